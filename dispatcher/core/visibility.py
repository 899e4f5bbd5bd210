"""What waits where, in the order the scheduler takes it: positions and start estimates.

Pure, no I/O, no clock reads (time comes in as `now`). The controller hands in the pending
AppWrappers in the order the last scheduling cycle took them (`Waiting`, with the cluster
queue and AppQueue each resolved to and the reason it waits) and what holds room now
(`Occupant`); `pending_view` gives every pending AppWrapper its positions (overall, in its
cluster queue, in its AppQueue) and an `Eta` with its basis.

The estimate is a slot model, kept simple on purpose so that its basis can be said in one
line: in each cluster queue (capacity-only work is one more line, ""), the first pending
AppWrapper starts when the first thing running there ends, the second when the next ends,
and so on; an AppWrapper that starts this way ends after its own expected duration. An end
is known from the durations observed in the same queue and kind (`Durations`, a small
rolling record; then the start is "expected", never later than a limit allows) or else from
a `dispatchDuration` limit (then it is "at the latest" that time). When the next end in
line is not known, neither is the start. The model ignores sizes (a large gang may need
several ends); the accuracy benchmark (benchmarks/eta_bench.py) measures how far off that
leaves it. A gang the scheduler reserved nodes for (`Waiting.reserved`) needs no slot:
its start is the reservation's, where the work it waits for is expected to end by the share
of their limits recent work ran (`Durations.limit_use`), and never later than their
declared limits allow (`Reserved.latest`); its pending entry names the nodes.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import lru_cache
from statistics import median
from typing import NamedTuple

from dispatcher.api.models import Reason
from dispatcher.core.limituse import LimitUse
from dispatcher.core.mentions import KEY, hide, namespace_of
from dispatcher.core.quota.model import QuotaSetup

__all__ = [
    "Durations",
    "Eta",
    "Occupant",
    "Pending",
    "PendingView",
    "Waiting",
    "audiences",
    "named_namespaces",
    "pending_view",
    "redacted",
]

CAPACITY_ONLY = ""
"""The line of AppWrappers that have no queue (admitted on capacity alone)."""

RECORD_SIZE = 32
"""Durations kept per (queue, kind): recent enough to follow a change of workload."""

LIMIT_RECORD_SIZE = 128
"""Shares of their limit kept, across queues: the reservations' start estimates."""


