"""What belongs to an AppWrapper, on the in-memory API server: pods only in its namespace and
with its uid, objects only those the dispatcher made (and not while they are being deleted),
and only the objects recorded at dispatch, whatever the spec is edited to later.

tests/e2e/test_ownership.py runs the same cases as a user would, on a real API server.
"""

from __future__ import annotations

from typing import Any

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.cluster.member import PODS
from dispatcher.cluster.objects import ensure_namespace
from dispatcher.controller.scheduling.cache import Assumed
from dispatcher.controller.status import APPWRAPPERS
from dispatcher.kube.client import ResourceInfo
from testenv.fakeenv import NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper, deployment, job

DEPLOYMENT = ("apps/v1", "Deployment")
DEPLOYMENTS = ResourceInfo("apps/v1", "Deployment", "deployments", namespaced=True)
JOBS = ResourceInfo("batch/v1", "Job", "jobs", namespaced=True)
Obj = dict[str, Any]


def status_of(obj: Obj) -> Obj:
    return dict(obj.get("status") or {})


async def admitted(env: FakeEnv, name: str) -> None:
    await env.reconcile(name)
    await env.cycle()
    await env.reconcile(name)


async def look_alike_pod(
    env: FakeEnv, name: str, *, namespace: str, labels: dict[str, str], phase: str
) -> None:
    """A pod anyone could run: labelled to look like an AppWrapper's."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
        },
    }
    await env.fake.create(PODS, namespace, pod)
    await env.fake.merge_patch(PODS, namespace, name, {"status": {"phase": phase}}, sub="status")


def victim_labels(name: str, uid: str) -> dict[str, str]:
    return {LABEL_NAME: name, LABEL_NAMESPACE: NAMESPACE, LABEL_UID: uid}


async def pod_counts(env: FakeEnv, name: str) -> tuple[int, int, int, int]:
    status = status_of(await env.get(name))
    return (
        status.get("pending", 0),
        status.get("running", 0),
        status.get("succeeded", 0),
        status.get("failed", 0),
    )


# -- pods -------------------------------------------------------------------------------


async def test_a_look_alike_pod_in_another_namespace_never_counts() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await ensure_namespace(env.fake, "intruder")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        uid = (await env.get("a"))["metadata"]["uid"]
        # The victim's name, namespace and even uid labels: the namespace gives it away.
        await look_alike_pod(
            env, "spoof", namespace="intruder", labels=victim_labels("a", uid), phase="Failed"
        )
        await env.pods("a", 1)
        await env.reconcile("a")
        assert await pod_counts(env, "a") == (0, 1, 0, 0)
        assert (await env.conditions("a"))["Running"] == "True"
        assert env.manager.members["local"].capacity.pod_counts(f"{NAMESPACE}/a", uid).total == 1


async def test_a_look_alike_pod_in_its_namespace_without_its_uid_never_counts() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        name_only = {LABEL_NAME: "a", LABEL_NAMESPACE: NAMESPACE}
        await look_alike_pod(env, "no-uid", namespace=NAMESPACE, labels=name_only, phase="Failed")
        await look_alike_pod(
            env,
            "wrong-uid",
            namespace=NAMESPACE,
            labels=victim_labels("a", "not-its-uid"),
            phase="Succeeded",
        )
        await env.pods("a", 1)
        await env.reconcile("a")
        assert await pod_counts(env, "a") == (0, 1, 0, 0)
        conditions = await env.conditions("a")
        assert conditions["Running"] == "True"
        assert "Failed" not in conditions
        assert "Completed" not in conditions


async def test_delete_and_reapply_counts_only_the_new_incarnations_pods() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        old_uid = (await env.get("a"))["metadata"]["uid"]
        # The first incarnation's pod failed and lingers after its AppWrapper is gone.
        await look_alike_pod(
            env, "old-0", namespace=NAMESPACE, labels=victim_labels("a", old_uid), phase="Failed"
        )
        await env.delete("a")
        await env.reconcile("a")
        await env.reconcile("a")
        assert env.objects("workload.codeflare.dev/v1beta1", "AppWrapper") == []

        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        new_uid = (await env.get("a"))["metadata"]["uid"]
        assert new_uid != old_uid
        await env.pods("a", 1)
        await env.reconcile("a")
        assert await pod_counts(env, "a") == (0, 1, 0, 0)
        conditions = await env.conditions("a")
        assert conditions["Running"] == "True"
        assert "Failed" not in conditions


# -- objects ------------------------------------------------------------------------------


async def test_a_planted_object_with_its_labels_fails_the_dispatch_and_is_left_alone() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await env.reconcile("a")
        uid = (await env.get("a"))["metadata"]["uid"]
        planted = deployment("a", 1, {"cpu": "1"})
        planted["metadata"]["labels"] = victim_labels("a", uid)
        await env.fake.create(DEPLOYMENTS, NAMESPACE, planted)
        await env.cycle()
        await env.reconcile("a")
        status = status_of(await env.get("a"))
        assert status["state"] == "Failed"
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "DispatchFailed"
        assert "Deployment/a" in failed["message"]
        assert "was not created by the dispatcher" in failed["message"]
        # Neither adopted nor deleted by the cleanup that follows a failure.
        await env.reconcile("a")
        [still] = env.objects(*DEPLOYMENT)
        assert still["metadata"]["uid"]
        assert not still["metadata"].get("deletionTimestamp")


async def test_an_object_being_deleted_is_not_adopted_the_dispatch_waits_then_creates() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        [first] = env.objects(*DEPLOYMENT)
        # An earlier attempt's object, held by a finalizer while it goes.
        first["metadata"]["finalizers"] = ["example.com/hold"]
        await env.fake.replace(DEPLOYMENTS, NAMESPACE, "a", first)
        await env.fake.delete(DEPLOYMENTS, NAMESPACE, "a")
        [going] = env.objects(*DEPLOYMENT)
        assert going["metadata"].get("deletionTimestamp")

        await env.restart()  # a new leader, which knows of no objects it made
        assert await env.reconcile("a") == 0.5  # waits for it to go
        [still] = env.objects(*DEPLOYMENT)
        assert still["metadata"]["uid"] == first["metadata"]["uid"]
        assert (await env.conditions("a"))["Dispatched"] == "True"

        env.clock.advance(60)
        assert await env.reconcile("a") == 0.5  # still waiting, within the limit
        going = await env.fake.get(DEPLOYMENTS, NAMESPACE, "a")
        going["metadata"]["finalizers"] = []
        await env.fake.replace(DEPLOYMENTS, NAMESPACE, "a", going)
        assert env.objects(*DEPLOYMENT) == []
        await env.reconcile("a")
        [created] = env.objects(*DEPLOYMENT)
        assert created["metadata"]["uid"] != first["metadata"]["uid"]
        assert not created["metadata"].get("deletionTimestamp")


async def test_a_look_alike_object_in_place_of_its_own_never_completes_it() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", job("a", 1, {"cpu": "1"}), completion="Complete"))
        await admitted(env, "a")
        uid = (await env.get("a"))["metadata"]["uid"]
        await env.fake.delete(JOBS, NAMESPACE, "a")
        fake_job = job("a", 1, {"cpu": "1"})
        fake_job["metadata"]["labels"] = victim_labels("a", uid)
        created = await env.fake.create(JOBS, NAMESPACE, fake_job)
        created["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        await env.fake.replace(JOBS, NAMESPACE, "a", created, sub="status")
        await env.pods("a", 1, phase="Succeeded")
        await env.reconcile("a")
        assert "Completed" not in await env.conditions("a")


async def test_an_object_that_never_goes_sends_the_dispatch_back_to_the_queue() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        [first] = env.objects(*DEPLOYMENT)
        first["metadata"]["finalizers"] = ["example.com/hold"]
        await env.fake.replace(DEPLOYMENTS, NAMESPACE, "a", first)
        await env.fake.delete(DEPLOYMENTS, NAMESPACE, "a")
        await env.restart()
        assert await env.reconcile("a") == 0.5
        env.clock.advance(301)
        await env.reconcile("a")
        status = status_of(await env.get("a"))
        requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
        assert requeued["reason"] == "DispatchFailed"
        assert "Deployment/a still being deleted" in requeued["message"]


# -- edits after dispatch -------------------------------------------------------------------


async def edit(env: FakeEnv, name: str, *items: Obj) -> None:
    current = await env.get(name)
    current["spec"] = appwrapper(name, *items)["spec"]
    await env.fake.replace(APPWRAPPERS, NAMESPACE, name, current)


async def test_renaming_an_item_after_dispatch_deletes_the_old_object_and_requeues() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("old", 1, {"cpu": "1"})))
        await admitted(env, "a")
        recorded = identities(status_of(await env.get("a"))["dispatchedObjects"])
        assert recorded == [("apps/v1", "Deployment", "old")]
        assert [d["metadata"]["name"] for d in env.objects(*DEPLOYMENT)] == ["old"]

        await edit(env, "a", deployment("new", 1, {"cpu": "1"}))
        await env.reconcile("a")
        status = status_of(await env.get("a"))
        requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
        assert requeued["reason"] == "SpecChanged"
        assert "Deployment/old" in requeued["message"]
        assert "Deployment/new" in requeued["message"]
        assert (await env.conditions("a"))["Dispatched"] == "False"
        assert env.objects(*DEPLOYMENT) == []  # the old one went; the new one waits its turn

        await env.cycle()
        await env.reconcile("a")
        assert (await env.conditions("a"))["Dispatched"] == "True"
        assert [d["metadata"]["name"] for d in env.objects(*DEPLOYMENT)] == ["new"]
        recorded = identities(status_of(await env.get("a"))["dispatchedObjects"])
        assert recorded == [("apps/v1", "Deployment", "new")]


def identities(recorded: list[Obj]) -> list[tuple[str, str, str]]:
    return [(r["apiVersion"], r["kind"], r["name"]) for r in recorded]


async def test_an_item_whose_content_is_edited_after_dispatch_is_requeued_and_fitted_again() -> (
    None
):
    """Shrinking a dispatched Deployment's replicas in the spec would leave the dispatcher
    accounting for fewer pods than run: the edit is seen by the content's fingerprint."""
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 6, {"cpu": "1"})))
        await admitted(env, "a")
        [before] = status_of(await env.get("a"))["dispatchedObjects"]
        await edit(env, "a", deployment("a", 1, {"cpu": "1"}))
        await env.reconcile("a")
        status = status_of(await env.get("a"))
        requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
        assert requeued["reason"] == "SpecChanged"
        assert "edited Deployment/a" in requeued["message"]
        assert env.objects(*DEPLOYMENT) == []
        await env.cycle()
        await env.reconcile("a")
        [made] = env.objects(*DEPLOYMENT)
        assert made["spec"]["replicas"] == 1
        [after] = status_of(await env.get("a"))["dispatchedObjects"]
        assert after["digest"] != before["digest"]


