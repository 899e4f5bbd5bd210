"""Today's full cycle and the queue manager's cycle side by side (the core benchmark's
section 5; also runnable alone).

Run from the repository root:

    python -m benchmarks.queues_bench [--quick] [--out benchmarks/results/queues.json]

The quota scenario of `benchmarks.quota_bench` (100 cluster queues in 14 cohorts, 3 flavors,
1k nodes x 3 clusters) at 1k, 10k and 100k pending. For each mode, both paths:

- *full* (today's `schedule` over every pending workload, its `QuotaView` built from every
  charge): the first cycle, and a steady-state cycle (after the first cycle's admissions,
  one of them finished): the full cycle costs the same whatever changed;
- *kept* (`core.queues.take` over a `QueueManager` filled by one event per workload, its
  `QuotaView` copied from a `Charges` kept on charge and release): the first cycle (every
  workload active, the same decisions as the full one, checked), then steady-state cycles,
  each after one admitted AppWrapper finished (its reservation gone, its quota released:
  the events wake what they can help), and an idle cycle (no event since the last one).

The kept path runs as the controller runs it: the clusters' states kept from cycle to
cycle (`core.scheduling.kept`), preemptors' claims honoured (a preemptor named its victims
once; later cycles name them again without asking the policy, `HonourClaims`). Its steady
cycles are timed three ways: *exact* (every woken workload decided in the cycle), *as
run* (at most the scheduler's `DECISIONS_PER_CYCLE`, the rest in the next cycles), and
*heads* (one workload per queue per cycle, as Kueue takes them).

Times are wall-clock medians (`time.perf_counter`); the full cycle at 100k is timed once.
The admitted AppWrappers' room is added to the clusters as reservations of their pods as
made (with their flavors' node selectors), which is what the next cycle's snapshot would
hold.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.core_bench import NOW, STARVATION_AFTER, _policy, machine
from benchmarks.quota_bench import QuotaScenario, build_quota_scenario
from dispatcher.controller.scheduling.scheduler import DECISIONS_PER_CYCLE
from dispatcher.core.model import ClusterSnapshot, QueueMode, Reservation, Workload
from dispatcher.core.queues import QueueManager, take
from dispatcher.core.quota.charges import Charges
from dispatcher.core.quota.flavors import with_flavors
from dispatcher.core.quota.model import Charge, Flavor
from dispatcher.core.quota.resolve import Queued
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import CycleResult, HonourClaims, PreemptorClaim, schedule
from dispatcher.core.scheduling.kept import KeptRooms

STEADY_STEPS = 5  # finish-then-cycle steps timed per case
MODES: tuple[tuple[QueueMode, str, str], ...] = (
    (QueueMode.STRICT_FIFO, "none", "none"),
    (QueueMode.BEST_EFFORT_FIFO, "none", "none"),
    (QueueMode.STRICT_FIFO, "quotas", "none"),
    (QueueMode.BEST_EFFORT_FIFO, "quotas", "none"),
    (QueueMode.BEST_EFFORT_FIFO, "fair sharing", "none"),
    (QueueMode.STRICT_FIFO, "quotas", "LowestPriorityFirst"),
    (QueueMode.BEST_EFFORT_FIFO, "quotas", "LowestPriorityFirst"),
    (QueueMode.BEST_EFFORT_FIFO, "fair sharing", "LowestPriorityFirst"),
)


@dataclass
class _State:
    """What the cycles have admitted so far, as the next snapshot and charges hold it."""

    clusters: list[ClusterSnapshot]
    charges: dict[str, Charge]
    admitted: list[tuple[str, Workload, str]]  # (cluster, workload, its queue)

    flavors: Mapping[str, Flavor]

    def admit(self, result: CycleResult, pending: dict[str, Workload]) -> None:
        added: dict[str, list[Reservation]] = {}
        for admit in result.admits:
            item = pending.pop(admit.key)
            if admit.assignment is not None:  # its pods as made: on its flavors' nodes
                item = with_flavors(item, admit.assignment.flavors, self.flavors)
            self.admitted.append((admit.cluster, item, admit.queue))
            added.setdefault(admit.cluster, []).append(
                Reservation(key=item.key, pod_sets=item.pod_sets, priority=item.priority)
            )
            if admit.assignment is not None:
                amounts = dict(admit.assignment.amounts)
                self.charges[item.key] = Charge(item.key, admit.queue, amounts, item.priority)
        self.clusters = [
            replace(c, reservations=c.reservations + tuple(added[c.name])) if c.name in added else c
            for c in self.clusters
        ]

    def finish(self, index: int) -> tuple[str, Charge | None]:
        cluster, item, _ = self.admitted.pop(index % len(self.admitted))
        self.clusters = [
            replace(c, reservations=tuple(r for r in c.reservations if r.key != item.key))
            if c.name == cluster
            else c
            for c in self.clusters
        ]
        return item.key, self.charges.pop(item.key, None)


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _full(
    pending: Sequence[Workload],
    state: _State,
    mode: QueueMode,
    preemption: str,
    tree: QuotaTree | None,
) -> CycleResult:
    return schedule(
        pending,
        state.clusters,
        mode=mode,
        now=NOW,
        starvation_after=STARVATION_AFTER,
        preemption=_policy(preemption),
        quotas=None if tree is None else QuotaView(tree, list(state.charges.values())),
    )


def _timed_full(
    pending: Sequence[Workload],  # in any order: the full cycle sorts
    state: _State,
    mode: QueueMode,
    preemption: str,
    tree: QuotaTree | None,
    runs: int,
) -> tuple[float, float, CycleResult]:
    """Median wall-clock and CPU ms of today's cycle, and its decisions."""
    times, cpus, result = [], [], None
    for _ in range(runs):
        started, cpu = time.perf_counter(), time.process_time()
        result = _full(pending, state, mode, preemption, tree)
        times.append(_ms(started))
        cpus.append((time.process_time() - cpu) * 1000)
    assert result is not None
    return statistics.median(times), statistics.median(cpus), result


