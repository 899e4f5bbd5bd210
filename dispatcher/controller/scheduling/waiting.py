"""Writing "why it waits" into queued AppWrappers' status, only when their own situation changes.

Side effects: status writes on the hub (through the status writer's one update path).

The scheduler hands over each cycle's waiting messages; `core.waiting` turns each into the
AppWrapper's own situation and says when it is worth a write. The head of the line's is
written at once by its own task (it is the one users watch). The others go to WRITERS writers
rather than a task each: the first cycle over a queue of 10k AppWrappers would otherwise
start 10k writes at once, each holding memory while it waits for the API server; a newer
situation replaces one not yet written.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from dispatcher.api.models import AppWrapperStatus, Reason
from dispatcher.clock import Clock
from dispatcher.controller.reading import AppWrapperReader
from dispatcher.controller.status import Change, StatusWriter
from dispatcher.core import conditions as cond
from dispatcher.core.conditions import Transition
from dispatcher.core.phase import initialised, queueing
from dispatcher.core.waiting import Situation, Written, due
from dispatcher.kube.errors import Conflict, KubeError

WRITERS = 48
"""Queued AppWrappers' status writes in flight at once. A writer waits out one round trip per
write, so the writers bound the rate at WRITERS / round trip: 48 allow ~100 writes/s at a
loaded API server's ~0.3 s (p50 while a 3,000 backlog was initialised) and still hold only
48 requests open. (With the finalizer to PATCH first, the reconcile workers bound the rate
before these do: see `Config.workers`.)"""
DEFERRAL_CHECK_SECONDS = 1.0
RETRY_SECONDS = 5.0
"""A write the API server refused (after the status writer's own retries) is tried again
this much later: a parked AppWrapper is not decided again until an event, and must not be
left without its status (a new one would stay without any condition) until then."""
SITUATIONS_KEPT = 4096
"""Situations remembered by (message, reason, head): a cycle over a long queue says the same
few messages for most of it, and turning each into its owner's terms (`own_terms`, a dozen
regular expressions) was a fifth of the dispatcher's CPU with 30,000 queued."""


class WaitingWriter:
    def __init__(
        self,
        *,
        models: AppWrapperReader,
        status: StatusWriter,
        clock: Clock,
        on_conflict: Callable[[], None],
    ) -> None:
        self._models = models
        self._status = status
        self._clock = clock
        self._on_conflict = on_conflict
        self._written: dict[str, Written] = {}
        self._queued: dict[str, Situation] = {}  # key -> what to write, oldest first
        # key -> (situation, when it may be written): a change that came too soon after
        # the last write. No later cycle may come to say it again (nothing else changes),
        # so it is written when its time comes unless a newer situation replaced it.
        self._deferred: dict[str, tuple[Situation, float]] = {}
        self._ready = asyncio.Event()
        self._heads: set[asyncio.Task[None]] = set()
        self._situations: OrderedDict[tuple[str, Reason, bool], Situation] = OrderedDict()
        self.skipped = 0
        """Waits the cycles reported that needed no write (the situation was unchanged)."""
        self._log = structlog.get_logger("waiting")

    def note(
        self,
        key: str,
        message: str,
        *,
        head: bool,
        now: float,
        reason: Reason = Reason.INSUFFICIENT_RESOURCES,
    ) -> None:
        """The scheduler says `key` waits because of `message` (for `reason`)."""
        self._note(key, self._situation(message, reason, head), now)

    def _situation(self, message: str, reason: Reason, head: bool) -> Situation:
        said = (message, reason, head)
        situation = self._situations.get(said)
        if situation is None:
            situation = self._situations[said] = Situation.of(message, reason, head=head)
            if len(self._situations) > SITUATIONS_KEPT:
                self._situations.popitem(last=False)
        else:
            self._situations.move_to_end(said)
        return situation

    def _note(self, key: str, situation: Situation, now: float) -> None:
        last = self._written.get(key)
        when = due(last, situation, now=now)
        if when is None:
            self.skipped += 1
            self._deferred.pop(key, None)  # what is written is current again
            return
        if when > now:
            self._deferred[key] = (situation, when)
            return
        self._deferred.pop(key, None)
        self._written[key] = Written(situation, now)
        self._queued.pop(key, None)
        if situation.head:
            task = asyncio.get_running_loop().create_task(self._write(key, situation))
            self._heads.add(task)
            task.add_done_callback(self._heads.discard)
            return
        self._queued[key] = situation
        self._ready.set()

    def forget(self, key: str) -> None:
        """It was dispatched, finished or deleted: its next wait starts afresh."""
        self._written.pop(key, None)
        self._queued.pop(key, None)
        self._deferred.pop(key, None)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for index in range(WRITERS):
                group.create_task(self._writer(), name=f"waiting-writer-{index}")
            group.create_task(self._deferrals(), name="waiting-deferrals")

    async def _deferrals(self) -> None:
        """Hand deferred messages to the writers when their time comes."""
        while True:
            await self._clock.sleep(DEFERRAL_CHECK_SECONDS)
            now = self._clock.time()
            for key, (situation, when) in list(self._deferred.items()):
                if when <= now:
                    del self._deferred[key]
                    self._note(key, situation, now)

    async def _writer(self) -> None:
        while True:
            while not self._queued:
                self._ready.clear()
                await self._ready.wait()
            key = next(iter(self._queued))
            situation = self._queued.pop(key)
            try:
                await self._write(key, situation)
            except Exception:
                self._log.exception("waiting_status_failed", appwrapper=key)

    async def _write(self, key: str, situation: Situation) -> None:
        def wait(obj: dict[str, Any]) -> Change | None:
            try:
                aw = self._models.parse(obj)
            except ValidationError:
                return None
            status = (aw.status or AppWrapperStatus()).editable_copy()
            moment = datetime.fromtimestamp(self._clock.time(), UTC)
            transitions: list[Transition | None] = []
            if not initialised(status):
                priority, _ = self._models.priority(aw)
                transitions.append(cond.initialize(status, priority=priority, now=moment))
            elif not queueing(status):
                return None
            transitions.append(
                cond.mark_waiting(status, situation.message, now=moment, reason=situation.reason)
            )
            if situation.head:
                transitions.append(cond.mark_head_of_line(status, now=moment))
            if all(t is None for t in transitions):
                return None
            return Change(status, transitions)

        try:
            await self._status.update(key, wait)
        except KubeError as exc:
            self._written.pop(key, None)
            # Unless a newer situation comes first, the same one is tried again.
            self._deferred.setdefault(key, (situation, self._clock.time() + RETRY_SECONDS))
            if isinstance(exc, Conflict):
                self._on_conflict()
            self._log.debug("waiting_status_not_written", appwrapper=key, error=str(exc)[:200])

    def fence(self) -> None:
        """Cancel the head-of-line writes in flight and drop the queued ones."""
        self._queued.clear()
        self._deferred.clear()
        for task in list(self._heads):
            task.cancel()

    async def drain(self, timeout: float) -> None:
        if self._heads:
            await asyncio.wait(list(self._heads), timeout=timeout)
