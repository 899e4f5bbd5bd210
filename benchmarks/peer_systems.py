"""The systems of the peer benchmark and the work they are given, each in its own terms.

Where it sits: benchmarks.peer_scenarios describes work as system-neutral `Workload`s; this
module turns one into what each system takes (an AppWrapper for ours and MCAD, a suspended Job
or RayCluster with Kueue's queue-name label), sets up a control plane for a system (CRDs,
queue objects, the controller's own identity, an audit log of its requests) and starts its
controller.

Identity: every client of a LocalCluster authenticates as "admin" from the same kubeconfig,
so the controller under test gets a ServiceAccount token of its own (`CONTROLLER_USER`, bound
to cluster-admin) and the API server's audit policy logs that user only, every verb, at
Metadata level: its requests by verb come from there.

Side effects: the set-up and launch functions create objects in a cluster, write files in the
work directory and start processes (see benchmarks.peers for Kueue's certificate files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks import peers
from benchmarks.e2e_bench import start_dispatcher
from dispatcher.api.constants import API_VERSION, KIND, PLURAL
from dispatcher.kube.client import ResourceInfo
from testenv.converter import install_appwrapper_crd
from testenv.localcluster import Binaries, LocalCluster, free_port
from testenv.manifests import appwrapper, job

Obj = dict[str, Any]

APPWRAPPERS = ResourceInfo(API_VERSION, KIND, PLURAL, True)
APPWRAPPERS_V1BETA2 = ResourceInfo("workload.codeflare.dev/v1beta2", KIND, PLURAL, True)
JOBS = ResourceInfo("batch/v1", "Job", "jobs", True)
RAYCLUSTERS = ResourceInfo("ray.io/v1", "RayCluster", "rayclusters", True)
PODS = ResourceInfo("v1", "Pod", "pods", True)
KUEUE_API = f"kueue.x-k8s.io/{peers.KUEUE_STORAGE}"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
NAMESPACE = "bench"
QUEUE = "bench"
FLAVOR = "default-flavor"
CONTROLLER_NAMESPACE = "peers-system"
CONTROLLER_ACCOUNT = "controller"
CONTROLLER_USER = f"system:serviceaccount:{CONTROLLER_NAMESPACE}:{CONTROLLER_ACCOUNT}"
MCAD_POD_LABEL = "appwrapper.mcad.ibm.com"
HOLD_ANNOTATION = "pod-complete.stage.kwok.x-k8s.io/delay"
"""On a Job's pod: how long KWOK keeps it Running before it succeeds (a Go duration)."""
PRIORITIES = {"bench-low": 10, "bench-high": 1000}
"""PriorityClasses (and Kueue WorkloadPriorityClasses) of the priority scenario."""
OURS_QPS = "200/400"
MCAD_QPS = "100/200"
KUEUE_DEFAULT_QPS = 50.0


AW_QPS = "20/30"
"""The AppWrapper v1beta2 controller's client: controller-runtime's default, not settable."""
KINDS = ("ours", "mcad", "kueue", "appwrapper")


@dataclass(frozen=True)
class System:
    """One system under test: `kind` is ours, mcad, kueue, or appwrapper (Kueue with the
    AppWrapper v1beta2 controller); `qps` is Kueue's, for kueue and appwrapper."""

    kind: str
    qps: float = 0

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.qps:g}" if self.qps else self.kind

    @property
    def client_qps(self) -> str:
        if self.kind in ("kueue", "appwrapper"):
            qps = self.qps or KUEUE_DEFAULT_QPS
            kueue = f"{qps:g}/{2 * qps:g}"
            return kueue if self.kind == "kueue" else f"{kueue} + {AW_QPS}"
        return OURS_QPS if self.kind == "ours" else MCAD_QPS

    @property
    def version(self) -> str:
        return {
            "ours": "this repository",
            "mcad": peers.MCAD_VERSION,
            "kueue": peers.KUEUE_VERSION,
            "appwrapper": f"{peers.APPWRAPPER_VERSION} + kueue {peers.KUEUE_VERSION}",
        }[self.kind]

    @property
    def wraps(self) -> bool:
        """Whether the system takes its work wrapped in an AppWrapper (v1beta1 for ours and
        MCAD; appwrapper's is v1beta2)."""
        return self.kind != "kueue"


