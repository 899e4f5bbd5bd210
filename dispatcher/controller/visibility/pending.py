"""What the leader knows of its queues, kept for "see the queue" (no I/O of its own).

The scheduler hands every cycle's result here (`observe`): the AppWrappers the cycle judged
in the order it took them, the queue each resolved to and why each waits, and how to list
what is pending now (`in_line_order`). On demand the two are merged: the judged work still
pending keeps the cycle's order, every other pending one (parked, woken since, or new since
that cycle) comes in by rule 3 (priority, age, name), with its last wait or, never judged
yet, the reason `AwaitingHeadOfLine`. Each pending AppWrapper is listed exactly once; the
positions are the order the scheduler takes them in. Only
references are kept then; the pending view (`core.visibility.pending_view`) is built from the last
cycle on the first question after it, and reused until the next cycle: no cycle pays for
a view nobody asks for, and no question costs a cycle; a question after work arrived or
left since (`changes`) lists again. What runs (`Occupant`) is read from
the scheduler's state at each cycle; the durations of those that finished feed the start estimates.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.api.models import Reason
from dispatcher.core.model import Workload
from dispatcher.core.queues import QueueManager, order_key
from dispatcher.core.quota.resolve import Queued, QueueProblem
from dispatcher.core.scheduling import CycleResult, Wait
from dispatcher.core.visibility import (
    Durations,
    Occupant,
    PendingView,
    Reserved,
    Waiting,
    pending_view,
)

Obj = dict[str, Any]
Found = tuple[Workload, Wait, Queued | QueueProblem | None]
Pending = Callable[[], Iterable[Found]]
"""Lists every pending workload now, in line order, with its wait and resolved queue."""
NOT_JUDGED = "not judged yet: the next scheduling cycle decides"


def in_line_order(
    queues: QueueManager,
    waits: Mapping[str, Wait],
    resolved: Mapping[str, Queued | QueueProblem | None],
    resolve: Callable[[Workload], Queued | QueueProblem | None],
) -> Iterator[Found]:
    """Every workload pending in `queues`, in the order the scheduler takes each line
    (merged across lines by rule 3), with its last wait and the queue it resolved to; one
    no cycle has judged yet gets a wait saying so and its queue resolved now."""
    lines = [queues.in_line(line) for line in queues.lines()]
    for workload in heapq.merge(*lines, key=order_key):
        key = workload.key
        wait = waits.get(key)
        if wait is None:
            yield workload, Wait(key, NOT_JUDGED, Reason.QUEUED), resolve(workload)
        else:
            yield workload, wait, resolved.get(key)


@dataclass(frozen=True, slots=True)
class _Known:
    """What the estimate needs of one AppWrapper's object, read once per start."""

    started_at: float
    kind: str
    limit: float | None
    queue: str


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def kind_and_limit(obj: Obj | None) -> tuple[str, float | None]:
    """The kind of its first item and its dispatchDuration limit (seconds), as written
    (the object is user input: anything malformed reads as unknown)."""
    spec = _map(_map(obj).get("spec"))
    items = _map(spec.get("resources")).get("GenericItems")
    kind = ""
    if isinstance(items, list) and items:
        kind = str(_map(_map(items[0]).get("generictemplate")).get("kind", ""))
    limit = _map(_map(spec.get("schedulingSpec")).get("dispatchDuration")).get("limit")
    if isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0:
        return kind, None
    return kind, float(limit)


class Visibility:
    """The last cycle's order and what runs, as a `PendingView` on demand."""

    def __init__(
        self,
        *,
        running: Callable[[], Iterator[tuple[str, float, str]]],
        current: Callable[[str], Obj | None],
        finished: Callable[[str], bool],
        changes: Callable[[], int] = lambda: 0,
    ) -> None:
        self._running = running  # (key, dispatched at, cluster queue) of what holds room
        self._current = current
        self._finished = finished
        self._changes = changes  # who is pending changed when this did
        self._listed_at = -1
        self.durations = Durations()
        self._last: tuple[CycleResult, Sequence[Workload], Pending | None] | None = None
        self._at = 0.0
        self._view: PendingView | None = None
        self._known: dict[str, _Known] = {}
        self._active: list[Occupant] = []
        self.cycles = 0

    def observe(
        self,
        result: CycleResult | None,
        pending: Sequence[Workload],
        now: float,
        pending_now: Pending | None = None,
    ) -> None:
        """A cycle ran (None: nothing is pending). Cheap, since it runs in the scheduler's
        loop: what ran is tracked (O(running)); the order is kept by reference and read on
        the first question (`view`), what is pending then listed by `pending_now`."""
        self.cycles += 1
        self._at = now
        self._view = None
        self._active = self._track()
        self._last = (result, pending, pending_now) if result is not None else None

    def _order(self) -> list[Waiting]:
        if self._last is None:
            return []
        result, pending, pending_now = self._last
        by_key = {w.key: w for w in pending}
        waits = {w.key: w for w in result.waits}
        judged = [
            (by_key[key], waits[key], result.resolved.get(key))
            for key in result.order
            if key in waits  # not admitted by that cycle
        ]
        reserved = {
            key: Reserved(i.cluster, tuple(n for n, _ in i.nodes), i.start, i.latest)
            for key, i in result.reservations.items()
        }
        if pending_now is None:
            return [self._waiting(*found, reserved) for found in judged]
        # What is pending now decides who is listed: the judged work still pending in the
        # cycle's order, the rest merged in by rule 3 (the order each line keeps).
        now = list(pending_now())
        still = {found[0].key for found in now}
        judged = [found for found in judged if found[0].key in still]
        rest = [found for found in now if found[0].key not in waits]
        merged = heapq.merge(judged, rest, key=lambda found: order_key(found[0]))
        return [self._waiting(*found, reserved) for found in merged]

    def _waiting(
        self,
        workload: Workload,
        wait: Wait,
        resolved: Queued | QueueProblem | None,
        reserved: Mapping[str, Reserved],
    ) -> Waiting:
        queue, local = _queues(resolved)
        return Waiting(
            key=workload.key,
            priority=workload.priority,
            queued_since=workload.queued_since or workload.created_at,
            cluster_queue=queue,
            local_queue=local,
            reason=str(wait.reason),
            message=wait.message,
            kind=workload.kind,
            limit=workload.duration_limit,
            reserved=reserved.get(workload.key),
        )

    def view(self) -> PendingView:
        changes = self._changes()
        if self._view is None or changes != self._listed_at:
            self._listed_at = changes
            self._view = pending_view(self._order(), self._active, self.durations, self._at)
        return self._view

    def active(self) -> list[Occupant]:
        """What held room at the last cycle."""
        return list(self._active)

    def _track(self) -> list[Occupant]:
        """What holds room now; those gone since the last cycle that finished are recorded
        in the durations (ended about now: a cycle follows the change that freed room)."""
        seen: dict[str, _Known] = {}
        for key, started_at, queue in self._running():
            known = self._known.get(key)
            if known is None or known.started_at != started_at:
                kind, limit = kind_and_limit(self._current(key))
                known = _Known(started_at, kind, limit, queue)
            seen[key] = known
        for key, known in self._known.items():
            if key not in seen and self._finished(key):
                ran = self._at - known.started_at
                self.durations.observe(known.queue, known.kind, ran, known.limit)
        self._known = seen
        return [Occupant(k, v.started_at, v.queue, v.kind, v.limit) for k, v in seen.items()]


def _queues(resolved: Queued | QueueProblem | None) -> tuple[str, str]:
    if resolved is None:
        return "", ""
    return resolved.queue, resolved.local
