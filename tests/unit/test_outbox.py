"""Notices are delivered after the write that raised them returned, never inside it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dispatcher.controller.lifecycle.reconciler import Reconciler
from dispatcher.controller.outbox import Notice, Outbox
from dispatcher.kube.client import ResourceInfo
from testenv.fakeenv import NAMESPACE, fake_env
from testenv.manifests import appwrapper, job

JOBS = ResourceInfo("batch/v1", "Job", "jobs", namespaced=True)


def notice(key: str) -> Notice:
    return Notice(key, decision=True, finished=False)


async def test_a_holder_gets_its_notices_when_its_block_ends() -> None:
    delivered: list[str] = []
    outbox = Outbox(lambda n: delivered.append(n.key))
    with outbox.deferring():
        outbox.put(notice("a"))
        await asyncio.sleep(0)  # a loop turn passes: still held
        await asyncio.sleep(0)
        assert delivered == []
    assert delivered == ["a"]


async def test_a_loose_notice_waits_for_the_next_loop_turn() -> None:
    delivered: list[str] = []
    outbox = Outbox(lambda n: delivered.append(n.key))
    outbox.put(notice("a"))
    outbox.put(notice("b"))
    assert delivered == []  # not inside the call that put it
    await asyncio.sleep(0)
    assert delivered == ["a", "b"]


async def test_holders_do_not_deliver_each_others_notices() -> None:
    delivered: list[str] = []
    outbox = Outbox(lambda n: delivered.append(n.key))
    first_put = asyncio.Event()
    release = asyncio.Event()

    async def holder(key: str, signal: asyncio.Event | None) -> None:
        with outbox.deferring():
            outbox.put(notice(key))
            if signal is not None:
                signal.set()
            await release.wait()

    slow = asyncio.create_task(holder("slow", first_put))
    await first_put.wait()

    async def quick() -> None:
        with outbox.deferring():
            outbox.put(notice("quick"))

    await quick()
    assert delivered == ["quick"]
    release.set()
    await slow
    assert delivered == ["quick", "slow"]


async def test_a_finished_life_is_forgotten_after_the_write_not_inside_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The write that ends a life (Completed) used to make the reconciler forget the
    AppWrapper inside its own await; now the owners act once the reconcile returned, and
    nothing the reconcile kept after the write outlives it."""
    writing: list[str] = []
    forgotten_while_writing: list[list[str]] = []
    forget = Reconciler.forget

    def watched_forget(self: Reconciler, key: str) -> None:
        forgotten_while_writing.append(list(writing))
        forget(self, key)

    monkeypatch.setattr(Reconciler, "forget", watched_forget)
    async with fake_env(loops=True) as env:
        manager = env.manager
        write = manager.status.write

        async def watched_write(obj: dict[str, Any], *args: Any) -> dict[str, Any]:
            writing.append(obj["metadata"]["name"])
            try:
                return await write(obj, *args)
            finally:
                writing.pop()

        manager.status.write = watched_write  # type: ignore[method-assign]
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", job("a", 1, {"cpu": "1"}), completion="Complete"))
        await env.until(lambda: len(env.objects("batch/v1", "Job")) == 1, "the Job is made")
        pods = await env.pods("a", 1)
        await env.set_pod_phase(pods, "Succeeded")
        done = {"type": "Complete", "status": "True"}
        await env.fake.merge_patch(
            JOBS, NAMESPACE, "a", {"status": {"conditions": [done]}}, sub="status"
        )
        await env.until(lambda: manager.finished["count"] == 1, "its life counted")
        await env.caught_up()
        assert forgotten_while_writing  # the ledger did have the reconciler forget it
        assert all(w == [] for w in forgotten_while_writing), forgotten_while_writing
        key = f"{NAMESPACE}/a"
        assert key not in manager.reconciler._pacing._counts_written
        assert key not in manager.reconciler._ensured
