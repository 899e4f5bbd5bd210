"""Prometheus metrics of a running manager, in the text format (prometheus-client).

`recorder.Recorder` holds what is observed as it happens (histograms, counters by reason,
the leader gauge, build_info, process collectors) in the manager's own registry;
`collector.ManagerCollector` adds, at scrape time, what the controller counts anyway and
the queues' gauges from the last view the controller published (`view.MetricsFigures`, kept
by `figures.Figures`: a scrape computes nothing). `render` is what health.py serves at
/metrics. Nothing here imports the controller (an import contract keeps it so): the
controller builds the views and its manager satisfies `view.Counted`.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import generate_latest

from dispatcher.metrics.collector import ManagerCollector
from dispatcher.metrics.figures import Figures, count_pending
from dispatcher.metrics.recorder import Recorder
from dispatcher.metrics.view import Counted, MetricsFigures, PendingFigures, QueueFigures


class Recorded(Protocol):
    """What `render` reads: the manager's recorder."""

    @property
    def recorder(self) -> Recorder: ...


def render(manager: Recorded) -> str:
    """The manager's registry as Prometheus text."""
    return generate_latest(manager.recorder.registry).decode()


__all__ = [
    "Counted",
    "Figures",
    "ManagerCollector",
    "MetricsFigures",
    "PendingFigures",
    "QueueFigures",
    "Recorder",
    "count_pending",
    "render",
]