def _kept(
    scenario: QuotaScenario,
    mode: QueueMode,
    preemption: str,
    tree: QuotaTree | None,
    per_line: int | None,
    first_admits: list[str],
    limit: int | None = None,
) -> dict[str, Any]:
    """The kept path from an empty manager: fill, first cycle, steady cycles, idle."""
    state = _State(
        list(scenario.clusters), {c.key: c for c in scenario.charges}, [], scenario.setup.flavors
    )
    pending = {w.key: w for w in scenario.pending}
    started = time.perf_counter()
    manager = QueueManager()
    resolver = QuotaView(tree) if tree is not None else None
    for item in scenario.pending:
        queued = resolver.resolve(item) if resolver is not None else None
        manager.upsert(item, queued.queue if isinstance(queued, Queued) else "")
    fill_ms = _ms(started)
    usage = Charges(tree, scenario.charges) if tree is not None else None
    states = KeptRooms()
    # As the controller: a preemptor whose victims are named holds a claim, and the next
    # cycles name the same victims instead of asking the policy again (`HonourClaims`).
    claims: dict[str, PreemptorClaim] = {}
    policy = _policy(preemption)

    def cycle(
        held: frozenset[str], heads: int | None, most: int | None
    ) -> tuple[float, float, CycleResult]:
        started, cpu = time.perf_counter(), time.process_time()
        result = take(
            manager,
            state.clusters,
            mode=mode,
            now=NOW,
            starvation_after=STARVATION_AFTER,
            preemption=None if policy is None else HonourClaims(policy, dict(claims)),
            quotas=None if tree is None or usage is None else QuotaView(tree, usage=usage),
            held_before=held,
            per_line=heads,
            limit=most,
            kept=states,
        )
        elapsed = _ms(started), (time.process_time() - cpu) * 1000
        for chosen in result.preemptions:
            claims[chosen.key] = PreemptorClaim(chosen.cluster, chosen.victims, NOW)
        return *elapsed, result

    first_ms, first_cpu, result = cycle(frozenset(), None, None)  # the first decides everything
    assert [a.key for a in result.admits] == first_admits, "paths disagree"
    held = _absorb(state, result, pending, usage)
    steady: list[tuple[float, float, int, int]] = []  # (ms, cpu ms, active, admits)
    for step in range(STEADY_STEPS):
        manager.capacity_freed()  # with nothing admitted to finish: a node changed
        if state.admitted:
            key, charge = state.finish(step * 7)
            root = usage.release(key) if usage is not None and charge is not None else ""
            if root:
                manager.quota_released(root)
        active = len(manager.active(per_line, limit))
        ms, cpu, result = cycle(held, per_line, limit)
        steady.append((ms, cpu, active, len(result.admits)))
        held = _absorb(state, result, pending, usage)
    idle_ms, idle_cpu, _ = cycle(held, per_line, limit)
    return {
        "first_ms": round(first_ms, 1),
        "first_cpu_ms": round(first_cpu, 1),
        "steady_ms": round(statistics.median(s[0] for s in steady), 1),
        "steady_cpu_ms": round(statistics.median(s[1] for s in steady), 1),
        "steady_max_ms": round(max(s[0] for s in steady), 1),
        "steady_active": [s[2] for s in steady],
        "steady_admits": [s[3] for s in steady],
        "idle_ms": round(idle_ms, 1),
        "idle_cpu_ms": round(idle_cpu, 1),
        "fill_ms": round(fill_ms, 1),
        "state": state,
        "pending": pending,
    }


