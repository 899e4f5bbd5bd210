"""Notices raised while a status write is answered, delivered once the write has returned.

Side effects: none of its own; what a notice does is its deliverer's.

The status writer records each answer in the scheduler cache at once (the next cycle must
see it), and what that changed for others (a decision to take again, a life that ended) is
put here. It is delivered after the write returned, never inside it: to the worker whose
reconcile wrote it, once that reconcile has returned (`deferring`); for any other writer (an
admission, a waiting message) and for the watch, on the event loop's next turn. So no
owner's state is changed under it while it awaits its own write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Notice:
    """What an AppWrapper's newest object changed for others."""

    key: str
    decision: bool
    """A scheduling decision may change (run a cycle; the queues' usage may move)."""
    finished: bool
    """Its life ended (Completed, Failed): count it and drop what only a live one needs."""
    deleted: bool = False
    """It is gone from the hub: drop everything held about it."""


class Outbox:
    def __init__(self, deliver: Callable[[Notice], None]) -> None:
        self._deliver = deliver
        self._loose: list[Notice] = []
        """Put outside any holder: delivered on the loop's next turn."""
        self._deferred: dict[asyncio.Task[object], list[Notice]] = {}
        self._scheduled = False

    def put(self, notice: Notice) -> None:
        task = _task()
        held = self._deferred.get(task) if task is not None else None
        if held is not None:
            held.append(notice)
            return
        self._loose.append(notice)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain_loose)

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """Notices this task puts meanwhile are delivered when the block ends."""
        task = _task()
        if task is None or task in self._deferred:
            yield
            return
        notices: list[Notice] = []
        self._deferred[task] = notices
        try:
            yield
        finally:
            del self._deferred[task]
            self._deliver_all(notices)

    def _drain_loose(self) -> None:
        self._scheduled = False
        notices, self._loose = self._loose, []
        self._deliver_all(notices)

    def _deliver_all(self, notices: list[Notice]) -> None:
        for notice in notices:
            self._deliver(notice)


def _task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None
