"""What one tenant reads of the visibility API (controller/visibility/api.py) and what its
requests cost (controller/access/reviews.py): queues only where their namespaces may
wait, other namespaces' names hidden, access checks on a budget of their own, kept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from dispatcher.controller.access.gatekeeper import AccessReviews
from dispatcher.controller.access.reviews import ReviewBudget
from dispatcher.controller.visibility.api import BASE, FrontProxy, VisibilityApi
from dispatcher.controller.visibility.webview import QueueRow
from dispatcher.core.mentions import OTHER
from dispatcher.core.visibility import Durations, Occupant, Waiting, pending_view

NOW = 1_800_000_000.0
ALICE = {"X-Remote-User": "alice"}
ROOT = {"X-Remote-User": "root"}


class Trusting(FrontProxy):
    def problem(self, der: bytes | None) -> str:
        return ""


@dataclass
class Server:
    """The API server's SubjectAccessReviews: alice may list AppWrappers in team-a, root
    everywhere; every review asked is counted."""

    asked: list[dict[str, Any]] = field(default_factory=list)

    async def create(self, info: Any, namespace: Any, body: Any, **_: Any) -> dict[str, Any]:
        self.asked.append(body)
        spec = body["spec"]
        where = spec["resourceAttributes"]["namespace"]
        allowed = spec["user"] == "root" or (spec["user"] == "alice" and where == "team-a")
        return {"status": {"allowed": allowed}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


ORDER = [
    Waiting("team-b/secret-big", 5, NOW - 60, "shared"),
    Waiting(
        "team-a/mine",
        0,
        NOW - 30,
        "shared",
        "team-a/q",
        message="waiting behind team-b/secret-big (head of queue shared)",
    ),
]
ACTIVE = [Occupant("team-b/secret-run", NOW - 100, "shared", "Job", 400.0)]
ROWS = [
    QueueRow("shared", (), 2, 1, True, "", admits=("team-a", "team-b")),
    QueueRow("team-b-only", (), 0, 0, True, "", admits=("team-b",)),
    QueueRow("nobody", (), 0, 0, True, "", admits=()),
]


@dataclass
class Api:
    http: TestClient[Any, Any]
    server: Server
    budget: ReviewBudget
    clock: Clock


@pytest_asyncio.fixture
async def api() -> AsyncIterator[Api]:
    server, clock = Server(), Clock()
    budget = ReviewBudget(server, qps=2, burst=5, now=clock)
    visibility = VisibilityApi(
        front_proxy=Trusting(cas=()),
        reviews=AccessReviews(budget, keep_seconds=10, now=clock),
        view=lambda: pending_view(ORDER, ACTIVE, Durations(), NOW),
        leading=lambda: True,
        leader=_nobody,
        appwrapper=lambda key: {"metadata": {"namespace": "team-a", "name": "mine"}},
        queues=lambda: ROWS,
        now=lambda: NOW,
    )
    async with TestClient(TestServer(visibility.app())) as http:
        yield Api(http, server, budget, clock)


async def _nobody() -> str:
    return ""


async def test_a_tenant_sees_only_queues_their_namespaces_use_and_no_other_names(
    api: Api,
) -> None:
    page = await (await api.http.get(f"{BASE}/views/queues", headers=ALICE)).text()
    assert "shared" in page
    assert "team-b-only" not in page
    assert "nobody" not in page
    assert "secret" not in page
    assert "team-a/mine" in page
    assert "another namespace&#x27;s AppWrapper" in page
    everything = await (await api.http.get(f"{BASE}/views/queues", headers=ROOT)).text()
    for name in ("shared", "team-b-only", "nobody", "team-b/secret-big"):
        assert name in everything


async def test_listings_and_one_hide_other_namespaces_names(api: Api) -> None:
    for path in (
        "/pendingappwrappers",
        "/namespaces/team-a/pendingappwrappers",
        "/clusterappqueues/shared/pendingappwrappers",
    ):
        answer = await (await api.http.get(BASE + path, headers=ALICE)).json()
        (item,) = answer["items"]
        assert item["metadata"]["name"] == "mine"
        assert item["position"] == 2  # the one ahead still counts
        assert item["message"] == f"waiting behind {OTHER} (head of queue shared)"
        assert item["eta"]["basis"] == f"unknown: nothing ahead has a known end ({OTHER} next)"
    one = await (
        await api.http.get(f"{BASE}/namespaces/team-a/pendingappwrappers/mine", headers=ALICE)
    ).json()
    assert "secret" not in str(one)
    page = await (await api.http.get(f"{BASE}/namespaces/team-a/views/mine", headers=ALICE)).text()
    assert "secret" not in page
    root = await (await api.http.get(f"{BASE}/pendingappwrappers", headers=ROOT)).json()
    assert root["items"][1]["message"] == "waiting behind team-b/secret-big (head of queue shared)"


async def test_a_flood_of_random_namespaces_costs_bounded_reviews(api: Api) -> None:
    """50 users asking for 50 new namespaces in one instant: the burst (5 reviews) is asked,
    every request beyond it answered 429 at once; a second later 2 more (qps); an answer
    asked again within its 10 s is kept and costs nothing."""
    codes = []
    for index in range(50):
        path = f"{BASE}/namespaces/ns-{index}/pendingappwrappers"
        answer = await api.http.get(path, headers={"X-Remote-User": f"user-{index}"})
        codes.append(answer.status)
        if answer.status == 429:
            assert answer.headers["Retry-After"] == "1"
    # Each of the first two asks two reviews (every namespace? this one?), the third one.
    assert codes == [403, 403] + [429] * 48
    assert len(api.server.asked) == 5
    api.clock.now += 1
    codes = []
    for index in range(50):
        path = f"{BASE}/namespaces/ns-{index}/pendingappwrappers"
        codes.append((await api.http.get(path, headers=ALICE)).status)
    assert codes == [403] + [429] * 49
    assert len(api.server.asked) == 7
    api.clock.now += 1
    for _ in range(3):
        mine = await api.http.get(f"{BASE}/namespaces/team-a/pendingappwrappers", headers=ALICE)
        assert mine.status == 200
    # team-a, then team-b (its AppWrapper is named in mine's message: may alice see it?).
    assert len(api.server.asked) == 9
    assert api.budget.refused == 48 + 49
