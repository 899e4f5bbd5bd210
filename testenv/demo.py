"""`make demo`: the dispatcher's main job on a local control plane, start to finish.

Side effects: builds (if missing) and starts a local control plane with fake GPU nodes and
KubeRay, runs the dispatcher in this process, applies the samples, prints what users see,
and tears everything down (or keeps it with --keep). The admission webhook is on: a user
who may only create AppWrappers is refused one that wraps a Job. Then quotas (samples/queues/): dev
RayClusters share a queue with room for one, and a prod one preempts the running dev one.
Then autoscaling (samples/autoscaling/): a RayCluster larger than any node, in a queue with
the ProvisioningRequest admission check, gets its nodes from the test kit's provisioner.
Last, reservation with backfill, on the three GPU nodes once the earlier acts' AppWrappers are
deleted: a gang that fits only when two running jobs' declared limits end reserves the nodes,
a short job backfills them, one without a limit waits behind the gang, which runs when the
limits end the two.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from dispatcher.app import running
from dispatcher.config import (
    Config,
    MemberConfig,
    ProvisioningCheckConfig,
    ProvisioningConfig,
    WebhookConfig,
)
from dispatcher.core.crdforms import converting
from dispatcher.kube.registration import webhook_configurations
from dispatcher.kube.webhook import CONVERT_PATH
from dispatcher.logs import configure_logging
from testenv.converter import Converter, crd_calling
from testenv.localcluster import REPO_ROOT, LocalCluster, ensure_binaries, free_port
from testenv.provisioner import TestProvisioner

SAMPLES = [
    "ray-glue-1.yaml",
    "ray-glue-2.yaml",
    "job-completion.yaml",
    "service-deployment.yaml",
    "mcad-legacy.yaml",
]
NAMESPACE = "demo"
QUEUES = REPO_ROOT / "samples" / "queues"
TEAM = "team"  # the namespace of the quotas act
CLUSTER_QUEUE = "cluster-queue"  # samples/queues/setup.yaml's
SYSTEM_NAMESPACE = "appwrapper-system"  # where the webhook keeps its certificate
WEBHOOK = "appwrapper-dispatcher"  # its webhook configurations
KINDS = (
    "appwrappers",
    "clusterappqueues",
    "appqueues",
    "appcohorts",
    "appflavors",
    "provisioningrequests",
)
AUTOSCALING = REPO_ROOT / "samples" / "autoscaling"
GROW = "grow"  # the namespace of the autoscaling act
HERO = "hero"  # the namespace of the reservation act
GPU_NODES = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
POOL = "demo.codeflare.dev/pool"  # the reservation act's pods go to GPU_NODES only
LIMIT = 40  # seconds: the running jobs' dispatchDuration.limit in the reservation act
MESSAGE = 'jsonpath={.status.message}{"\\n"}'
DISPATCHED = (  # the Dispatched condition: why it waits, and its reservation
    "jsonpath={range .status.conditions[?(@.type=='Dispatched')]}{.type}={.status} "
    '({.reason}: {.message}){"\\n"}{end}'
)


def _say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


async def _conditions(
    cluster: LocalCluster, name: str, namespace: str = NAMESPACE
) -> dict[str, str]:
    out = await cluster.akubectl("get", "aw", name, "-n", namespace, "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    status = json.loads(out.stdout).get("status") or {}
    return {c["type"]: c["status"] for c in status.get("conditions", [])}


async def _wait_for(
    cluster: LocalCluster, name: str, condition: str, timeout: float, namespace: str = NAMESPACE
) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (await _conditions(cluster, name, namespace)).get(condition) == "True":
            return True
        await asyncio.sleep(0.5)
    return False


async def _wait_served(
    cluster: LocalCluster, plurals: tuple[str, ...], timeout: float = 60
) -> None:
    """Until kubectl can use every one of `plurals` (CRDs applied a moment ago are not
    served, nor in discovery, at once)."""
    deadline = time.monotonic() + timeout
    for plural in plurals:
        while (await cluster.akubectl("get", plural, "-A", check=False)).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{plural} not served after {timeout}s")
            await asyncio.sleep(0.5)


async def _show(cluster: LocalCluster, *args: str) -> None:
    print(f"$ kubectl {' '.join(args)}")
    out = await cluster.akubectl(*args, check=False)
    print(out.stdout or out.stderr, end="", flush=True)


async def demo(workdir: Path, keep: bool) -> int:
    _say("Building (first run only) and starting a local control plane with KubeRay")
    binaries = ensure_binaries()
    cluster = LocalCluster.start("demo", workdir, binaries=binaries, kuberay=True)
    try:
        # Six GPUs: one RayCluster gang (4 GPUs) fits, a second does not.
        for index in (1, 2, 3):
            cluster.add_node(f"gpu-node-{index}", cpu="8", memory="40Gi", gpu=2)
        cluster.add_node("cpu-node", cpu="8", memory="32Gi")
        cluster.wait_nodes_ready(["gpu-node-1", "gpu-node-2", "gpu-node-3", "cpu-node"])
        # The AppWrapper CRD as an install that converts applies it, through the webhook
        # server of the dispatcher started below (its caBundle written by the dispatcher, as
        # for the webhook configurations), before kubectl first reads the API's discovery,
        # which it caches. The quota kinds too, and served before the dispatcher starts: it
        # looks again for kinds that were missing at its start only now and then.
        webhook_port = free_port()
        crd = yaml.safe_load((REPO_ROOT / "crds" / "appwrapper.yaml").read_text())
        cluster.apply(converting(crd, {"url": f"https://127.0.0.1:{webhook_port}{CONVERT_PATH}"}))
        for crd_file in ("queues.yaml", "provisioning/provisioningrequest.yaml"):
            cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / crd_file))
        cluster.kubectl("create", "namespace", NAMESPACE)
        await _wait_served(cluster, KINDS)
        await _show(
            cluster,
            "get",
            "nodes",
            "-o",
            "custom-columns=NAME:.metadata.name,CPU:.status.allocatable.cpu,"
            "MEMORY:.status.allocatable.memory,"
            "GPU:.status.allocatable.nvidia\\.com/gpu",
        )
        config = _with_webhook(cluster, webhook_port)
        provisioner = TestProvisioner(cluster.kubeconfig, GROW, labels={}, delay=3.0)
        async with provisioner, running(config):
            _say("Dispatcher running; applying the samples")
            for sample in SAMPLES:
                await _show(
                    cluster, "apply", "-n", NAMESPACE, "-f", str(REPO_ROOT / "samples" / sample)
                )
                if sample == "ray-glue-1.yaml":
                    await _wait_for(cluster, "glue-1", "Dispatched", 30)
            await _wait_for(cluster, "glue-1", "Running", 90)
            await _wait_for(cluster, "mcad-legacy", "Dispatched", 60)
            await asyncio.sleep(2)
            _say("Two RayClusters, GPUs for one: glue-1 runs, glue-2 waits with the reason")
            await _show(cluster, "get", "aw", "-n", NAMESPACE)
            await _show(cluster, "get", "pods", "-n", NAMESPACE, "-o", "wide")
            await _show(
                cluster,
                "get",
                "aw",
                "glue-2",
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={range .status.conditions[*]}{.type}={.status} "
                '({.reason}: {.message}){"\\n"}{end}',
            )
            _say("kubectl describe aw glue-1 (conditions and events)")
            await _show(cluster, "describe", "aw", "glue-1", "-n", NAMESPACE)
            _say("Deleting glue-1: its pods go, and only then glue-2 is dispatched")
            await _show(cluster, "delete", "aw", "glue-1", "-n", NAMESPACE)
            ok = await _wait_for(cluster, "glue-2", "Running", 90)
            await _show(cluster, "get", "aw", "-n", NAMESPACE)
            ok = await _v1beta2_act(cluster) and ok
            ok = await _privilege_act(cluster) and ok
            ok = await _queues_act(cluster) and ok
            ok = await _autoscaling_act(cluster, provisioner) and ok
            ok = await _reservation_act(cluster) and ok
            if keep:
                _say(
                    f"Still running. Try: kubectl --kubeconfig {cluster.kubeconfig} get aw -A"
                    "   (Ctrl-C to stop)"
                )
                await asyncio.Event().wait()
            return 0 if ok else 1
    finally:
        cluster.stop()


def _with_webhook(cluster: LocalCluster, port: int) -> Config:
    """Settings with the admission webhook on, as the manifests deploy it, served on
    127.0.0.1:`port` (the API server runs on this machine: a URL instead of a Service),
    answering only the API server's client certificate."""
    cluster.kubectl("create", "namespace", SYSTEM_NAMESPACE)
    for configuration in webhook_configurations(WEBHOOK, port):
        cluster.apply(configuration)
    return Config(
        kubeconfig=str(cluster.kubeconfig),
        health_port=0,
        log_level="warning",
        # The admission check of samples/autoscaling/setup.yaml's queue (no other names it).
        provisioning=ProvisioningConfig(
            enabled=True, checks={"autoscale": ProvisioningCheckConfig()}
        ),
        webhook=WebhookConfig(
            enabled=True,
            host="127.0.0.1",
            port=port,
            namespace=SYSTEM_NAMESPACE,
            extra_names=["127.0.0.1"],
            mutating_configuration=WEBHOOK,
            validating_configuration=WEBHOOK,
            client_ca_file=str(cluster.webhook_client_ca) if cluster.webhook_client_ca else None,
        ),
    )


