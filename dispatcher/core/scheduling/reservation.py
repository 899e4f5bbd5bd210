"""Reservations for heads that fit nowhere yet, and backfill around them. Pure, no I/O.

A line's head that fits no cluster now, when its line's backfill is `Declared`
(`core.model.Backfill`), is given the earliest time T it will fit (`reserve_room`). In each
cluster it may use, the dispatched work that declares a limit (`DispatchedWorkload.ends_at`,
and this cycle's own admissions: now + their limit) is let go in the order it ends, on the
cluster's room as this cycle has left it, and after each end the gang is fitted again; the
first fit gives T and the nodes, with what the gang takes on each. Work without a limit
never frees room. The earliest T wins (a tie: the first cluster by name). Everything let go
is taken back, so the room is as it was.

The nodes are then fenced for the rest of the cycle (`clusters.Fence`): a later workload
whose own declared limit ends it by T (now + limit <= T) may use any room, since it is gone
before the head needs its nodes (EASY backfill); any other is placed as if those nodes had
no room (`CycleScratch.fence_off`), though it may use the cluster's other nodes. At most one
reservation per cluster per cycle, the first in the cycle's order, and one per line. A head
that preempts, or that its quota keeps out, reserves nothing.

Beside the queueing strategies: a StrictFIFO head that reserved blocks only the work of its
line that would not be gone by its start (the rest may pass it, onto any room); under
BestEffortFIFO a reserving head holds no cluster even when starving, and no starving
workload holds a cluster where nodes are reserved (what is left there is for backfill).
With backfill off (`Backfill.NEVER`), or no limit declared anywhere, none of this happens.

T is the reservation's latest start: every rule above reads it, and it depends on nothing
but the snapshot. Its start estimate is searched for again on the same cluster with the
work ordered by when it is expected to end (`limituse.LimitUse`: the share of their limits
recent work ran, measured by the controller): never later than T, since all that ends by T
at the latest is expected to end by then. The estimate moves only what users are told; a
backfill rule on it was measured to cost gangs and small jobs wait without starting gangs
any sooner (docs/performance.md, "Reservation and backfill").

Nothing is kept between cycles: each cycle derives the reservation again from its snapshot
alone, so a restarted dispatcher derives the same one, and work backfilled into the
reserved nodes ends by T, so T does not move later on its account.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import groupby

from dispatcher.api.resources import Resources
from dispatcher.core.limituse import LimitUse
from dispatcher.core.mentions import mention_all
from dispatcher.core.model import Backfill, ClusterSnapshot, DispatchedWorkload, Workload
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling.clusters import CycleScratch, Fence, backfills
from dispatcher.core.scheduling.evictions import evict, lift
from dispatcher.core.scheduling.nodeorder import Requests
from dispatcher.core.scheduling.placement import ClusterRoom, Gang, Placed
from dispatcher.core.visibility import rfc3339

__all__ = [
    "Ending",
    "ReservationInfo",
    "Reservations",
    "declared_lines",
    "earliest_start",
    "endings",
    "fenced_words",
    "reserve_room",
    "reserved_words",
]

NO_RECORD = LimitUse()  # every end at its limit

UNLIMITED = 10**12  # pods a node holds of a pod that asks for nothing

NAMED = 3
"""How many of the AppWrappers it waits for a head's message names (then "and N more")."""


@dataclass(frozen=True, slots=True)
class ReservationInfo:
    """A head's reservation: in `cluster`, from `latest` (seconds since the epoch: where the
    declared limits of the work it waits for end it at the latest, T), the `nodes` with what
    its gang takes on each; `ending`: the AppWrappers whose declared ends free room on those
    nodes, in the order they end; `start`: its start estimate (`Reservations.use`), at most
    `latest`."""

    cluster: str
    start: float
    nodes: tuple[tuple[str, Resources], ...]
    ending: tuple[str, ...]
    latest: float