def parse_systems(text: str) -> list[System]:
    """ "ours,mcad,kueue,kueue:200,appwrapper" -> Systems (an unknown name is an error)."""
    systems = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, qps = item.partition(":")
        if kind not in KINDS or (qps and kind not in ("kueue", "appwrapper")):
            raise ValueError(
                f"unknown system {item!r}: ours, mcad, kueue, kueue:QPS, appwrapper or "
                "appwrapper:QPS"
            )
        systems.append(System(kind, float(qps) if qps else 0))
    return systems


# -- the work --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One unit of work, whatever the system: a Job of `pods` identical pods, or a RayCluster
    of a head and `pods - 1` workers, each pod asking for `requests`. `hold`: how long each
    Job pod runs before it succeeds (None: at once; RayCluster pods run until deleted).
    `priority`: a key of PRIORITIES, or None."""

    name: str
    pods: int = 1
    requests: tuple[tuple[str, str], ...] = (("cpu", "100m"), ("memory", "64Mi"))
    ray: bool = False
    hold: str | None = None
    priority: str | None = None

    @property
    def pod_requests(self) -> dict[str, str]:
        return dict(self.requests)


def ray_cluster(name: str, workers: int, requests: dict[str, str]) -> Obj:
    """A RayCluster: one head, one worker group of `workers`, every pod asking `requests`."""

    def group() -> Obj:
        container = {
            "name": "ray",
            "image": "rayproject/ray:2.9.0",
            "resources": {"requests": dict(requests), "limits": dict(requests)},
        }
        return {"rayStartParams": {}, "template": {"spec": {"containers": [container]}}}

    workers_group = {
        **group(),
        "groupName": "workers",
        "replicas": workers,
        "minReplicas": workers,
        "maxReplicas": workers,
    }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "rayVersion": "2.9.0",
            "headGroupSpec": group(),
            "workerGroupSpecs": [workers_group],
        },
    }


def plain(work: Workload) -> Obj:
    """The workload as a user would create it with no dispatcher at all."""
    if work.ray:
        return ray_cluster(work.name, work.pods - 1, work.pod_requests)
    body = job(work.name, work.pods, work.pod_requests)
    if work.hold:
        body["spec"]["template"]["metadata"] = {"annotations": {HOLD_ANNOTATION: work.hold}}
    return body


def pod_templates(body: Obj) -> list[Obj]:
    """The pod templates of a Job or a RayCluster (head first)."""
    spec = body["spec"]
    if body["kind"] == "RayCluster":
        groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
        return [group["template"] for group in groups]
    return [spec["template"]]


def kueue_labels(work: Workload) -> dict[str, str]:
    labels = {KUEUE_QUEUE_LABEL: QUEUE}
    if work.priority:
        labels[KUEUE_PRIORITY_LABEL] = work.priority
    return labels


def native(system: System, work: Workload) -> tuple[ResourceInfo, Obj]:
    """What `system` is given for `work`, and its resource."""
    body = plain(work)
    if system.kind == "kueue":
        body["metadata"]["labels"] = kueue_labels(work)
        body["spec"]["suspend"] = True
        return (RAYCLUSTERS if work.ray else JOBS), body
    if system.kind == "appwrapper":
        # Created suspended and labelled (the webhooks that would do it are off); the pod
        # sets of a Job and a RayCluster are inferred by Kueue and the controller alike.
        return APPWRAPPERS_V1BETA2, {
            "apiVersion": APPWRAPPERS_V1BETA2.group_version,
            "kind": KIND,
            "metadata": {"name": work.name, "labels": kueue_labels(work)},
            "spec": {"suspend": True, "components": [{"template": body}]},
        }
    if system.kind == "mcad":
        for template in pod_templates(body):
            # MCAD finds an AppWrapper's pods by this label, which it adds to a pod template
            # only where the template has labels already; its samples write it themselves.
            template.setdefault("metadata", {}).setdefault("labels", {})[MCAD_POD_LABEL] = work.name
            if work.priority:
                # MCAD leaves evictions to the kube-scheduler: its pods carry the class.
                template["spec"]["priorityClassName"] = work.priority
    custom = None
    if work.ray:
        requests = work.pod_requests
        custom = [
            {"replicas": 1, "requests": requests, "limits": requests},
            {"replicas": work.pods - 1, "requests": requests, "limits": requests},
        ]
    wrapper = appwrapper(
        work.name,
        body,
        completion=None if work.ray else "Complete",
        custom=custom,
        # Ours takes the PriorityClass; MCAD only knows spec.priority.
        priority=PRIORITIES[work.priority] if work.priority and system.kind == "mcad" else None,
        priority_class=work.priority if system.kind == "ours" else None,
    )
    return APPWRAPPERS, wrapper


def admitted(system: System, obj: Obj) -> bool:
    """Whether `obj` (what `native` made, as the API server returns it) has been admitted:
    an AppWrapper with its Dispatched condition True (MCAD adds it, reason AppWrapperRunnable,
    once it has created the wrapped items), a Job or RayCluster Kueue unsuspended, or a v1beta2
    AppWrapper in phase Running or Succeeded (the controller has created what it wraps; its
    ResourcesDeployed condition turns True before that)."""
    if system.kind == "appwrapper":
        return (obj.get("status") or {}).get("phase") in ("Running", "Succeeded")
    if system.wraps:
        return any(
            c.get("type") == "Dispatched" and c.get("status") == "True"
            for c in (obj.get("status") or {}).get("conditions") or []
        )
    return (obj.get("spec") or {}).get("suspend") is False


def workload_resources(system: System, ray: bool) -> list[ResourceInfo]:
    """Where `system`'s workloads are admitted (Kueue: Jobs, and RayClusters with `ray`)."""
    if system.kind == "appwrapper":
        return [APPWRAPPERS_V1BETA2]
    if system.wraps:
        return [APPWRAPPERS]
    return [JOBS, RAYCLUSTERS] if ray else [JOBS]


