"""Whether a gang fits one member cluster, where its pods go, and why not. Pure, no I/O.

A `ClusterRoom` is the mutable, per-cycle picture of one cluster's free room, built from
a frozen `ClusterSnapshot`. Only schedulable nodes (Ready and not cordoned) take part:

- per node, free = allocatable - requested (the node's bound, non-terminal pods);
- the aggregate free is the sum of those, minus every reservation (pods of dispatched
  AppWrappers that are not bound yet).

Reservations are charged first, oldest dispatch first: each reserved pod goes on a node
the way `place` would put it. A reserved pod that fits on no node is still charged against
the aggregate (never per node): the aggregate then stays an upper bound on what can really
be admitted, so pods the real scheduler may still place are never double-booked, at the
price of sometimes being a little pessimistic.

`place` places a gang: all pods or none. The aggregate is checked first (a few dict
lookups); only when that fits are pods placed, one pod set at a time, the largest pods
first, each pod on the node with the least room that holds it (best fit; room = sum over
the pod's resources of free / cluster capacity, exact; ties go to the node listed first),
filling that node before going to the next. On success the placement stays applied and
`Placed.undo` restores the state exactly. On failure nothing changes and the `Refusal`
says why, with numbers, in one line.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice

from dispatcher.api.quantity import format_milli
from dispatcher.api.resources import Resources
from dispatcher.core.model import (
    PODS,
    UNLIMITED_PODS,
    ClusterSnapshot,
    NodeSnapshot,
    PodSet,
    Reservation,
    Toleration,
)
from dispatcher.core.scheduling.nodeorder import NodeOrder, Requests, ranked

__all__ = ["ClusterRoom", "Gang", "NodeAssignment", "Placed", "Placements", "Refusal"]

# Stands for the failing pod set's name in a `Refusal`: one refusal serves every workload
# of the same shape, and each message names that workload's own pod.
POD = "\x00"

# Pods of one pod set applied to one node: (pod set index, node index, per-pod requests,
# pods).
_Applied = tuple[int, int, Requests, int]
Constraint = tuple[tuple[tuple[str, str], ...], tuple[Toleration, ...]]  # selector, tolerations


@dataclass(frozen=True, slots=True)
class NodeAssignment:
    """`count` pods of pod set `pod_set` (its index in the gang) go on node `node`."""

    pod_set: int
    node: str
    count: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a gang does not fit; `text` holds `POD` where it names the failing pod set."""

    text: str
    pod_set: int = -1  # the pod set `text` names, -1 for none

    def message(self, pod_sets: Sequence[PodSet]) -> str:
        if self.pod_set < 0:
            return self.text
        name = pod_sets[self.pod_set].name or f"pod set {self.pod_set}"
        return self.text.replace(POD, name)


@dataclass(frozen=True, slots=True)
class Gang:
    """What a gang asks for, worked out once per shape (pod names play no part in a fit)."""

    pod_sets: tuple[PodSet, ...]
    requests: tuple[Requests, ...]  # per pod set, per pod
    totals: Requests  # the whole gang, per resource (pod sets of no pods count nothing)
    shape: tuple[str, ...]

    @staticmethod
    def of(pod_sets: Sequence[PodSet]) -> Gang:
        requests = tuple(
            tuple(sorted((r, v) for r, v in p.requests.items() if v > 0)) for p in pod_sets
        )
        totals: dict[str, int] = {}
        for pod_set, asked in zip(pod_sets, requests, strict=True):
            for resource, value in asked:
                totals[resource] = totals.get(resource, 0) + value * max(pod_set.count, 0)
        return Gang(
            pod_sets=tuple(pod_sets),
            requests=requests,
            totals=tuple(sorted((r, v) for r, v in totals.items() if v > 0)),
            shape=tuple(p.shape for p in pod_sets),
        )


