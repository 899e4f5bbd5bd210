"""The key work queue: dedupe, one worker per key, delayed adds, backoff."""

from __future__ import annotations

import asyncio

from dispatcher.controller.workqueue import WorkQueue


async def test_duplicates_collapse_and_order_is_kept() -> None:
    queue = WorkQueue()
    for key in ("a", "b", "a", "c", "b"):
        queue.add(key)
    assert len(queue) == 3
    assert [await queue.get() for _ in range(3)] == ["a", "b", "c"]


async def test_key_added_while_active_runs_again_after_done() -> None:
    queue = WorkQueue()
    queue.add("a")
    key = await queue.get()
    queue.add("a")  # a change arrives while "a" is being handled
    assert len(queue) == 0  # not handed to a second worker
    queue.done(key)
    assert await asyncio.wait_for(queue.get(), 1) == "a"


async def test_add_after_and_earliest_timer_wins() -> None:
    queue = WorkQueue()
    queue.add_after("a", 5.0)
    queue.add_after("a", 0.01)
    assert await asyncio.wait_for(queue.get(), 1) == "a"
    queue.shutdown()


async def test_retry_backs_off_exponentially_and_forget_resets() -> None:
    queue = WorkQueue(base_delay=0.01, max_delay=0.04)
    delays = [queue.retry("a") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    queue.forget("a")
    assert queue.retry("a") == 0.01
    queue.shutdown()


async def test_waiting_worker_wakes_on_add() -> None:
    queue = WorkQueue()
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.add("x")
    assert await asyncio.wait_for(getter, 1) == "x"