async def _v1beta2_act(cluster: LocalCluster) -> bool:
    """The AppWrapper controller's generation beside MCAD's: a v1beta2 Job runs; a v1beta2
    RayCluster created suspended waits until it is unsuspended; both read as v1beta1 too."""
    _say("v1beta2 AppWrappers (the AppWrapper controller's fields), served beside v1beta1")
    for sample in ("v1beta2-job.yaml", "v1beta2-raycluster.yaml"):
        await _show(cluster, "apply", "-n", NAMESPACE, "-f", str(REPO_ROOT / "samples" / sample))
    ok = await _wait_for(cluster, "v1beta2-job", "Dispatched", 60)
    await asyncio.sleep(2)  # the suspended one has had its first look
    await _show(cluster, "get", "aw", "v1beta2-job", "v1beta2-ray", "-n", NAMESPACE, "-o", "wide")
    _say("The same objects as v1beta1, MCAD's generation (converted by the dispatcher)")
    await _show(cluster, "get", "appwrappers.v1beta1.workload.codeflare.dev", "-n", NAMESPACE)
    _say("Unsuspended, the RayCluster is queued and dispatched like any other")
    await _show(
        cluster, "patch", "aw", "v1beta2-ray", "-n", NAMESPACE, "--type=merge",
        "-p", '{"spec":{"suspend":false}}',
    )  # fmt: skip
    ok = await _wait_for(cluster, "v1beta2-ray", "Dispatched", 60) and ok
    await _show(
        cluster, "get", "aw", "v1beta2-ray", "-n", NAMESPACE,
        "-o", "jsonpath={.status.phase}",
    )  # fmt: skip
    await _show(cluster, "delete", "aw", "v1beta2-job", "v1beta2-ray", "-n", NAMESPACE)
    return ok


