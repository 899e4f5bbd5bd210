"""A signed creator record is honoured only if the webhook configuration was in place when
its spec was stored (dispatcher.core.recordtime, dispatcher.controller.access.witness)."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from dispatcher.clock import ManualClock
from dispatcher.controller.access.gatekeeper import objects_made
from dispatcher.controller.access.witness import RecordWitness
from dispatcher.core.gatekeeping import (
    SIGNATURE,
    Creator,
    attribution,
    record_patch,
    sign,
    signed_at_of,
)
from dispatcher.core.recordtime import Read, covers, record_time_problem, timestamp
from dispatcher.kube.errors import NotFound

KEY = b"k" * 32
NAME = "appwrapper-dispatcher"
T0 = timestamp("2026-01-01T00:00:00Z") or 0.0


def at(seconds: float) -> str:
    return datetime.fromtimestamp(T0 + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


EXACT_RULE = {
    "apiGroups": ["workload.codeflare.dev"],
    "apiVersions": ["v1beta1", "v1beta2"],
    "resources": ["appwrappers"],
    "operations": ["CREATE", "UPDATE"],
}


def configuration(**webhook: Any) -> dict[str, Any]:
    entry = {
        "name": "mutate.appwrappers.workload.codeflare.dev",
        "rules": [
            {
                "apiGroups": ["workload.codeflare.dev"],
                "apiVersions": ["v1beta1"],
                "resources": ["appwrappers"],
                "operations": ["CREATE", "UPDATE"],
            }
        ],
        "failurePolicy": "Fail",
        **webhook,
    }
    return {"metadata": {"name": NAME}, "webhooks": [entry]}


def meta(created: float, generation: int = 1, namespace: str = "team-a") -> dict[str, Any]:
    return {"namespace": namespace, "creationTimestamp": at(created), "generation": generation}


def read(issued: int, created: float | None, config: dict[str, Any] | None = None) -> Read:
    if created is None:
        return Read(issued)
    return Read(issued, uid="c1", created=T0 + created, configuration=config or configuration())


@pytest.mark.parametrize(
    ("appwrapper", "signed_at", "reads", "want"),
    [
        pytest.param(meta(100), 100, [read(2, 0)], "", id="created-while-in-place"),
        pytest.param(meta(100), None, [read(2, 0)], "", id="old-form-created-while-in-place"),
        pytest.param(meta(100), 100, [], None, id="no-read-yet"),
        pytest.param(meta(100), 100, [read(0, 0)], None, id="only-a-read-before-arrival"),
        # The attack: signed while registered, stored after the configuration was removed
        # (absent now) or made again (created after the record's spec was stored).
        pytest.param(meta(100), 100, [read(2, None)], "does not exist now", id="absent-now"),
        pytest.param(meta(100), 95, [read(2, 150)], "was created at", id="made-again-after"),
        pytest.param(meta(100), 100, [read(2, 100)], "was created at", id="same-second"),
        # A record obtained long before: not the time of the create.
        pytest.param(meta(1000), 100, [read(2, 0)], "signed at", id="signed-long-before"),
        pytest.param(meta(100), 200, [read(2, 0)], "signed at", id="signed-after"),
        # An edit: stored after it was signed; the configuration made after that is no proof.
        pytest.param(meta(100, 2), 5000, [read(2, 4000)], "", id="edit-signed-after-made"),
        pytest.param(meta(100, 2), 4002, [read(2, 4000)], "was created at", id="edit-skew"),
        pytest.param(meta(100, 2), None, [read(2, 4000)], "was created at", id="edit-old-form"),
        # A read after arrival that proves, beside a later one that finds it absent.
        pytest.param(meta(100), 100, [read(2, 0), Read(3)], "", id="proved-before-outage"),
        pytest.param(
            meta(100, namespace="other"),
            100,
            [
                read(
                    2,
                    0,
                    configuration(
                        namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": "x"}}
                    ),
                )
            ],
            "does not send every AppWrapper of namespace other",
            id="namespace-not-covered",
        ),
    ],
)
def test_record_time(
    appwrapper: dict[str, Any], signed_at: int | None, reads: list[Read], want: str | None
) -> None:
    problem = record_time_problem(
        meta=appwrapper,
        signed_at=None if signed_at is None else int(T0) + signed_at,
        received=1,
        reads=reads,
        name=NAME,
    )
    if want is None or want == "":
        assert problem == want
    else:
        assert problem is not None
        assert want in problem


@pytest.mark.parametrize(
    ("webhook", "namespace", "want"),
    [
        pytest.param({}, "a", True, id="shipped"),
        pytest.param({"failurePolicy": "Ignore"}, "a", False, id="ignore"),
        pytest.param({"objectSelector": {"matchLabels": {"x": "y"}}}, "a", False, id="objects"),
        pytest.param(
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "a"}}},
            "a",
            True,
            id="own-namespace",
        ),
        pytest.param(
            {"namespaceSelector": {"matchLabels": {"team": "a"}}}, "a", False, id="other-label"
        ),
        pytest.param(
            {"rules": [{"apiGroups": ["*"], "resources": ["*"], "operations": ["CREATE"]}]},
            "a",
            False,
            id="no-update",
        ),
        # With matchPolicy Exact, a request made in v1beta2 is not sent to a webhook that
        # names v1beta1 only: a record stored through v1beta2 would pass it unseen.
        pytest.param({"matchPolicy": "Exact"}, "a", False, id="exact-v1beta1-only"),
        pytest.param(
            {"matchPolicy": "Exact", "rules": [EXACT_RULE]}, "a", True, id="exact-all-versions"
        ),
        pytest.param({"matchPolicy": "Equivalent"}, "a", True, id="equivalent"),
        pytest.param(
            {"matchConditions": [{"name": "x", "expression": "false"}]}, "a", False, id="conds"
        ),
    ],
)
def test_covers(webhook: dict[str, Any], namespace: str, want: bool) -> None:
    assert covers(configuration(**webhook), namespace) is want


def signed_obj(signed_at: int | None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": "a", "namespace": "team-a", "uid": "u1", "generation": 1},
        "spec": {"priority": 1},
    }
    for change in record_patch(
        operation="CREATE", obj=obj, old=None, user=Creator("bob"), keys=[KEY], signed_at=signed_at
    ):
        if change["path"] == "/metadata/annotations":
            obj["metadata"]["annotations"] = change["value"]
    return obj


def test_the_signing_time_is_signed() -> None:
    obj = signed_obj(1_700_000_000)
    assert attribution(obj, [KEY]).signed_at == 1_700_000_000
    forged = copy.deepcopy(obj)
    signature = forged["metadata"]["annotations"][SIGNATURE]
    forged["metadata"]["annotations"][SIGNATURE] = signature.replace("1700000000", "1700000001")
    assert attribution(forged, [KEY]).creator is None


def test_signing_again_keeps_the_time() -> None:
    old = signed_obj(1_700_000_000)
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}
    patch = record_patch(
        operation="UPDATE",
        obj=new,
        old=old,
        user=Creator("eve"),
        keys=[b"n" * 32, KEY],
        signed_at=1_800_000_000,
    )
    (change,) = patch
    assert change["value"] == sign(
        b"n" * 32,
        "team-a",
        old["metadata"]["annotations"]["workload.codeflare.dev/user"],
        old["spec"],
        1_700_000_000,
    )


class Hub:
    def __init__(self) -> None:
        self.configuration: dict[str, Any] | None = None
        self.reads = 0

    async def get(self, info: Any, namespace: str | None, name: str) -> dict[str, Any]:
        self.reads += 1
        if self.configuration is None:
            raise NotFound("gone", status=404)
        return self.configuration


def appwrapper_obj(created: float) -> dict[str, Any]:
    return {"metadata": {**meta(created), "uid": "u1", "annotations": {SIGNATURE: "v2:1:x"}}}


async def test_a_proof_made_while_in_place_outlives_an_outage() -> None:
    hub = Hub()
    hub.configuration = {**configuration(), "metadata": {"uid": "c1", "creationTimestamp": at(0)}}
    witness = RecordWitness(hub, NAME, clock=ManualClock())  # type: ignore[arg-type]
    queued = appwrapper_obj(100)
    witness.receive(queued)
    await witness.read()  # what `run` does soon after it arrived
    hub.configuration = None  # the configurations removed
    assert await witness.problem(queued, int(T0) + 100) == ""
    late = appwrapper_obj(200)
    late["metadata"]["uid"] = "u2"
    assert "does not exist now" in await witness.problem(late, int(T0) + 200)
    assert hub.reads == 2


class SlowHub(Hub):
    """A hub whose answers wait for `release`: reads asked meanwhile are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def get(self, info: Any, namespace: str | None, name: str) -> dict[str, Any]:
        self.reads += 1
        await self.release.wait()
        assert self.configuration is not None
        return self.configuration


