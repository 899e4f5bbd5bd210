"""The same checks against FakeKube and a real API server, so the fake's rules stay true.

Each test runs twice: on `FakeKube` (no cluster needed, fast) and, marked `cluster`, through a
`KubeClient` to the session's control plane, in the test's own namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest
import pytest_asyncio

from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import AlreadyExists, Conflict, NotFound
from testenv.fakekube import FakeKube

CM = ResourceInfo("v1", "ConfigMap", "configmaps", namespaced=True)
AW = ResourceInfo("workload.codeflare.dev/v1beta1", "AppWrapper", "appwrappers", namespaced=True)
NS = ResourceInfo("v1", "Namespace", "namespaces", namespaced=False)
HOLD = "contract.test/hold"


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.cluster)])
def target(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """(namespace, kubeconfig); the cluster fixtures are only asked for by the real half."""
    if request.param == "fake":
        return "contract", None
    cluster = request.getfixturevalue("cluster")
    request.getfixturevalue("appwrapper_crd")
    return str(request.getfixturevalue("namespace")), str(cluster.kubeconfig)


@pytest_asyncio.fixture
async def api(target: tuple[str, str | None]) -> AsyncIterator[tuple[KubeApi, str]]:
    namespace, kubeconfig = target
    if kubeconfig is None:
        fake = FakeKube()
        await fake.create(NS, None, {"metadata": {"name": namespace}})
        yield fake, namespace
        return
    client = await KubeClient.connect(kubeconfig=kubeconfig)
    try:
        yield client, namespace
    finally:
        await client.close()


def cm(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels or {}}, "data": {"v": "0"}}  # fmt: skip


def aw(name: str, finalizers: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "finalizers": finalizers or []}
    return {"apiVersion": AW.group_version, "kind": "AppWrapper", "metadata": meta,
            "spec": {"priority": 1}, "status": {"state": "Running"}}  # fmt: skip


def version(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


async def test_stale_resource_version_conflicts(api: tuple[KubeApi, str]) -> None:
    kube, ns = api
    first = await kube.create(CM, ns, cm("stale"))
    second = await kube.merge_patch(CM, ns, "stale", {"data": {"v": "1"}})
    assert version(second) != version(first)
    first["data"] = {"v": "2"}
    with pytest.raises(Conflict):
        await kube.replace(CM, ns, "stale", first)
    stale = {"metadata": {"resourceVersion": version(first)}, "data": {"v": "3"}}
    with pytest.raises(Conflict):
        await kube.merge_patch(CM, ns, "stale", stale)
    same = await kube.replace(CM, ns, "stale", second)  # no change: no new version
    assert version(same) == version(second)


async def test_already_exists_and_not_found(api: tuple[KubeApi, str]) -> None:
    kube, ns = api
    await kube.create(CM, ns, cm("once"))
    with pytest.raises(AlreadyExists):
        await kube.create(CM, ns, cm("once"))
    with pytest.raises(NotFound):
        await kube.get(CM, ns, "never")
    with pytest.raises(NotFound):
        await kube.replace(CM, ns, "never", cm("never"))
    with pytest.raises(NotFound):
        await kube.merge_patch(CM, ns, "never", {"data": {"v": "1"}})
    await kube.delete(CM, ns, "never")  # the client treats a missing object as deleted


def managers(obj: dict[str, Any]) -> list[str]:
    return [entry.get("manager", "") for entry in obj["metadata"].get("managedFields") or []]


async def test_create_records_its_field_manager(api: tuple[KubeApi, str]) -> None:
    """How the dispatcher tells the objects it made from look-alikes (objects.py)."""
    kube, ns = api
    body = cm("managed") | {"data": {"v": "0", "w": "0"}}
    await kube.create(CM, ns, body, field_manager="appwrapper-dispatcher")
    assert managers(await kube.get(CM, ns, "managed")) == ["appwrapper-dispatcher"]
    # A look-alike made by someone else (kubectl create): not the dispatcher's.
    await kube.create(CM, ns, cm("unmanaged"), field_manager="kubectl-create")
    assert managers(await kube.get(CM, ns, "unmanaged")) == ["kubectl-create"]
    # Someone else's edit takes over the fields it sets; the entry stays while the
    # dispatcher still owns some (every field of a template it created).
    await kube.merge_patch(CM, ns, "managed", {"data": {"v": "1"}}, field_manager="kubectl-edit")
    assert managers(await kube.get(CM, ns, "managed")) == ["appwrapper-dispatcher", "kubectl-edit"]


async def test_status_subresource_and_generation(api: tuple[KubeApi, str]) -> None:
    kube, ns = api
    created = await kube.create(AW, ns, aw("status"))
    assert "status" not in created  # dropped on create
    assert created["metadata"]["generation"] == 1
    on_status = await kube.merge_patch(
        AW, ns, "status", {"status": {"state": "Queued"}, "spec": {"priority": 7}}, sub="status"
    )
    assert on_status["status"] == {"state": "Queued"}
    assert on_status["spec"]["priority"] == 1
    assert on_status["metadata"]["generation"] == 1
    on_status["status"] = {"state": "Failed"}
    on_status["spec"]["priority"] = 5
    on_main = await kube.replace(AW, ns, "status", on_status)
    assert on_main["status"] == {"state": "Queued"}
    assert on_main["spec"]["priority"] == 5
    assert on_main["metadata"]["generation"] == 2
    on_main["status"] = {"state": "Completed"}
    on_main["spec"]["priority"] = 9
    put_status = await kube.replace(AW, ns, "status", on_main, sub="status")
    assert put_status["status"] == {"state": "Completed"}
    assert put_status["spec"]["priority"] == 5
    labelled = await kube.merge_patch(AW, ns, "status", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 2


async def test_finalizers_hold_deletion_and_uid_precondition(api: tuple[KubeApi, str]) -> None:
    kube, ns = api
    created = await kube.create(AW, ns, aw("held", [HOLD]))
    try:
        with pytest.raises(Conflict):
            await kube.delete(AW, ns, "held", uid="00000000-0000-0000-0000-000000000000")
        await kube.delete(AW, ns, "held", uid=created["metadata"]["uid"])
        marked = await kube.get(AW, ns, "held")
        assert marked["metadata"]["deletionTimestamp"]
        assert marked["metadata"]["generation"] == 2  # marking for deletion bumps it
        assert marked["metadata"]["finalizers"] == [HOLD]
        marked["metadata"]["finalizers"] = []
        await kube.replace(AW, ns, "held", marked)
        with pytest.raises(NotFound):
            await kube.get(AW, ns, "held")
    finally:
        with contextlib.suppress(NotFound):
            await kube.merge_patch(AW, ns, "held", {"metadata": {"finalizers": None}})
    plain = await kube.create(CM, ns, cm("plain"))
    await kube.delete(CM, ns, "plain", uid=plain["metadata"]["uid"])
    with pytest.raises(NotFound):
        await kube.get(CM, ns, "plain")


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("group=a", ["a0", "a1", "a2"]),
        ("group!=a", ["b0", "none"]),
        ("group", ["a0", "a1", "a2", "b0"]),
        ("!group", ["none"]),
    ],
)
async def test_label_selected_list_in_pages(
    api: tuple[KubeApi, str], selector: str, expected: list[str]
) -> None:
    kube, ns = api
    mark = {"contract": "list"}  # other objects (kube-root-ca.crt) may share the namespace
    for name, group in [("a0", "a"), ("a1", "a"), ("a2", "a"), ("b0", "b"), ("none", None)]:
        await kube.create(CM, ns, cm(name, {**mark, "group": group} if group else mark))
    query = {"labelSelector": f"contract=list,{selector}", "limit": "2"}
    first = await kube.list(CM, ns, query=query)
    assert first["metadata"]["resourceVersion"]
    names = [item["metadata"]["name"] for item in first["items"]]
    assert len(names) == min(2, len(expected))
    token = first["metadata"].get("continue")
    while token:
        page = await kube.list(CM, ns, query={**query, "continue": token})
        names += [item["metadata"]["name"] for item in page["items"]]
        token = page["metadata"].get("continue")
    assert names == expected


async def test_watch_from_a_version(api: tuple[KubeApi, str]) -> None:
    kube, ns = api
    labels = {"contract-watch": ns}
    await kube.create(CM, ns, cm("w1", labels))
    start = version(await kube.get(CM, ns, "w1"))
    await kube.create(CM, ns, cm("w2", labels))
    await kube.merge_patch(CM, ns, "w2", {"data": {"v": "1"}})
    await kube.create(CM, ns, cm("unlabelled"))
    await kube.delete(CM, ns, "w1")

    async def first_events(count: int) -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        stream = kube.watch(
            CM, resource_version=start, timeout_seconds=30,
            query={"labelSelector": f"contract-watch={ns}"},
        )  # fmt: skip
        async with aclosing(stream) as events:  # type: ignore[type-var]
            async for event in events:
                if event["type"] != "BOOKMARK":
                    seen.append((event["type"], event["object"]["metadata"]["name"]))
                if len(seen) == count:
                    break
        return seen

    events = await asyncio.wait_for(first_events(3), 30)
    assert events == [("ADDED", "w2"), ("MODIFIED", "w2"), ("DELETED", "w1")]
