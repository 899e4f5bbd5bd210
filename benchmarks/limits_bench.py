"""Per-user limits and budgets over simulated time, in one shared queue, side by side with the
queue without them.

Run from the repository root:

    python -m benchmarks.limits_bench [--seed 42] [--out benchmarks/results/limits.json]

8 nodes x 8 GPUs and one BestEffortFIFO cluster queue of 64 GPUs; jobs are one pod of 1, 2,
4 or 8 GPUs running 1-4 hours. The real `schedule` runs on every arrival and end, with a
`QuotaView` holding the queue's spending as the controller samples it (`core.quota.budget`).

- **Flood**, one week: alice submits work offering 300% of the cluster, bob, carol and dave
  15% each. Without a limit, against `userLimits.maxResources` of 24 GPUs: the most alice
  held at once, each user's share of the GPU-hours, and the others' mean wait.
- **Budget**, two weeks: a team offering 80% of the cluster against a weekly budget of 40% of
  the cluster's GPU-hours; its jobs declare a limit of their runtime x U(1, 1.5), and in a
  second run 10% declare none (`whenExhausted: Finish`). Per week: what was spent against
  the budget (the most it was overdrawn), and the GPU utilisation.

Side effects: prints tables, writes the JSON file.
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.gpusim import FLAVOR, GPU, MILLI, gpu_nodes, gpu_queue, gpu_workload
from benchmarks.report import save
from dispatcher.core.model import ClusterSnapshot, QueueMode, Workload
from dispatcher.core.quota.budget import HOUR, Budget, BudgetPeriod, Spent
from dispatcher.core.quota.model import (
    Charge,
    Flavor,
    LocalQueue,
    QuotaSetup,
    UserLimit,
)
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import schedule

NODES, PER_NODE = 8, 8
CAPACITY = NODES * PER_NODE
DAY, WEEK = 24 * HOUR, 7 * 24 * HOUR
SIZES = (1, 2, 4, 8)
OFFERED = 32  # pending jobs of each user a cycle sees, in order (the queue manager parks
# what a user's limit refuses, so the others' work is reached whatever one user floods)
START = datetime(2026, 11, 23, tzinfo=UTC).timestamp()  # a Monday: weeks are calendar weeks


@dataclass(frozen=True, slots=True)
class Job:
    key: str
    user: str
    arrival: float
    gpus: int
    runtime: float
    limit: float | None


def queue_setup(**fields: Any) -> QuotaSetup:
    spec = gpu_queue("shared", CAPACITY, **fields)
    return QuotaSetup(
        queues={"shared": spec},
        flavors={FLAVOR: Flavor(FLAVOR)},
        local_queues={("ns", "shared"): LocalQueue("ns", "shared", "shared")},
    )


def arrivals(
    rng: random.Random, user: str, load: float, until: float, *, no_limit: float = 0.0
) -> list[Job]:
    gap = sum(SIZES) / len(SIZES) * 2.5 * HOUR / (load * CAPACITY)
    jobs, at, index = [], START + rng.expovariate(1.0 / gap), 0
    while at < START + until:
        runtime = rng.uniform(1.0, 4.0) * HOUR
        limit = None if rng.random() < no_limit else runtime * rng.uniform(1.0, 1.5)
        jobs.append(Job(f"ns/{user}-{index}", user, at, rng.choice(SIZES), runtime, limit))
        at += rng.expovariate(1.0 / gap)
        index += 1
    return jobs


@dataclass(slots=True)
class Run:
    started: dict[str, float]
    most_held: dict[str, int]
    used: dict[str, float]  # GPU-seconds per user
    weekly: list[float]  # GPU-seconds used per week


def simulate(jobs: Sequence[Job], setup: QuotaSetup, horizon: float) -> Run:
    """The jobs through `schedule` until `horizon`, pods bound where the cycle put them."""
    tree = QuotaTree(setup)
    budget = setup.queues["shared"].budget
    by_key = {job.key: job for job in jobs}
    events = [(job.arrival, 1, job.key) for job in jobs]
    heapq.heapify(events)
    pending: dict[str, Workload] = {}
    running: dict[str, tuple[Job, float, str]] = {}
    spent, run = Spent(), Run({}, {}, {}, [0.0] * int(horizon // WEEK + 1))
    last = START
    while events and events[0][0] < START + horizon:
        now = events[0][0]
        held = sum(job.gpus for job, _, _ in running.values())
        for job, begun, _ in running.values():
            _account(run, job, max(last, begun), now)
        if budget is not None:  # sampled at every event, as held since the last
            spent = spent.advance(now, held * MILLI, budget)
        last = now
        while events and events[0][0] == now:
            _, kind, key = heapq.heappop(events)
            if kind == 0:
                del running[key]
            else:
                job = by_key[key]
                pending[key] = gpu_workload(
                    key,
                    job.arrival,
                    1,
                    job.gpus,
                    queue_name="shared",
                    user=job.user,
                    duration_limit=job.limit,
                )
        if not pending:
            continue
        charges = [
            Charge(
                key,
                "shared",
                {(FLAVOR, GPU): job.gpus * MILLI},
                admitted_at=begun,
                user=job.user,
                limit=job.limit,
            )
            for key, (job, begun, _) in running.items()
        ]
        offered: dict[str, list[Workload]] = {}
        for workload in pending.values():
            mine = offered.setdefault(workload.user, [])
            if len(mine) < OFFERED:
                mine.append(workload)
        result = schedule(
            sorted((w for ws in offered.values() for w in ws), key=lambda w: (w.created_at, w.key)),
            [_snapshot(running)],
            mode=QueueMode.BEST_EFFORT_FIFO,
            now=now,
            starvation_after=1e12,
            preemption=None,
            quotas=QuotaView(tree, charges, spent={"shared": spent}),
            presorted=True,
        )
        for admit in result.admits:
            job = by_key[admit.key]
            del pending[admit.key]
            running[admit.key] = (job, now, result.placements[admit.key][0].node)
            run.started[admit.key] = now
            heapq.heappush(events, (now + job.runtime, 0, admit.key))
        holding: dict[str, int] = {}
        for job, _, _ in running.values():
            holding[job.user] = holding.get(job.user, 0) + job.gpus
        for user, gpus in holding.items():
            run.most_held[user] = max(run.most_held.get(user, 0), gpus)
    return run


def _account(run: Run, job: Job, since: float, until: float) -> None:
    """The GPU-seconds `job` used in [since, until), to its user and to each week."""
    run.used[job.user] = run.used.get(job.user, 0.0) + (until - since) * job.gpus
    while since < until:
        week = int((since - START) // WEEK)
        end = min(until, START + (week + 1) * WEEK)
        if week < len(run.weekly):
            run.weekly[week] += (end - since) * job.gpus
        since = end


def _snapshot(running: dict[str, tuple[Job, float, str]]) -> ClusterSnapshot:
    used = dict.fromkeys((f"n{i}" for i in range(NODES)), 0)
    for job, _, node in running.values():
        used[node] += job.gpus
    return ClusterSnapshot(name="c1", nodes=gpu_nodes(used, PER_NODE))


def flood(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    jobs = arrivals(rng, "alice", 3.0, WEEK)
    for user in ("bob", "carol", "dave"):
        jobs += arrivals(rng, user, 0.15, WEEK)
    jobs.sort(key=lambda j: (j.arrival, j.key))
    found: dict[str, Any] = {}
    print("\nflood: one week; alice offers 300% of 64 GPUs, bob, carol and dave 15% each")
    print(f"  {'queue':<28}{'alice held at most':>20}{'alice share':>13}{'others wait mean':>18}")
    for name, setup in (
        ("no limit", queue_setup()),
        ("userLimits 24 GPUs", queue_setup(user_limit=UserLimit(None, {GPU: 24 * MILLI}))),
    ):
        run = simulate(jobs, setup, WEEK)
        total = sum(run.used.values())
        waits = [
            run.started[j.key] - j.arrival
            for j in jobs
            if j.user != "alice" and j.key in run.started
        ]
        row: dict[str, Any] = {
            "alice_most_gpus": run.most_held.get("alice", 0),
            "share": {u: round(v / total, 4) for u, v in sorted(run.used.items())},
            "others_wait_mean_s": round(sum(waits) / len(waits), 1) if waits else None,
        }
        found[name] = row
        print(
            f"  {name:<28}{row['alice_most_gpus']:>20}{row['share']['alice']:>13.1%}"
            f"{row['others_wait_mean_s']:>17.0f}s"
        )
    return found


def budgets(seed: int) -> dict[str, Any]:
    amount = 0.4 * CAPACITY * WEEK  # GPU-seconds a week
    budget = Budget(GPU, amount * MILLI, BudgetPeriod.WEEK)
    found: dict[str, Any] = {}
    print("\nbudget: two weeks; a team offering 80% of 64 GPUs, a weekly budget of 40%")
    print(f"  {'jobs':<28}{'used / budget per week':>28}{'most overdrawn':>16}{'util':>8}")
    for name, no_limit in (("all declare a limit", 0.0), ("10% declare none", 0.1)):
        jobs = arrivals(random.Random(seed), "team", 0.8, 2 * WEEK, no_limit=no_limit)
        run = simulate(jobs, queue_setup(budget=budget), 2 * WEEK)
        spent = run.weekly[:2]
        over = max(0.0, *(s - amount for s in spent))
        row: dict[str, Any] = {
            "used_share_of_budget_per_week": [round(s / amount, 4) for s in spent],
            "most_overdrawn_gpu_hours": round(over / HOUR, 1),
            "utilisation": round(sum(run.weekly[:2]) / (2 * WEEK * CAPACITY), 4),
        }
        found[name] = row
        weeks = " ".join(f"{s:.0%}" for s in row["used_share_of_budget_per_week"])
        print(
            f"  {name:<28}{weeks:>28}{row['most_overdrawn_gpu_hours']:>14.1f}h"
            f"{row['utilisation']:>8.1%}"
        )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.limits_bench", description=__doc__)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", default="benchmarks/results/limits.json")
    args = parser.parse_args(argv)
    report = {"settings": vars(args), "flood": flood(args.seed), "budget": budgets(args.seed)}
    save(report, Path(args.out))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
