"""Trying an eviction on a `ClusterRoom`, and taking it back. Pure, no I/O.

`evict` changes the state into the cluster as it would be without one dispatched
AppWrapper and returns the function that changes it back, so a preemption policy can try
victims one after another on one state, the way Kueue simulates a workload's removal.
An evicted AppWrapper gives back exactly what it holds in the state: the requests of its
bound pods to their nodes and to the aggregate, and its reservation's charges (the pods
placed on nodes, and the whole reservation against the aggregate). The other reservations
keep the nodes they were charged to. Evictions add room and their undos take the same
room again, so they may be tried and taken back in any order. `lift` does the same for a
gang this cycle placed (it is in no snapshot yet): reservations let such work end too; and
`withhold` takes a node's free room away for a while (nodes reserved for another).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from dispatcher.api.resources import EMPTY, Resources
from dispatcher.core.model import ClusterSnapshot, DispatchedWorkload
from dispatcher.core.scheduling.placement import ClusterRoom, Placed

__all__ = ["evict", "lift", "withhold", "without"]


def without(snapshot: ClusterSnapshot, keys: frozenset[str]) -> ClusterSnapshot:
    """The cluster as the next cycle will see it once the AppWrappers named by `keys` are
    gone: their bound pods' requests off their nodes, their reservations dropped."""
    if not keys:
        return snapshot
    freed: dict[str, Resources] = {}
    for admitted in snapshot.admitted:
        if admitted.key in keys:
            for node_name, used in admitted.usage:
                freed[node_name] = freed.get(node_name, EMPTY) + used
    nodes = tuple(
        replace(node, requested=node.requested - freed[node.name]) if node.name in freed else node
        for node in snapshot.nodes
    )
    return replace(
        snapshot,
        nodes=nodes,
        reservations=tuple(r for r in snapshot.reservations if r.key not in keys),
        admitted=tuple(a for a in snapshot.admitted if a.key not in keys),
    )


def _held_by(
    state: ClusterRoom, victim: DispatchedWorkload
) -> tuple[dict[int, dict[str, int]], dict[str, int]]:
    """What `victim` holds in `state`: per node index, and in the aggregate."""
    per_node: dict[int, dict[str, int]] = {}
    total: dict[str, int] = {}

    def add(node: int, resource: str, value: int, *, aggregate: bool) -> None:
        on_node = per_node.setdefault(node, {})
        on_node[resource] = on_node.get(resource, 0) + value
        if aggregate:
            total[resource] = total.get(resource, 0) + value

    for node_name, used in victim.usage:
        node = state.index.get(node_name)
        if node is not None:  # pods on unschedulable nodes were never counted
            for resource, value in used.items():
                add(node, resource, value, aggregate=True)
    reserved = state.reserved.get(victim.key)
    if reserved is not None:
        applied, totals = reserved
        for _, node, requests, count in applied:
            for resource, value in requests:
                add(node, resource, value * count, aggregate=False)
        for resource, value in totals:  # the aggregate was charged the whole reservation
            total[resource] = total.get(resource, 0) + value
    return per_node, total


def evict(state: ClusterRoom, victim: DispatchedWorkload) -> Callable[[], None]:
    """Give back what `victim` holds in `state`; returns the undo."""
    per_node, total = _held_by(state, victim)
    return _given_back(state, per_node, total)


def lift(state: ClusterRoom, placed: Placed) -> Callable[[], None]:
    """Give back what a gang placed in `state` this cycle takes (its pods on their nodes,
    and the same against the aggregate); returns the undo. The placement itself stands:
    the undo takes the room again."""
    per_node: dict[int, dict[str, int]] = {}
    total: dict[str, int] = {}
    for _, node, requests, count in placed.applied:
        on_node = per_node.setdefault(node, {})
        for resource, value in requests:
            on_node[resource] = on_node.get(resource, 0) + value * count
            total[resource] = total.get(resource, 0) + value * count
    return _given_back(state, per_node, total)


def withhold(state: ClusterRoom, nodes: Iterable[int]) -> Callable[[], None]:
    """Take away every bit of free room `nodes` (indices) have, from them and from the
    aggregate, as if they were full: nodes reserved for another, kept from work that may
    not use them (`core.scheduling.reservation`); returns the undo."""
    per_node: dict[int, dict[str, int]] = {}
    total: dict[str, int] = {}
    for node in nodes:
        on_node = per_node[node] = {}
        for resource, column in state.free.items():
            if column[node]:
                on_node[resource] = -column[node]
                total[resource] = total.get(resource, 0) - column[node]
    return _given_back(state, per_node, total)


def _given_back(
    state: ClusterRoom, per_node: dict[int, dict[str, int]], total: dict[str, int]
) -> Callable[[], None]:
    """Add `per_node` and `total` to `state` (negative amounts take room); returns the undo."""
    state.give_back(per_node, total)

    def undo() -> None:
        state.give_back(
            {node: {r: -v for r, v in amounts.items()} for node, amounts in per_node.items()},
            {r: -v for r, v in total.items()},
        )

    return undo
