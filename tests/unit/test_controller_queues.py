"""The controller on the queue manager, on the in-memory API server: work that cannot be
admitted is parked, not judged (nor written) again until an event can change its answer,
and stays in the pending list with its last reason.

The queue manager's own rules are table-tested in tests/unit/test_queues.py; the random
walks of tests/unit/test_controller_random.py hold the controller's rules over it.
"""

from __future__ import annotations

from testenv.fakeenv import NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper, job


async def queued(env: FakeEnv, name: str, pods: int, cpu: str) -> None:
    await env.apply(appwrapper(name, job(name, pods, {"cpu": cpu})))
    await env.reconcile(name)


async def test_refused_work_is_parked_until_room_is_freed() -> None:
    # Without preemption: with it, every admission wakes every question (what it admitted
    # may be a victim for any of them; `QueueManager.admitted`).
    async with fake_env(preemption=False) as env:
        await env.add_node("n1", cpu="4")
        big, small = f"{NAMESPACE}/big", f"{NAMESPACE}/small"
        await queued(env, "big", 2, "3")  # 6 cpu do not fit in 4
        await env.cycle()
        scheduler, queues = env.manager.scheduler, env.manager.cache.queues
        assert scheduler.considered[big] == 1
        assert queues.is_parked(big)
        written = (await env.get("big"))["metadata"]["resourceVersion"]
        reason = scheduler.waits()[big].message

        await queued(env, "small", 1, "1")
        await env.cycle()
        await env.cycle()
        assert (await env.conditions("small"))["Dispatched"] == "True"
        # Another's admission neither judges nor writes the parked one again.
        assert scheduler.considered[big] == 1
        assert (await env.get("big"))["metadata"]["resourceVersion"] == written
        view = env.manager.visibility.view()
        assert [p.key for p in view.items] == [big]
        assert view.items[0].message == reason

        await env.add_node("n2", cpu="8")  # room: it is judged again, and fits
        await env.cycle()
        assert scheduler.considered[big] == 2
        assert big not in queues
        assert (await env.conditions("big"))["Dispatched"] == "True"
        assert small not in queues


async def test_a_deleted_parked_appwrapper_leaves_the_queues() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="2")
        await queued(env, "big", 1, "4")
        await env.cycle()
        key = f"{NAMESPACE}/big"
        assert env.manager.cache.queues.is_parked(key)
        await env.delete("big")
        await env.reconcile("big")
        await env.cycle()
        assert key not in env.manager.cache.queues
        assert key not in env.manager.scheduler.waits()
        assert env.manager.visibility.view().items == ()
