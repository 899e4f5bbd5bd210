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


def render(manager: Manager) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ManagerCollector(manager))
    return generate_latest(registry).decode()
