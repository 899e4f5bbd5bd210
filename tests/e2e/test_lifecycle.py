"""Completion, requeueing, time limits and deletion, on the real control plane."""

from __future__ import annotations

import json

import pytest

from dispatcher.app import running
from testenv.waits import async_wait_until
from tests.e2e.conftest import (
    apply,
    appwrapper,
    conditions,
    deployment,
    dispatcher_config,
    get_aw,
    job,
    load_sample,
    pods_of,
    service,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]


async def test_job_completes_and_frees_capacity(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1", cpu="4", memory="16Gi")
    dispatcher = await run_dispatcher()
    await apply(
        cluster,
        namespace,
        appwrapper("first", job("first", 2, {"cpu": "2"}), completion="Complete"),
    )
    await apply(
        cluster,
        namespace,
        appwrapper("second", job("second", 2, {"cpu": "2"}), completion="Complete"),
    )
    await wait_condition(cluster, namespace, "first", "Completed", timeout=90)
    await wait_condition(cluster, namespace, "second", "Completed", timeout=90)
    status = (await get_aw(cluster, namespace, "first"))["status"]
    assert status["state"] == "Completed"
    assert status["succeeded"] == 2
    # Jobs' completion is watched (label-selected to our own), not polled.
    jobs = dispatcher.members["local"].wrapped["batch/v1/Job"]
    assert jobs.synced.is_set()
    assert f"{namespace}/first" in jobs.store

    # Finished ones are held as text from then on, and still counted by state.
    async def packed() -> bool:
        return dispatcher.appwrappers.store.packed() >= 2

    await async_wait_until(packed, timeout=30, what="finished AppWrappers held as text")
    assert dispatcher.appwrappers.store[f"{namespace}/first"]["status"]["state"] == "Completed"
    assert dispatcher.states["Completed"] >= 2


@pytest.mark.parametrize(
    "completion",
    [
        pytest.param("Complete", id="completionstatus"),
        pytest.param(None, id="pods-succeeded"),
    ],
)
async def test_brief_job_is_running_then_completed(
    cluster, namespace, fake_nodes, run_dispatcher, completion
):
    # KWOK turns a Job's pod Succeeded as soon as it runs: it may never be seen Running.
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(
        cluster,
        namespace,
        appwrapper("brief", job("brief", 1, {"cpu": "1"}), completion=completion),
    )
    await wait_condition(cluster, namespace, "brief", "Running", timeout=60)
    await wait_condition(cluster, namespace, "brief", "Completed", timeout=60)
    status = (await get_aw(cluster, namespace, "brief"))["status"]
    assert (status["state"], status["stage"], status["succeeded"]) == ("Completed", "Completed", 1)
    kinds = {c["type"]: c for c in status["conditions"]}
    assert kinds["Running"]["status"] == "True"
    assert kinds["Running"]["reason"] == "PodsRunning"
    assert kinds["Completed"]["status"] == "True"
    assert kinds["Completed"]["reason"] == "PodsCompleted"
    assert kinds["Dispatched"]["status"] == "True"
    assert "Failed" not in kinds


@pytest.mark.parametrize(
    "completion",
    [
        pytest.param("Complete", id="completionstatus"),
        pytest.param(None, id="pods-succeeded"),
    ],
)
async def test_job_that_finished_unseen_is_running_and_completed(
    cluster, namespace, fake_nodes, run_dispatcher, completion
):
    # The pod runs and succeeds while no dispatcher watches, so none ever sees it Running:
    # the next one finds it Succeeded (and the Job Complete) at its first look.
    node = fake_nodes.add("n1")
    gate = {"appwrapper.test/open": "yes"}  # no node has it yet: the pod waits unscheduled
    declared = [{"replicas": 1, "requests": {"cpu": "1"}}]  # so the fit check dispatches
    brief = job("brief", 1, {"cpu": "1"}, nodeSelector=gate)
    async with running(dispatcher_config(cluster, fake_nodes)):
        await apply(
            cluster,
            namespace,
            appwrapper("brief", brief, completion=completion, custom=declared),
        )
        await wait_condition(cluster, namespace, "brief", "Dispatched")
        assert (await conditions(cluster, namespace, "brief"))["Running"] == "False"
    await cluster.akubectl("label", "node", node, "appwrapper.test/open=yes")

    async def pod_succeeded() -> bool:
        pods = await pods_of(cluster, namespace, "brief")
        return [p["status"].get("phase") for p in pods] == ["Succeeded"]

    await async_wait_until(pod_succeeded, timeout=60, what="the pod ran and succeeded")
    await cluster.akubectl(
        "wait", "-n", namespace, "--for=condition=Complete", "job/brief", "--timeout=60s"
    )
    await run_dispatcher()
    await wait_condition(cluster, namespace, "brief", "Running", timeout=60)
    await wait_condition(cluster, namespace, "brief", "Completed", timeout=60)
    status = (await get_aw(cluster, namespace, "brief"))["status"]
    assert (status["state"], status["succeeded"]) == ("Completed", 1)
    running_condition = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running_condition["reason"] == "PodsRunning"
    assert running_condition["message"].startswith("ran to completion: ")


async def test_job_sample_completes(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1")
    await run_dispatcher()
    sample = load_sample("job-completion.yaml")
    await apply(cluster, namespace, sample)
    await wait_condition(cluster, namespace, sample["metadata"]["name"], "Completed", timeout=90)


async def test_pods_that_never_start_are_requeued_then_failed(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("n1")
    await run_dispatcher()
    # Fits by the numbers, but no node has the label the pods insist on.
    stuck = deployment("stuck", 1, {"cpu": "1"}, nodeSelector={"no-such-label": "x"})
    scheduling = {
        "requeuing": {
            "timeInSeconds": 2,
            "growthType": "none",
            "maxNumRequeuings": 2,
            "pauseTimeInSeconds": 0,
        },
    }
    # The fit check honours nodeSelectors; declared pods without it get it dispatched.
    custom = [{"replicas": 1, "requests": {"cpu": "1"}}]
    await apply(
        cluster, namespace, appwrapper("stuck", stuck, scheduling=scheduling, custom=custom)
    )
    await wait_condition(cluster, namespace, "stuck", "Failed", timeout=90)
    status = (await get_aw(cluster, namespace, "stuck"))["status"]
    assert status["requeueCount"] == 2
    assert status["state"] == "Deleted"  # MCAD's name for this end
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "RequeueLimitReached"
    requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
    assert requeued["reason"] == "PodsNotRunningInTime"

    async def objects_gone() -> bool:
        out = await cluster.akubectl("get", "deployment", "stuck", "-n", namespace, check=False)
        return out.returncode != 0

    await async_wait_until(objects_gone, timeout=30, what="stuck Deployment removed")


async def test_dispatch_duration_limit_fails(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(
        cluster,
        namespace,
        appwrapper(
            "limited",
            deployment("limited", 1, {"cpu": "1"}),
            scheduling={"dispatchDuration": {"limit": 3}},
        ),
    )
    await wait_condition(cluster, namespace, "limited", "Running")
    await wait_condition(cluster, namespace, "limited", "Failed", timeout=30)
    status = (await get_aw(cluster, namespace, "limited"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DispatchDurationExceeded"

    async def no_pods() -> bool:
        return not await pods_of(cluster, namespace, "limited")

    await async_wait_until(no_pods, timeout=60, what="pods of the failed AppWrapper gone")


@pytest.mark.parametrize("state", ["queued", "dispatched", "running", "completed", "failed"])
async def test_deletion_removes_objects_in_every_state(
    cluster, namespace, fake_nodes, run_dispatcher, state
):
    fake_nodes.add("n1", cpu="2", memory="8Gi")
    await run_dispatcher()
    items = [service("web"), deployment("web", 1, {"cpu": "1"})]
    scheduling: dict = {}
    completion = None
    custom = None
    if state == "queued":
        items = [service("web"), deployment("web", 1, {"cpu": "4"})]
    elif state == "dispatched":
        items = [deployment("web", 1, {"cpu": "1"}, nodeSelector={"no-such-label": "x"})]
        custom = [{"replicas": 1, "requests": {"cpu": "1"}}]
    elif state == "completed":
        items = [job("web", 1, {"cpu": "1"})]
        completion = "Complete"
    elif state == "failed":
        scheduling = {"dispatchDuration": {"limit": 1}}
    await apply(
        cluster,
        namespace,
        appwrapper("victim", *items, scheduling=scheduling, completion=completion, custom=custom),
    )
    if state == "queued":
        await async_wait_until(
            lambda: _message(cluster, namespace, "victim"), timeout=30, what="queued with a message"
        )
    else:
        wanted = {
            "dispatched": "Dispatched",
            "running": "Running",
            "completed": "Completed",
            "failed": "Failed",
        }[state]
        await wait_condition(cluster, namespace, "victim", wanted, timeout=60)

    await cluster.akubectl(
        "delete", "appwrapper", "victim", "-n", namespace, "--timeout=60s", timeout=90
    )

    # The finalizer goes only once the wrapped objects are gone: none is left when the
    # delete returns.
    wrapped = [f"{item['kind']}/{item['metadata']['name']}" for item in items]
    assert [o for o in await _objects_named_web(cluster, namespace) if o in wrapped] == []

    # What those owned (ReplicaSets, pods) is removed by the garbage collector after them,
    # in the background: all of it goes, live or terminating.
    async def all_gone() -> bool:
        return await _objects_named_web(cluster, namespace) == []

    await async_wait_until(all_gone, timeout=60, what="every object of the AppWrapper gone")

    # The capacity is free again: a new AppWrapper needing all of it dispatches.
    await apply(cluster, namespace, appwrapper("after", deployment("after", 1, {"cpu": "2"})))
    await wait_condition(cluster, namespace, "after", "Running", timeout=60)


async def _objects_named_web(cluster, namespace) -> list[str]:
    out = await cluster.akubectl("get", "all", "-n", namespace, "-o", "json")
    return [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in json.loads(out.stdout)["items"]
        if o["metadata"]["name"].startswith("web")
    ]


async def _message(cluster, namespace, name) -> str | None:
    return ((await get_aw(cluster, namespace, name)).get("status") or {}).get("message")


async def test_conditions_hold_one_entry_per_type(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("once", deployment("once", 2, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "once", "Running")
    status = (await get_aw(cluster, namespace, "once"))["status"]
    types = [c["type"] for c in status["conditions"]]
    assert len(types) == len(set(types))
    assert (await conditions(cluster, namespace, "once"))["Running"] == "True"


async def test_mcad_users_find_the_pods_by_mcad_labels(
    cluster, namespace, fake_nodes, run_dispatcher
):
    """`kubectl get pods -l appwrapper.mcad.ibm.com=NAME,resourceName=OBJECT`, as MCAD's
    users and its own test suite do."""
    fake_nodes.add("n1", cpu="4")
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("mcad-way", deployment("web", 2, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "mcad-way", "Running")
    out = await cluster.akubectl(
        "get",
        "pods",
        "-n",
        namespace,
        "-l",
        "appwrapper.mcad.ibm.com=mcad-way,resourceName=web",
        "-o",
        "name",
    )
    assert len(out.stdout.split()) == 2, out.stdout
    out = await cluster.akubectl(
        "get", "deployment", "-n", namespace, "-l", "appwrapper.mcad.ibm.com=mcad-way", "-o", "name"
    )
    assert out.stdout.split() == ["deployment.apps/web"]
    # And MCAD's status fields, as its users' scripts read them.
    fields = "{.status.canrun},{.status.isdispatched},{.status.numberOfRequeueings}"
    out = await cluster.akubectl(
        "get", "appwrapper", "mcad-way", "-n", namespace, "-o", f"jsonpath={fields}"
    )
    assert out.stdout == "true,true,0", out.stdout
    status = (await get_aw(cluster, namespace, "mcad-way"))["status"]
    assert status["queuejobstate"] == status["stage"]
    assert status["controllerfirsttimestamp"] == status["queuedAt"]


async def test_items_done_while_pods_run_hold_completion(
    cluster, namespace, fake_nodes, run_dispatcher
):
    """MCAD's rule: two Deployments, one with `completionstatus: Progressing` (true while it
    rolls out and runs). Its item reports completion while both Deployments' pods run: the
    AppWrapper is held in RunningHoldCompletion, not Completed; Completed once no pod is
    left."""
    fake_nodes.add("n1", cpu="4")
    await run_dispatcher()
    aw = appwrapper("rhc", deployment("tracked", 1, {"cpu": "1"}), deployment("other", 1, {}))
    aw["spec"]["resources"]["GenericItems"][0]["completionstatus"] = "Progressing"
    await apply(cluster, namespace, aw)

    async def held() -> bool:
        status = (await get_aw(cluster, namespace, "rhc")).get("status") or {}
        return status.get("state") == "RunningHoldCompletion"

    await async_wait_until(held, timeout=60, what="RunningHoldCompletion")
    found = await conditions(cluster, namespace, "rhc")
    assert found["Running"] == "True"
    assert "Completed" not in found
    out = await cluster.akubectl("get", "appwrapper", "rhc", "-n", namespace, "--no-headers")
    assert "RunningHoldCompletion" in out.stdout, out.stdout

    # The pods end (both Deployments scaled to zero): Completed.
    for name in ("tracked", "other"):
        await cluster.akubectl("scale", "deployment", name, "-n", namespace, "--replicas=0")
    await wait_condition(cluster, namespace, "rhc", "Completed", timeout=60)
    status = (await get_aw(cluster, namespace, "rhc"))["status"]
    assert status["state"] == "Completed"
