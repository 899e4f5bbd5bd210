"""Side by side: this dispatcher, MCAD and Kueue, the same work on the same local control plane.

    python -m benchmarks.peer_bench [--systems ours,mcad,kueue] [--count 1000] [--cap 600]
                                    [--out benchmarks/results/peers.json] [--workdir DIR]

Needs the peers built (`make peers`). Scenario "backlog drain": N one-pod Jobs are queued
before the controller starts, on KWOK nodes with room for all of them; then the controller
starts, and the run measures how long it takes to admit them all. Each system gets the work
in its own terms:

- ours: AppWrappers wrapping the Job; admitted = its `Dispatched` condition True;
- mcad (v1.40.0): the same AppWrappers, under MCAD's own AppWrapper CRD (same name as ours,
  so never both in one cluster); admitted = the `Dispatched` condition True that MCAD adds
  (reason AppWrapperRunnable) once it has created the wrapped items;
- kueue (v0.15.0): the Jobs themselves, created with `spec.suspend: true` and the label
  `kueue.x-k8s.io/queue-name` (no webhook does it for them here), a ResourceFlavor, a
  ClusterQueue with quota for the whole cluster and a LocalQueue; admitted = `spec.suspend`
  false. `kueue:QPS` runs Kueue with that client QPS (burst twice that) instead of its
  default 50/100; ours runs at 200/400, MCAD at its fixed 100/200.

The time of admission is when this benchmark's watch sees it (one clock for every system).
Each system runs alone, from a fresh local control plane, with a time cap: past it, the run
records how many were admitted by then. Figures: seconds from controller start to the last
admission, admissions per second, create->admitted and start->admitted percentiles, the
controller's CPU seconds and peak RSS (its whole process tree), control-plane CPU seconds,
and the drain curve (seconds, admitted so far).

Side effects: starts and stops local control planes and the controllers; writes the JSON
results (default benchmarks/results/peers.json); Kueue's start may write its metrics
certificate under /etc/kueue (see benchmarks.peers).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import peers
from benchmarks.e2e_bench import cluster_cpu, cpu_used, create_all, percentile, start_dispatcher
from benchmarks.report import save
from dispatcher.api.constants import API_VERSION, KIND, PLURAL
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.informer import Informer
from dispatcher.testing.localcluster import (
    DEFAULT_CACHE,
    REPO_ROOT,
    LocalCluster,
    ensure_binaries,
    free_port,
)
from dispatcher.testing.manifests import appwrapper, job

APPWRAPPERS = ResourceInfo(API_VERSION, KIND, PLURAL, True)
JOBS = ResourceInfo("batch/v1", "Job", "jobs", True)
KUEUE_API = f"kueue.x-k8s.io/{peers.KUEUE_STORAGE}"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NAMESPACE = "bench"
QUEUE = "bench"
FLAVOR = "default-flavor"
REQUESTS = {"cpu": "100m", "memory": "64Mi"}
"""Each Job's one pod."""
NODE = {"cpu": 32, "memory_gi": 128, "pods": 110}
"""Each KWOK node's capacity (allocatable)."""
OURS_QPS = "200/400"
MCAD_QPS = "100/200"
KUEUE_DEFAULT_QPS = 50.0

Obj = dict[str, Any]


@dataclass(frozen=True)
class System:
    """One system under test: `kind` is ours, mcad or kueue; `qps` only for Kueue."""

    kind: str
    qps: float = 0

    @property
    def label(self) -> str:
        return f"kueue:{self.qps:g}" if self.kind == "kueue" and self.qps else self.kind

    @property
    def client_qps(self) -> str:
        if self.kind == "kueue":
            qps = self.qps or KUEUE_DEFAULT_QPS
            return f"{qps:g}/{2 * qps:g}"
        return OURS_QPS if self.kind == "ours" else MCAD_QPS


def parse_systems(text: str) -> list[System]:
    """ "ours,mcad,kueue,kueue:200" -> Systems (an unknown name is an error)."""
    systems = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, qps = item.partition(":")
        if kind not in ("ours", "mcad", "kueue") or (qps and kind != "kueue"):
            raise ValueError(f"unknown system {item!r}: ours, mcad, kueue or kueue:QPS")
        systems.append(System(kind, float(qps) if qps else 0))
    return systems


