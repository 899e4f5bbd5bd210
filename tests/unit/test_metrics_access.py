"""/metrics behind the API server's own authentication and authorization
(`metrics.auth: kubernetes`), with a fake API server: a bearer token is reviewed
(TokenReview), its user asked about `get /metrics` (SubjectAccessReview); answers are kept
briefly and shared in flight; a flood of made-up tokens costs a bounded number of reviews
and never pushes the scraper's answer out. /healthz and /readyz stay open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from dispatcher import health
from dispatcher.config import MetricsConfig
from dispatcher.controller.access.metrics import MetricsAccess, bearer_token
from dispatcher.kube.errors import ServerError
from testenv.ports import free_port

GOOD = "token-of-prometheus"
NOBODY = "token-of-a-pod-without-the-right"
PROMETHEUS = "system:serviceaccount:monitoring:prometheus"
OTHER = "system:serviceaccount:team-a:default"


class FakeApiServer:
    """TokenReviews and SubjectAccessReviews as the API server answers them: `users` maps
    the tokens it accepts to their user; `allowed` holds the users who may get a path.
    Reviews wait for `gate` (set from the start unless a test holds it)."""

    def __init__(self) -> None:
        self.users = {GOOD: PROMETHEUS, NOBODY: OTHER}
        self.allowed = {(PROMETHEUS, "/metrics")}
        self.token_reviews: list[str] = []
        self.access_reviews: list[dict[str, Any]] = []
        self.fail: Exception | None = None
        self.gate = asyncio.Event()
        self.gate.set()

    async def create(self, info: Any, namespace: Any, body: Any, **_: Any) -> dict[str, Any]:
        await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        if body["kind"] == "TokenReview":
            token = body["spec"]["token"]
            self.token_reviews.append(token)
            user = self.users.get(token)
            if user is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            groups = ["system:serviceaccounts", "system:authenticated"]
            return {"status": {"authenticated": True, "user": {"username": user, "groups": groups}}}
        assert body["kind"] == "SubjectAccessReview"
        spec = body["spec"]
        self.access_reviews.append(spec)
        attributes = spec["nonResourceAttributes"]
        allowed = attributes["verb"] == "get" and (spec["user"], attributes["path"]) in (
            self.allowed
        )
        return {"status": {"allowed": allowed}}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Scrape = Callable[..., Awaitable[tuple[int, str, dict[str, str]]]]


@pytest.fixture
def api() -> FakeApiServer:
    return FakeApiServer()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def access(api: FakeApiServer, clock: Clock) -> MetricsAccess:
    return MetricsAccess(api, qps=5, burst=20, keep_seconds=10, now=clock)


@pytest_asyncio.fixture
async def scrape(access: MetricsAccess) -> AsyncIterator[Scrape]:
    """GET a path of a health port served with `access`, as a given token (or none)."""
    port = free_port()
    runner = await health.serve(
        port=port,
        host="127.0.0.1",
        ready=lambda: True,
        metrics=lambda: "appwrapper_dispatcher_up 1\n",
        access=access,
    )
    session = aiohttp.ClientSession()

    async def get(
        token: str | None, path: str = "/metrics", header: str | None = None
    ) -> tuple[int, str, dict[str, str]]:
        headers = {"Authorization": header or f"Bearer {token}"} if header or token else {}
        async with session.get(f"http://127.0.0.1:{port}{path}", headers=headers) as response:
            return response.status, await response.text(), dict(response.headers)

    try:
        yield get
    finally:
        await session.close()
        await runner.cleanup()


async def test_a_token_the_api_server_accepts_with_the_right_is_served(
    scrape: Scrape, api: FakeApiServer
) -> None:
    status, text, _ = await scrape(GOOD)
    assert (status, text) == (200, "appwrapper_dispatcher_up 1\n")
    assert api.token_reviews == [GOOD]
    (review,) = api.access_reviews
    assert review["user"] == PROMETHEUS
    assert review["groups"] == ["system:serviceaccounts", "system:authenticated"]
    assert review["nonResourceAttributes"] == {"verb": "get", "path": "/metrics"}
    assert "resourceAttributes" not in review


async def test_a_token_the_api_server_refuses_is_401_and_asks_no_access_review(
    scrape: Scrape, api: FakeApiServer
) -> None:
    status, _, headers = await scrape("made-up")
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert api.token_reviews == ["made-up"]
    assert api.access_reviews == []


async def test_a_user_without_the_right_is_403(scrape: Scrape, api: FakeApiServer) -> None:
    status, text, _ = await scrape(NOBODY)
    assert status == 403
    assert text == f"Forbidden: {OTHER} may not get /metrics"
    assert [r["user"] for r in api.access_reviews] == [OTHER]


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(None, id="no-header"),
        pytest.param("Basic dXNlcjpwYXNz", id="basic"),
        pytest.param("Bearer", id="bearer-without-token"),
        pytest.param("Bearer a b", id="two-tokens"),
        pytest.param("Bearer " + "x" * 8100, id="longer-than-any-token"),
    ],
)
async def test_no_bearer_token_is_401_and_asks_nothing(
    scrape: Scrape, api: FakeApiServer, header: str | None
) -> None:
    status, _, _ = await scrape(None, header=header)
    assert status == 401
    assert (api.token_reviews, api.access_reviews) == ([], [])


@pytest.mark.parametrize(
    ("header", "want"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("  Bearer   abc  ", "abc"),
        ("Bearer", None),
        ("Token abc", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, want: str | None) -> None:
    assert bearer_token(header) == want


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_the_probes_stay_open(scrape: Scrape, api: FakeApiServer, path: str) -> None:
    status, text, _ = await scrape(None, path=path)
    assert (status, text) == (200, "ok")
    assert api.token_reviews == []


async def test_answers_are_kept_for_their_time_then_asked_again(
    scrape: Scrape, api: FakeApiServer, clock: Clock
) -> None:
    for _ in range(5):
        assert (await scrape(GOOD))[0] == 200
    assert (len(api.token_reviews), len(api.access_reviews)) == (1, 1)
    clock.now += 9.9
    api.allowed.clear()  # taken away: seen once the kept answer is old
    assert (await scrape(GOOD))[0] == 200
    clock.now += 0.2
    assert (await scrape(GOOD))[0] == 403
    assert (len(api.token_reviews), len(api.access_reviews)) == (2, 2)


async def test_a_burst_of_scrapes_shares_one_review_in_flight(
    access: MetricsAccess, api: FakeApiServer
) -> None:
    api.gate.clear()
    burst = [
        asyncio.create_task(access.refusal(f"Bearer {GOOD}", path="/metrics")) for _ in range(20)
    ]
    for _ in range(10):
        await asyncio.sleep(0)  # asyncio turns only: no time passes
    api.gate.set()
    assert await asyncio.gather(*burst) == [None] * 20
    assert (len(api.token_reviews), len(api.access_reviews)) == (1, 1)


async def test_a_flood_of_made_up_tokens_costs_bounded_reviews_and_keeps_the_scraper_served(
    access: MetricsAccess, api: FakeApiServer, clock: Clock
) -> None:
    assert await access.refusal(f"Bearer {GOOD}", path="/metrics") is None
    answers = [await access.refusal(f"Bearer forged-{i}", path="/metrics") for i in range(2000)]
    # The burst less the good token's two reviews, then nothing until time passes.
    assert len(api.token_reviews) + len(api.access_reviews) == 20
    assert [a.status if a else 200 for a in answers[:18]] == [401] * 18
    assert {(a.status, a.retry_after > 0) if a else 200 for a in answers[18:]} == {(429, True)}
    # The scraper's kept answer was not pushed out: served without a review.
    assert await access.refusal(f"Bearer {GOOD}", path="/metrics") is None
    assert len(api.token_reviews) + len(api.access_reviews) == 20
    clock.now += 2  # qps 5: ten more reviews
    for i in range(100):
        await access.refusal(f"Bearer later-{i}", path="/metrics")
    assert len(api.token_reviews) + len(api.access_reviews) == 30


async def test_a_429_says_when_to_ask_again(scrape: Scrape, access: MetricsAccess) -> None:
    for i in range(20):
        await scrape(f"forged-{i}")
    status, _, headers = await scrape("forged-last")
    assert status == 429
    assert int(headers["Retry-After"]) >= 1


async def test_an_api_server_failure_is_503_and_not_kept(
    scrape: Scrape, api: FakeApiServer
) -> None:
    api.fail = ServerError("etcdserver: request timed out")
    assert (await scrape(GOOD))[0] == 503
    api.fail = None
    assert (await scrape(GOOD))[0] == 200


async def test_debug_memory_asks_for_its_own_path(api: FakeApiServer) -> None:
    access = MetricsAccess(api, qps=5, burst=20, keep_seconds=10)
    port = free_port()
    runner = await health.serve(
        port=port,
        host="127.0.0.1",
        ready=lambda: True,
        metrics=str,
        access=access,
        debug_memory=True,
    )
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/debug/memory"
            async with session.get(url, headers={"Authorization": f"Bearer {GOOD}"}) as r:
                assert r.status == 403  # the right to /metrics is not the right to this
    finally:
        await runner.cleanup()
    assert api.access_reviews[0]["nonResourceAttributes"]["path"] == "/debug/memory"


async def test_without_auth_metrics_stay_open() -> None:
    port = free_port()
    runner = await health.serve(
        port=port, host="127.0.0.1", ready=lambda: True, metrics=lambda: "m 1\n"
    )
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            assert (response.status, await response.text()) == (200, "m 1\n")
    finally:
        await runner.cleanup()


def test_settings_default_to_open_and_take_cert_and_key_together() -> None:
    assert MetricsConfig().auth == "none"
    assert MetricsConfig(auth="kubernetes", cert_file="c", key_file="k").cert_file == "c"
    with pytest.raises(ValueError, match="go together"):
        MetricsConfig(cert_file="tls.crt")
    with pytest.raises(ValueError, match="'none' or 'kubernetes'"):
        MetricsConfig(auth="basic")  # type: ignore[arg-type]
