"""Fair over time: two teams of equal share, one steady and one bursty, over simulated weeks,
with fair sharing by what queues borrow now (`Instant`) and by use over time (`Usage`).

Run from the repository root:

    python -m benchmarks.fairness_bench [--weeks 4] [--seed 42]
        [--out benchmarks/results/fairness.json]

8 nodes x 8 GPUs; two cluster queues, `steady` and `bursty`, of 32 GPUs each in one cohort,
each free to borrow all the other lends (fair sharing on, no preemption: what is fair is
decided at admission only). Jobs are one pod of 1, 2, 4 or 8 GPUs running 1-4 hours.
`steady` submits a Poisson stream offering 80% of the cluster all the time; `bursty`
alternates half-weeks on (offering 160% of the cluster) and off. Both teams want more than
half of the cluster on average, so each is entitled to half of the GPU-hours, and the question
is whether it gets them over weeks. Two streams: `alternating` (both from the start) and
`late` (`bursty` submits nothing in the first week: the week it lost while the other used the
whole cluster is owed back only as far as the half-life remembers it).

The real `schedule` runs on every arrival and every end with a `QuotaView` holding each
queue's history (`core.quota.history`), brought up to the event's time with what each queue
held since the last (the controller samples the same way, at its status writes). Each cycle
sees each queue's first 64 pending jobs in its order (no cycle can admit more than 64 pods
here). Figures per mode: each team's share of the GPU-hours used over the window, and per
week, and the GPU utilisation. Side effects: prints a table, writes the JSON file.
"""

from __future__ import annotations

import argparse
import heapq
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpusim import FLAVOR, GPU, MILLI, gpu_nodes, gpu_queue, gpu_workload
from benchmarks.report import save
from dispatcher.core.model import (
    ClusterSnapshot,
    DispatchedWorkload,
    QueueMode,
    Workload,
)
from dispatcher.core.quota.history import UsageHistory
from dispatcher.core.quota.model import (
    Charge,
    FairSharingMode,
    Flavor,
    LocalQueue,
    QuotaSetup,
)
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import schedule

NODES, PER_NODE = 8, 8
CAPACITY = NODES * PER_NODE
HOUR, DAY, WEEK = 3600.0, 86400.0, 7 * 86400.0
SIZES = (1, 2, 4, 8)
TEAMS = ("steady", "bursty")
PER_QUEUE = 64


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    fair: FairSharingMode
    half_life: float = WEEK


@dataclass(frozen=True, slots=True)
class Job:
    key: str
    team: str
    arrival: float
    gpus: int
    runtime: float


