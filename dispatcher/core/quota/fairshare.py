"""Fair sharing: the order in which queues that borrow are served. Pure, no I/O.

With fair sharing on, the cycle takes the next workload from the queue with the lowest
weighted share of what it borrows from its cohort (`Ledger.share`), re-reading a queue's
share after each of its admissions; within a queue, and between equal shares, the usual
order (priority, then age) holds. Workloads with no queue, or whose queue cannot be
resolved, come in the usual order with share 0.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping, Sequence

from dispatcher.core.model import Workload
from dispatcher.core.quota.resolve import Queued, QueueProblem
from dispatcher.core.quota.tree import Ledger

__all__ = ["fair_order"]


def _order(workload: Workload) -> tuple[int, float, str]:
    return (-workload.priority, workload.created_at, workload.key)


def fair_order(
    ordered: Sequence[Workload],
    resolved: Mapping[str, Queued | QueueProblem | None],
    ledger: Ledger,
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