async def _privilege_act(cluster: LocalCluster) -> bool:
    """alice may create AppWrappers in the namespace and nothing else: the webhook refuses
    one that wraps pods, naming what she lacks."""
    _say("Least privilege: alice may create AppWrappers, not the Jobs they would make")
    cluster.kubectl(
        "create", "role", "appwrapper-user", "-n", NAMESPACE,
        "--verb=get,list,watch,create,update,patch,delete", "--resource=appwrappers",
    )  # fmt: skip
    cluster.kubectl(
        "create", "rolebinding", "alice", "-n", NAMESPACE, "--role=appwrapper-user",
        "--user=alice",
    )  # fmt: skip
    sample = yaml.safe_load((REPO_ROOT / "samples" / "job-completion.yaml").read_text())
    sample["metadata"]["name"] = "alice-job"
    print(
        f"$ kubectl apply -n {NAMESPACE} --as alice -f samples/job-completion.yaml"
        "  # named alice-job"
    )
    out = await cluster.akubectl(
        "apply", "-n", NAMESPACE, "--as=alice", "-f", "-", input=json.dumps(sample), check=False
    )
    print(out.stdout or out.stderr, end="", flush=True)
    _say("Who created glue-2 (recorded and signed by the webhook)")
    await _show(
        cluster, "get", "aw", "glue-2", "-n", NAMESPACE,
        "-o", 'jsonpath={.metadata.annotations.workload\\.codeflare\\.dev/user}{"\\n"}',
    )  # fmt: skip
    return out.returncode != 0 and "alice may not create jobs.batch" in out.stderr


