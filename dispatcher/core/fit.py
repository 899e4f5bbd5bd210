"""The fit check (rules 1 and 2): aggregate first, then every pod on some node. Pure, no I/O.

A `ClusterState` is a mutable, per-cycle simulation of one member cluster, built from a
frozen `ClusterSnapshot`. Only schedulable nodes (Ready and not cordoned) take part:

- per node, free = allocatable - requested (the node's bound, non-terminal pods);
- the aggregate free is the sum of those, minus every reservation (pods of dispatched
  AppWrappers that are not bound yet).

Reservations are applied first, oldest dispatch first: each reserved pod goes on a node the
same way `try_place` would put it. A reserved pod that fits on no node is still charged
against the aggregate (never per node). We prefer that to dropping it: the aggregate then
stays an upper bound on what can really be admitted, so pods that the real scheduler may
still place (after others finish, or where our greedy packing differs from its choice) are
never double-booked, at the price of sometimes being a little pessimistic.

`try_place` places a gang: all pods or none. It checks the aggregate first (a few dict
lookups), and only when that fits places pods one pod set at a time, larger pods first,
each pod on the node with the least room left after it that still holds it (best fit;
room = sum over the pod's resources of leftover / cluster capacity). On success the
placement stays applied and the result carries an `undo` that restores the state exactly,
so a caller can try, compare and roll back (as Kueue does with its snapshot). On failure
nothing changes and `reason` says why, with numbers, in one line.

Speed (one cycle tries thousands of gangs against clusters of a thousand nodes): free
room is kept as plain `dict[str, int]` of milli-units; a gang whose totals exceed the
aggregate costs a few dict lookups; per-node placement scans only nodes that still have
room of the pod's requested resources, and sorts only as many as it may use; and answers
that cannot change until room comes back (a gang shape's aggregate shortfall at the current
state, a shape that found no room per node) are remembered and replayed for the next
workload of the same shape.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dispatcher.api.quantity import format_milli
from dispatcher.api.resources import Resources
from dispatcher.core.model import ClusterSnapshot, NodeState, PodSet, Toleration

__all__ = ["ClusterState", "Demand", "NodeAssignment", "PlaceResult", "fits_ever"]

_Free = dict[str, int]
_Shape = tuple[tuple[tuple[str, str], ...], tuple[Toleration, ...]]
# Stands for the failing pod's name in cached reasons, so a workload of the same shape gets
# a reason naming its own pod.
_POD = "\x00pod\x00"
# (resource name, milli-units per pod, weight = 1 / cluster capacity) for one pod shape.
_Request = list[tuple[str, int, float]]
_NONE: frozenset[int] = frozenset()


def _noop() -> None:
    return None


@dataclass(frozen=True, slots=True)
class NodeAssignment:
    """`count` pods of `pod_sets[pod_set]` (as passed to `try_place`) go on node `node`."""

    pod_set: int
    node: str
    count: int


@dataclass(frozen=True, slots=True)
class PlaceResult:
    """The outcome of `ClusterState.try_place`.

    `ok`: every pod was placed; the placement stays applied until `undo()` is called (once).
    Otherwise `reason` is one line for people ("needs nvidia.com/gpu 4, free 2 of 8").
    """

    ok: bool
    reason: str = ""
    assignments: tuple[NodeAssignment, ...] = ()
    undo: Callable[[], None] = _noop


class Demand:
    """What a gang asks for, worked out once and then tried against any number of clusters.

    `try_place` accepts the pod sets themselves too; a caller that tries the same gang in
    several clusters (the scheduling cycle) saves the repeated sums by passing a `Demand`.
    """

    __slots__ = ("pod_sets", "shape", "totals")

    def __init__(self, pod_sets: Sequence[PodSet]) -> None:
        self.pod_sets: tuple[PodSet, ...] = tuple(pod_sets)
        self.totals: dict[str, int] = _totals(self.pod_sets)
        # What the fit depends on (counts, requests, constraints; not names).
        self.shape: tuple[object, ...] = tuple(
            (p.count, p.requests, p.node_selector, p.tolerations) for p in self.pod_sets
        )


def _fmt(resource: str, milli: int) -> str:
    return f"{resource} {format_milli(max(milli, 0), resource)}"


def _pod_name(pod_set: PodSet, index: int) -> str:
    return pod_set.name or f"pod set {index}"


class ClusterState:
    """A mutable simulation of one cluster's free capacity for one scheduling cycle."""

    __slots__ = (
        "_admitting",
        "_capacity",
        "_empty",
        "_failures",
        "_free",
        "_free_total",
        "_names",
        "_nodes",
        "_overflow",
        "_positive",
        "_seq",
        "_short",
        "_version",
        "name",
        "snapshot",
        "unschedulable_nodes",
    )

    def __init__(self, snapshot: ClusterSnapshot, *, empty: bool = False) -> None:
        """Build from `snapshot`; with `empty`, as if no pod ran and nothing was reserved."""
        self.name = snapshot.name
        self.snapshot = snapshot
        self._empty = empty
        nodes = [n for n in snapshot.nodes if n.schedulable]
        self.unschedulable_nodes = len(snapshot.nodes) - len(nodes)
        self._nodes: list[NodeState] = nodes
        self._names: list[str] = [n.name for n in nodes]
        self._free: list[_Free] = []
        self._capacity: _Free = {}
        self._free_total: _Free = {}
        for node in nodes:
            free = dict(node.allocatable.items())
            for resource, value in free.items():
                self._capacity[resource] = self._capacity.get(resource, 0) + value
            if not empty:
                for resource, value in node.requested.items():
                    free[resource] = free.get(resource, 0) - value
            for resource, value in free.items():
                self._free_total[resource] = self._free_total.get(resource, 0) + value
            self._free.append(free)
        # Nodes with some room left of each resource: a pod asking for a resource need
        # only look at those, and in a busy cluster they are few.
        self._positive: dict[str, set[int]] = {}
        for index, free in enumerate(self._free):
            for resource, value in free.items():
                if value > 0:
                    self._positive.setdefault(resource, set()).add(index)
        self._admitting: dict[_Shape, tuple[list[int], frozenset[int]]] = {}
        # Gang shapes that found no room per node -> (reason with _POD for the pod's name,
        # index of the pod set that failed, placement seq when it failed). Placements only
        # take room away, so the answer stands until a placement made before it is undone.
        self._failures: dict[tuple[object, ...], tuple[str, int, int]] = {}
        self._seq = 0
        # Aggregate shortfall reasons by gang shape, valid while `_version` (bumped on every
        # change of the aggregate) is unchanged: a full cluster answers thousands of
        # workloads of a few shapes without formatting the same numbers again.
        self._short: dict[tuple[object, ...], tuple[int, str]] = {}
        self._version = 0
        self._overflow: _Free = {}
        if not empty:
            for reservation in sorted(
                snapshot.reservations, key=lambda r: (r.dispatched_at, r.key)
            ):
                self._reserve(reservation.pod_sets)

    # -- read-only views ---------------------------------------------------------------

    @property
    def capacity(self) -> Resources:
        """Allocatable summed over schedulable nodes."""
        return Resources(self._capacity)

    @property
    def free(self) -> Resources:
        """Aggregate free (may be negative where the cluster is overcommitted)."""
        return Resources(self._free_total)

    @property
    def overflow(self) -> Resources:
        """Reserved pods that fit on no node, charged against the aggregate only."""
        return Resources(self._overflow)

    def capacity_of(self, resource: str) -> int:
        return self._capacity.get(resource, 0)

    def free_of(self, resource: str) -> int:
        return self._free_total.get(resource, 0)

    def node_free(self, node: str) -> Resources:
        """Free room on a schedulable node (KeyError for other nodes)."""
        return Resources(self._free[self._names.index(node)])

    def node_names(self) -> tuple[str, ...]:
        """The schedulable nodes, in snapshot order."""
        return tuple(self._names)

    # -- placement ---------------------------------------------------------------------

    def fits(self, pod_sets: Sequence[PodSet] | Demand) -> str | None:
        """None when the gang fits now (nothing stays applied), else the reason."""
        result = self.try_place(pod_sets)
        if result.ok:
            result.undo()
            return None
        return result.reason

    def try_place(self, pod_sets: Sequence[PodSet] | Demand) -> PlaceResult:
        """Place all pods of all pod sets (a gang) or none; see the module docstring."""
        demand = pod_sets if isinstance(pod_sets, Demand) else Demand(pod_sets)
        pod_sets = demand.pod_sets
        totals = demand.totals
        free_total = self._free_total
        for resource, value in totals.items():
            if value > free_total.get(resource, 0):
                known = self._short.get(demand.shape)
                if known is None or known[0] != self._version:
                    known = self._short[demand.shape] = (
                        self._version,
                        self._aggregate_shortfall(totals),
                    )
                return PlaceResult(ok=False, reason=known[1])
        if not self._names and totals:
            return PlaceResult(ok=False, reason=self._no_nodes_reason())
        key = demand.shape
        cached = self._failures.get(key)
        if cached is not None:
            template, failed, _ = cached
            return PlaceResult(ok=False, reason=_name_pod(template, pod_sets, failed))
        applied: list[tuple[int, _Request, int, int]] = []  # (node, request, count, pod set)
        for index in self._largest_first(pod_sets):
            pod_set = pod_sets[index]
            if pod_set.count <= 0:
                continue
            request = self._request(pod_set.requests)
            nodes = self._admitting_nodes(pod_set)
            if nodes[0]:
                remaining = self._fill(request, nodes, pod_set.count, applied, index)
                if not remaining:
                    continue
                placed = sum(count for _, _, count, _ in applied)
                template = self._per_node_reason(pod_set, request, nodes[0], placed, pod_sets)
                self._unapply(applied)
                # When the nodes these pods may use (selector, taints) lack the room in total,
                # that is the clearer answer: the aggregate counted nodes they cannot go to.
                template = self._usable_shortfall(pod_set, nodes[0], pod_sets) or template
            else:
                self._unapply(applied)
                template = self._no_match_reason()
            self._failures[key] = (template, index, self._seq)
            return PlaceResult(ok=False, reason=_name_pod(template, pod_sets, index))
        for resource, value in totals.items():
            self._free_total[resource] = self._free_total.get(resource, 0) - value
        self._seq += 1
        self._version += 1
        return PlaceResult(
            ok=True,
            assignments=tuple(
                NodeAssignment(pod_set=ps, node=self._names[node], count=count)
                for node, _, count, ps in applied
            ),
            undo=self._undo_for(applied, totals, self._seq),
        )

    def _undo_for(
        self, applied: list[tuple[int, _Request, int, int]], totals: Mapping[str, int], seq: int
    ) -> Callable[[], None]:
        done = False

        def undo() -> None:
            nonlocal done
            if done:
                raise RuntimeError("this placement was already undone")
            done = True
            self._unapply(applied)
            for resource, value in totals.items():
                self._free_total[resource] += value
            self._version += 1
            # Room came back: failures recorded while this placement was applied may fit now.
            self._failures = {k: v for k, v in self._failures.items() if v[2] < seq}

        return undo

    def _unapply(self, applied: list[tuple[int, _Request, int, int]]) -> None:
        positive = self._positive
        for node, request, count, _ in applied:
            free = self._free[node]
            for resource, value, _weight in request:
                free[resource] += value * count
                if free[resource] > 0:
                    positive.setdefault(resource, set()).add(node)
        applied.clear()

    def _reserve(self, pod_sets: Sequence[PodSet]) -> None:
        """Charge a reservation: per node where its pods fit, aggregate always."""
        applied: list[tuple[int, _Request, int, int]] = []
        for index in self._largest_first(pod_sets):
            pod_set = pod_sets[index]
            if pod_set.count <= 0:
                continue
            request = self._request(pod_set.requests)
            remaining = self._fill(
                request, self._admitting_nodes(pod_set), pod_set.count, applied, index
            )
            for resource, value in pod_set.requests.items():
                self._free_total[resource] = self._free_total.get(resource, 0) - value * (
                    pod_set.count
                )
                if remaining:
                    self._overflow[resource] = self._overflow.get(resource, 0) + value * remaining

    def _fill(
        self,
        request: _Request,
        nodes: tuple[list[int], frozenset[int]],
        count: int,
        applied: list[tuple[int, _Request, int, int]],
        pod_set: int,
    ) -> int:
        """Best-fit `count` identical pods onto `nodes`; returns how many found no room.

        Putting one pod on the best node lowers only that node's score, so it stays the best
        while it still holds a pod: fill it, then go to the next best. One sort per pod set.
        """
        candidates: list[tuple[float, int]] = []
        free_list = self._free
        admitting, admitting_set = nodes
        scan: Iterable[int] = admitting
        if request:
            with_room = [self._positive.get(resource, _NONE) for resource, _, _ in request]
            fewest = min(with_room, key=len)
            if len(fewest) < len(admitting):
                scan = [n for n in fewest if n in admitting_set]
        for node in scan:
            free = free_list[node]
            score = 0.0
            for resource, value, weight in request:
                left = free.get(resource, 0) - value
                if left < 0:
                    break
                score += left * weight
            else:
                candidates.append((score, node))
        # At most `count` nodes get pods: no need to sort them all.
        ordered = (
            sorted(candidates) if count >= len(candidates) else heapq.nsmallest(count, candidates)
        )
        remaining = count
        for _, node in ordered:
            if not remaining:
                break
            free = free_list[node]
            room = remaining
            for resource, value, _weight in request:
                room = min(room, free.get(resource, 0) // value)
            for resource, value, _weight in request:
                free[resource] = left = free.get(resource, 0) - value * room
                if left <= 0:
                    self._positive[resource].discard(node)
            applied.append((node, request, room, pod_set))
            remaining -= room
        return remaining

    # -- helpers -----------------------------------------------------------------------

    def _request(self, requests: Resources) -> _Request:
        capacity = self._capacity
        return [
            (resource, value, 1.0 / capacity[resource] if capacity.get(resource) else 1.0)
            for resource, value in requests.items()
            if value > 0
        ]

    def _largest_first(self, pod_sets: Sequence[PodSet]) -> list[int]:
        """Pod set indices, the pods with the largest dominant share of the cluster first."""
        capacity = self._capacity

        def share(index: int) -> float:
            largest = 0.0
            for resource, value in pod_sets[index].requests.items():
                cap = capacity.get(resource, 0)
                largest = max(largest, value / cap if cap > 0 else math.inf)
            return largest

        return sorted(range(len(pod_sets)), key=lambda i: (-share(i), i))

    def _admitting_nodes(self, pod_set: PodSet) -> tuple[list[int], frozenset[int]]:
        """The nodes whose labels and taints let these pods on, as a list and as a set."""
        shape = (pod_set.node_selector, pod_set.tolerations)
        nodes = self._admitting.get(shape)
        if nodes is None:
            listed = [i for i, node in enumerate(self._nodes) if node.admits(pod_set)]
            nodes = self._admitting[shape] = (listed, frozenset(listed))
        return nodes

    def _aggregate_shortfall(self, totals: Mapping[str, int]) -> str:
        free_total = self._free_total
        short = [r for r, v in totals.items() if v > free_total.get(r, 0)]
        clauses = []
        for resource in sorted(short):
            capacity = format_milli(self._capacity.get(resource, 0), resource)
            if self._empty:
                room = f"the cluster has {capacity}"
            else:
                room = f"free {format_milli(max(free_total.get(resource, 0), 0), resource)}"
                room += f" of {capacity}"
            clauses.append(f"needs {_fmt(resource, totals[resource])}, {room}")
        return "; ".join(clauses)

    def _no_nodes_reason(self) -> str:
        if self.unschedulable_nodes:
            return (
                f"no schedulable node ({self.unschedulable_nodes} nodes, all NotReady or cordoned)"
            )
        return "no schedulable node (the cluster has no nodes)"

    def _no_match_reason(self) -> str:
        if not self._names:
            return self._no_nodes_reason()
        return f"no schedulable node matches pod {_POD} (nodeSelector/taints)"

    def _per_node_reason(
        self,
        pod_set: PodSet,
        request: _Request,
        nodes: list[int],
        placed: int,
        pod_sets: Sequence[PodSet],
    ) -> str:
        """Why the gang found no room, naming the pod and the roomiest node it could use."""
        best_node = nodes[0]
        best_ratio = -math.inf
        for node in nodes:
            free = self._free[node]
            ratio = min(free.get(r, 0) / v for r, v, _ in request)
            if ratio > best_ratio:
                best_node, best_ratio = node, ratio
        free = self._free[best_node]
        room = ", ".join(_fmt(r, free.get(r, 0)) for r, _, _ in sorted(request))
        pod = f"pod {_POD} ({pod_set.requests.describe()})"
        total = sum(max(p.count, 0) for p in pod_sets)
        after = f" after placing {placed} of {total} pods" if placed else ""
        where = f"{room} ({self._names[best_node]})"
        if self._empty:
            return f"no node can ever hold {pod}{after}: the largest node has {where}"
        return (
            f"resources free in total but no node can hold {pod}{after}: "
            f"largest free on a node is {where}"
        )

    def _usable_shortfall(
        self, pod_set: PodSet, nodes: list[int], pod_sets: Sequence[PodSet]
    ) -> str | None:
        if len(nodes) == len(self._nodes):
            return None  # the cluster-wide aggregate already covered these nodes
        shape = (pod_set.node_selector, pod_set.tolerations)
        needed: _Free = {}
        for other in pod_sets:
            if (other.node_selector, other.tolerations) == shape:
                for resource, value in other.requests.items():
                    needed[resource] = needed.get(resource, 0) + value * max(other.count, 0)
        clauses = []
        for resource in sorted(needed):
            capacity = sum(self._nodes[n].allocatable.get(resource, 0) for n in nodes)
            free = sum(self._free[n].get(resource, 0) for n in nodes)
            if needed[resource] <= (capacity if self._empty else free):
                continue
            if self._empty:
                room = f"its {len(nodes)} usable nodes have {format_milli(capacity, resource)}"
            else:
                room = (
                    f"free {format_milli(max(free, 0), resource)} of "
                    f"{format_milli(capacity, resource)}"
                )
            clauses.append(f"needs {_fmt(resource, needed[resource])}, {room}")
        if not clauses:
            return None
        return "; ".join(clauses) + f" on the {len(nodes)} nodes its pods may use"


def _name_pod(template: str, pod_sets: Sequence[PodSet], index: int) -> str:
    return template.replace(_POD, _pod_name(pod_sets[index], index))


def _totals(pod_sets: Iterable[PodSet]) -> _Free:
    totals: _Free = {}
    for pod_set in pod_sets:
        if pod_set.count <= 0:
            continue
        for resource, value in pod_set.requests.items():
            totals[resource] = totals.get(resource, 0) + value * pod_set.count
    return {r: v for r, v in totals.items() if v > 0}


def fits_ever(pod_sets: Sequence[PodSet] | Demand, snapshot: ClusterSnapshot) -> str | None:
    """Why the gang could not fit this cluster even with every schedulable node empty.

    None when it could. Only nodes that are schedulable now count, so a cluster whose nodes
    are all NotReady for a moment also answers with a reason: callers should treat the
    answer as "not now, and not by waiting for others to finish".
    """
    return ClusterState(snapshot, empty=True).fits(pod_sets)