@dataclass(frozen=True, slots=True)
class Reserved:
    """Nodes reserved for a pending gang: in `cluster`, `nodes` by name, from `start` (its
    estimate) and at the latest from `latest` (seconds since the epoch)."""

    cluster: str
    nodes: tuple[str, ...]
    start: float
    latest: float


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pending AppWrapper, as the cycle took it (in order)."""

    key: str  # "namespace/name"
    priority: int
    queued_since: float  # seconds since the epoch
    cluster_queue: str = CAPACITY_ONLY
    local_queue: str = ""  # "namespace/name" of its AppQueue, "" for none
    reason: str = ""
    message: str = ""
    kind: str = ""  # the kind of its first item, for the durations record
    limit: float | None = None  # its dispatchDuration limit, seconds
    reserved: Reserved | None = None
    """Nodes reserved for it: its estimate is the reservation's, whatever the slot model
    would guess."""


@dataclass(frozen=True, slots=True)
class Occupant:
    """An AppWrapper that holds room now (dispatched or running)."""

    key: str
    started_at: float
    cluster_queue: str = CAPACITY_ONLY
    kind: str = ""
    limit: float | None = None


@dataclass(frozen=True, slots=True)
class Eta:
    """When it may start (None: unknown), and why that time."""

    at: float | None
    basis: str
    latest: bool = False  # `at` is a bound (from dispatchDuration limits), not a guess
    after: str = ""  # the key of the AppWrapper the basis names ("" for none)


@dataclass(frozen=True, slots=True)
class Pending:
    key: str
    priority: int
    queued_since: float
    cluster_queue: str
    local_queue: str
    reason: str
    message: str
    position: int  # 1-based, over every pending AppWrapper
    queue_position: int  # 1-based, in its cluster queue ("" for capacity-only work)
    local_position: int  # 1-based, in its AppQueue (0 when it has none)
    eta: Eta
    reserved: Reserved | None = None  # nodes reserved for it

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def name(self) -> str:
        return self.key.partition("/")[2]


@dataclass(frozen=True, slots=True)
class PendingView:
    """Every pending AppWrapper in the scheduler's order, with indexes to answer a query
    per cluster queue, AppQueue or namespace without a scan."""

    at: float
    items: tuple[Pending, ...] = ()
    by_key: Mapping[str, Pending] = field(default_factory=dict)
    by_queue: Mapping[str, tuple[Pending, ...]] = field(default_factory=dict)
    by_local: Mapping[str, tuple[Pending, ...]] = field(default_factory=dict)
    by_namespace: Mapping[str, tuple[Pending, ...]] = field(default_factory=dict)
    active: frozenset[str] = frozenset()
    """The keys of what held room: a basis or a wait message may name one (`redacted`)."""


class Durations:
    """How long AppWrappers ran, per (cluster queue, kind): the last `RECORD_SIZE` of each;
    and, of those with a declared limit, the share of it they ran: the last
    `LIMIT_RECORD_SIZE`, across queues. A plain in-memory record (a restart starts it empty;
    limits still give bounds)."""

    def __init__(self, size: int = RECORD_SIZE) -> None:
        self._size = size
        self._seen: dict[tuple[str, str], deque[float]] = {}
        self._shares: deque[float] = deque(maxlen=LIMIT_RECORD_SIZE)
        self._use: LimitUse | None = None

    def observe(self, queue: str, kind: str, seconds: float, limit: float | None = None) -> None:
        if seconds < 0:
            return
        if limit is not None and limit > 0:
            self._shares.append(seconds / limit)
            self._use = None
        for where in ((queue, kind), (queue, ""), ("*", kind)):
            record = self._seen.get(where)
            if record is None:
                record = self._seen[where] = deque(maxlen=self._size)
            record.append(seconds)

    def limit_use(self) -> LimitUse:
        """The shares of their limits recent work ran (`core.limituse`)."""
        if self._use is None:
            self._use = LimitUse.of(self._shares)
        return self._use

    def expected(self, queue: str, kind: str) -> float | None:
        """The median of the closest record: same queue and kind, same queue, same kind."""
        for where in ((queue, kind), (queue, ""), ("*", kind)):
            record = self._seen.get(where)
            if record:
                return float(median(record))
        return None


def _reserved_eta(start: float, latest: float | None, durations: Durations) -> Eta:
    """The estimate of a gang with nodes reserved from `start`, `latest` at the latest."""
    if latest is None or latest <= start:
        basis = f"nodes reserved for it from {clock(start)} (declared limits), at the latest"
        return Eta(start, basis, latest=True)
    typical = durations.limit_use().typical()
    ran = "" if typical is None else f": recent work ran {typical:.0%} of its limit (median)"
    basis = (
        f"nodes reserved for it, expected from {clock(start)} (declared limits{ran}), "
        f"at the latest {clock(latest)}"
    )
    return Eta(start, basis)


class _End(NamedTuple):
    """When something running ends (inf: unknown); a tuple, so that the heap compares fast."""

    at: float
    key: str
    latest: bool


class _Expected:
    """`Durations.expected`, asked once per (queue, kind) in one view."""

    def __init__(self, durations: Durations) -> None:
        self._durations = durations
        self._known: dict[tuple[str, str], float | None] = {}

    def __call__(self, queue: str, kind: str) -> float | None:
        where = (queue, kind)
        if where not in self._known:
            self._known[where] = self._durations.expected(queue, kind)
        return self._known[where]


def _end_of(
    key: str, start: float, queue: str, kind: str, limit: float | None, durations: _Expected
) -> _End:
    """When it ends: after the durations observed (no later than its limit), else at its
    limit (a bound), else unknown (inf)."""
    expected = durations(queue, kind)
    if expected is not None and (limit is None or expected < limit):
        return _End(start + expected, key, False)
    if limit is not None:
        return _End(start + limit, key, True)
    return _End(float("inf"), key, False)


def _seconds(at: float) -> int:
    """Whole seconds as `datetime.fromtimestamp` counts them (it rounds the fraction to the
    microsecond first), for times since the epoch."""
    fraction, whole = math.modf(at)
    return int(whole) + (1 if round(fraction * 1e6) >= 1_000_000 else 0)


@lru_cache(maxsize=64)
def _day(day: int) -> str:
    return datetime.fromtimestamp(day * 86400, UTC).strftime("%Y-%m-%d")


def rfc3339(at: float) -> str:
    """`at` as Kubernetes writes times (UTC, to the second). Without strftime per call:
    a list of 10,000 AppWrappers writes 20,000 of them."""
    day, second = divmod(_seconds(at), 86400)
    hour, rest = divmod(second, 3600)
    return f"{_day(day)}T{hour:02d}:{rest // 60:02d}:{rest % 60:02d}Z"


def clock(at: float) -> str:
    """A time of day as the basis says it (UTC, to the minute)."""
    second = _seconds(at) % 86400
    return f"{second // 3600:02d}:{second % 3600 // 60:02d} UTC"


def _lines(
    order: Sequence[Waiting], active: Iterable[Occupant], durations: Durations, now: float
) -> dict[str, Eta]:
    """The slot model of the module docstring, per cluster queue."""
    expected = _Expected(durations)
    ends: dict[str, list[_End]] = {}
    for running in active:
        end = _end_of(
            running.key,
            running.started_at,
            running.cluster_queue,
            running.kind,
            running.limit,
            expected,
        )
        ends.setdefault(running.cluster_queue, []).append(end)
    for line in ends.values():
        heapq.heapify(line)
    etas: dict[str, Eta] = {}
    for waiting in order:
        if waiting.reason == Reason.QUEUE_NOT_READY:
            etas[waiting.key] = Eta(None, f"unknown: {waiting.message}")
            continue
        heap = ends.get(waiting.cluster_queue) or []
        if waiting.reserved is not None:
            start = max(now, waiting.reserved.start)
            etas[waiting.key] = _reserved_eta(start, waiting.reserved.latest, durations)
            if heap:  # it takes the slot it waited for, as any other: those behind wait on it
                heapq.heappop(heap)
                own = _end_of(
                    waiting.key, start, waiting.cluster_queue, waiting.kind, waiting.limit, expected
                )
                heapq.heappush(heap, own)
            continue
        if not heap:
            where = waiting.cluster_queue or "capacity-only work"
            etas[waiting.key] = Eta(
                None, f"unknown: nothing runs in {where} whose end would free room"
            )
            continue
        first = heapq.heappop(heap)
        if first.at == float("inf"):
            heapq.heappush(heap, first)  # every later one waits behind it too
            etas[waiting.key] = Eta(
                None, f"unknown: nothing ahead has a known end ({first.key} next)", after=first.key
            )
            continue
        start = max(now, first.at)
        if first.latest:
            basis = f"after {first.key} ends, at the latest {clock(start)}"
        else:
            basis = f"after {first.key} ends, expected {clock(start)}"
        etas[waiting.key] = Eta(start, basis, first.latest, first.key)
        own = _end_of(
            waiting.key, start, waiting.cluster_queue, waiting.kind, waiting.limit, expected
        )
        heapq.heappush(heap, _End(own.at, own.key, own.latest and first.latest))
    return etas


def pending_view(
    order: Sequence[Waiting], active: Iterable[Occupant], durations: Durations, now: float
) -> PendingView:
    """Positions and estimates of every pending AppWrapper, `order` being the cycle's."""
    active = tuple(active)
    etas = _lines(order, active, durations, now)
    in_queue: dict[str, int] = {}
    in_local: dict[str, int] = {}
    items: list[Pending] = []
    for index, waiting in enumerate(order, start=1):
        queue_position = in_queue[waiting.cluster_queue] = (
            in_queue.get(waiting.cluster_queue, 0) + 1
        )
        local_position = 0
        if waiting.local_queue:
            local_position = in_local[waiting.local_queue] = (
                in_local.get(waiting.local_queue, 0) + 1
            )
        items.append(
            Pending(
                key=waiting.key,
                priority=waiting.priority,
                queued_since=waiting.queued_since,
                cluster_queue=waiting.cluster_queue,
                local_queue=waiting.local_queue,
                reason=waiting.reason,
                message=waiting.message,
                position=index,
                queue_position=queue_position,
                local_position=local_position,
                eta=etas[waiting.key],
                reserved=waiting.reserved,
            )
        )
    by_queue: dict[str, list[Pending]] = {}
    by_local: dict[str, list[Pending]] = {}
    by_namespace: dict[str, list[Pending]] = {}
    for item in items:
        by_queue.setdefault(item.cluster_queue, []).append(item)
        if item.local_queue:
            by_local.setdefault(item.local_queue, []).append(item)
        by_namespace.setdefault(item.namespace, []).append(item)
    return PendingView(
        at=now,
        items=tuple(items),
        by_key={item.key: item for item in items},
        by_queue={k: tuple(v) for k, v in by_queue.items()},
        by_local={k: tuple(v) for k, v in by_local.items()},
        by_namespace={k: tuple(v) for k, v in by_namespace.items()},
        active=frozenset(a.key for a in active),
    )