# -- queue and priority objects --------------------------------------------------------------


def kueue_objects(quota: dict[str, str]) -> list[Obj]:
    """A ResourceFlavor, a ClusterQueue (every namespace) with `quota` that may evict lower
    priorities of its own, the LocalQueue the work names, and the WorkloadPriorityClasses."""
    return [
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [
                                    {"name": r, "nominalQuota": q} for r, q in quota.items()
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": NAMESPACE},
            "spec": {"clusterQueue": QUEUE},
        },
        *(
            {
                "apiVersion": KUEUE_API,
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
            for name, value in PRIORITIES.items()
        ),
    ]


def priority_classes() -> list[Obj]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        }
        for name, value in PRIORITIES.items()
    ]


# -- the control plane -----------------------------------------------------------------------


class AuditedCluster(LocalCluster):
    """A LocalCluster whose audit log holds every request of the controller under test (and
    nothing else), one line per stage at Metadata level; with KubeRay, its CRDs are there
    before the garbage collector starts.

    Why the CRDs first: the garbage collector watches the kinds served when it starts and looks
    for new ones every 30 s; until then, the pods of a deleted RayCluster stay (5-30 s here),
    holding their nodes, and a gang scenario would measure the collector's discovery period.
    """

    ray_crds_first = False

    def _start_all(
        self,
        *,
        api_port: int,
        kuberay: bool,
        audit: bool,
        stages: list[Path],
        timeout: float,
    ) -> None:
        self.ray_crds_first = kuberay
        super()._start_all(
            api_port=api_port, kuberay=kuberay, audit=audit, stages=stages, timeout=timeout
        )

    def _spawn(self, component: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        if component == "kube-controller-manager" and self.ray_crds_first:
            crds = str(self.binaries.kuberay_crds)
            self.kubectl("apply", "--server-side", "-f", crds, timeout=120)
        super()._spawn(component, argv, env)

    def _audit_flags(self) -> list[str]:
        policy = self.workdir / "audit-policy.yaml"
        rules = [{"level": "Metadata", "users": [CONTROLLER_USER]}, {"level": "None"}]
        policy.write_text(
            json.dumps(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    "omitStages": ["RequestReceived"],
                    "rules": rules,
                }
            )
        )
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.workdir / 'logs' / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]

    def stop(self) -> None:
        """Killed outright: nothing of a benchmark's control plane is kept, and a graceful
        stop of the API server and etcd takes seconds every run."""
        for process in self.processes.values():
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        for process in self.processes.values():
            process.wait(timeout=30)


def kwok_stages(binaries: Binaries, home: Path) -> list[Path]:
    """KWOK's fast stages, with Job pods completing after the delay their HOLD_ANNOTATION
    names (at once without it)."""
    stages = [p for p in binaries.kwok_stages if p.name != "pod-complete.yaml"]
    complete = yaml.safe_load(
        (binaries.root / "kwok-stages" / "pod" / "fast" / "pod-complete.yaml").read_text()
    )
    complete["spec"]["delay"] = {
        "durationMilliseconds": 0,
        "durationFrom": {"expressionFrom": f'.metadata.annotations["{HOLD_ANNOTATION}"]'},
    }
    path = home / "pod-complete-after-hold.yaml"
    path.write_text(yaml.safe_dump(complete))
    return [*stages, path]