@dataclass(frozen=True, slots=True)
class Ending:
    """Work that ends at `at` (by its declared limit, or as expected): dispatched work of
    the snapshot, or a gang this cycle placed."""

    at: float
    key: str
    holds: DispatchedWorkload | Placed

    def release(self, state: ClusterRoom) -> Callable[[], None]:
        """Let it go on `state`; the function returned takes its room again."""
        if isinstance(self.holds, Placed):
            return lift(state, self.holds)
        return evict(state, self.holds)

    def nodes(self, state: ClusterRoom) -> set[int]:
        """The nodes (indices) it holds room on in `state`."""
        if isinstance(self.holds, Placed):
            return {node for _, node, _, _ in self.holds.applied}
        held = {state.index[name] for name, _ in self.holds.usage if name in state.index}
        reserved = state.reserved.get(self.key)  # its pods not bound yet, where charged
        if reserved is not None:
            held.update(node for _, node, _, _ in reserved[0])
        return held


@dataclass(frozen=True, slots=True)
class _Found:
    """What `earliest_start` found: the start, the nodes (indices), what the gang takes on
    each (by name), and the work it waits for."""

    start: float
    nodes: tuple[int, ...]
    taken: tuple[tuple[str, Resources], ...]
    ending: tuple[str, ...]


@dataclass(slots=True)
class Reservations:
    """One cycle's reservations, made in its order: at most one per line (its head's) and
    one per cluster."""

    declared: Mapping[str, bool]  # line -> its backfill is Declared (`declared_lines`)
    use: LimitUse = field(default_factory=LimitUse)
    """How much of their limits recent work ran: start estimates are made with it."""
    before: Mapping[str, ReservationInfo] = field(default_factory=dict)
    """The last cycle's reservations, by head (`kept_through`)."""
    made: dict[str, ReservationInfo] = field(default_factory=dict)  # by head
    lines: set[str] = field(default_factory=set)  # the lines whose head reserved
    never: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)  # see `reserve_room`
    passable: dict[str, float] = field(default_factory=dict)
    """StrictFIFO: line -> the start of the reservation its blocking head holds."""

    def reserve(
        self,
        cycle: CycleScratch,
        line: str,
        head: Workload,
        gang: Gang,
        usable: Sequence[ClusterSnapshot],
    ) -> ReservationInfo | None:
        """Reserve for `head`, the head of `line`, if the line's backfill is Declared and
        nothing of it reserved yet this cycle (with quotas a later one may be tried, and
        reserve, before its head); None if it may not or finds no room (`reserve_room`)."""
        if not self.declared.get(line, False) or line in self.lines:
            return None
        found = reserve_room(cycle, head.key, gang, usable, self.never, self.use)
        if found is None:
            found = kept_through(cycle, head.key, self.before.get(head.key), usable)
        if found is not None:
            self.made[head.key] = found
            self.lines.add(line)
        return found

    def passes(self, line: str, workload: Workload, now: float) -> bool:
        """Whether `workload` may pass the StrictFIFO head of `line`: it holds a
        reservation, and `workload` is gone by its start."""
        start = self.passable.get(line)
        return start is not None and backfills(workload, now, start)


KEPT_PAST_START_SECONDS = 60.0
"""How long past its latest start a reservation the head does not fit yet is kept
(`kept_through`)."""


def kept_through(
    cycle: CycleScratch,
    key: str,
    before: ReservationInfo | None,
    usable: Sequence[ClusterSnapshot],
) -> ReservationInfo | None:
    """The head's reservation of the last cycle, kept as it was when the search finds none:
    the work it waited for ended (at its limit, which the dispatcher enforces a moment
    before the second the search counts to, or earlier) and its pods are going, and pods on
    their way out (terminating, or of an AppWrapper that ended) are no running work with a
    declared end the search could let go. Without this, the reservation would lapse in those
    seconds and work without a limit could take the nodes. Kept at most
    KEPT_PAST_START_SECONDS past its latest start, on the same nodes, if they are still
    there."""
    if before is None or cycle.now - before.latest > KEPT_PAST_START_SECONDS:
        return None
    cluster = next((c for c in usable if c.name == before.cluster), None)
    if cluster is None or not cluster.reachable or cluster.name in cycle.held:
        return None
    if cluster.name in cycle.fences:
        return None
    index = cycle.state(cluster).index
    if any(name not in index for name, _ in before.nodes):
        return None
    nodes = tuple(sorted(index[name] for name, _ in before.nodes))
    cycle.fence(cluster.name, Fence(key, max(cycle.now, before.latest), nodes))
    return before


