"""The order in which queued workloads are tried within a cycle. Pure, no I/O.

Without fair sharing (`nominal_first`): workloads that fit their queue's own nominal quota
come before those that would borrow, as in Kueue, so a queue taking back its own quota is not
met, in the same cycle, by a borrower admitted a moment earlier (it would preempt one of that
queue's workloads to get it back: a pointless preemption).

Fair sharing (`fair_order`): the order in which queues are served.

With fair sharing on, the cycle takes the next workload from the queue with the lowest
share (`Shares.share`): in `Instant` mode the weighted share of what it borrows from its
cohort now (`QuotaLedger.share`), in `Usage` mode its use over time plus what it holds
(`core.quota.history`), re-reading a queue's share after each of its admissions. Within a
queue, and between equal shares, the usual order (priority, then age) holds, except that
in `Usage` mode a BestEffortFIFO queue serves its users the same way: the next workload is
that of the user with the lowest share (`Shares.user_share`), then by the usual order.
Workloads with no queue, or whose queue cannot be resolved, come in the usual order with
share 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from dispatcher.core.model import QueueMode, Workload
from dispatcher.core.quota.flavors import request_of
from dispatcher.core.quota.model import QueueSpec
from dispatcher.core.quota.resolve import Queued, QueueProblem
from dispatcher.core.quota.tree import QuotaLedger

__all__ = ["Shares", "fair_order", "nominal_first"]


class Shares(Protocol):
    """What fair sharing compares (`core.quota.view.QuotaView` answers)."""

    def share(self, queue: str) -> float: ...

    def user_share(self, queue: str, user: str) -> float | None:
        """None: the queue does not order its users (Instant mode, or StrictFIFO)."""
        ...


def nominal_first(
    ordered: Sequence[Workload],
    resolved: Mapping[str, Queued | QueueProblem | None],
    ledger: QuotaLedger,
    specs: Mapping[str, QueueSpec],
) -> list[Workload]:
    """`ordered` (priority order) with the workloads that fit within their queue's nominal
    quota first. In a StrictFIFO queue the order is kept: once one of its workloads would
    borrow, every later one counts as borrowing too. In a BestEffortFIFO queue a smaller one
    that fits may go before a larger one that would borrow, as it may pass it anyway.
    Nominal and use are summed over the queue's flavors (which flavor a workload gets is
    decided later)."""
    left: dict[str, dict[str, int] | None] = {}  # queue -> nominal room; None: borrowing
    first: list[Workload] = []
    later: list[Workload] = []
    for workload in ordered:
        queued = resolved.get(workload.key)
        if not isinstance(queued, Queued):
            first.append(workload)
            continue
        queue = queued.queue
        if queue not in left:
            left[queue] = _nominal_room(queue, ledger, specs)
        room = left[queue]
        spec = specs.get(queue)
        request = request_of(spec.charged(workload) if spec is not None else workload.pod_sets)
        if room is not None and all(request[r] <= room[r] for r in request if r in room):
            for resource in room:
                room[resource] -= request.get(resource, 0)
            first.append(workload)
        else:
            if spec is not None and spec.strategy is QueueMode.STRICT_FIFO:
                left[queue] = None
            later.append(workload)
    return first + later


def _nominal_room(
    queue: str, ledger: QuotaLedger, specs: Mapping[str, QueueSpec]
) -> dict[str, int]:
    room: dict[str, int] = {}
    spec = specs.get(queue)
    for group in spec.groups if spec is not None else ():
        for flavor in group.flavors:
            for resource, quota in flavor.quotas.items():
                used = ledger.used(queue, (flavor.flavor, resource))
                room[resource] = room.get(resource, 0) + quota.nominal - used
    return room


def _order(workload: Workload) -> tuple[int, float, str]:
    return (-workload.priority, workload.created_at, workload.key)


def fair_order(
    ordered: Sequence[Workload],
    resolved: Mapping[str, Queued | QueueProblem | None],
    shares: Shares,
) -> Iterator[Workload]:
    """`ordered` (already in priority order) re-ordered by queue share, lazily: each
    workload is yielded before the next share is read, so admissions count."""
    lines: dict[str, _Line] = {}
    for workload in reversed(ordered):  # popped from the end: first in order last in
        queued = resolved.get(workload.key)
        name = queued.queue if isinstance(queued, Queued) else ""
        if name not in lines:
            lines[name] = _Line(name, shares, by_user=bool(name))
        lines[name].add(workload)

    def share(name: str) -> float:
        return shares.share(name) if name else 0.0

    heap = [(share(name), _order(line.next()), name) for name, line in lines.items()]
    heapq.heapify(heap)
    while heap:
        known, _, name = heapq.heappop(heap)
        served = lines[name]
        now = share(name)
        if now != known:  # it admitted since: take its place again
            heapq.heappush(heap, (now, _order(served.next()), name))
            continue
        yield served.pop()
        if served:
            heapq.heappush(heap, (share(name), _order(served.next()), name))


class _Line:
    """One queue's workloads in the order it serves them: the usual order, or, where the
    queue orders its users (`Shares.user_share`), its users' by their shares."""

    def __init__(self, queue: str, shares: Shares, *, by_user: bool) -> None:
        self.queue = queue
        self.shares = shares
        self.users: dict[str, list[Workload]] = {}  # user -> theirs, first in order last
        self.by_user = by_user and shares.user_share(queue, "") is not None

    def add(self, workload: Workload) -> None:  # called in reverse order
        self.users.setdefault(workload.user if self.by_user else "", []).append(workload)

    def __bool__(self) -> bool:
        return bool(self.users)

    def _user(self) -> str:
        if len(self.users) == 1:
            return next(iter(self.users))
        queue, shares = self.queue, self.shares

        def rank(user: str) -> tuple[float, tuple[int, float, str]]:
            return (shares.user_share(queue, user) or 0.0, _order(self.users[user][-1]))

        return min(self.users, key=rank)

    def next(self) -> Workload:
        return self.users[self._user()][-1]

    def pop(self) -> Workload:
        user = self._user()
        items = self.users[user]
        workload = items.pop()
        if not items:
            del self.users[user]
        return workload
