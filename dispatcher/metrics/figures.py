"""The gauges that cost a pass over all pending work, computed by the controller on a timer
and only read by a scrape; and `Figures`, where the controller publishes the view a scrape
reads (view.py).

No I/O. `count_pending` is the pass (each pending AppWrapper resolved to its queue, with the
status of its last wait); `Figures.latest` is the last `MetricsFigures`: its pending part is
computed again by `refresh`, which the leader's manager runs every `metrics.refresh_seconds`
(`run`), its queues' part replaced by `publish_queues` when the queues' status is computed.
A scrape reads `Figures.latest` and computes nothing: however often /metrics is asked (it
may be served without authentication on the health port), the controller's loop pays at
most one pass per period. The pending figures lag the queues by at most that period.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace

import structlog

from dispatcher.core.model import Workload
from dispatcher.core.pending import PendingStatus, pending_status
from dispatcher.core.quota.resolve import Queued, QueueProblem, resolve
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.scheduling import Wait
from dispatcher.metrics.view import MetricsFigures, PendingFigures, QueueFigures


def count_pending(
    pending: Iterable[Workload], waits: Mapping[str, Wait], tree: QuotaTree
) -> PendingFigures:
    """Queued AppWrappers per cluster queue ("" without queues) and AppQueue, by status."""
    queued: Counter[tuple[str, str]] = Counter()
    local: Counter[tuple[str, str]] = Counter()
    for workload in pending:
        wait = waits.get(workload.key)
        status = pending_status(wait.reason, wait.message) if wait else PendingStatus.ACTIVE
        namespace = workload.key.partition("/")[0]
        found = resolve(namespace, workload.queue_name, tree.setup, tree)
        if isinstance(found, Queued | QueueProblem):
            queued[(found.queue, status)] += 1
            if found.local:
                local[(found.local, status)] += 1
        else:
            queued[("", status)] += 1
    return PendingFigures(dict(queued), dict(local))


class Figures:
    """The last `MetricsFigures` published, and the loop that computes its pending figures
    again."""

    def __init__(
        self,
        compute: Callable[[], PendingFigures],
        *,
        every: float,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._compute = compute
        self._every = every
        self._sleep = sleep
        self.latest = MetricsFigures()
        self.computed = 0
        """How many times the pending figures were computed (tests: a scrape adds none)."""

    def refresh(self) -> None:
        self.latest = replace(self.latest, pending=self._compute())
        self.computed += 1

    def publish_queues(self, queues: QueueFigures) -> None:
        """The queues as their status was just computed (the quotas' status loop)."""
        self.latest = replace(self.latest, queues=queues)

    async def run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception as exc:  # figures are for scrapes: never end the manager for them
                structlog.get_logger("metrics").warning("figures_failed", error=repr(exc)[:300])
            await self._sleep(self._every)
