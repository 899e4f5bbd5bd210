"""The clocks the shell reads, passed in so tests can move time themselves.

`time()` is wall-clock seconds since the epoch (what status timestamps are compared with);
`monotonic()` never goes back (what silences and intervals are measured with). The core
never reads a clock: it is given `now` as a value.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self.steady = 1_000.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.steady

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.steady += seconds
        while self._sleepers and self._sleepers[0][0] <= self.steady:
            _, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():
                waiter.set_result(None)

    async def sleep(self, seconds: float) -> None:
        """Return once `advance` has moved the clock on by `seconds` (an `asyncio.sleep` in
        this clock's time, for code that is given a sleep function)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waiter = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.steady + seconds, next(self._order), waiter))
        await waiter
