"""The controller on the in-memory API server: each step of an AppWrapper's life, one
reconcile or one scheduling cycle at a time, with the owner of each step checked.

The real API server runs the same paths in tests/e2e; FakeKube's rules are held to the
real server's by tests/e2e/test_fake_contract.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.controller.status import APPWRAPPERS, UPDATE_ATTEMPTS
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import Conflict
from testenv.fakeenv import NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper, deployment, job

JOB = ("batch/v1", "Job")
DEPLOYMENT = ("apps/v1", "Deployment")
DEPLOYMENTS = ResourceInfo("apps/v1", "Deployment", "deployments", namespaced=True)


def status_of(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status") or {})


async def admitted(env: FakeEnv, name: str) -> None:
    """Taken in by the reconciler, dispatched by the scheduler, objects made."""
    await env.reconcile(name)
    await env.cycle()
    await env.reconcile(name)


async def test_new_appwrapper_gets_finalizer_then_one_write_dispatches_it() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", job("a", 2, {"cpu": "1"}), completion="Complete"))
        assert await env.reconcile("a") is None
        taken = await env.get("a")
        assert "workload.codeflare.dev/finalizer" in taken["metadata"]["finalizers"]
        assert status_of(taken) == {}  # Init and Queueing come with the first decision
        await env.cycle()
        conditions = await env.conditions("a")
        assert conditions["Init"] == conditions["Dispatched"] == "True"
        assert status_of(await env.get("a"))["clusterName"] == "local"
        assert env.objects(*JOB) == []  # the scheduler writes status only
        await env.reconcile("a")
        [created] = env.objects(*JOB)
        assert created["metadata"]["labels"]["workload.codeflare.dev/appwrapper"] == "a"


async def test_invalid_spec_fails_at_once_without_the_scheduler() -> None:
    async with fake_env() as env:
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "r"},
        }
        await env.apply(appwrapper("bad", role))
        await env.reconcile("bad")
        status = status_of(await env.get("bad"))
        assert status["state"] == "Failed"
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "InvalidSpec"
        assert "ClusterRole" in failed["message"]
        assert env.manager.scheduler.cycles == 0


async def test_a_gang_that_does_not_fit_waits_with_numbers_at_head_of_line() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="2")
        await env.apply(appwrapper("big", deployment("big", 3, {"cpu": "1"})))
        await env.reconcile("big")
        await env.cycle()
        await env.until(
            lambda: bool(env.manager.status.current(f"{NAMESPACE}/big").get("status")),
            "waiting message written",
        )
        await env.caught_up()
        status = status_of(await env.get("big"))
        conditions = {c["type"]: c for c in status["conditions"]}
        assert conditions["Dispatched"]["status"] == "False"
        assert conditions["Dispatched"]["reason"] == "InsufficientResources"
        assert "cpu" in conditions["Dispatched"]["message"]
        assert conditions["HeadOfLine"]["status"] == "True"
        assert env.objects(*DEPLOYMENT) == []


async def test_running_pods_make_it_running_and_counts_are_written() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 2, {"cpu": "1"})))
        await admitted(env, "a")
        await env.pods("a", 2)
        uid = (await env.get("a"))["metadata"]["uid"]
        capacity = env.manager.members["local"].capacity
        await env.until(
            lambda: len(capacity.owned_pods(f"{NAMESPACE}/a", uid)) == 2,
            "pods seen",
        )
        await env.reconcile("a")
        status = status_of(await env.get("a"))
        assert (await env.conditions("a"))["Running"] == "True"
        assert status["running"] == 2


async def test_conflict_on_admission_is_decided_again_on_the_object_read_afresh() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await env.reconcile("a")
        env.fake.fail_next("replace", kind="AppWrapper", error=Conflict("stale"))
        await env.cycle()
        assert (await env.conditions("a"))["Dispatched"] == "True"
        assert not env.manager.cache.busy(f"{NAMESPACE}/a")


async def test_conflicts_on_every_attempt_drop_the_assumption_and_decide_again() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await env.reconcile("a")
        env.fake.fail_next(
            "replace", kind="AppWrapper", error=Conflict("stale"), times=UPDATE_ATTEMPTS
        )
        await env.cycle()
        assert (await env.conditions("a")).get("Dispatched") is None
        assert not env.manager.cache.busy(f"{NAMESPACE}/a")
        await env.cycle()
        assert (await env.conditions("a"))["Dispatched"] == "True"


async def test_dispatched_to_an_unknown_cluster_is_requeued() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        current = await env.get("a")
        current["status"]["clusterName"] = "gone"
        await env.fake.replace(APPWRAPPERS, NAMESPACE, "a", current, sub="status")
        await env.reconcile("a")
        status = status_of(await env.get("a"))
        requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
        assert requeued["reason"] == "ClusterUnreachable"
        assert status["state"] == "Pending"


async def test_failed_gives_its_capacity_back_once() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        aw = appwrapper(
            "a", deployment("a", 1, {"cpu": "1"}), scheduling={"dispatchDuration": {"limit": 1}}
        )
        await env.apply(aw)
        await admitted(env, "a")
        assert len(env.objects(*DEPLOYMENT)) == 1
        env.clock.advance(5)
        await env.reconcile("a")
        assert status_of(await env.get("a"))["state"] == "Failed"
        assert env.objects(*DEPLOYMENT) == []
        deletes = env.fake.counts["delete"]
        await env.reconcile("a")
        assert env.fake.counts["delete"] == deletes


async def test_deletion_removes_objects_then_the_finalizer() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        await env.delete("a")
        # The Deployment went at once (its DELETE said so): the finalizer goes in the same
        # reconcile, with no second look at the Deployment.
        assert await env.reconcile("a") is None
        assert env.objects(*DEPLOYMENT) == []
        assert env.objects("workload.codeflare.dev/v1beta1", "AppWrapper") == []


async def test_deletion_waits_for_an_object_held_by_its_own_finalizer() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        hold = {"metadata": {"finalizers": ["example.com/hold"]}}
        await env.fake.merge_patch(DEPLOYMENTS, NAMESPACE, "a", hold)
        await env.delete("a")
        assert await env.reconcile("a") == 0.5  # asked to go; the finalizer waits for it
        assert len(env.objects("workload.codeflare.dev/v1beta1", "AppWrapper")) == 1
        assert await env.reconcile("a") == 0.5  # still there, being deleted
        await env.fake.merge_patch(DEPLOYMENTS, NAMESPACE, "a", {"metadata": {"finalizers": []}})
        assert env.objects(*DEPLOYMENT) == []
        assert await env.reconcile("a") is None
        assert env.objects("workload.codeflare.dev/v1beta1", "AppWrapper") == []


async def test_backoff_waits_out_its_pause_then_queues_again() -> None:
    async with fake_env(requeue_pause_seconds=30.0) as env:
        await env.add_node("n1", cpu="8")
        aw = appwrapper(
            "a", deployment("a", 1, {"cpu": "1"}), scheduling={"requeuing": {"timeInSeconds": 10}}
        )
        await env.apply(aw)
        await admitted(env, "a")
        env.clock.advance(11)  # no pod ran within the window
        await env.reconcile("a")
        assert (await env.conditions("a"))["Backoff"] == "True"
        assert env.objects(*DEPLOYMENT) == []
        env.clock.advance(10)
        assert await env.reconcile("a") == pytest.approx(20)
        env.clock.advance(20)
        assert await env.reconcile("a") is None
        conditions = await env.conditions("a")
        assert conditions["Backoff"] == "False"
        assert conditions["Queueing"] == "True"
