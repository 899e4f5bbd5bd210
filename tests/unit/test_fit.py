"""The fit check: aggregate, per node, reservations, undo, and the reasons people read."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.api.resources import Resources
from dispatcher.core.model import PODS, UNLIMITED_PODS, ClusterSnapshot, PodSet, Taint, Toleration
from dispatcher.core.scheduling.placement import ClusterRoom, Gang, NodeAssignment
from tests.unit.builders import (
    GPU,
    cluster,
    free_room,
    node,
    node_free,
    pods,
    res,
    reservation,
    try_place,
)


def gpus(count: int) -> int:
    """GPUs in the milli-units the core counts in."""
    return count * 1000


GPU_TAINT = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")

FIT_CASES: list[Any] = [
    pytest.param(
        cluster("c", node("n1", gpu=4), node("n2", gpu=4)),
        (pods(2, gpu=4, name="Job/train"),),
        None,
        id="fits-exactly",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=4, used=res(gpu=3)), node("n2", gpu=4, used=res(gpu=3))),
        (pods(4, gpu=1, name="Job/train"),),
        "needs nvidia.com/gpu 4, free 2 of 8",
        id="aggregate-short",
    ),
    pytest.param(
        cluster("c", node("n1", cpu=4, memory="16Gi", gpu=1)),
        (pods(2, cpu=3, memory="16Gi", gpu=1, name="Job/train"),),
        "needs cpu 6, free 4 of 4; needs memory 32Gi, free 16Gi of 16Gi; "
        "needs nvidia.com/gpu 2, free 1 of 1",
        id="aggregate-one-clause-per-resource",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=8), node("n2", gpu=8)),
        (pods(1, gpu=2, name="Job/x"),),
        None,
        id="small-fits",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=8, used=res(gpu=4)), node("n2", gpu=8, used=res(gpu=4))),
        (pods(1, gpu=8, name="Job/big"),),
        "resources free in total but no node can hold pod Job/big (nvidia.com/gpu 8): "
        "largest free on a node is nvidia.com/gpu 4 (n1)",
        id="8-gpu-pod-on-two-half-free-nodes",
    ),
    pytest.param(
        cluster(
            "c", node("n1", cpu=5, memory="64G", gpu=2), node("n2", cpu=2, memory="64G", gpu=4)
        ),
        (pods(2, cpu=3, memory="16G", gpu=1, name="RayCluster/glue worker"),),
        "resources free in total but no node can hold pod RayCluster/glue worker "
        "(cpu 3, memory 16G, nvidia.com/gpu 1) after placing 1 of 2 pods: "
        "largest free on a node is cpu 2, memory 48G, nvidia.com/gpu 1 (n1)",
        id="gang-partly-placed",
    ),
    pytest.param(
        cluster(
            "c",
            node("n1", gpu=8, ready=False),
            node("n2", gpu=8, unschedulable=True),
            node("n3", gpu=2),
        ),
        (pods(1, gpu=4, name="Job/x"),),
        "needs nvidia.com/gpu 4, free 2 of 2",
        id="notready-and-cordoned-do-not-count",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=8, ready=False), node("n2", gpu=8, unschedulable=True)),
        (pods(1, name="Pod/empty"),),
        "no schedulable node (2 nodes, all NotReady or cordoned)",
        id="no-schedulable-node",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=8, taints=(GPU_TAINT,)), node("n2", gpu=1)),
        (pods(1, gpu=4, name="Job/x"),),
        "needs nvidia.com/gpu 4, free 1 of 1 on the 1 nodes its pods may use",
        id="tainted-node-repels",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=8, taints=(GPU_TAINT,))),
        (pods(1, gpu=4, name="Job/x"),),
        "no schedulable node matches pod Job/x (nodeSelector/taints)",
        id="only-tainted-nodes",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=8, taints=(GPU_TAINT,))),
        (
            pods(
                1,
                gpu=4,
                name="Job/x",
                tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),),
            ),
        ),
        None,
        id="toleration-admits",
    ),
    pytest.param(
        cluster(
            "c",
            node("n1", gpu=8, taints=(Taint(key="maintenance", effect="PreferNoSchedule"),)),
        ),
        (pods(1, gpu=4, name="Job/x"),),
        None,
        id="prefer-no-schedule-does-not-repel",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=8, labels={"gpu": "v100"})),
        (pods(1, gpu=1, name="Job/x", selector={"gpu": "a100"}),),
        "no schedulable node matches pod Job/x (nodeSelector/taints)",
        id="selector-matches-nothing",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=8, labels={"gpu": "v100"}), node("n2", gpu=1)),
        (pods(1, gpu=2, name="Job/x", selector={"gpu": "v100"}),),
        None,
        id="selector-matches",
    ),
    pytest.param(
        cluster(
            "c",
            node("n1", gpu=4),
            node("n2", gpu=4),
            reservations=(reservation("ns/dispatched", pods(1, gpu=4)),),
        ),
        (pods(1, gpu=8, name="Job/x"),),
        "needs nvidia.com/gpu 8, free 4 of 8",
        id="reservation-holds-aggregate",
    ),
    pytest.param(
        cluster(
            "c",
            node("n1", gpu=8),
            node("n2", gpu=4),
            reservations=(reservation("ns/dispatched", pods(1, gpu=4)),),
        ),
        (pods(1, gpu=8, name="Job/x"),),
        None,
        id="reservation-placed-best-fit-leaves-big-node",
    ),
    pytest.param(
        cluster(
            "c",
            node("n1", gpu=4),
            node("n2", gpu=4),
            reservations=(reservation("ns/dispatched", pods(3, gpu=2)),),
        ),
        (pods(1, gpu=2, name="Job/x"),),
        None,
        id="reservation-three-of-four-slots",
    ),
    pytest.param(
        cluster(
            "c",
            node("n1", gpu=4),
            node("n2", gpu=4),
            reservations=(reservation("ns/dispatched", pods(3, gpu=2)),),
        ),
        (pods(2, gpu=2, name="Job/x"),),
        "needs nvidia.com/gpu 4, free 2 of 8",
        id="reservation-holds-per-node",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=4)),
        (pods(0, gpu=100, name="Job/none"), pods(1, name="Pod/nothing")),
        None,
        id="zero-pods-and-zero-requests",
    ),
]


@pytest.mark.parametrize(("snapshot", "pod_sets", "want_reason"), FIT_CASES)
def test_try_place(
    snapshot: ClusterSnapshot, pod_sets: tuple[PodSet, ...], want_reason: str | None
) -> None:
    state = ClusterRoom(snapshot)
    before = free_room(state)
    result = try_place(state, pod_sets)
    assert result.ok == (want_reason is None)
    assert result.reason == (want_reason or "")
    if result.ok:
        placed = sum(a.count for a in result.assignments)
        assert placed == sum(p.count for p in pod_sets if p.count > 0)
        result.undo()
    assert free_room(state) == before


def test_placement_stays_applied_until_undone() -> None:
    state = ClusterRoom(cluster("c", node("n1", gpu=8), node("n2", gpu=4)))
    result = try_place(state, (pods(1, gpu=3, name="a"),))
    assert result.ok
    assert result.assignments == (NodeAssignment(pod_set=0, node="n2", count=1),)  # best fit
    assert free_room(state)[0][GPU] == gpus(9)
    assert node_free(state, "n2")[GPU] == gpus(1)
    second = try_place(state, (pods(2, gpu=4, name="b"),))
    assert second.ok
    assert second.assignments == (NodeAssignment(pod_set=0, node="n1", count=2),)
    assert not try_place(state, (pods(1, gpu=2, name="c"),)).ok
    second.undo()
    result.undo()
    assert free_room(state)[0][GPU] == gpus(12)
    with pytest.raises(RuntimeError, match="already undone"):
        result.undo()


def test_larger_pods_are_placed_first() -> None:
    state = ClusterRoom(cluster("c", node("n1", gpu=4), node("n2", gpu=2)))
    result = try_place(state, (pods(2, gpu=1, name="small"), pods(1, gpu=4, name="big")))
    assert result.ok
    assert result.assignments == (
        NodeAssignment(pod_set=1, node="n1", count=1),
        NodeAssignment(pod_set=0, node="n2", count=2),
    )


def test_failed_gang_changes_nothing_and_names_each_workloads_pod() -> None:
    state = ClusterRoom(cluster("c", node("n1", gpu=4), node("n2", gpu=4)))
    first = try_place(state, (pods(1, gpu=1, name="Job/a"), pods(1, gpu=6, name="Job/a big")))
    second = try_place(state, (pods(1, gpu=1, name="Job/b"), pods(1, gpu=6, name="Job/b big")))
    assert not first.ok
    assert not second.ok
    assert "pod Job/a big (nvidia.com/gpu 6)" in first.reason
    assert "pod Job/b big (nvidia.com/gpu 6)" in second.reason
    assert free_room(state)[0][GPU] == gpus(8)
    assert [room[GPU] for room in free_room(state)[1]] == [gpus(4), gpus(4)]


def test_undo_gives_room_back_to_a_shape_that_failed() -> None:
    state = ClusterRoom(
        cluster("c", node("n1", gpu=4, labels={"pool": "a"}), node("n2", gpu=4), node("n3", gpu=2))
    )
    taken = try_place(state, (pods(1, gpu=2, name="a", selector={"pool": "a"}),))
    assert taken.assignments == (NodeAssignment(pod_set=0, node="n1", count=1),)
    big = (pods(2, gpu=4, name="big"),)
    assert try_place(state, big).reason.startswith("resources free in total but no node")
    assert try_place(state, big).reason.startswith("resources free in total but no node")
    taken.undo()
    assert try_place(state, big).ok


def test_reservation_that_fits_no_node_is_charged_to_the_aggregate() -> None:
    snapshot = cluster(
        "c",
        node("n1", gpu=4),
        node("n2", gpu=4),
        reservations=(reservation("ns/old", pods(1, gpu=6)),),
    )
    state = ClusterRoom(snapshot)
    # Charged to the aggregate (8 - 6 free), while both nodes stay free.
    assert free_room(state)[0][GPU] == gpus(2)
    assert [room[GPU] for room in free_room(state)[1]] == [gpus(4), gpus(4)]
    result = try_place(state, (pods(1, gpu=4, name="Job/x"),))
    assert result.reason == "needs nvidia.com/gpu 4, free 2 of 8"


def test_overcommitted_node_lowers_the_aggregate() -> None:
    state = ClusterRoom(cluster("c", node("n1", gpu=4, used=res(gpu=6)), node("n2", gpu=4)))
    assert free_room(state)[0][GPU] == gpus(2)
    assert try_place(state, (pods(1, gpu=4, name="Job/x"),)).reason == (
        "needs nvidia.com/gpu 4, free 2 of 8"
    )


FITS_EVER_CASES: list[Any] = [
    pytest.param(
        cluster("c", node("n1", gpu=8, used=res(gpu=8))),
        (pods(1, gpu=8, name="Job/x"),),
        None,
        id="full-now-but-fits-empty",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=4), node("n2", gpu=4)),
        (pods(4, gpu=4, name="Job/x"),),
        "needs nvidia.com/gpu 16, the cluster has 8",
        id="bigger-than-cluster",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=4), node("n2", gpu=4)),
        (pods(1, gpu=8, name="Job/x"),),
        "no node can ever hold pod Job/x (nvidia.com/gpu 8): the largest node has "
        "nvidia.com/gpu 4 (n1)",
        id="pod-bigger-than-any-node",
    ),
    pytest.param(
        cluster("c", node("n1", gpu=4), reservations=(reservation("r", pods(1, gpu=4)),)),
        (pods(1, gpu=4, name="Job/x"),),
        None,
        id="reservations-ignored",
    ),
]


@pytest.mark.parametrize(("snapshot", "pod_sets", "want"), FITS_EVER_CASES)
def test_could_ever_fit(
    snapshot: ClusterSnapshot, pod_sets: tuple[PodSet, ...], want: str | None
) -> None:
    """The cycle's "could it fit this cluster emptied" check (StrictFIFO's head of line and
    the starvation guard); `want` says why not, for people reading the case."""
    assert ClusterRoom(snapshot, empty=True).fits(Gang.of(pod_sets)) == (want is None)


def test_capacity_counts_schedulable_nodes_only() -> None:
    state = ClusterRoom(
        cluster("c", node("n1", cpu=4, gpu=2), node("n2", cpu=4, gpu=2, unschedulable=True))
    )
    # n1 does not report `pods`: it takes any number.
    assert Resources(state.capacity) == res(cpu=4, memory="64Gi", gpu=2) + {PODS: UNLIMITED_PODS}
    assert state.capacity_of(GPU) == gpus(2)
    assert state.names == ["n1"]
