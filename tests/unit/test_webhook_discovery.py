"""What one admission request may cost in discovery (the webhook's `Gatekeeper`, with
`DiscoveryBounds`), the kinds pinned to their groups (dispatcher.core.kindgroups), and when a
replica counts as registered (dispatcher.kube.registration.calls_us). Discovery is a stub
that counts lookups; the API server's side is tests/e2e/test_security.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import pytest

from dispatcher.config import Config, WebhookConfig
from dispatcher.controller.access.gatekeeper import DiscoveryBounds, Gatekeeper
from dispatcher.core.kindgroups import group_problem
from dispatcher.kube.client import RequestStats, ResourceInfo
from dispatcher.kube.errors import Forbidden, UnknownKind
from dispatcher.kube.registration import MUTATING as REGISTRATION_INFO
from dispatcher.kube.registration import Registration, calls_us
from dispatcher.kube.webhook import MUTATE_PATH
from dispatcher.webhook_service import registered_only
from testenv.fakekube import FakeKube
from testenv.manifests import appwrapper, pod_template
from testenv.waits import async_wait_until

MUTATING_KIND = (
    REGISTRATION_INFO.group_version,
    REGISTRATION_INFO.kind,
    REGISTRATION_INFO.plural,
    REGISTRATION_INFO.namespaced,
)

SERVED = {
    ("v1", "Pod"): ResourceInfo("v1", "Pod", "pods", namespaced=True),
    ("example.com/v1", "Widget"): ResourceInfo("example.com/v1", "Widget", "widgets", True),
}


class Cluster:
    """Discovery that counts its lookups, and SubjectAccessReviews that allow everything."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.stats = RequestStats({})
        self.lookups: list[str] = []

    async def resource_info(self, api_version: str, kind: str) -> ResourceInfo:
        self.lookups.append(api_version)
        found = SERVED.get((api_version, kind))
        if found is None:
            raise UnknownKind(f"{self.name} does not serve {kind} in {api_version}")
        return found

    async def create(self, info: Any, namespace: Any, body: Any, **_: Any) -> dict[str, Any]:
        return {"status": {"allowed": True}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def item(api_version: str, kind: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name},
        **pod_template({"cpu": "100m"}),
    }


def request(*items: dict[str, Any]) -> dict[str, Any]:
    # Pods declared: a kind whose pods are not read would be refused before discovery.
    obj = appwrapper("aw", *items, custom=[{"replicas": 1, "requests": {"cpu": "100m"}}])
    obj["metadata"]["namespace"] = "team-a"
    return {
        "uid": "u",
        "operation": "CREATE",
        "namespace": "team-a",
        "object": obj,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
    }


def webhook_admission(
    *, bounds: DiscoveryBounds | None, clock: Clock | None = None
) -> tuple[Gatekeeper, Cluster, Cluster]:
    hub, member = Cluster("hub"), Cluster("member")
    config = Config(allowed_kinds=["Pod", "Widget"])
    admission = Gatekeeper(
        config=config,
        hub=hub,  # type: ignore[arg-type]
        discovery=[member],  # type: ignore[list-item]
        bounds=bounds,
        now=clock or Clock(),
    )
    return admission, hub, member


BOUNDS = DiscoveryBounds(max_api_versions=3, unserved_seconds=10)


def refusal(answer: dict[str, Any]) -> str:
    assert answer["allowed"] is False
    return str(answer["status"]["message"])


async def test_a_known_kind_from_another_group_is_refused_without_a_lookup() -> None:
    admission, hub, member = webhook_admission(bounds=BOUNDS)
    answer = await admission.validate(request(item("x1.example/v1", "Pod", "p")))
    assert refusal(answer) == (
        "item 0 (Pod/p): kind Pod of API group 'x1.example' is not allowed: "
        "Pod is only wrapped from the core group (v1)"
    )
    assert hub.lookups == member.lookups == []


async def test_more_api_versions_than_the_bound_are_refused_without_a_lookup() -> None:
    admission, hub, member = webhook_admission(bounds=BOUNDS)
    items = [item(f"x{n}.example/v1", "Widget", f"w{n}") for n in range(4)]
    # A refused kind/group does not count towards the bound.
    answer = await admission.validate(request(*items, item("x9.example/v1", "Pod", "p")))
    assert refusal(answer) == (
        "the items name 4 distinct apiVersions; at most 3 are looked up for one AppWrapper "
        "(webhook.max_api_versions): x0.example/v1, x1.example/v1, x2.example/v1, "
        "x3.example/v1"
    )
    assert hub.lookups == member.lookups == []


