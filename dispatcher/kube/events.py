"""Kubernetes Events on AppWrappers, so `kubectl describe aw` tells the story.

Side effects: creates core/v1 Events through a KubeApi, in the background.

Events are best effort: a failure to record one is logged, never raised, and never
holds up a scheduling decision. Posting runs in a bounded background queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import structlog

from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError

EVENTS = ResourceInfo("v1", "Event", "events", namespaced=True)
COMPONENT = "appwrapper-dispatcher"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Queues Events and posts them from one background task (`run`)."""

    def __init__(self, client: KubeApi, *, max_pending: int = 10_000) -> None:
        self._client = client
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=max_pending)
        self._fenced = False
        self._log = structlog.get_logger("events")

    def fence(self) -> None:
        """Post nothing more, queued or new (the Lease is lost)."""
        self._fenced = True

    def record(
        self, obj: Mapping[str, Any], *, reason: str, message: str, warning: bool = False
    ) -> None:
        """Queue one Event about `obj` (an AppWrapper as read from the server)."""
        if self._fenced:
            return
        meta = obj.get("metadata", {})
        now = _now()
        event = {
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
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            # The API server is far behind: an Event is a courtesy, the status says it all.
            self._log.debug("event_dropped", appwrapper=meta.get("name"), reason=reason)

    async def run(self, *, workers: int = 4) -> None:
        """Post queued events with a few concurrent senders until cancelled."""
        async with asyncio.TaskGroup() as group:
            for _ in range(workers):
                group.create_task(self._send_loop())

    async def _send_loop(self) -> None:
        while True:
            event = await self._queue.get()
            if self._fenced:
                self._queue.task_done()
                continue
            try:
                await self._client.create(EVENTS, event["metadata"]["namespace"], event)
            except KubeError as exc:
                self._log.debug(
                    "event_not_recorded",
                    appwrapper=event["involvedObject"]["name"],
                    namespace=event["metadata"]["namespace"],
                    reason=event["reason"],
                    error=str(exc)[:200],
                )
            finally:
                self._queue.task_done()

    async def flush(self, timeout: float = 5) -> None:
        """Wait (bounded) until queued events are posted; used at shutdown and in tests."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout)
