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
each pod on the node with the least room left (best fit; room = sum over the pod's
resources of free / cluster capacity), filling that node before going to the next. On
success the placement stays applied and the result carries an `undo` that restores the
state exactly, so a caller can try, compare and roll back (as Kueue does with its
snapshot). On failure nothing changes and `reason` says why, with numbers, in one line.

Speed (one cycle tries thousands of gangs against clusters of thousands of nodes):

- free room is kept per resource as a list of integer milli-units indexed by node;
- for each set of requested resources (and each set of nodes that pods' selector and
  tolerations allow), the nodes are kept sorted by room. A pod can only fit a node whose
  room is at least its own request's, so placement starts there and walks up, stopping as
  soon as every pod has a node. The order is kept up to date lazily: every change of a
  node's room is logged, and an order catches up with the log when next used;
- answers that cannot change until room comes back are remembered by gang shape (counts,
  requests, constraints; not names): an aggregate shortfall while the aggregate is
  unchanged, a per-node failure until a placement made before it is undone (placements
  only take room away). Reasons are kept with a token standing for the failing pod's name,
  so every workload of the shape gets a reason naming its own pod.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dispatcher.api.quantity import format_milli
from dispatcher.api.resources import Resources
from dispatcher.core.model import ClusterSnapshot, NodeState, PodSet

__all__ = ["ClusterState", "Demand", "NodeAssignment", "PlaceResult", "fits_ever", "shape_of"]

_Free = dict[str, int]
# (node, pod set index, pairs of (free column, milli-units per pod), pods) for one node.
_Applied = list[tuple[int, list[tuple[list[int], int]], int, int]]
# An order of nodes by room must catch up with more logged changes than this share of its
# nodes: rebuilding it is then cheaper.
_REBUILD_SHARE = 4


def _token(index: int) -> str:
    """Stands for the name of pod set `index` in remembered reasons."""
    return f"\x00pod{index}\x00"


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


def shape_of(pod_sets: Sequence[PodSet]) -> tuple[object, ...]:
    """What the fit of these pod sets depends on: counts, requests, constraints; not names.

    Two gangs of equal shape fit the same clusters the same way.
    """
    if len(pod_sets) == 1:
        p = pod_sets[0]
        return (p.count, p.requests, p.node_selector, p.tolerations)
    return tuple([(p.count, p.requests, p.node_selector, p.tolerations) for p in pod_sets])


class _Key:
    """A gang shape as a dict key whose hash is computed once."""

    __slots__ = ("hash", "value")

    def __init__(self, value: tuple[object, ...]) -> None:
        self.value = value
        self.hash = hash(value)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, _Key):
            return NotImplemented
        return self.hash == other.hash and self.value == other.value


class Demand:
    """What a gang asks for, worked out once and then tried against any number of clusters.

    `try_place` accepts the pod sets themselves too; a caller that tries the same gang in
    several clusters (the scheduling cycle) saves the repeated work by passing a `Demand`.
    The pod sets' names are only read for messages; a `Demand` may stand for every gang of
    its shape (see `reason_for`).
    """

    __slots__ = ("key", "pod_sets", "requests", "shape", "totals")

    def __init__(self, pod_sets: Sequence[PodSet], shape: tuple[object, ...] | None = None) -> None:
        self.pod_sets: tuple[PodSet, ...] = tuple(pod_sets)
        self.shape: tuple[object, ...] = shape_of(self.pod_sets) if shape is None else shape
        self.key = _Key(self.shape)
        # Per pod set, the requested resources with a positive amount, by name.
        self.requests: tuple[tuple[tuple[str, int], ...], ...] = tuple(
            tuple(sorted((r, v) for r, v in p.requests.items() if v > 0)) for p in self.pod_sets
        )
        totals: _Free = {}
        for pod_set, requests in zip(self.pod_sets, self.requests, strict=True):
            if pod_set.count > 0:
                for resource, value in requests:
                    totals[resource] = totals.get(resource, 0) + value * pod_set.count
        self.totals: _Free = totals


def reason_for(template: str, pod_sets: Sequence[PodSet]) -> str:
    """A remembered reason with the tokens replaced by these pod sets' names."""
    if "\x00" not in template:
        return template
    for index, pod_set in enumerate(pod_sets):
        template = template.replace(_token(index), _pod_name(pod_set, index))
    return template