async def test_within_the_bound_every_cluster_is_asked_once_then_the_answer_is_kept() -> None:
    clock = Clock()
    admission, hub, member = webhook_admission(bounds=BOUNDS, clock=clock)
    unknown = request(item("x1.example/v1", "Widget", "w"), item("v1", "Pod", "p"))
    message = refusal(await admission.validate(unknown))
    assert "item 0 (Widget/w): member does not serve Widget in x1.example/v1" in message
    assert (hub.lookups, member.lookups) == (["x1.example/v1", "v1"], ["x1.example/v1"])
    clock.now += 9.9
    message = refusal(await admission.validate(unknown))
    assert "no cluster serves kind 'Widget' in 'x1.example/v1'" in message
    assert (hub.lookups, member.lookups) == (["x1.example/v1", "v1", "v1"], ["x1.example/v1"])
    clock.now += 0.2  # the negative answer expires: asked again
    await admission.validate(unknown)
    assert hub.lookups.count("x1.example/v1") == 2
    assert member.lookups.count("x1.example/v1") == 2


async def test_a_served_kind_is_allowed() -> None:
    admission, _, _ = webhook_admission(bounds=BOUNDS)
    answer = await admission.validate(request(item("example.com/v1", "Widget", "w")))
    assert answer["allowed"] is True


async def test_the_operator_pins_a_kind_of_their_own() -> None:
    bounds = DiscoveryBounds(max_api_versions=3, kind_groups={"Widget": ["example.com"]})
    admission, hub, _ = webhook_admission(bounds=bounds)
    message = refusal(await admission.validate(request(item("x1.example/v1", "Widget", "w"))))
    assert "Widget is only wrapped from example.com" in message
    assert hub.lookups == []


async def test_the_check_before_dispatch_has_no_bounds() -> None:
    """The leader's Gatekeeper (no bounds) leaves nothing out of the rights it asks for."""
    admission, hub, _ = webhook_admission(bounds=None)
    answer = await admission.validate(request(item("x1.example/v1", "Pod", "p")))
    assert "member does not serve Pod in x1.example/v1" in refusal(answer)
    assert hub.lookups == ["x1.example/v1"]


@pytest.mark.parametrize(
    ("api_version", "kind", "allowed"),
    [
        ("v1", "Pod", True),
        ("apps/v1", "Deployment", True),
        ("v1", "Deployment", False),
        ("ray.io/v1", "RayCluster", True),
        ("ray.io.evil/v1", "RayCluster", False),
        ("scheduling.volcano.sh/v1beta1", "PodGroup", True),
        ("scheduling.x-k8s.io/v1alpha1", "PodGroup", True),
        ("anything.example/v1", "Unpinned", True),
    ],
)
def test_kinds_pinned_to_their_groups(api_version: str, kind: str, allowed: bool) -> None:
    assert (group_problem(api_version, kind) == "") is allowed


# -- registered: the MutatingWebhookConfiguration calls this replica -------------------------

SERVICE = ("appwrapper-system", "appwrapper-dispatcher-webhook")


def configuration(*client_configs: dict[str, Any]) -> dict[str, Any]:
    webhooks = [{"name": f"w{i}", "clientConfig": c} for i, c in enumerate(client_configs)]
    return {"webhooks": webhooks}


