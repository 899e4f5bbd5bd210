"""The in-memory API server: each rule it follows, and the real Informer running on it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, cast

import pytest

from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    ServerError,
    TooManyRequests,
    UnknownKind,
    Unreachable,
)
from dispatcher.kube.informer import Informer
from testenv.fakekube import FakeKube
from testenv.fakekube_store import label_selector, merge_patch
from testenv.waits import async_wait_until

CM = ResourceInfo("v1", "ConfigMap", "configmaps", namespaced=True)
AW = ResourceInfo("workload.codeflare.dev/v1beta1", "AppWrapper", "appwrappers", namespaced=True)
NS = ResourceInfo("v1", "Namespace", "namespaces", namespaced=False)


def _both_satisfy_the_protocol(client: KubeClient, fake: FakeKube) -> list[KubeApi]:
    """Type-checked only: mypy rejects this module if either side drifts from KubeApi."""
    return [client, fake]


def cm(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def aw(name: str, priority: int = 0) -> dict[str, Any]:
    return {"apiVersion": AW.group_version, "kind": "AppWrapper", "metadata": {"name": name},
            "spec": {"priority": priority}}  # fmt: skip


async def fresh() -> FakeKube:
    fake = FakeKube()
    await fake.create(NS, None, {"metadata": {"name": "ns"}})
    return fake


async def test_discovery_knows_builtins_added_and_removed_kinds() -> None:
    fake = FakeKube()
    assert await fake.resource_info("apps/v1", "Deployment") == ResourceInfo(
        "apps/v1", "Deployment", "deployments", True
    )
    assert (await fake.resource_info(AW.group_version, "AppWrapper")).plural == "appwrappers"
    assert (await fake.resource_info("coordination.k8s.io/v1", "Lease")).plural == "leases"
    with pytest.raises(UnknownKind):
        await fake.resource_info("example.com/v1", "Widget")
    fake.add_kind("example.com/v1", "Widget", "widgets", namespaced=False)
    widgets = await fake.resource_info("example.com/v1", "Widget")
    await fake.create(widgets, None, {"metadata": {"name": "w"}})
    fake.remove_kind("example.com/v1", "Widget")
    assert await fake.resource_info("example.com/v1", "Widget") == widgets  # cached, as a client
    with pytest.raises(NotFound):
        await fake.get(widgets, None, "w")
    fake.forget_discovery("example.com/v1")
    with pytest.raises(UnknownKind):
        await fake.resource_info("example.com/v1", "Widget")


async def test_server_fields_versions_and_copies() -> None:
    fake = await fresh()
    body = cm("a", x="1")
    created = await fake.create(CM, "ns", body)
    meta = created["metadata"]
    assert meta["uid"]
    assert meta["creationTimestamp"].endswith("Z")
    assert meta["namespace"] == "ns"
    assert "generation" not in meta  # ConfigMaps have none, as on a real server
    assert "uid" not in body["metadata"]  # the caller's dict is untouched
    created["data"]["x"] = "changed"
    assert (await fake.get(CM, "ns", "a"))["data"] == {"x": "1"}
    updated = await fake.merge_patch(CM, "ns", "a", {"data": {"x": "2"}})
    assert int(updated["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert fake.resource_version == updated["metadata"]["resourceVersion"]
    same = await fake.replace(CM, "ns", "a", updated)
    assert same["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]
    named = await fake.create(CM, "ns", {"metadata": {"generateName": "gen-"}})
    assert named["metadata"]["name"].startswith("gen-")


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("create-again", AlreadyExists),
        ("create-no-namespace-object", NotFound),
        ("create-no-name", Invalid),
        ("get-missing", NotFound),
        ("replace-missing", NotFound),
        ("patch-missing", NotFound),
        ("replace-stale", Conflict),
        ("patch-stale", Conflict),
        ("replace-other-uid", Conflict),
        ("replace-wrong-name", BadRequest),
        ("replace-custom-without-version", Invalid),
        ("unknown-subresource", NotFound),
        ("bad-selector", BadRequest),
    ],
)
async def test_errors(call: str, error: type[KubeError]) -> None:
    fake = await fresh()
    first = await fake.create(CM, "ns", cm("a"))
    await fake.merge_patch(CM, "ns", "a", {"data": {"v": "2"}})
    await fake.create(AW, "ns", aw("w"))
    actions = {
        "create-again": lambda: fake.create(CM, "ns", cm("a")),
        "create-no-namespace-object": lambda: fake.create(CM, "elsewhere", cm("b")),
        "create-no-name": lambda: fake.create(CM, "ns", {"metadata": {}}),
        "get-missing": lambda: fake.get(CM, "ns", "b"),
        "replace-missing": lambda: fake.replace(CM, "ns", "b", cm("b")),
        "patch-missing": lambda: fake.merge_patch(CM, "ns", "b", {}),
        "replace-stale": lambda: fake.replace(CM, "ns", "a", first),
        "patch-stale": lambda: fake.merge_patch(CM, "ns", "a", {"metadata": first["metadata"]}),
        "replace-other-uid": lambda: fake.replace(
            CM, "ns", "a", {"metadata": {"name": "a", "uid": "other"}}
        ),
        "replace-wrong-name": lambda: fake.replace(CM, "ns", "a", cm("b")),
        "replace-custom-without-version": lambda: fake.replace(AW, "ns", "w", aw("w")),
        "unknown-subresource": lambda: fake.replace(CM, "ns", "a", cm("a"), sub="status"),
        "bad-selector": lambda: fake.list(CM, "ns", query={"labelSelector": "a=(b"}),
    }
    with pytest.raises(error):
        await actions[call]()


async def test_status_subresource_and_generation() -> None:
    fake = await fresh()
    body = aw("w")
    body["status"] = {"state": "Running"}
    created = await fake.create(AW, "ns", body)
    assert "status" not in created
    assert created["metadata"]["generation"] == 1
    with_status = await fake.merge_patch(
        AW, "ns", "w", {"status": {"state": "Queued"}, "spec": {"priority": 9}}, sub="status"
    )
    assert with_status["status"] == {"state": "Queued"}
    assert with_status["spec"]["priority"] == 0
    assert with_status["metadata"]["generation"] == 1
    with_status["status"] = {"state": "Failed"}
    with_status["spec"]["priority"] = 5
    replaced = await fake.replace(AW, "ns", "w", with_status)
    assert replaced["status"] == {"state": "Queued"}
    assert replaced["spec"]["priority"] == 5
    assert replaced["metadata"]["generation"] == 2
    labelled = await fake.merge_patch(AW, "ns", "w", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 2
    replaced["metadata"]["generation"] = 7  # the server owns it
    replaced["metadata"]["resourceVersion"] = labelled["metadata"]["resourceVersion"]
    assert (await fake.replace(AW, "ns", "w", replaced))["metadata"]["generation"] == 2


async def test_finalizers_uid_precondition_and_garbage_collection() -> None:
    fake = await fresh()
    held = aw("w")
    held["metadata"]["finalizers"] = ["x/hold"]
    uid = (await fake.create(AW, "ns", held))["metadata"]["uid"]
    with pytest.raises(Conflict):
        await fake.delete(AW, "ns", "w", uid="someone-else")
    await fake.delete(AW, "ns", "w", uid=uid)
    marked = await fake.get(AW, "ns", "w")
    assert marked["metadata"]["deletionTimestamp"]
    assert marked["metadata"]["generation"] == 2
    with pytest.raises(Invalid):
        await fake.merge_patch(AW, "ns", "w", {"metadata": {"finalizers": ["x/hold", "y"]}})
    await fake.merge_patch(AW, "ns", "w", {"metadata": {"finalizers": None}})
    with pytest.raises(NotFound):
        await fake.get(AW, "ns", "w")
    await fake.delete(AW, "ns", "w")  # already gone: not an error

    owner = await fake.create(CM, "ns", cm("owner"))
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    for name in ("child", "orphan"):
        await fake.create(CM, "ns", {"metadata": {"name": name, "ownerReferences": [ref]}})
    await fake.delete(CM, "ns", "owner")
    assert [o["metadata"]["name"] for o in fake.objects("v1", "ConfigMap")] == []
    await fake.delete(NS, None, "ns")
    with pytest.raises(NotFound):
        await fake.create(CM, "ns", cm("late"))


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", ["a", "b", "c", "d"]),
        ("team=red", ["a", "b"]),
        ("team==red,tier=1", ["a"]),
        ("team!=red", ["c", "d"]),
        ("team", ["a", "b", "c"]),
        ("!team", ["d"]),
        ("team in (red, blue)", ["a", "b", "c"]),
        ("team notin (red),tier", ["c"]),
    ],
)
async def test_list_label_selectors(selector: str, expected: list[str]) -> None:
    fake = await fresh()
    await fake.create(CM, "ns", cm("a", {"team": "red", "tier": "1"}))
    await fake.create(CM, "ns", cm("b", {"team": "red"}))
    await fake.create(CM, "ns", cm("c", {"team": "blue", "tier": "2"}))
    await fake.create(CM, "ns", cm("d"))
    listing = await fake.list(CM, "ns", query={"labelSelector": selector})
    assert [i["metadata"]["name"] for i in listing["items"]] == expected
    assert listing["metadata"]["resourceVersion"] == fake.resource_version
    assert "kind" not in listing["items"][0]  # built-in list items carry none


async def test_list_pages_namespaces_and_expired_tokens() -> None:
    fake = await fresh()
    await fake.create(NS, None, {"metadata": {"name": "other"}})
    for index in range(5):
        await fake.create(CM, "ns", cm(f"cm-{index}"))
    await fake.create(CM, "other", cm("x"))
    assert len((await fake.list(CM))["items"]) == 6
    first = await fake.list(CM, "ns", query={"limit": "2"})
    assert first["metadata"]["remainingItemCount"] == 3
    await fake.create(CM, "ns", cm("cm-9"))  # after the list's version: not in its pages
    names = [i["metadata"]["name"] for i in first["items"]]
    token = first["metadata"]["continue"]
    while token:
        page = await fake.list(CM, "ns", query={"limit": "2", "continue": token})
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        names += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue", "")
    assert names == [f"cm-{i}" for i in range(5)]
    stale = (await fake.list(CM, "ns", query={"limit": "2"}))["metadata"]["continue"]
    await fake.create(CM, "ns", cm("cm-10"))
    fake.compact()
    with pytest.raises(Gone):
        await fake.list(CM, "ns", query={"limit": "2", "continue": stale})


def test_merge_patch_follows_rfc_7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "l": [3], "n": {"x": None}}
    assert merge_patch(target, patch) == {"a": "z", "c": {"d": "e"}, "l": [3], "n": {}}
    assert target["c"] == {"d": "e", "f": "g"}
    assert label_selector("a in (x,y),!b")({"metadata": {"labels": {"a": "y"}}})


async def settle() -> None:
    """Let started tasks run up to their next real wait."""
    for _ in range(20):
        await asyncio.sleep(0)


async def collect(events: AsyncIterator[dict[str, Any]], n: int) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    async with aclosing(events) as stream:  # type: ignore[type-var]
        async for event in stream:
            seen.append((event["type"], event["object"]["metadata"].get("name", "")))
            if len(seen) == n:
                break
    return seen


async def test_watch_from_a_version_with_selectors_bookmarks_and_ends() -> None:
    fake = await fresh()
    await fake.create(CM, "ns", cm("a", {"w": "1"}))
    start = fake.resource_version
    await fake.create(CM, "ns", cm("b", {"w": "1"}))
    await fake.merge_patch(CM, "ns", "a", {"metadata": {"labels": {"w": "0"}}})  # leaves
    await fake.create(CM, "ns", cm("ignored"))
    stream = fake.watch(CM, resource_version=start, query={"labelSelector": "w=1"})
    task = asyncio.create_task(collect(stream, 4))
    await settle()
    await fake.delete(CM, "ns", "b")
    fake.bookmark()
    assert await task == [("ADDED", "b"), ("DELETED", "a"), ("DELETED", "b"), ("BOOKMARK", "")]
    everything = await collect(fake.watch(CM, resource_version="0"), 2)
    assert everything == [("ADDED", "a"), ("ADDED", "ignored")]

    timed = asyncio.create_task(collect(fake.watch(CM, resource_version=start, query={
        "labelSelector": "none"}, timeout_seconds=30), 1))  # fmt: skip
    await settle()
    fake.advance(10)
    await settle()
    assert not timed.done()
    fake.advance(25)
    assert await timed == []
    ended = asyncio.create_task(collect(fake.watch(CM, resource_version=start), 99))
    await settle()
    fake.end_watches()
    assert len(await ended) == 4
    fake.compact()
    with pytest.raises(Gone):
        await collect(fake.watch(CM, resource_version=start), 1)


async def test_faults_unreachability_and_the_request_log() -> None:
    fake = await fresh()
    await fake.create(CM, "ns", cm("a"))
    fake.fail_next("get", kind="ConfigMap", name="a", error=ServerError("boom"), times=2)
    for _ in range(2):
        with pytest.raises(ServerError):
            await fake.get(CM, "ns", "a")
    await fake.get(CM, "ns", "a")
    await fake.get(CM, "ns", "a")
    fake.fail_next("create", error=TooManyRequests("slow down", retry_after=0), times=2)
    await fake.create(CM, "ns", cm("b"))  # retried, as KubeClient.request does
    fake.fail_next("ping", error=ServerError("503", status=503))
    with pytest.raises(Unreachable):
        await fake.ping()
    fake.fail_next("delete", error=NotFound("gone"))
    await fake.delete(CM, "ns", "a")  # NotFound is swallowed, as by KubeClient.delete
    assert fake.calls[-1] == ("delete", "ConfigMap", "ns", "a", "")
    assert fake.writes == 4
    assert fake.counts["get"] == 4
    assert fake.stats.counts["POST configmaps"] == 4  # one, then three attempts
    fake.unreachable = True
    with pytest.raises(Unreachable):
        await fake.list(CM)
    fake.unreachable = False
    stream = asyncio.create_task(collect(fake.watch(CM, resource_version="0"), 99))
    await settle()
    fake.unreachable = True
    with pytest.raises(Unreachable):
        await stream


async def test_latency_slows_every_request() -> None:
    fake = FakeKube()
    fake.latency = 0.01
    loop = asyncio.get_running_loop()
    began = loop.time()
    await fake.list(NS)
    assert loop.time() - began >= 0.009


async def test_the_informer_lists_watches_and_relists_on_gone() -> None:
    fake = await fresh()
    for index in range(5):
        await fake.create(CM, "ns", cm(f"cm-{index}", {"app": "x"}))
    await fake.create(CM, "ns", cm("other"))
    informer = Informer(cast(KubeClient, fake), CM, label_selector="app=x", page_size=2)
    seen: list[tuple[str, Any]] = []
    informer.add_handler(lambda kind, old, new: seen.append((kind, (new or old or {})["data"])))
    informer.add_handler(lambda kind, old, new: None)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 1)
        assert sorted(informer.store) == [f"ns/cm-{i}" for i in range(5)]
        assert informer.store["ns/cm-1"]["kind"] == "ConfigMap"
        assert fake.counts["list"] == 3

        await fake.merge_patch(CM, "ns", "cm-1", {"data": {"v": "1"}})
        await fake.delete(CM, "ns", "cm-2")
        await settle()
        assert seen[-2:] == [("MODIFIED", {"v": "1"}), ("DELETED", {})]
        assert "ns/cm-2" not in informer.store

        # The watch breaks while changes happen; they were compacted away: relist, diff.
        fake.unreachable = True
        await settle()
        fake.unreachable = False
        await fake.merge_patch(CM, "ns", "cm-3", {"data": {"v": "3"}})
        await fake.delete(CM, "ns", "cm-4")
        await fake.create(CM, "ns", cm("cm-5", {"app": "x"}))
        fake.compact()

        async def relisted() -> bool:
            return informer.relists == 2

        await async_wait_until(relisted, timeout=2, interval=0.005, what="a relist")
        await settle()
        assert sorted(informer.store) == [f"ns/cm-{i}" for i in (0, 1, 3, 5)]
        assert sorted(seen[-3:]) == [("ADDED", {}), ("DELETED", {}), ("MODIFIED", {"v": "3"})]
    finally:
        task.cancel()