@dataclass(frozen=True, slots=True)
class Placed:
    """A gang placed in a `ClusterRoom`, and how to take it off again."""

    applied: tuple[_Applied, ...]
    node_names: Sequence[str] = field(repr=False)
    undo: Callable[[], None] = field(repr=False, compare=False)

    @property
    def assignments(self) -> tuple[NodeAssignment, ...]:
        """Where its pods went, in the order they were placed."""
        return _assignments(self.applied, self.node_names)


def _assignments(
    applied: tuple[_Applied, ...], node_names: Sequence[str]
) -> tuple[NodeAssignment, ...]:
    return tuple(
        NodeAssignment(pod_set=pod_set, node=node_names[node], count=count)
        for pod_set, node, _, count in applied
    )


class Placements(Mapping[str, tuple[NodeAssignment, ...]]):
    """Where each of a cycle's admissions put its pods, by key: worked out when read (most
    cycles' never are, and a cycle of thousands of admissions would pay for them all)."""

    def __init__(self, placed: Mapping[str, Placed] | None = None) -> None:
        # What they are made from, without the placement's undo (which holds its state).
        self._placed = {k: (p.applied, p.node_names) for k, p in (placed or {}).items()}

    def __getitem__(self, key: str) -> tuple[NodeAssignment, ...]:
        return _assignments(*self._placed[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._placed)

    def __len__(self) -> int:
        return len(self._placed)


# The answer of `place(explain=False)`: working out why costs a pass over the nodes.
_UNEXPLAINED = Refusal("does not fit")


# See `ClusterRoom._step`: the order walked, the key it starts from, (free column,
# milli-units per pod) per resource, and the nodes known full for such pods.
_Step = tuple[NodeOrder, tuple[int, int], list[tuple[list[int], int]], set[int]]


class ClusterRoom:
    """A mutable simulation of one cluster's free room for one scheduling cycle."""

    def __init__(self, snapshot: ClusterSnapshot, *, empty: bool = False) -> None:
        """Build from `snapshot`; with `empty`, as if no pod ran and nothing was reserved."""
        self.name = snapshot.name
        self.snapshot = snapshot
        self.nodes: list[NodeSnapshot] = [n for n in snapshot.nodes if n.schedulable]
        self.names = [n.name for n in self.nodes]
        self.unschedulable = len(snapshot.nodes) - len(self.nodes)
        self.allocatable = Resources.columns([n.allocatable for n in self.nodes])
        if self.nodes:
            # Every pod asks for `pods: 1`; a node that does not report how many it runs
            # takes any number, so a cluster whose nodes never say stays as it was.
            pods = self.allocatable.setdefault(PODS, [0] * len(self.nodes))
            for index, value in enumerate(pods):
                if value <= 0:
                    pods[index] = UNLIMITED_PODS
        self.capacity = {r: sum(column) for r, column in self.allocatable.items()}
        # Free room per resource, one integer per schedulable node.
        self.free: dict[str, list[int]] = {r: list(c) for r, c in self.allocatable.items()}
        if not empty:
            for resource, used in Resources.columns([n.requested for n in self.nodes]).items():
                column = self.free_column(resource)
                for index, value in enumerate(used):
                    column[index] -= value
        self.index = {name: i for i, name in enumerate(self.names)}
        self.free_total = {r: sum(column) for r, column in self.free.items()}
        # Per reservation key, what it was charged: (pods applied to nodes, totals).
        self.reserved: dict[str, tuple[list[_Applied], Requests]] = {}
        self._orders: dict[tuple[tuple[str, ...], Constraint], NodeOrder] = {}
        self._admitting: dict[Constraint, list[int]] = {}
        self._full: dict[Requests, set[int]] = {}  # see `_fill`
        self._gangs: dict[tuple[str, ...], Gang] = {}  # reservations' gangs by shape
        self._largest: dict[tuple[str, ...], list[int]] = {}  # see `_largest_first`
        self._steps: dict[tuple[tuple[str, ...], int], _Step] = {}  # by gang shape, pod set
        # Gang shapes that found no room per node, with why and how many placements had
        # been made then (a count that never goes down): room only shrinks, until one of
        # those placements is undone.
        self._failed: dict[tuple[str, ...], tuple[Refusal, int]] = {}
        self._placements = 0
        # Aggregate shortfalls by (totals, free amounts): thousands of workloads of a few
        # shapes are refused with the same numbers.
        self._shortfalls: dict[tuple[Requests, tuple[int | None, ...]], Refusal] = {}
        if not empty:
            by_age = sorted(snapshot.reservations, key=lambda r: (r.dispatched_at, r.key))
            for reservation in by_age:
                self.reserve(reservation)

    # -- reading -----------------------------------------------------------------------

    def free_column(self, resource: str) -> list[int]:
        column = self.free.get(resource)
        if column is None:
            column = self.free[resource] = [0] * len(self.nodes)
        return column

    def capacity_of(self, resource: str) -> int:
        return self.capacity.get(resource, 0)

    def free_of(self, resource: str) -> int:
        return self.free_total.get(resource, 0)

    # -- giving room back -------------------------------------------------------------

    def give_back(self, per_node: dict[int, dict[str, int]], total: dict[str, int]) -> None:
        """Add room: `per_node` (node index -> milli-units) to nodes, `total` to the
        aggregate; the negated amounts take it again."""
        for node, amounts in per_node.items():
            for resource, value in amounts.items():
                self.free_column(resource)[node] += value
        for resource, value in total.items():
            self.free_total[resource] = self.free_total.get(resource, 0) + value
        gained = any(v > 0 for amounts in per_node.values() for v in amounts.values())
        self._moved(list(per_node), gained=gained)
        if gained or any(v > 0 for v in total.values()):
            self._failed.clear()  # room came back: failures remembered may fit now

    def release(self, key: str) -> None:
        """Give back what reservation `key` was charged (see `reserve`)."""
        applied, totals = self.reserved.pop(key)
        self._unapply(list(applied))
        self._take(totals, +1)
        self._failed.clear()

    def copy(self) -> ClusterRoom:
        """An independent state with the same free room: a cycle places on the copy and the
        kept one stays as the snapshot was (`core.scheduling.kept`). What depends only on the
        nodes (which nodes a constraint admits, pod sets' order, refusal texts) is shared."""
        new = object.__new__(ClusterRoom)
        new.__dict__.update(self.__dict__)
        new.free = {r: list(column) for r, column in self.free.items()}
        new.free_total = dict(self.free_total)
        new.reserved = dict(self.reserved)
        new._orders = {
            key: order.copy([new.free_column(r) for r in order.resources])
            for key, order in self._orders.items()
        }
        new._full = {asked: set(nodes) for asked, nodes in self._full.items()}
        new._steps = {}  # they point into this state's orders and columns: made again
        new._failed = dict(self._failed)
        return new

    # -- placing -----------------------------------------------------------------------

    def reserve(self, reservation: Reservation) -> None:
        """Charge a dispatched AppWrapper's unbound pods: per node where they fit, and
        always against the aggregate."""
        shape = tuple(p.shape for p in reservation.pod_sets)
        gang = self._gangs.get(shape)
        if gang is None:
            gang = self._gangs[shape] = Gang.of(reservation.pod_sets)
        applied: list[_Applied] = []
        for index in self._largest_first(gang):
            self._fill(gang, index, applied)  # pods that find no node: aggregate only
        self._take(gang.totals, -1)
        self.reserved[reservation.key] = (applied, gang.totals)

    def refusal(self, gang: Gang) -> Refusal | None:
        """Why the gang cannot fit, when that is known without placing a pod."""
        short = self.short_in_total(gang)
        if short is not None:
            return short
        failed = self._failed.get(gang.shape)
        return None if failed is None else failed[0]

    def short_in_total(self, gang: Gang) -> Refusal | None:
        """Why the gang cannot fit the cluster's free room even in total (or no node), if
        it cannot: the aggregate only, nothing remembered from earlier placements."""
        free_total = self.free_total
        for resource, value in gang.totals:
            if value > free_total.get(resource, 0):
                return self._aggregate_shortfall(gang)
        if not self.nodes and gang.totals:
            return self._no_nodes()
        return None

    def fits(self, gang: Gang) -> bool:
        """Whether the gang fits now (nothing stays applied)."""
        placed = self.place(gang, explain=False)
        if isinstance(placed, Refusal):
            return False
        placed.undo()
        return True

    def place(self, gang: Gang, *, explain: bool = True, checked: bool = False) -> Placed | Refusal:
        """Place every pod of the gang, or none and say why (unless not `explain`: a
        reason costs a pass over the nodes, and a yes-or-no question needs none).
        `checked`: `refusal` just said None."""
        if not checked:
            if explain:
                refused = self.refusal(gang)
            elif any(value > self.free_total.get(r, 0) for r, value in gang.totals):
                refused = _UNEXPLAINED
            else:
                refused = None
            if refused is not None:
                return refused
        applied: list[_Applied] = []
        for index in self._largest_first(gang):
            if not self._admitting_nodes(gang.pod_sets[index]):
                self._unapply(applied)
                return self._remember(gang, self._no_match(index)) if explain else _UNEXPLAINED
            if self._fill(gang, index, applied):
                if not explain:
                    self._unapply(applied)
                    return _UNEXPLAINED
                placed = sum(count for *_, count in applied)
                why = self._no_node_holds(gang, index, placed)
                self._unapply(applied)
                # When the nodes these pods may use (selector, taints) lack the room in
                # total, that is the clearer answer: the aggregate counted other nodes.
                return self._remember(gang, self._usable_shortfall(gang, index) or why)
        self._take(gang.totals, -1)
        self._placements += 1
        made = self._placements
        undone: list[bool] = []

        def undo() -> None:
            if undone:
                raise RuntimeError("this placement was already undone")
            undone.append(True)
            self._unapply(applied)
            self._take(gang.totals, +1)
            # Room came back: a failure recorded while this placement stood may fit now.
            self._failed = {k: v for k, v in self._failed.items() if v[1] < made}

        return Placed(applied=tuple(applied), node_names=self.names, undo=undo)

    def _take(self, totals: Requests, sign: int) -> None:
        for resource, value in totals:
            self.free_total[resource] = self.free_total.get(resource, 0) + sign * value

    def _remember(self, gang: Gang, why: Refusal) -> Refusal:
        self._failed[gang.shape] = (why, self._placements)
        return why

    def _fill(self, gang: Gang, index: int, applied: list[_Applied]) -> int:
        """Best-fit the pods of pod set `index` (appended to `applied`); returns how many
        found no node."""
        pod_set = gang.pod_sets[index]
        asked = gang.requests[index]
        step = self._steps.get((gang.shape, index))
        if step is None:
            step = self._steps[(gang.shape, index)] = self._step(pod_set, asked)
        order, start_key, columns, full = step
        start = bisect_left(order.sorted, start_key)
        left = max(pod_set.count, 0)
        touched = []
        for _, node in islice(order.sorted, start, None):
            if not left:
                break
            if node in full:
                continue
            count = left
            for column, value in columns:
                holds = column[node] // value
                if holds < count:
                    count = holds
            if count <= 0:
                full.add(node)
                continue
            for column, value in columns:
                column[node] -= value * count
            applied.append((index, node, asked, count))
            touched.append(node)
            left -= count
        self._moved(touched, gained=False)
        return left

    def _unapply(self, applied: list[_Applied]) -> None:
        for _, node, asked, count in applied:
            for resource, value in asked:
                self.free[resource][node] += value * count
        self._moved([node for _, node, _, _ in applied], gained=True)
        applied.clear()

    def _moved(self, nodes: list[int], *, gained: bool) -> None:
        """Keep the node orders sorted after `nodes` lost or `gained` room."""
        for order in self._orders.values():
            for node in nodes:
                order.moved(node)
        if gained:
            for full in self._full.values():
                full.difference_update(nodes)

    # -- which nodes, in which order ---------------------------------------------------

    def _largest_first(self, gang: Gang) -> list[int]:
        """Pod set indices, the pods with the largest dominant share of the cluster first
        (they are the hardest to place; small ones fill the gaps left)."""

        order = self._largest.get(gang.shape)
        if order is None:

            def share(index: int) -> float:
                largest = 0.0
                for resource, value in ranked(gang.requests[index]):
                    capacity = self.capacity.get(resource, 0)
                    largest = max(largest, value / capacity if capacity > 0 else math.inf)
                return largest

            used = [i for i, p in enumerate(gang.pod_sets) if p.count > 0]
            order = self._largest[gang.shape] = sorted(used, key=lambda i: (-share(i), i))
        return order

    def admitting(self, pod_set: PodSet) -> list[int]:
        """The nodes (indices) whose labels and taints let these pods on, in snapshot order."""
        return self._admitting_nodes(pod_set)

    def _admitting_nodes(self, pod_set: PodSet) -> list[int]:
        """The nodes whose labels and taints let these pods on, in snapshot order."""
        constraint = (pod_set.node_selector, pod_set.tolerations)
        nodes = self._admitting.get(constraint)
        if nodes is None:
            nodes = self._admitting[constraint] = [
                i for i, node in enumerate(self.nodes) if node.admits(pod_set)
            ]
        return nodes

    def _step(self, pod_set: PodSet, asked: Requests) -> _Step:
        """How pods of this size and these constraints are placed (worked out once)."""
        sizes = ranked(asked)
        order = self._order(pod_set, sizes)
        # A node that holds one pod has at least this room: the walk starts there.
        floor = sum(value * m for (_, value), m in zip(sizes, order.multipliers, strict=True))
        # Whether a node holds them is decided by every resource asked, `pods` too.
        columns = [(self.free_column(resource), value) for resource, value in asked]
        # Nodes known to hold no pod of this size: room only shrinks as pods are placed,
        # so they stay full until room comes back to them (see `_moved`).
        full = self._full.setdefault(asked, set())
        return (order, (floor, -1), columns, full)

    def _order(self, pod_set: PodSet, asked: Requests) -> NodeOrder:
        """The nodes ranked by their room in the resources `asked` (see `ranked`)."""
        resources = tuple(r for r, _ in asked)
        key = (resources, (pod_set.node_selector, pod_set.tolerations))
        order = self._orders.get(key)
        if order is None:
            # Nodes without any of a requested resource can never hold these pods.
            columns = [self.allocatable.get(r) for r in resources]
            nodes = [
                n
                for n in self._admitting_nodes(pod_set)
                if all(column is not None and column[n] > 0 for column in columns)
            ]
            order = self._orders[key] = NodeOrder(
                self.capacity, resources, [self.free_column(r) for r in resources], nodes
            )
        return order

    # -- why not -----------------------------------------------------------------------

    def _aggregate_shortfall(self, gang: Gang) -> Refusal:
        # The message names only the resources short, with what is free of them: the key
        # holds those amounts (None for the others), so room taken elsewhere keeps it.
        free = self.free_total
        short = tuple(
            # With no schedulable node there is no `pods` to count: say that instead.
            free.get(r, 0) if value > free.get(r, 0) and (r != PODS or self.nodes) else None
            for r, value in gang.totals
        )
        known = self._shortfalls.get((gang.totals, short))
        if known is None and all(have is None for have in short):
            known = self._shortfalls[(gang.totals, short)] = self._no_nodes()
        if known is None:
            clauses = [
                f"needs {_amount(r, value)}, free {_amount_of(r, have)} of "
                f"{format_milli(self.capacity.get(r, 0), r)}"
                for (r, value), have in zip(gang.totals, short, strict=True)
                if have is not None
            ]
            known = self._shortfalls[(gang.totals, short)] = Refusal("; ".join(clauses))
        return known

    def _no_nodes(self) -> Refusal:
        if self.unschedulable:
            return Refusal(
                f"no schedulable node ({self.unschedulable} nodes, all NotReady or cordoned)"
            )
        return Refusal("no schedulable node (the cluster has no nodes)")

    def _no_match(self, index: int) -> Refusal:
        if not self.nodes:
            return self._no_nodes()
        return Refusal(f"no schedulable node matches pod {POD} (nodeSelector/taints)", index)

    def _no_node_holds(self, gang: Gang, index: int, placed: int) -> Refusal:
        """No node holds the next pod of pod set `index`: name the roomiest one it may use
        (the most of its pods, as a fraction, by its scarcest resource; first listed on a
        tie), with its free room as it stands after the `placed` pods before."""
        asked = gang.requests[index]

        def roomiest(nodes: list[int]) -> tuple[float, int]:
            if not asked:
                return (0.0, nodes[0])
            # Per node, how many pods its free room holds, by its scarcest resource; one
            # list per resource, combined pairwise (this runs over every node).
            holds: list[float] = []
            for resource, value in asked:
                column = self.free[resource]
                these = [column[node] / value for node in nodes]
                holds = list(map(min, holds, these)) if holds else these
            best = max(holds)
            return (best, nodes[holds.index(best)])

        pod_set = gang.pod_sets[index]
        # Nodes that have none of a requested resource hold no room for it: a node that
        # has them all and room for a bit of a pod is the roomiest.
        order = self._order(pod_set, ranked(asked))
        ratio, node = roomiest(order.nodes) if order.nodes else (0.0, -1)
        if ratio <= 0:
            ratio, node = roomiest(self._admitting_nodes(pod_set))
        # `pods` is named only when it is what that node lacks (or all the pod asks for):
        # every pod asks for one, and saying so in every message would only add noise.
        shown = [
            (r, value)
            for r, value in asked
            if r != PODS or self.free[r][node] < value or len(asked) == 1
        ]
        room = ", ".join(_amount(r, self.free[r][node]) for r, _ in shown)
        names = {r for r, _ in shown}
        requests = Resources({r: v for r, v in pod_set.requests.items() if r in names})
        total = sum(max(p.count, 0) for p in gang.pod_sets)
        after = f" after placing {placed} of {total} pods" if placed else ""
        return Refusal(
            f"resources free in total but no node can hold pod {POD} "
            f"({requests.describe()}){after}: "
            f"largest free on a node is {room} ({self.names[node]})",
            index,
        )

    def _usable_shortfall(self, gang: Gang, index: int) -> Refusal | None:
        """The room the nodes pod set `index` may use lack in total, if they lack some."""
        pod_set = gang.pod_sets[index]
        nodes = self._admitting_nodes(pod_set)
        if len(nodes) == len(self.nodes):
            return None  # the cluster-wide aggregate covered these nodes already
        constraint = (pod_set.node_selector, pod_set.tolerations)
        needed: dict[str, int] = {}
        for other in gang.pod_sets:
            if (other.node_selector, other.tolerations) == constraint:
                for resource, value in other.requests.items():
                    needed[resource] = needed.get(resource, 0) + value * max(other.count, 0)
        clauses = []
        for resource in sorted(needed):
            column = self.free.get(resource)
            free = sum(column[n] for n in nodes) if column else 0
            if needed[resource] <= free:
                continue
            allocatable = self.allocatable.get(resource)
            capacity = sum(allocatable[n] for n in nodes) if allocatable else 0
            clauses.append(
                f"needs {_amount(resource, needed[resource])}, free "
                f"{_amount_of(resource, free)} of {format_milli(capacity, resource)}"
            )
        if not clauses:
            return None
        return Refusal("; ".join(clauses) + f" on the {len(nodes)} nodes its pods may use")


def _amount_of(resource: str, milli: int) -> str:
    return format_milli(max(milli, 0), resource)


def _amount(resource: str, milli: int) -> str:
    return f"{resource} {_amount_of(resource, milli)}"
