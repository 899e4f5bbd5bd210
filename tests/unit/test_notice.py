"""Protected runtime and notice before preemption, through the controller on the in-memory
API server: a victim is told when its objects go and keeps them until then (across a
restart), ends as it ended if it completes or fails meanwhile; work within its minimum runtime
is no victim, and the preemptor says until when it waits for that."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from dispatcher.api.models import parse_time
from dispatcher.controller.scheduling.standing import derive
from dispatcher.controller.status import APPWRAPPERS
from dispatcher.core.protection import CHECKPOINTED_AT, MINIMUM_RUNTIME, removal_time
from dispatcher.core.quota.model import Charge, QueueSpec, QuotaSetup
from dispatcher.kube.events import EVENTS
from testenv.fakeenv import NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper, deployment

DEPLOYMENT = ("apps/v1", "Deployment")
Obj = dict[str, Any]


async def fill_with_low(
    env: FakeEnv, names: list[str], annotations: dict[str, dict[str, str]] | None = None
) -> dict[str, list[str]]:
    """Low-priority AppWrappers of 2 CPUs each, dispatched a second apart, running on n1."""
    pods = {}
    for name in names:
        body = appwrapper(name, deployment(name, 1, {"cpu": "2"}), priority=1)
        body["metadata"]["annotations"] = (annotations or {}).get(name, {})
        await env.apply(body)
        await env.reconcile(name)
        await env.cycle()
        await env.reconcile(name)
        pods[name] = await env.pods(name, 1, cpu="2")
        advance(env, 1)
    await env.caught_up()
    return pods


async def preempt_for_high(env: FakeEnv) -> None:
    await env.apply(appwrapper("high", deployment("high", 1, {"cpu": "2"}), priority=10))
    await env.reconcile("high")
    await env.cycle()


def advance(env: FakeEnv, seconds: float) -> None:
    """Time passes, and the member answers meanwhile (else it would be unreachable: the fake
    sends no heartbeats)."""
    env.clock.advance(seconds)
    env.manager.members["local"].last_answer = env.clock.monotonic()


def preempted(obj: Obj) -> Obj:
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Preempted")


def deployments(env: FakeEnv) -> list[str]:
    return sorted(d["metadata"]["name"] for d in env.objects(*DEPLOYMENT))


async def test_a_victim_is_told_and_keeps_its_objects_until_its_notice_ends() -> None:
    async with fake_env(protection={"notice_seconds": 30}) as env:
        await env.add_node("n1", cpu="4")
        await fill_with_low(env, ["low-a", "low-b"])
        await preempt_for_high(env)
        condition = preempted(await env.get("low-b"))
        chosen = parse_time(condition["lastTransitionMicroTime"]).timestamp()
        assert condition["status"] == "True"
        assert "its objects are removed at" in condition["message"]
        assert removal_time(condition["message"], chosen) == pytest.approx(chosen + 30)
        await env.manager.events.flush(5)
        events = (await env.fake.list(EVENTS, NAMESPACE))["items"]
        told = [e for e in events if e["involvedObject"]["name"] == "low-b"]
        assert any("its objects are removed at" in e["message"] for e in told)

        assert await env.reconcile("low-b") == pytest.approx(30)
        assert deployments(env) == ["low-a", "low-b"]
        advance(env, 29)
        assert await env.reconcile("low-b") == pytest.approx(1)
        assert deployments(env) == ["low-a", "low-b"]
        assert (await env.conditions("high")).get("Dispatched") == "False"
        advance(env, 1)
        await env.reconcile("low-b")
        assert deployments(env) == ["low-a"]
        assert (await env.conditions("low-b"))["Requeued"] == "True"


async def test_a_restarted_dispatcher_keeps_the_same_deadline() -> None:
    async with fake_env(protection={"notice_seconds": 60}) as env:
        await env.add_node("n1", cpu="4")
        await fill_with_low(env, ["low-a", "low-b"])
        await preempt_for_high(env)
        advance(env, 20)
        await env.restart()
        await env.caught_up()
        assert await env.reconcile("low-b") == pytest.approx(40)
        await env.cycle()
        assert env.manager.preemptions == 0  # the claim is read back: nobody else goes
        assert deployments(env) == ["low-a", "low-b"]
        advance(env, 40)
        await env.reconcile("low-b")
        assert deployments(env) == ["low-a"]


async def test_a_victim_that_completes_within_its_notice_is_completed_not_requeued() -> None:
    async with fake_env(protection={"notice_seconds": 30}) as env:
        await env.add_node("n1", cpu="4")
        pods = await fill_with_low(env, ["low-a", "low-b"])
        await preempt_for_high(env)
        await env.reconcile("low-b")
        advance(env, 10)
        await env.set_pod_phase(pods["low-b"], "Succeeded")
        await env.reconcile("low-b")
        await env.reconcile("low-b")
        conditions = await env.conditions("low-b")
        assert conditions["Completed"] == "True"
        assert conditions["Preempted"] == "False"
        assert "Requeued" not in conditions
        status = (await env.get("low-b"))["status"]
        assert "preemptedBy" not in status or not status["preemptedBy"]
        assert status["requeueCount"] == 0
        await env.cycle()
        assert (await env.conditions("high"))["Dispatched"] == "True"
        assert env.manager.preemptions == 1
        assert lost_seconds(env) == 0.0  # it lost nothing: it finished


async def test_a_victim_that_fails_within_its_notice_is_failed_and_cleaned() -> None:
    async with fake_env(protection={"notice_seconds": 30}) as env:
        await env.add_node("n1", cpu="4")
        pods = await fill_with_low(env, ["low-a", "low-b"])
        await preempt_for_high(env)
        await env.set_pod_phase(pods["low-b"], "Failed")
        await env.reconcile("low-b")
        await env.reconcile("low-b")  # finished: its objects are removed as a Failed one's
        conditions = await env.conditions("low-b")
        assert conditions["Failed"] == "True"
        assert conditions["Preempted"] == "False"
        assert "Requeued" not in conditions
        assert deployments(env) == ["low-a"]


async def test_a_claim_lasts_through_a_notice_longer_than_its_timeout() -> None:
    async with fake_env(protection={"notice_seconds": 600}) as env:
        await env.add_node("n1", cpu="4")
        pods = await fill_with_low(env, ["low-a", "low-b"])
        await preempt_for_high(env)
        advance(env, 400)  # past CLAIM_TIMEOUT after the eviction, within the notice
        await env.cycle()
        assert env.manager.preemptions == 1  # low-a is not evicted as well
        assert (await env.conditions("low-a")).get("Preempted") is None
        advance(env, 200)
        await env.reconcile("low-b")
        await env.remove_pods(pods["low-b"])
        await env.cycle()
        assert (await env.conditions("high"))["Dispatched"] == "True"
        assert env.manager.preemptions == 1


async def test_protected_work_is_no_victim_and_the_preemptor_says_until_when() -> None:
    async with fake_env(protection={"minimum_runtime_seconds": 60}) as env:
        await env.add_node("n1", cpu="4")
        await fill_with_low(env, ["low-a", "low-b"])
        dispatched = parse_time((await env.get("low-a"))["status"]["lastDispatchedAt"]).timestamp()
        await preempt_for_high(env)
        assert env.manager.preemptions == 0
        message = (await env.get("high"))["status"]["message"]
        until = datetime.fromtimestamp(dispatched + 60, UTC).strftime("%H:%M:%S UTC")
        assert f"the victims it needs are protected until {until} (minimum runtime)" in message
        # At the end of low-a's protection (low-b's runs a second longer) the parked
        # preemptor is woken, and takes low-a, not the most recently dispatched.
        advance(env, dispatched + 60 - env.clock.time())
        await env.cycle()
        assert env.manager.preemptions == 1
        assert (await env.get("low-a"))["status"]["preemptedBy"] == f"{NAMESPACE}/high"
        assert (await env.conditions("low-b")).get("Preempted") is None


async def test_an_annotation_asks_for_protection_and_a_checkpoint_spares_the_most_recent() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="6")
        await fill_with_low(env, ["low-a", "low-b", "low-c"], {"low-c": {MINIMUM_RUNTIME: "10m"}})
        # low-c is protected; of the others, low-a checkpointed after low-b's dispatch,
        # so evicting it loses less.
        stamp = datetime.fromtimestamp(env.clock.time() - 0.5, UTC).isoformat()
        patch = {"metadata": {"annotations": {CHECKPOINTED_AT: stamp}}}
        await env.fake.merge_patch(APPWRAPPERS, NAMESPACE, "low-a", patch)
        await env.caught_up()
        await preempt_for_high(env)
        assert env.manager.preemptions == 1
        assert (await env.get("low-a"))["status"]["preemptedBy"] == f"{NAMESPACE}/high"


async def test_hostile_annotations_stored_anyway_ask_nothing_and_fail_nothing() -> None:
    hostile = {MINIMUM_RUNTIME: "9" * 10_000 + "h", CHECKPOINTED_AT: "2999-99-99T00:00:00Z"}
    async with fake_env(protection={"max_minimum_runtime_seconds": 600}) as env:
        await env.add_node("n1", cpu="4")
        await fill_with_low(env, ["low-a", "low-b"], {"low-b": hostile})
        assert (await env.conditions("low-b"))["Dispatched"] == "True"
        await preempt_for_high(env)
        assert (await env.get("low-b"))["status"]["preemptedBy"] == f"{NAMESPACE}/high"


async def test_the_standing_takes_the_queues_minimum_runtime_capping_the_ask() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="4")
        await fill_with_low(env, ["low-a"], {"low-a": {MINIMUM_RUNTIME: "2h"}})
        obj = await env.get("low-a")
        status = obj["status"]
        status["admission"] = {"queue": "lq", "clusterQueue": "q", "flavors": []}
        moment = datetime.fromtimestamp(env.clock.time(), UTC)

        def standing(setup: QuotaSetup) -> float:
            found = derive(
                obj,
                f"{NAMESPACE}/low-a",
                env.manager.reader,
                now=moment,
                setup=lambda: setup,
                only_member=lambda: "local",
            )
            assert found.occupying is not None
            return found.occupying.minimum_runtime

        assert standing(QuotaSetup(queues={"q": QueueSpec(name="q", minimum_runtime=900)})) == 900
        assert standing(QuotaSetup(queues={"q": QueueSpec(name="q")})) == 3600  # the setting's cap
        assert standing(QuotaSetup()) == 3600  # its queue gone: as with none


async def test_a_victims_notice_is_its_cluster_queues_else_the_settings() -> None:
    async with fake_env(protection={"notice_seconds": 5}) as env:
        scheduler = env.manager.scheduler
        queues = {"q": QueueSpec(name="q", notice_seconds=40), "none": QueueSpec(name="none")}
        tree = SimpleNamespace(setup=QuotaSetup(queues=queues))
        charges = {"ns/a": Charge("ns/a", "q", {}), "ns/b": Charge("ns/b", "none", {})}
        env.manager.cache.charge_of = charges.get  # type: ignore[method-assign, assignment]
        notice = scheduler._notice
        assert notice("ns/a", tree) == 40  # type: ignore[arg-type]
        assert notice("ns/b", tree) == 0  # type: ignore[arg-type]  # its queue says none
        assert notice("ns/c", tree) == 5  # type: ignore[arg-type]  # admitted through none
        assert notice("ns/a", None) == 5  # no quotas at all


def lost_seconds(env: FakeEnv) -> float:
    registry = env.manager.recorder.registry
    name = "appwrapper_dispatcher_preempted_runtime_lost_seconds_total"
    return registry.get_sample_value(name, {"cluster_queue": ""}) or 0.0


def requeued_message(obj: Obj) -> str:
    return str(next(c for c in obj["status"]["conditions"] if c["type"] == "Requeued")["message"])


async def test_a_checkpoint_within_the_notice_is_all_the_victim_loses() -> None:
    """low-b, dispatched about 1 s before the preemptor, then running 30 s of notice: without
    a checkpoint it loses all of that, said in its requeue message and counted; with one
    declared 25 s into the notice, only the 5 s since."""
    for checkpoint_after, want_lost, since in ((None, 31.0, "dispatch"), (25.0, 5.0, "checkpoint")):
        async with fake_env(protection={"notice_seconds": 30}) as env:
            await env.add_node("n1", cpu="4")
            await fill_with_low(env, ["low-a", "low-b"])
            await preempt_for_high(env)
            await env.reconcile("low-b")
            if checkpoint_after is not None:
                advance(env, checkpoint_after)
                stamp = datetime.fromtimestamp(env.clock.time(), UTC).isoformat()
                patch = {"metadata": {"annotations": {CHECKPOINTED_AT: stamp}}}
                await env.fake.merge_patch(APPWRAPPERS, NAMESPACE, "low-b", patch)
                await env.caught_up()
                advance(env, 30 - checkpoint_after)
            else:
                advance(env, 30)
            await env.reconcile("low-b")
            assert deployments(env) == ["low-a"]
            message = requeued_message(await env.get("low-b"))
            assert f"; {want_lost:.0f}s of runtime lost, since its " in message
            assert since in message
            assert lost_seconds(env) == pytest.approx(want_lost, abs=1.0)
