"""Hero gangs among small jobs: StrictFIFO, BestEffortFIFO and reservation with backfill side
by side, in simulated time over the pure core.

Run from the repository root:

    python -m benchmarks.backfill_bench [--quick] [--jobs N] [--seed S]
        [--out benchmarks/results/backfill.json]

The cluster is 16 nodes x 8 GPUs. A seeded stream of jobs arrives (Poisson, offering about
`--load` of the GPUs): small jobs of one pod of 1, 2, 4 or 8 GPUs, most with a declared
limit (`dispatchDuration.limit`) of 2-15 minutes and some without one, and, one job in
`--gang-every`, a gang of 8 pods x 8 GPUs (64 GPUs) with a limit of 30 minutes. Each job runs
for a random time no longer than its limit: limit x U(`--fill`, 1) (without a limit, 1-10
minutes). The same stream is run three times, by the real `schedule` on every event (an
arrival or an end; nothing is admitted between events, so no cycle between them could
decide anything else): StrictFIFO, BestEffortFIFO with the starvation guard at 300 s, and
BestEffortFIFO with backfill `Declared` (guard at 300 s too), its start estimates made from
the record of the shares of their limits the last 100 jobs ran (`core.limituse.LimitUse`,
as the controller keeps it). Admitted pods are bound to the nodes the cycle placed them on
(`CycleResult.placements`) and each job's declared end is its dispatch plus its limit
(`DispatchedWorkload.ends_at`), as the controller's snapshot says them.

Figures per mode: GPU utilisation (GPU-seconds used / available, from the first arrival to
the last), each gang's wait (mean, p50, p90, max), the small jobs' wait, how many gangs
waited longer than under StrictFIFO (and by how much at most), and, for gangs that
reserved, the start-estimate error: |first estimate - actual start| (median, p90), beside
that of the first latest start (the limits alone), and both again by how closely runtimes
fill their limits (a quarter of the jobs per stream). The issue's scenario (4 nodes x 8
GPUs, a 32-GPU gang submitted while four 60 s jobs run, then one 8-GPU job of 20 s with a
30 s limit every 5 s for 150 s) is run in every mode too: the four jobs were dispatched 45,
30, 15 and 8 s before the gang (so one node frees at a time, at 15, 30, 45 and 52 s). Side
effects: prints tables, writes the
JSON file (directories created).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.core_bench import machine
from benchmarks.gpusim import GPU, MILLI, gpu_nodes, gpu_workload
from dispatcher.api.resources import Resources
from dispatcher.core.limituse import LimitUse
from dispatcher.core.model import (
    Backfill,
    ClusterSnapshot,
    DispatchedWorkload,
    QueueMode,
    Workload,
)
from dispatcher.core.scheduling import schedule

STARVATION_AFTER = 300.0
SMALL_GPUS = ((1, 0.3), (2, 0.3), (4, 0.2), (8, 0.2))  # (GPUs, share of small jobs)
SMALL_LIMITS = (120.0, 300.0, 600.0, 900.0)
GANG_PODS, GANG_GPUS, GANG_LIMIT = 8, 8, 1800.0


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    queueing: QueueMode
    backfill: Backfill


MODES = (
    Mode("StrictFIFO", QueueMode.STRICT_FIFO, Backfill.NEVER),
    Mode("BestEffortFIFO", QueueMode.BEST_EFFORT_FIFO, Backfill.NEVER),
    Mode("reservation+backfill", QueueMode.BEST_EFFORT_FIFO, Backfill.DECLARED),
)
SHARES_KEPT = 100  # as the controller's record of durations (core.visibility.RECORD_SIZE)


@dataclass(frozen=True, slots=True)
class Job:
    key: str
    arrival: float
    pods: int
    gpus: int  # per pod
    limit: float | None
    runtime: float

    @property
    def gang(self) -> bool:
        return self.pods > 1

    def workload(self) -> Workload:
        return gpu_workload(self.key, self.arrival, self.pods, self.gpus, duration_limit=self.limit)


@dataclass(slots=True)
class _Running:
    job: Job
    started: float
    usage: dict[str, int]  # node -> GPUs


@dataclass(slots=True)
class Run:
    """One mode's run of a stream: when each job started, and each reserving head's first
    reservation: its estimate (from the record of shares) and its latest start."""

    started: dict[str, float] = field(default_factory=dict)
    estimates: dict[str, float] = field(default_factory=dict)
    latest: dict[str, float] = field(default_factory=dict)
    cycles: int = 0
    seconds: float = 0.0  # wall time in `schedule`


def jobs_stream(
    rng: random.Random,
    count: int,
    *,
    nodes: int,
    load: float,
    gang_every: int,
    fill: float,
    unlimited: float,
) -> list[Job]:
    """`count` jobs arriving as a Poisson stream offering `load` of the GPUs on average."""
    jobs: list[Job] = []
    for index in range(count):
        if index % gang_every == gang_every // 2:
            limit: float | None = GANG_LIMIT
            jobs.append(Job(f"bench/gang-{index}", 0.0, GANG_PODS, GANG_GPUS, limit, 0.0))
            continue
        gpus = rng.choices([g for g, _ in SMALL_GPUS], [w for _, w in SMALL_GPUS])[0]
        limit = None if rng.random() < unlimited else rng.choice(SMALL_LIMITS)
        jobs.append(Job(f"bench/job-{index}", 0.0, 1, gpus, limit, 0.0))
    timed = []
    for job in jobs:
        if job.limit is None:
            runtime = rng.uniform(60.0, 600.0)
        else:
            runtime = job.limit * rng.uniform(fill, 1.0)
        timed.append(Job(job.key, 0.0, job.pods, job.gpus, job.limit, runtime))
    mean_work = statistics.fmean(j.pods * j.gpus * j.runtime for j in timed)
    gap = mean_work / (load * nodes * GANG_GPUS)  # mean seconds between arrivals
    at = 0.0
    arrived = []
    for job in timed:
        arrived.append(Job(job.key, round(at, 3), job.pods, job.gpus, job.limit, job.runtime))
        at += rng.expovariate(1.0 / gap)
    return arrived


def _snapshot(nodes: int, running: dict[str, _Running]) -> ClusterSnapshot:
    used = dict.fromkeys((f"n{i:02d}" for i in range(nodes)), 0)
    admitted = []
    for key, run in running.items():
        for node, gpus in run.usage.items():
            used[node] += gpus
        limit = run.job.limit
        admitted.append(
            DispatchedWorkload(
                key=key,
                priority=0,
                dispatched_at=run.started,
                usage=tuple((n, Resources({GPU: g * MILLI})) for n, g in run.usage.items()),
                ends_at=None if limit is None else run.started + limit,
            )
        )
    return ClusterSnapshot(
        name="c1",
        nodes=gpu_nodes(used, GANG_GPUS),
        admitted=tuple(admitted),
    )


def simulate(jobs: Sequence[Job], mode: Mode, *, nodes: int) -> Run:
    """Run the stream through `schedule` on every arrival and end, binding admitted pods
    where the cycle placed them."""
    by_key = {job.key: job for job in jobs}
    events: list[tuple[float, int, str]] = [(j.arrival, 1, j.key) for j in jobs]  # 0: end
    heapq.heapify(events)
    pending: dict[str, Workload] = {}
    running: dict[str, _Running] = {}
    shares: deque[float] = deque(maxlen=SHARES_KEPT)
    run = Run()
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, key = heapq.heappop(events)
            if kind == 0:
                ended = running.pop(key).job
                if ended.limit is not None:
                    shares.append(ended.runtime / ended.limit)
            else:
                pending[key] = by_key[key].workload()
        if not pending:
            continue
        started = time.perf_counter()
        result = schedule(
            sorted(pending.values(), key=lambda w: (w.created_at, w.key)),
            [_snapshot(nodes, running)],
            mode=mode.queueing,
            now=now,
            starvation_after=STARVATION_AFTER,
            preemption=None,
            presorted=True,
            backfill=mode.backfill,
            limit_use=LimitUse.of(shares),
        )
        run.seconds += time.perf_counter() - started
        run.cycles += 1
        for key, info in result.reservations.items():
            run.estimates.setdefault(key, info.start)
            run.latest.setdefault(key, info.latest)
        for admit in result.admits:
            job = by_key[admit.key]
            del pending[admit.key]
            usage: dict[str, int] = {}
            for placed in result.placements[admit.key]:
                usage[placed.node] = usage.get(placed.node, 0) + placed.count * job.gpus
            running[admit.key] = _Running(job, now, usage)
            run.started[admit.key] = now
            heapq.heappush(events, (now + job.runtime, 0, admit.key))
    return run


def percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _spread(values: Sequence[float]) -> dict[str, float | int | None]:
    def r(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    return {
        "count": len(values),
        "mean_s": r(statistics.fmean(values)) if values else None,
        "p50_s": r(statistics.median(values)) if values else None,
        "p90_s": r(percentile(values, 0.9)),
        "max_s": r(max(values)) if values else None,
    }


def _error(errors: Sequence[float]) -> dict[str, float | None]:
    p90 = percentile(errors, 0.9)
    return {
        "median_s": round(statistics.median(errors), 1) if errors else None,
        "p90_s": None if p90 is None else round(p90, 1),
    }


def utilisation(jobs: Sequence[Job], run: Run, *, nodes: int, until: float) -> float:
    """GPU-seconds used between the first arrival and `until` over those available."""
    start = min(j.arrival for j in jobs)
    used = 0.0
    for job in jobs:
        begun = run.started.get(job.key)
        if begun is None:
            continue
        end = min(begun + job.runtime, until)
        if end > begun:
            used += (end - max(begun, start)) * job.pods * job.gpus
    return used / ((until - start) * nodes * GANG_GPUS)


def figures(jobs: Sequence[Job], run: Run, *, nodes: int) -> dict[str, Any]:
    waits = {j.key: run.started[j.key] - j.arrival for j in jobs if j.key in run.started}
    gangs = [j for j in jobs if j.gang]
    errors = [
        abs(run.estimates[j.key] - run.started[j.key]) for j in gangs if j.key in run.estimates
    ]
    bound_errors = [
        abs(run.latest[j.key] - run.started[j.key]) for j in gangs if j.key in run.latest
    ]
    return {
        "utilisation": round(
            utilisation(jobs, run, nodes=nodes, until=max(j.arrival for j in jobs)), 4
        ),
        "gang_wait": _spread([waits[j.key] for j in gangs if j.key in waits]),
        "small_wait": _spread([waits[j.key] for j in jobs if not j.gang and j.key in waits]),
        "never_started": len(jobs) - len(waits),
        "reserved_gangs": len(errors),
        "estimate_error": _error(errors),
        "latest_start_error": _error(bound_errors),
        "cycles": run.cycles,
        "cycle_ms_mean": round(1000 * run.seconds / max(run.cycles, 1), 3),
        "waits": waits,
    }


def against_strict(
    result: dict[str, Any], strict: dict[str, Any], jobs: Sequence[Job]
) -> dict[str, Any]:
    """How many gangs waited longer than under StrictFIFO, and by how much at most."""
    over = [
        result["waits"][j.key] - strict["waits"][j.key]
        for j in jobs
        if j.gang and j.key in result["waits"] and j.key in strict["waits"]
    ]
    late = [d for d in over if d > 0]
    return {
        "gangs_later_than_strict": len(late),
        "most_later_s": round(max(late), 1) if late else 0.0,
    }


def issue_scenario() -> list[Job]:
    """4 nodes x 8 GPUs; four 8-GPU jobs of 60 s (limit 60 s) dispatched 45, 30, 15 and 8 s
    before a 32-GPU gang (4 x 8 GPUs) arrives at 0; then an 8-GPU job of 20 s (limit 30 s)
    every 5 s for 150 s."""
    jobs = [
        Job(f"bench/long-{i}", at, 1, 8, 60.0, 60.0) for i, at in enumerate((-45, -30, -15, -8))
    ]
    jobs.append(Job("bench/gang", 0.0, 4, 8, 600.0, 300.0))
    jobs += [Job(f"bench/stream-{t:03d}", float(t), 1, 8, 30.0, 20.0) for t in range(5, 151, 5)]
    return jobs


TABLE = (
    f"  {'mode':<22}{'util':>7}{'gang wait mean/p50/p90/max (s)':>34}"
    f"{'small wait mean/p90 (s)':>26}{'>strict (max s)':>17}{'est. err p50/p90 (s)':>22}"
    f"{'latest err p50/p90':>20}{'cycle ms':>10}"
)


def _row(name: str, f: dict[str, Any], strict: dict[str, Any]) -> str:
    g, s = f["gang_wait"], f["small_wait"]
    gang = f"{g['mean_s']:.0f}/{g['p50_s']:.0f}/{g['p90_s']:.0f}/{g['max_s']:.0f}"
    small = f"{s['mean_s']:.0f}/{s['p90_s']:.0f}"
    err, bound = (_cell(f["estimate_error"]), _cell(f["latest_start_error"]))
    if err != "-":
        err += f" ({f['reserved_gangs']})"
    later = f"{strict['gangs_later_than_strict']} (+{strict['most_later_s']:.0f})"
    return (
        f"  {name:<22}{f['utilisation']:>7.1%}{gang:>34}{small:>26}{later:>17}{err:>22}"
        f"{bound:>20}{f['cycle_ms_mean']:>10.2f}"
    )


def _cell(error: dict[str, Any]) -> str:
    if error["median_s"] is None:
        return "-"
    return f"{error['median_s']:.1f}/{error['p90_s']:.1f}"


def run_modes(jobs: Sequence[Job], *, nodes: int) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        found[mode.name] = figures(jobs, simulate(jobs, mode, nodes=nodes), nodes=nodes)
    strict = found[MODES[0].name]
    for result in found.values():
        result["vs_strict"] = against_strict(result, strict, jobs)
    return found


def stream_section(
    name: str, args: argparse.Namespace, count: int, *, fill: float, unlimited: float
) -> dict[str, Any]:
    """One stream through every mode: the table's rows."""
    nodes = 16
    rng = random.Random(args.seed)
    jobs = jobs_stream(
        rng,
        count,
        nodes=nodes,
        load=args.load,
        gang_every=args.gang_every,
        fill=fill,
        unlimited=unlimited,
    )
    gangs = sum(j.gang for j in jobs)
    print(
        f"\n{name}: {nodes} nodes x 8 GPUs, {count} jobs ({gangs} gangs of 64 GPUs) over "
        f"{jobs[-1].arrival / 3600:.1f} h, offered load {args.load:.0%}; runtime = limit x "
        f"U({fill:g}, 1), {unlimited:.0%} of small jobs without a limit"
    )
    print(TABLE)
    found = run_modes(jobs, nodes=nodes)
    for mode, result in found.items():
        print(_row(mode, result, result["vs_strict"]))
        del result["waits"]
    return {"fill": fill, "unlimited": unlimited, "modes": found}


