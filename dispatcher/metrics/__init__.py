"""Prometheus metrics of a running manager, in the text format (prometheus-client).

`recorder.Recorder` holds what is observed as it happens (histograms, counters by reason,
the leader gauge, build_info, process collectors) in the manager's own registry;
`collector.ManagerCollector` adds, at scrape time, what the controller counts anyway and
the queues' gauges, as last computed (`figures.Figures`: a scrape computes nothing).
`render` is what health.py serves at /metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import generate_latest

from dispatcher.metrics.collector import ManagerCollector, pending_figures
from dispatcher.metrics.figures import Figures
from dispatcher.metrics.recorder import Recorder

if TYPE_CHECKING:
    from dispatcher.controller.manager import Manager


def render(manager: Manager) -> str:
    """The manager's registry as Prometheus text."""
    return generate_latest(manager.recorder.registry).decode()


__all__ = ["Figures", "ManagerCollector", "Recorder", "pending_figures", "render"]
