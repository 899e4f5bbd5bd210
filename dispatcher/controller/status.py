"""The one writer of AppWrapper status (and of the dispatcher's finalizer on it).

Side effects: writes to the hub API server; queues Events.

One status-update path for every writer (scheduler, waiting writer, reconciler): `update`
reads the newest object (the overlay below, else the watch cache), hands it to a pure
mutation (parse, then `core.conditions` transitions on a copy of the status; None: nothing
to write), and writes the result guarded by the resourceVersion it was read at. On Conflict
(someone wrote in between: a user's edit, our own finalizer patch) it reads the object again
from the API server and runs the same mutation on it, a few times at most, so the decision is
re-made on fresh data rather than forced over it. The reconciler passes the object it
decided on and one attempt: its Conflict goes back to its work queue, whose next reconcile
reads afresh (its decisions involve member I/O that a mutation must not repeat).

A write posts at most one Event, and only for a step an operator reads in `kubectl describe`
(`EVENT_REASONS`: dispatched, preempted, requeued, failed, completed...); the states of waiting
(queued, at the head, why it waits) and Running are told by the conditions alone
(docs/operations.md, "Kubernetes Events", says why). What a write returns is kept as an
overlay until the watch shows that version or a newer one, so the scheduler and the
reconciler read their own writes at once instead of deciding again on the older object.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from dispatcher.api.constants import API_VERSION, FINALIZER, KIND, PLURAL
from dispatcher.api.models import AppWrapperStatus, Reason, status_to_kube
from dispatcher.controller.reading import key_of, resource_version, without_bookkeeping
from dispatcher.core.conditions import Transition
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import Conflict, KubeError, NotFound
from dispatcher.kube.events import EventRecorder

Obj = dict[str, Any]
APPWRAPPERS = ResourceInfo(API_VERSION, KIND, PLURAL, namespaced=True)
_log = structlog.get_logger("status")
UPDATE_ATTEMPTS = 5
"""Writes of one update before its Conflict is raised (each after reading the object again)."""
QUIET_REASONS = frozenset(
    {
        Reason.QUEUED,
        Reason.FRONT_OF_QUEUE,
        Reason.INSUFFICIENT_RESOURCES,
        Reason.QUOTA_EXCEEDED,
        Reason.PODS_RUNNING,
    }
)
"""Transitions that post no Event: the states of waiting for room or quota (queued, at the
head, why it waits: its conditions say so, kept current) and Running (its pods' own Events
tell it). An Event marks a step taken (dispatched, preempted, requeued, failed, completed) or
a problem to fix (its queue unusable, a spec refused)."""


@dataclass(frozen=True, slots=True)
class Change:
    """What a mutation wants written: the whole new status and what happened, for the Event."""

    status: AppWrapperStatus
    transitions: Sequence[Transition | None] = ()


Mutation = Callable[[Obj], Change | None]
"""Given the newest AppWrapper (raw, as read), the change to write; None: nothing to write."""


class Fenced(KubeError):
    """This replica lost the Lease: it may write nothing more (another may be leading)."""


class StatusWriter:
    """Guarded status writes, their Events, and the read-your-writes overlay."""

    def __init__(
        self,
        hub: KubeApi,
        events: EventRecorder,
        *,
        watched: Callable[[str], Obj | None],
        on_written: Callable[[str, Obj], None] = lambda key, obj: None,
        slim: Callable[[Obj], Obj] = without_bookkeeping,
    ) -> None:
        self.hub = hub
        self.events = events
        self._watched = watched
        self._slim = slim
        """What is kept of a written object: the same as the watch cache keeps."""
        self._on_written = on_written
        self._overlay: dict[str, Obj] = {}
        self.writes: Counter[str] = Counter()
        """Status writes per AppWrapper in its current life (read by the hop metrics)."""
        self.fenced = False

    def fence(self) -> None:
        """Refuse every write from now on (the Lease is lost)."""
        self.fenced = True

    def _check_fence(self) -> None:
        if self.fenced:
            raise Fenced("this replica lost the leader Lease; no more writes")

    def current(self, key: str) -> Obj | None:
        """The newest known version of the AppWrapper: our own last write if the watch has
        not shown it yet, else the watch cache's. None once the watch saw it deleted."""
        watched = self._watched(key)
        if watched is None:
            return None
        mine = self._overlay.get(key)
        if mine is not None and resource_version(mine) > resource_version(watched):
            return mine
        return watched

    def observe(self, key: str, watched: Obj | None) -> bool:
        """The watch delivered `watched` (None: deleted): drop an overlay it caught up with.
        True when `watched` is the echo of our own last write."""
        mine = self._overlay.get(key)
        if mine is None:
            return False
        if watched is None or resource_version(watched) >= resource_version(mine):
            del self._overlay[key]
        return watched is not None and resource_version(watched) == resource_version(mine)

    def forget(self, key: str) -> None:
        self._overlay.pop(key, None)
        self.writes.pop(key, None)

    def _keep(self, written: Obj) -> Obj:
        slim = self._slim(written)
        key = key_of(slim)
        watched = self._watched(key)
        if watched is None or resource_version(watched) < resource_version(slim):
            self._overlay[key] = slim  # else the watch has shown it already
        self._on_written(key, slim)
        return slim

    async def update(
        self,
        key: str,
        mutate: Mutation,
        *,
        obj: Obj | None = None,
        attempts: int = UPDATE_ATTEMPTS,
    ) -> Obj | None:
        """Read, mutate, write guarded; on Conflict read again from the API server and
        mutate again. `obj`: the version to start from (default: `current(key)`). Returns
        what was written, or None when there was nothing to write (or the object is gone)."""
        if obj is None:
            obj = self.current(key)
        for attempt in range(attempts):
            if obj is None:
                return None
            change = mutate(obj)
            if change is None:
                return None
            try:
                return await self.write(obj, change.status, change.transitions)
            except Conflict:
                if attempt + 1 == attempts:
                    raise
            obj = await self._read(key)
        return None

    async def _read(self, key: str) -> Obj | None:
        """The newest version from the API server itself (after a Conflict the watch cache
        is known to be behind)."""
        namespace, _, name = key.partition("/")
        try:
            return self._slim(await self.hub.get(APPWRAPPERS, namespace, name))
        except NotFound:
            return None

    async def write(
        self, obj: Obj, status: AppWrapperStatus, transitions: Sequence[Transition | None]
    ) -> Obj:
        """Write `status` over `obj`'s (Conflict if `obj` is stale) and post one Event for
        the step it takes, if it takes one worth an Event (`QUIET_REASONS`: none)."""
        self._check_fence()
        meta = obj["metadata"]
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "status": status_to_kube(status),
        }
        key = key_of(obj)
        # Counted before the answer: the watch may deliver the write (and the life end,
        # whose hops are read then) before this coroutine resumes.
        self.writes[key] += 1
        try:
            written = await self.hub.replace(
                APPWRAPPERS, meta["namespace"], meta["name"], body, sub="status"
            )
        except BaseException:
            self.writes[key] -= 1
            if self.writes[key] <= 0:
                del self.writes[key]
            raise
        _log.debug(
            "status_written",
            appwrapper=key,
            steps=",".join(str(t.reason) for t in transitions if t is not None),
            message=status.message,
        )
        happened = [
            t for t in transitions if t is not None and t.reason and t.reason not in QUIET_REASONS
        ]
        if happened:
            self.events.record(
                written,
                reason=happened[-1].reason,
                message="; ".join(t.message for t in happened),
                warning=any(t.warning for t in happened),
            )
        return self._keep(written)

    async def set_finalizer(self, obj: Obj, *, present: bool) -> Obj:
        """Add or remove the dispatcher's finalizer (guarded by resourceVersion too)."""
        self._check_fence()
        meta = obj["metadata"]
        others = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
        patch = {
            "metadata": {
                "finalizers": [*others, FINALIZER] if present else others,
                "resourceVersion": meta["resourceVersion"],
            }
        }
        written = await self.hub.merge_patch(APPWRAPPERS, meta["namespace"], meta["name"], patch)
        return self._keep(written)

    def record(self, obj: Obj, *, reason: str, message: str) -> None:
        """An Event that goes with no status write (a preemptor's "evicting X")."""
        self.events.record(obj, reason=reason, message=message)
