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
each pod on the node with the least room (best fit; room = sum over the pod's resources of
free / cluster capacity, computed exactly; ties go to the node listed first), filling that
node before going to the next. On success the placement stays applied and the result
carries an `undo` that restores the state exactly, so a caller can try, compare and roll
back (as Kueue does with its snapshot). On failure nothing changes and `reason` says why,
with numbers, in one line.

Speed (one cycle tries thousands of gangs against clusters of thousands of nodes):

- free room is kept per resource as a list of integer milli-units indexed by node;
- for each set of requested resources and each set of nodes the pods' selector and
  tolerations allow (an `_Order`), the nodes are kept sorted by room, as one integer per
  node (room scaled to an integer, node index in the low bits). A pod fits no node whose
  room is below its own request's, so a walk starts there (`_Request`) and goes up,
  stopping as soon as every pod has a node. Orders catch up lazily with a log of the nodes
  whose room changed; for each pod size a walk also skips the nodes it found full before
  and starts where the last walk stopped (room only shrinks as pods are placed, so those
  stay full until the log says their room changed);
- answers that cannot change until room comes back are remembered by gang shape (counts,
  requests, constraints; not names): an aggregate shortfall while the free amounts of the
  resources short are unchanged, a per-node failure until a placement made before it is
  undone. Reasons are kept with a token standing for the failing pod's name, so every
  workload of the shape gets a reason naming its own pod (`reason_for`, `token_parts`).

`Evictions` answers, for preemption, whether a gang would fit a cluster once some
dispatched AppWrappers were evicted, exactly as a fresh `ClusterState` of the snapshot
without them would, without building one for every set of victims it is asked about.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from operator import sub, truediv

from dispatcher.api.quantity import format_milli
from dispatcher.api.resources import Resources
from dispatcher.core.model import AdmittedWorkload, ClusterSnapshot, NodeState, PodSet, Taint

__all__ = [
    "ClusterState",
    "Demand",
    "Evictions",
    "NodeAssignment",
    "PlaceResult",
    "Shape",
    "fits_ever",
    "reason_for",
    "shape_of",
    "token_parts",
]

_Free = dict[str, int]
# (node, pod set index, pairs of (free column, milli-units per pod), pods) for one node.
_Applied = list[tuple[int, list[tuple[list[int], int]], int, int]]
# An order of nodes by room must catch up with more logged changes than this share of its
# nodes: rebuilding it is then cheaper.
_REBUILD_SHARE = 4
# A `_Request` that missed more changes than this forgets where its walks start.
_FRONTIER_CHANGES = 64


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


# A gang shape (see `shape_of`): built-in strings, so hashing is cached and comparing is C.
Shape = str | tuple[str, ...]


def shape_of(pod_sets: Sequence[PodSet]) -> Shape:
    """What the fit of these pod sets depends on: counts, requests, constraints; not names.

    Two gangs of equal shape fit the same clusters the same way.
    """
    if len(pod_sets) == 1:
        return pod_sets[0].shape
    return tuple([p.shape for p in pod_sets])


class Demand:
    """What a gang asks for, worked out once and then tried against any number of clusters.

    `try_place` accepts the pod sets themselves too; a caller that tries the same gang in
    several clusters (the scheduling cycle) saves the repeated work by passing a `Demand`.
    The pod sets' names are only read for messages; a `Demand` may stand for every gang of
    its shape (see `reason_for`).
    """

    __slots__ = ("key", "pod_sets", "requests", "shape", "totals")

    def __init__(self, pod_sets: Sequence[PodSet], shape: Shape | None = None) -> None:
        self.pod_sets: tuple[PodSet, ...] = tuple(pod_sets)
        self.shape: Shape = shape_of(self.pod_sets) if shape is None else shape
        self.key: Shape = self.shape
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


def token_parts(template: str) -> tuple[int, list[str]] | None:
    """A remembered reason that names one pod set, cut where it names it: (index, parts),
    so that `name.join(parts)` is the reason for a pod set of that name. (-1, [template])
    for a reason that names none, None for one that names several."""
    if "\x00" not in template:
        return (-1, [template])
    start = template.index("\x00pod") + 4
    index = int(template[start : template.index("\x00", start)])
    parts = template.split(_token(index))
    return (index, parts) if "\x00" not in "".join(parts) else None


def reason_for(template: str, pod_sets: Sequence[PodSet]) -> str:
    """A remembered reason with the tokens replaced by these pod sets' names."""
    if "\x00" not in template:
        return template
    for index, pod_set in enumerate(pod_sets):
        token = _token(index)
        if token in template:
            template = template.replace(token, pod_set.name or f"pod set {index}")
    return template


def _fmt(resource: str, milli: int) -> str:
    return f"{resource} {format_milli(max(milli, 0), resource)}"