def controller_kubeconfig(cluster: LocalCluster) -> Path:
    """A kubeconfig for the controller under test: a ServiceAccount token (CONTROLLER_USER)
    bound to cluster-admin."""
    cluster.kubectl("create", "namespace", CONTROLLER_NAMESPACE)
    cluster.kubectl("create", "serviceaccount", CONTROLLER_ACCOUNT, "-n", CONTROLLER_NAMESPACE)
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        "peers-controller",
        "--clusterrole=cluster-admin",
        f"--serviceaccount={CONTROLLER_NAMESPACE}:{CONTROLLER_ACCOUNT}",
    )
    token = cluster.kubectl(
        "create", "token", CONTROLLER_ACCOUNT, "-n", CONTROLLER_NAMESPACE, "--duration=24h"
    ).stdout.strip()
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    path = cluster.workdir / "controller.kubeconfig"
    path.write_text(json.dumps(config, indent=2))
    return path


def prepare(system: System, cluster: LocalCluster, cache: Path, quota: dict[str, str]) -> None:
    """CRDs, namespace, PriorityClasses and queue objects, before any workload exists."""
    if system.kind == "ours":
        install_appwrapper_crd(cluster)
        cluster.kubectl("wait", "--for=condition=Established", peers.APPWRAPPER_CRD)
    elif system.kind == "mcad":
        peers.install_crds(cluster, peers.mcad(cache, build=False))
    elif system.kind == "appwrapper":
        kueue = peers.kueue(cache, build=False)
        peers.install_appwrapper(cluster, peers.appwrapper(cache, build=False), kueue)
    else:
        peers.install_kueue(cluster, peers.kueue(cache, build=False))
    cluster.kubectl("create", "namespace", NAMESPACE)
    queues = kueue_objects(quota) if system.kind in ("kueue", "appwrapper") else []
    objects = priority_classes() + queues
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": objects}, server_side=True)


def sample(pid: int, out: Path) -> None:
    """py-spy samples `pid` until it exits, then writes the stacks it saw (folded: one line
    per stack, `frame;frame;... count`). A sampler attached from outside adds little to the
    process's own CPU, which cProfile would double."""
    spy = Path(sys.executable).parent / "py-spy"
    subprocess.Popen(
        [
            *(str(spy), "record", "--pid", str(pid), "--rate", "100", "--nonblocking"),
            *("--format", "raw", "--output", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=(out.parent / "py-spy.log").open("ab"),
    )


def launch(
    system: System,
    cluster: LocalCluster,
    kubeconfig: Path,
    workdir: Path,
    cache: Path,
    *,
    ray: bool = False,
    preemption: bool = False,
    profile: bool = False,
) -> subprocess.Popen[bytes]:
    """Start the system's controller as CONTROLLER_USER (its CRDs and queue objects are
    there). `ray`: Kueue manages RayClusters too; `preemption`: MCAD's --preemption (ours
    preempts by priority by default; Kueue as its ClusterQueue says); `profile`: ours
    sampled by py-spy (100 Hz, without pausing it), its stacks folded in
    workdir/dispatcher.folded when it stops."""
    acting = dataclasses.replace(cluster, kubeconfig=kubeconfig)
    if system.kind == "ours":
        # All nodes count (no node selector), warnings only in its log.
        process = start_dispatcher(acting, workdir, {}, free_port())
        if profile:
            sample(process.pid, workdir / "dispatcher.folded")
        return process
    if system.kind == "mcad":
        extra = ["--preemption=true"] if preemption else []
        return peers.start_mcad(acting, peers.mcad(cache, build=False), workdir, extra)
    qps = system.qps or KUEUE_DEFAULT_QPS
    if system.kind == "appwrapper":
        return peers.start_appwrapper(
            acting,
            peers.appwrapper(cache, build=False),
            peers.kueue(cache, build=False),
            workdir,
            qps=qps,
            burst=int(2 * qps),
        )
    frameworks = ("batch/job", "ray.io/raycluster") if ray else ("batch/job",)
    return peers.start_kueue(
        acting,
        peers.kueue(cache, build=False),
        workdir,
        qps=qps,
        burst=int(2 * qps),
        frameworks=frameworks,
    )
