"""Reservations for heads that fit nowhere yet, and backfill around them: one cycle per case."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from dispatcher.core.limituse import LimitUse
from dispatcher.core.model import (
    Backfill,
    ClusterSnapshot,
    DispatchedWorkload,
    QueueMode,
    Workload,
)
from dispatcher.core.queues import QueueManager, take
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import CycleResult, LowestPriorityFirst, schedule
from dispatcher.core.scheduling.clusters import CycleScratch
from dispatcher.core.scheduling.kept import KeptRooms
from dispatcher.core.scheduling.placement import ClusterRoom
from dispatcher.core.scheduling.reservation import earliest_start, endings
from tests.unit.builders import cluster, node, pods, res, running, with_running, workload
from tests.unit.quota_builders import queue, setup

STRICT = QueueMode.STRICT_FIFO
BEST = QueueMode.BEST_EFFORT_FIFO
DECLARED = Backfill.DECLARED
NEVER = Backfill.NEVER
NOW = 1000.0
T60 = "1970-01-01T00:17:40Z"  # NOW + 60


def job(
    key: str,
    gpus: int,
    *,
    count: int = 1,
    limit: float | None = None,
    at: float = 0.0,
    **kwargs: object,
) -> Workload:
    made = workload(key, pods(count, gpu=gpus, name="pods"), created_at=at, **kwargs)  # type: ignore[arg-type]
    return replace(made, duration_limit=limit)


def busy(key: str, on: str, gpus: int = 8, *, ends: float | None = None) -> DispatchedWorkload:
    """Dispatched work using `gpus` on node `on`, ending `ends` seconds from NOW (None: no
    declared limit)."""
    made = running(key, dispatched_at=NOW - 10, usage={on: res(gpu=gpus)})
    return replace(made, ends_at=None if ends is None else NOW + ends)


def gpus_cluster(name: str, nodes: int, *work: DispatchedWorkload) -> ClusterSnapshot:
    names = [f"{name}-n{i}" if name != "c1" else f"n{i}" for i in range(nodes)]
    return with_running(cluster(name, *(node(n, gpu=8) for n in names)), *work)


def gang(key: str = "ns/gang", nodes: int = 2, **kwargs: object) -> Workload:
    return job(key, 8, count=nodes, **kwargs)  # type: ignore[arg-type]


def cycle(
    pending: Sequence[Workload],
    clusters: Sequence[ClusterSnapshot],
    *,
    mode: QueueMode = BEST,
    backfill: Backfill = DECLARED,
    starvation_after: float = 1e9,
    now: float = NOW,
    **kwargs: object,
) -> CycleResult:
    return schedule(
        pending,
        clusters,
        mode=mode,
        now=now,
        starvation_after=starvation_after,
        preemption=kwargs.pop("preemption", None),  # type: ignore[arg-type]
        backfill=backfill,
        **kwargs,  # type: ignore[arg-type]
    )


def waits(result: CycleResult) -> dict[str, str]:
    return {w.key: w.message for w in result.waits}


def reserved(result: CycleResult) -> dict[str, tuple[str, float, tuple[str, ...], tuple[str, ...]]]:
    return {
        key: (r.cluster, r.start - NOW, tuple(n for n, _ in r.nodes), r.ending)
        for key, r in result.reservations.items()
    }


def nodes_of(result: CycleResult, key: str) -> set[str]:
    return {a.node for a in result.placements[key]}


# Four full nodes whose work ends 30, 60 and 90 s from now, and one without a limit.
FOUR = gpus_cluster(
    "c1",
    4,
    busy("ns/r0", "n0", ends=30),
    busy("ns/r1", "n1", ends=60),
    busy("ns/r2", "n2", ends=90),
    busy("ns/r3", "n3"),
)
# n0 free, n1 full until 60 s from now, n2 half used by work with no limit.
MIXED = gpus_cluster("c1", 3, busy("ns/r1", "n1", ends=60), busy("ns/r2", "n2", 4))


@dataclass(frozen=True)
class Case:
    id: str
    pending: tuple[Workload, ...]
    clusters: tuple[ClusterSnapshot, ...]
    want_reserved: dict[str, tuple[str, float, tuple[str, ...], tuple[str, ...]]]
    want_admits: dict[str, str] = field(default_factory=dict)  # key -> cluster
    want_waits: dict[str, str] = field(default_factory=dict)  # key -> message (some)
    mode: QueueMode = BEST
    backfill: Backfill = DECLARED


CASES = [
    Case(
        id="the-head-reserves-from-the-first-time-declared-limits-free-enough",
        pending=(gang(),),
        clusters=(FOUR,),
        want_reserved={"ns/gang": ("c1", 60.0, ("n0", "n1"), ("ns/r0", "ns/r1"))},
        want_waits={
            "ns/gang": "needs nvidia.com/gpu 16, free 0 of 32; reserved 2 nodes in cluster c1"
            f" from {T60} (fits when ns/r0, ns/r1 end: declared limits)"
        },
    ),
    Case(
        id="work-without-a-limit-never-frees-room",
        pending=(gang(nodes=4),),
        clusters=(FOUR,),
        want_reserved={},
        want_waits={"ns/gang": "needs nvidia.com/gpu 32, free 0 of 32"},
    ),
    Case(
        id="backfill-off-reserves-nothing",
        pending=(gang(),),
        clusters=(FOUR,),
        want_reserved={},
        want_waits={"ns/gang": "needs nvidia.com/gpu 16, free 0 of 32"},
        backfill=NEVER,
    ),
    Case(
        id="work-ending-at-the-same-instant-goes-together",
        pending=(gang(),),
        clusters=(gpus_cluster("c1", 3, busy("ns/a", "n0", ends=60), busy("ns/b", "n1", ends=60)),),
        want_reserved={"ns/gang": ("c1", 60.0, ("n0", "n1"), ("ns/a", "ns/b"))},
    ),
    Case(
        id="work-that-ends-before-the-start-backfills-the-reserved-nodes",
        pending=(gang(at=1), job("ns/short", 8, limit=30, at=2)),
        clusters=(MIXED,),
        want_reserved={"ns/gang": ("c1", 60.0, ("n0", "n1"), ("ns/r1",))},
        want_admits={"ns/short": "c1"},
    ),
    Case(
        id="work-that-outlasts-the-start-is-kept-off-the-reserved-nodes",
        pending=(gang(at=1), job("ns/long", 8, limit=90, at=2), job("ns/endless", 8, at=3)),
        clusters=(MIXED,),
        want_reserved={"ns/gang": ("c1", 60.0, ("n0", "n1"), ("ns/r1",))},
        want_waits={
            "ns/long": "needs nvidia.com/gpu 8, free 4 of 24; nodes in cluster c1 are reserved"
            " for work ahead of it, and its declared limit runs past the reservation's start",
            "ns/endless": "needs nvidia.com/gpu 8, free 4 of 24; nodes in cluster c1 are"
            " reserved for work ahead of it, and it declares no limit (dispatchDuration.limit)",
        },
    ),
    Case(
        id="strict-fifo-lets-pass-what-ends-before-the-start",
        pending=(gang(at=1), job("ns/long", 8, limit=90, at=2), job("ns/short", 8, limit=30, at=3)),
        clusters=(MIXED,),
        want_reserved={"ns/gang": ("c1", 60.0, ("n0", "n1"), ("ns/r1",))},
        want_admits={"ns/short": "c1"},
        want_waits={"ns/long": "waiting behind ns/gang (head of line)"},
        mode=STRICT,
    ),
    Case(
        id="strict-fifo-without-backfill-blocks-all",
        pending=(gang(at=1), job("ns/short", 8, limit=30, at=3)),
        clusters=(MIXED,),
        want_reserved={},
        want_waits={"ns/short": "waiting behind ns/gang (head of line)"},
        mode=STRICT,
        backfill=NEVER,
    ),
    Case(
        id="only-the-head-reserves",
        pending=(job("ns/first", 8, at=1), gang(at=2)),
        clusters=(FOUR,),
        want_reserved={"ns/first": ("c1", 30.0, ("n0",), ("ns/r0",))},
    ),
    Case(
        id="the-earliest-cluster-wins",
        pending=(gang(),),
        clusters=(
            gpus_cluster("a", 2, busy("ns/a0", "a-n0", ends=90), busy("ns/a1", "a-n1", ends=90)),
            gpus_cluster("b", 2, busy("ns/b0", "b-n0", ends=40), busy("ns/b1", "b-n1", ends=50)),
        ),
        want_reserved={"ns/gang": ("b", 50.0, ("b-n0", "b-n1"), ("ns/b0", "ns/b1"))},
    ),
    Case(
        id="a-tie-goes-to-the-first-cluster",
        pending=(gang(),),
        clusters=(
            gpus_cluster("b", 2, busy("ns/b0", "b-n0", ends=60), busy("ns/b1", "b-n1", ends=60)),
            gpus_cluster("a", 2, busy("ns/a0", "a-n0", ends=60), busy("ns/a1", "a-n1", ends=60)),
        ),
        want_reserved={"ns/gang": ("a", 60.0, ("a-n0", "a-n1"), ("ns/a0", "ns/a1"))},
    ),
    Case(
        id="this-cycles-admissions-end-by-their-limits-too",
        pending=(job("ns/a", 8, limit=50, at=1), job("ns/b", 8, limit=100, at=2), gang(at=3)),
        clusters=(gpus_cluster("c1", 2),),
        want_reserved={"ns/gang": ("c1", 100.0, ("n0", "n1"), ("ns/a", "ns/b"))},
        want_admits={"ns/a": "c1", "ns/b": "c1"},
    ),
    Case(
        id="others-are-named-for-the-heads-namespace-only",
        pending=(gang(),),
        clusters=(gpus_cluster("c1", 2, busy("ns/a", "n0", ends=60), busy("x/b", "n1", ends=60)),),
        want_reserved={"ns/gang": ("c1", 60.0, ("n0", "n1"), ("ns/a", "x/b"))},
        want_waits={
            "ns/gang": "needs nvidia.com/gpu 16, free 0 of 16; reserved 2 nodes in cluster c1"
            f" from {T60} (fits when ns/a and another namespace's AppWrapper end: declared"
            " limits)"
        },
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reservations(case: Case) -> None:
    result = cycle(case.pending, case.clusters, mode=case.mode, backfill=case.backfill)
    assert reserved(result) == case.want_reserved
    assert {a.key: a.cluster for a in result.admits} == case.want_admits
    got = waits(result)
    for key, message in case.want_waits.items():
        assert got[key] == message
    limits = {w.key: w.duration_limit for w in case.pending}
    for key, info in result.reservations.items():
        later = result.order[result.order.index(key) :]
        for admit in result.admits:
            if admit.key in later and nodes_of(result, admit.key) & {n for n, _ in info.nodes}:
                limit = limits[admit.key]
                assert limit is not None
                assert NOW + limit <= info.start


def test_backfilled_work_lands_on_the_reserved_node_and_long_work_beside_it() -> None:
    pending = (gang(at=1), job("ns/short", 8, limit=30, at=2), job("ns/long", 4, at=3))
    result = cycle(pending, [MIXED])
    assert nodes_of(result, "ns/short") == {"n0"}
    assert nodes_of(result, "ns/long") == {"n2"}


def test_a_reserving_strict_head_does_not_park_its_line() -> None:
    result = cycle((gang(at=1), job("ns/long", 8, limit=90, at=2)), [MIXED], mode=STRICT)
    assert "ns/gang" in result.reservations
    assert result.blocking == frozenset()  # work that ends before its start may still pass


def test_a_starving_head_reserves_instead_of_holding_the_cluster() -> None:
    pending = (gang(at=1), job("ns/short", 8, limit=30, at=2))
    result = cycle(pending, [MIXED], starvation_after=10.0)
    assert "ns/gang" in result.reservations
    assert result.holders == frozenset()
    assert [a.key for a in result.admits] == ["ns/short"]
    today = cycle(pending, [MIXED], starvation_after=10.0, backfill=NEVER)
    assert today.holders == {"ns/gang"}
    assert today.admits == ()


def test_a_preempting_head_reserves_nothing() -> None:
    victims = gpus_cluster("c1", 2, busy("ns/a", "n0", ends=60), busy("ns/b", "n1", ends=60))
    result = cycle([gang(priority=5)], [victims], preemption=LowestPriorityFirst())
    assert result.preemptions
    assert result.reservations == {}


def _queues(backfill: Backfill) -> QuotaView:
    quotas = setup(
        queue("q1", {"nvidia.com/gpu": "64"}, backfill=backfill),
        queue("q2", {"nvidia.com/gpu": "64"}, backfill=backfill),
    )
    return QuotaView(QuotaTree(quotas), ())


def test_one_reservation_per_cluster_the_first_in_the_cycles_order() -> None:
    pending = (gang("ns/g1", at=1, queue="q1"), gang("ns/g2", at=2, queue="q2"))
    result = cycle(pending, [FOUR], quotas=_queues(DECLARED))
    assert list(result.reservations) == ["ns/g1"]
    assert "reserved for work ahead of it" in waits(result)["ns/g2"]
    assert result.heads == {"ns/g1", "ns/g2"}


def test_a_queue_with_backfill_off_reserves_nothing() -> None:
    result = cycle([gang(queue="q1")], [FOUR], quotas=_queues(NEVER))
    assert result.reservations == {}


def test_finding_the_start_leaves_the_room_as_it_was() -> None:
    state = ClusterRoom(FOUR)
    free = {r: list(c) for r, c in state.free.items()}
    totals = dict(state.free_total)
    scratch = CycleScratch([FOUR], NOW)
    found = earliest_start(state, scratch.gang(gang()), endings(FOUR, (), NOW), NOW)
    assert found is not None
    assert found.start == NOW + 60
    assert (state.free, state.free_total) == (free, totals)


def test_the_same_inputs_give_the_same_reservation_kept_or_afresh() -> None:
    """Nothing is stored between cycles: a second cycle (or a restarted dispatcher, whose
    cluster states are built afresh) derives the same reservation from the same snapshot."""
    pending = (gang(at=1), job("ns/short", 8, limit=30, at=2), job("ns/long", 4, at=3))
    kept = KeptRooms()
    first = cycle(pending, [MIXED], kept=kept)
    again = cycle(pending, [MIXED], kept=kept)
    afresh = cycle(pending, [MIXED])
    assert first.reservations == again.reservations == afresh.reservations
    assert first.waits == again.waits == afresh.waits
    assert first.placements == again.placements == afresh.placements


def _bound(
    snapshot: ClusterSnapshot, result: CycleResult, pending: Sequence[Workload]
) -> ClusterSnapshot:
    """The next snapshot: the cycle's admissions bound where it placed them, each ending by
    its declared limit from NOW."""
    by_key = {w.key: w for w in pending}
    started = []
    for admit in result.admits:
        usage: dict[str, object] = {}
        for placed in result.placements[admit.key]:
            gpus = by_key[admit.key].pod_sets[placed.pod_set].requests
            usage[placed.node] = gpus.scale(placed.count)
        limit = by_key[admit.key].duration_limit
        started.append(
            replace(
                running(admit.key, dispatched_at=NOW, usage=usage),  # type: ignore[arg-type]
                ends_at=None if limit is None else NOW + limit,
            )
        )
    return with_running(snapshot, *started)


def test_backfilled_work_never_moves_the_start_later() -> None:
    pending = (gang(at=1), job("ns/short", 8, limit=30, at=2), job("ns/long", 4, at=3))
    first = cycle(pending, [MIXED])
    assert {a.key for a in first.admits} == {"ns/short", "ns/long"}
    after = _bound(MIXED, first, pending)
    second = cycle([gang(at=1)], [after], now=NOW + 5)
    assert second.reservations["ns/gang"].start <= first.reservations["ns/gang"].start


def test_take_keeps_a_reserving_head_active_and_wakes_when_it_ends() -> None:
    manager = QueueManager()
    for w in (gang(at=1), job("ns/long", 8, limit=90, at=2)):
        manager.upsert(w, "")
    kwargs = {"mode": BEST, "starvation_after": 1e9, "preemption": None, "backfill": DECLARED}
    result = take(manager, [MIXED], now=NOW, **kwargs)  # type: ignore[arg-type]
    assert "ns/gang" in result.reservations
    assert "c1" in result.held
    assert not manager.is_parked("ns/gang")
    assert manager.is_parked("ns/long")
    # The head's room freed elsewhere is not its own: it is still tried the next cycle.
    again = take(manager, [MIXED], now=NOW + 1, held_before=result.held, **kwargs)  # type: ignore[arg-type]
    assert "ns/gang" in again.reservations


def test_a_reservation_whose_start_came_is_kept_while_the_work_it_waited_for_goes() -> None:
    """At its start the work it waited for reached its limit and is going: no longer
    dispatched, its pods still on the nodes (terminating). The reservation is kept as it
    was, so that work without a limit cannot take the nodes in those seconds; once the pods
    are gone the gang is admitted there."""
    ending = [busy("ns/a", "n0", 4, ends=60), busy("ns/b", "n1", 4, ends=60)]
    first = cycle([gang(at=1.0)], [gpus_cluster("c1", 3, *ending, busy("ns/c", "n2"))])
    reserved = first.reservations["ns/gang"]
    assert (reserved.start, {n for n, _ in reserved.nodes}) == (NOW + 60, {"n0", "n1"})
    # 61 s later: a and b are no longer dispatched, their pods not gone yet.
    going = with_running(
        cluster("c1", *(node(f"n{i}", gpu=8) for i in range(3))),
        busy("ns/c", "n2"),
    )
    going = with_running(going, *[replace(e, key=f"{e.key}-pods") for e in ending])
    going = replace(going, admitted=tuple(a for a in going.admitted if a.key == "ns/c"))
    unbounded = job("ns/unbounded", 4, at=2.0)  # fits beside a going one: reserved room
    later = cycle(
        [gang(at=1.0), unbounded], [going], now=NOW + 61, reserved_before=first.reservations
    )
    assert later.reservations["ns/gang"] == reserved
    assert [a.key for a in later.admits] == []
    # Without the last cycle's reservation, the lapse lets the unbounded one in: the rule
    # above is what keeps it out.
    lapsed = cycle([gang(at=1.0), unbounded], [going], now=NOW + 61)
    assert "ns/gang" not in lapsed.reservations
    assert [a.key for a in lapsed.admits] == ["ns/unbounded"]
    # Long past its start, it is not kept for ever.
    stale = cycle(
        [gang(at=1.0), unbounded], [going], now=NOW + 600, reserved_before=first.reservations
    )
    assert "ns/gang" not in stale.reservations


def test_a_reservation_is_kept_when_the_work_it_waited_for_ends_before_its_start() -> None:
    """The limit is enforced a moment before the second the search counts to (or the work
    ends early): gone from the dispatched, its pods still there, the start not come yet.
    The reservation is kept, the nodes fenced from work without a limit."""
    ending = [busy("ns/a", "n0", 4, ends=60), busy("ns/b", "n1", 4, ends=60)]
    first = cycle([gang(at=1.0)], [gpus_cluster("c1", 3, *ending, busy("ns/c", "n2"))])
    going = with_running(
        cluster("c1", *(node(f"n{i}", gpu=8) for i in range(3))),
        busy("ns/c", "n2"),
        *[replace(e, key=f"{e.key}-pods") for e in ending],
    )
    going = replace(going, admitted=tuple(a for a in going.admitted if a.key == "ns/c"))
    unbounded = job("ns/unbounded", 4, at=2.0)
    early = cycle(
        [gang(at=1.0), unbounded], [going], now=NOW + 59.5, reserved_before=first.reservations
    )
    assert early.reservations["ns/gang"] == first.reservations["ns/gang"]
    assert early.admits == ()


def test_a_record_of_early_ends_moves_the_estimate_earlier_and_nothing_else() -> None:
    """Work recorded to run half its limit: the two ends the gang waits for (on two of its
    three nodes) are expected at +10 and +25 s (of +30 and +60 s). The estimate is then; the
    latest start, the nodes, the message and backfill (work that ends by the latest) are as
    with nothing recorded."""
    clusters = [gpus_cluster("c1", 3, busy("ns/r0", "n0", ends=30), busy("ns/r1", "n1", ends=60))]
    pending = [
        gang(nodes=3, at=1),
        job("ns/quick", 4, limit=20, at=2),
        job("ns/slower", 4, limit=30, at=3),
        job("ns/long", 4, limit=90, at=4),
    ]
    recorded = cycle(pending, clusters, limit_use=LimitUse.of([0.5] * 5))
    bound = cycle(pending, clusters)
    assert recorded.reservations["ns/gang"].start == NOW + 25
    assert bound.reservations["ns/gang"].start == NOW + 60
    assert replace(recorded.reservations["ns/gang"], start=0) == replace(
        bound.reservations["ns/gang"], start=0
    )
    assert recorded.reservations["ns/gang"].latest == NOW + 60
    assert waits(recorded) == waits(bound)
    assert f"from {T60} (fits when ns/r0, ns/r1 end" in waits(recorded)["ns/gang"]
    assert [a.key for a in recorded.admits] == [a.key for a in bound.admits]
    assert [a.key for a in recorded.admits] == ["ns/quick", "ns/slower"]
