"""No tenant can fool the dispatcher about what belongs to an AppWrapper, as a user would try
it with kubectl: look-alike pods, planted objects, edits after dispatch, delete and re-apply.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    deployment,
    get_aw,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]

NAME = "workload.codeflare.dev/appwrapper"
NAMESPACE = "workload.codeflare.dev/appwrapper-namespace"
UID = "workload.codeflare.dev/appwrapper-uid"


async def finished_pod(cluster: Any, namespace: str, name: str, labels: dict[str, str]) -> None:
    """`kubectl create` a pod wearing `labels` that never lands on a node, then report it
    Failed as a kubelet would (a pod anyone with access to `namespace` can make)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [{"name": "c", "image": "busybox"}],
            "nodeSelector": {"appwrapper.test/no-such-pool": "x"},
        },
    }
    await cluster.akubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pod))
    await cluster.akubectl(
        "patch",
        "pod",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Failed"}}),
    )


async def still_running_with_no_failed_pod(cluster: Any, namespace: str, name: str) -> None:
    async def healthy() -> bool:
        status = (await get_aw(cluster, namespace, name))["status"]
        assert status["state"] == "Running", status
        assert status.get("failed", 0) == 0, status
        assert status.get("running") == 1, status
        assert not any(
            c["type"] in ("Failed", "Requeued") and c["status"] == "True"
            for c in status["conditions"]
        ), status
        return True

    await async_holds_for(healthy, seconds=QUIET_SECONDS, what=f"{name} unaffected")


async def test_look_alike_pods_never_count(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("victim", deployment("victim", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "victim", "Running")
    uid = (await get_aw(cluster, namespace, "victim"))["metadata"]["uid"]
    other = f"{namespace}-x"[:63]
    await cluster.akubectl("create", "namespace", other)
    try:
        # Another tenant's namespace, with every label of the victim's pods, uid included.
        labels = {NAME: "victim", NAMESPACE: namespace, UID: uid}
        await finished_pod(cluster, other, "spoof", labels)
        # The victim's own namespace, with its name but not its uid.
        await finished_pod(cluster, namespace, "no-uid", {NAME: "victim", NAMESPACE: namespace})
        await finished_pod(
            cluster, namespace, "wrong-uid", {NAME: "victim", NAMESPACE: namespace, UID: "x"}
        )
        await still_running_with_no_failed_pod(cluster, namespace, "victim")
    finally:
        await cluster.akubectl("delete", "namespace", other, "--wait=false", check=False)


async def test_a_planted_object_fails_the_dispatch_and_is_left_alone(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("n1")
    await apply(cluster, namespace, appwrapper("target", deployment("target", 1, {"cpu": "1"})))
    uid = (await get_aw(cluster, namespace, "target"))["metadata"]["uid"]
    planted = deployment("target", 1, {"cpu": "1"})
    planted["metadata"]["labels"] = {NAME: "target", NAMESPACE: namespace, UID: uid}
    await cluster.akubectl("create", "-n", namespace, "-f", "-", input=json.dumps(planted))
    await run_dispatcher()
    await wait_condition(cluster, namespace, "target", "Failed")
    status = (await get_aw(cluster, namespace, "target"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DispatchFailed"
    assert "Deployment/target" in failed["message"]
    assert "was not created by the dispatcher" in failed["message"]

    async def planted_stays() -> bool:
        out = await cluster.akubectl(
            "get", "deployment", "target", "-n", namespace, "-o", "json", check=False
        )
        assert out.returncode == 0, out.stderr
        meta = json.loads(out.stdout)["metadata"]
        assert not meta.get("deletionTimestamp"), meta
        return True

    await async_holds_for(planted_stays, seconds=QUIET_SECONDS, what="the planted Deployment")


async def test_renaming_an_item_after_dispatch_requeues_with_the_new_spec(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("edited", deployment("before", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "edited", "Running")
    await apply(cluster, namespace, appwrapper("edited", deployment("after", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "edited", "Requeued")
    status = (await get_aw(cluster, namespace, "edited"))["status"]
    requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
    assert requeued["reason"] == "SpecChanged"
    assert "Deployment/before" in requeued["message"]

    async def dispatched_again_with_the_new_object() -> bool:
        status = (await get_aw(cluster, namespace, "edited"))["status"]
        running = next((c for c in status["conditions"] if c["type"] == "Running"), None)
        return bool(
            running is not None
            and running["status"] == "True"
            and [(r["kind"], r["name"]) for r in status.get("dispatchedObjects") or []]
            == [("Deployment", "after")]
        )

    await async_wait_until(dispatched_again_with_the_new_object, timeout=60, what="re-dispatched")

    async def only_the_new_one() -> bool:
        out = await cluster.akubectl("get", "deployments", "-n", namespace, "-o", "name")
        return out.stdout.split() == ["deployment.apps/after"]

    await async_wait_until(only_the_new_one, timeout=60, what="Deployment before deleted")
    out = await cluster.akubectl("get", "deployments", "-n", namespace, "-o", "name")
    assert out.stdout.split() == ["deployment.apps/after"]

    # Its content edited (same object, three replicas): requeued again, and dispatched with it.
    await apply(cluster, namespace, appwrapper("edited", deployment("after", 3, {"cpu": "1"})))

    async def requeued_for_the_content() -> bool:
        status = (await get_aw(cluster, namespace, "edited"))["status"]
        requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
        return "edited Deployment/after" in requeued["message"]

    await async_wait_until(requeued_for_the_content, timeout=60, what="requeued for the edit")

    async def three_replicas() -> bool:
        out = await cluster.akubectl(
            "get", "deployment", "after", "-n", namespace, "-o", "json", check=False
        )
        return out.returncode == 0 and json.loads(out.stdout)["spec"]["replicas"] == 3

    await async_wait_until(three_replicas, timeout=60, what="dispatched with three replicas")


async def test_delete_and_reapply_counts_only_the_new_appwrappers_pods(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("again", deployment("again", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "again", "Running")
    old_uid = (await get_aw(cluster, namespace, "again"))["metadata"]["uid"]
    # A failed pod of the first AppWrapper that outlives it.
    await finished_pod(
        cluster, namespace, "left-over", {NAME: "again", NAMESPACE: namespace, UID: old_uid}
    )
    await cluster.akubectl(
        "delete", "appwrapper", "again", "-n", namespace, "--timeout=60s", timeout=90
    )
    await apply(cluster, namespace, appwrapper("again", deployment("again", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "again", "Running")
    assert (await get_aw(cluster, namespace, "again"))["metadata"]["uid"] != old_uid
    await still_running_with_no_failed_pod(cluster, namespace, "again")
