"""Prometheus text exposition of the dispatcher's counters. Pure: reads values it is given."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatcher.controller.manager import Manager


def render(dispatcher: Manager) -> str:
    states = +dispatcher.states  # without the states nothing is in any more
    lines = [
        "# HELP appwrapper_dispatcher_appwrappers AppWrappers by status.state.",
        "# TYPE appwrapper_dispatcher_appwrappers gauge",
        *(
            f'appwrapper_dispatcher_appwrappers{{state="{s}"}} {n}'
            for s, n in sorted(states.items())
        ),
        "# HELP appwrapper_dispatcher_cycles_total Scheduling cycles run.",
        "# TYPE appwrapper_dispatcher_cycles_total counter",
        f"appwrapper_dispatcher_cycles_total {dispatcher.cycles}",
        "# HELP appwrapper_dispatcher_preemptions_total AppWrappers chosen as preemption victims.",
        "# TYPE appwrapper_dispatcher_preemptions_total counter",
        f"appwrapper_dispatcher_preemptions_total {dispatcher.preemptions}",
        "# HELP appwrapper_dispatcher_api_requests_total API requests made to the hub.",
        "# TYPE appwrapper_dispatcher_api_requests_total counter",
    ]
    for key, count in sorted(dispatcher.hub.stats.counts.items()):
        verb, _, resource = key.partition(" ")
        labels = f'verb="{verb}",resource="{resource}"'
        lines.append(f"appwrapper_dispatcher_api_requests_total{{{labels}}} {count}")
    return "\n".join(lines) + "\n"
