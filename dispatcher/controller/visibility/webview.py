"""The read-only web view: plain server-rendered HTML and CSS, no script.

Pure rendering (no I/O): `queues_page` (usage bars per flavor and resource, then the pending
list with positions and estimates) and `appwrapper_page` (one AppWrapper's conditions as a
timeline). Every name and message is user input: each goes through `html.escape`, attribute
values included, and links are built from escaped path segments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

from dispatcher.api.quantity import format_milli
from dispatcher.core.visibility import Pending

STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #1b1f24; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
table { border-collapse: collapse; margin: .5em 0; }
th, td { text-align: left; padding: .25em .8em; border-bottom: 1px solid #d0d7de; }
th { background: #f6f8fa; }
.bar { width: 16em; height: .9em; background: #eaeef2; border-radius: 3px; position: relative; }
.bar span { display: block; height: 100%; background: #2f81f7; border-radius: 3px; }
.bar span.over { background: #d1242f; }
.muted { color: #59636e; } .reason { font-family: monospace; }
ol.timeline { list-style: none; padding-left: 0; }
ol.timeline li { border-left: 3px solid #2f81f7; padding: .2em .8em; margin: .3em 0; }
ol.timeline li.False { border-left-color: #d0d7de; }
"""


@dataclass(frozen=True, slots=True)
class UsageBar:
    """One (flavor, resource) of a cluster queue: used and nominal, milli-units."""

    flavor: str
    resource: str
    used: int
    nominal: int
    borrowed: int = 0


@dataclass(frozen=True, slots=True)
class QueueRow:
    name: str
    usage: tuple[UsageBar, ...]
    pending: int
    admitted: int
    active: bool
    message: str
    admits: tuple[str, ...] = ()
    """The namespaces whose AppQueues point at it and that it admits: who may see it."""


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body><h1>{escape(title)}</h1>{body}</body></html>\n"
    )


def _time(at: float | None) -> str:
    if at is None:
        return "unknown"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _bar(usage: UsageBar) -> str:
    share = usage.used / usage.nominal if usage.nominal else (1.0 if usage.used else 0.0)
    width = min(100, round(share * 100))
    over = " class='over'" if usage.used > usage.nominal else ""
    label = (
        f"{format_milli(usage.used, usage.resource)} of "
        f"{format_milli(usage.nominal, usage.resource)}"
    )
    if usage.borrowed:
        label += f" ({format_milli(usage.borrowed, usage.resource)} borrowed)"
    return (
        f"<tr><td>{escape(usage.flavor)}</td><td>{escape(usage.resource)}</td>"
        f"<td><div class='bar' title='{escape(label, quote=True)}'>"
        f"<span{over} style='width:{width}%'></span></div></td><td>{escape(label)}</td></tr>"
    )


def pending_table(items: Sequence[Pending], now: float, base: str) -> str:
    if not items:
        return "<p class='muted'>nothing pending</p>"
    rows = []
    for item in items:
        link = (
            f"{base}/namespaces/{quote(item.namespace, safe='')}/views/{quote(item.name, safe='')}"
        )
        rows.append(
            "<tr>"
            f"<td>{item.position}</td><td>{item.queue_position}</td>"
            f"<td><a href='{escape(link, quote=True)}'>{escape(item.key)}</a></td>"
            f"<td>{escape(item.cluster_queue or '(capacity only)')}</td>"
            f"<td>{item.priority}</td><td>{_duration(now - item.queued_since)}</td>"
            f"<td class='reason'>{escape(item.reason)}</td><td>{escape(item.message)}</td>"
            f"<td>{escape(item.eta.basis)}</td></tr>"
        )
    head = (
        "<tr><th>#</th><th>in queue</th><th>AppWrapper</th><th>cluster queue</th>"
        "<th>priority</th><th>waiting</th><th>reason</th><th>why</th><th>starts</th></tr>"
    )
    return f"<table class='pending'>{head}{''.join(rows)}</table>"


def queues_page(
    queues: Iterable[QueueRow], pending: Sequence[Pending], now: float, base: str
) -> str:
    parts = []
    for queue in queues:
        state = "active" if queue.active else f"inactive: {queue.message}"
        parts.append(
            f"<h2 class='queue'>{escape(queue.name)}</h2><p class='muted'>{queue.admitted}"
            f" admitted, {queue.pending} pending, {escape(state)}</p>"
        )
        if queue.usage:
            parts.append(
                "<table class='usage'><tr><th>flavor</th><th>resource</th><th>usage</th>"
                "<th></th></tr>" + "".join(_bar(u) for u in queue.usage) + "</table>"
            )
    if not parts:
        parts.append("<p class='muted'>no ClusterAppQueue</p>")
    parts.append(f"<h2>Pending ({len(pending)})</h2>")
    parts.append(pending_table(pending, now, base))
    parts.append(f"<p class='muted'>as of {_time(now)}</p>")
    return _page("AppWrapper queues", "".join(parts))


def appwrapper_page(obj: Mapping[str, Any], pending: Pending | None, now: float) -> str:
    metadata = obj.get("metadata") or {}
    key = f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
    status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
    assert isinstance(status, dict)
    parts = [f"<p>state <b>{escape(str(status.get('state') or 'Pending'))}</b></p>"]
    if pending is not None:
        parts.append(
            f"<p class='position'>position {pending.position} overall, {pending.queue_position}"
            f" in {escape(pending.cluster_queue or 'capacity-only work')}; starts:"
            f" {escape(pending.eta.basis)}</p><p class='why'>{escape(pending.message)}</p>"
        )
        reserved = pending.reserved
        if reserved is not None:
            parts.append(
                f"<p class='reserved'>reserved in cluster {escape(reserved.cluster)}:"
                f" {escape(', '.join(reserved.nodes))}</p>"
            )
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict)]
    conditions.sort(key=lambda c: str(c.get("lastTransitionMicroTime") or ""))
    items = []
    for c in conditions:
        flag = "True" if c.get("status") == "True" else "False"
        items.append(
            f"<li class='{flag}'><b>{escape(str(c.get('type', '')))}</b> {escape(flag)}"
            f" <span class='muted'>{escape(str(c.get('lastTransitionMicroTime') or ''))}</span>"
            f" <span class='reason'>{escape(str(c.get('reason') or ''))}</span>"
            f" {escape(str(c.get('message') or ''))}</li>"
        )
    parts.append(f"<h2>Timeline</h2><ol class='timeline'>{''.join(items)}</ol>")
    parts.append(f"<p class='muted'>as of {_time(now)}</p>")
    return _page(f"AppWrapper {key}", "".join(parts))
