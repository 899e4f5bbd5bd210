"""Preemption through the controller on the in-memory API server: the eviction is one
status write on the victim, the reconciler removes its objects, and no leader, new or old,
evicts twice for one need."""

from __future__ import annotations

from dispatcher.kube.errors import Conflict
from testenv.fakeenv import NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper, deployment

DEPLOYMENT = ("apps/v1", "Deployment")


async def fill_with_low(env: FakeEnv, names: list[str]) -> dict[str, list[str]]:
    """Low-priority AppWrappers of 2 CPUs each, dispatched and running on n1."""
    pods = {}
    for name in names:
        await env.apply(appwrapper(name, deployment(name, 1, {"cpu": "2"}), priority=1))
        await env.reconcile(name)
        await env.cycle()
        await env.reconcile(name)
        pods[name] = await env.pods(name, 1, cpu="2")
        env.clock.advance(1)  # dispatched one after the other
    await env.caught_up()
    return pods


async def test_eviction_is_written_on_the_victim_and_carried_out_by_the_reconciler() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="4")
        pods = await fill_with_low(env, ["low-a", "low-b"])
        await env.apply(appwrapper("high", deployment("high", 1, {"cpu": "2"}), priority=10))
        await env.reconcile("high")
        await env.cycle()
        victim = "low-b"  # the most recently dispatched of the lowest priority
        status = (await env.get(victim))["status"]
        assert status["preemptedBy"] == f"{NAMESPACE}/high"
        conditions = {c["type"]: c["status"] for c in status["conditions"]}
        assert conditions["Preempted"] == conditions["Dispatched"] == "True"
        assert len(env.objects(*DEPLOYMENT)) == 2  # the scheduler deletes nothing
        assert env.manager.preemptions == 1
        await env.reconcile(victim)
        assert [d["metadata"]["name"] for d in env.objects(*DEPLOYMENT)] == ["low-a"]
        conditions = await env.conditions(victim)
        assert conditions["Dispatched"] == "False"
        assert conditions["Requeued"] == "True"
        assert (await env.conditions("low-a"))["Dispatched"] == "True"
        # Its pods are still terminating: the claim holds, nobody else is evicted.
        await env.cycle()
        await env.cycle()
        assert env.manager.preemptions == 1
        assert (await env.conditions("low-a"))["Dispatched"] == "True"
        assert (await env.conditions("high")).get("Dispatched") == "False"
        await env.remove_pods(pods[victim])
        await env.cycle()
        assert (await env.conditions("high"))["Dispatched"] == "True"
        assert env.manager.preemptions == 1


async def test_a_new_leader_reads_evictions_under_way_from_the_victims() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="4")
        await fill_with_low(env, ["low-a", "low-b"])
        await env.apply(appwrapper("high", deployment("high", 1, {"cpu": "2"}), priority=10))
        await env.reconcile("high")
        await env.cycle()
        assert env.manager.preemptions == 1
        # The leader dies after the eviction write, before removing anything.
        await env.restart()
        await env.caught_up()
        await env.cycle()
        await env.cycle()
        assert env.manager.preemptions == 0  # the new leader evicted nobody
        assert (await env.conditions("low-a"))["Dispatched"] == "True"
        await env.reconcile("low-b")  # it carries out the eviction the old one wrote
        assert (await env.conditions("low-b"))["Requeued"] == "True"
        await env.cycle()
        assert env.manager.preemptions == 0
        assert (await env.conditions("low-a"))["Dispatched"] == "True"


async def test_equal_priority_is_never_evicted() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="4")
        await fill_with_low(env, ["low-a", "low-b"])
        await env.apply(appwrapper("peer", deployment("peer", 1, {"cpu": "2"}), priority=1))
        await env.reconcile("peer")
        for _ in range(3):
            await env.cycle()
        assert env.manager.preemptions == 0
        assert "preemptedBy" not in (await env.get("low-b"))["status"]


async def test_an_eviction_that_meets_a_conflict_is_written_again() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="4")
        await fill_with_low(env, ["low-a", "low-b"])
        # Something else wrote the victim a moment before the eviction (its pod counts).
        env.fake.fail_next(
            "replace", kind="AppWrapper", name="low-b", error=Conflict("changed", status=409)
        )
        await env.apply(appwrapper("high", deployment("high", 1, {"cpu": "2"}), priority=10))
        await env.reconcile("high")
        await env.cycle()
        await env.until(
            lambda: (
                env.manager.status.current(f"{NAMESPACE}/low-b") is not None
                and "preemptedBy"
                in (env.manager.status.current(f"{NAMESPACE}/low-b") or {}).get("status", {})
            ),
            "the eviction written on the second try",
        )
        status = (await env.get("low-b"))["status"]
        assert status["preemptedBy"] == f"{NAMESPACE}/high"
