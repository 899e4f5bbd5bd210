"""Prometheus metrics of a running manager, in the text format (prometheus-client).

No I/O of its own: `render` reads the manager's counters at scrape time (health.py serves
the text). A custom collector rather than metric objects updated in place: the values are
counters the controller keeps anyway, and one registry per manager keeps tests apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from dispatcher.controller.manager import Manager


class ManagerCollector(Collector):
    def __init__(self, manager: Manager) -> None:
        self._manager = manager

    def collect(self) -> Iterator[Metric]:
        manager = self._manager
        states = GaugeMetricFamily(
            "appwrapper_dispatcher_appwrappers", "AppWrappers by status.state.", labels=["state"]
        )
        for state, count in sorted((+manager.states).items()):
            states.add_metric([state], count)
        yield states
        yield CounterMetricFamily(
            "appwrapper_dispatcher_cycles", "Scheduling cycles run.", value=manager.cycles
        )
        yield CounterMetricFamily(
            "appwrapper_dispatcher_preemptions",
            "AppWrappers chosen as preemption victims.",
            value=manager.preemptions,
        )
        yield from _queue_metrics(manager)
        requests = CounterMetricFamily(
            "appwrapper_dispatcher_api_requests",
            "API requests made to the hub.",
            labels=["verb", "resource"],
        )
        for key, count in sorted(manager.hub.stats.counts.items()):
            verb, _, resource = key.partition(" ")
            requests.add_metric([verb, resource], count)
        yield requests
        finished = manager.finished
        yield CounterMetricFamily(
            "appwrapper_dispatcher_lifecycles",
            "AppWrappers that finished (Completed or Failed); the hop counters sum over them.",
            value=finished["count"],
        )
        for hop, what in (
            ("reconciles", "Reconciles"),
            ("cycles", "Scheduling cycles that decided about it"),
            ("writes", "Status writes"),
        ):
            yield CounterMetricFamily(
                f"appwrapper_dispatcher_lifecycle_{hop}",
                f"{what} per AppWrapper, summed over the AppWrappers that finished.",
                value=finished[hop],
            )


def _queue_metrics(manager: Manager) -> Iterator[Metric]:
    """Per cluster queue, as its status last showed it (with quotas)."""
    summaries = manager.quotas.summaries
    families = {
        name: GaugeMetricFamily(f"appwrapper_dispatcher_queue_{name}", text, labels=["queue"])
        for name, text in (
            ("pending", "AppWrappers waiting in the cluster queue."),
            ("admitted", "AppWrappers admitted (dispatched) in the cluster queue."),
            ("active", "1 when the cluster queue can admit, 0 when it is inactive or stopped."),
        )
    }
    usage = GaugeMetricFamily(
        "appwrapper_dispatcher_queue_usage",
        "Quota in use (in units of the resource: cores, bytes, devices).",
        labels=["queue", "flavor", "resource"],
    )
    borrowed = GaugeMetricFamily(
        "appwrapper_dispatcher_queue_borrowed",
        "Quota in use beyond the queue's nominal quota, borrowed from its cohort.",
        labels=["queue", "flavor", "resource"],
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
        "appwrapper_dispatcher_queue_preemptions",
        "Victims chosen for preemptors of the cluster queue.",
        labels=["queue"],
    )
    for queue, count in sorted(manager.scheduler.preemptions_by_queue.items()):
        preemptions.add_metric([queue], count)
    yield preemptions


def render(manager: Manager) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ManagerCollector(manager))
    return generate_latest(registry).decode()