FILLS = (1.0, 0.99, 0.95, 0.8, 0.5)
"""How closely runtimes fill their limits (runtime = limit x U(fill, 1)), for `fill_section`."""


def fill_section(args: argparse.Namespace, count: int) -> dict[str, Any]:
    """The reserved gangs' start-estimate error (median, p90) by how closely work fills its
    limits, every job with a limit: the estimate (the record of shares) and the latest start
    (the limits alone)."""
    nodes = 16
    mode = next(m for m in MODES if m.backfill is Backfill.DECLARED)
    print(f"\nestimate error by fill: {count} jobs per stream, every small job with a limit")
    print(f"  {'runtime':<22}{'estimate p50/p90 (s)':>24}{'latest start p50/p90 (s)':>28}")
    found: dict[str, Any] = {}
    for fill in FILLS:
        rng = random.Random(args.seed)
        jobs = jobs_stream(
            rng,
            count,
            nodes=nodes,
            load=args.load,
            gang_every=args.gang_every,
            fill=fill,
            unlimited=0.0,
        )
        result = figures(jobs, simulate(jobs, mode, nodes=nodes), nodes=nodes)
        row = {
            "estimate_error": result["estimate_error"],
            "latest_start_error": result["latest_start_error"],
            "reserved_gangs": result["reserved_gangs"],
        }
        found[f"{fill:g}"] = row
        runtime = f"limit x U({fill:g}, 1)"
        estimate, bound = _cell(row["estimate_error"]), _cell(row["latest_start_error"])
        print(f"  {runtime:<22}{estimate:>24}{bound:>28}")
    return found


