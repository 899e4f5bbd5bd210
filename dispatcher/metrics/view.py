"""What /metrics reads, and nothing else: the frozen view the controller publishes and the
plain counters it keeps anyway.

No I/O, and no import of the controller: the controller imports this (it builds the views
and its manager satisfies `Counted`), never the other way round. A scrape reads
`Counted.metrics_view`, the last `MetricsFigures` published, and the counters as they stand;
it calls nothing that computes, so it never drives the scheduler cache or the quota tree.

The view is published at two known points, each replacing its own part (`Figures`):
- `QueueFigures`, where the queues' status is computed (the quota status loop, at most
  once a second after a change): each cluster queue's quotas and summary, each AppQueue's;
- `PendingFigures`, by the leader's timer every `metrics.refresh_seconds` (the one pass
  over all pending work, `figures.count_pending`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from dispatcher.core.quota.model import QueueSpec
from dispatcher.core.quota.summary import QueueSummary
from dispatcher.kube.client import RequestStats

TOP_USERS = 10
"""Users per cluster queue with a series of their own: bounded, whatever the number of users."""


@dataclass(frozen=True)
class PendingFigures:
    """Pending AppWrappers counted by (cluster queue, status) and (AppQueue, status)."""

    queued: Mapping[tuple[str, str], int] = field(default_factory=dict)
    local: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueFigures:
    """The queues as their status was last computed: each cluster queue's spec (its quotas,
    its cohort) by name, and the summaries of cluster queues and AppQueues ("ns/name").

    Published whole and never changed after: the summaries are the ones the status write
    used, which the quotas replace, never mutate."""

    specs: Mapping[str, QueueSpec] = field(default_factory=dict)
    summaries: Mapping[str, QueueSummary] = field(default_factory=dict)
    local_summaries: Mapping[str, QueueSummary] = field(default_factory=dict)
    budgets: Mapping[str, tuple[str, float, float]] = field(default_factory=dict)
    """Cluster queue -> (resource, hours spent, hours left) of its budget this period."""
    users: Mapping[str, tuple[tuple[str, str, float], ...]] = field(default_factory=dict)
    """Cluster queue -> (user, resource, average rate of use, in units) of its `TOP_USERS`
    users by use over time (`Usage` fair sharing)."""


@dataclass(frozen=True)
class MetricsFigures:
    """Everything a scrape reads that the controller computed: published, never computed
    at scrape time."""

    queues: QueueFigures = field(default_factory=QueueFigures)
    pending: PendingFigures = field(default_factory=PendingFigures)


class Counted(Protocol):
    """What the collector reads at scrape time (the manager satisfies it): counters the
    controller keeps anyway, read as they stand, and the last published view."""

    @property
    def states(self) -> Counter[str]:
        """AppWrappers by status.state."""
        ...

    @property
    def cycles(self) -> int: ...

    @property
    def preemptions(self) -> int: ...

    @property
    def preemptions_by_queue(self) -> Mapping[str, int]:
        """Victims chosen, by the preemptor's cluster queue."""
        ...

    @property
    def finished(self) -> Mapping[str, int]:
        """Sums of hops over the finished lives: count, reconciles, cycles, writes."""
        ...

    @property
    def request_stats(self) -> RequestStats:
        """The hub client's requests, by code, with their latency."""
        ...

    @property
    def metrics_view(self) -> MetricsFigures: ...
