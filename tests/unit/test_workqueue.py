"""The work queue: what a handler's Result asks of it, and how idle workers are woken."""

from __future__ import annotations

import asyncio
import math

import pytest

from dispatcher.controller.workqueue import Result, WorkQueue


@pytest.mark.parametrize(
    ("result", "want_requeue_after"),
    [
        pytest.param(Result.done(), None, id="done-never-again"),
        pytest.param(Result.now(), 0.0, id="now-at-once"),
        pytest.param(Result.after(2.5), 2.5, id="after-seconds"),
        pytest.param(Result.soonest(None, None), None, id="soonest-of-nothing-is-done"),
        pytest.param(Result.soonest(None, 3.0, 1.0), 1.0, id="soonest-shortest"),
        pytest.param(Result.soonest(0.0, 4.0), 0.0, id="soonest-zero-is-now"),
    ],
)
def test_result_says_what_it_means(result: Result, want_requeue_after: float | None) -> None:
    assert result.requeue_after == want_requeue_after


@pytest.mark.parametrize(
    "seconds", [0.0, -1.0, math.inf, math.nan], ids=["zero", "negative", "inf", "nan"]
)
def test_after_refuses_what_is_not_a_delay(seconds: float) -> None:
    """Zero is `now()`; a delay that is no delay at all is a bug of the caller's."""
    with pytest.raises(ValueError, match="seconds > 0"):
        Result.after(seconds)


def test_done_and_now_differ() -> None:
    """controller-runtime's zero means "no requeue"; here "done" and "now" cannot be
    mistaken for one another."""
    assert Result.done() != Result.now()


async def _settle() -> None:
    for _ in range(5):  # a few turns of the loop: woken workers run, the rest keep waiting
        await asyncio.sleep(0)


async def test_a_key_added_wakes_one_idle_worker_and_each_key_is_taken_once() -> None:
    queue = WorkQueue()
    taken: list[str] = []

    async def worker() -> None:
        while True:
            taken.append(await queue.get())

    workers = [asyncio.create_task(worker()) for _ in range(4)]
    await _settle()
    idle = list(queue._waiters)
    queue.add("ns/a")
    await _settle()
    assert taken == ["ns/a"]
    assert [waiter.done() for waiter in idle].count(True) == 1  # the other three slept on
    for key in ("ns/b", "ns/c", "ns/b"):
        queue.add(key)
    await _settle()
    assert sorted(taken) == ["ns/a", "ns/b", "ns/c"]
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


async def test_a_worker_cancelled_after_its_wake_passes_the_key_on() -> None:
    queue = WorkQueue()
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await _settle()
    queue.add("ns/a")  # wakes the first
    first.cancel()  # before it runs
    assert await asyncio.wait_for(second, timeout=5) == "ns/a"
    assert first.cancelled()
