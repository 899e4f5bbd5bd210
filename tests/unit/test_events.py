"""Events recorded as client-go's recorder does: repeats aggregated, spam filtered, cut."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatcher.kube.errors import NotFound
from dispatcher.kube.events import (
    CUT,
    EVENTS,
    MESSAGE_LIMIT,
    REPEAT_SECONDS,
    SPAM_BURST,
    SPAM_REFILL_SECONDS,
    EventRecorder,
    cut,
)
from testenv.fakekube import FakeKube

NS = "default"


def aw(name: str = "a", uid: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": NS, "uid": uid, "resourceVersion": "1"},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def posted(fake: FakeKube, recorder: EventRecorder) -> list[dict[str, Any]]:
    task = asyncio.create_task(recorder.run(workers=2))
    try:
        await recorder.flush(5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    items = (await fake.list(EVENTS, NS))["items"]
    return sorted(items, key=lambda e: (e["reason"], e["message"]))


@pytest.mark.parametrize(
    ("steps", "want"),
    [
        pytest.param([(0, "a", "Queued", "q")], [("Queued", "q", 1)], id="one-event"),
        pytest.param(
            [(0, "a", "Queued", "q"), (1, "a", "Queued", "q")],
            [("Queued", "q", 2)],
            id="repeat-is-counted-not-created",
        ),
        pytest.param(
            [(0, "a", "Queued", "q"), (1, "a", "Queued", "other")],
            [("Queued", "other", 1), ("Queued", "q", 1)],
            id="another-message-is-another-event",
        ),
        pytest.param(
            [(0, "a", "Queued", "q"), (1, "b", "Queued", "q")],
            [("Queued", "q", 1), ("Queued", "q", 1)],
            id="another-object-is-another-event",
        ),
        pytest.param(
            [(0, "a", "Queued", "q"), (REPEAT_SECONDS + 1, "a", "Queued", "q")],
            [("Queued", "q", 1), ("Queued", "q", 1)],
            id="a-repeat-after-ten-minutes-starts-a-new-event",
        ),
    ],
)
async def test_repeats(
    steps: list[tuple[float, str, str, str]], want: list[tuple[str, str, int]]
) -> None:
    fake, clock = FakeKube(), Clock()
    recorder = EventRecorder(fake, clock=clock)
    start = clock.now
    task = asyncio.create_task(recorder.run(workers=2))
    try:
        for at, name, reason, message in steps:
            clock.now = start + at
            recorder.record(aw(name, uid=name), reason=reason, message=message)
            await recorder.flush(5)  # each step posted before the next, as in life
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    items = (await fake.list(EVENTS, NS))["items"]
    got = sorted((e["reason"], e["message"], e["count"]) for e in items)
    assert got == sorted(want)


async def test_a_repeat_patches_count_and_last_timestamp() -> None:
    fake, clock = FakeKube(), Clock()
    recorder = EventRecorder(fake, clock=clock)
    recorder.record(aw(), reason="Queued", message="q")
    await posted(fake, recorder)
    clock.now += 90
    recorder.record(aw(), reason="Queued", message="q")
    [event] = await posted(fake, recorder)
    assert (event["count"], recorder.created, recorder.patched) == (2, 1, 1)
    assert event["firstTimestamp"] != event["lastTimestamp"]


async def test_repeats_while_queued_cost_one_request() -> None:
    fake = FakeKube()
    recorder = EventRecorder(fake, clock=Clock())
    for _ in range(5):
        recorder.record(aw(), reason="Queued", message="q")
    [event] = await posted(fake, recorder)
    assert (event["count"], recorder.created, recorder.patched) == (5, 1, 0)


async def test_an_expired_event_is_created_again() -> None:
    fake, clock = FakeKube(), Clock()
    recorder = EventRecorder(fake, clock=clock)
    recorder.record(aw(), reason="Queued", message="q")
    [first] = await posted(fake, recorder)
    await fake.delete(EVENTS, NS, first["metadata"]["name"])
    recorder.record(aw(), reason="Queued", message="q")
    [again] = await posted(fake, recorder)
    assert again["metadata"]["name"] != first["metadata"]["name"]
    assert again["count"] == 2


async def test_spam_filter_per_object_then_one_per_refill() -> None:
    fake, clock = FakeKube(), Clock()
    recorder = EventRecorder(fake, clock=clock)
    for index in range(SPAM_BURST + 5):
        recorder.record(aw(), reason="Flap", message=f"m{index}")
    recorder.record(aw("b", uid="b"), reason="Flap", message="other object")
    events = await posted(fake, recorder)
    assert len(events) == SPAM_BURST + 1
    assert recorder.dropped == 5
    clock.now += SPAM_REFILL_SECONDS
    recorder.record(aw(), reason="Flap", message="after refill")
    recorder.record(aw(), reason="Flap", message="still too soon")
    events = await posted(fake, recorder)
    assert len(events) == SPAM_BURST + 2
    assert recorder.dropped == 6


@pytest.mark.parametrize(
    ("length", "want_cut"),
    [(MESSAGE_LIMIT, False), (MESSAGE_LIMIT + 1, True), (10 * MESSAGE_LIMIT, True)],
)
def test_cut(length: int, want_cut: bool) -> None:
    message = "x" * length
    got = cut(message)
    assert len(got) <= MESSAGE_LIMIT
    assert got.endswith(CUT) is want_cut
    assert (got == message) is not want_cut


async def test_a_failed_post_is_not_raised() -> None:
    fake = FakeKube()
    fake.fail_next("create", kind="Event", error=NotFound("no namespace"))
    recorder = EventRecorder(fake, clock=Clock())
    recorder.record(aw(), reason="Queued", message="q")
    assert await posted(fake, recorder) == []
