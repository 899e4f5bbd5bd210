"""The end of an AppWrapper's life, for the reconciler: a Failed one's objects removed once
(its capacity given back), a deleted one's objects removed wherever they may be before its
finalizer goes, and one that does not parse failed (or, being deleted, let go). Side
effects: deletes wrapped objects (through the `Maker`), writes status and patches the
finalizer away (through the status writer).

What it remembers is only what saves work: the failed attempts already cleaned, and the
uids whose finalizer this replica removed (the watch may show such an AppWrapper with its
finalizer a moment longer: the answer to the last PATCH may carry no newer resourceVersion
to read our own write by, and a reconcile then would look for its objects and patch again,
for nothing)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import structlog
from pydantic import ValidationError

from dispatcher.api.constants import FINALIZER
from dispatcher.api.models import AppWrapper, AppWrapperStatus, Reason
from dispatcher.cluster.member import Member
from dispatcher.controller.lifecycle.making import Maker
from dispatcher.controller.status import StatusWriter
from dispatcher.controller.workqueue import Result
from dispatcher.core import conditions as cond

RELEASED_KEPT = 4096
"""How many released uids are remembered (the most recent)."""


class Endings:
    def __init__(
        self,
        *,
        maker: Maker,
        status: StatusWriter,
        members: Mapping[str, Member],
        schedule_soon: Callable[[], None],
    ) -> None:
        self._maker = maker
        self._status = status
        self._members = members
        self._schedule_soon = schedule_soon
        self._cleaned: dict[str, tuple[str, str]] = {}
        """key -> (uid, lastDispatchedAt) of the failed attempt whose objects were removed."""
        self._released: OrderedDict[str, None] = OrderedDict()
        """uids whose finalizer this replica removed (the most recent RELEASED_KEPT)."""
        self._log = structlog.get_logger("reconciler")

    def forget(self, key: str) -> None:
        self._cleaned.pop(key, None)

    async def unreadable(self, obj: dict[str, Any], exc: ValidationError, *, now: datetime) -> bool:
        """An AppWrapper that does not parse: Failed, saying why (once); being deleted, its
        finalizer goes (True). Without a model its objects cannot be listed, but the
        finalizer must not hold it forever: objects on the hub are owned by it (the garbage
        collector takes them), members' are swept as orphans."""
        meta = obj.get("metadata") or {}
        if meta.get("deletionTimestamp") and FINALIZER in (meta.get("finalizers") or []):
            await self._status.set_finalizer(obj, present=False)
            return True
        message = "spec does not match the AppWrapper API: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        if (obj.get("status") or {}).get("message") != message:
            status = AppWrapperStatus()
            transition = cond.mark_failed(status, Reason.INVALID_SPEC, message, now=now)
            await self._status.write(obj, status, [transition])
        return False

    async def clean_failed(
        self, aw: AppWrapper, status: AppWrapperStatus, member: Member | None
    ) -> Result:
        """A Failed AppWrapper's objects in `member`, removed once per attempt."""
        attempt = (aw.metadata.uid or "", status.lastDispatchedAt or "")
        if member is None or self._cleaned.get(aw.key) == attempt:
            return Result.done()
        if await self._maker.remove(aw, member):
            return Result.after(1.0)
        self._cleaned[aw.key] = attempt
        return Result.done()

    async def finalize(self, aw: AppWrapper, obj: dict[str, Any], member: Member | None) -> bool:
        """Deletion: remove the wrapped objects (in `member`, or in every member when it is
        not known), then our finalizer. True once the finalizer is gone (or was already);
        False while objects remain (look again shortly)."""
        if FINALIZER not in aw.metadata.finalizers or aw.metadata.uid in self._released:
            return True
        targets = [member] if member is not None else list(self._members.values())
        remaining = await self._maker.remove_everywhere(aw, targets)
        if remaining:
            self._log.info(
                "waiting_for_objects_to_go",
                appwrapper=aw.metadata.name,
                namespace=aw.metadata.namespace,
                remaining=remaining[:5],
            )
            return False
        await self._status.set_finalizer(obj, present=False)
        if aw.metadata.uid:
            self._released[aw.metadata.uid] = None
            if len(self._released) > RELEASED_KEPT:
                self._released.popitem(last=False)
        self._schedule_soon()
        return True