async def test_dispatches_that_ask_at_once_share_one_read() -> None:
    """After a restart many queued AppWrappers are dispatched at once, each needing a read
    issued after it arrived: one GET serves every one that arrived before it was issued; one
    that arrives later gets a read of its own."""
    hub = SlowHub()
    hub.configuration = {**configuration(), "metadata": {"uid": "c1", "creationTimestamp": at(0)}}
    witness = RecordWitness(hub, NAME, clock=ManualClock())  # type: ignore[arg-type]
    objs = []
    for number in range(20):
        obj = appwrapper_obj(100)
        obj["metadata"]["uid"] = f"u{number}"
        witness.receive(obj)
        objs.append(obj)
    asking = [asyncio.create_task(witness.problem(obj, int(T0) + 100)) for obj in objs]
    await asyncio.sleep(0)  # every one asks before the answer comes
    later = appwrapper_obj(100)
    later["metadata"]["uid"] = "later"
    witness.receive(later)
    after = asyncio.create_task(witness.problem(later, int(T0) + 100))
    await asyncio.sleep(0)
    hub.release.set()
    assert await asyncio.gather(*asking) == [""] * 20
    assert await after == ""
    assert hub.reads == 2


async def test_a_waiter_cancelled_leaves_the_others_their_read() -> None:
    hub = SlowHub()
    hub.configuration = {**configuration(), "metadata": {"uid": "c1", "creationTimestamp": at(0)}}
    witness = RecordWitness(hub, NAME, clock=ManualClock())  # type: ignore[arg-type]
    one, two = appwrapper_obj(100), appwrapper_obj(100)
    two["metadata"]["uid"] = "u2"
    witness.receive(one)
    witness.receive(two)
    first = asyncio.create_task(witness.problem(one, int(T0) + 100))
    second = asyncio.create_task(witness.problem(two, int(T0) + 100))
    await asyncio.sleep(0)
    first.cancel()
    hub.release.set()
    assert await second == ""
    assert hub.reads == 1


