"""The polling helpers the cluster tests wait and hold with."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from testenv.waits import async_holds_for, holds_for, wait_until


def test_holds_for_samples_the_whole_window() -> None:
    start = time.monotonic()
    samples = holds_for(lambda: True, seconds=0.3, interval=0.05)
    assert time.monotonic() - start >= 0.3
    assert samples >= 4


def test_holds_for_fails_on_the_first_bad_sample() -> None:
    answers = itertools.chain([True, True], itertools.repeat(False))
    with pytest.raises(AssertionError, match=r"quiet stopped holding .* \(sample 3\): False"):
        holds_for(lambda: next(answers), seconds=5, interval=0.01, what="quiet")


def test_holds_for_reports_an_assert_inside_the_probe() -> None:
    def probe() -> bool:
        assert 1 + 1 == 3, "arithmetic broke"
        return True

    with pytest.raises(AssertionError, match="arithmetic broke"):
        holds_for(probe, seconds=1, interval=0.01, what="sums")


def test_holds_for_zero_seconds_still_looks_once() -> None:
    calls: list[int] = []

    def probe() -> bool:
        calls.append(1)
        return True

    assert holds_for(probe, seconds=0) == 1
    assert calls == [1]


def test_async_holds_for() -> None:
    async def ok() -> bool:
        return True

    async def bad() -> str:
        return ""

    assert asyncio.run(async_holds_for(ok, seconds=0.1, interval=0.02)) >= 2
    with pytest.raises(AssertionError, match="sample 1"):
        asyncio.run(async_holds_for(bad, seconds=1, what="bad"))


def test_wait_until_times_out_naming_what() -> None:
    with pytest.raises(TimeoutError, match="the impossible"):
        wait_until(lambda: None, timeout=0.05, interval=0.01, what="the impossible")
