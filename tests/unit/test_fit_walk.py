"""The node walk of `ClusterRoom` places every pod exactly where a plain best fit would.

Pins what the walk relies on: a node whose room changes is re-sorted in place (every order
stays what sorting afresh would give), and the nodes a walk skips (below the least room
one pod needs, or known full) hold none of its pods, through placements and undos.
"""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core.model import ClusterSnapshot
from dispatcher.core.scheduling.placement import ClusterRoom
from tests.unit.builders import cluster, node, node_free, pods, res, try_place

RESOURCES = ("cpu", "memory")


def _free(state: ClusterRoom) -> list[dict[str, int]]:
    return [dict(node_free(state, name)) for name in state.names]


def _best_fit(
    state: ClusterRoom, count: int, cpu: int, memory: int
) -> list[tuple[str, int]] | None:
    """Each pod on the node with the least room (sum of free / capacity) that holds one,
    ties to the node listed first, filling it before the next; None when some pod finds
    no node."""
    free = _free(state)
    capacity = {r: state.capacity_of(r) or 1 for r in RESOURCES}
    want = {"cpu": cpu * 1000, "memory": memory * 2**30 * 1000}
    names = state.names
    placed: list[tuple[str, int]] = []
    while count:
        holders = [
            i
            for i, room in enumerate(free)
            if all(room.get(r, 0) >= want[r] for r in RESOURCES)
            and all(state.allocatable[r][i] > 0 for r in RESOURCES)
        ]
        if not holders:
            return None
        best = min(
            holders,
            key=lambda i: (sum(Fraction(free[i].get(r, 0), capacity[r]) for r in RESOURCES), i),
        )
        fit = min(free[best].get(r, 0) // want[r] for r in RESOURCES)
        taken = min(fit, count)
        for r in RESOURCES:
            free[best][r] = free[best].get(r, 0) - want[r] * taken
        placed.append((names[best], taken))
        count -= taken
    return placed


def _orders_as_rebuilt(state: ClusterRoom) -> bool:
    for order in state._orders.values():
        if order.sorted != sorted((order.room(n), n) for n in order.nodes):
            return False
    return True


def _snapshot(used: list[tuple[int, int]]) -> ClusterSnapshot:
    return cluster(
        "c",
        *(
            node(f"n{i}", cpu=16, memory="64Gi", used=res(cpu=cpu, memory=f"{memory}Gi"))
            for i, (cpu, memory) in enumerate(used)
        ),
    )


@settings(max_examples=150, deadline=None)
@given(
    used=st.lists(st.tuples(st.integers(0, 16), st.integers(0, 64)), min_size=1, max_size=12),
    gangs=st.lists(
        st.tuples(st.integers(1, 6), st.integers(1, 4), st.integers(1, 16), st.booleans()),
        min_size=1,
        max_size=25,
    ),
)
def test_walk_places_as_plain_best_fit(
    used: list[tuple[int, int]], gangs: list[tuple[int, int, int, bool]]
) -> None:
    state = ClusterRoom(_snapshot(used))
    for count, cpu, memory, undo in gangs:
        expected = _best_fit(state, count, cpu, memory)
        result = try_place(state, (pods(count, cpu=cpu, memory=f"{memory}Gi", name="Job/x"),))
        if expected is None:
            assert not result.ok
        else:
            assert result.ok, result.reason
            assert [(a.node, a.count) for a in result.assignments] == expected
            if undo:
                result.undo()
        assert _orders_as_rebuilt(state)
