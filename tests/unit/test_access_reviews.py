"""SubjectAccessReviews asked once per user and right: kept for a while, and shared while
in flight, so a burst of AppWrappers from one user costs one review per right."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from dispatcher.controller.access.gatekeeper import AccessReviews
from dispatcher.core.gatekeeping import Access, Creator
from dispatcher.kube.api import KubeApi
from dispatcher.kube.errors import KubeError

ALICE = Creator("alice", groups=("team-a",))
BOB = Creator("bob")
JOBS = Access("create", "batch", "jobs", "team-a")


class Reviewer:
    """The API server's SubjectAccessReviews: answered when the test lets them through."""

    def __init__(self, allowed: bool = True) -> None:
        self.asked: list[dict[str, Any]] = []
        self.allowed = allowed
        self.fail: KubeError | None = None
        self.gate = asyncio.Event()

    async def create(self, info: Any, namespace: Any, body: Any, **_: Any) -> dict[str, Any]:
        self.asked.append(body)
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return {"status": {"allowed": self.allowed}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def turns(n: int = 10) -> None:
    """Let every task run as far as it can (no time passes: asyncio turns only)."""
    for _ in range(n):
        await asyncio.sleep(0)


def reviews(reviewer: Reviewer, clock: Clock, keep: float = 10.0) -> AccessReviews:
    return AccessReviews(cast(KubeApi, reviewer), keep_seconds=keep, now=clock)


async def test_a_burst_from_one_user_asks_once_while_the_first_review_is_in_flight() -> None:
    reviewer, clock = Reviewer(), Clock()
    gate = reviews(reviewer, clock)
    burst = [asyncio.create_task(gate.allowed(ALICE, JOBS)) for _ in range(20)]
    other = asyncio.create_task(gate.allowed(BOB, JOBS))
    await turns()
    assert len(reviewer.asked) == 2  # alice's and bob's, not one per request
    reviewer.gate.set()
    assert await asyncio.gather(*burst, other) == [True] * 21
    assert [r["spec"]["user"] for r in reviewer.asked] == ["alice", "bob"]


async def test_an_answer_is_kept_for_its_time_then_asked_again() -> None:
    reviewer, clock = Reviewer(), Clock()
    reviewer.gate.set()
    gate = reviews(reviewer, clock)
    assert await gate.allowed(ALICE, JOBS)
    clock.now += 9.9
    reviewer.allowed = False  # taken away: not seen until the kept answer is old
    assert await gate.allowed(ALICE, JOBS)
    clock.now += 0.2
    assert not await gate.allowed(ALICE, JOBS)
    assert len(reviewer.asked) == 2


async def test_an_error_reaches_every_waiting_caller_and_is_not_kept() -> None:
    reviewer, clock = Reviewer(), Clock()
    reviewer.fail = KubeError("the API server did not answer", status=503)
    gate = reviews(reviewer, clock)
    burst = [asyncio.create_task(gate.allowed(ALICE, JOBS)) for _ in range(3)]
    await turns()
    reviewer.gate.set()
    results = await asyncio.gather(*burst, return_exceptions=True)
    assert all(isinstance(r, KubeError) for r in results)
    reviewer.fail = None
    assert await gate.allowed(ALICE, JOBS)
    assert len(reviewer.asked) == 2


async def test_a_caller_that_gives_up_leaves_the_others_their_answer() -> None:
    reviewer, clock = Reviewer(), Clock()
    gate = reviews(reviewer, clock)
    first = asyncio.create_task(gate.allowed(ALICE, JOBS))
    second = asyncio.create_task(gate.allowed(ALICE, JOBS))
    await turns()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    reviewer.gate.set()
    assert await second
    assert len(reviewer.asked) == 1
