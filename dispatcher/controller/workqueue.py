"""A key work queue in the style of client-go: dedupe, one worker per key, delayed adds,
per-key exponential backoff on failure; the `Result` a handler returns; and the workers
(`serve`), which act on a handler's exception as the one error policy says
(`controller.errors.decide`).

Side effects: none beyond timers on its clock and the workers' log lines. Keys are
"namespace/name" strings; the handler reads the current object, so collapsing many changes
into one run loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial

import structlog

from dispatcher.clock import Clock, SystemClock, Timer
from dispatcher.controller.errors import Action, decide
from dispatcher.core.retry import retry_delay

CONFLICT_BACKOFF_SECONDS = 0.01
"""First delay between runs of one key that keep meeting Conflict (doubling)."""


@dataclass(frozen=True, slots=True)
class Result:
    """What the queue does with a key after its handler ran: nothing until something
    changes it (`done()`), run it again at once (`now()`), or after `seconds` (`after`).

    Built through those three only: in controller-runtime a zero delay means "no requeue",
    and a bare number cannot say which of "now" and "never" it meant."""

    requeue_after: float | None
    """None: not again until an event adds the key; 0: at once; else seconds."""

    def __post_init__(self) -> None:
        if self.requeue_after is not None and not (
            math.isfinite(self.requeue_after) and self.requeue_after >= 0
        ):
            raise ValueError(f"a requeue delay is a finite number >= 0: {self.requeue_after}")

    @classmethod
    def done(cls) -> Result:
        """Not again until something changes (an event adds the key)."""
        return _DONE

    @classmethod
    def now(cls) -> Result:
        """Again at once (behind the keys already queued)."""
        return _NOW

    @classmethod
    def after(cls, seconds: float) -> Result:
        """Again in `seconds` (> 0: at once is `now()`, never is `done()`)."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"Result.after takes seconds > 0, not {seconds}")
        return cls(seconds)

    @classmethod
    def soonest(cls, *delays: float | None) -> Result:
        """After the shortest of `delays` (None: no reason to come back); done if none."""
        given = [d for d in delays if d is not None]
        if not given:
            return _DONE
        shortest = min(given)
        return cls.after(shortest) if shortest > 0 else _NOW


class WorkQueue:
    def __init__(
        self, *, base_delay: float = 0.05, max_delay: float = 30.0, clock: Clock | None = None
    ) -> None:
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._active: set[str] = set()
        self._again: set[str] = set()  # added while being processed: run once more after
        self._failures: dict[str, int] = {}
        self._timers: dict[str, tuple[float, Timer]] = {}
        """Key -> when its delayed add is due (the clock's monotonic time), and its timer."""
        self._clock = clock or SystemClock()
        # Idle workers, each waiting on its own future: a key added wakes one of them, not
        # all (a shared Event woke every idle worker for each key, and all but one went
        # back to sleep: some 3% of the process's CPU with a dozen workers).
        self._waiters: deque[asyncio.Future[None]] = deque()
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
        existing = self._timers.get(key)
        due = self._clock.monotonic() + delay
        if existing is not None and existing[0] <= due:
            return
        if existing is not None:
            existing[1].cancel()
        self._timers[key] = (due, self._clock.call_after(delay, partial(self._fire, key)))

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
        delay = retry_delay(start, failures, self._max)
        self.add_after(key, delay)
        return delay

    def failures(self, key: str) -> int:
        """Failures of `key` since its last success."""
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        """The key succeeded: reset its backoff."""
        self._failures.pop(key, None)

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def get(self) -> str:
        while not self._queue:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken for a key it will not take: pass it on
                raise
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
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


async def serve(
    queue: WorkQueue,
    handle: Callable[[str], Awaitable[Result]],
    *,
    taken: Callable[[str], None] = lambda key: None,
    around: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
) -> None:
    """One worker: take a key, run `handle` on it (inside `around()`), and act on how it
    ended. `taken` is told of each key taken (hop counts).

    A handler's own verdicts come back as its Result; an exception is acted on as the one
    error policy says (`controller.errors.decide`): a Conflict (someone, often our own
    earlier write, changed it) runs it again at once, then with backoff should it keep
    losing; NotFound means it went (the watch says the rest); a `TerminalError` (the
    user's input, which the handler did not fail) is logged and not retried, as in
    controller-runtime; any other error is retried with the queue's per-key backoff and
    logged (`reconcile_failed` for the API's, `reconcile_crashed` with the traceback for
    the dispatcher's own)."""
    log = structlog.get_logger("worker")
    while True:
        key = await queue.get()
        taken(key)
        try:
            with around():
                result = await handle(key)
            queue.forget(key)
            if result.requeue_after is not None:
                queue.add_after(key, result.requeue_after)
        except Exception as exc:
            decision = decide(exc)
            if decision.action is Action.RERUN:
                queue.retry(key, base=CONFLICT_BACKOFF_SECONDS, first_at_once=True)
            elif decision.action is Action.FORGET:
                queue.forget(key)
            elif decision.action is Action.FAIL:
                queue.forget(key)
                log.error("reconcile_terminal", appwrapper=key, error=decision.message[:300])
            elif decision.own:
                delay = queue.retry(key)
                log.exception("reconcile_crashed", appwrapper=key, retry_in=delay)
            else:
                delay = queue.retry(key)
                log.warning(
                    "reconcile_failed", appwrapper=key, error=str(exc)[:300], retry_in=delay
                )
        finally:
            queue.done(key)


_DONE = Result(None)
_NOW = Result(0.0)