async def _value(cluster: LocalCluster, *args: str) -> str:
    out = await cluster.akubectl("get", *args, check=False)
    return out.stdout.strip() if out.returncode == 0 else ""


async def _wait_value(cluster: LocalCluster, want: str, *args: str, timeout: float = 30) -> bool:
    """Until `kubectl get ARGS` (a jsonpath) prints `want`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await _value(cluster, *args) == want:
            return True
        await asyncio.sleep(0.5)
    return False


async def _queue_shows(cluster: LocalCluster, pending: int, admitted: int) -> bool:
    """Until the queue's status (written about once a second) has these counts."""
    counts = "jsonpath={.status.pendingWorkloads} {.status.admittedWorkloads}"
    return await _wait_value(
        cluster, f"{pending} {admitted}", "clusterappqueue", CLUSTER_QUEUE, "-o", counts
    )


async def _submit(cluster: LocalCluster, sample: str, name: str) -> None:
    """samples/queues/`sample`, it and its RayCluster named `name`."""
    aw: dict[str, Any] = yaml.safe_load((QUEUES / sample).read_text())
    aw["metadata"]["name"] = name
    for item in aw["spec"]["resources"]["GenericItems"]:
        item["generictemplate"]["metadata"]["name"] = name
    print(f"$ kubectl apply -n {TEAM} -f samples/queues/{sample}   # named {name}")
    out = await cluster.akubectl("apply", "-n", TEAM, "-f", "-", input=json.dumps(aw))
    print(out.stdout, end="", flush=True)


async def _show_queues(cluster: LocalCluster) -> None:
    await _show(cluster, "get", "clusterappqueues")
    await _show(cluster, "get", "appqueues", "-n", TEAM)
    await _show(cluster, "get", "aw", "-n", TEAM)


async def _queues_act(cluster: LocalCluster) -> bool:
    """Quotas as Kueue's priority guide for KubeRay shows them: a queue of 2 CPU, dev
    RayClusters of 2 CPU each, one at a time; prod preempts the running dev one."""
    _say("Quotas: a queue of 2 CPU, 8G and 1 GPU; prod-priority preempts dev-priority")
    cluster.kubectl("create", "namespace", TEAM)
    await _show(cluster, "label", "namespace", TEAM, "team=ml")  # the queue admits it
    await _show(cluster, "apply", "-n", TEAM, "-f", str(QUEUES / "setup.yaml"))
    active = "jsonpath={.status.conditions[?(@.type=='Active')].status}"
    ok = await _wait_value(cluster, "True", "clusterappqueue", CLUSTER_QUEUE, "-o", active)

    _say("Two dev RayClusters (2 CPU each): the cluster has room for both, the queue for one")
    await _submit(cluster, "dev-job.yaml", "dev-1")
    ok = await _wait_for(cluster, "dev-1", "Dispatched", 30, TEAM) and ok
    await _submit(cluster, "dev-job.yaml", "dev-2")
    ok = await _wait_for(cluster, "dev-1", "Running", 90, TEAM) and ok
    ok = await _queue_shows(cluster, pending=1, admitted=1) and ok
    await _show_queues(cluster)
    await _show(
        cluster, "get", "aw", "dev-2", "-n", TEAM, "-o", 'jsonpath={.status.message}{"\\n"}'
    )

    _say("A prod RayCluster arrives: dev-1 is preempted and goes back to the queue")
    await _submit(cluster, "prod-job.yaml", "prod-1")
    ok = await _wait_for(cluster, "prod-1", "Running", 90, TEAM) and ok
    ok = await _queue_shows(cluster, pending=2, admitted=1) and ok
    await _show_queues(cluster)
    await _show(
        cluster,
        "get",
        "aw",
        "dev-1",
        "-n",
        TEAM,
        "-o",
        "jsonpath={range .status.conditions[?(@.type=='Preempted')]}{.type}={.status} "
        '({.reason}: {.message}){"\\n"}{end}',
    )
    return ok


