"""Preemptors that protection alone holds back (their victims have not run their minimum
runtime yet): their waits say until when, and a cycle runs again then. Side effects: a timer
on the clock that kicks the scheduler.

The end of a minimum runtime is no event that wakes work parked for room, so the timer does:
when it fires, the next cycle wakes the capacity-parked work (`take_over`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace

from dispatcher.clock import Clock, Timer
from dispatcher.core.protection import clock_time
from dispatcher.core.scheduling import CycleResult

__all__ = ["ProtectionNote"]


class ProtectionNote:
    def __init__(self, clock: Clock, kick: Callable[[], None]) -> None:
        self._clock = clock
        self._kick = kick
        self._timer: Timer | None = None
        self._wake = math.inf  # when the timer fires
        self._over = False  # it fired: wake the work it held back

    def noted(self, result: CycleResult, protected: Mapping[str, float], now: float) -> CycleResult:
        """`result` with the waits of preemptors held back by protection alone (`protected`:
        key -> until when, as the preemption policy noted it) saying until when; a cycle is
        set to run then."""
        preempting = {p.key for p in result.preemptions}
        held = {key: until for key, until in protected.items() if key not in preempting}
        if not held:
            return result
        self._wake_at(min(held.values()), now)
        waits = tuple(
            replace(
                wait,
                message=f"{wait.message}; the victims it needs are protected until"
                f" {clock_time(held[wait.key])} (minimum runtime)",
            )
            if wait.key in held
            else wait
            for wait in result.waits
        )
        return replace(result, waits=waits)

    def take_over(self) -> bool:
        """Whether a protection ended since the last cycle asked (then it wakes the work
        parked for room)."""
        over, self._over = self._over, False
        return over

    def _wake_at(self, at: float, now: float) -> None:
        """Run a cycle at `at` (the earliest asked for)."""
        if self._timer is not None:
            if self._wake <= at:
                return
            self._timer.cancel()
        self._wake = at
        self._timer = self._clock.call_after(at - now, self._ended)

    def _ended(self) -> None:
        self._timer = None
        self._wake = math.inf
        self._over = True
        self._kick()