class _Order:
    """Nodes that may take pods asking for some resources, sorted by their room for them.

    A node's room is the sum over the resources of free / cluster capacity. It is kept
    exactly, as the integer sum of free * (product of the other resources' capacities),
    and with the node's index in the low `shift` bits, so that one integer orders nodes by
    room, then index: `items` holds those keys ascending, `rooms` the key by node. Up to
    date with the state's change log up to position `seen`. Once built, the new key of
    every node found changed is also added to `changes` and, unless it lost room, the node
    to `raised`: what the `_Request`s over this order catch up with.
    """

    __slots__ = ("changes", "items", "mask", "nodes", "pairs", "raised", "rooms", "seen", "shift")

    def __init__(
        self, nodes: frozenset[int], pairs: list[tuple[list[int], int]], shift: int
    ) -> None:
        self.nodes = nodes
        self.pairs = pairs  # (free column, multiplier) for each resource
        self.shift = shift
        self.mask = (1 << shift) - 1
        self.items: list[int] = []
        self.rooms: dict[int, int] = {}
        self.seen = -1  # never built
        self.changes: list[int] = []
        self.raised: list[int] = []

    def rebuild(self, seen: int) -> None:
        pairs = self.pairs
        shift = self.shift
        rooms = {}
        for node in self.nodes:
            total = 0
            for column, multiplier in pairs:
                total += column[node] * multiplier
            rooms[node] = (total << shift) + node
        self.rooms = rooms
        self.items = sorted(rooms.values())
        self.seen = seen

    def catch_up(self, log: list[int]) -> None:
        seen = self.seen
        end = len(log)
        if seen == end:
            return
        if seen < 0:
            self.rebuild(end)
            return
        nodes = self.nodes
        logged = log[seen:end]
        changed = [node for node in (set(logged) if len(logged) > 1 else logged) if node in nodes]
        rooms = self.rooms
        changes = self.changes
        raised = self.raised
        if len(changed) * _REBUILD_SHARE > len(nodes):
            before = {node: rooms[node] for node in changed}
            self.rebuild(end)
            rooms = self.rooms
            for node, old in before.items():
                new = rooms[node]
                changes.append(new)
                if new >= old:
                    raised.append(node)
            return
        items = self.items
        pairs = self.pairs
        shift = self.shift
        for node in changed:
            total = 0
            for column, multiplier in pairs:
                total += column[node] * multiplier
            new = (total << shift) + node
            old = rooms[node]
            if new != old:
                del items[bisect_left(items, old)]
                insort(items, new)
                rooms[node] = new
            changes.append(new)
            if new >= old:
                raised.append(node)
        self.seen = end

    def clone(self, columns: Mapping[int, list[int]], *, contents: bool) -> _Order:
        """A copy over the state copy whose columns `columns` maps (by the originals' id);
        without `contents` (or if this one was never built), one that builds on first use.
        Must be caught up with the log first."""
        copy = _Order(self.nodes, [(columns[id(c)], m) for c, m in self.pairs], self.shift)
        if contents and self.seen >= 0:
            copy.items = list(self.items)
            copy.rooms = dict(self.rooms)
            copy.seen = 0
        return copy


