"""Which ProvisioningRequests count for an AppWrapper: only those the dispatcher made for it
(its namespace, the name its uid, check and attempt fix, a controller reference to its uid),
never one that only carries its uid label (`core.admissionchecks.foreign`, and the
controller's index of requests built on it)."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.models import AppWrapper
from dispatcher.clock import ManualClock
from dispatcher.config import ProvisioningConfig
from dispatcher.controller.lifecycle.provisioning import REQUESTS, Provisioning
from dispatcher.controller.reading import AppWrapperReader
from dispatcher.controller.status import StatusWriter
from dispatcher.core import admissionchecks as checks
from dispatcher.kube.api import KubeApi
from testenv.fakekube import FakeKube
from testenv.waits import async_wait_until

UID = "0d6c0d84-victim"
OWNER = {
    "apiVersion": "workload.codeflare.dev/v1beta1",
    "kind": "AppWrapper",
    "name": "victim",
    "uid": UID,
}


def made(namespace: str = "team-a", attempt: int = 1, uid: str = UID) -> dict[str, Any]:
    """The request the dispatcher makes for attempt `attempt` of check `prov`."""
    _, request = checks.request_objects(
        namespace=namespace,
        owner={**OWNER, "uid": uid},
        check="prov",
        attempt=attempt,
        provisioning_class=checks.BEST_EFFORT_ATOMIC,
        parameters={},
        pod_sets=[],
    )
    return request


def edited(**changes: Any) -> dict[str, Any]:
    """`made()` with metadata fields replaced (None: removed)."""
    request = copy.deepcopy(made())
    meta = request["metadata"]
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return request


def owner(**changes: Any) -> list[dict[str, Any]]:
    return [{**OWNER, "controller": True, "blockOwnerDeletion": True, **changes}]


def labels(**changes: str) -> dict[str, str]:
    return {**made()["metadata"]["labels"], **changes}


@dataclass(frozen=True)
class Case:
    id: str
    request: dict[str, Any]
    want: str = ""  # "" = it counts; else a part of the reason it does not
    namespace: str = "team-a"


CASES = [
    Case("made by the dispatcher", made()),
    Case("a later attempt", made(attempt=7)),
    Case("another namespace", made(namespace="team-b"), "in namespace team-b"),
    Case("no namespace", edited(namespace=None), "in namespace None"),
    Case("no owner", edited(ownerReferences=None), "no controller reference"),
    Case("owner not controller", edited(ownerReferences=owner(controller=False)), "no controller"),
    Case("controller is a string", edited(ownerReferences=owner(controller="true")), "no control"),
    Case("owner of another uid", edited(ownerReferences=owner(uid="other")), "no controller"),
    Case("owner of another kind", edited(ownerReferences=owner(kind="Job")), "no controller"),
    Case(
        "owner of another group",
        edited(ownerReferences=owner(apiVersion="example.com/v1")),
        "no controller",
    ),
    Case("wrong name", edited(name="aw-x"), f"not aw-{UID}-prov-1"),
    Case("name of another attempt", edited(name=f"aw-{UID}-prov-2"), "not aw-"),
    Case("label of another uid", edited(labels=labels(**{checks.UID_LABEL: "x"})), "uid"),
    Case("no check label", edited(labels=labels(**{checks.CHECK_LABEL: ""})), "no workload"),
    Case("attempt not a number", edited(labels=labels(**{checks.ATTEMPT_LABEL: "x"})), "number"),
    Case("attempt padded", edited(labels=labels(**{checks.ATTEMPT_LABEL: "01"})), "number"),
    Case("attempt of other digits", edited(labels=labels(**{checks.ATTEMPT_LABEL: "²"})), "number"),
    Case("no labels", edited(labels=None), "uid"),
    Case("the AppWrapper of another namespace", made(), "in namespace team-a", "team-b"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_foreign(case: Case) -> None:
    why = checks.foreign(case.request, namespace=case.namespace, uid=UID)
    if case.want:
        assert case.want in why
    else:
        assert why == ""


NAMES = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)


@given(
    namespace=NAMES,
    other=NAMES,
    uid=NAMES,
    other_uid=NAMES,
    check=NAMES,
    attempt=st.integers(min_value=1, max_value=10_000),
)
def test_a_request_counts_for_its_own_appwrapper_only(
    namespace: str, other: str, uid: str, other_uid: str, check: str, attempt: int
) -> None:
    """What `request_objects` makes counts for its AppWrapper; for an AppWrapper of any
    other namespace or uid it never does."""
    _, request = checks.request_objects(
        namespace=namespace,
        owner={**OWNER, "uid": uid},
        check=check,
        attempt=attempt,
        provisioning_class=checks.CHECK_CAPACITY,
        parameters={},
        pod_sets=[],
    )
    assert checks.foreign(request, namespace=namespace, uid=uid) == ""
    if other != namespace:
        assert checks.foreign(request, namespace=other, uid=uid) != ""
    if other_uid != uid:
        assert checks.foreign(request, namespace=namespace, uid=other_uid) != ""


# -- the controller's index -----------------------------------------------------------------


@dataclass
class Env:
    kube: FakeKube
    provisioning: Provisioning
    woken: list[str] = field(default_factory=list)


async def start() -> tuple[Env, asyncio.Task[None]]:
    kube = FakeKube(namespaces_must_exist=False)
    kube.add_kind(REQUESTS.group_version, REQUESTS.kind, REQUESTS.plural, True, status=True)
    woken: list[str] = []
    provisioning = Provisioning(
        config=ProvisioningConfig(enabled=True),
        hub=cast(KubeApi, kube),
        # Neither is used by what is tested here (reading the requests, not following them).
        status=cast(StatusWriter, None),
        reader=cast(AppWrapperReader, None),
        clock=ManualClock(),
        wake=woken.append,
    )
    task = asyncio.get_running_loop().create_task(provisioning.requests.run())
    await asyncio.wait_for(provisioning.requests.synced.wait(), 5)
    return Env(kube, provisioning, woken), task


async def test_only_the_appwrappers_own_requests_are_read_and_wake_it() -> None:
    env, task = await start()
    try:
        own = made()
        forged = [
            made(namespace="mallory", attempt=5),  # another namespace, owner and all
            edited(name=f"aw-{UID}-prov-6", labels=labels(**{checks.ATTEMPT_LABEL: "6"}),
                   ownerReferences=None),  # same namespace, no owner
        ]  # fmt: skip
        for request in [own, *forged]:
            meta = request["metadata"]
            await env.kube.create(REQUESTS, meta["namespace"], request)

        async def all_seen() -> bool:
            return len(env.provisioning.requests.store) == 3

        await async_wait_until(all_seen, timeout=5, what="the watch shows all three")
        found = await env.provisioning._requests_of("team-a", UID)
        assert [r["metadata"]["name"] for r in found] == [own["metadata"]["name"]]
        assert checks.latest_round(found, "prov") == 1
        # Only its own request woke the victim (the one in mallory's namespace can wake
        # only an AppWrapper of that namespace).
        assert env.woken.count("team-a/victim") == 1
        # Before the watch has synced, the list in the namespace is filtered alike.
        env.provisioning.requests.synced.clear()
        listed = await env.provisioning._requests_of("team-a", UID)
        assert [r["metadata"]["name"] for r in listed] == [own["metadata"]["name"]]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_index_stays_bounded_as_forged_requests_come_and_go() -> None:
    env, task = await start()
    try:
        for round_ in range(20):
            request = made(namespace=f"ns-{round_}", uid=f"uid-{round_}")
            meta = request["metadata"]
            await env.kube.create(REQUESTS, meta["namespace"], request)
            await env.kube.delete(REQUESTS, meta["namespace"], meta["name"])
            forged = made(namespace="mallory", uid=f"victim-{round_}")
            forged["metadata"]["ownerReferences"] = []
            await env.kube.create(REQUESTS, "mallory", forged)
            await env.kube.delete(REQUESTS, "mallory", forged["metadata"]["name"])

        async def drained() -> bool:
            return not env.provisioning.requests.store

        await async_wait_until(drained, timeout=5, what="every delete seen")
        assert env.provisioning._by_uid == {}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_request_squatting_the_next_attempts_name_is_named_not_followed() -> None:
    env, task = await start()
    try:
        aw = AppWrapper.model_validate(
            {**OWNER, "metadata": {"name": "victim", "namespace": "team-a", "uid": UID}}
        )
        name = checks.request_name(UID, "prov", 1)
        # Its own (made before a crash): nothing to say.
        await env.kube.create(REQUESTS, "team-a", made())
        assert await env.provisioning._taken(aw, name) == ""
        await env.kube.delete(REQUESTS, "team-a", name)
        # Someone else's of that name, without the owner reference.
        await env.kube.create(REQUESTS, "team-a", edited(ownerReferences=None))
        said = await env.provisioning._taken(aw, name)
        assert said.startswith(f"ProvisioningRequest {name} exists but was not made by")
        assert "no controller reference to the AppWrapper" in said
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
