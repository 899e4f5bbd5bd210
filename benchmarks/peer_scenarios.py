"""The scenarios of the peer benchmark, each a coroutine over a `Run` (benchmarks.peer_run).

- backlog: N one-pod Jobs queued before the controller starts, room for all; the clock starts
  with the controller.
- burst: the controller running (and warmed up by one workload), N created at full client
  speed, room for all; the clock starts with the first create.
- contention: N one-pod Jobs (1 CPU each) against room for K at a time, each pod Running for
  `hold` seconds (a KWOK stage with a delay) before it succeeds; done when every Job has
  finished. The floor is N / K * hold.
- gangs: N RayClusters of a head and 4 workers (1 CPU each) against room for K at a time; a
  gang's owner deletes it `gang_hold` seconds after all five of its pods were placed (nothing
  finishes a RayCluster on its own); done when every gang has had all its pods placed once.
- priority: room for F one-pod Jobs filled with F low-priority ones (Running for good), then
  one high-priority Job of 2 pods: how long until both of its pods are placed.

Throughout, pods are watched: one ever Unschedulable is an overcommit, a gang with a pod placed
while a sibling is Unschedulable is partially placed. Costs are per workload admitted in the
measured window: all of them, unless the run was cut at its cap.

Side effects: those of the Run given (objects created in its cluster).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.peer_measure import (
    PodState,
    admission_figures,
    fully_placed_at,
    gone_at,
    quantiles,
    split_capacity,
    waits_after,
)
from benchmarks.peer_run import Nodes, Run, Scenario, Window
from benchmarks.peer_systems import Workload

Obj = dict[str, Any]

SMALL = (("cpu", "100m"), ("memory", "64Mi"))
ONE_CPU = (("cpu", "1"), ("memory", "64Mi"))
RAY_POD = (("cpu", "1"), ("memory", "256Mi"))
GANG_PODS = 5
HIGH_PODS = 2
FOREVER = "3600s"
NODE_PODS = 110


@dataclass(frozen=True)
class Sizes:
    """How much work each scenario gets."""

    count: int = 1000
    """backlog and burst: workloads."""
    contention: int = 2000
    slots: int = 100
    """contention: Jobs, and how many fit at once."""
    hold: float = 2.0
    """contention: seconds each pod runs."""
    gangs: int = 200
    gang_slots: int = 20
    gang_hold: float = 5.0
    fill: int = 20
    """priority: low-priority one-pod Jobs that fill the cluster."""


async def idle() -> None:
    return None


def everyone(run: Run, names: list[str], table: Callable[[Run], dict[str, float]]) -> bool:
    return all(n in table(run) for n in names)


def admissions(run: Run) -> dict[str, float]:
    assert run.recorder is not None
    return run.recorder.admitted


def finishes(run: Run) -> dict[str, float]:
    assert run.recorder is not None
    return run.recorder.finished


async def admit_all(
    run: Run, works: list[Workload], window: Window, created: dict[str, float]
) -> Obj:
    """Wait until all `works` are admitted; the admission figures and the costs."""
    names = [w.name for w in works]
    finished = await run.until(lambda: everyone(run, names, admissions), window, tick=idle)
    figures = admission_figures(names, created, admissions(run), window.started, run.cap)
    figures["capped"] = not finished
    figures["seconds_to_done"] = figures["seconds_to_all_admitted"]
    figures["seconds_creating"] = round(max(created.values()) - min(created.values()), 2)
    figures.update(await run.costs(window, figures["admitted"], settle=finished))
    return figures


async def backlog(run: Run, sizes: Sizes) -> Obj:
    works = [Workload(f"w-{i}", requests=SMALL) for i in range(sizes.count)]
    created = await run.create(works)
    early = len(admissions(run))  # with no controller running: 0, or the run means nothing
    window = run.begin()
    run.launch()
    figures = await admit_all(run, works, window, created)
    figures["admitted_before_start"] = early
    return figures


async def burst(run: Run, sizes: Sizes) -> Obj:
    run.launch()
    warm = await run.warm_up()
    works = [Workload(f"w-{i}", requests=SMALL) for i in range(sizes.count)]
    window = run.begin()
    created = await run.create(works)
    figures = await admit_all(run, works, window, created)
    figures["seconds_warming_up"] = warm
    return figures


async def contention(run: Run, sizes: Sizes) -> Obj:
    run.launch()
    warm = await run.warm_up()
    hold = f"{sizes.hold:g}s"
    works = [Workload(f"w-{i}", requests=ONE_CPU, hold=hold) for i in range(sizes.contention)]
    names = [w.name for w in works]
    window = run.begin()
    created = await run.create(works)
    finished = await run.until(lambda: everyone(run, names, finishes), window, tick=idle)
    figures = admission_figures(names, created, admissions(run), window.started, run.cap)
    done = [finishes(run)[n] for n in names if n in finishes(run)]
    seconds = (max(done) - window.started) if done else 0.0
    figures.update(
        {
            "capped": not finished,
            "finished": len(done),
            "seconds_to_done": round(seconds, 3) if finished else None,
            "completed_per_second": round(
                len(done) / (max(seconds, 0.001) if finished else run.cap), 3
            ),
            # Every wave of K held `hold` seconds, one after the other.
            "floor_seconds": round(-(-sizes.contention // sizes.slots) * sizes.hold, 1),
            "slots": sizes.slots,
            "hold_seconds": sizes.hold,
            "seconds_warming_up": warm,
        }
    )
    figures.update(await run.costs(window, figures["admitted"], settle=finished))
    return figures


async def gangs(run: Run, sizes: Sizes) -> Obj:
    run.launch()
    warm = await run.warm_up()
    works = [
        Workload(f"rc-{i}", pods=GANG_PODS, requests=RAY_POD, ray=True) for i in range(sizes.gangs)
    ]
    by_name = {w.name: w for w in works}
    ran: dict[str, float] = {}
    deleted: dict[str, float] = {}
    deleting: list[asyncio.Task[None]] = []

    async def reap() -> None:
        """Note gangs fully placed; delete those placed `gang_hold` seconds ago."""
        assert run.recorder is not None
        now = time.time()
        for gang, pods in run.recorder.placed.items():
            if gang in by_name and gang not in ran and len(pods) >= GANG_PODS:
                ran[gang] = now
        for gang, since in ran.items():
            if by_name.get(gang) and now - since >= sizes.gang_hold:
                deleted[gang] = now
                deleting.append(asyncio.create_task(run.delete(by_name.pop(gang))))

    window = run.begin()
    created = await run.create(works)
    names = list(by_name)
    finished = await run.until(lambda: all(n in ran for n in names), window, tick=reap)
    await asyncio.gather(*deleting, return_exceptions=True)
    figures = admission_figures(names, created, admissions(run), window.started, run.cap)
    assert run.recorder is not None
    gone = gone_at(run.recorder.samples, deleted)
    waiting = [run.recorder.admitted[n] for n in names if n in run.recorder.admitted]
    idle = waits_after(gone.values(), waiting)
    # Exact times from the pod events (the deletions above went by a half-second tick).
    placed = fully_placed_at(run.recorder.samples, {n: GANG_PODS for n in names})
    seconds = (max(placed.values()) - window.started) if placed else 0.0
    figures.update(
        {
            "capped": not finished,
            "gangs_fully_placed": len(ran),
            "seconds_to_done": round(seconds, 3) if finished else None,
            "completed_per_second": round(
                len(ran) / (max(seconds, 0.001) if finished else run.cap), 3
            ),
            "gang_slots": sizes.gang_slots,
            "gang_hold_seconds": sizes.gang_hold,
            # The last wave is done once placed: it need not hold.
            "floor_seconds": round((-(-sizes.gangs // sizes.gang_slots) - 1) * sizes.gang_hold, 1),
            "seconds_warming_up": warm,
            # Deleted by its owner -> its last pod gone (the garbage collector's part), and
            # last pod gone -> the next admission (the controller's part).
            "seconds_delete_to_pods_gone": (
                quantiles([gone[g] - deleted[g] for g in gone]) if gone else None
            ),
            "seconds_pods_gone_to_next_admission": quantiles(idle) if idle else None,
        }
    )
    figures.update(await run.costs(window, figures["admitted"], settle=finished))
    return figures


async def priority(run: Run, sizes: Sizes) -> Obj:
    run.launch(preemption=True)
    warm = await run.warm_up()
    assert run.recorder is not None
    recorder = run.recorder
    low = [
        Workload(f"low-{i}", requests=ONE_CPU, hold=FOREVER, priority="bench-low")
        for i in range(sizes.fill)
    ]
    fill_window = run.begin()
    await run.create(low)

    def full() -> bool:
        return all(len(recorder.placed.get(w.name, ())) >= 1 for w in low)

    filled = await run.until(full, fill_window, tick=idle)
    fill_seconds = round(time.time() - fill_window.started, 2)
    high = Workload("high", pods=HIGH_PODS, requests=ONE_CPU, hold=FOREVER, priority="bench-high")
    figures: Obj = {
        "fill": sizes.fill,
        "fill_placed": sum(1 for w in low if recorder.placed.get(w.name)),
        "seconds_to_fill": fill_seconds,
        "seconds_warming_up": warm,
    }
    if not filled:
        # A cluster with room left would let the high one in without evicting anything.
        figures.update(capped=True, high_priority={"skipped": "the cluster never filled"})
        figures.update(await run.costs(fill_window, sizes.fill, settle=False))
        return figures
    window = run.begin()
    created = await run.create([high])
    ran = await run.until(
        lambda: len(recorder.placed.get(high.name, ())) >= HIGH_PODS, window, tick=idle
    )
    placed_at = fully_placed_at(recorder.samples, {high.name: HIGH_PODS}).get(high.name, 0.0)
    admitted_at = recorder.admitted.get(high.name)
    after = [s for s in recorder.samples if s.gang.startswith("low-") and s.at >= window.started]
    evicted = {s.pod for s in after if s.state is PodState.GONE}
    figures.update(
        {
            "capped": not ran,
            "high_priority": {
                "seconds_to_admitted": (
                    round(admitted_at - created[high.name], 3) if admitted_at else None
                ),
                "seconds_to_running": round(placed_at - created[high.name], 3) if ran else None,
                "pods_placed": len(recorder.placed.get(high.name, ())),
            },
            "low_pods_evicted": len(evicted),
            "low_placed_at_end": sum(1 for w in low if recorder.placed.get(w.name)),
        }
    )
    figures.update(await run.costs(window, 1, settle=ran))
    return figures


def scenarios(sizes: Sizes) -> dict[str, Scenario]:
    """Every scenario, with its nodes, for these sizes."""

    def bound(
        body: Callable[[Run, Sizes], Awaitable[Obj]],
    ) -> Callable[[Run], Awaitable[Obj]]:
        async def run(run: Run) -> Obj:
            return await body(run, sizes)

        return run

    wide = max(2, -(-sizes.count // (NODE_PODS - 10)))
    return {
        "backlog": Scenario("backlog", Nodes((32,) * wide, 128, NODE_PODS), bound(backlog)),
        "burst": Scenario("burst", Nodes((32,) * wide, 128, NODE_PODS), bound(burst)),
        "contention": Scenario(
            "contention", Nodes(tuple(split_capacity(sizes.slots, 25))), bound(contention)
        ),
        "gangs": Scenario(
            "gangs",
            Nodes(tuple(split_capacity(GANG_PODS * sizes.gang_slots, 10))),
            bound(gangs),
            ray=True,
        ),
        "priority": Scenario(
            "priority", Nodes(tuple(split_capacity(sizes.fill, 10))), bound(priority)
        ),
    }