def declared_lines(backfill: Backfill, quotas: QuotaView | None) -> dict[str, bool]:
    """Whether each line's backfill is `Declared`: a cluster queue's own setting, and for ""
    (work with no queue) `backfill`."""
    declared: dict[str, bool] = {}
    if quotas is not None:
        for name, spec in quotas.setup.queues.items():
            declared[name] = spec.backfill is Backfill.DECLARED
    declared[""] = backfill is Backfill.DECLARED  # (a cluster queue is never named "")
    return declared


def endings(
    cluster: ClusterSnapshot,
    placed: Iterable[tuple[Workload, Placed]],
    now: float,
    use: LimitUse = NO_RECORD,
) -> list[Ending]:
    """What ends in `cluster` by a declared limit, in the order it ends (then by key): its
    dispatched work with an `ends_at`, and `placed`, this cycle's admissions there; each
    at its limit, or when `use` expects it to end."""
    found = []
    for admitted in cluster.admitted:
        if (ends_at := admitted.ends_at) is not None:
            started = admitted.dispatched_at
            at = use.expected_end(started, ends_at - started, now)
            found.append(Ending(at, admitted.key, admitted))
    for workload, placement in placed:
        if (limit := workload.duration_limit) is not None:
            found.append(Ending(use.expected_end(now, limit, now), workload.key, placement))
    found.sort(key=lambda e: (e.at, e.key))
    return found


