"""What /metrics reads at scrape time: the manager's counters and its queues' gauges.

No I/O of its own, nothing computed over the AppWrappers, and no call into the controller's
parts: the counters are ones the controller keeps anyway and the gauges are read from the
last `MetricsFigures` it published (view.py: the queues as their status was last computed,
the pending work's figures as the leader's timer last counted them), both through the
narrow `Counted` the manager satisfies. Histograms are not here: the recorder observes
them where the fact is known.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dispatcher.core.pending import PendingStatus
from dispatcher.metrics.recorder import PREFIX
from dispatcher.metrics.view import Counted, MetricsFigures, QueueFigures

RESOURCE_LABELS = ["cohort", "cluster_queue", "flavor", "resource"]
DEPRECATED = "Deprecated, removed in the next release: read {}. "


class ManagerCollector(Collector):
    def __init__(self, manager: Counted) -> None:
        self._manager = manager

    def describe(self) -> list[Metric]:
        # Registered while the manager is still being built: nothing to read yet.
        return []

    def collect(self) -> Iterator[Metric]:
        manager = self._manager
        states = GaugeMetricFamily(
            f"{PREFIX}_appwrappers", "AppWrappers by status.state.", labels=["state"]
        )
        for state, count in sorted((+manager.states).items()):
            states.add_metric([state], count)
        yield states
        yield CounterMetricFamily(
            f"{PREFIX}_cycles", "Scheduling cycles run.", value=manager.cycles
        )
        yield CounterMetricFamily(
            f"{PREFIX}_preemptions",
            "AppWrappers chosen as preemption victims.",
            value=manager.preemptions,
        )
        view = manager.metrics_view  # one view for the whole scrape
        yield from _api_metrics(manager)
        yield from _queue_metrics(view.queues)
        yield from _pending_metrics(view)
        yield from _deprecated_queue_metrics(manager, view.queues)
        finished = manager.finished
        yield CounterMetricFamily(
            f"{PREFIX}_lifecycles",
            "AppWrappers that finished (Completed or Failed); the hop counters sum over them.",
            value=finished["count"],
        )
        for hop, what in (
            ("reconciles", "Reconciles"),
            ("cycles", "Scheduling cycles that decided about it"),
            ("writes", "Status writes"),
        ):
            yield CounterMetricFamily(
                f"{PREFIX}_lifecycle_{hop}",
                f"{what} per AppWrapper, summed over the AppWrappers that finished.",
                value=finished[hop],
            )


def _api_metrics(manager: Counted) -> Iterator[Metric]:
    stats = manager.request_stats
    requests = CounterMetricFamily(
        f"{PREFIX}_api_requests",
        "API requests made to the hub, by verb, resource and HTTP code (<error>: no answer).",
        labels=["verb", "resource", "code"],
    )
    for (verb, resource, code), count in sorted(stats.codes.items()):
        requests.add_metric([verb, resource, code], count)
    yield requests
    yield from stats.latency.collect()


def _queue_metrics(view: QueueFigures) -> Iterator[Metric]:
    """Per cluster queue and AppQueue, as their status last showed them; quotas as set."""
    queues = view.specs
    gauges = {
        name: GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["cluster_queue"])
        for name, text in (
            ("admitted_active_workloads", "AppWrappers admitted (Dispatched) holding quota."),
            (
                "reserving_active_workloads",
                "AppWrappers holding quota: admitted, and requeued ones whose pods still run.",
            ),
        )
    }
    by_status = GaugeMetricFamily(
        f"{PREFIX}_cluster_queue_status",
        "1 for the cluster queue's status: active (can admit) or pending (inactive, stopped).",
        labels=["cluster_queue", "status"],
    )
    usage, borrowed = (
        GaugeMetricFamily(f"{PREFIX}_cluster_queue_resource_{name}", text, labels=RESOURCE_LABELS)
        for name, text in (
            ("usage", "Quota in use (in units of the resource: cores, bytes, devices)."),
            ("borrowed", "The part of the usage above the nominal quota, borrowed."),
        )
    )
    for queue, summary in sorted(view.summaries.items()):
        spec = queues.get(queue)
        cohort = (spec.cohort if spec else None) or ""
        gauges["admitted_active_workloads"].add_metric([queue], summary.admitted)
        gauges["reserving_active_workloads"].add_metric([queue], summary.reserving)
        for status in ("active", "pending"):
            by_status.add_metric(
                [queue, status], 1 if (status == "active") == summary.active else 0
            )
        for (flavor, resource), amount in sorted(summary.usage.items()):
            usage.add_metric([cohort, queue, flavor, resource], amount / 1000)
            lent = summary.borrowed.get((flavor, resource), 0)
            borrowed.add_metric([cohort, queue, flavor, resource], lent / 1000)
    yield from gauges.values()
    yield by_status
    yield usage
    yield borrowed
    limits = {
        name: GaugeMetricFamily(f"{PREFIX}_cluster_queue_{name}", text, labels=RESOURCE_LABELS)
        for name, text in (
            ("nominal_quota", "The cluster queue's nominal quota per flavor and resource."),
            ("borrowing_limit", "How much more it may borrow (absent: no limit)."),
            ("lending_limit", "How much of its quota it may lend (absent: all of it)."),
        )
    }
    for queue, spec in sorted(queues.items()):
        for group in spec.groups:
            for quotas in group.flavors:
                for resource, quota in sorted(quotas.quotas.items()):
                    labels = [spec.cohort or "", queue, quotas.flavor, resource]
                    limits["nominal_quota"].add_metric(labels, quota.nominal / 1000)
                    if quota.borrowing_limit is not None:
                        limits["borrowing_limit"].add_metric(labels, quota.borrowing_limit / 1000)
                    if quota.lending_limit is not None:
                        limits["lending_limit"].add_metric(labels, quota.lending_limit / 1000)
    yield from limits.values()
    yield from _budget_and_user_metrics(view)
    local = GaugeMetricFamily(
        f"{PREFIX}_local_queue_admitted_active_workloads",
        "AppWrappers admitted through the AppQueue and holding quota.",
        labels=["name", "namespace"],
    )
    for key, summary in sorted(view.local_summaries.items()):
        namespace, _, name = key.partition("/")
        local.add_metric([name, namespace], summary.admitted)
    yield local


def _budget_and_user_metrics(view: QueueFigures) -> Iterator[Metric]:
    """Budgets spent and left; the heaviest users' use over time (bounded per queue)."""
    labels = ["cluster_queue", "resource"]
    spent = GaugeMetricFamily(
        f"{PREFIX}_cluster_queue_budget_spent_hours",
        "What the cluster queue spent of its budget this period, in resource-hours.",
        labels=labels,
    )
    left = GaugeMetricFamily(
        f"{PREFIX}_cluster_queue_budget_remaining_hours",
        "What is left of the cluster queue's budget this period, in resource-hours.",
        labels=labels,
    )
    for queue, (resource, hours, remaining) in sorted(view.budgets.items()):
        spent.add_metric([queue, resource], hours)
        left.add_metric([queue, resource], remaining)
    yield spent
    yield left
    users = GaugeMetricFamily(
        f"{PREFIX}_cluster_queue_user_usage",
        "Fair sharing by use: a user's average use of a resource in the cluster queue over"
        " time (decayed with the half-life), for its heaviest users only.",
        labels=["cluster_queue", "user", "resource"],
    )
    for queue, rows in sorted(view.users.items()):
        for user, resource, rate in rows:
            users.add_metric([queue, user, resource], rate)
    yield users