def quota_setup(mode: Mode) -> QuotaSetup:
    return QuotaSetup(
        queues={name: gpu_queue(name, CAPACITY // 2, cohort="all") for name in TEAMS},
        flavors={FLAVOR: Flavor(FLAVOR)},
        local_queues={(t, t): LocalQueue(t, t, t) for t in TEAMS},
        fair_sharing=True,
        fair_preemption=False,
        fair_mode=mode.fair,
        half_life=mode.half_life,
    )


def stream(rng: random.Random, weeks: int, *, late: bool) -> list[Job]:
    """Both teams' jobs in arrival order (`late`: bursty's from the second week)."""
    mean_gpu_hours = sum(SIZES) / len(SIZES) * 2.5
    jobs: list[Job] = []

    def arrivals(team: str, load: float, on: Any) -> None:
        gap = mean_gpu_hours * HOUR / (load * CAPACITY)
        at, index = 0.0, 0
        while at < weeks * WEEK:
            if on(at):
                runtime = rng.uniform(1.0, 4.0) * HOUR
                jobs.append(Job(f"{team}/j{index}", team, at, rng.choice(SIZES), runtime))
                index += 1
            at += rng.expovariate(1.0 / gap)

    arrivals("steady", 0.8, lambda at: True)
    arrivals("bursty", 1.6, lambda at: (at % WEEK) < WEEK / 2 and (at >= WEEK or not late))
    return sorted(jobs, key=lambda j: (j.arrival, j.key))


def workload(job: Job) -> Workload:
    return gpu_workload(job.key, job.arrival, 1, job.gpus, queue_name=job.team)


@dataclass(slots=True)
class _Running:
    job: Job
    started: float
    node: str


def _snapshot(running: dict[str, _Running]) -> ClusterSnapshot:
    used = dict.fromkeys((f"n{i}" for i in range(NODES)), 0)
    for run in running.values():
        used[run.node] += run.job.gpus
    return ClusterSnapshot(
        name="c1",
        nodes=gpu_nodes(used, PER_NODE),
        admitted=tuple(
            DispatchedWorkload(key=k, priority=0, dispatched_at=r.started)
            for k, r in running.items()
        ),
    )


def simulate(jobs: Sequence[Job], mode: Mode, weeks: int) -> dict[str, Any]:
    """The stream through `schedule` in `mode`: GPU-seconds used per team and week."""
    setup = quota_setup(mode)
    tree = QuotaTree(setup)
    by_key = {job.key: job for job in jobs}
    events: list[tuple[float, int, str]] = [(j.arrival, 1, j.key) for j in jobs]
    heapq.heapify(events)
    pending: dict[str, dict[str, Workload]] = {team: {} for team in TEAMS}
    running: dict[str, _Running] = {}
    history = {team: UsageHistory() for team in TEAMS}
    used = {team: [0.0] * weeks for team in TEAMS}
    last = 0.0
    cycles, seconds = 0, 0.0
    horizon = weeks * WEEK
    while events and events[0][0] < horizon:
        now = events[0][0]
        _account(running, used, last, now)
        held = {team: 0.0 for team in TEAMS}
        for run in running.values():
            held[run.job.team] += run.job.gpus * MILLI
        history = {
            team: history[team].advance(now, {GPU: held[team]}, {}, mode.half_life)
            for team in TEAMS
        }
        last = now
        while events and events[0][0] == now:
            _, kind, key = heapq.heappop(events)
            job = by_key[key]
            if kind == 0:
                del running[key]
            else:
                pending[job.team][key] = workload(job)
        if not any(pending.values()):
            continue
        charges = [
            Charge(k, r.job.team, {(FLAVOR, GPU): r.job.gpus * MILLI}, admitted_at=r.started)
            for k, r in running.items()
        ]
        offered = [w for team in TEAMS for w in list(pending[team].values())[:PER_QUEUE]]
        began = time.perf_counter()
        result = schedule(
            sorted(offered, key=lambda w: (w.created_at, w.key)),
            [_snapshot(running)],
            mode=QueueMode.BEST_EFFORT_FIFO,
            now=now,
            starvation_after=1e12,
            preemption=None,
            quotas=QuotaView(tree, charges, history=history),
            presorted=True,
        )
        seconds += time.perf_counter() - began
        cycles += 1
        for admit in result.admits:
            job = by_key[admit.key]
            del pending[job.team][admit.key]
            node = result.placements[admit.key][0].node
            running[admit.key] = _Running(job, now, node)
            heapq.heappush(events, (now + job.runtime, 0, admit.key))
    _account(running, used, last, horizon)
    return _figures(used, weeks) | {
        "cycles": cycles,
        "cycle_ms_mean": round(1000 * seconds / max(cycles, 1), 3),
    }


def _account(
    running: dict[str, _Running], used: dict[str, list[float]], since: float, until: float
) -> None:
    """Add the GPU-seconds each running job used in [since, until) to its team's weeks."""
    if until <= since:
        return
    for run in running.values():
        start = max(since, run.started)
        while start < until:
            week = int(start // WEEK)
            end = min(until, (week + 1) * WEEK)
            if week < len(used[run.job.team]):
                used[run.job.team][week] += (end - start) * run.job.gpus
            start = end


def _figures(used: dict[str, list[float]], weeks: int) -> dict[str, Any]:
    total = {team: sum(values) for team, values in used.items()}
    everything = sum(total.values())
    per_week = []
    for week in range(weeks):
        both = sum(used[team][week] for team in TEAMS)
        per_week.append(
            {team: round(used[team][week] / both, 4) if both else None for team in TEAMS}
        )
    return {
        "share": {team: round(total[team] / everything, 4) for team in TEAMS},
        "share_per_week": per_week,
        "utilisation": round(everything / (weeks * WEEK * CAPACITY), 4),
        "gpu_hours": {team: round(total[team] / HOUR, 1) for team in TEAMS},
    }


MODES = (
    Mode("Instant", FairSharingMode.INSTANT),
    Mode("Usage, half-life 1 day", FairSharingMode.USAGE, DAY),
    Mode("Usage, half-life 3 days", FairSharingMode.USAGE, 3 * DAY),
    Mode("Usage, half-life 7 days", FairSharingMode.USAGE, WEEK),
    Mode("Usage, half-life 28 days", FairSharingMode.USAGE, 4 * WEEK),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fairness_bench", description=__doc__
    )
    parser.add_argument("--weeks", type=int, default=4)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", default="benchmarks/results/fairness.json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    for name, late in (("alternating", False), ("late", True)):
        jobs = stream(random.Random(args.seed), args.weeks, late=late)
        print(
            f"\n{name}: {len(jobs)} jobs over {args.weeks} weeks on {CAPACITY} GPUs "
            f"({sum(j.team == 'bursty' for j in jobs)} bursty)"
        )
        print(f"  {'mode':<26}{'steady':>9}{'bursty':>9}{'util':>8}   bursty's share per week")
        found_modes: dict[str, Any] = {}
        for mode in MODES:
            found = found_modes[mode.name] = simulate(jobs, mode, args.weeks)
            weeks = " ".join(
                "-" if w["bursty"] is None else f"{w['bursty']:.0%}"
                for w in found["share_per_week"]
            )
            print(
                f"  {mode.name:<26}{found['share']['steady']:>9.1%}"
                f"{found['share']['bursty']:>9.1%}{found['utilisation']:>8.1%}   {weeks}"
            )
        results[name] = {"jobs": len(jobs), "modes": found_modes}
    save({"settings": vars(args), "streams": results}, Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
