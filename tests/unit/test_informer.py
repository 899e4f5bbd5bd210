"""The informer's reconnect rules, with a scripted client standing in for the API server
(tests/e2e/test_informer.py covers listing and watching against the real one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import Gone, Unreachable
from dispatcher.kube.informer import Informer

CONFIGMAPS = ResourceInfo("v1", "ConfigMap", "configmaps", namespaced=True)


def configmap(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


class ScriptedServer:
    """Answers lists from `objects`; each watch plays the next script (events, then an error
    or a clean end)."""

    name = "scripted"

    def __init__(self, scripts: list[tuple[list[dict[str, Any]], Exception | None]]) -> None:
        self.scripts = scripts
        self.lists: list[Mapping[str, str]] = []
        self.watched_from: list[str] = []
        self.finished = asyncio.Event()
        self.objects = [configmap("a", "10")]

    async def list(self, info: ResourceInfo, **kwargs: Any) -> dict[str, Any]:
        self.lists.append(kwargs.get("query") or {})
        return {"metadata": {"resourceVersion": "10"}, "items": list(self.objects)}

    async def watch(
        self, info: ResourceInfo, *, resource_version: str, **kwargs: Any
    ) -> AsyncIterator[dict[str, Any]]:
        self.watched_from.append(resource_version)
        if not self.scripts:
            self.finished.set()
            await asyncio.Event().wait()  # an idle watch, until cancelled
        events, error = self.scripts.pop(0)
        for event in events:
            yield event
        if error is not None:
            raise error


async def run_until_scripts_end(server: ScriptedServer) -> Informer:
    informer = Informer(cast(KubeClient, server), CONFIGMAPS)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(server.finished.wait(), 10)
    finally:
        task.cancel()
    return informer


async def test_a_failed_watch_resumes_from_the_last_version_without_relisting() -> None:
    server = ScriptedServer(
        [
            ([{"type": "MODIFIED", "object": configmap("a", "11")}], Unreachable("timed out")),
            ([{"type": "BOOKMARK", "object": configmap("", "15")}], Unreachable("timed out")),
            ([{"type": "ADDED", "object": configmap("b", "16")}], None),
        ]
    )
    informer = await run_until_scripts_end(server)
    assert informer.relists == 1
    assert server.watched_from == ["10", "11", "15", "16"]
    assert informer.store["ns/a"]["metadata"]["resourceVersion"] == "11"
    assert "ns/b" in informer.store


async def test_gone_relists_and_the_list_comes_in_pages() -> None:
    server = ScriptedServer([([], Gone("too old"))])
    informer = await run_until_scripts_end(server)
    assert informer.relists == 2
    assert server.watched_from == ["10", "10"]
    assert all(query.get("limit") == "500" for query in server.lists)


async def test_a_failing_transform_or_handler_costs_one_object_not_the_watch() -> None:
    """User data that breaks the transform or a handler is logged and passed over; the
    watch goes on (ending it would read the same object again on every restart)."""
    events = [
        {"type": "ADDED", "object": configmap("bad", "11")},
        {"type": "ADDED", "object": configmap("good", "12")},
        {"type": "MODIFIED", "object": configmap("bad", "13")},
    ]
    server = ScriptedServer([(events, None)])
    seen: list[str] = []

    def transform(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "bad":
            raise RecursionError("maximum recursion depth exceeded")
        return {**obj, "slim": True}

    def handler(kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        assert new is not None
        if new["metadata"]["name"] == "bad" and kind == "MODIFIED":
            raise TypeError("a handler met an odd field")
        seen.append(f"{kind} {new['metadata']['name']}")

    informer = Informer(cast(KubeClient, server), CONFIGMAPS, transform=transform)
    informer.add_handler(handler)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(server.finished.wait(), 10)
    finally:
        task.cancel()
    assert seen == ["ADDED a", "ADDED bad", "ADDED good"]
    assert informer.resource_version == "13"
    assert informer.store["ns/good"]["slim"] is True
    assert "slim" not in informer.store["ns/bad"]  # kept raw


class PagedServer:
    """Lists `objects` in the pages asked for (`limit`, `continue`); watches stay idle."""

    name = "paged"

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects
        self.limits: list[str] = []

    async def list(self, info: ResourceInfo, **kwargs: Any) -> dict[str, Any]:
        query = kwargs.get("query") or {}
        self.limits.append(query["limit"])
        start = int(query.get("continue") or 0)
        end = start + int(query["limit"])
        more = {"continue": str(end)} if end < len(self.objects) else {}
        return {"metadata": {"resourceVersion": "10", **more}, "items": self.objects[start:end]}

    async def watch(self, info: ResourceInfo, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        await asyncio.Event().wait()
        yield {}


def weighing(name: str, size: int) -> dict[str, Any]:
    return {**configmap(name, "10"), "data": {"blob": "x" * size}}


async def test_pages_are_sized_by_what_the_last_one_weighed() -> None:
    """With `page_bytes`, ten objects of unknown size first, then as many as the budget
    holds at the last page's mean size: 200 KB objects under a 1.1 MB budget come five at a
    time; small ones in pages of `page_size`."""
    for objects, want in (
        ([weighing(f"big-{i}", 200_000) for i in range(30)], ["10", "5", "5", "5", "5"]),
        ([weighing(f"small-{i}", 100) for i in range(700)], ["10", "500", "500"]),
    ):
        server = PagedServer(objects)
        informer = Informer(cast(KubeClient, server), CONFIGMAPS, page_bytes=1_100_000)
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 10)
        finally:
            task.cancel()
        assert server.limits == want
        assert len(informer.store) == len(objects)