class _Request:
    """Pods of one size and constraints in one cluster: where to look for room for them.

    Walks for these pods skip nodes known to hold none of them: those of `order` from
    `floor` (the least key a node that holds one such pod can have) up to `start`, but for
    the keys in `extra`, and those in `full`. Room only shrinks as pods are placed, so such
    nodes still hold none unless their room changed: before each walk, the order's
    `changes` since `changes_seen` that fall below `start` and hold one pod are added to
    `extra`, and its `raised` nodes since `raised_seen` that are in `full` are checked.
    `extra` may also hold keys a node no longer has (it moved since): walks skip those.
    A walk visits `extra` first, best first, then the order from `start`, so it never
    passes again the full nodes between a node that moved down and the frontier.
    """

    __slots__ = (
        "changes_seen",
        "extra",
        "floor",
        "full",
        "order",
        "pairs",
        "raised_seen",
        "start",
    )

    def __init__(self, order: _Order, pairs: list[tuple[list[int], int]], floor: int) -> None:
        self.order = order
        self.pairs = pairs  # (free column, milli-units per pod) for each requested resource
        self.floor = floor
        self.start: float = floor
        self.extra: list[int] = []
        self.full: set[int] = set()
        self.changes_seen = len(order.changes)
        self.raised_seen = len(order.raised)

    def holds_one(self, node: int) -> bool:
        return all(column[node] >= value for column, value in self.pairs)

    def catch_up(self) -> None:
        """Forget what changed nodes could not hold, where they now hold one pod."""
        order = self.order
        changes = order.changes
        seen = self.changes_seen
        if seen != len(changes):
            self.changes_seen = len(changes)
            start = self.start
            floor = self.floor
            extra = self.extra
            if len(changes) - seen > _FRONTIER_CHANGES:
                self.forget_frontier()
            elif start > floor:
                pairs = self.pairs
                mask = order.mask
                for key in changes[seen:]:
                    if floor <= key < start:
                        node = key & mask
                        for column, value in pairs:
                            if column[node] < value:
                                break
                        else:
                            extra.append(key)
                if len(extra) > _FRONTIER_CHANGES:
                    self.forget_frontier()
        raised = order.raised
        if self.raised_seen != len(raised):
            full = self.full
            for node in raised[self.raised_seen :]:
                if node in full and self.holds_one(node):
                    full.discard(node)
            self.raised_seen = len(raised)

    def forget_frontier(self) -> None:
        """Walk from the floor again (past nodes known full): cheaper than checking many
        changes, or visiting many keys that may have moved."""
        self.start = self.floor
        self.extra = []

    def clone(self, order: _Order, columns: Mapping[int, list[int]]) -> _Request:
        copy = _Request(order, [(columns[id(c)], v) for c, v in self.pairs], self.floor)
        copy.start = self.start
        copy.extra = list(self.extra)
        copy.full = set(self.full)
        return copy


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
        "_assignments",
        "_capacity",
        "_columns",
        "_empty",
        "_failures",
        "_free_total",
        "_listed",
        "_log",
        "_names",
        "_nodes",
        "_orders",
        "_overflow",
        "_plans",
        "_refusals",
        "_requests",
        "_seq",
        "_short",
        "_zeros",
        "name",
        "snapshot",
        "unschedulable_nodes",
    )

    def __init__(self, snapshot: ClusterSnapshot, *, empty: bool = False) -> None:
        """Build from `snapshot`; with `empty`, as if no pod ran and nothing was reserved."""
        self._setup(snapshot, empty=empty)
        if not empty:
            demands: dict[Shape, Demand] = {}
            for reservation in sorted(
                snapshot.reservations, key=lambda r: (r.dispatched_at, r.key)
            ):
                shape = shape_of(reservation.pod_sets)
                demand = demands.get(shape)
                if demand is None:
                    demand = demands[shape] = Demand(reservation.pod_sets, shape)
                self._reserve(demand)

    @classmethod
    def _unreserved(cls, snapshot: ClusterSnapshot) -> ClusterState:
        """The cluster with its bound pods but none of its reservations applied."""
        state = cls.__new__(cls)
        state._setup(snapshot, empty=False)
        return state

    def _setup(self, snapshot: ClusterSnapshot, *, empty: bool) -> None:
        self.name = snapshot.name
        self.snapshot = snapshot
        self._empty = empty
        nodes = [n for n in snapshot.nodes if n.ready and not n.unschedulable]
        self.unschedulable_nodes = len(snapshot.nodes) - len(nodes)
        self._nodes: list[NodeState] = nodes
        self._names: list[str] = [n.name for n in nodes]
        count = len(nodes)
        allocatable = Resources.columns([n.allocatable for n in nodes])
        self._allocatable = allocatable
        self._capacity: _Free = {r: sum(column) for r, column in allocatable.items()}
        columns = {r: list(column) for r, column in allocatable.items()}
        if not empty:
            for resource, used in Resources.columns([n.requested for n in nodes]).items():
                column = columns.get(resource)
                if column is None:
                    columns[resource] = [-value for value in used]
                else:
                    columns[resource] = list(map(sub, column, used))
        self._columns = columns
        self._zeros = [0] * count
        self._free_total: _Free = {r: sum(column) for r, column in columns.items()}
        self._overflow: _Free = {}
        self._log: list[int] = []  # nodes whose free room changed, in order
        self._orders: dict[tuple[tuple[str, ...], object], _Order] = {}
        self._admitting: dict[object, frozenset[int]] = {}
        self._listed: dict[frozenset[int], list[int]] = {}  # node sets, sorted
        self._assignments: dict[tuple[int, int, int], NodeAssignment] = {}
        self._requests: dict[tuple[object, ...], _Request] = {}
        self._plans: dict[Shape, list[_Step]] = {}
        # Gang shapes that found no room per node -> (reason with tokens for pod names,
        # placement seq when it failed). Placements only take room away, so the answer
        # stands until a placement made before it is undone.
        self._failures: dict[Shape, tuple[str, int]] = {}
        self._seq = 0
        # Aggregate shortfall reasons by gang shape, with the free amounts of the resources
        # short that they were worked out from: a full cluster answers
        # thousands of workloads of a few shapes without formatting the same numbers again.
        self._short: dict[Shape, tuple[tuple[int | None, ...], str]] = {}
        # `refusal`'s answers by gang shape, emptied whenever the aggregate free or the
        # remembered failures change: a cycle asks again after every admission anywhere.
        self._refusals: dict[Shape, str | None] = {}

    def _clone(self, keep: Container[frozenset[int]] | None = None) -> ClusterState:
        """An independent copy of this state (its answers are the same, its caches empty).

        With `keep`, only the node orders over node sets in `keep` are copied (others are
        rebuilt if ever used): for copies that only place pods on those nodes.
        """
        log = self._log

        def kept(order: _Order) -> bool:
            return order.seen >= 0 and (keep is None or order.nodes in keep)

        for order in self._orders.values():
            if kept(order):
                order.catch_up(log)
        for request in self._requests.values():
            if kept(request.order):
                request.catch_up()
        copy = ClusterState.__new__(ClusterState)
        copy.name = self.name
        copy.snapshot = self.snapshot
        copy._empty = self._empty
        copy.unschedulable_nodes = self.unschedulable_nodes
        copy._nodes = self._nodes
        copy._names = self._names
        copy._allocatable = self._allocatable
        copy._capacity = self._capacity
        copy._zeros = self._zeros
        copy._admitting = self._admitting
        copy._listed = self._listed
        copy._assignments = self._assignments
        copy._columns = {r: list(column) for r, column in self._columns.items()}
        by_id = {id(self._columns[r]): copy._columns[r] for r in self._columns}
        by_id[id(self._zeros)] = self._zeros
        copy._free_total = dict(self._free_total)
        copy._overflow = dict(self._overflow)
        copy._log = []
        copy._orders = {}
        orders: dict[int, _Order] = {}
        for key, order in self._orders.items():
            orders[id(order)] = copy._orders[key] = order.clone(by_id, contents=kept(order))
        copy._requests = {}
        requests: dict[int, _Request] = {}
        for request_key, request in self._requests.items():
            copied = request.clone(orders[id(request.order)], by_id)
            if not kept(request.order):
                # Not caught up with the log: start over.
                copied.forget_frontier()
                copied.full = set()
            requests[id(request)] = copy._requests[request_key] = copied
        copy._plans = {
            shape: [_Step(s.index, s.count, requests[id(s.request)], s.admitting) for s in plan]
            for shape, plan in self._plans.items()
        }
        copy._failures = {}
        copy._seq = self._seq
        copy._short = {}
        copy._refusals = {}
        return copy

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
        refusals = self._refusals
        key = demand.key
        if key in refusals:
            return refusals[key]
        answer = refusals[key] = self._refusal(demand)
        return answer

    def _refusal(self, demand: Demand) -> str | None:
        free_total = self._free_total
        for resource, value in demand.totals.items():
            if value > free_total.get(resource, 0):
                # The reason names the resources short, with what is free of them.
                short = tuple(
                    [
                        free_total.get(r, 0) if v > free_total.get(r, 0) else None
                        for r, v in demand.totals.items()
                    ]
                )
                known = self._short.get(demand.key)
                if known is None or known[0] != short:
                    known = self._short[demand.key] = (
                        short,
                        self._aggregate_shortfall(demand.totals),
                    )
                return known[1]
        if not self._names and demand.totals:
            return self._no_nodes_reason()
        failed = self._failures.get(demand.key)
        if failed is not None:
            return failed[0]
        return None

    def place(self, demand: Demand, *, checked: bool = False) -> PlaceResult | str:
        """`try_place` for callers that name pods themselves: on failure, the reason with
        tokens for pod names (see `reason_for`). `checked`: `refusal` just said None (and
        nothing changed since)."""
        if not checked:
            refusal = self.refusal(demand)
            if refusal is not None:
                return refusal
        applied: _Applied = []
        for step in self._plan(demand):
            if not step.admitting:
                self._unapply(applied)
                template = self._no_match_reason(step.index)
                self._failures[demand.key] = (template, self._seq)
                self._refusals.pop(demand.key, None)
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
                self._refusals.pop(demand.key, None)
                return template
        totals = demand.totals
        free_total = self._free_total
        for resource, value in totals.items():
            free_total[resource] = free_total.get(resource, 0) - value
        self._refusals.clear()
        self._seq += 1
        names = self._names
        # Values: the same assignment is one object (a cycle makes thousands).
        made = self._assignments
        assignments = []
        for node, _, count, pod_set in applied:
            key = (node, count, pod_set)
            assignment = made.get(key)
            if assignment is None:
                assignment = made[key] = NodeAssignment(
                    pod_set=pod_set, node=names[node], count=count
                )
            assignments.append(assignment)
        return PlaceResult(
            ok=True,
            assignments=tuple(assignments),
            # A partial, not a closure: one is made for every admission, most never called.
            undo=partial(self._undo, applied, totals, self._seq, []),
        )

    def _holds(self, demand: Demand) -> bool:
        """Whether the gang fits now, for a state that is thrown away after: the placement
        stays applied, no reason is worked out, nothing is remembered."""
        free_total = self._free_total
        for resource, value in demand.totals.items():
            if value > free_total.get(resource, 0):
                return False
        applied: _Applied = []
        for step in self._plan(demand):
            if not step.admitting or self._fill(step, applied):
                return False
        return True

    def _undo(
        self, applied: _Applied, totals: Mapping[str, int], seq: int, done: list[bool]
    ) -> None:
        if done:
            raise RuntimeError("this placement was already undone")
        done.append(True)
        self._unapply(applied)
        for resource, value in totals.items():
            self._free_total[resource] += value
        # Room came back: failures recorded while this placement was applied may fit now.
        self._failures = {k: v for k, v in self._failures.items() if v[1] < seq}
        self._refusals.clear()

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
        self._refusals.clear()

    def _reserve_within(self, demand: Demand, orders: Container[frozenset[int]]) -> None:
        """Place a reservation's pods that may use the node sets in `orders`, nothing else.

        Pods of other node sets never touch those nodes, and the aggregate is not kept:
        only for states that answer about gangs using those nodes, with the aggregate set.
        """
        applied: _Applied = []
        for step in self._plan(demand):
            if step.request.order.nodes in orders:
                self._fill(step, applied)

    def _fill(self, step: _Step, applied: _Applied) -> int:
        """Best-fit the step's pods; returns how many found no room.

        Putting pods on a node lowers only that node's room, so the next best node is the
        next one in the order: one walk per pod set, from the first node that may hold one.
        """
        request = step.request
        log = self._log
        order = request.order
        # Checked here first: often nothing changed since (pods of other node sets placed in
        # between), and a call costs more than the check.
        if order.seen != len(log):
            order.catch_up(log)
        if request.changes_seen != len(order.changes) or request.raised_seen != len(order.raised):
            request.catch_up()
        items = order.items
        rooms = order.rooms
        changes = order.changes
        mask = order.mask
        pairs = request.pairs
        # One pod's share of a node's key: a node's key drops by this much per pod placed.
        per_pod = request.floor
        remaining = step.count
        position = bisect_left(items, request.start)
        end = len(items)
        full = request.full
        # Keys below the frontier first (all below `items[position]`), best first.
        extra = request.extra
        if len(extra) > 1:
            extra.sort()
        visited = 0
        waiting = len(extra)
        more = False  # whether the last node that took pods can take another
        new = 0
        while True:
            if visited < waiting:
                key = extra[visited]
                visited += 1
                node = key & mask
                if rooms[node] != key:
                    continue  # it moved since; its new key was looked at then
                index = -1
            elif position < end:
                key = items[position]
                position += 1
                node = key & mask
                index = position - 1
            else:
                break
            if node in full:
                continue
            room = remaining
            for column, value in pairs:
                fit = column[node] // value
                if fit < room:
                    room = fit
                    if fit <= 0:
                        break
            if room <= 0:
                full.add(node)
                continue
            for column, value in pairs:
                column[node] -= value * room
            log.append(node)
            applied.append((node, pairs, room, step.index))
            # The order is kept up to date here rather than through the log: the node only
            # moves down (it lost room), so the items from `position` on keep their places.
            if index < 0:
                index = bisect_left(items, key, 0, position)
            new = key - room * per_pod
            del items[index]
            insort(items, new, 0, index)
            rooms[node] = new
            changes.append(new)
            remaining -= room
            if not remaining:
                for column, value in pairs:
                    if column[node] < value:
                        break
                else:
                    more = True
                break
        order.seen = len(log)
        request.changes_seen = len(changes)
        # Every node walked past is full or took pods: the next walk begins where this one
        # stopped, after the keys it did not get to and the last node that took pods if it
        # can take another.
        del extra[:visited]
        if more:
            extra.append(new)
        request.start = items[position] if position < end else math.inf
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
                    usable = frozenset([n for n in usable if column[n] > 0])
                capacities = [self._capacity.get(r, 0) or 1 for r in resources]
                multipliers = [
                    math.prod(c for j, c in enumerate(capacities) if j != i)
                    for i in range(len(resources))
                ]
                order = self._orders[(resources, constraint)] = _Order(
                    usable,
                    [
                        (self._columns.get(r, self._zeros), m)
                        for r, m in zip(resources, multipliers, strict=True)
                    ],
                    max(1, len(self._nodes).bit_length()),
                )
            floor = 0
            for (_, value), (_, multiplier) in zip(requests, order.pairs, strict=True):
                floor += value * multiplier
            request = self._requests[(requests, constraint)] = _Request(
                order,
                [(self._columns.get(r, self._zeros), v) for r, v in requests],
                floor << order.shift,
            )
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
            # The same test as `NodeState.admits` (every node here is schedulable), with the
            # verdict on a set of taints worked out once: nodes mostly share a few.
            selector, tolerations = shape
            tolerated: dict[tuple[Taint, ...], bool] = {}
            chosen = []
            for index, node in enumerate(self._nodes):
                taints = node.taints
                if taints:
                    verdict = tolerated.get(taints)
                    if verdict is None:
                        verdict = tolerated[taints] = all(
                            any(t.tolerates(taint) for t in tolerations)
                            for taint in taints
                            if taint.repels
                        )
                    if not verdict:
                        continue
                if selector:
                    labels = node.labels
                    if any(labels.get(key) != value for key, value in selector):
                        continue
                chosen.append(index)
            nodes = self._admitting[shape] = frozenset(chosen)
        return nodes

    def _sorted_nodes(self, nodes: frozenset[int]) -> list[int]:
        listed = self._listed.get(nodes)
        if listed is None:
            listed = self._listed[nodes] = sorted(nodes)
        return listed

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

        def roomiest(nodes: list[int]) -> tuple[float, int]:
            # Per node, the fewest pods of this size its free room holds of any resource
            # (as a fraction); the roomiest node is the first with the most.
            # Built-in maps and one comprehension (`map(min, ...)` calls a builtin per node):
            # this runs over every node for each gang shape that fails.
            ratios: list[float] | None = None
            for resource, value in requests:
                shares = map(truediv, map(columns[resource].__getitem__, nodes), repeat(value))
                if ratios is None:
                    ratios = list(shares)
                else:
                    ratios = [a if a < b else b for a, b in zip(ratios, shares, strict=True)]
            if not ratios:
                return (0.0, nodes[0])
            best = max(ratios)
            return (best, nodes[ratios.index(best)])

        # Nodes that have none of a requested resource hold no room for it: when some
        # node that has them all has room for a bit of a pod, it is the roomiest.
        best_ratio, best_node = (
            roomiest(self._sorted_nodes(step.request.order.nodes))
            if step.request.order.nodes
            else (0.0, -1)
        )
        if best_ratio <= 0:
            best_ratio, best_node = roomiest(self._sorted_nodes(step.admitting))
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
            free = sum(map(column.__getitem__, nodes))
            if needed[resource] <= free:
                continue  # (when empty, free is the capacity)
            capacity = sum(map(allocatable.__getitem__, nodes))
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


