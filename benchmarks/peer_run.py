"""One run of the peer benchmark: one system, one scenario, a fresh local control plane.

Where it sits: benchmarks.peer_bench calls `run_one` for each (scenario, pair, system);
`run_one` starts the control plane with the scenario's nodes, sets it up for the system
(benchmarks.peer_systems), and hands a `Run` to the scenario's coroutine
(benchmarks.peer_scenarios), which uses it to start the controller, create work, wait with the
run's cap, and collect the costs of a measured window.

Side effects: starts and stops a control plane and a controller; writes under the work
directory.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.e2e_bench import cluster_cpu, cpu_used, create_all
from benchmarks.peer_measure import (
    COSTS_OVER_ADMITTED,
    PodState,
    counted,
    overcommitted_pods,
    partial_gangs,
    per_workload,
    requests_of,
)
from benchmarks.peer_systems import (
    CONTROLLER_USER,
    NAMESPACE,
    AuditedCluster,
    System,
    Workload,
    admitted,
    controller_kubeconfig,
    kwok_stages,
    launch,
    native,
    prepare,
    workload_resources,
)
from benchmarks.peer_watch import AuditTail, Recorder, tree_stats
from dispatcher.kube.client import KubeClient
from testenv.localcluster import Binaries, LocalCluster, node_manifest

Obj = dict[str, Any]

READS = ("get", "list", "watch")
WARM_UP = "warm-up"
WARM_UP_SECONDS = 180.0
"""How long a controller may take to admit its first workload before the run gives up."""


@dataclass(frozen=True)
class Nodes:
    """The KWOK nodes of a scenario: CPUs of each, and what every node has besides."""

    cpus: tuple[int, ...]
    memory_gi: int = 64
    pods: int = 110

    def quota(self) -> dict[str, str]:
        """All of it, as Kueue quota."""
        return {
            "cpu": str(sum(self.cpus)),
            "memory": f"{self.memory_gi * len(self.cpus)}Gi",
            "pods": str(self.pods * len(self.cpus)),
        }


@dataclass
class Window:
    """The measured part of a run: from `started` (epoch seconds), with the CPU used so far."""

    started: float
    controller_cpu: float
    plane_cpu: dict[str, float]


@dataclass
class Run:
    """What a scenario works with: the system, its cluster and client, the recorder, and the
    cap on any wait (seconds from the start of the measured window)."""

    system: System
    cluster: LocalCluster
    kubeconfig: Path
    client: KubeClient
    home: Path
    cache: Path
    cap: float
    ray: bool = False
    profile: bool = False
    """ours under cProfile (benchmarks.peer_systems.launch)."""
    process: subprocess.Popen[bytes] | None = None
    recorder: Recorder | None = None
    peak_rss_mb: float = 0.0
    cpu_seconds: float = 0.0
    """The controller's CPU seconds when last sampled (kept if it exits)."""
    exit_code: int | None = None
    progress: list[tuple[float, int, int]] = field(default_factory=list)
    audit: AuditTail = field(init=False)

    def __post_init__(self) -> None:
        self.audit = AuditTail(self.cluster.workdir / "logs" / "audit.log")

    async def watch(self) -> Recorder:
        recorder = Recorder(
            self.client,
            workload_resources(self.system, self.ray),
            lambda obj: admitted(self.system, obj),
        )
        await recorder.start()
        self.recorder = recorder
        return recorder

    def launch(self, *, preemption: bool = False) -> None:
        self.process = launch(
            self.system,
            self.cluster,
            self.kubeconfig,
            self.home,
            self.cache,
            ray=self.ray,
            preemption=preemption,
            profile=self.profile,
        )

    async def create(self, works: Sequence[Workload]) -> dict[str, float]:
        """Create them all at full client speed; name -> when its create returned."""
        items = []
        for work in works:
            info, body = native(self.system, work)
            items.append((info, NAMESPACE, body))
        done = await create_all(self.client, items)
        return {key.split("/", 1)[1]: stamp for key, stamp in done.items()}

    async def delete(self, work: Workload) -> None:
        info, _ = native(self.system, work)
        await self.client.delete(info, NAMESPACE, work.name)

    async def warm_up(self) -> float:
        """One tiny workload through the controller, then deleted: the controller is ready.
        How long it took."""
        assert self.recorder is not None
        work = Workload(WARM_UP, requests=(("cpu", "1m"), ("memory", "1Mi")))
        started = time.time()
        await self.create([work])
        deadline = started + WARM_UP_SECONDS
        recorder = self.recorder

        def finished() -> bool:
            # Succeeded: its pod no longer holds room on a node.
            return any(
                s.gang == work.name and s.state in (PodState.DONE, PodState.GONE)
                for s in recorder.samples
            )

        while work.name not in recorder.admitted or not finished():
            if time.time() > deadline or not self.alive():
                raise TimeoutError(f"{self.system.label} ran nothing in {WARM_UP_SECONDS}s")
            await recorder.wait_changed(1.0)
        await self.delete(work)
        return round(time.time() - started, 2)

    def alive(self) -> bool:
        if self.process is None:
            return True
        if self.process.poll() is not None:
            self.exit_code = self.process.returncode
            return False
        return True

    def begin(self) -> Window:
        """Start a measured window (the progress curve starts again with it)."""
        self.progress = []
        cpu = tree_stats(self.process.pid)["cpu_seconds"] if self.process else 0.0
        return Window(time.time(), cpu, cluster_cpu(self.cluster))

    async def until(
        self, done: Callable[[], bool], window: Window, *, tick: Callable[[], Awaitable[None]]
    ) -> bool:
        """Wait until `done()`, or the cap from the window's start, or the controller exits;
        whether it was done. `tick` runs about every half second meanwhile (and the
        controller's memory is sampled)."""
        assert self.recorder is not None
        last_sample = 0.0
        while not done():
            now = time.time()
            if now - window.started > self.cap or not self.alive():
                return False
            if now - last_sample >= 1.0:
                last_sample = now
                self.sample(window)
            await tick()
            await self.recorder.wait_changed(0.5)
        self.sample(window)
        return True

    def sample(self, window: Window) -> None:
        """The controller's memory, and a point of the progress curve."""
        assert self.recorder is not None
        if self.process is not None and self.process.poll() is None:
            stats = tree_stats(self.process.pid)
            self.cpu_seconds = stats["cpu_seconds"]
            self.peak_rss_mb = max(self.peak_rss_mb, stats["rss_mb"], stats["peak_rss_mb"])
        point = (
            round(time.time() - window.started, 1),
            len(self.recorder.admitted.keys() - {WARM_UP}),
            len(self.recorder.finished.keys() - {WARM_UP}),
        )
        if not self.progress or self.progress[-1][1:] != point[1:]:
            self.progress.append(point)

    async def settle(self, *, quiet: float = 2.0, limit: float = 10.0) -> None:
        """Until the controller has written nothing for `quiet` seconds (at most `limit`):
        what follows an admission (the wrapped objects' creates, Events) counts too."""
        last_write = time.time()
        deadline = last_write + limit
        while time.time() < deadline:
            new = self.audit.read()
            if any(counted(e) and e.get("verb") not in READS for e in new):
                last_write = time.time()
            elif time.time() - last_write >= quiet:
                return
            await asyncio.sleep(0.5)

    async def costs(self, window: Window, workloads: int, *, settle: bool = True) -> Obj:
        """What the window cost: controller and API server CPU, the controller's requests by
        verb (audit log), its peak memory, and what the pods showed (overcommits, gangs).
        With `settle`, the window ends once the controller's writes have settled. Per
        workload: over `workloads` (those admitted: a run cut at its cap spent its CPU on
        fewer than were given), at least one."""
        workloads = max(1, workloads)
        assert self.recorder is not None
        if settle:
            await self.settle()
        self.audit.read()
        ended = time.time()
        self.sample(window)
        cpu = self.cpu_seconds - window.controller_cpu if self.process else 0.0
        plane = cpu_used(window.plane_cpu, cluster_cpu(self.cluster))
        requests = requests_of(
            self.audit.events, user=CONTROLLER_USER, since=window.started, until=ended
        )
        over = overcommitted_pods(self.recorder.samples)
        partial = partial_gangs(self.recorder.samples)
        return {
            "controller_cpu_seconds": round(cpu, 2),
            "costs_per": COSTS_OVER_ADMITTED,
            "controller_cpu_seconds_per_workload": round(cpu / workloads, 4),
            "apiserver_cpu_seconds": plane.get("kube-apiserver"),
            "apiserver_cpu_seconds_per_workload": round(
                plane.get("kube-apiserver", 0.0) / workloads, 4
            ),
            "control_plane_cpu_seconds": plane,
            "requests": requests.total,
            "requests_per_workload": round(requests.total / workloads, 3),
            "requests_per_workload_by_verb": per_workload(requests.by_verb, workloads),
            "requests_per_workload_by_resource": per_workload(requests.by_resource, workloads),
            "controller_peak_rss_mb": round(self.peak_rss_mb, 1),
            "controller_exit_code": self.exit_code,
            "overcommitted_pods": len(over),
            "overcommitted_pod_names": sorted(over)[:20],
            "partial_gangs": len(partial),
            "partial_gang_names": sorted(partial)[:20],
            "progress": self.progress,
        }


