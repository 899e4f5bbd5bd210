"""The clocks the shell reads, passed in so tests can move time themselves.

`time()` is wall-clock seconds since the epoch (what status timestamps are compared with);
`monotonic()` never goes back (what silences and intervals are measured with); `sleep()` waits
in the clock's own time (what loops pace themselves with, so a test moves them by advancing a
`ManualClock` instead of waiting), and `call_after()` runs a callback later in that time
(delayed work: the work queue's requeues). The core never reads a clock: it is given `now`
as a value.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None:
        """Return once `seconds` have passed on `monotonic()` (0 or less: a bare yield)."""
        ...

    def call_after(self, seconds: float, callback: Callable[[], None]) -> Timer:
        """Call `callback` on the running loop once `seconds` have passed on `monotonic()`,
        unless the returned timer is cancelled first."""
        ...


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_after(self, seconds: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(seconds, callback)


class _ManualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to (tests)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start
        self.steady = 1_000.0
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.steady

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.steady += seconds
        # In order of their due times; each is called here, at once (a sleeper's wake-up:
        # its task runs at the loop's next turn).
        while self._timers and self._timers[0][0] <= self.steady:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                timer.cancelled = True
                timer.callback()

    def call_after(self, seconds: float, callback: Callable[[], None]) -> Timer:
        """Call `callback` once `advance` has moved the clock on by `seconds` (at the loop's
        next turn when `seconds` is 0 or less, as `call_later` does)."""
        if seconds <= 0:
            return asyncio.get_running_loop().call_soon(callback)
        timer = _ManualTimer(callback)
        heapq.heappush(self._timers, (self.steady + seconds, next(self._order), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        """Return once `advance` has moved the clock on by `seconds` (an `asyncio.sleep` in
        this clock's time)."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        timer = self.call_after(seconds, wake)
        try:
            await waiter
        finally:
            timer.cancel()