# A replay of reservations is saved every this many of them (see `Evictions`).
_STOP_EVERY = 16


class _Tape:
    """Fresh-state replays of the reservations over one starting state, saved as they go.

    `at(position)` is a copy of the state once the first `position` reservations (of those
    the owner replays) were placed; the tape moves forward on demand and keeps a copy every
    `_STOP_EVERY` reservations, so going back costs a copy and a few reservations.
    """

    __slots__ = ("_cursor", "_keep", "_position", "_steps", "_stops")

    def __init__(
        self, start: ClusterState, steps: Sequence[Demand], keep: frozenset[frozenset[int]]
    ) -> None:
        self._cursor = start
        self._steps = steps
        self._keep = keep
        self._position = 0
        self._stops: list[tuple[int, ClusterState]] = [(0, start._clone(keep))]

    def at(self, position: int) -> ClusterState:
        keep = self._keep
        if position >= self._position:
            cursor = self._cursor
            while self._position < position:
                cursor._reserve_within(self._steps[self._position], keep)
                self._position += 1
                if self._position % _STOP_EVERY == 0:
                    self._stops.append((self._position, cursor._clone(keep)))
            return cursor._clone(keep)
        stop = bisect_left(self._stops, position + 1, key=lambda s: s[0]) - 1
        at, saved = self._stops[stop]
        state = saved._clone(keep)
        for index in range(at, position):
            state._reserve_within(self._steps[index], keep)
        return state