def _fmt(resource: str, milli: int) -> str:
    return f"{resource} {format_milli(max(milli, 0), resource)}"


def _pod_name(pod_set: PodSet, index: int) -> str:
    return pod_set.name or f"pod set {index}"


class _Order:
    """Nodes that may take pods asking for `resources`, sorted by their room for them.

    `items` holds (room, node) ascending, room = sum over `resources` of free * weight;
    `rooms` the same by node. Up to date with the state's change log up to `seen`.
    """

    __slots__ = ("columns", "items", "nodes", "rooms", "seen", "weights")

    def __init__(
        self, nodes: frozenset[int], columns: list[list[int]], weights: list[float]
    ) -> None:
        self.nodes = nodes
        self.columns = columns
        self.weights = weights
        self.items: list[tuple[float, int]] = []
        self.rooms: dict[int, float] = {}
        self.seen = -1  # never built

    def room(self, node: int) -> float:
        total = 0.0
        for column, weight in zip(self.columns, self.weights, strict=True):
            total += column[node] * weight
        return total

    def rebuild(self, seen: int) -> None:
        pairs = list(zip(self.columns, self.weights, strict=True))
        items = []
        for node in self.nodes:
            total = 0.0
            for column, weight in pairs:
                total += column[node] * weight
            items.append((total, node))
        items.sort()
        self.items = items
        self.rooms = {node: total for total, node in items}
        self.seen = seen

    def catch_up(self, log: list[int]) -> None:
        seen = self.seen
        end = len(log)
        if seen == end:
            return
        if seen < 0 or (end - seen) * _REBUILD_SHARE > len(self.nodes):
            self.rebuild(end)
            return
        nodes = self.nodes
        items = self.items
        rooms = self.rooms
        for node in set(log[seen:end]):
            if node not in nodes:
                continue
            old = rooms[node]
            new = self.room(node)
            if new != old:
                del items[bisect_left(items, (old, node))]
                insort(items, (new, node))
                rooms[node] = new
        self.seen = end


class _Request:
    """Pods of one size and constraints in one cluster: where to look for room for them.

    Nodes of `order` from `floor` (the least room a node that holds one such pod can have)
    up to `start` held none of these pods when last looked at (`seen`, a position in the
    state's change log). Room only shrinks as pods are placed, so they still hold none
    unless their room changed since: a walk for these pods begins at `start` once the
    changes since `seen` are checked, instead of stepping over the same full nodes again.
    """

    __slots__ = ("floor", "order", "pairs", "seen", "start")

    def __init__(self, order: _Order, pairs: list[tuple[list[int], int]], floor: float) -> None:
        self.order = order
        self.pairs = pairs  # (free column, milli-units per pod) for each requested resource
        self.floor = floor
        self.start: tuple[float, int] = (floor, -1)
        self.seen = 0

    def holds_one(self, node: int) -> bool:
        return all(column[node] >= value for column, value in self.pairs)

    def catch_up(self, log: list[int]) -> None:
        """Move `start` back to any node whose room changed and now holds one pod."""
        seen = self.seen
        end = len(log)
        if seen == end:
            return
        self.seen = end
        if (end - seen) * _REBUILD_SHARE > len(self.order.nodes):
            self.start = (self.floor, -1)
            return
        rooms = self.order.rooms
        start = self.start
        floor = self.floor
        for node in log[seen:end]:
            room = rooms.get(node)
            if room is not None and floor <= room and (room, node) < start and self.holds_one(node):
                start = (room, node)
        self.start = start


class _Step:
    """How one pod set of a gang is placed in one cluster (precomputed per gang shape)."""

    __slots__ = ("admitting", "count", "index", "request")

    def __init__(
        self, index: int, count: int, request: _Request, admitting: frozenset[int]
    ) -> None:
        self.index = index
        self.count = count
        self.request = request
        self.admitting = admitting  # the nodes the pods' selector and tolerations allow


