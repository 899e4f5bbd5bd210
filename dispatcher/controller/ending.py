"""The end of an AppWrapper's life, for the reconciler: a Failed one's objects removed once
(its capacity given back), and a deleted one's objects removed wherever they may be before
its finalizer goes. Side effects: deletes wrapped objects (through the `Maker`) and patches
the finalizer away (through the status writer).

What it remembers is only what saves work: the failed attempts already cleaned, and the
uids whose finalizer this replica removed (the watch may show such an AppWrapper with its
finalizer a moment longer: the answer to the last PATCH may carry no newer resourceVersion
to read our own write by, and a reconcile then would look for its objects and patch again,
for nothing)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from dispatcher.api.constants import FINALIZER
from dispatcher.api.models import AppWrapper, AppWrapperStatus
from dispatcher.cluster.member import Member
from dispatcher.controller.making import Maker
from dispatcher.controller.status import StatusWriter
from dispatcher.controller.workqueue import Result

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
