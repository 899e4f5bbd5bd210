"""The one writer of AppWrapper status (and of the dispatcher's finalizer on it).

Side effects: writes to the hub API server; queues Events.

Every write carries the resourceVersion it was decided on, so two writers (two replicas, a
stale cache) cannot both succeed: the loser gets Conflict and decides again from fresh data.
Each write posts one Event telling what changed. What a write returns is kept as an overlay
until the watch shows that version or a newer one, so the scheduler and the reconciler read
their own writes at once instead of deciding again on the older object.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from dispatcher.api.constants import API_VERSION, FINALIZER, KIND, PLURAL
from dispatcher.api.models import AppWrapperStatus, status_to_kube
from dispatcher.controller.reading import key_of, resource_version, without_bookkeeping
from dispatcher.core.conditions import Transition
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError
from dispatcher.kube.events import EventRecorder

Obj = dict[str, Any]
APPWRAPPERS = ResourceInfo(API_VERSION, KIND, PLURAL, namespaced=True)


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

    async def write(
        self, obj: Obj, status: AppWrapperStatus, transitions: list[Transition | None]
    ) -> Obj:
        """Write `status` over `obj`'s (Conflict if `obj` is stale) and post one Event for
        what changed: a queued-and-dispatched AppWrapper costs one Event, not two."""
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
        happened = [t for t in transitions if t is not None and t.reason]
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