async def test_a_record_without_fingerprints_is_compared_by_identity_only() -> None:
    """Records written before fingerprints existed: no requeue on upgrade."""
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        current = await env.get("a")
        for record in current["status"]["dispatchedObjects"]:
            del record["digest"]
        await env.fake.replace(APPWRAPPERS, NAMESPACE, "a", current, sub="status")
        await env.restart()
        await env.reconcile("a")
        assert (await env.conditions("a"))["Dispatched"] == "True"
        assert len(env.objects(*DEPLOYMENT)) == 1


async def test_an_item_added_after_dispatch_is_not_created_without_the_scheduler() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="2")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await admitted(env, "a")
        await edit(env, "a", deployment("a", 1, {"cpu": "1"}), deployment("b", 4, {"cpu": "1"}))
        await env.restart()
        await env.reconcile("a")
        assert env.objects(*DEPLOYMENT) == []
        await env.cycle()  # 5 cpu do not fit in 2: it waits
        await env.reconcile("a")
        assert (await env.conditions("a"))["Dispatched"] == "False"
        assert env.objects(*DEPLOYMENT) == []


async def test_an_edit_between_the_fit_and_the_admission_write_is_not_admitted() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="2")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await env.reconcile("a")
        state = env.manager.scheduler.state
        state.refresh(env.clock.time(), env.manager.quotas.tree())
        fitted = state.queues.workload("team/a")
        assert fitted is not None
        await edit(env, "a", deployment("a", 4, {"cpu": "1"}))
        await env.caught_up()
        # The write for the decision made on the old spec finds the new one: no dispatch.
        state.assume(fitted.key, Assumed(fitted, "local", env.clock.time()))
        await env.manager.scheduler._admit(fitted.key, "local", fitted)
        assert (await env.conditions("a")).get("Dispatched") is None
        await env.cycle()  # 4 cpu do not fit in 2
        assert (await env.conditions("a"))["Dispatched"] == "False"
        assert env.objects(*DEPLOYMENT) == []


async def test_deletion_after_an_edit_removes_what_was_dispatched() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("old", 1, {"cpu": "1"})))
        await admitted(env, "a")
        await edit(env, "a", deployment("new", 1, {"cpu": "1"}))
        await env.delete("a")
        await env.reconcile("a")
        assert env.objects(*DEPLOYMENT) == []
        await env.reconcile("a")
        assert env.objects("workload.codeflare.dev/v1beta1", "AppWrapper") == []


async def test_dispatched_without_a_record_uses_the_spec() -> None:
    """Dispatched by MCAD (no dispatchedObjects): its objects come from the spec."""
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await env.reconcile("a")
        await env.cycle()
        current = await env.get("a")
        del current["status"]["dispatchedObjects"]
        await env.fake.replace(APPWRAPPERS, NAMESPACE, "a", current, sub="status")
        await env.reconcile("a")
        assert [d["metadata"]["name"] for d in env.objects(*DEPLOYMENT)] == ["a"]
        await env.delete("a")
        await env.reconcile("a")
        assert env.objects(*DEPLOYMENT) == []