def _pending_metrics(view: MetricsFigures) -> Iterator[Metric]:
    """Queued AppWrappers per cluster queue ("" without queues) and AppQueue, by status,
    as last computed."""
    figures, queues = view.pending, view.queues
    queued, local = figures.queued, figures.local
    every = (PendingStatus.ACTIVE, PendingStatus.INADMISSIBLE)
    family = GaugeMetricFamily(
        f"{PREFIX}_pending_workloads",
        "Queued AppWrappers per cluster queue: active (could be admitted when room frees) or"
        " inadmissible (waits for quota, its queue, or a matching cluster).",
        labels=["cluster_queue", "status"],
    )
    for queue in sorted({q for q, _ in queued} | set(queues.summaries)):
        for status in every:
            family.add_metric([queue, status], queued.get((queue, status), 0))
    yield family
    family = GaugeMetricFamily(
        f"{PREFIX}_local_queue_pending_workloads",
        "Queued AppWrappers per AppQueue, by the same status.",
        labels=["name", "namespace", "status"],
    )
    for key in sorted({k for k, _ in local} | set(queues.local_summaries)):
        namespace, _, name = key.partition("/")
        for status in every:
            family.add_metric([name, namespace, status], local.get((key, status), 0))
    yield family


def _deprecated_queue_metrics(manager: Counted, view: QueueFigures) -> Iterator[Metric]:
    """The names before Kueue's, label `queue`: kept one release so alerts keep firing."""
    summaries = view.summaries
    families = {
        name: GaugeMetricFamily(
            f"{PREFIX}_queue_{name}", DEPRECATED.format(instead) + text, labels=["queue"]
        )
        for name, instead, text in (
            ("pending", "pending_workloads", "AppWrappers waiting in the cluster queue."),
            ("admitted", "admitted_active_workloads", "AppWrappers admitted in the queue."),
            ("active", "cluster_queue_status", "1 when the cluster queue can admit."),
        )
    }
    usage, borrowed = (
        GaugeMetricFamily(
            f"{PREFIX}_queue_{name}",
            DEPRECATED.format(f"cluster_queue_resource_{name}") + text,
            labels=["queue", "flavor", "resource"],
        )
        for name, text in (("usage", "Quota in use."), ("borrowed", "Quota borrowed."))
    )
    for queue, summary in sorted(summaries.items()):
        families["pending"].add_metric([queue], summary.pending)
        families["admitted"].add_metric([queue], summary.admitted)
        families["active"].add_metric([queue], 1 if summary.active else 0)
        for (flavor, resource), amount in sorted(summary.usage.items()):
            usage.add_metric([queue, flavor, resource], amount / 1000)
            borrowed.add_metric(
                [queue, flavor, resource], summary.borrowed.get((flavor, resource), 0) / 1000
            )
    yield from families.values()
    yield usage
    yield borrowed
    preemptions = CounterMetricFamily(
        f"{PREFIX}_queue_preemptions",
        DEPRECATED.format("preempted_workloads_total") + "Victims chosen for the queue.",
        labels=["queue"],
    )
    for queue, count in sorted(manager.preemptions_by_queue.items()):
        preemptions.add_metric([queue], count)
    yield preemptions
