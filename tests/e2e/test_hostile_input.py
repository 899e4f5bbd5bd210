"""Hostile AppWrappers, walked as a user would: `kubectl apply`, `kubectl wait
--for=condition=Failed`, `kubectl delete`. Each is Failed with a clear, bounded message (or
refused by the CRD at apply), is deleted without a stuck finalizer, and the dispatcher goes
on serving the AppWrapper applied after it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.core.validation import MAX_ITEMS, MAX_MESSAGE_CHARS
from testenv.localcluster import KubectlError
from tests.e2e.conftest import apply, appwrapper, deployment, get_aw, wait_condition

pytestmark = [pytest.mark.cluster]


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


def config_map(name: str, **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **metadata}}


async def failed_message(cluster: Any, namespace: str, name: str) -> str:
    await wait_condition(cluster, namespace, name, "Failed")
    status = (await get_aw(cluster, namespace, name))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert status["state"] == "Failed"
    assert len(failed["message"]) <= MAX_MESSAGE_CHARS
    return f"{failed['reason']}: {failed['message']}"


async def still_serves_and_deletes(cluster: Any, namespace: str, bad: str) -> None:
    """Another AppWrapper is dispatched after the bad one; the bad one deletes at once."""
    await apply(cluster, namespace, appwrapper("good", deployment("good", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "good", "Running")
    await cluster.akubectl(
        "delete", "appwrapper", bad, "-n", namespace, "--timeout=30s", timeout=45
    )
    gone = await cluster.akubectl(
        "get", "appwrapper", bad, "-n", namespace, "--ignore-not-found", "-o", "name"
    )
    assert gone.stdout.strip() == ""


async def test_a_template_500_levels_deep(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("deep", {**config_map("deep"), "x": nested(500)}))
    assert await failed_message(cluster, namespace, "deep") == (
        "InvalidSpec: item 0 (ConfigMap/deep): generictemplate is nested more than 64 levels deep"
    )
    await still_serves_and_deletes(cluster, namespace, "deep")


@pytest.mark.parametrize(
    ("template", "says"),
    [
        pytest.param(
            config_map("o", ownerReferences=1),
            "cannot unmarshal number into Go struct field ObjectMeta.ownerReferences",
            id="owner-references-of-the-wrong-type",
        ),
        pytest.param(
            {"apiVersion": "../api/v1/pods", "kind": "Pod", "metadata": {"name": "p"}},
            'generictemplate.apiVersion: Invalid value: "../api/v1/pods"',
            id="api-version-that-is-a-path",
        ),
    ],
)
async def test_a_template_that_is_not_an_object_is_refused_at_apply(
    cluster, namespace, run_dispatcher, template, says
):
    """The CRD declares each template an embedded object (as MCAD's does): the API server
    checks its apiVersion and metadata before the AppWrapper exists. The dispatcher's own
    checks of the same (for AppWrappers stored under an older CRD) are in the unit tests."""
    await run_dispatcher()
    with pytest.raises(KubectlError) as refused:
        await apply(cluster, namespace, appwrapper("refused", template))
    assert says in str(refused.value), str(refused.value)


async def test_an_api_version_with_a_query(cluster, namespace, fake_nodes, run_dispatcher):
    """Passes the API server's check (group "apps", version "v1?x=1"); the dispatcher's
    grammar refuses it before any URL is built."""
    fake_nodes.add("n1")
    await run_dispatcher()
    template = {"apiVersion": "apps/v1?x=1", "kind": "Deployment", "metadata": {"name": "d"}}
    await apply(cluster, namespace, appwrapper("query", template))
    message = await failed_message(cluster, namespace, "query")
    assert message.startswith("InvalidSpec: item 0 (Deployment/d): apiVersion 'apps/v1?x=1'"), (
        message
    )
    await still_serves_and_deletes(cluster, namespace, "query")


async def test_too_many_items_are_refused_at_apply(cluster, namespace, run_dispatcher):
    await run_dispatcher()
    items = [config_map(f"c{i}") for i in range(MAX_ITEMS + 1)]
    with pytest.raises(KubectlError) as refused:
        await apply(cluster, namespace, appwrapper("many", *items))
    assert "must have at most 100 items" in str(refused.value), str(refused.value)


async def test_an_oversized_template_fails_with_a_bounded_message(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("n1")
    await run_dispatcher()
    # 300 KiB of data (ConfigMap values are unbounded strings to the CRD). `kubectl create`:
    # `apply` would also store the whole object in an annotation, itself limited to 256 KiB.
    big = {**config_map("big"), "data": {f"k{i}": "v" * 1024 for i in range(300)}}
    await cluster.akubectl(
        "create", "-n", namespace, "-f", "-", input=json.dumps(appwrapper("big", big))
    )
    message = await failed_message(cluster, namespace, "big")
    assert message == "InvalidSpec: item 0 (ConfigMap/big): generictemplate is larger than 256 KiB"
    await still_serves_and_deletes(cluster, namespace, "big")
