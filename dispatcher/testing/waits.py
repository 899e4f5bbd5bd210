"""Waiting on conditions with deadlines (never bare sleeps). Side effects: none of its own."""

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