async def _autoscaling_act(cluster: LocalCluster, provisioner: TestProvisioner) -> bool:
    """A RayCluster whose workers need 4 GPUs (no node has more than 2), in a queue with the
    ProvisioningRequest check: it holds the queue's quota, a request asks for a node per pod,
    the provisioner (3 s, then KWOK nodes) says Provisioned, and it is dispatched there."""
    _say("Autoscaling: a RayCluster whose workers need 4 GPUs each; no node has more than 2")
    cluster.kubectl("create", "namespace", GROW)
    await _show(cluster, "label", "namespace", GROW, "team=ml")  # the queue admits it
    await _show(cluster, "apply", "-n", GROW, "-f", str(AUTOSCALING / "setup.yaml"))
    started = time.monotonic()
    await _show(cluster, "apply", "-n", GROW, "-f", str(AUTOSCALING / "ray-big.yaml"))
    ok = await _wait_for(cluster, "ray-big", "QuotaReserved", 30, GROW)
    _say("Its quota is held and a ProvisioningRequest asks for the nodes; nothing is created yet")
    await _show(cluster, "get", "provisioningrequests", "-n", GROW)
    await _show(
        cluster,
        "get",
        "appwrappers.v1beta1.workload.codeflare.dev",
        "ray-big",
        "-n",
        GROW,
        "-o",
        "jsonpath={range .status.conditions[*]}{.type}={.status} "
        '({.reason}: {.message}){"\\n"}{end}',
    )
    ok = await _wait_for(cluster, "ray-big", "Running", 120, GROW) and ok
    took = time.monotonic() - started
    provisioned = sum(provisioner.provisioned_in.values())
    _say(
        f"Provisioned, dispatched and Running {took:.1f}s after apply"
        f" (the provisioner's own time: {provisioned:.1f}s)"
    )
    await _show(cluster, "get", "provisioningrequests", "-n", GROW)
    await _show(cluster, "get", "pods", "-n", GROW, "-o", "wide")
    return ok


def _gpu_job(name: str, pods: int, gpus: int, limit: int | None) -> dict[str, Any]:
    """An AppWrapper of a Deployment of `pods` pods of `gpus` GPUs each on the GPU nodes,
    with `limit` as its dispatchDuration.limit (KWOK's pods never end by themselves: the
    limit is what ends a running one)."""
    resources = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": pods,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {POOL: HERO},
                    "containers": [
                        {
                            "name": "work",
                            "image": "busybox",
                            "command": ["sleep", "infinity"],
                            "resources": {"requests": resources, "limits": resources},
                        }
                    ],
                },
            },
        },
    }
    spec: dict[str, Any] = {"resources": {"GenericItems": [{"generictemplate": deployment}]}}
    if limit is not None:
        spec["schedulingSpec"] = {"dispatchDuration": {"limit": limit}}
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": name},
        "spec": spec,
    }


async def _submit_gpu_job(
    cluster: LocalCluster, name: str, pods: int, gpus: int, limit: int | None
) -> None:
    bound = f"limit {limit}s" if limit is not None else "no limit"
    size = f"{pods} pod{'s' if pods > 1 else ''} x {gpus} GPU{'s' if gpus > 1 else ''}"
    print(f"$ kubectl apply -n {HERO} -f -   # {name}: {size}, {bound}")
    out = await cluster.akubectl(
        "apply", "-n", HERO, "-f", "-", input=json.dumps(_gpu_job(name, pods, gpus, limit))
    )
    print(out.stdout, end="", flush=True)