class ClusterState:
    """A mutable simulation of one cluster's free capacity for one scheduling cycle."""

    __slots__ = (
        "_admitting",
        "_allocatable",
        "_capacity",
        "_columns",
        "_empty",
        "_failures",
        "_free_total",
        "_log",
        "_names",
        "_nodes",
        "_orders",
        "_overflow",
        "_plans",
        "_requests",
        "_seq",
        "_short",
        "_version",
        "_weights",
        "_zeros",
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
        count = len(nodes)
        allocatable: dict[str, list[int]] = {}
        for index, node in enumerate(nodes):
            for resource, value in node.allocatable.items():
                column = allocatable.get(resource)
                if column is None:
                    column = allocatable[resource] = [0] * count
                column[index] = value
        self._allocatable = allocatable
        self._capacity: _Free = {r: sum(column) for r, column in allocatable.items()}
        self._weights: dict[str, float] = {
            r: 1.0 / value if value else 1.0 for r, value in self._capacity.items()
        }
        columns = {r: list(column) for r, column in allocatable.items()}
        if not empty:
            for index, node in enumerate(nodes):
                for resource, value in node.requested.items():
                    column = columns.get(resource)
                    if column is None:
                        column = columns[resource] = [0] * count
                    column[index] -= value
        self._columns = columns
        self._zeros = [0] * count
        self._free_total: _Free = {r: sum(column) for r, column in columns.items()}
        self._overflow: _Free = {}
        self._log: list[int] = []  # nodes whose free room changed, in order
        self._orders: dict[tuple[tuple[str, ...], object], _Order] = {}
        self._admitting: dict[object, frozenset[int]] = {}
        self._requests: dict[tuple[object, ...], _Request] = {}
        self._plans: dict[_Key, list[_Step]] = {}
        # Gang shapes that found no room per node -> (reason with tokens for pod names,
        # placement seq when it failed). Placements only take room away, so the answer
        # stands until a placement made before it is undone.
        self._failures: dict[_Key, tuple[str, int]] = {}
        self._seq = 0
        # Aggregate shortfall reasons by gang shape, valid while `_version` (bumped on every
        # change of the aggregate) is unchanged: a full cluster answers thousands of
        # workloads of a few shapes without formatting the same numbers again.
        self._short: dict[_Key, tuple[int, str]] = {}
        self._version = 0
        if not empty:
            demands: dict[tuple[object, ...], Demand] = {}
            for reservation in sorted(
                snapshot.reservations, key=lambda r: (r.dispatched_at, r.key)
            ):
                shape = shape_of(reservation.pod_sets)
                demand = demands.get(shape)
                if demand is None:
                    demand = demands[shape] = Demand(reservation.pod_sets, shape)
                self._reserve(demand)

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

    @property
    def version(self) -> int:
        """Changes whenever the aggregate free changes."""
        return self._version

    def capacity_of(self, resource: str) -> int:
        return self._capacity.get(resource, 0)

    def free_of(self, resource: str) -> int:
        return self._free_total.get(resource, 0)

    def node_free(self, node: str) -> Resources:
        """Free room on a schedulable node (KeyError for other nodes)."""
        try:
            index = self._names.index(node)
        except ValueError:
            raise KeyError(node) from None
        return Resources({r: column[index] for r, column in self._columns.items()})

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
        outcome = self.place(demand)
        if isinstance(outcome, str):
            return PlaceResult(ok=False, reason=reason_for(outcome, demand.pod_sets))
        return outcome

    def refusal(self, demand: Demand) -> str | None:
        """A reason known without placing pods (aggregate short, or a remembered per-node
        failure), with tokens for pod names (see `reason_for`); None when it may fit."""
        free_total = self._free_total
        for resource, value in demand.totals.items():
            if value > free_total.get(resource, 0):
                known = self._short.get(demand.key)
                if known is None or known[0] != self._version:
                    known = self._short[demand.key] = (
                        self._version,
                        self._aggregate_shortfall(demand.totals),
                    )
                return known[1]
        if not self._names and demand.totals:
            return self._no_nodes_reason()
        failed = self._failures.get(demand.key)
        if failed is not None:
            return failed[0]
        return None

    def place(self, demand: Demand) -> PlaceResult | str:
        """`try_place` for callers that name pods themselves: on failure, the reason with
        tokens for pod names (see `reason_for`)."""
        refused = self.refusal(demand)
        if refused is not None:
            return refused
        applied: _Applied = []
        for step in self._plan(demand):
            if not step.admitting:
                self._unapply(applied)
                template = self._no_match_reason(step.index)
                self._failures[demand.key] = (template, self._seq)
                return template
            remaining = self._fill(step, applied)
            if remaining:
                placed = sum(count for _, _, count, _ in applied)
                template = self._per_node_reason(demand, step, placed)
                self._unapply(applied)
                # When the nodes these pods may use (selector, taints) lack the room in total,
                # that is the clearer answer: the aggregate counted nodes they cannot go to.
                template = self._usable_shortfall(demand, step) or template
                self._failures[demand.key] = (template, self._seq)
                return template
        totals = demand.totals
        free_total = self._free_total
        for resource, value in totals.items():
            free_total[resource] = free_total.get(resource, 0) - value
        self._seq += 1
        self._version += 1
        names = self._names
        return PlaceResult(
            ok=True,
            assignments=tuple(
                [
                    NodeAssignment(pod_set=pod_set, node=names[node], count=count)
                    for node, _, count, pod_set in applied
                ]
            ),
            undo=self._undo_for(applied, totals, self._seq),
        )

    def _undo_for(
        self, applied: _Applied, totals: Mapping[str, int], seq: int
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
            self._failures = {k: v for k, v in self._failures.items() if v[1] < seq}

        return undo

    def _unapply(self, applied: _Applied) -> None:
        log = self._log
        for node, pairs, count, _ in applied:
            for column, value in pairs:
                column[node] += value * count
            log.append(node)
        applied.clear()

    def _reserve(self, demand: Demand) -> None:
        """Charge a reservation: per node where its pods fit, aggregate always."""
        applied: _Applied = []
        overflow = self._overflow
        for step in self._plan(demand):
            remaining = self._fill(step, applied)
            if remaining:
                for resource, value in demand.requests[step.index]:
                    overflow[resource] = overflow.get(resource, 0) + value * remaining
        free_total = self._free_total
        for resource, value in demand.totals.items():
            free_total[resource] = free_total.get(resource, 0) - value

    def _fill(self, step: _Step, applied: _Applied) -> int:
        """Best-fit the step's pods; returns how many found no room.

        Putting pods on a node lowers only that node's room, so the next best node is the
        next one in the order: one walk per pod set, from the first node that may hold one.
        """
        request = step.request
        log = self._log
        order = request.order
        order.catch_up(log)
        request.catch_up(log)
        items = order.items
        pairs = request.pairs
        remaining = step.count
        position = bisect_left(items, request.start)
        end = len(items)
        first: tuple[float, int] | None = None
        while position < end:
            item = items[position]
            position += 1
            node = item[1]
            room = remaining
            for column, value in pairs:
                fit = column[node] // value
                if fit < room:
                    room = fit
                    if fit <= 0:
                        break
            if room <= 0:
                continue
            if first is None:
                first = item
            for column, value in pairs:
                column[node] -= value * room
            log.append(node)
            applied.append((node, pairs, room, step.index))
            remaining -= room
            if not remaining:
                break
        request.start = (math.inf, -1) if first is None else first
        return remaining

    # -- helpers -----------------------------------------------------------------------

    def _plan(self, demand: Demand) -> list[_Step]:
        plan = self._plans.get(demand.key)
        if plan is None:
            plan = self._plans[demand.key] = [
                self._step(demand, index) for index in self._largest_first(demand)
            ]
        return plan

    def _step(self, demand: Demand, index: int) -> _Step:
        pod_set = demand.pod_sets[index]
        requests = demand.requests[index]
        constraint = (pod_set.node_selector, pod_set.tolerations)
        admitting = self._admitting_nodes(pod_set)
        request = self._requests.get((requests, constraint))
        if request is None:
            resources = tuple(r for r, _ in requests)
            order = self._orders.get((resources, constraint))
            if order is None:
                # Nodes without any of a requested resource can never hold these pods.
                usable = admitting
                for resource in resources:
                    column = self._allocatable.get(resource, self._zeros)
                    usable = frozenset(n for n in usable if column[n] > 0)
                order = self._orders[(resources, constraint)] = _Order(
                    usable,
                    [self._columns.get(r, self._zeros) for r in resources],
                    [self._weights.get(r, 1.0) for r in resources],
                )
            floor = 0.0
            for (_, value), weight in zip(requests, order.weights, strict=True):
                floor += value * weight
            request = self._requests[(requests, constraint)] = _Request(
                order, [(self._columns.get(r, self._zeros), v) for r, v in requests], floor
            )
            request.seen = len(self._log)
        return _Step(index, max(pod_set.count, 0), request, admitting)

    def _largest_first(self, demand: Demand) -> list[int]:
        """Pod set indices, the pods with the largest dominant share of the cluster first."""
        capacity = self._capacity

        def share(index: int) -> float:
            largest = 0.0
            for resource, value in demand.requests[index]:
                cap = capacity.get(resource, 0)
                largest = max(largest, value / cap if cap > 0 else math.inf)
            return largest

        return sorted(
            (i for i, p in enumerate(demand.pod_sets) if p.count > 0),
            key=lambda i: (-share(i), i),
        )

    def _admitting_nodes(self, pod_set: PodSet) -> frozenset[int]:
        """The nodes whose labels and taints let these pods on."""
        shape = (pod_set.node_selector, pod_set.tolerations)
        nodes = self._admitting.get(shape)
        if nodes is None:
            nodes = self._admitting[shape] = frozenset(
                i for i, node in enumerate(self._nodes) if node.admits(pod_set)
            )
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

    def _no_match_reason(self, index: int) -> str:
        if not self._names:
            return self._no_nodes_reason()
        return f"no schedulable node matches pod {_token(index)} (nodeSelector/taints)"

    def _per_node_reason(self, demand: Demand, step: _Step, placed: int) -> str:
        """Why the gang found no room, naming the pod and the roomiest node it could use."""
        requests = demand.requests[step.index]
        columns = {r: self._columns.get(r, self._zeros) for r, _ in requests}
        nodes = sorted(step.admitting)
        best_node = nodes[0]
        best_ratio = -math.inf
        for node in nodes:
            ratio = min(columns[r][node] / v for r, v in requests)
            if ratio > best_ratio:
                best_node, best_ratio = node, ratio
        room = ", ".join(_fmt(r, columns[r][best_node]) for r, _ in requests)
        pod_set = demand.pod_sets[step.index]
        pod = f"pod {_token(step.index)} ({pod_set.requests.describe()})"
        total = sum(max(p.count, 0) for p in demand.pod_sets)
        after = f" after placing {placed} of {total} pods" if placed else ""
        where = f"{room} ({self._names[best_node]})"
        if self._empty:
            return f"no node can ever hold {pod}{after}: the largest node has {where}"
        return (
            f"resources free in total but no node can hold {pod}{after}: "
            f"largest free on a node is {where}"
        )

    def _usable_shortfall(self, demand: Demand, step: _Step) -> str | None:
        pod_set = demand.pod_sets[step.index]
        nodes = self._admitting_nodes(pod_set)
        if len(nodes) == len(self._nodes):
            return None  # the cluster-wide aggregate already covered these nodes
        shape = (pod_set.node_selector, pod_set.tolerations)
        needed: _Free = {}
        for other in demand.pod_sets:
            if (other.node_selector, other.tolerations) == shape:
                for resource, value in other.requests.items():
                    needed[resource] = needed.get(resource, 0) + value * max(other.count, 0)
        clauses = []
        for resource in sorted(needed):
            allocatable = self._allocatable.get(resource, self._zeros)
            column = self._columns.get(resource, self._zeros)
            capacity = sum(allocatable[n] for n in nodes)
            free = sum(column[n] for n in nodes)
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


def fits_ever(pod_sets: Sequence[PodSet] | Demand, snapshot: ClusterSnapshot) -> str | None:
    """Why the gang could not fit this cluster even with every schedulable node empty.

    None when it could. Only nodes that are schedulable now count, so a cluster whose nodes
    are all NotReady for a moment also answers with a reason: callers should treat the
    answer as "not now, and not by waiting for others to finish".
    """
    return ClusterState(snapshot, empty=True).fits(pod_sets)