@dataclass(frozen=True)
class Scenario:
    """A scenario: its name, its nodes, whether KubeRay runs, and its coroutine."""

    name: str
    nodes: Nodes
    body: Callable[[Run], Awaitable[Obj]]
    ray: bool = False


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def run_one(
    system: System,
    scenario: Scenario,
    *,
    home: Path,
    binaries: Binaries,
    cache: Path,
    cap: float,
    profile: bool = False,
) -> Obj:
    """`scenario` for `system` alone on a fresh control plane, all of it stopped at the end."""
    home.mkdir(parents=True, exist_ok=True)
    cluster = AuditedCluster.start(
        "peers",
        home,
        binaries=binaries,
        kuberay=scenario.ray,
        audit=True,
        kwok_stages=kwok_stages(binaries, home),
    )
    run: Run | None = None
    try:
        names = [f"node-{i}" for i in range(len(scenario.nodes.cpus))]
        nodes = [
            node_manifest(
                name,
                cpu=str(cpus),
                memory=f"{scenario.nodes.memory_gi}Gi",
                pods=scenario.nodes.pods,
            )
            for name, cpus in zip(names, scenario.nodes.cpus, strict=True)
        ]
        cluster.apply({"apiVersion": "v1", "kind": "List", "items": nodes})
        cluster.wait_nodes_ready(names, timeout=120)
        kubeconfig = controller_kubeconfig(cluster)
        prepare(system, cluster, cache, scenario.nodes.quota())

        async def go() -> Obj:
            nonlocal run
            client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), pool_size=64)
            run = Run(
                system,
                cluster,
                kubeconfig,
                client,
                home,
                cache,
                cap,
                ray=scenario.ray,
                profile=profile,
            )
            try:
                await asyncio.sleep(2)  # the CRDs' discovery settles before anything is timed
                await run.watch()
                return await scenario.body(run)
            finally:
                if run.recorder is not None:
                    await run.recorder.stop()
                await client.close()

        figures = asyncio.run(go())
        figures.update(
            {
                "system": system.label,
                "version": system.version,
                "client_qps_burst": system.client_qps,
                "nodes": len(scenario.nodes.cpus),
                "node_cpus": sum(scenario.nodes.cpus),
                "cap_seconds": cap,
            }
        )
        return figures
    finally:
        if run is not None and run.process is not None:
            stop(run.process)
        cluster.stop()
