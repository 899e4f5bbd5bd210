"""A key work queue in the style of client-go: dedupe, one worker per key, delayed adds,
per-key exponential backoff on failure.

Side effects: none beyond asyncio timers. Keys are "namespace/name" strings; the handler
reads the current object, so collapsing many changes into one run loses nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque


class WorkQueue:
    def __init__(self, *, base_delay: float = 0.05, max_delay: float = 30.0) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._again: set[str] = set()  # added while being processed: run once more after
        self._failures: dict[str, int] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._ready = asyncio.Event()
        self._base = base_delay
        self._max = max_delay

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: str) -> None:
        if key in self._active:
            self._again.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(key)
        self._wake()

    def add_after(self, key: str, delay: float) -> None:
        """Add `key` after `delay` seconds; an earlier pending timer for it wins."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        due = loop.time() + delay
        if existing is not None and existing.when() <= due:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_at(due, self._fire, key)

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: str, *, base: float | None = None, first_at_once: bool = False) -> float:
        """Re-add after a failure with per-key exponential backoff from `base` (the queue's
        when None); returns the delay. `first_at_once`: the first failure since the last
        success is retried at once, the next ones back off."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        if first_at_once:
            if failures == 0:
                self.add(key)
                return 0.0
            failures -= 1
        start = self._base if base is None else base
        delay = min(start * float(2 ** min(failures, 30)), self._max)
        self.add_after(key, delay)
        return delay

    def failures(self, key: str) -> int:
        """Failures of `key` since its last success."""
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        """The key succeeded: reset its backoff."""
        self._failures.pop(key, None)

    def _wake(self) -> None:
        self._ready.set()

    async def get(self) -> str:
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: str) -> None:
        self._active.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    def shutdown(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
