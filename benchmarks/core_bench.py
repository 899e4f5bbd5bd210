"""How fast the scheduling cycle decides, and how fast capacity accounting absorbs watch events.

Run from the repository root:

    python -m benchmarks.core_bench [--quick] [--out benchmarks/results/core.json]

Everything is synthetic and seeded (the same figures come from the same machine): member
clusters of mostly full nodes (about 90% of cpu, memory and GPUs requested by running
pods, GPU nodes tainted), a few hundred reservations of dispatched AppWrappers per
cluster, admitted AppWrappers that preemption may pick from, and pending AppWrappers of
20 shapes (1-8 pods; cpu, memory, some GPUs). Times are wall-clock (`time.perf_counter`),
the median of several runs; the CPU time of the process is shown beside them (on a shared
machine, wall time above CPU time is time other work took) and the load average is
recorded. Side effects: prints a table and writes the JSON file (directories created).

The quota scenario (4) puts the same clusters under 100 cluster queues in cohorts three
levels deep, with flavors that select nodes by label, admitted work charged to the queues
(some borrow), and the headline's number of pending AppWrappers spread over the queues;
it times the whole cycle, building the cycle's `QuotaView` included, in both queue modes,
with and without fair sharing, beside the same workloads on capacity alone.

Section 5 (`benchmarks.queues_bench`) runs today's full cycle beside the queue manager's
cycles (`core.queues.take`) at 1k, 10k and 100k pending: the first cycle, the steady state
after one AppWrapper finishes, an idle cycle, and one head per queue.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE
from dispatcher.api.resources import EMPTY, Resources
from dispatcher.cluster.capacity import CapacityCache, slim_pod
from dispatcher.core.model import (
    ClusterSnapshot,
    DispatchedWorkload,
    NodeSnapshot,
    Placement,
    PodSet,
    QueueMode,
    Reservation,
    Taint,
    Toleration,
    Workload,
)
from dispatcher.core.quota.model import (
    Charge,
)
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import CycleResult, LowestPriorityFirst, PreemptionPolicy, schedule
from dispatcher.core.scheduling.placement import ClusterRoom, Gang, Refusal

GPU = "nvidia.com/gpu"
GI = 2**30 * 1000  # milli-units of one Gi of memory
NOW = 1_000_000.0
STARVATION_AFTER = 3600.0
CYCLE_BUDGET_SECONDS = 30.0  # per benchmark combination
GPU_TAINT = Taint(key=GPU, value="present", effect="NoSchedule")
GPU_TOLERATION = Toleration(key=GPU, operator="Exists")
ON_DEMAND, SPOT, GPU_FLAVOR = "on-demand", "spot", "gpu"  # the quota scenario's flavors

# The pending AppWrappers' shapes: pod sets of (pods, cpu cores, memory Gi, GPUs per pod).
SHAPES: tuple[tuple[tuple[int, float, float, int], ...], ...] = (
    ((1, 1, 2, 0),),
    ((1, 2, 4, 0),),
    ((2, 1, 4, 0),),
    ((4, 2, 8, 0),),
    ((8, 1, 2, 0),),
    ((1, 4, 16, 0),),
    ((2, 4, 16, 0),),
    ((1, 2, 8, 0), (4, 4, 16, 0)),
    ((1, 1, 4, 0), (2, 2, 8, 0)),
    ((3, 0.5, 1, 0),),
    ((1, 8, 32, 0),),
    ((6, 2, 4, 0),),
    ((2, 0.5, 0.5, 0),),
    ((1, 4, 32, 1),),
    ((2, 8, 64, 2),),
    ((1, 8, 64, 4),),
    ((1, 2, 8, 0), (2, 8, 64, 1)),
    ((4, 4, 32, 1),),
    ((1, 16, 128, 8),),
    ((8, 2, 16, 1),),
)


# -- synthetic data ----------------------------------------------------------------------


def _resources(cpu: float, memory_gi: float, gpu: int = 0) -> Resources:
    return Resources({"cpu": int(cpu * 1000), "memory": int(memory_gi * GI), GPU: gpu * 1000})


def pod_sets_for(shape: tuple[tuple[int, float, float, int], ...], name: str) -> tuple[PodSet, ...]:
    """Fresh objects for every AppWrapper, as the controller parses each one on its own."""
    result = []
    for index, (count, cpu, memory, gpu) in enumerate(shape):
        result.append(
            PodSet(
                count=count,
                requests=_resources(cpu, memory, gpu),
                tolerations=(GPU_TOLERATION,) if gpu else (),
                name=f"Job/{name}" if len(shape) == 1 else f"RayCluster/{name} group {index}",
            )
        )
    return tuple(result)


def _split(rng: random.Random, used: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    share = rng.uniform(0.3, 0.7)
    first = {r: int(v * share) for r, v in used.items()}
    return first, {r: v - first[r] for r, v in used.items()}


def node_tier(index: int) -> str:
    """The `tier` label of node `index`: 30% `spot` (half of the GPU nodes), the rest
    `on-demand`; the quota scenario's flavors select nodes by it (no selector without
    quotas asks for it)."""
    return SPOT if index % 10 in (2, 5, 9) else ON_DEMAND


def build_cluster(
    name: str, nodes: int, rng: random.Random, *, busy: tuple[float, float], reserved: int
) -> ClusterSnapshot:
    """A mostly full member cluster: nodes, running AppWrappers, reservations.

    Running pods take 86-94% of each node's cpu and memory and 6-8 of a GPU node's 8 GPUs
    (90% on average); AppWrappers dispatched in the last minute, whose pods are not bound
    yet, take some of the rest (each one was dispatched because it fitted then, as the
    dispatcher does).
    """
    admitted_count = max(1, nodes // 2)
    usage: list[dict[str, Resources]] = [{} for _ in range(admitted_count)]
    node_states = []
    for index in range(nodes):
        node_name = f"{name}-n{index:05d}"
        gpu_node = index % 5 == 4
        if gpu_node:
            allocatable = _resources(96, 1024, 8)
            used = {
                "cpu": int(96_000 * rng.uniform(*busy)),
                "memory": int(1024 * GI * rng.uniform(*busy)),
                GPU: rng.choice([6, 7, 7, 8, 8]) * 1000,
            }
        else:
            allocatable = _resources(64, 256)
            used = {
                "cpu": int(64_000 * rng.uniform(*busy)),
                "memory": int(256 * GI * rng.uniform(*busy)),
            }
        # Most of it belongs to dispatched AppWrappers (preemption candidates), the rest to
        # pods the dispatcher does not manage.
        owned, other = _split(rng, used)
        for part in (owned, other) if rng.random() < 0.4 else (owned,):
            owner = usage[rng.randrange(admitted_count)]
            owner[node_name] = owner.get(node_name, EMPTY) + Resources(part)
        node_states.append(
            NodeSnapshot(
                name=node_name,
                allocatable=allocatable,
                requested=Resources(used),
                labels={
                    "pool": "gpu" if gpu_node else "cpu",
                    "zone": f"z{index % 3}",
                    "tier": node_tier(index),
                },
                taints=(GPU_TAINT,) if gpu_node else (),
            )
        )
    admitted = [
        DispatchedWorkload(
            key=f"run/{name}-{index:05d}",
            priority=rng.choice([0, 0, 0, 0, 0, 0, 1, 1, 1, 5]),
            dispatched_at=NOW - rng.uniform(60, 86_400),
            usage=tuple(sorted(used_by.items())),
        )
        for index, used_by in enumerate(usage)
        if used_by
    ]
    # Dispatch AppWrappers, oldest first, while they fit (as the dispatcher did).
    state = ClusterRoom(ClusterSnapshot(name=name, nodes=tuple(node_states)))
    reservations: list[Reservation] = []
    wanted = min(reserved, max(10, nodes * reserved // 1000))
    for attempt in range(wanted * 4):
        if len(reservations) == wanted:
            break
        key = f"starting/{name}-{attempt:04d}"
        pod_sets = pod_sets_for(rng.choice(SHAPES), key)
        if isinstance(state.place(Gang.of(pod_sets)), Refusal):
            continue
        priority = rng.choice([0, 0, 1])
        dispatched_at = NOW - 60 + attempt * 60 / (wanted * 4)
        reservations.append(
            Reservation(key=key, pod_sets=pod_sets, priority=priority, dispatched_at=dispatched_at)
        )
        admitted.append(DispatchedWorkload(key=key, priority=priority, dispatched_at=dispatched_at))
    return ClusterSnapshot(
        name=name,
        nodes=tuple(node_states),
        reservations=tuple(reservations),
        labels={"region": f"r{ord(name[-1]) % 2}"},
        admitted=tuple(admitted),
    )


def pending_workload(
    key: str, clusters: Sequence[str], rng: random.Random, queue_name: str = ""
) -> Workload:
    """A queued AppWrapper of one of the 20 shapes; one in ten may use one named cluster."""
    created_at = NOW - rng.uniform(1, 1800)
    placement = Placement()
    if len(clusters) > 1 and rng.random() < 0.1:
        placement = Placement(clusters=frozenset({rng.choice(clusters)}))
    return Workload(
        key=key,
        priority=rng.choice([0, 0, 0, 0, 0, 0, 0, 1, 1, 3]),
        created_at=created_at,
        pod_sets=pod_sets_for(rng.choice(SHAPES), key),
        placement=placement,
        queued_since=created_at,
        queue_name=queue_name,
    )


def build_pending(count: int, clusters: Sequence[str], rng: random.Random) -> list[Workload]:
    """Queued AppWrappers of the 20 shapes, in 50 namespaces."""
    return [
        pending_workload(f"ns{index % 50}/aw-{index:06d}", clusters, rng) for index in range(count)
    ]


@dataclass(frozen=True)
class Scenario:
    pending: list[Workload]
    clusters: list[ClusterSnapshot]


def build_scenario(
    pending: int,
    nodes: int,
    clusters: int,
    *,
    seed: int = 7,
    busy: tuple[float, float] = (0.86, 0.94),
    reserved: int = 300,
) -> Scenario:
    rng = random.Random(seed)
    names = [f"member-{chr(ord('a') + i)}" for i in range(clusters)]
    snapshots = [build_cluster(name, nodes, rng, busy=busy, reserved=reserved) for name in names]
    return Scenario(pending=build_pending(pending, names, rng), clusters=snapshots)


# -- measuring ---------------------------------------------------------------------------


def _policy(name: str) -> PreemptionPolicy | None:
    return LowestPriorityFirst() if name == "LowestPriorityFirst" else None


def run_cycle(
    scenario: Scenario,
    mode: QueueMode,
    preemption: str,
    tree: QuotaTree | None = None,
    charges: Sequence[Charge] = (),
) -> CycleResult:
    """One cycle; with a quota `tree`, a fresh `QuotaView` of it and `charges` too (the
    controller caches the tree and builds the view every cycle, so the view is timed)."""
    return schedule(
        scenario.pending,
        scenario.clusters,
        mode=mode,
        now=NOW,
        starvation_after=STARVATION_AFTER,
        preemption=_policy(preemption),
        quotas=None if tree is None else QuotaView(tree, charges),
    )


def timed(
    fn: Callable[[], object], runs: int, budget: float = CYCLE_BUDGET_SECONDS
) -> tuple[list[float], list[float]]:
    """Wall-clock and CPU seconds per call; stops early (after one call at least) once
    `budget` would be exceeded. The CPU time of this process shows how much of the wall
    time other work on a shared machine took."""
    times: list[float] = []
    cpu: list[float] = []
    for _ in range(runs):
        gc.collect()
        started = time.perf_counter()
        cpu_started = time.process_time()
        fn()
        cpu.append(time.process_time() - cpu_started)
        times.append(time.perf_counter() - started)
        if sum(times) + times[-1] > budget:
            break
    return times, cpu


@dataclass(frozen=True)
class CycleFigure:
    pending: int
    nodes: int
    clusters: int
    mode: str
    preemption: str
    runs: int
    median_ms: float
    min_ms: float
    max_ms: float
    cpu_median_ms: float
    admits: int
    waits: int
    preemptions: int

    @property
    def decisions_per_second(self) -> float:
        return (self.admits + self.waits) / (self.median_ms / 1000)

    def as_json(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "nodes_per_cluster": self.nodes,
            "clusters": self.clusters,
            "mode": self.mode,
            "preemption": self.preemption,
            "runs": self.runs,
            "median_ms": round(self.median_ms, 2),
            "min_ms": round(self.min_ms, 2),
            "max_ms": round(self.max_ms, 2),
            "cpu_median_ms": round(self.cpu_median_ms, 2),
            "decisions_per_second": round(self.decisions_per_second),
            "admits": self.admits,
            "waits": self.waits,
            "preemptions": self.preemptions,
        }


def measure_cycle(
    scenario: Scenario, *, mode: QueueMode, preemption: str, runs: int
) -> CycleFigure:
    return measure(scenario, mode=mode, preemption=preemption, runs=runs)[0]


def measure(
    scenario: Scenario,
    *,
    mode: QueueMode,
    preemption: str,
    runs: int,
    tree: QuotaTree | None = None,
    charges: Sequence[Charge] = (),
) -> tuple[CycleFigure, CycleResult]:
    """The figure, and the decisions of the warm-up cycle (every run decides the same)."""

    def cycle() -> CycleResult:
        return run_cycle(scenario, mode, preemption, tree, charges)

    result = cycle()  # warm-up, and the decisions to report
    times, cpu = timed(cycle, runs)
    figure = CycleFigure(
        pending=len(scenario.pending),
        nodes=len(scenario.clusters[0].nodes),
        clusters=len(scenario.clusters),
        mode=mode.value,
        preemption=preemption,
        runs=len(times),
        median_ms=statistics.median(times) * 1000,
        min_ms=min(times) * 1000,
        max_ms=max(times) * 1000,
        cpu_median_ms=statistics.median(cpu) * 1000,
        admits=len(result.admits),
        waits=len(result.waits),
        preemptions=len(result.preemptions),
    )
    return figure, result


def _fmt_count(value: int) -> str:
    return f"{value // 1000}k" if value >= 1000 and value % 1000 == 0 else str(value)


def _cycle_row(figure: CycleFigure) -> str:
    return (
        f"{_fmt_count(figure.pending):>6} {_fmt_count(figure.nodes):>6} {figure.clusters:>3}  "
        f"{figure.mode:<15} {figure.preemption:<20} {figure.runs:>4} "
        f"{figure.median_ms:>10.1f} {figure.min_ms:>9.1f} {figure.cpu_median_ms:>8.1f} "
        f"{figure.decisions_per_second:>12,.0f} "
        f"{figure.admits:>6} {figure.preemptions:>4}"
    )


CYCLE_HEADER = (
    f"{'N':>6} {'M':>6} {'C':>3}  {'mode':<15} {'preemption':<20} {'runs':>4} "
    f"{'median ms':>10} {'min ms':>9} {'cpu ms':>8} {'decisions/s':>12} {'admits':>6} {'pre':>4}"
)


def cycle_matrix(
    pendings: Sequence[int], nodes: Sequence[int], clusters: Sequence[int]
) -> tuple[list[CycleFigure], list[str]]:
    """BestEffortFIFO without preemption over every (N, M, C); skips what would be too slow."""
    figures: list[CycleFigure] = []
    skipped: list[str] = []
    for m in nodes:
        for c in clusters:
            per_pending: float | None = None  # seconds per pending workload, at this (M, C)
            for n in pendings:
                label = f"{_fmt_count(n)} x {_fmt_count(m)} x {c}"
                if per_pending is not None and per_pending * n > CYCLE_BUDGET_SECONDS:
                    skipped.append(f"{label}: one cycle estimated over {CYCLE_BUDGET_SECONDS:g}s")
                    continue
                biggest = n == max(pendings) and m == max(nodes) and c == max(clusters)
                scenario = build_scenario(n, m, c)
                figure = measure_cycle(
                    scenario,
                    mode=QueueMode.BEST_EFFORT_FIFO,
                    preemption="none",
                    runs=3 if biggest else 5,
                )
                print(_cycle_row(figure), flush=True)
                figures.append(figure)
                per_pending = figure.median_ms / 1000 / n
    return figures, skipped


def headline(pending: int, nodes: int, clusters: int) -> list[CycleFigure]:
    scenario = build_scenario(pending, nodes, clusters)
    figures = []
    for mode in (QueueMode.STRICT_FIFO, QueueMode.BEST_EFFORT_FIFO):
        for preemption in ("none", "LowestPriorityFirst"):
            figure = measure_cycle(scenario, mode=mode, preemption=preemption, runs=7)
            print(_cycle_row(figure), flush=True)
            figures.append(figure)
    return figures


def growth(pendings: Sequence[int], nodes: int, clusters: int) -> list[dict[str, Any]]:
    """time(2N) / time(N) at fixed nodes and clusters, per mode and preemption."""
    rows = []
    for mode in (QueueMode.BEST_EFFORT_FIFO, QueueMode.STRICT_FIFO):
        for preemption in ("none", "LowestPriorityFirst"):
            times = {}
            for n in pendings:
                scenario = build_scenario(n, nodes, clusters)
                figure = measure_cycle(scenario, mode=mode, preemption=preemption, runs=5)
                times[n] = figure.median_ms
            for small, large in itertools.pairwise(pendings):
                ratio = times[large] / times[small]
                rows.append(
                    {
                        "mode": mode.value,
                        "preemption": preemption,
                        "from": small,
                        "to": large,
                        "nodes_per_cluster": nodes,
                        "clusters": clusters,
                        "from_ms": round(times[small], 2),
                        "to_ms": round(times[large], 2),
                        "ratio": round(ratio, 3),
                    }
                )
                print(
                    f"  {mode.value:<15} {preemption:<20} {_fmt_count(small):>4} -> "
                    f"{_fmt_count(large):>4}: {times[small]:8.1f} ms -> {times[large]:8.1f} ms"
                    f"  ratio {ratio:.2f}",
                    flush=True,
                )
    return rows


# -- capacity cache ----------------------------------------------------------------------


def _raw_node(name: str, *, cpu: str = "64", ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"pool": "cpu"}, "resourceVersion": "1"},
        "spec": {"unschedulable": False},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _raw_pod(index: int, node: str, phase: str, rng: random.Random, version: int) -> dict[str, Any]:
    owned = index % 3 != 0
    labels = {"app": f"app-{index % 97}"}
    if owned:
        labels |= {LABEL_NAME: f"aw-{index // 4}", LABEL_NAMESPACE: "team"}
    containers = [
        {
            "name": f"c{c}",
            "image": "busybox",
            "resources": {
                "requests": {"cpu": f"{rng.choice([100, 250, 500, 1000])}m", "memory": "512Mi"},
                "limits": {"cpu": "2", "memory": "1Gi"},
            },
        }
        for c in range(rng.choice([1, 1, 2]))
    ]
    return slim_pod(
        {
            "metadata": {
                "name": f"pod-{index:06d}",
                "namespace": "team",
                "uid": f"uid-{index}",
                "resourceVersion": str(version),
                "labels": labels,
            },
            "spec": {"nodeName": node, "containers": containers},
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else ""}],
            },
        }
    )


def capacity_events(pod_events: int, nodes: int) -> dict[str, Any]:
    """Events per second absorbed by `CapacityCache.on_pod` and `on_node`."""
    rng = random.Random(11)
    node_names = [f"node-{i:05d}" for i in range(nodes)]
    raw_nodes = [_raw_node(name) for name in node_names]
    # Each pod lives through ADDED (unbound), MODIFIED (bound, Running), MODIFIED (Succeeded),
    # DELETED: four events; the last quarter of lifecycles is cut so the total is exact.
    events: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    version = 1
    index = 0
    while len(events) < pod_events:
        node = rng.choice(node_names)
        stages = [
            _raw_pod(index, "", "Pending", rng, version),
            _raw_pod(index, node, "Running", rng, version + 1),
            _raw_pod(index, node, "Succeeded", rng, version + 2),
        ]
        version += 3
        events.append(("ADDED", None, stages[0]))
        events.append(("MODIFIED", stages[0], stages[1]))
        events.append(("MODIFIED", stages[1], stages[2]))
        events.append(("DELETED", stages[2], None))
        index += 1
    events = events[:pod_events]

    def feed_pods() -> CapacityCache:
        cache = CapacityCache(cluster="bench")
        for raw in raw_nodes:
            cache.on_node("ADDED", None, raw)
        for kind, old, new in events:
            cache.on_pod(kind, old, new)
        return cache

    node_events: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
    for round_ in range(10):
        for i, name in enumerate(node_names):
            # Mostly heartbeats that change nothing the dispatcher reads; some flap Ready.
            flapping = (i + round_) % 50 == 0
            node_events.append(("MODIFIED", raw_nodes[i], _raw_node(name, ready=not flapping)))

    def feed_nodes() -> CapacityCache:
        cache = CapacityCache(cluster="bench")
        for raw in raw_nodes:
            cache.on_node("ADDED", None, raw)
        for kind, old, new in node_events:
            cache.on_node(kind, old, new)
        return cache

    pod_times, _ = timed(feed_pods, 5)
    node_times, _ = timed(feed_nodes, 5)
    # The node ADDED events are part of both loops; count them in.
    pod_seconds = statistics.median(pod_times)
    node_seconds = statistics.median(node_times)
    return {
        "nodes": nodes,
        "pod_events": len(events),
        "pod_seconds": round(pod_seconds, 4),
        "pod_events_per_second": round((len(events) + nodes) / pod_seconds),
        "node_events": len(node_events) + nodes,
        "node_seconds": round(node_seconds, 4),
        "node_events_per_second": round((len(node_events) + nodes) / node_seconds),
        "runs": len(pod_times),
    }


# -- main --------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    return {
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.core_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a small subset, in a few seconds")
    parser.add_argument("--out", default=None, help="JSON results file")
    args = parser.parse_args(argv)
    out = Path(
        args.out
        or ("benchmarks/results/core-quick.json" if args.quick else "benchmarks/results/core.json")
    )
    info = machine()
    print(
        f"python {info['python']} on {info['platform']}, {info['cpu_count']} cpus, "
        f"load average {info['load_average'][0]}" + (" (quick)" if args.quick else "")
    )
    if args.quick:
        pendings, nodes, clusters = [1000], [100], [1, 3]
        head = (2000, 200, 3)
        growth_at: tuple[list[int], int, int] = ([1000, 2000], 200, 3)
        pod_events, cache_nodes = 10_000, 100
    else:
        pendings, nodes, clusters = [1000, 10_000, 50_000], [100, 1000, 5000], [1, 3]
        head = (10_000, 1000, 3)
        growth_at = ([5000, 10_000, 20_000], 1000, 3)
        pod_events, cache_nodes = 100_000, 1000

    print("\n(1) scheduling cycle: N pending x M nodes per cluster x C clusters")
    print(CYCLE_HEADER)
    matrix, skipped = cycle_matrix(pendings, nodes, clusters)
    for line in skipped:
        print(f"  skipped {line}")
    if not skipped:
        print(f"  (no combination skipped: none was estimated over {CYCLE_BUDGET_SECONDS:g}s)")

    print(f"\n    headline case, {_fmt_count(head[0])} x {_fmt_count(head[1])} x {head[2]}")
    print(CYCLE_HEADER)
    heads = headline(*head)

    print(f"\n(2) growth with N at M={_fmt_count(growth_at[1])}, C={growth_at[2]}")
    ratios = growth(*growth_at)

    print(f"\n(3) capacity cache, {pod_events:,} pod events over {cache_nodes:,} nodes")
    capacity = capacity_events(pod_events, cache_nodes)
    print(
        f"  on_pod:  {capacity['pod_events_per_second']:>10,} events/s "
        f"({capacity['pod_seconds'] * 1000:.0f} ms for {capacity['pod_events']:,} + "
        f"{cache_nodes:,} node ADDED)"
    )
    print(
        f"  on_node: {capacity['node_events_per_second']:>10,} events/s "
        f"({capacity['node_seconds'] * 1000:.0f} ms for {capacity['node_events']:,})"
    )

    # Imported here: the quota scenario builds on this module's scenario and measuring.
    from benchmarks.quota_bench import (
        QUOTA_HEADER,
        build_quota_scenario,
        quota_cycles,
        quota_summary,
    )

    quota_scenario = build_quota_scenario(*head)
    summary = quota_summary(quota_scenario)
    print(
        f"\n(4) quotas: {summary['queues']} queues in {summary['cohorts']} cohorts "
        f"({summary['cohort_levels']} levels, {summary['cohorts_with_quotas']} with quotas), "
        f"{summary['flavors']} flavors, {summary['charges']:,} charges "
        f"({summary['borrowing_queues']} queues borrowing), "
        f"{_fmt_count(head[0])} x {_fmt_count(head[1])} x {head[2]}; tree built once in "
        f"{summary['tree_build_ms']:.1f} ms, the QuotaView in every cycle"
    )
    print(QUOTA_HEADER)
    quota_figures = quota_cycles(
        quota_scenario, preemptions=("none", "LowestPriorityFirst"), runs=7
    )

    from benchmarks.queues_bench import side_by_side

    queue_counts = [1000, 2000] if args.quick else [1000, 10_000, 100_000]
    print(
        f"\n(5) today's full cycle beside the queue manager's, quotas of (4), "
        f"{_fmt_count(head[1])} nodes x {head[2]}, CPU ms (benchmarks.queues_bench)"
    )
    queue_rows = side_by_side(queue_counts, head[1], head[2])

    worst = max(heads, key=lambda f: f.median_ms)
    label = f"{_fmt_count(head[0])} pending x {_fmt_count(head[1])} nodes x {head[2]} clusters"
    print()
    for figure in heads:
        preemption = "no preemption" if figure.preemption == "none" else figure.preemption
        print(
            f"cycle {label}: {figure.median_ms:.1f} ms (target < 100 ms)"
            f"  [{figure.mode}, {preemption}, median of {figure.runs}]"
        )
    worst_ratio = max((row["ratio"] for row in ratios), default=0.0)
    print(f"growth time(2N)/time(N), worst: {worst_ratio:.2f} (target <= 2)")
    quota_label = (
        f"{label}, {summary['queues']} queues in {summary['cohorts']} cohorts"
        f" ({summary['cohort_levels']} levels)"
    )
    for quota_figure in quota_figures:
        if quota_figure.quotas == "none":
            continue
        cycle = quota_figure.cycle
        preemption = "no preemption" if cycle.preemption == "none" else cycle.preemption
        fair = "fair sharing" if quota_figure.quotas == "fair sharing" else "no fair sharing"
        print(
            f"cycle with quotas {quota_label}: {cycle.median_ms:.1f} ms, max {cycle.max_ms:.1f} ms"
            f" (target < 100 ms)  [{cycle.mode}, {fair}, {preemption}, median of {cycle.runs}]"
        )
    quota_worst = max(
        (f for f in quota_figures if f.quotas != "none"), key=lambda f: f.cycle.median_ms
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": info,
                "load_average_after": [round(x, 2) for x in os.getloadavg()],
                "quick": args.quick,
                "cycle_matrix": [f.as_json() for f in matrix],
                "skipped": skipped,
                "headline": {
                    "pending": head[0],
                    "nodes_per_cluster": head[1],
                    "clusters": head[2],
                    "worst_median_ms": round(worst.median_ms, 2),
                    "target_ms": 100,
                    "cases": [f.as_json() for f in heads],
                },
                "growth": ratios,
                "capacity_cache": capacity,
                "queues": queue_rows,
                "quotas": {
                    "pending": head[0],
                    "nodes_per_cluster": head[1],
                    "clusters": head[2],
                    "scenario": summary,
                    "worst_median_ms": round(quota_worst.cycle.median_ms, 2),
                    "worst_max_ms": round(max(f.cycle.max_ms for f in quota_figures), 2),
                    "target_ms": 100,
                    "cases": [f.as_json() for f in quota_figures],
                },
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