@pytest.mark.parametrize("when", ["²", "①", "١٢٣", "-1", "1" * 13, "", "1.5"])
def test_a_signing_time_of_other_digits_is_no_time_not_a_crash(when: str) -> None:
    """str.isdigit() takes "²", which int() refuses, and hmac.compare_digest refuses str with
    non-ASCII characters: an exception there went up through the cycle and ended every leader
    in turn."""
    assert signed_at_of(f"v2:{when}:00") is None
    obj = signed_obj(1_700_000_000)
    obj["metadata"]["annotations"][SIGNATURE] = f"v2:{when}:00"
    assert attribution(obj, [KEY]).creator is None


@pytest.mark.parametrize(
    ("status", "made"),
    [
        pytest.param({}, False, id="never-dispatched"),
        pytest.param({"lastDispatchedAt": "t1"}, False, id="dispatched-not-made"),
        pytest.param({"lastDispatchedAt": "t2", "objectsMadeFor": "t1"}, False, id="new-attempt"),
        pytest.param({"lastDispatchedAt": "t1", "objectsMadeFor": "t1"}, True, id="made"),
    ],
)
def test_only_an_attempt_whose_objects_are_not_made_is_judged_by_its_time(
    status: dict[str, str], made: bool
) -> None:
    """A restart, or the configuration made again since, must not fail running work: the
    record was judged before this attempt's objects were made."""
    assert objects_made({"status": status}) is made
