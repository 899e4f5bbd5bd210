"""Nodes ranked by their free room for pods of some size, kept sorted as room moves. Pure.

`ClusterRoom` places a pod on the node with the least room that holds it (best fit): a
`NodeOrder` per (resources asked, node constraint) keeps the nodes that may take such pods
ascending by room, so that a placement walks them from the first that can hold one pod
instead of scanning every node.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Mapping

from dispatcher.core.model import PODS

__all__ = ["NodeOrder", "Requests", "ranked"]

Requests = tuple[tuple[str, int], ...]  # (resource, milli-units), positive amounts only


class NodeOrder:
    """The nodes that may take pods asking for some resources, ascending by room, then index.

    Room is kept exact as an integer: sum of free * (product of the other resources'
    capacities), which orders nodes as the sum of free / capacity does.
    """

    def __init__(
        self,
        capacity: Mapping[str, int],
        resources: tuple[str, ...],
        columns: list[list[int]],
        nodes: list[int],
    ) -> None:
        capacities = [capacity.get(r, 0) or 1 for r in resources]
        self.resources = resources
        self.multipliers = [
            math.prod(c for j, c in enumerate(capacities) if j != i) for i in range(len(resources))
        ]
        self.nodes = nodes  # never changed: shared by copies
        self._bind(columns)
        self.keys = {n: (self.room(n), n) for n in nodes}
        self.sorted = sorted(self.keys.values())

    def _bind(self, columns: list[list[int]]) -> None:
        self.columns = columns
        self._terms = list(zip(columns, self.multipliers, strict=True))

    def copy(self, columns: list[list[int]]) -> NodeOrder:
        """The same order over `columns` (a copy of the free room this one reads)."""
        new = object.__new__(NodeOrder)
        new.resources, new.multipliers, new.nodes = self.resources, self.multipliers, self.nodes
        new._bind(columns)
        new.keys = dict(self.keys)
        new.sorted = list(self.sorted)
        return new

    def room(self, node: int) -> int:
        total = 0
        for column, multiplier in self._terms:
            total += column[node] * multiplier
        return total

    def moved(self, node: int) -> None:
        """Re-sort `node` after its free room changed."""
        old = self.keys.get(node)
        if old is None:
            return
        new = (self.room(node), node)
        if new != old:
            del self.sorted[bisect_left(self.sorted, old)]
            insort(self.sorted, new)
            self.keys[node] = new


def ranked(asked: Requests) -> Requests:
    """The requests that rank nodes by room (best fit) and pod sets by size: all but
    `pods`, unless a pod asks for nothing else. Every pod asks for one `pods`, and counting
    it would reorder nodes the other resources tie on."""
    ranked = tuple(item for item in asked if item[0] != PODS)
    return ranked or asked