async def _wait_message(
    cluster: LocalCluster, name: str, part: str, timeout: float, namespace: str = HERO
) -> bool:
    """Until the AppWrapper's status.message contains `part`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if part in await _value(cluster, "aw", name, "-n", namespace, "-o", MESSAGE):
            return True
        await asyncio.sleep(0.5)
    return False


async def _wait_nodes_empty(cluster: LocalCluster, nodes: tuple[str, ...], timeout: float) -> bool:
    """Until no pod is bound to any of `nodes`."""
    where = 'jsonpath={range .items[*]}{.spec.nodeName}{"\\n"}{end}'
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        bound = (await _value(cluster, "pods", "-A", "-o", where)).split()
        if not set(bound) & set(nodes):
            return True
        await asyncio.sleep(0.5)
    return False


def _hero_queue() -> list[dict[str, Any]]:
    """The reservation act's queue: StrictFIFO with backfill Declared, quota for all of it
    at once (capacity, not quota, is what the gang waits for), admitting namespace HERO,
    which submits to it through its AppQueue `default`: StrictFIFO with backfill, as batch
    systems pair them (the head keeps its place; only work that ends before it starts may
    pass it)."""
    group = "workload.codeflare.dev/v1beta1"
    quota = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "12"}
    return [
        {"apiVersion": group, "kind": "AppFlavor", "metadata": {"name": HERO}, "spec": {}},
        {
            "apiVersion": group,
            "kind": "ClusterAppQueue",
            "metadata": {"name": HERO},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": HERO}},
                "queueingStrategy": "StrictFIFO",
                "backfill": "Declared",
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [
                            {
                                "name": HERO,
                                "resources": [
                                    {"name": k, "nominalQuota": v} for k, v in quota.items()
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": group,
            "kind": "AppQueue",
            "metadata": {"name": "default", "namespace": HERO},
            "spec": {"clusterQueue": HERO},
        },
    ]


async def _reservation_act(cluster: LocalCluster) -> bool:
    """Reservation with backfill on the three 2-GPU nodes, emptied of the earlier acts' work,
    in a StrictFIFO queue whose backfill is Declared: two jobs with a declared limit hold two
    nodes; a gang of 3 x 2 GPUs reserves all three from when the limits end; a short job
    passes it onto the free room, gone before then; one without a limit waits behind it; the
    gang runs once the limits end the two jobs."""
    _say("Reservation and backfill: a hero gang reserved while small jobs backfill")
    for namespace in (NAMESPACE, TEAM, GROW):  # the earlier acts' work goes
        await cluster.akubectl("delete", "aw", "--all", "-n", namespace, check=False)
    ok = await _wait_nodes_empty(cluster, GPU_NODES, 60)
    cluster.kubectl("create", "namespace", HERO)
    await _show(cluster, "label", "nodes", *GPU_NODES, f"{POOL}={HERO}")
    print(f"(the earlier acts' AppWrappers are deleted; this act's pods select {POOL}={HERO})")
    print("$ kubectl apply -f -   # ClusterAppQueue hero (StrictFIFO, backfill: Declared),")
    print("                       # AppFlavor hero, AppQueue hero/default")
    queue = {"apiVersion": "v1", "kind": "List", "items": _hero_queue()}
    out = await cluster.akubectl("apply", "-f", "-", input=json.dumps(queue))
    print(out.stdout, end="", flush=True)
    active = "jsonpath={.status.conditions[?(@.type=='Active')].status}"
    ok = await _wait_value(cluster, "True", "clusterappqueue", HERO, "-o", active) and ok

    _say(f"Two jobs of 2 GPUs, each stopped by its limit ({LIMIT}s): a GPU node left free")
    for name in ("runner-1", "runner-2"):
        await _submit_gpu_job(cluster, name, 1, 2, LIMIT)
    for name in ("runner-1", "runner-2"):
        ok = await _wait_for(cluster, name, "Running", 60, HERO) and ok

    _say("The hero gang (3 pods x 2 GPUs) fits only when they end: it reserves the nodes")
    await _submit_gpu_job(cluster, "hero", 3, 2, None)
    ok = await _wait_message(cluster, "hero", "declared limits", 30) and ok
    await _show(cluster, "get", "aw", "hero", "-n", HERO, "-o", DISPATCHED)

    _say("A short job (limit 15s, gone before the reservation starts) backfills the free room")
    await _submit_gpu_job(cluster, "short", 1, 1, 15)
    ok = await _wait_for(cluster, "short", "Dispatched", 30, HERO) and ok
    _say("A job without a limit may not pass the reserved gang: it waits behind it")
    await _submit_gpu_job(cluster, "open-ended", 1, 1, None)
    ok = await _wait_message(cluster, "open-ended", "waiting behind", 30) and ok
    await _show(cluster, "get", "aw", "-n", HERO)
    await _show(cluster, "get", "aw", "open-ended", "-n", HERO, "-o", MESSAGE)

    _say("The limits end the running jobs (Failed: they ran too long); the hero gang runs")
    ok = await _wait_for(cluster, "hero", "Running", LIMIT + 30, HERO) and ok
    await _show(cluster, "get", "aw", "-n", HERO)
    await _show(cluster, "get", "pods", "-n", HERO, "-o", "wide")
    return ok and (await _conditions(cluster, "open-ended", HERO)).get("Dispatched") != "True"


async def demo_members(workdir: Path, members: int, keep: bool) -> int:
    """A hub holding AppWrappers and `members` member clusters; work lands where it fits."""
    _say(f"Starting a hub and {members} member clusters")
    binaries = ensure_binaries()
    hub = LocalCluster.start("hub", workdir, binaries=binaries)
    clusters: list[LocalCluster] = []
    converter = Converter()
    try:
        names = [f"member-{chr(ord('a') + i)}" for i in range(members)]
        for index, name in enumerate(names):
            cluster = LocalCluster.start(name, workdir, binaries=binaries)
            clusters.append(cluster)
            # Only the last member has GPUs: GPU work must land there.
            cluster.add_node(
                f"{name}-node", cpu="8", memory="32Gi", gpu=4 if index == members - 1 else 0
            )
            cluster.wait_nodes_ready([f"{name}-node"])
        # No webhook in this act: the conversion endpoint alone serves the CRD.
        converter.start()
        hub.apply(
            crd_calling(REPO_ROOT / "crds" / "appwrapper.yaml", converter.url, converter.ca_bundle)
        )
        hub.kubectl("create", "namespace", NAMESPACE)
        config = Config(
            kubeconfig=str(hub.kubeconfig),
            health_port=0,
            log_level="warning",
            # This act shows placement; the single-cluster demo shows the webhook.
            unattributed="allow",
            members=[
                MemberConfig(
                    name=n,
                    kubeconfig=str(c.kubeconfig),
                    labels={"demo": n},
                    # Every hub namespace under its own name but the platform's, made when
                    # missing; the samples' pods set no securityContext, which `restricted`
                    # would refuse.
                    namespaces={"*": "*"},
                    wildcard_reserved=["*-system", "gpu-operator"],
                    create_namespaces=True,
                    namespace_labels={"pod-security.kubernetes.io/enforce": "baseline"},
                )
                for n, c in zip(names, clusters, strict=True)
            ],
        )
        async with running(config):
            _say("Applying a GPU job and a CPU service on the hub")
            await _show(
                hub, "apply", "-n", NAMESPACE, "-f", str(REPO_ROOT / "samples" / "mcad-legacy.yaml")
            )
            await _show(
                hub,
                "apply",
                "-n",
                NAMESPACE,
                "-f",
                str(REPO_ROOT / "samples" / "service-deployment.yaml"),
            )
            ok = await _wait_for(hub, "mcad-legacy", "Dispatched", 60)
            ok = await _wait_for(hub, "service-deployment", "Running", 60) and ok
            await _show(hub, "get", "aw", "-n", NAMESPACE)
            for name, cluster in zip(names, clusters, strict=True):
                _say(f"In {name}")
                await _show(cluster, "get", "deployments,jobs,pods", "-n", NAMESPACE)
            if keep:
                _say(f"Still running. Hub: kubectl --kubeconfig {hub.kubeconfig} get aw -A")
                await asyncio.Event().wait()
            return 0 if ok else 1
    finally:
        converter.stop()
        for cluster in clusters:
            cluster.stop()
        hub.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="keep running until Ctrl-C")
    parser.add_argument(
        "--members",
        type=int,
        default=1,
        help="member clusters besides the hub (default: the hub alone)",
    )
    args = parser.parse_args()
    configure_logging(level="warning")
    with tempfile.TemporaryDirectory(prefix="aw-demo-") as tmp:
        try:
            if args.members > 1:
                raise SystemExit(asyncio.run(demo_members(Path(tmp), args.members, args.keep)))
            raise SystemExit(asyncio.run(demo(Path(tmp), args.keep)))
        except KeyboardInterrupt:
            raise SystemExit(130) from None


if __name__ == "__main__":
    main()