class _Tally:
    """Per pod set of a gang, how many of its pods the free room of each node it may use
    holds, and the sum: kept as work is let go, it says cheaply when the gang cannot fit
    yet (a pod set whose nodes hold fewer than its pods), so that the full placement is
    tried only when it may succeed (for a gang of one pod set, exactly when it does)."""

    def __init__(self, state: ClusterRoom, gang: Gang) -> None:
        self.state = state
        self.sets = [
            (gang.requests[i], p.count, set(state.admitting(p)))
            for i, p in enumerate(gang.pod_sets)
            if p.count > 0
        ]
        self.holds = [{n: self._holds(n, asked) for n in nodes} for asked, _, nodes in self.sets]
        self.totals = [sum(holds.values()) for holds in self.holds]
        self.short = sum(t < c for t, (_, c, _) in zip(self.totals, self.sets, strict=True))
        """How many pod sets cannot place all their pods: while any, the gang does not fit."""

    def _holds(self, node: int, asked: Requests) -> int:
        free = self.state.free
        counts = [free[r][node] // v if r in free else 0 for r, v in asked]
        return max(min(counts), 0) if counts else UNLIMITED

    def moved(self, nodes: Iterable[int]) -> None:
        """The free room of `nodes` changed."""
        for index, (asked, _, admitting) in enumerate(self.sets):
            holds = self.holds[index]
            for node in nodes:
                if node in admitting:
                    now = self._holds(node, asked)
                    before = self.totals[index]
                    self.totals[index] = after = before + now - holds[node]
                    holds[node] = now
                    count = self.sets[index][1]
                    self.short += (after < count) - (before < count)


def earliest_start(
    state: ClusterRoom,
    gang: Gang,
    ending: Sequence[Ending],
    now: float,
    *,
    before: float = math.inf,
) -> _Found | None:
    """The first time, as the work of `ending` (in order) ends, that the gang fits `state`,
    and where; None if it fits not even once all of it ended, or not before `before`.
    `state` is left as it was. Work that ends by `now` already (past its limit, or its
    expected end, still there) frees its room now."""
    undos: list[Callable[[], None]] = []
    released: list[Ending] = []
    tally = _Tally(state, gang)
    try:
        for at, group in groupby(ending, key=lambda e: e.at):
            if max(at, now) >= before:
                return None
            for end in group:  # all that ends at the same instant goes together
                undos.append(end.release(state))
                released.append(end)
                tally.moved(end.nodes(state))
            if tally.short:
                continue
            placed = state.place(gang, explain=False)
            if isinstance(placed, Placed):
                nodes, taken = _taken(placed)
                placed.undo()
                return _Found(max(at, now), nodes, taken, _waited_for(state, released, nodes))
        return None
    finally:
        for undo in reversed(undos):
            undo()


def _waited_for(
    state: ClusterRoom, released: list[Ending], nodes: tuple[int, ...]
) -> tuple[str, ...]:
    """The keys of the work let go that held room on `nodes` (all of it, if none did: the
    room it gave back was the aggregate's)."""
    on = set(nodes)
    named = tuple(end.key for end in released if end.nodes(state) & on)
    return named or tuple(end.key for end in released)


def _taken(placed: Placed) -> tuple[tuple[int, ...], tuple[tuple[str, Resources], ...]]:
    """The nodes (indices) a placement uses, and (node name, what it takes there)."""
    per_node: dict[int, dict[str, int]] = {}
    for _, node, requests, count in placed.applied:
        on_node = per_node.setdefault(node, {})
        for resource, value in requests:
            on_node[resource] = on_node.get(resource, 0) + value * count
    nodes = tuple(sorted(per_node))
    return nodes, tuple((placed.node_names[n], Resources(per_node[n])) for n in nodes)


def reserve_room(
    cycle: CycleScratch,
    key: str,
    gang: Gang,
    usable: Sequence[ClusterSnapshot],
    never: set[tuple[str, tuple[str, ...]]],
    use: LimitUse,
) -> ReservationInfo | None:
    """Reserve for head `key` the earliest room its gang will have in one of `usable`, and
    fence it; None when it has none (no cluster frees enough by declared limits). Clusters
    held this cycle, reserved already, unreachable, or too small for it are not tried, nor
    those in `never` for its shape (found this cycle to free too little even once all their
    limits ended: room only shrinks in a cycle, and what it admits ends as it came)."""
    best: tuple[ClusterSnapshot, _Found] | None = None
    for cluster in usable:
        name = cluster.name
        if not cluster.reachable or name in cycle.held or name in cycle.fences:
            continue
        if (name, gang.shape) in never or not cycle.could_ever_fit(gang, cluster):
            continue
        ending = endings(cluster, cycle.placed.get(name, ()), cycle.now)
        if not ending:
            continue
        # Only a strictly earlier start can win over the best found (ties: cluster order).
        before = math.inf if best is None else best[1].start
        found = earliest_start(cycle.state(cluster), gang, ending, cycle.now, before=before)
        if found is not None:
            best = (cluster, found)
        elif before == math.inf:
            never.add((name, gang.shape))
    if best is None:
        return None
    cluster, found = best
    cycle.fence(cluster.name, Fence(key, found.start, found.nodes))
    start = found.start
    if use.shares:  # the same search with the ends expected: never later (module docstring)
        expected = endings(cluster, cycle.placed.get(cluster.name, ()), cycle.now, use)
        soonest = earliest_start(cycle.state(cluster), gang, expected, cycle.now)
        start = min(start, soonest.start) if soonest is not None else start
    return ReservationInfo(cluster.name, start, found.taken, found.ending, found.start)


def reserved_words(key: str, info: ReservationInfo) -> str:
    """What head `key`'s wait message ends with: its reservation from its latest start (a
    bound that the snapshot alone gives, so the same after a restart), and whom it waits for
    (named for its own namespace, `core.mentions`)."""
    count = len(info.nodes)
    nodes = f"{count} node{'' if count == 1 else 's'}"
    words = f"; reserved {nodes} in cluster {info.cluster} from {rfc3339(info.latest)}"
    ending = info.ending
    if not ending:
        return words
    named = mention_all(ending[:NAMED], to=key)
    if len(ending) > NAMED:
        named += f" and {len(ending) - NAMED} more"
    verb = "ends" if len(ending) == 1 else "end"
    return f"{words} (fits when {named} {verb}: declared limits)"


def fenced_words(cycle: CycleScratch, workload: Workload, usable: Sequence[ClusterSnapshot]) -> str:
    """What a workload kept off reserved nodes adds to its wait message ("" for none): no
    name, time or amount, so that its status moves with its own situation only
    (`core.waiting`)."""
    fenced = cycle.fenced(workload)
    where = [c.name for c in usable if c.name in fenced] if fenced else []
    if not where:
        return ""
    label = "cluster" if len(where) == 1 else "clusters"
    if workload.duration_limit is None:
        why = "it declares no limit (dispatchDuration.limit)"
    else:
        why = "its declared limit runs past the reservation's start"
    return f"; nodes in {label} {', '.join(where)} are reserved for work ahead of it, and {why}"