def scenario_section() -> dict[str, Any]:
    """The issue's scenario in every mode."""
    print("\nissue scenario: 4 nodes x 8 GPUs, a 32-GPU gang behind four 60 s jobs")
    scenario = issue_scenario()
    found: dict[str, Any] = {}
    for mode in MODES:
        run = simulate(scenario, mode, nodes=4)
        gang_wait = run.started["bench/gang"]
        estimate = run.estimates.get("bench/gang")
        until = max(run.started[j.key] + j.runtime for j in scenario)
        used = utilisation(scenario, run, nodes=4, until=until)
        found[mode.name] = {
            "gang_wait_s": round(gang_wait, 1),
            "first_estimate_s": estimate,
            "utilisation_to_last_end": round(used, 4),
            "last_end_s": round(until, 1),
        }
        said = "" if estimate is None else f" (reserved from {estimate:.0f} s)"
        print(
            f"  {mode.name:<22} gang waits {gang_wait:5.1f} s{said}; GPUs {used:.0%} busy "
            f"until the last job ends at {until:.0f} s"
        )
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.backfill_bench", description=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="fewer jobs, well under a minute")
    parser.add_argument("--jobs", type=int, default=None, help="jobs per stream (4000; quick 600)")
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--load", type=float, default=0.8, help="offered share of the GPUs")
    parser.add_argument("--gang-every", type=int, default=40, help="one gang in this many jobs")
    parser.add_argument("--fill", type=float, default=0.5, help="mixed: runtime >= limit x this")
    parser.add_argument(
        "--unlimited", type=float, default=0.1, help="mixed: share of small jobs without a limit"
    )
    parser.add_argument("--out", default=None, help="JSON results file")
    args = parser.parse_args(argv)
    count = args.jobs or (600 if args.quick else 4000)
    out = Path(args.out or f"benchmarks/results/backfill{'-quick' if args.quick else ''}.json")
    info = machine()
    print(f"python {info['python']} on {info['platform']}" + (" (quick)" if args.quick else ""))
    report: dict[str, Any] = {"machine": info, "settings": vars(args) | {"jobs": count}}
    # The mixed stream, as users declare limits (loosely, some none); then every job with a
    # limit it nearly uses: what the start estimates' target is stated for.
    report["mixed"] = stream_section("mixed", args, count, fill=args.fill, unlimited=args.unlimited)
    report["declared"] = stream_section("declared", args, count, fill=0.95, unlimited=0.0)
    report["by_fill"] = fill_section(args, max(count // 4, 300))
    report["issue_scenario"] = scenario_section()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