def node_count(count: int) -> int:
    """KWOK nodes with room for `count` one-pod Jobs (pods per node is the limit), at least 2."""
    return max(2, -(-count // (NODE["pods"] - 10)))


def bench_job(name: str, kueue: bool) -> Obj:
    body = job(name, 1, REQUESTS)
    if kueue:
        body["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: QUEUE}
        body["spec"]["suspend"] = True
    return body


def workloads(system: System, count: int) -> list[tuple[ResourceInfo, str, Obj]]:
    """The N workloads, natively for `system`."""
    if system.kind == "kueue":
        return [(JOBS, NAMESPACE, bench_job(f"job-{i}", True)) for i in range(count)]
    return [
        (APPWRAPPERS, NAMESPACE, appwrapper(f"job-{i}", bench_job(f"job-{i}", False)))
        for i in range(count)
    ]


def kueue_objects(nodes: int) -> list[Obj]:
    """A ResourceFlavor, a ClusterQueue (every namespace) with quota for every node's
    capacity, and the LocalQueue the Jobs name."""
    quota = {
        "cpu": str(nodes * NODE["cpu"]),
        "memory": f"{nodes * NODE['memory_gi']}Gi",
        "pods": str(nodes * NODE["pods"]),
    }
    return [
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
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
    ]


def dispatched(obj: Obj) -> bool:
    """An AppWrapper (ours or MCAD's) with its Dispatched condition True."""
    return any(
        c.get("type") == "Dispatched" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def unsuspended(obj: Obj) -> bool:
    """A Job that Kueue admitted: no longer suspended."""
    return (obj.get("spec") or {}).get("suspend") is False


class AdmissionWatch:
    """When each object was first seen admitted (this machine's clock, at the watch event)."""

    def __init__(self, client: KubeClient, info: ResourceInfo, admitted: Callable[[Obj], bool]):
        self.informer = Informer(client, info)
        self.admitted = admitted
        self.first: dict[str, float] = {}
        self.informer.add_handler(self._on)

    def _on(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is None or new["metadata"].get("namespace") != NAMESPACE:
            return
        name = new["metadata"]["name"]
        if name not in self.first and self.admitted(new):
            self.first[name] = time.time()


def tree_stats(pid: int) -> dict[str, float]:
    """CPU seconds and RSS (MB) of a process and its live descendants (with the CPU of the
    children it reaped), and its own peak RSS."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
            stats[int(entry.name)] = fields
    family = {pid}
    grew = True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in family and child not in family:
                family.add(child)
                grew = True
    cpu = 0.0
    rss = 0.0
    peak = 0.0
    for member in family & set(stats):
        fields = stats[member]
        cpu += (int(fields[11]) + int(fields[12])) / ticks
        if member == pid:
            cpu += (int(fields[13]) + int(fields[14])) / ticks
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{member}/status").read_text()
            values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            rss += int(values["VmRSS"].split()[0]) / 1024
            if member == pid:
                peak = int(values["VmHWM"].split()[0]) / 1024
    return {"cpu_seconds": cpu, "rss_mb": rss, "peak_rss_mb": peak}


def summarize(
    count: int,
    created: dict[str, float],
    admitted: dict[str, float],
    started: float,
    cap: float,
) -> dict[str, Any]:
    """The drain figures from create and admission times (epoch seconds, by name)."""
    names = sorted(admitted)
    last = max(admitted.values(), default=started)
    seconds = last - started
    figures: dict[str, Any] = {
        "admitted": len(names),
        "all_admitted": len(names) == count,
        "seconds_to_all_admitted": round(seconds, 3) if len(names) == count else None,
        "seconds_to_first_admitted": (
            round(min(admitted.values()) - started, 3) if admitted else None
        ),
        "cap_seconds": cap,
        # Over the time it took when all made it, else over the whole capped run.
        "admitted_per_second": round(
            len(names) / (seconds if len(names) == count and seconds > 0 else cap), 3
        ),
    }
    if names:
        from_create = [admitted[n] - created[n] for n in names if n in created]
        from_start = [admitted[n] - started for n in names]
        figures["create_to_admitted_seconds"] = quantiles(from_create)
        figures["start_to_admitted_seconds"] = quantiles(from_start)
    return figures


def quantiles(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 0.5), 3),
        "p99": round(percentile(values, 0.99), 3),
        "max": round(max(values), 3),
    }


def launch(
    system: System, cluster: LocalCluster, workdir: Path, cache: Path
) -> subprocess.Popen[bytes]:
    """Start the system's controller (its CRDs and queue objects are already there)."""
    if system.kind == "ours":
        # All nodes count (no node selector), warnings only in its log.
        return start_dispatcher(cluster, workdir, {}, free_port())
    if system.kind == "mcad":
        return peers.start_mcad(cluster, peers.mcad(cache, build=False), workdir)
    qps = system.qps or KUEUE_DEFAULT_QPS
    return peers.start_kueue(
        cluster, peers.kueue(cache, build=False), workdir, qps=qps, burst=int(2 * qps)
    )


def prepare(system: System, cluster: LocalCluster, cache: Path, nodes: int) -> None:
    """CRDs, namespace and queue objects, before any workload is created."""
    if system.kind == "ours":
        cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "appwrapper.yaml"))
        cluster.kubectl("wait", "--for=condition=Established", peers.APPWRAPPER_CRD)
    elif system.kind == "mcad":
        peers.install_crds(cluster, peers.mcad(cache, build=False))
    else:
        peers.install_kueue(cluster, peers.kueue(cache, build=False))
    cluster.kubectl("create", "namespace", NAMESPACE)
    if system.kind == "kueue":
        for obj in kueue_objects(nodes):
            cluster.apply(obj, server_side=True)


async def drain(
    system: System,
    cluster: LocalCluster,
    workdir: Path,
    cache: Path,
    count: int,
    cap: float,
    running: list[subprocess.Popen[bytes]],
) -> dict[str, Any]:
    """Queue `count` workloads, start the controller (appended to `running`, for the caller
    to stop), and follow admissions until all are admitted or `cap` seconds have passed."""
    client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), pool_size=64)
    try:
        await asyncio.sleep(2)  # the CRDs' discovery settles before anything is timed
        items = workloads(system, count)
        queued_at = time.time()
        done = await create_all(client, items)
        created = {key.split("/", 1)[1]: stamp for key, stamp in done.items()}
        queued_seconds = time.time() - queued_at
        info, admitted = (
            (JOBS, unsuspended) if system.kind == "kueue" else (APPWRAPPERS, dispatched)
        )
        watch = AdmissionWatch(client, info, admitted)
        watching = asyncio.create_task(watch.informer.run())
        await watch.informer.synced.wait()
        early = len(watch.first)  # admitted with no controller running: should be 0
        plane_before = cluster_cpu(cluster)
        started = time.time()
        process = launch(system, cluster, workdir, cache)
        running.append(process)
        progress: list[tuple[float, int]] = []
        last = tree_stats(process.pid)
        peak_tree_rss = last["rss_mb"]
        exited = None
        while len(watch.first) < count and time.time() - started < cap:
            await asyncio.sleep(1)
            if process.poll() is not None:
                exited = process.returncode
                break
            last = tree_stats(process.pid)
            peak_tree_rss = max(peak_tree_rss, last["rss_mb"])
            # The drain curve: a point whenever the count moved, else every 10 s.
            moved = not progress or progress[-1][1] != len(watch.first)
            if moved or time.time() - started - progress[-1][0] >= 10:
                progress.append((round(time.time() - started, 1), len(watch.first)))
        elapsed = time.time() - started
        await asyncio.sleep(1)  # the last events in flight
        plane_after = cluster_cpu(cluster)
        if process.poll() is None:
            last = tree_stats(process.pid)
        progress.append((round(elapsed, 1), len(watch.first)))
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        jobs = await client.list(JOBS, NAMESPACE)
        figures = summarize(count, created, watch.first, started, cap)
        plane = cpu_used(plane_before, plane_after)
        figures.update(
            {
                "system": system.label,
                "version": {
                    "ours": "this repository",
                    "mcad": peers.MCAD_VERSION,
                    "kueue": peers.KUEUE_VERSION,
                }[system.kind],
                "client_qps_burst": system.client_qps,
                "count": count,
                "nodes": node_count(count),
                "seconds_queueing": round(queued_seconds, 2),
                "admitted_before_start": early,
                "seconds_observed": round(elapsed, 1),
                "controller_exit_code": exited,
                "controller_cpu_seconds": round(last["cpu_seconds"], 2),
                "controller_cpu_seconds_per_admission": (
                    round(last["cpu_seconds"] / len(watch.first), 4) if watch.first else None
                ),
                "controller_peak_rss_mb": round(max(last["peak_rss_mb"], peak_tree_rss), 1),
                "control_plane_cpu_seconds": plane,
                "apiserver_cpu_seconds": plane.get("kube-apiserver"),
                "jobs_in_namespace": len(jobs.get("items", [])),
                "progress": progress,
            }
        )
        return figures
    finally:
        await client.close()


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def run_system(system: System, workdir: Path, cache: Path, count: int, cap: float) -> Obj:
    """One system alone, from a fresh local control plane, stopped (all of it) at the end."""
    home = workdir / system.label.replace(":", "-")
    home.mkdir(parents=True, exist_ok=True)
    nodes = node_count(count)
    cluster = LocalCluster.start("peers", home, binaries=ensure_binaries(cache))
    running: list[subprocess.Popen[bytes]] = []
    try:
        names = []
        for index in range(nodes):
            name = f"node-{index}"
            cluster.add_node(
                name, cpu=str(NODE["cpu"]), memory=f"{NODE['memory_gi']}Gi", pods=NODE["pods"]
            )
            names.append(name)
        cluster.wait_nodes_ready(names, timeout=120)
        prepare(system, cluster, cache, nodes)
        return asyncio.run(drain(system, cluster, home, cache, count, cap, running))
    finally:
        for process in running:
            stop(process)
        cluster.stop()


def table(runs: Sequence[Obj]) -> str:
    header = (
        "| System | Version | Client QPS | Admitted | To all (s) | Per s | create->adm p50/p99 (s)"
        " | start->adm p50/p99 (s) | Ctl CPU (s) | Ctl peak RSS (MB) | API server CPU (s) |"
    )
    lines = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['system']} | | | error: {r['error']} |" + " |" * 7)
            continue

        def pair(key: str, r: Obj = r) -> str:
            q = r.get(key)
            return f"{q['p50']:.2f} / {q['p99']:.2f}" if q else "-"

        to_all = r["seconds_to_all_admitted"]
        shown = f"{to_all:.1f}" if to_all is not None else f"> {r['cap_seconds']:g} (cap)"
        lines.append(
            f"| {r['system']} | {r['version']} | {r['client_qps_burst']} "
            f"| {r['admitted']}/{r['count']} "
            f"| {shown} "
            f"| {r['admitted_per_second']:.2f} | {pair('create_to_admitted_seconds')} "
            f"| {pair('start_to_admitted_seconds')} | {r['controller_cpu_seconds']:.1f} "
            f"| {r['controller_peak_rss_mb']:.0f} | {r['apiserver_cpu_seconds'] or 0:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--systems", default="ours,mcad,kueue", type=parse_systems)
    parser.add_argument("--count", type=int, default=1000, help="Jobs queued (default 1000)")
    parser.add_argument(
        "--cap", type=float, default=600, help="seconds per run before giving up (default 600)"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/peers.json")
    parser.add_argument("--workdir", type=Path, help="keep the clusters' and controllers' logs")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    # Stopped (timeout, kill): the clean-up in run_system still runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for kind in {s.kind for s in args.systems} - {"ours"}:
        peer = peers.BUILDERS[kind](args.cache, build=False)
        if not peer.binary.exists():
            parser.error(f"{kind} is not built: run `make peers` first ({peer.binary})")
    runs = []
    with contextlib.ExitStack() as stack:
        if args.workdir:
            args.workdir.mkdir(parents=True, exist_ok=True)
            workdir = args.workdir.resolve()
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="aw-peers-")))
        for system in args.systems:
            print(f"{system.label}: backlog drain of {args.count} Jobs...", flush=True)
            try:
                figures = run_system(system, workdir, args.cache, args.count, args.cap)
            except Exception as exc:  # one system failing must not lose the others' figures
                figures = {"system": system.label, "error": f"{type(exc).__name__}: {exc}"[:500]}
            print(
                {k: v for k, v in figures.items() if k not in ("progress",)},
                flush=True,
            )
            runs.append(figures)
    result: Obj = {
        "scenario": "backlog_drain",
        "count": args.count,
        "cap_seconds": args.cap,
        "job_pod_requests": REQUESTS,
        "node": NODE,
        "versions": {"mcad": peers.MCAD_VERSION, "kueue": peers.KUEUE_VERSION},
        "runs": runs,
    }
    save(result, args.out)
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
