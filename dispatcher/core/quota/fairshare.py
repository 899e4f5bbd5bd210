"""The order in which queued workloads are tried within a cycle. Pure, no I/O.

Without fair sharing (`nominal_first`): workloads that fit their queue's own nominal quota
come before those that would borrow, as in Kueue, so a queue taking back its own quota is not
met, in the same cycle, by a borrower admitted a moment earlier (it would preempt one of that
queue's workloads to get it back: a pointless preemption).

Fair sharing (`fair_order`): the order in which queues that borrow are served.

With fair sharing on, the cycle takes the next workload from the queue with the lowest
weighted share of what it borrows from its cohort (`QuotaLedger.share`), re-reading a queue's
share after each of its admissions; within a queue, and between equal shares, the usual
order (priority, then age) holds. Workloads with no queue, or whose queue cannot be
resolved, come in the usual order with share 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence

from dispatcher.core.model import QueueMode, Workload
from dispatcher.core.quota.flavors import request_of
from dispatcher.core.quota.model import QueueSpec
from dispatcher.core.quota.resolve import Queued, QueueProblem
from dispatcher.core.quota.tree import QuotaLedger

__all__ = ["fair_order", "nominal_first"]


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
    ledger: QuotaLedger,
) -> Iterator[Workload]:
    """`ordered` (already in priority order) re-ordered by queue share, lazily: each
    workload is yielded before the next share is read, so admissions count."""
    lines: dict[str, list[Workload]] = {}
    for workload in reversed(ordered):  # popped from the end: first in order last in
        queued = resolved.get(workload.key)
        line = queued.queue if isinstance(queued, Queued) else ""
        lines.setdefault(line, []).append(workload)

    def share(line: str) -> float:
        return ledger.share(line) if line else 0.0

    heap = [(share(line), _order(items[-1]), line) for line, items in lines.items()]
    heapq.heapify(heap)
    while heap:
        known, _, line = heapq.heappop(heap)
        items = lines[line]
        now = share(line)
        if now != known:  # it admitted since: take its place again
            heapq.heappush(heap, (now, _order(items[-1]), line))
            continue
        yield items.pop()
        if items:
            heapq.heappush(heap, (share(line), _order(items[-1]), line))