class _PodRoom:
    """For each pod set of a gang: how many of its pods the nodes it may use could hold,
    one node at a time, with no pod reserved (reservations only take room away), as
    bound pods are freed node by node."""

    __slots__ = ("_base", "_sets")

    def __init__(self, base: ClusterState, demand: Demand, plan: Sequence[_Step]) -> None:
        self._base = base._columns
        # (pods needed, resources and amounts per pod, usable nodes, pods per node, total)
        self._sets: list[tuple[int, list[tuple[str, int]], frozenset[int], dict[int, int], int]]
        self._sets = []
        for step in plan:
            if not step.request.pairs:
                continue
            pairs = step.request.pairs
            counts = {}
            for node in step.request.order.nodes:
                pods = min(column[node] // value for column, value in pairs)
                if pods > 0:
                    counts[node] = pods
            self._sets.append(
                (
                    step.count,
                    list(demand.requests[step.index]),
                    step.request.order.nodes,
                    counts,
                    sum(counts.values()),
                )
            )

    def fresh(self) -> list[tuple[dict[int, int], int]]:
        """Mutable running counts (per node, total) for `free`, one entry per pod set."""
        return [(dict(counts), total) for _, _, _, counts, total in self._sets]

    def free(
        self, running: list[tuple[dict[int, int], int]], node: int, room: Mapping[str, int]
    ) -> None:
        """Count in that `node` has `room` more than with its bound pods."""
        base = self._base
        for index, (_, requests, nodes, _, _) in enumerate(self._sets):
            if node not in nodes:
                continue
            counts, total = running[index]
            pods = min((base[r][node] + room.get(r, 0)) // value for r, value in requests)
            pods = max(pods, 0)
            running[index] = (counts, total + pods - counts.get(node, 0))
            counts[node] = pods

    def enough(self, running: list[tuple[dict[int, int], int]]) -> bool:
        return all(
            total >= needed
            for (needed, _, _, _, _), (_, total) in zip(self._sets, running, strict=True)
        )


class Evictions:
    """Would one gang fit one cluster once some of its dispatched AppWrappers were evicted?

    `fits(keys)` answers exactly as `ClusterState(snapshot.without(keys)).fits(demand)`
    (None or not) would, for as many sets of keys as a preemption policy cares to ask
    about, without building each of those states from nothing:

    - the aggregate free is summed from what each evicted AppWrapper holds (bound pods on
      schedulable nodes, reservations); when it is short, the gang does not fit;
    - a pod set that finds too few places even on nodes freed of every reservation (and of
      the evicted AppWrappers' bound pods) does not fit either: reservations only take room;
    - otherwise reservations are replayed as a fresh state would place them, but only pods
      that may use the nodes the gang may use (nodes are connected through the node sets
      pods may use: a GPU gang's replay skips pods that cannot go on GPU nodes, which never
      touch them), and from a saved replay with the same bound pods evicted, taken before the
      first evicted reservation.

    `first_fit(keys)` is the shortest prefix of `keys` that fits, found the same way with
    the aggregate and the room per pod set summed as the prefix grows.
    """

    def __init__(self, snapshot: ClusterSnapshot, demand: Demand) -> None:
        self._demand = demand
        base = ClusterState._unreserved(snapshot)
        self._base = base
        demands: dict[Shape, Demand] = {}
        ordered: list[tuple[str, Demand]] = []
        for reservation in sorted(snapshot.reservations, key=lambda r: (r.dispatched_at, r.key)):
            shape = shape_of(reservation.pod_sets)
            known = demands.get(shape)
            if known is None:
                known = demands[shape] = Demand(reservation.pod_sets, shape)
            ordered.append((reservation.key, known))
        # Node sets the gang's pods may use, and every node set sharing a node with one of
        # those, transitively: only pods that may use them change the nodes the gang may use.
        gang_plan = base._plan(demand)
        keep = {step.request.order.nodes for step in gang_plan}
        others = {step.request.order.nodes for d in demands.values() for step in base._plan(d)}
        others -= keep
        grown = True
        while grown:
            grown = False
            for nodes in list(others):
                if any(not nodes.isdisjoint(kept) for kept in keep):
                    keep.add(nodes)
                    others.discard(nodes)
                    grown = True
        self._keep = frozenset(keep)
        self._nodes: frozenset[int] = frozenset().union(*keep) if keep else frozenset()
        relevant = {
            id(d): any(step.request.order.nodes in self._keep for step in base._plan(d))
            for d in demands.values()
        }
        self._steps: list[Demand] = []
        self._positions: dict[str, list[int]] = {}
        # The aggregate free of the gang's resources with every reservation applied, and
        # what each AppWrapper's reservations hold of them.
        resources = tuple(demand.totals)
        self._free = {r: base._free_total.get(r, 0) for r in resources}
        self._reserved: dict[str, _Free] = {}
        for key, known in ordered:
            if relevant[id(known)]:
                self._positions.setdefault(key, []).append(len(self._steps))
                self._steps.append(known)
            held = self._reserved.setdefault(key, {})
            for resource in resources:
                value = known.totals.get(resource, 0)
                if value:
                    self._free[resource] -= value
                    held[resource] = held.get(resource, 0) + value
        self._admitted: dict[str, list[AdmittedWorkload]] = {}
        for admitted in snapshot.admitted:
            self._admitted.setdefault(admitted.key, []).append(admitted)
        self._index = {name: i for i, name in enumerate(base._names)}
        # Worked out for an AppWrapper when first asked about: what it holds of the gang's
        # resources, and what its bound pods use on the nodes the gang may come to depend on.
        self._held: dict[str, _Free] = {}
        self._usage: dict[str, list[tuple[int, dict[str, int]]]] = {}
        self._room = _PodRoom(base, demand, gang_plan)
        self._tapes: dict[frozenset[str], _Tape] = {}
        # `fits` by set of victims: a policy's searches (a prefix, then victims given back,
        # then one at a time) come back to sets they asked about, and each answer may cost
        # a replay of the reservations.
        self._answers: dict[frozenset[str], bool] = {}

    def _holding(self, key: str) -> _Free:
        held = self._held.get(key)
        if held is not None:
            return held
        held = self._held[key] = dict(self._reserved.get(key, ()))
        index = self._index
        nodes = self._nodes
        resources = self._free
        for admitted in self._admitted.get(key, ()):
            for node_name, used in admitted.usage:
                node = index.get(node_name)
                if node is None:
                    continue  # not schedulable: a fresh state does not count it either
                amounts = {r: used[r] for r in used}
                for resource, value in amounts.items():
                    if resource in resources:
                        held[resource] = held.get(resource, 0) + value
                if node in nodes:
                    self._usage.setdefault(key, []).append((node, amounts))
        return held

    def fits(self, keys: Iterable[str]) -> bool:
        """Whether the gang fits once the AppWrappers named by `keys` are gone."""
        victims = list(dict.fromkeys(keys))
        asked = frozenset(victims)
        answer = self._answers.get(asked)
        if answer is None:
            answer = self._answers[asked] = self._fits(victims)
        return answer

    def _fits(self, victims: list[str]) -> bool:
        """`fits` worked out (its answer depends on the set of victims, not their order)."""
        free = dict(self._free)
        freed: dict[int, dict[str, int]] = {}
        usage_by = self._usage
        for key in victims:
            for resource, value in self._holding(key).items():
                free[resource] += value
            for node, amounts in usage_by.get(key, ()):
                room = freed.setdefault(node, {})
                for resource, value in amounts.items():
                    room[resource] = room.get(resource, 0) + value
        if not self._enough(free):
            return False
        running = self._room.fresh()
        for node, room in freed.items():
            self._room.free(running, node, room)
        if not self._room.enough(running):
            return False
        return self._replay(victims, free)

    def first_fit(self, keys: Sequence[str]) -> int | None:
        """The length of the shortest prefix of `keys` whose eviction makes the gang fit.

        Prefixes are checked cheaply (aggregate, room per pod set) one by one; from the
        first that passes, the full check gallops (1, 2, 4... further) to a prefix that
        fits, then halves the gap. That finds the same prefix as checking each in turn
        whenever evicting more never makes the gang fit worse, which is the usual case
        (greedy placement can, rarely, do worse with more room; then a longer prefix that
        fits, with a shorter one before it that does not, is the answer).
        """
        free = dict(self._free)
        freed: dict[int, dict[str, int]] = {}
        running = self._room.fresh()
        length = 0
        for key in keys:
            length += 1
            for resource, value in self._holding(key).items():
                free[resource] += value
            for node, amounts in self._usage.get(key, ()):
                room = freed.setdefault(node, {})
                for resource, value in amounts.items():
                    room[resource] = room.get(resource, 0) + value
                self._room.free(running, node, room)
            if self._enough(free) and self._room.enough(running):
                break
        else:
            return None
        failed = length - 1  # the longest prefix known not to fit
        step = 1
        while True:
            if self.fits(keys[:length]):
                break
            failed = length
            if length == len(keys):
                return None
            length = min(length + step, len(keys))
            step *= 2
        while length - failed > 1:
            middle = (failed + length) // 2
            if self.fits(keys[:middle]):
                length = middle
            else:
                failed = middle
        return length

    def _enough(self, free: Mapping[str, int]) -> bool:
        return all(value <= free[r] for r, value in self._demand.totals.items())

    def _replay(self, victims: Sequence[str], free: _Free) -> bool:
        usage = self._usage
        bound = frozenset([key for key in victims if key in usage])
        tape = self._tapes.get(bound)
        if tape is None:
            tape = self._tapes[bound] = self._tape(bound)
        positions = self._positions
        evicted = sorted([p for key in victims if key in positions for p in positions[key]])
        first = evicted[0] if evicted else len(self._steps)
        state = tape.at(first)
        skip = set(evicted)
        keep = self._keep
        steps = self._steps
        for position in range(first, len(steps)):
            if position not in skip:
                state._reserve_within(steps[position], keep)
        state._free_total = free
        return state._holds(self._demand)

    def _tape(self, bound: Iterable[str]) -> _Tape:
        start = self._base._clone(self._keep)
        columns = start._columns
        for key in bound:
            for node, amounts in self._usage[key]:
                for resource, value in amounts.items():
                    column = columns.get(resource)
                    if column is not None:
                        column[node] += value
                start._log.append(node)
        return _Tape(start, self._steps, self._keep)


def fits_ever(pod_sets: Sequence[PodSet] | Demand, snapshot: ClusterSnapshot) -> str | None:
    """Why the gang could not fit this cluster even with every schedulable node empty.

    None when it could. Only nodes that are schedulable now count, so a cluster whose nodes
    are all NotReady for a moment also answers with a reason: callers should treat the
    answer as "not now, and not by waiting for others to finish".
    """
    return ClusterState(snapshot, empty=True).fits(pod_sets)
