"""The visibility API's answers (controller/visibility/api.py) over plain HTTP, its front-proxy
check stood in for: the leader alone answers lists, pages, errors as Kubernetes Status."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from dispatcher.controller.visibility.api import BASE, FrontProxy, VisibilityApi
from dispatcher.core.visibility import Durations, Waiting, pending_view

NOW = 1_800_000_000.0


class Trusting(FrontProxy):
    """Every caller speaks for the user it names (the TLS check is tested elsewhere)."""

    def problem(self, der: bytes | None) -> str:
        return ""


class Reviews:
    """Alice may list AppWrappers in team-a only."""

    async def allowed(self, user: Any, access: Any) -> bool:
        return bool(user.username == "alice" and access.namespace == "team-a")


def order() -> list[Waiting]:
    keys = ["team-a/a1", "team-b/b1", "team-a/a2", "team-a/a3"]
    return [Waiting(key, 0, NOW - 10, "cq", "") for key in keys]


@pytest_asyncio.fixture
async def client() -> AsyncIterator[tuple[TestClient[Any, Any], list[bool]]]:
    leading = [True]

    async def leader() -> str:
        return "replica-1"

    api = VisibilityApi(
        front_proxy=Trusting(cas=()),
        reviews=Reviews(),  # type: ignore[arg-type]
        view=lambda: pending_view(order(), (), Durations(), NOW),
        leading=lambda: leading[0],
        leader=leader,
        appwrapper=lambda key: None,
        queues=lambda: [],
        now=lambda: NOW,
    )
    async with TestClient(TestServer(api.app())) as test_client:
        yield test_client, leading


ALICE = {"X-Remote-User": "alice", "X-Remote-Group": "dev"}


async def test_lists_filter_by_namespace_and_keep_positions(
    client: tuple[TestClient[Any, Any], list[bool]],
) -> None:
    http, _ = client
    answer = await (
        await http.get(f"{BASE}/clusterappqueues/cq/pendingappwrappers", headers=ALICE)
    ).json()
    assert [(i["metadata"]["name"], i["positionInClusterQueue"]) for i in answer["items"]] == [
        ("a1", 1),
        ("a2", 3),
        ("a3", 4),
    ]
    page = await (
        await http.get(f"{BASE}/pendingappwrappers?limit=1&offset=1", headers=ALICE)
    ).json()
    assert page["total"] == 3
    assert [i["metadata"]["name"] for i in page["items"]] == ["a2"]
    refused = await http.get(f"{BASE}/namespaces/team-b/pendingappwrappers", headers=ALICE)
    assert refused.status == 403
    assert (await refused.json())["message"] == "you may not list appwrappers in namespace team-b"
    missing = await http.get(f"{BASE}/namespaces/team-a/pendingappwrappers/gone", headers=ALICE)
    assert missing.status == 404
    bad = await http.get(f"{BASE}/pendingappwrappers?limit=ten", headers=ALICE)
    assert bad.status == 400


async def test_a_standby_names_the_leader_but_serves_discovery(
    client: tuple[TestClient[Any, Any], list[bool]],
) -> None:
    http, leading = client
    leading[0] = False
    answer = await http.get(f"{BASE}/pendingappwrappers", headers=ALICE)
    assert answer.status == 503
    assert "the leader (replica-1)" in (await answer.json())["message"]
    discovery = await http.get(BASE, headers=ALICE)
    assert discovery.status == 200
    assert (await discovery.json())["groupVersion"] == "visibility.workload.codeflare.dev/v1alpha1"


async def test_no_user_no_answer(client: tuple[TestClient[Any, Any], list[bool]]) -> None:
    http, _ = client
    answer = await http.get(f"{BASE}/pendingappwrappers")
    assert answer.status == 401
