"""Waiting on conditions with deadlines, and checking that one holds over a window (never
bare sleeps). Side effects: none of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T | None], *, timeout: float, interval: float = 0.2, what: str = ""
) -> T:
    """Call `probe` until it returns something truthy; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or probe!r}")
        time.sleep(interval)


async def async_wait_until(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str = "",
) -> T:
    """The asyncio twin of `wait_until`."""
    deadline = time.monotonic() + timeout
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or probe!r}")
        await asyncio.sleep(interval)


def _broken(
    what: str, start: float, seconds: float, samples: int, answer: object
) -> AssertionError:
    return AssertionError(
        f"{what} stopped holding {time.monotonic() - start:.1f}s into a {seconds}s window "
        f"(sample {samples}): {answer}"
    )


def holds_for(
    probe: Callable[[], object], *, seconds: float, interval: float = 0.2, what: str = ""
) -> int:
    """Call `probe` every `interval` for `seconds` (at least twice: at once and at the end)
    and fail the first time it answers something falsy or raises AssertionError (so a probe
    may hold plain asserts and return True). Returns how many samples were taken.

    For negative checks ("nothing was preempted", "still pending"): one look proves only that
    the bad thing had not happened yet; looks held over a window that the thing would have
    needed to happen in prove it did not.
    """
    name = what or repr(probe)
    start = time.monotonic()
    deadline = start + seconds
    samples = 0
    while True:
        last = time.monotonic() >= deadline
        samples += 1
        try:
            answer = probe()
        except AssertionError as exc:
            raise _broken(name, start, seconds, samples, exc) from exc
        if not answer:
            raise _broken(name, start, seconds, samples, repr(answer))
        if last:
            return samples
        time.sleep(max(min(interval, deadline - time.monotonic()), 0.0))


async def async_holds_for(
    probe: Callable[[], Awaitable[object]],
    *,
    seconds: float,
    interval: float = 0.2,
    what: str = "",
) -> int:
    """The asyncio twin of `holds_for`."""
    name = what or repr(probe)
    start = time.monotonic()
    deadline = start + seconds
    samples = 0
    while True:
        last = time.monotonic() >= deadline
        samples += 1
        try:
            answer = await probe()
        except AssertionError as exc:
            raise _broken(name, start, seconds, samples, exc) from exc
        if not answer:
            raise _broken(name, start, seconds, samples, repr(answer))
        if last:
            return samples
        await asyncio.sleep(max(min(interval, deadline - time.monotonic()), 0.0))
