"""Bad input gets a clear answer and never stops the dispatcher serving others (rule 6)."""

from __future__ import annotations

import pytest

from testenv.localcluster import KubectlError
from testenv.waits import async_holds_for
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    deployment,
    get_aw,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]


def _named(kind: str, name: str | None, **extra: object) -> dict:
    obj: dict = {"apiVersion": "v1", "kind": kind, "metadata": {}}
    if name is not None:
        obj["metadata"]["name"] = name
    obj.update(extra)
    return obj


BAD_ITEMS = [
    pytest.param(_named("ConfigMap", None), "metadata.name", id="missing-name"),
    pytest.param(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "x", "namespace": "elsewhere"},
        },
        "namespace",
        id="other-namespace",
    ),
    pytest.param(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "x"},
        },
        "cluster-scoped",
        id="cluster-scoped",
    ),
    pytest.param(deployment("q", 1, {"cpu": "lots"}), "lots", id="malformed-quantity"),
]


@pytest.mark.parametrize(("item", "expected"), BAD_ITEMS)
async def test_invalid_item_fails_with_a_clear_message(
    cluster, namespace, fake_nodes, run_dispatcher, item, expected
):
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("bad", item))
    await apply(cluster, namespace, appwrapper("good", deployment("good", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "bad", "Failed")
    status = (await get_aw(cluster, namespace, "bad"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert expected in failed["message"], failed["message"]
    assert status["state"] == "Failed"
    # The others are still served.
    await wait_condition(cluster, namespace, "good", "Running")


async def test_request_larger_than_the_cluster_says_so(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("n1", cpu="4", memory="16Gi", gpu=2)
    await run_dispatcher()
    huge = deployment("huge", 1, {"cpu": "1", "nvidia.com/gpu": "16"})
    await apply(cluster, namespace, appwrapper("huge", huge))
    await apply(cluster, namespace, appwrapper("good", deployment("good", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "good", "Running")

    async def huge_waits_saying_why() -> bool:
        status = (await get_aw(cluster, namespace, "huge"))["status"]
        # "good" takes CPU only: both GPUs stay free, and 16 are asked for.
        assert status["message"] == "needs nvidia.com/gpu 16, free 2 of 2", status
        assert status["state"] == "Pending", status
        return True

    await async_holds_for(huge_waits_saying_why, seconds=QUIET_SECONDS, what="huge waits")


async def test_kind_without_crd_fails_and_cleans_up(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1")
    await run_dispatcher()
    # An allowed kind whose CRD (the Kubeflow training operator's) is not installed here.
    unknown = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "w"},
        "spec": {},
    }
    aw = appwrapper(
        "widget", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}, unknown
    )
    await apply(cluster, namespace, aw)
    await wait_condition(cluster, namespace, "widget", "Failed")
    status = (await get_aw(cluster, namespace, "widget"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DispatchFailed"
    assert "PyTorchJob" in failed["message"]
    assert "CustomResourceDefinition" in failed["message"]

    # All or nothing: the ConfigMap created beside it was removed again, and stays removed.
    async def configmap_gone() -> bool:
        out = await cluster.akubectl("get", "configmap", "cm", "-n", namespace, check=False)
        assert out.returncode != 0, out.stdout
        assert "NotFound" in out.stderr, out.stderr
        return True

    await async_holds_for(configmap_gone, seconds=QUIET_SECONDS, what="no ConfigMap cm")


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        pytest.param({"priority": "high"}, "priority", id="priority-not-int"),
        pytest.param(
            {"schedulingSpec": {"requeuing": {"growthType": "cubic"}}}, "growthType", id="bad-enum"
        ),
        pytest.param(
            {
                "resources": {
                    "GenericItems": [
                        {"custompodresources": [{"replicas": -1, "requests": {"cpu": "1"}}]}
                    ]
                }
            },
            "replicas",
            id="negative",
        ),
        pytest.param(
            {
                "resources": {
                    "GenericItems": [{"generictemplate": {"apiVersion": "v1", "metadata": {}}}]
                }
            },
            "generictemplate.kind: Required value",
            id="template-without-kind",
        ),
    ],
)
async def test_schema_errors_are_rejected_at_apply(
    cluster, namespace, appwrapper_crd, patch, expected
):
    aw = appwrapper("schema", deployment("d", 1, {"cpu": "1"}))
    aw["spec"].update(patch)
    with pytest.raises(KubectlError) as error:
        await apply(cluster, namespace, aw)
    assert expected in error.value.stderr


async def test_an_item_without_a_template_is_accepted_and_fails(
    cluster, namespace, fake_nodes, run_dispatcher
):
    """As with MCAD: the API server takes it; the dispatcher fails it, naming the item."""
    fake_nodes.add("n1")
    await run_dispatcher()
    aw = appwrapper("empty", deployment("d", 1, {"cpu": "1"}))
    aw["spec"]["resources"]["GenericItems"].append({"replicas": 1})
    await apply(cluster, namespace, aw)
    await wait_condition(cluster, namespace, "empty", "Failed")
    status = (await get_aw(cluster, namespace, "empty"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"] == "item 1: no generictemplate (the object to create)"


async def test_object_of_someone_else_is_never_touched(
    cluster, namespace, fake_nodes, run_dispatcher
):
    await run_dispatcher()
    theirs = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "taken"},
        "data": {"owner": "someone else"},
    }
    await apply(cluster, namespace, theirs)
    await apply(cluster, namespace, appwrapper("grabber", dict(theirs, data={"owner": "me"})))
    await wait_condition(cluster, namespace, "grabber", "Failed")
    status = (await get_aw(cluster, namespace, "grabber"))["status"]
    assert "does not belong to this AppWrapper" in status["message"]

    async def untouched() -> bool:
        out = await cluster.akubectl(
            "get", "configmap", "taken", "-n", namespace, "-o", "jsonpath={.data.owner}"
        )
        assert out.stdout == "someone else"
        return True

    await async_holds_for(untouched, seconds=QUIET_SECONDS / 2, what="their ConfigMap, failed")
    await cluster.akubectl("delete", "aw", "grabber", "-n", namespace, "--timeout=60s")
    await async_holds_for(untouched, seconds=QUIET_SECONDS / 2, what="their ConfigMap, deleted")
