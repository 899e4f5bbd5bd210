"""Cluster states kept from cycle to cycle (`core.scheduling.kept`): brought up to each new
snapshot by its differences, they hold the same room as a state built afresh."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.core.model import ClusterSnapshot, Reservation
from dispatcher.core.scheduling.kept import REBUILD_AFTER, KeptRooms
from dispatcher.core.scheduling.placement import ClusterRoom, Gang, Refusal
from tests.unit.builders import node, pods, res

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NODES = (node("n1", cpu=4), node("n2", cpu=8, gpu=2), node("n3", cpu=6))

# Each step: (reserve, pods, cpu), (release, which, -), (bind, node, cpu), (resize, which, pods)
steps = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "reserve", "release", "bind", "resize"]),
        st.integers(0, 5),
        st.integers(1, 3),
    ),
    max_size=25,
)


def _applied_room(state: ClusterRoom) -> dict[str, list[int]]:
    """Per node, allocatable - requested - what each reservation was charged there."""
    room = {r: list(column) for r, column in state.allocatable.items()}
    for index, node_state in enumerate(state.nodes):
        for resource, value in node_state.requested.items():
            room.setdefault(resource, [0] * len(state.nodes))[index] -= value
    for applied, _ in state.reserved.values():
        for _, index, asked, count in applied:
            for resource, value in asked:
                room[resource][index] -= value * count
    return room


@SETTINGS
@given(steps)
def test_a_kept_state_holds_what_a_fresh_one_holds(script: list[tuple[str, int, int]]) -> None:
    """After any run of reservations made, given back, resized and pods bound: the aggregate
    free room is a fresh state's, and each node's room is its allocatable less its bound
    pods and what the kept reservations were charged there. While reservations are only
    added, newest last, the kept state is the fresh one, node for node."""
    kept = KeptRooms()
    snapshot = ClusterSnapshot(name="c", nodes=NODES)
    kept.state(snapshot)
    only_added = True
    for step, (kind, which, amount) in enumerate(script):
        reservations = list(snapshot.reservations)
        nodes = list(snapshot.nodes)
        if kind == "reserve":
            reservations.append(
                Reservation(f"ns/r{step}", (pods(which + 1, cpu=amount),), dispatched_at=step)
            )
        elif kind == "release" and reservations:
            reservations.pop(which % len(reservations))
            only_added = False
        elif kind == "resize" and reservations:
            index = which % len(reservations)
            reservations[index] = replace(reservations[index], pod_sets=(pods(amount, cpu=1),))
            only_added = False
        elif kind == "bind":
            index = which % len(nodes)
            nodes[index] = replace(nodes[index], requested=nodes[index].requested + res(cpu=amount))
            only_added = False
        snapshot = replace(snapshot, nodes=tuple(nodes), reservations=tuple(reservations))
        state = kept.state(snapshot)
        fresh = ClusterRoom(snapshot)
        assert state.free_total == fresh.free_total
        room = _applied_room(state)
        assert {r: state.free[r] for r in room} == room
        if only_added:
            assert state.free == fresh.free
    assert kept.built == 1


def test_placing_on_the_copy_leaves_the_kept_state_as_it_was() -> None:
    kept = KeptRooms()
    snapshot = ClusterSnapshot(
        name="c", nodes=NODES, reservations=(Reservation("ns/r", (pods(2, cpu=2),)),)
    )
    first = kept.state(snapshot)
    before = {r: list(c) for r, c in first.free.items()}
    placed = first.place(Gang.of((pods(3, cpu=2),)))
    assert not isinstance(placed, Refusal)
    second = kept.state(snapshot)
    assert second.free == before
    assert second.free_total == ClusterRoom(snapshot).free_total


def test_any_other_change_to_the_nodes_builds_the_state_afresh() -> None:
    kept = KeptRooms()
    snapshot = ClusterSnapshot(name="c", nodes=NODES)
    kept.state(snapshot)
    for changed in (
        NODES[:2],  # a node left
        (replace(NODES[0], unschedulable=True), *NODES[1:]),  # cordoned
        (replace(NODES[0], labels={"zone": "a"}), *NODES[1:]),
        (replace(NODES[0], allocatable=res(cpu=16)), *NODES[1:]),
    ):
        built = kept.built
        state = kept.state(replace(snapshot, nodes=changed))
        assert kept.built == built + 1
        assert state.free == ClusterRoom(replace(snapshot, nodes=changed)).free
        kept.state(snapshot)


def test_a_cluster_that_left_is_forgotten() -> None:
    kept = KeptRooms()
    kept.state(ClusterSnapshot(name="a", nodes=NODES))
    kept.state(ClusterSnapshot(name="b", nodes=NODES))
    kept.keep_only(["b"])
    kept.state(ClusterSnapshot(name="b", nodes=NODES))
    assert kept.built == 2
    kept.state(ClusterSnapshot(name="a", nodes=NODES))
    assert kept.built == 3


def test_a_kept_state_is_built_afresh_now_and_then() -> None:
    """What a state remembers by gang shape must not grow for ever in a long-lived one."""
    kept = KeptRooms()
    snapshot = ClusterSnapshot(name="c", nodes=NODES)
    kept.state(snapshot)
    for step in range(REBUILD_AFTER + 1):
        reservation = Reservation(f"ns/r{step}", (pods(1, cpu=1),), dispatched_at=step)
        kept.state(replace(snapshot, reservations=(reservation,)))
    assert kept.built == 2
