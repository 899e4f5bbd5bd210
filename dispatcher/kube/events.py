"""Kubernetes Events on AppWrappers, so `kubectl describe aw` tells the story.

Side effects: creates and patches core/v1 Events through a KubeApi, in the background.

Events are best effort: a failure to record one is logged, never raised, and never
holds up a scheduling decision. Posting runs in a bounded background queue.

Recorded as client-go's recorder (tools/record) does, for core/v1 Events:
- a repeat (same object, reason, message, type and source) within REPEAT_SECONDS of the
  last is one Event whose `count` and `lastTimestamp` are PATCHed, not a new Event; repeats
  that come while the first is still queued cost nothing more (the one request carries the
  newest count);
- a spam filter per object and source: a token bucket of SPAM_BURST Events refilled one per
  SPAM_REFILL_SECONDS, so a flapping AppWrapper cannot flood the API server; what it drops
  is counted (`dropped`) and logged at debug;
- the message is cut at MESSAGE_LIMIT characters with "…" and a pointer to the condition,
  where the full text is. The API server enforces no length on a core/v1 Event's message
  (the 1,024 it enforces is on events.k8s.io/v1's `note`, and on core/v1 Events that set
  `eventTime`, which these do not); 1,024 keeps Events readable and the same size should
  they move to events.k8s.io.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError, NotFound

EVENTS = ResourceInfo("v1", "Event", "events", namespaced=True)
COMPONENT = "appwrapper-dispatcher"
REPEAT_SECONDS = 600.0
"""A repeat within this long of the last one updates that Event (client-go: 10 minutes)."""
SERIES_CACHE = 4096
"""Event series remembered for repeats, least recently seen dropped first (client-go's LRU)."""
SPAM_BURST = 25
SPAM_REFILL_SECONDS = 300.0
"""client-go's defaults: 25 Events per object at once, then one per 5 minutes."""
MESSAGE_LIMIT = 1024
CUT = "… (cut; the full message is in the AppWrapper's conditions)"


def cut(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """`message` in at most `limit` characters; a cut one ends with CUT."""
    if len(message) <= limit:
        return message
    return message[: limit - len(CUT)] + CUT


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Bucket:
    tokens: float
    at: float

    def take(self, now: float) -> bool:
        self.tokens = min(SPAM_BURST, self.tokens + (now - self.at) / SPAM_REFILL_SECONDS)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class _Series:
    """One Event and its repeats: what the server has, and what it should have."""

    event: dict[str, Any]
    first: float
    count: int = 1
    last: float = 0.0
    sent: int = 0
    """The count the server holds (0: not created yet)."""
    busy: bool = field(default=False)
    """Queued or being sent: a repeat now only raises `count`."""


class EventRecorder:
    """Queues Events and posts them from a few background tasks (`run`)."""

    def __init__(
        self,
        client: KubeApi,
        *,
        max_pending: int = 10_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._clock = clock
        self._queue: asyncio.Queue[_Series] = asyncio.Queue(maxsize=max_pending)
        self._series: OrderedDict[tuple[str, ...], _Series] = OrderedDict()
        self._buckets: OrderedDict[tuple[str, ...], _Bucket] = OrderedDict()
        self._fenced = False
        self.created = 0
        self.patched = 0
        self.dropped = 0
        """Events the spam filter or a full queue dropped."""
        self._log = structlog.get_logger("events")

    def fence(self) -> None:
        """Post nothing more, queued or new (the Lease is lost)."""
        self._fenced = True

    def record(
        self, obj: Mapping[str, Any], *, reason: str, message: str, warning: bool = False
    ) -> None:
        """Record one Event about `obj` (an AppWrapper as read from the server): a new one,
        or one more of a recent identical one."""
        if self._fenced:
            return
        meta = obj.get("metadata", {})
        kind = "Warning" if warning else "Normal"
        involved = (
            str(obj.get("apiVersion")),
            str(obj.get("kind")),
            str(meta.get("namespace") or ""),
            str(meta.get("name")),
            str(meta.get("uid")),
        )
        now = self._clock()
        if not self._allowed((COMPONENT, *involved), now):
            self.dropped += 1
            self._log.debug("event_spam_dropped", appwrapper=meta.get("name"), reason=reason)
            return
        message = cut(message)
        key = (*involved, COMPONENT, kind, reason, message)
        series = self._series.get(key)
        if series is not None and now - series.last <= REPEAT_SECONDS:
            self._series.move_to_end(key)
            series.count += 1
            series.last = now
            if not series.busy:
                self._enqueue(series)
            return
        series = _Series(self._event(obj, kind, reason, message), first=now, last=now)
        self._series[key] = series
        if len(self._series) > SERIES_CACHE:
            self._series.popitem(last=False)
        self._enqueue(series)

    def _allowed(self, key: tuple[str, ...], now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(SPAM_BURST, now)
            if len(self._buckets) > SERIES_CACHE:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket.take(now)

    def _enqueue(self, series: _Series) -> None:
        try:
            self._queue.put_nowait(series)
            series.busy = True
        except asyncio.QueueFull:
            # The API server is far behind: an Event is a courtesy, the status says it all.
            self.dropped += 1
            self._log.debug("event_dropped", appwrapper=series.event["involvedObject"]["name"])

    @staticmethod
    def _event(obj: Mapping[str, Any], kind: str, reason: str, message: str) -> dict[str, Any]:
        meta = obj.get("metadata", {})
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta.get('name')}.{secrets.token_hex(8)}",
                # A cluster-scoped object's Events go to `default`, as Kubernetes' own do.
                "namespace": meta.get("namespace") or "default",
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
        }

    async def run(self, *, workers: int = 4) -> None:
        """Post queued events with a few concurrent senders until cancelled."""
        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(self._send_loop())

    async def _send_loop(self) -> None:
        while True:
            series = await self._queue.get()
            try:
                if not self._fenced:
                    await self._send(series)
            except KubeError as exc:
                event = series.event
                self._log.debug(
                    "event_not_recorded",
                    appwrapper=event["involvedObject"]["name"],
                    namespace=event["metadata"]["namespace"],
                    reason=event["reason"],
                    error=str(exc)[:200],
                )
            finally:
                series.busy = False
                if series.sent and series.count > series.sent and not self._fenced:
                    self._enqueue(series)  # repeats came while it was being sent
                self._queue.task_done()

    async def _send(self, series: _Series) -> None:
        event = series.event
        namespace, name = event["metadata"]["namespace"], event["metadata"]["name"]
        count, last = series.count, _stamp(series.last)
        if series.sent:
            try:
                await self._client.merge_patch(
                    EVENTS, namespace, name, {"count": count, "lastTimestamp": last}
                )
                self.patched += 1
                series.sent = count
                return
            except NotFound:
                # Expired (the API server keeps Events an hour): start the series again.
                suffix = secrets.token_hex(8)
                event["metadata"]["name"] = f"{event['involvedObject']['name']}.{suffix}"
                series.first = series.last
        body = {
            **event,
            "count": count,
            "firstTimestamp": _stamp(series.first),
            "lastTimestamp": last,
        }
        await self._client.create(EVENTS, namespace, body)
        self.created += 1
        series.sent = count

    async def flush(self, timeout: float = 5) -> None:
        """Wait (bounded) until queued events are posted; used at shutdown and in tests."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):  # not wait_for: see kube/certs.py
                await self._queue.join()
