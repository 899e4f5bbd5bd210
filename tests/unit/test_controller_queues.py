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
        scheduler, queues = env.manager.scheduler, env.manager.scheduler.state.queues
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
        assert env.manager.scheduler.state.queues.is_parked(key)
        await env.delete("big")
        await env.reconcile("big")
        await env.cycle()
        assert key not in env.manager.scheduler.state.queues
        assert key not in env.manager.scheduler.waits()
        assert env.manager.visibility.view().items == ()


async def test_the_schedulers_state_changes_in_its_cycle_alone_and_readers_see_the_last() -> None:
    """Arrivals, admissions written, deletions and the readers' reads (the queues' status, the
    metrics' figures, the pending list) between two cycles change nothing the scheduler
    keeps; the view they read is what the last cycle left, until the next one runs."""
    async with fake_env(preemption=False) as env:
        manager = env.manager
        state = manager.scheduler.state
        await env.add_node("n1", cpu="4")
        await queued(env, "a", 1, "3")
        await env.cycle()
        assert (await env.conditions("a"))["Dispatched"] == "True"
        before = manager.scheduler.view()
        kept = (state.queues.changes, state.charges_changed, len(state.queues))
        await queued(env, "b", 1, "3")  # does not fit beside a
        await queued(env, "c", 1, "1")
        await env.delete("a")
        await env.reconcile("a")
        manager.quotas.summarize()
        manager.pending_figures()
        manager.visibility.view()
        await manager.quotas.write_status()
        assert (state.queues.changes, state.charges_changed, len(state.queues)) == kept
        assert manager.scheduler.view() is before
        assert before.pending == ()
        assert [key for key, _, _ in before.running] == [f"{NAMESPACE}/a"]
        await env.cycle()
        after = manager.scheduler.view()
        assert after is not before
        assert {w.key for w in after.pending} | {k for k, _, _ in after.running} == {
            f"{NAMESPACE}/b",
            f"{NAMESPACE}/c",
        }
