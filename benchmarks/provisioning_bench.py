"""Provisioned gangs on the local control plane: a gang that fits nowhere gets its nodes from a
ProvisioningRequest and runs; many at once are never left partially placed.

    python -m benchmarks.provisioning_bench [--gangs 50] [--solo 5] [--fresh 1]
        [--delay 1.0] [--out benchmarks/results/provisioning.json] [--workdir DIR]

A gang is an AppWrapper of a head (1 CPU) and 8 GPU workers (1 CPU, 1 GPU each), submitted to
a ClusterAppQueue whose `admissionChecks` name the ProvisioningRequest check (quota for all
the gangs). The cluster has one 4-CPU node and no GPU: every gang fits nowhere, holds its
quota, and asks for nodes. The test kit's provisioner (testenv/provisioner.py,
run in this process) answers: after `--delay` seconds a KWOK node per pod, then
`Provisioned`. The dispatcher runs as its own process, with its production settings
(`provisioning.poll_seconds` 5 s: the watch of requests wakes a gang, not the poll).

1. Fresh CRD (`--fresh` times): the ProvisioningRequest CRD installed just now (deleted and
   installed again for each repetition after the first), the dispatcher (re)started, one
   gang timed: the case in which the first request was once seen to be 2 s late.
2. Alone (`--solo` times): one gang, apply -> Running; its nodes removed after each.
3. At once (`--gangs`): all applied together.

For each gang: apply -> Running; the provisioner's own time (request seen -> nodes Ready ->
`Provisioned`, as the provisioner measures it); the dispatcher's share = the rest (reserve
the quota, make the request, notice `Provisioned`, fit and dispatch, KWOK starting the pods);
and its steps: applied -> quota held (`QuotaHeld`, the dispatcher's stamp) -> request seen
by a watch of requests here -> `Provisioned` seen -> `Dispatched` -> `Running`.

**Partially placed**, watched on every pod event (an informer on the pods of AppWrappers,
not a poll): a gang is partially placed while at least one of its pods is bound to a node
(`spec.nodeName`) and at least one of its 9 pods is not (not created yet, or not bound). Its
objects are created one after the other and kube-scheduler binds pods one by one, so every
gang passes through that state briefly. A violation is a gang that:

- stays partially placed for longer than `--grace` seconds (5) at a stretch;
- has a pod that kube-scheduler reports unschedulable (`PodScheduled` False,
  `Unschedulable`) while any of its pods is bound: it was dispatched onto room that was not
  there;
- has a ProvisioningRequest asking for fewer than all of its pods (the quota and the nodes
  asked for part of a gang);
- is still partially placed when the phase ends.

A gang not Running when the phase ends is **stuck**. A gang may make more than one request:
kube-scheduler may bind other gangs' pods (a head, 1 CPU) on the nodes made for it before it
is placed, and after `provisioning.fit_timeout_seconds` it asks again (docs/autoscaling.md);
the requests per gang are reported.

The phase also reports the longest partially placed stretch of any gang, the time to all
Running, the ProvisioningRequests made, and the API requests the dispatcher made (its
/metrics, the member liveness probe left out). Figures print as a table and go to JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.e2e_bench import (
    APPWRAPPERS,
    PODS,
    Watcher,
    _without_probes,
    create_all,
    percentile,
    scrape,
    settled_counts,
    start_dispatcher,
    wait_ready,
)
from benchmarks.report import save
from dispatcher.api.constants import LABEL_NAME
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import KubeError, NotFound
from dispatcher.kube.informer import Informer
from testenv.converter import install_appwrapper_crd
from testenv.localcluster import REPO_ROOT, LocalCluster, ensure_binaries, free_port
from testenv.manifests import (
    app_flavor,
    app_queue,
    appwrapper,
    cluster_queue,
    deployment,
)
from testenv.provisioner import TestProvisioner

NAMESPACE = "prov"
POOL = {"bench/pool": "prov"}
CHECK = "prov"
WORKERS = 8
GANG_PODS = WORKERS + 1
GPU = "nvidia.com/gpu"
PROVISIONING_CRD = REPO_ROOT / "crds" / "provisioning" / "provisioningrequest.yaml"
CRD_NAME = "provisioningrequests.autoscaling.x-k8s.io"
REQUESTS = ResourceInfo(
    "autoscaling.x-k8s.io/v1", "ProvisioningRequest", "provisioningrequests", True
)
NODES = ResourceInfo("v1", "Node", "nodes", False)


def gang(name: str) -> dict[str, Any]:
    head = deployment(f"{name}-head", 1, {"cpu": "1"})
    workers = deployment(f"{name}-workers", WORKERS, {"cpu": "1", GPU: "1"})
    return appwrapper(name, head, workers, queue="team")


def settings() -> dict[str, Any]:
    return {
        "log_level": "info",
        "provisioning": {"enabled": True, "checks": {CHECK: {}}},
    }


@dataclass
class Gang:
    pods: dict[str, bool] = field(default_factory=dict)
    """Pod name -> bound to a node."""
    running: set[str] = field(default_factory=set)
    all_bound: float = 0.0
    all_running: float = 0.0
    partial_since: float | None = None
    longest_partial: float = 0.0
    unschedulable_while_partial: int = 0


class Placement:
    """Every pod event of the AppWrappers' pods: which gangs are partially placed, and for
    how long at a stretch."""

    def __init__(self, client: KubeClient) -> None:
        self.informer = Informer(client, PODS, label_selector=LABEL_NAME)
        self.informer.add_handler(self._on)
        self.gangs: dict[str, Gang] = {}
        self.events = 0

    def _on(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        now = time.time()
        obj = new if new is not None else old
        if obj is None:
            return
        self.events += 1
        meta = obj["metadata"]
        gang = self.gangs.setdefault(meta["labels"][LABEL_NAME], Gang())
        if new is None:
            gang.pods.pop(meta["name"], None)
            gang.running.discard(meta["name"])
            return  # removals come from the clean-up between phases, not measured
        gang.pods[meta["name"]] = bool((new.get("spec") or {}).get("nodeName"))
        if (new.get("status") or {}).get("phase") == "Running":
            gang.running.add(meta["name"])
            if len(gang.running) == GANG_PODS and not gang.all_running:
                gang.all_running = now
        bound = sum(gang.pods.values())
        if bound == GANG_PODS and not gang.all_bound:
            gang.all_bound = now
        if 0 < bound < GANG_PODS:
            if gang.partial_since is None:
                gang.partial_since = now
            if _unschedulable(new):
                gang.unschedulable_while_partial += 1
        elif gang.partial_since is not None:
            gang.longest_partial = max(gang.longest_partial, now - gang.partial_since)
            gang.partial_since = None

    def report(self, names: list[str], grace: float) -> dict[str, Any]:
        now = time.time()
        violations: dict[str, list[str]] = {}
        longest = 0.0
        for name in names:
            found = self.gangs.get(name, Gang())
            stretch = found.longest_partial
            if found.partial_since is not None:
                stretch = max(stretch, now - found.partial_since)
                violations.setdefault(name, []).append("still partially placed")
            longest = max(longest, stretch)
            if stretch > grace:
                violations.setdefault(name, []).append(f"partially placed for {stretch:.2f}s")
            if found.unschedulable_while_partial:
                violations.setdefault(name, []).append("a pod unschedulable while others bound")
        return {"violations": violations, "longest_partial_seconds": longest}


def _unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled"
        and c.get("status") == "False"
        and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class Requests:
    """When each ProvisioningRequest was first seen, and seen `Provisioned` (a watch)."""

    def __init__(self, client: KubeClient) -> None:
        self.informer = Informer(client, REQUESTS)
        self.seen: dict[str, float] = {}
        self.provisioned: dict[str, float] = {}
        self.owner: dict[str, str] = {}
        self.pods: dict[str, int] = {}

    def on(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None:
            return
        now = time.time()
        name = new["metadata"]["name"]
        self.seen.setdefault(name, now)
        self.owner[name] = new["metadata"]["ownerReferences"][0]["name"]
        self.pods[name] = sum(int(p["count"]) for p in new["spec"]["podSets"])
        conditions = (new.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Provisioned" and c["status"] == "True" for c in conditions):
            self.provisioned.setdefault(name, now)

    def of(self, gang_name: str) -> list[str]:
        return sorted(n for n, owner in self.owner.items() if owner == gang_name)


@dataclass
class Bench:
    cluster: LocalCluster
    client: KubeClient
    workdir: Path
    provisioner: TestProvisioner
    watcher: Watcher
    placement: Placement
    requests: Requests
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    watching: asyncio.Task[None] | None = None

    def watch_requests(self) -> None:
        if self.watching is not None:
            self.watching.cancel()
        self.requests.informer = Informer(self.client, REQUESTS)
        self.requests.informer.add_handler(self.requests.on)
        self.watching = asyncio.create_task(self.requests.informer.run())

    def start(self) -> None:
        self.port = free_port()
        self.process = start_dispatcher(
            self.cluster, self.workdir, POOL, self.port, None, settings()
        )
        wait_ready(self.port, timeout=120)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(60)
            self.process = None

    def figures(self, name: str, applied: float) -> dict[str, Any]:
        """One gang's timeline (seconds from its apply) and the dispatcher's share."""
        first = self.watcher.first.get(name, {})
        placed = self.placement.gangs[name]
        (request,) = self.requests.of(name)[-1:]
        running = first["Running"] - applied
        own = self.provisioner.provisioned_in[request]
        return {
            "gang": name,
            "running": running,
            "provisioner": own,
            "dispatcher": running - own,
            "quota_held": first["QuotaHeld"] - applied,
            "request_seen": self.requests.seen[request] - applied,
            "provisioned_seen": self.requests.provisioned[request] - applied,
            "dispatched": first["Dispatched"] - applied,
            "pods_bound": placed.all_bound - applied,
            "pods_running": placed.all_running - applied,
        }

    async def run_gangs(self, names: list[str], timeout: float) -> dict[str, float]:
        """Apply `names`; when each create was answered. Returns once all are Running, or
        after `timeout` (the ones not Running then are the caller's to report)."""
        jobs = [(APPWRAPPERS, NAMESPACE, gang(n)) for n in names]
        done = await create_all(self.client, jobs)
        with contextlib.suppress(TimeoutError):
            await self.watcher.wait("Running", set(names), timeout=timeout)
        return {n: done[f"appwrappers/{n}"] for n in names}

    def stranded(self, names: list[str]) -> dict[str, str]:
        """The gangs not Running, and what their status says."""
        out = {}
        for name in names:
            if "Running" not in self.watcher.first.get(name, {}):
                obj = self.watcher.informer.store.get(f"{NAMESPACE}/{name}") or {}
                out[name] = str((obj.get("status") or {}).get("message") or "")
        return out

    async def remove(self, names: list[str]) -> None:
        """Delete the gangs, then (their pods gone) the nodes made for them; the dispatcher's
        node cache must not offer them to the next gang."""
        for name in names:
            with contextlib.suppress(NotFound):
                await self.client.delete(APPWRAPPERS, NAMESPACE, name)
        await _until(lambda: not any(self.placement.gangs.get(n, Gang()).pods for n in names))
        nodes = [n for made in self.provisioner.nodes.values() for n in made]
        self.provisioner.nodes.clear()
        for node in nodes:
            with contextlib.suppress(KubeError):
                await self.client.delete(NODES, None, node)
        left = set(nodes)

        async def gone() -> bool:
            listed = await self.client.list(NODES, None)
            return not left & {n["metadata"]["name"] for n in listed["items"]}

        await _until_async(gone)
        await asyncio.sleep(1.0)  # the dispatcher's node watch sees the deletions


async def _until(check: Any, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("clean-up")
        await asyncio.sleep(0.2)


async def _until_async(check: Any, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("clean-up")
        await asyncio.sleep(0.2)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "p90": percentile(values, 0.9),
        "max": max(values),
        "min": min(values),
    }


def install_crd(cluster: LocalCluster) -> float:
    """The ProvisioningRequest CRD, from scratch; seconds until it is Established."""
    started = time.monotonic()
    cluster.kubectl("apply", "-f", str(PROVISIONING_CRD))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    return time.monotonic() - started


async def fresh_crd(bench: Bench, repetitions: int, timeout: float) -> list[dict[str, Any]]:
    runs = []
    for index in range(repetitions):
        bench.stop()
        if index:
            bench.cluster.kubectl("delete", "crd", CRD_NAME, "--wait=true", "--timeout=120s")
        established = install_crd(bench.cluster)
        bench.watch_requests()  # a watch of a kind that was absent looks again only later
        started = time.time()
        bench.start()
        ready = time.time() - started
        name = f"fresh-{index}"
        applied = await bench.run_gangs([name], timeout)
        figures = bench.figures(name, applied[name])
        figures.update(crd_established_seconds=established, dispatcher_ready_seconds=ready)
        runs.append(figures)
        _row(figures)
        await bench.remove([name])
    return runs


async def solo(bench: Bench, repetitions: int, timeout: float) -> dict[str, Any]:
    runs = []
    for index in range(repetitions):
        name = f"solo-{index}"
        applied = await bench.run_gangs([name], timeout)
        runs.append(bench.figures(name, applied[name]))
        _row(runs[-1])
        await bench.remove([name])
    return {
        "runs": runs,
        "dispatcher": summary([r["dispatcher"] for r in runs]),
        "provisioner": summary([r["provisioner"] for r in runs]),
        "running": summary([r["running"] for r in runs]),
        "steps_median": {step: statistics.median(r[step] for r in runs) for step in STEPS},
    }


async def at_once(bench: Bench, count: int, grace: float, timeout: float) -> dict[str, Any]:
    names = [f"gang-{index:03d}" for index in range(count)]
    before = scrape(bench.port)
    started = time.time()
    applied = await bench.run_gangs(names, timeout)
    all_running = time.time() - started
    stranded = bench.stranded(names)
    placed = bench.placement.report(names, grace)
    runs = [bench.figures(n, applied[n]) for n in names if n not in stranded]
    after = await settled_counts(bench.port, quiet=3.0, timeout=300)
    made = {n: bench.requests.of(n) for n in names}
    for requests in made.values():
        for request in requests:
            if bench.requests.pods[request] != GANG_PODS:
                name = bench.requests.owner[request]
                placed["violations"].setdefault(name, []).append(
                    f"request {request} for {bench.requests.pods[request]} pods"
                )
    api = {
        k: after.get(k, 0) - before.get(k, 0)
        for k in sorted(set(_without_probes(after)) | set(_without_probes(before)))
        if after.get(k, 0) != before.get(k, 0)
    }
    result = {
        "gangs": count,
        "grace_seconds": grace,
        "violations": len(placed["violations"]),
        "violating": placed["violations"],
        "longest_partial_seconds": placed["longest_partial_seconds"],
        "pod_events": bench.placement.events,
        "seconds_to_all_running": None if stranded else all_running,
        "seconds_waited": all_running,
        "not_running": stranded,
        "provisioning_requests": sum(len(r) for r in made.values()),
        "requests_per_gang": dict(sorted(Counter(len(r) for r in made.values()).items())),
        "nodes_made": sum(len(v) for v in bench.provisioner.nodes.values()),
        "api_requests": api,
        "api_requests_per_gang": sum(api.values()) / count,
        "dispatcher": summary([r["dispatcher"] for r in runs]),
        "provisioner": summary([r["provisioner"] for r in runs]),
        "running": summary([r["running"] for r in runs]),
        "steps_median": {step: statistics.median(r[step] for r in runs) for step in STEPS},
        "runs": runs,
    }
    return result


STEPS = (
    "quota_held",
    "request_seen",
    "provisioned_seen",
    "dispatched",
    "pods_bound",
    "pods_running",
)
SHORT = ("held", "req.", "prov'd", "disp'd", "bound", "pods R")
HEADER = f"{'gang':<10} {'Running':>8} {'prov.':>6} {'disp.':>6} |" + "".join(
    f" {label:>6}" for label in SHORT
)
"""Per gang: seconds from its apply to Running, the provisioner's own time, the rest (the
dispatcher's share); then seconds from apply to each step (STEPS)."""


def _row(r: dict[str, Any]) -> None:
    steps = "".join(f" {r[step]:6.2f}" for step in STEPS)
    print(
        f"{r['gang']:<10} {r['running']:8.2f} {r['provisioner']:6.2f} {r['dispatcher']:6.2f} |"
        + steps,
        flush=True,
    )


def table(result: dict[str, Any]) -> None:
    print("\nseconds from apply; disp. = Running - the provisioner's own time")
    print(f"{'phase':<10} {'n':>3} {'stat':<7} {'Running':>8} {'prov.':>6} {'disp.':>6}")
    phases = [("alone", result["alone"]), ("at once", result["at_once"])]
    for label, phase in phases:
        for stat in ("median", "p90", "max"):
            n = len(phase["runs"]) if stat == "median" else ""
            print(
                f"{label if stat == 'median' else '':<10} {n!s:>3} {stat:<7}"
                f" {phase['running'][stat]:8.2f} {phase['provisioner'][stat]:6.2f}"
                f" {phase['dispatcher'][stat]:6.2f}"
            )
    print("median seconds from apply to each step: " + ", ".join(STEPS))
    for label, phase in phases:
        print(f"{label:<10} " + " ".join(f"{phase['steps_median'][s]:6.2f}" for s in STEPS))
    at = result["at_once"]
    print(
        f"\n{at['gangs']} at once: {at['gangs'] - len(at['not_running'])} Running after"
        f" {at['seconds_waited']:.1f}s;"
        f" {at['provisioning_requests']} requests (gangs by requests made:"
        f" {at['requests_per_gang']}), {at['nodes_made']} nodes;"
        f" partially placed violations {at['violations']} (longest stretch"
        f" {at['longest_partial_seconds']:.2f}s, grace {at['grace_seconds']:.0f}s);"
        f" {at['api_requests_per_gang']:.1f} API requests per gang"
    )


async def run(args: Any, workdir: Path) -> dict[str, Any]:
    cluster = LocalCluster.start("provbench", workdir, binaries=ensure_binaries())
    try:
        cluster.add_node("prov-cpu", cpu="4", memory="16Gi", labels=POOL)
        cluster.wait_nodes_ready(["prov-cpu"], timeout=120)
        install_appwrapper_crd(cluster)
        cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "queues.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        cluster.kubectl("create", "namespace", NAMESPACE)
        amounts = {"cpu": GANG_PODS * args.gangs, "memory": "1Ti", GPU: WORKERS * args.gangs}
        cluster.apply(app_flavor("any"))
        cluster.apply(cluster_queue("gpu", {"any": amounts}, admissionChecks=[CHECK]))
        cluster.kubectl(
            "apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(app_queue("team", "gpu"))
        )
        client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), pool_size=32)
        provisioner = TestProvisioner(cluster.kubeconfig, NAMESPACE, labels=POOL, delay=args.delay)
        bench = Bench(
            cluster,
            client,
            workdir,
            provisioner,
            Watcher(client),
            Placement(client),
            Requests(client),
        )
        tasks = [
            asyncio.create_task(i.run()) for i in (bench.watcher.informer, bench.placement.informer)
        ]
        try:
            async with provisioner:
                result: dict[str, Any] = {"delay_seconds": args.delay, "settings": settings()}
                print(HEADER, flush=True)
                result["fresh_crd"] = await fresh_crd(bench, args.fresh, args.timeout)
                result["alone"] = await solo(bench, args.solo, args.timeout)
                result["at_once"] = await at_once(bench, args.gangs, args.grace, args.timeout)
                return result
        finally:
            bench.stop()
            for task in [*tasks, bench.watching]:
                if task is None:
                    continue
                task.cancel()
            await client.close()
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gangs", type=int, default=50)
    parser.add_argument("--solo", type=int, default=5)
    parser.add_argument("--fresh", type=int, default=1, help="fresh-CRD repetitions")
    parser.add_argument("--delay", type=float, default=1.0, help="the provisioner's scale-up")
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for gangs to run"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/provisioning.json"))
    parser.add_argument("--workdir", type=Path, help="keep the cluster's and dispatcher's logs")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        workdir = report.workdir(stack, args.workdir, "aw-prov-")
        result = asyncio.run(run(args, workdir))
    table(result)
    save(result, args.out)


if __name__ == "__main__":
    main()
