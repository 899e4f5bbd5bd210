"""Many mixed-priority arrivals, cycle after cycle, with evictions that take time: no one is
evicted for a need already being met, equal or higher priority is never evicted, and the
system settles once arrivals stop.

The loop below plays the shell's part in miniature: it applies admissions as running pods,
turns preemptions into claims, and lets victims' pods linger a few cycles before they go.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import pytest

from dispatcher.api.resources import EMPTY, Resources
from dispatcher.core.model import ClusterSnapshot, DispatchedWorkload, QueueMode, Workload
from dispatcher.core.scheduling import HonourClaims, LowestPriorityFirst, PreemptorClaim, schedule
from tests.unit.builders import admitted_placements, node, pods

TERMINATION_CYCLES = 3
BACKOFF_CYCLES = 2
CLAIM_TIMEOUT_CYCLES = 20


@dataclass
class Running:
    workload: Workload
    usage: dict[str, Resources]
    since: int


@dataclass
class World:
    nodes: dict[str, Resources]
    running: dict[str, Running] = field(default_factory=dict)
    terminating: list[tuple[int, dict[str, Resources]]] = field(default_factory=list)
    queued: dict[str, Workload] = field(default_factory=dict)
    backoff: dict[str, tuple[int, Workload]] = field(default_factory=dict)
    claims: dict[str, PreemptorClaim] = field(default_factory=dict)
    evictions: dict[str, int] = field(default_factory=dict)

    def snapshot(self) -> ClusterSnapshot:
        used: dict[str, Resources] = {name: EMPTY for name in self.nodes}
        for run in self.running.values():
            for name, amount in run.usage.items():
                used[name] = used[name] + amount
        for _, usage in self.terminating:
            for name, amount in usage.items():
                used[name] = used[name] + amount
        nodes = tuple(
            node(n, cpu=alloc["cpu"] / 1000, memory="64Gi") for n, alloc in self.nodes.items()
        )
        nodes = tuple(
            n.__class__(name=n.name, allocatable=n.allocatable, requested=used[n.name])
            for n in nodes
        )
        admitted = tuple(
            DispatchedWorkload(
                key=k,
                priority=r.workload.priority,
                dispatched_at=float(r.since),
                usage=tuple(sorted(r.usage.items())),
            )
            for k, r in self.running.items()
        )
        return ClusterSnapshot(name="c", nodes=nodes, admitted=admitted)


def step(world: World, cycle: int) -> list[tuple[str, tuple[str, ...]]]:
    """One cycle; returns the preemptions started in it."""
    world.terminating = [(end, u) for end, u in world.terminating if end > cycle]
    for key, (until, workload) in list(world.backoff.items()):
        if until <= cycle:
            del world.backoff[key]
            world.queued[key] = workload
    for key, claim in list(world.claims.items()):
        if cycle - claim.at > CLAIM_TIMEOUT_CYCLES:
            del world.claims[key]
    queued = list(world.queued.values())
    snapshots = [world.snapshot()]
    result = schedule(
        queued,
        snapshots,
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=float(cycle),
        starvation_after=1e9,
        preemption=HonourClaims(LowestPriorityFirst(), dict(world.claims)),
    )
    placements = admitted_placements(result, queued, snapshots)
    for admit in result.admits:
        workload = world.queued.pop(admit.key)
        usage: dict[str, Resources] = {}
        for assignment in placements[admit.key]:
            requests = workload.pod_sets[assignment.pod_set].requests.scale(assignment.count)
            usage[assignment.node] = usage.get(assignment.node, EMPTY) + requests
        world.running[admit.key] = Running(workload, usage, cycle)
    for key in [k for k in world.claims if k not in world.queued]:
        del world.claims[key]
    started = []
    for preempt in result.preemptions:
        if preempt.key in world.claims:
            continue
        world.claims[preempt.key] = PreemptorClaim(preempt.cluster, preempt.victims, float(cycle))
        started.append((preempt.key, preempt.victims))
        for victim in preempt.victims:
            run = world.running.pop(victim)
            assert run.workload.priority < world.queued[preempt.key].priority
            world.evictions[victim] = world.evictions.get(victim, 0) + 1
            world.terminating.append((cycle + TERMINATION_CYCLES, run.usage))
            world.backoff[victim] = (cycle + BACKOFF_CYCLES, run.workload)
    return started


@pytest.mark.parametrize("seed", range(12))
def test_mixed_priority_arrivals_settle_without_needless_evictions(seed: int) -> None:
    rng = random.Random(seed)
    world = World(nodes={f"n{i}": Resources({"cpu": 4000}) for i in range(4)})
    arrivals: list[tuple[int, Workload]] = []
    for index in range(30):
        priority = rng.choice([0, 0, 10, 100])
        gang = pods(rng.randint(1, 3), cpu=rng.choice([1, 2]))
        arrivals.append(
            (
                rng.randint(0, 40),
                Workload(
                    key=f"ns/w{index:02d}",
                    priority=priority,
                    created_at=float(index),
                    pod_sets=(gang,),
                ),
            )
        )
    history: list[tuple[int, str, tuple[str, ...]]] = []
    for cycle in range(200):
        for at, workload in arrivals:
            if at == cycle:
                world.queued[workload.key] = workload
        for preemptor, victims in step(world, cycle):
            history.append((cycle, preemptor, victims))
    # Settled: long after the last arrival nothing is evicted any more.
    assert all(cycle < 120 for cycle, _, _ in history), history
    # Each preemptor needed its victims once: it never started a second eviction while the
    # first set was still making room.
    preemptors = [p for _, p, _ in history]
    for preemptor in set(preemptors):
        cycles = [c for c, p, _ in history if p == preemptor]
        for earlier, later in itertools.pairwise(cycles):
            assert later - earlier > TERMINATION_CYCLES, (preemptor, cycles)
    # No thrashing: nobody is evicted over and over.
    assert max(world.evictions.values(), default=0) <= 3, world.evictions
    # The most important work got in: any top-priority workload still waiting is one that
    # evicting every lower-priority workload would not help.
    snapshot = world.snapshot()
    for waiting in world.queued.values():
        if waiting.priority == 100:
            assert LowestPriorityFirst().choose_victims(waiting, snapshot) is None, waiting.key