def _absorb(
    state: _State, result: CycleResult, pending: dict[str, Workload], usage: Charges | None
) -> frozenset[str]:
    state.admit(result, pending)
    if usage is not None:
        for admit in result.admits:
            if admit.key in state.charges:
                usage.charge(state.charges[admit.key])
    return result.held


def compare(
    scenario: QuotaScenario, mode: QueueMode, quotas: str, preemption: str, full_runs: int
) -> dict[str, Any]:
    """One mode, every path: the figures of one row."""
    tree = None
    if quotas != "none":
        tree = QuotaTree(scenario.setup_for(mode, fair=quotas == "fair sharing"))
    state = _State(
        list(scenario.clusters), {c.key: c for c in scenario.charges}, [], scenario.setup.flavors
    )
    full_first = _timed_full(scenario.pending, state, mode, preemption, tree, full_runs)
    first = full_first[2]
    admits = [a.key for a in first.admits]
    exact = _kept(scenario, mode, preemption, tree, None, admits)
    heads = _kept(scenario, mode, preemption, tree, 1, admits)
    limited = _kept(scenario, mode, preemption, tree, None, admits, DECISIONS_PER_CYCLE)
    # Today's cycle in the state the exact path reached: it costs the same whatever changed.
    after: _State = exact.pop("state")
    left: dict[str, Workload] = exact.pop("pending")
    for other in (heads, limited):
        other.pop("state"), other.pop("pending")
    full_steady = _timed_full(list(left.values()), after, mode, preemption, tree, full_runs)
    return {
        "pending": len(scenario.pending),
        "mode": mode.value,
        "quotas": quotas,
        "preemption": preemption,
        "first_admits": len(first.admits),
        "full_first_ms": round(full_first[0], 1),
        "full_first_cpu_ms": round(full_first[1], 1),
        "full_steady_ms": round(full_steady[0], 1),
        "full_steady_cpu_ms": round(full_steady[1], 1),
        "kept": exact,
        "kept_heads": heads,
        "kept_limited": limited,
    }


HEADER = (
    f"{'N':>5} {'mode':<14} {'quotas':<12} {'preemption':<19} "
    f"{'full 1st':>8} {'full st.':>8} {'kept 1st':>8} {'kept st.':>8} {'active':>6} "
    f"{'idle':>6} {'as run':>7} {'active':>6} {'heads st.':>9} {'active':>6} {'fill ms':>7}"
)


def _row(row: dict[str, Any]) -> str:
    """CPU ms of each cycle (wall-clock times are in the JSON)."""
    kept, heads, limited = row["kept"], row["kept_heads"], row["kept_limited"]
    count = f"{row['pending'] // 1000}k"
    return (
        f"{count:>5} {row['mode']:<14} {row['quotas']:<12} {row['preemption']:<19} "
        f"{row['full_first_cpu_ms']:>8.1f} {row['full_steady_cpu_ms']:>8.1f} "
        f"{kept['first_cpu_ms']:>8.1f} {kept['steady_cpu_ms']:>8.1f} "
        f"{max(kept['steady_active']):>6} {kept['idle_cpu_ms']:>6.1f} "
        f"{limited['steady_cpu_ms']:>7.1f} {max(limited['steady_active']):>6} "
        f"{heads['steady_cpu_ms']:>9.1f} {max(heads['steady_active']):>6} "
        f"{kept['fill_ms']:>7.0f}"
    )


def side_by_side(
    pendings: Sequence[int], nodes: int, clusters: int, out: Path | None = None
) -> list[dict[str, Any]]:
    """Every mode at every count; with `out`, the JSON is rewritten after each row (a long
    run on a shared machine keeps what it measured)."""
    print(HEADER, flush=True)
    rows: list[dict[str, Any]] = []
    for count in pendings:
        scenario = build_quota_scenario(count, nodes, clusters)
        for mode, quotas, preemption in MODES:
            row = compare(scenario, mode, quotas, preemption, 1 if count >= 50_000 else 3)
            print(_row(row), flush=True)
            rows.append(row)
            if out is not None:
                _write(out, nodes, clusters, rows)
    return rows


def _write(out: Path, nodes: int, clusters: int, rows: list[dict[str, Any]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {"machine": machine(), "nodes_per_cluster": nodes, "clusters": clusters}
    out.write_text(json.dumps({**document, "rows": rows}, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.queues_bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1k and 10k on 200 nodes")
    parser.add_argument("--out", default=None, help="JSON results file")
    args = parser.parse_args(argv)
    out = Path(args.out or "benchmarks/results/queues.json")
    pendings, nodes = ([1000, 10_000], 200) if args.quick else ([1000, 10_000, 100_000], 1000)
    info = machine()
    print(f"python {info['python']}, {info['cpu_count']} cpus, load {info['load_average'][0]}")
    print("CPU ms per cycle (wall-clock in the JSON; the machine may be shared)")
    side_by_side(pendings, nodes, 3, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
