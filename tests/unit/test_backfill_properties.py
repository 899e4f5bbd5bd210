"""Property tests of reservations and backfill over random clusters, running work and
pending streams.

(a) A reserved gang's nodes are never given to work that ends after the reservation starts:
    work admitted after the head in the cycle's order onto a reserved node always declares a
    limit that ends it by then; at most one reservation per cluster, each a line's head's.
(b) With backfill off the decisions are today's: the same as the cycle without shortcuts
    (`test_cycle_scale.plain_schedule`, which knows nothing of limits), however much of the
    running and pending work declares limits; and with backfill on but no limit declared
    anywhere, the same as with it off.
(c) The start never moves later on account of backfilled work: a second cycle, once the
    first's admissions run where it placed them, finds a start no later than the first's
    (or its own now, where work past its limit frees the room). Gangs of one pod set: the
    best fit of identical pods fits whenever some placement does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.api.resources import Resources
from dispatcher.core.limituse import LimitUse
from dispatcher.core.model import (
    Backfill,
    ClusterSnapshot,
    DispatchedWorkload,
    NodeSnapshot,
    PodSet,
    QueueMode,
    Workload,
)
from dispatcher.core.scheduling import CycleResult, LowestPriorityFirst, schedule
from tests.unit.builders import GPU
from tests.unit.test_cycle_scale import plain_schedule

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NOW = 1000.0
GPUS = 8

limits = st.sampled_from([None, 5.0, 20.0, 30.0, 60.0, 90.0, 200.0])
running_strategy = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 3), st.sampled_from([2, 4, 4, 6, 8]), limits),
    min_size=2,
    max_size=16,
)
# A gang often goes first (it may reserve); small work behind it may backfill.
gang_strategy = st.tuples(st.integers(2, 4), st.sampled_from([4, 8]), limits, st.just(0))
small_strategy = st.tuples(
    st.integers(1, 2), st.sampled_from([1, 2, 2, 4, 4, 8]), limits, st.integers(0, 1)
)
pending_strategy = st.builds(
    lambda first, rest: [*first, *rest],
    st.lists(gang_strategy, max_size=1),
    st.lists(small_strategy, min_size=1, max_size=10),
)
world_strategy = st.tuples(
    st.lists(st.integers(1, 4), min_size=1, max_size=2),  # nodes per cluster
    running_strategy,
    pending_strategy,
    st.sampled_from(list(QueueMode)),
    st.sampled_from([1e9, 0.0]),  # starvation_after: never, or everything is starving
)


def _clusters(
    nodes_per_cluster: list[int],
    running: list[tuple[int, int, int, float | None]],
) -> list[ClusterSnapshot]:
    """Clusters of 8-GPU nodes, with the running work that fits placed on its node."""
    used: dict[tuple[int, int], int] = {}
    work: dict[int, list[DispatchedWorkload]] = {}
    for index, (c, n, gpus, limit) in enumerate(running):
        if c >= len(nodes_per_cluster) or n >= nodes_per_cluster[c]:
            continue
        if used.get((c, n), 0) + gpus > GPUS:
            continue
        used[(c, n)] = used.get((c, n), 0) + gpus
        at = NOW - 1 - index % 3
        work.setdefault(c, []).append(
            DispatchedWorkload(
                key=f"run/r{index}",
                priority=0,
                dispatched_at=at,
                usage=((f"c{c}-n{n}", Resources({GPU: gpus * 1000})),),
                ends_at=None if limit is None else at + limit,
            )
        )
    return [
        ClusterSnapshot(
            name=f"c{c}",
            nodes=tuple(
                NodeSnapshot(
                    name=f"c{c}-n{n}",
                    allocatable=Resources({GPU: GPUS * 1000}),
                    requested=Resources({GPU: used.get((c, n), 0) * 1000}),
                )
                for n in range(count)
            ),
            admitted=tuple(work.get(c, ())),
        )
        for c, count in enumerate(nodes_per_cluster)
    ]


def _pending(specs: list[tuple[int, int, float | None, int]]) -> list[Workload]:
    return [
        Workload(
            key=f"ns/w{i}",
            priority=priority,
            created_at=float(i),
            pod_sets=(PodSet(count=count, requests=Resources({GPU: gpus * 1000}), name="pods"),),
            duration_limit=limit,
        )
        for i, (count, gpus, limit, priority) in enumerate(specs)
    ]


def _cycle(world: Any, backfill: Backfill, **kwargs: Any) -> tuple[CycleResult, list[Workload]]:
    nodes, running, specs, mode, starvation_after = world
    pending = _pending(specs)
    result = schedule(
        pending,
        _clusters(nodes, running),
        mode=mode,
        now=NOW,
        starvation_after=starvation_after,
        preemption=kwargs.pop("preemption", None),
        backfill=backfill,
        **kwargs,
    )
    return result, pending


def _decisions(result: CycleResult) -> tuple[object, ...]:
    return (result.admits, result.waits, result.preemptions, result.head_key)


@SETTINGS
@given(world_strategy, st.booleans())
def test_reserved_nodes_go_only_to_work_that_ends_before_the_start(
    world: Any, preempt: bool
) -> None:
    policy = LowestPriorityFirst() if preempt else None
    result, pending = _cycle(world, Backfill.DECLARED, preemption=policy)
    limits = {w.key: w.duration_limit for w in pending}
    clusters = [r.cluster for r in result.reservations.values()]
    assert len(clusters) == len(set(clusters))  # one per cluster
    assert set(result.reservations) <= result.heads
    for head, info in result.reservations.items():
        assert info.start >= NOW
        reserved = {name for name, _ in info.nodes}
        later = set(result.order[result.order.index(head) + 1 :])
        for admit in result.admits:
            if admit.key not in later or admit.cluster != info.cluster:
                continue
            if {a.node for a in result.placements[admit.key]} & reserved:
                limit = limits[admit.key]
                assert limit is not None, admit.key
                assert NOW + limit <= info.start, admit.key


shares = st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=1, max_size=8)


@SETTINGS
@given(world_strategy, shares)
def test_a_record_of_ends_moves_the_estimate_alone_and_never_past_the_latest(
    world: Any, recorded: list[float]
) -> None:
    bound, _ = _cycle(world, Backfill.DECLARED)
    estimated, _ = _cycle(world, Backfill.DECLARED, limit_use=LimitUse.of(recorded))
    assert _decisions(estimated) == _decisions(bound)
    assert estimated.reservations.keys() == bound.reservations.keys()
    for head, info in estimated.reservations.items():
        assert NOW <= info.start <= info.latest
        assert replace(info, start=info.latest) == bound.reservations[head]


@SETTINGS
@given(world_strategy, st.booleans())
def test_with_backfill_off_the_decisions_are_todays(world: Any, preempt: bool) -> None:
    nodes, running, specs, mode, starvation_after = world
    policy = LowestPriorityFirst() if preempt else None
    got, pending = _cycle(world, Backfill.NEVER, preemption=policy)
    assert got.reservations == {}
    want = plain_schedule(
        pending,
        _clusters(nodes, running),
        mode=mode,
        now=NOW,
        starvation_after=starvation_after,
        preemption=policy,
    )
    assert _decisions(got) == _decisions(want)
    # Nothing declares a limit: backfill on has nothing to reserve from, and changes nothing.
    no_limits = (nodes, [(*r[:3], None) for r in running], [(*s[:2], None, s[3]) for s in specs])
    unlimited = (*no_limits, mode, starvation_after)
    declared, _ = _cycle(unlimited, Backfill.DECLARED, preemption=policy)
    off, _ = _cycle(unlimited, Backfill.NEVER, preemption=policy)
    assert declared.reservations == {}
    assert _decisions(declared) == _decisions(off)


def _ran(
    clusters: list[ClusterSnapshot], result: CycleResult, pending: list[Workload]
) -> list[ClusterSnapshot]:
    """The clusters once the cycle's admissions run where it placed them, each ending by
    its declared limit."""
    by_key = {w.key: w for w in pending}
    started: dict[str, list[DispatchedWorkload]] = {}
    for admit in result.admits:
        workload = by_key[admit.key]
        usage: dict[str, Resources] = {}
        for placed in result.placements[admit.key]:
            asked = workload.pod_sets[placed.pod_set].requests.scale(placed.count)
            usage[placed.node] = usage.get(placed.node, Resources()) + asked
        limit = workload.duration_limit
        started.setdefault(admit.cluster, []).append(
            DispatchedWorkload(
                key=admit.key,
                priority=workload.priority,
                dispatched_at=NOW,
                usage=tuple(usage.items()),
                ends_at=None if limit is None else NOW + limit,
            )
        )
    after = []
    for cluster in clusters:
        extra = started.get(cluster.name, [])
        added: dict[str, Resources] = {}
        for work in extra:
            for name, used in work.usage:
                added[name] = added.get(name, Resources()) + used
        nodes = tuple(
            replace(n, requested=n.requested + added.get(n.name, Resources()))
            for n in cluster.nodes
        )
        after.append(replace(cluster, nodes=nodes, admitted=cluster.admitted + tuple(extra)))
    return after


@SETTINGS
@given(world_strategy, st.sampled_from([0.5, 1.0, 4.0]))
def test_the_start_never_moves_later_once_backfilled_work_runs(world: Any, later: float) -> None:
    nodes, running, specs, mode, _ = world
    clusters = _clusters(nodes, running)
    pending = _pending(specs)
    kwargs: dict[str, Any] = {"mode": mode, "starvation_after": 1e9, "preemption": None}
    first = schedule(pending, clusters, now=NOW, backfill=Backfill.DECLARED, **kwargs)
    admitted = {a.key for a in first.admits}
    left = [w for w in pending if w.key not in admitted]
    second = schedule(
        left, _ran(clusters, first, pending), now=NOW + later, backfill=Backfill.DECLARED, **kwargs
    )
    for head, info in first.reservations.items():
        assert head in second.reservations
        # (Work past its limit frees its room "now": such a start is always the cycle's now.)
        assert second.reservations[head].start <= max(info.start, NOW + later)
