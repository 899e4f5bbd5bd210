"""Victim choice of the default preemption policy (rule 4)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.model import ClusterSnapshot, Workload
from dispatcher.core.scheduling import LowestPriorityFirst, PreemptionPolicy
from dispatcher.core.scheduling.evictions import without
from tests.unit.builders import (
    cluster,
    node,
    pods,
    res,
    reservation,
    running,
    with_running,
    workload,
)

ONE_NODE = cluster("c", node("n1", gpu=8))
TWO_NODES = cluster("c", node("n1", gpu=8), node("n2", gpu=8))
URGENT = workload("ns/urgent", pods(1, gpu=4, name="Job/urgent"), priority=5)
URGENT_8 = workload("ns/urgent", pods(1, gpu=8, name="Job/urgent"), priority=5)

CASES: list[Any] = [
    pytest.param(
        with_running(ONE_NODE, running("ns/a", usage={"n1": res(gpu=4)})),
        URGENT,
        (),
        id="fits-already",
    ),
    pytest.param(
        with_running(
            ONE_NODE,
            running("ns/a", priority=0, dispatched_at=1, usage={"n1": res(gpu=2)}),
            running("ns/b", priority=0, dispatched_at=2, usage={"n1": res(gpu=2)}),
            running("ns/c", priority=1, dispatched_at=0, usage={"n1": res(gpu=4)}),
        ),
        URGENT,
        ("ns/b", "ns/a"),
        id="lowest-priority-then-most-recent",
    ),
    pytest.param(
        with_running(
            ONE_NODE,
            running("ns/small", priority=0, usage={"n1": res(gpu=1)}),
            running("ns/big", priority=1, usage={"n1": res(gpu=4)}),
            running("ns/rest", priority=9, usage={"n1": res(gpu=3)}),
        ),
        URGENT,
        ("ns/big",),
        id="unneeded-victim-given-back",
    ),
    pytest.param(
        with_running(
            TWO_NODES,
            running("ns/high", priority=9, usage={"n1": res(gpu=4)}),
            running("ns/a", priority=0, dispatched_at=2, usage={"n1": res(gpu=4)}),
            running("ns/b", priority=0, dispatched_at=1, usage={"n2": res(gpu=8)}),
        ),
        URGENT_8,
        ("ns/b",),
        id="per-node-only-the-victim-on-the-right-node",
    ),
    pytest.param(
        with_running(ONE_NODE, running("ns/equal", priority=5, usage={"n1": res(gpu=8)})),
        URGENT,
        None,
        id="equal-priority-never",
    ),
    pytest.param(
        with_running(ONE_NODE, running("ns/higher", priority=7, usage={"n1": res(gpu=8)})),
        URGENT,
        None,
        id="higher-priority-never",
    ),
    pytest.param(
        with_running(
            ONE_NODE,
            running("ns/low", priority=0, usage={"n1": res(gpu=2)}),
            running("ns/high", priority=9, usage={"n1": res(gpu=6)}),
        ),
        URGENT,
        None,
        id="impossible-even-evicting-all",
    ),
    pytest.param(
        with_running(
            ONE_NODE,
            running("ns/pinned", priority=0, preemptible=False, usage={"n1": res(gpu=4)}),
            running("ns/low", priority=1, usage={"n1": res(gpu=4)}),
        ),
        URGENT,
        ("ns/low",),
        id="non-preemptible-skipped",
    ),
    pytest.param(
        with_running(
            ONE_NODE, running("ns/pinned", priority=0, preemptible=False, usage={"n1": res(gpu=8)})
        ),
        URGENT,
        None,
        id="only-non-preemptible",
    ),
    pytest.param(
        cluster(
            "c",
            node("n1", gpu=8),
            reservations=(reservation("ns/starting", pods(2, gpu=4)),),
            admitted=(running("ns/starting", priority=0),),
        ),
        URGENT,
        ("ns/starting",),
        id="reservation-of-dispatched-but-unbound",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=2)),
        URGENT,
        None,
        id="no-candidates",
    ),
]


@pytest.mark.parametrize(("snapshot", "preemptor", "want"), CASES)
def test_lowest_priority_first(
    snapshot: ClusterSnapshot, preemptor: Workload, want: tuple[str, ...] | None
) -> None:
    policy: PreemptionPolicy = LowestPriorityFirst()
    assert policy.choose_victims(preemptor, snapshot) == want


def test_without_removes_usage_and_reservations() -> None:
    """(The test helper that builds a cluster as it is once victims are gone.)"""
    snapshot = with_running(
        cluster("c", node("n1", gpu=8), reservations=(reservation("ns/r", pods(1, gpu=2)),)),
        running("ns/a", usage={"n1": res(gpu=3)}),
        running("ns/r"),
    )
    assert snapshot.nodes[0].requested == res(gpu=3)
    emptied = without(snapshot, frozenset({"ns/a", "ns/r"}))
    assert emptied.nodes[0].requested == res()
    assert emptied.reservations == ()
    assert emptied.admitted == ()
    assert without(snapshot, frozenset()) is snapshot