@pytest.mark.parametrize(
    ("found", "want_problem"),
    [
        (None, "its MutatingWebhookConfiguration does not exist"),
        (configuration({"url": f"https://127.0.0.1:9443{MUTATE_PATH}"}), ""),
        (configuration({"url": f"https://127.0.0.1:9444{MUTATE_PATH}"}), "calls another server"),
        (configuration({"url": f"https://10.0.0.1:9443{MUTATE_PATH}"}), "calls another server"),
        (configuration({"url": "https://127.0.0.1:9443/validate-appwrapper"}), "another server"),
        (configuration({"url": f"http://127.0.0.1:9443{MUTATE_PATH}"}), "calls another server"),
        (
            configuration(
                {"url": "https://elsewhere:443/x"},
                {"service": {"namespace": SERVICE[0], "name": SERVICE[1], "path": MUTATE_PATH}},
            ),
            "",
        ),
        (
            configuration({"service": {"namespace": "other", "name": SERVICE[1]}}),
            "calls another server",
        ),
        ({"webhooks": None}, "calls another server"),
    ],
)
def test_registered_only_while_the_configuration_calls_this_replica(
    found: dict[str, Any] | None, want_problem: str
) -> None:
    problem = calls_us(found, path=MUTATE_PATH, service=SERVICE, hosts={"127.0.0.1"}, port=9443)
    if want_problem:
        assert want_problem in problem
    else:
        assert problem == ""


# -- Registration follows the configuration (watch, else polling) -----------------------------


async def until(predicate: Callable[[], bool], what: str) -> None:
    async def probe() -> bool:
        return predicate()

    await async_wait_until(probe, timeout=5, interval=0.005, what=what)


def mutating(url: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "appwrapper-dispatcher"},
        "webhooks": [{"name": "m", "clientConfig": {"url": url}}],
    }


def webhook_settings() -> WebhookConfig:
    return WebhookConfig(enabled=True, extra_names=["127.0.0.1"], port=9443)


async def follow(fake: FakeKube, registration: Registration) -> AsyncIterator[None]:
    await registration.start(9443)
    task = asyncio.create_task(registration.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize("watch", [True, False], ids=["watched", "polled"])
async def test_registration_follows_deletion_and_redirection(watch: bool) -> None:
    fake = FakeKube(namespaces_must_exist=False)
    fake.add_kind(*MUTATING_KIND, custom=False)
    ours = f"https://127.0.0.1:9443{MUTATE_PATH}"
    await fake.create(REGISTRATION_INFO, None, mutating(ours))
    if not watch:  # an older install's RBAC: no list or watch
        fake.fail_next("list", kind="MutatingWebhookConfiguration", error=Forbidden("no list"))
    registration = Registration(fake, webhook_settings(), path=MUTATE_PATH, poll_seconds=0.01)
    async with contextlib.asynccontextmanager(follow)(fake, registration):
        assert registration.registered
        await fake.delete(REGISTRATION_INFO, None, "appwrapper-dispatcher")
        await until(lambda: not registration.registered, "deletion seen")
        assert registration.problem == "its MutatingWebhookConfiguration does not exist"
        await fake.create(REGISTRATION_INFO, None, mutating(f"https://10.0.0.9:9443{MUTATE_PATH}"))
        await until(lambda: "another server" in registration.problem, "redirection seen")
        assert not registration.registered
        current = await fake.get(REGISTRATION_INFO, None, "appwrapper-dispatcher")
        current["webhooks"][0]["clientConfig"]["url"] = ours
        await fake.replace(REGISTRATION_INFO, None, "appwrapper-dispatcher", current)
        await until(lambda: registration.registered, "back")
    assert (fake.counts["watch"] > 0) is watch


async def test_unregistered_mutate_signs_nothing() -> None:
    fake = FakeKube(namespaces_must_exist=False)
    fake.add_kind(*MUTATING_KIND, custom=False)
    registration = Registration(fake, webhook_settings(), path=MUTATE_PATH)
    await registration.start(9443)
    signed: list[str] = []

    async def mutate(request: Mapping[str, Any]) -> dict[str, Any]:
        signed.append(str(request["uid"]))
        return {"uid": request["uid"], "allowed": True, "patch": "x"}

    answer = await registered_only(registration, mutate)({"uid": "u1"})
    assert answer == {
        "uid": "u1",
        "allowed": False,
        "status": {
            "code": 403,
            "reason": "Forbidden",
            "message": "the dispatcher's admission webhook is not installed (its "
            "MutatingWebhookConfiguration does not exist): it signs no creator record now",
        },
    }
    assert signed == []
    await fake.create(REGISTRATION_INFO, None, mutating(f"https://127.0.0.1:9443{MUTATE_PATH}"))
    await registration.start(9443)
    answer = await registered_only(registration, mutate)({"uid": "u2"})
    assert answer["allowed"] is True
    assert signed == ["u2"]