def _keys_in(text: str, known: Callable[[str], bool]) -> Iterable[re.Match[str]]:
    return (m for m in KEY.finditer(text) if known(m[0]))


def named_namespaces(pending: Pending, known: Callable[[str], bool]) -> set[str]:
    """The namespaces of the AppWrappers its start estimate and wait message name (`known`
    tells an AppWrapper's key from any other "a/b" in the text)."""
    return {m[1] for text in (pending.eta.basis, pending.message) for m in _keys_in(text, known)}


def redacted(pending: Pending, known: Callable[[str], bool], visible: Container[str]) -> Pending:
    """`pending` as a user who sees only the namespaces in `visible` may read it: each
    AppWrapper of another namespace its estimate or wait message names becomes `OTHER`
    (`core.mentions`: the words of an AppWrapper's own messages)
    (how many, and the rest of the sentence, stay). Itself when nothing is hidden."""

    message = hide(pending.message, known=known, visible=visible)
    basis = hide(pending.eta.basis, known=known, visible=visible)
    if message == pending.message and basis == pending.eta.basis:
        return pending
    after = pending.eta.after
    if namespace_of(after) not in visible:
        after = ""
    return replace(pending, message=message, eta=replace(pending.eta, basis=basis, after=after))


def audiences(setup: QuotaSetup) -> dict[str, tuple[str, ...]]:
    """Cluster queue -> the namespaces whose users may see it: those with an AppQueue that
    points at it and that its namespaceSelector admits (work reaches a cluster queue only
    through such an AppQueue). A queue no namespace can use is absent."""
    found: dict[str, set[str]] = {}
    for (namespace, _), local in setup.local_queues.items():
        queue = setup.queues.get(local.cluster_queue)
        if queue is None or queue.namespaces is None:
            continue
        if queue.namespaces.matches(setup.namespace_labels.get(namespace, {})):
            found.setdefault(queue.name, set()).add(namespace)
    return {name: tuple(sorted(namespaces)) for name, namespaces in found.items()}
