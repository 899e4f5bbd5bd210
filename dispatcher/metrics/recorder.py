"""The recorder: metric objects observed where a fact becomes known.

No I/O: prometheus-client objects in the manager's own registry (one per manager, so
tests, and two managers in one process, stay apart). The manager hands it to the parts:
the scheduler observes an admission when its write lands and each cycle's length and
waits; the reconciler observes Running and every eviction. Nothing here scans the
AppWrappers: what is counted at scrape time (gauges) is in `collector.py`.
"""

from __future__ import annotations

import platform

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from dispatcher import __version__
from dispatcher.api.models import AppWrapper, AppWrapperStatus

PREFIX = "appwrapper_dispatcher"
WAIT_BUCKETS = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 43200, 86400)
"""Seconds: admission waits run from an instant (an empty queue) to hours or days."""
CYCLE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
"""Seconds: a cycle over a short queue takes a millisecond, over 10k pending about a second."""
QUEUE_LABELS = ["cluster_queue", "priority_class"]


def labels_of(aw: AppWrapper, status: AppWrapperStatus) -> tuple[str, str]:
    """(cluster_queue, priority_class): "" for none, as Kueue's labels read without them."""
    admission = status.admission
    return (admission.clusterQueue if admission else "", aw.spec.priorityClassName or "")


class Recorder:
    """One per manager; `registry` is what /metrics serves (with the scrape-time collector)."""

    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry(auto_describe=True)
        self.admission_wait = Histogram(
            f"{PREFIX}_admission_wait_time_seconds",
            "Seconds from creation, or the last requeue, until Dispatched.",
            QUEUE_LABELS,
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.until_ready = Histogram(
            f"{PREFIX}_admitted_until_ready_wait_time_seconds",
            "Seconds from Dispatched until Running (minAvailable pods running).",
            QUEUE_LABELS,
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.admitted_total = Counter(
            f"{PREFIX}_admitted_workloads",
            "AppWrappers admitted (Dispatched), each admission once.",
            QUEUE_LABELS,
            registry=registry,
        )
        self.evicted_total = Counter(
            f"{PREFIX}_evicted_workloads",
            "Dispatched AppWrappers requeued (their objects removed), by the requeue's reason.",
            ["cluster_queue", "reason"],
            registry=registry,
        )
        self.preempted_total = Counter(
            f"{PREFIX}_preempted_workloads",
            "Victims chosen by the scheduler, by the preemptor's cluster queue and the reason.",
            ["preempting_cluster_queue", "reason"],
            registry=registry,
        )
        self.runtime_lost = Counter(
            f"{PREFIX}_preempted_runtime_lost_seconds",
            "Runtime preemption victims lost (since their last declared checkpoint, or their"
            " dispatch) when their objects were removed, by the victim's cluster queue.",
            ["cluster_queue"],
            registry=registry,
        )
        self.attempts = Counter(
            f"{PREFIX}_admission_attempts",
            "Scheduling cycles over pending work: success when one admitted something.",
            ["result"],
            registry=registry,
        )
        self.attempt_seconds = Histogram(
            f"{PREFIX}_admission_attempt_duration_seconds",
            "Seconds one scheduling cycle took (snapshot, decisions, writes started).",
            ["result"],
            buckets=CYCLE_BUCKETS,
            registry=registry,
        )
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica leads (its manager runs), 0 on a standby or once fenced.",
            registry=registry,
        )
        Info(f"{PREFIX}_build", "The dispatcher's version and Python's.", registry=registry).info(
            {"version": __version__, "python": platform.python_version()}
        )
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)

    def admitted(self, aw: AppWrapper, status: AppWrapperStatus, waited: float) -> None:
        queue, priority_class = labels_of(aw, status)
        self.admission_wait.labels(queue, priority_class).observe(max(waited, 0.0))
        self.admitted_total.labels(queue, priority_class).inc()

    def running(self, aw: AppWrapper, status: AppWrapperStatus, since_dispatch: float) -> None:
        self.until_ready.labels(*labels_of(aw, status)).observe(max(since_dispatch, 0.0))

    def evicted(self, status: AppWrapperStatus, reason: str) -> None:
        admission = status.admission
        self.evicted_total.labels(admission.clusterQueue if admission else "", reason).inc()

    def lost(self, status: AppWrapperStatus, seconds: float) -> None:
        admission = status.admission
        self.runtime_lost.labels(admission.clusterQueue if admission else "").inc(seconds)

    def preempted(self, preempting_queue: str, reason: str, victims: int = 1) -> None:
        self.preempted_total.labels(preempting_queue, reason).inc(victims)

    def cycle(self, seconds: float, *, admitted: bool) -> None:
        result = "success" if admitted else "inadmissible"
        self.attempts.labels(result).inc()
        self.attempt_seconds.labels(result).observe(seconds)

    def leading(self, leads: bool) -> None:
        self.leader.set(1 if leads else 0)
