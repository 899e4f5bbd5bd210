"""A cap on the whole AppWrapper (max_appwrapper_bytes): the size as counted, the message
(size, limit, largest field), the webhook's answer, and what the dispatcher keeps of one
stored anyway: a stub of its metadata, Failed InvalidSpec, its spec never held."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from dispatcher.config import Config
from dispatcher.controller.access.gatekeeper import Gatekeeper
from dispatcher.controller.reading import OVERSIZE, AppWrapperReader, slimmer
from dispatcher.core.validation import (
    DEFAULT_MAX_APPWRAPPER_BYTES,
    LAST_APPLIED,
    appwrapper_size,
    size_problem,
)
from dispatcher.core.workloads import InvalidSpec
from testenv.fakeenv import fake_env
from testenv.fakekube import FakeKube
from testenv.manifests import appwrapper, deployment

KIB = 1024
LIMIT = 64 * KIB


def small() -> dict[str, Any]:
    obj = appwrapper("a", deployment("d", 1, {"cpu": "1"}))
    obj["metadata"].update(namespace="team", uid="u1", resourceVersion="7")
    return obj


def stuffed(path: str, size: int) -> dict[str, Any]:
    """`small()` with `size` bytes of text at `path` (a legacy field)."""
    obj = small()
    spec = obj["spec"]
    if path == "spec.service":
        spec["service"] = {"spec": {"note": "x" * size}}
    elif path == "spec.selector":
        spec["selector"] = {"matchLabels": {"k": "x" * size}}
    elif path == "spec.resources.Items":
        spec["resources"]["Items"] = [{"template": {"note": "x" * size}}]
    elif path == "spec.resources.GenericItems":
        spec["resources"]["GenericItems"][0]["generictemplate"]["spec"]["note"] = "x" * size
    else:
        raise ValueError(path)
    return obj


def json_size(obj: Any) -> int:
    return len(orjson.dumps(obj))


@dataclass(frozen=True)
class SizeCase:
    id: str
    obj: dict[str, Any]
    want_field: str  # "" when within the limit


SIZE_CASES = [
    SizeCase("small", small(), ""),
    SizeCase("service", stuffed("spec.service", 100 * KIB), "spec.service.spec.note"),
    SizeCase("selector", stuffed("spec.selector", 100 * KIB), "spec.selector.matchLabels.k"),
    SizeCase("legacy-items", stuffed("spec.resources.Items", 100 * KIB), "spec.resources.Items[0]"),
    SizeCase(
        "a-template",
        stuffed("spec.resources.GenericItems", 100 * KIB),
        "spec.resources.GenericItems[0]",
    ),
]


@pytest.mark.parametrize("case", SIZE_CASES, ids=[c.id for c in SIZE_CASES])
def test_the_size_message_names_the_size_the_limit_and_the_largest_field(case: SizeCase) -> None:
    message = size_problem(case.obj, limit=LIMIT)
    if not case.want_field:
        assert message == ""
        return
    size = appwrapper_size(case.obj)
    assert size == json_size(case.obj)
    assert message.startswith(
        f"the AppWrapper is {size:,} bytes as JSON; at most {LIMIT:,} are accepted"
        f" (the dispatcher's max_appwrapper_bytes); its largest field is {case.want_field} ("
    )


def test_bookkeeping_copies_are_not_counted() -> None:
    """managedFields and kubectl's last-applied copy are the API server's and kubectl's, not
    the user's: a 40 KiB AppWrapper applied with kubectl stays 40 KiB."""
    obj = stuffed("spec.service", 40 * KIB)
    plain = appwrapper_size(obj)
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f": "y" * 50 * KIB}}]
    obj["metadata"]["annotations"] = {LAST_APPLIED: "z" * 50 * KIB, "team": "a"}
    counted = appwrapper_size(obj)
    assert abs(counted - plain - len('"annotations":{"team":"a"},')) <= 4
    assert size_problem(obj, limit=LIMIT) == ""


def test_status_is_not_counted() -> None:
    """Status is the dispatcher's: its own writes must never push past the limit an
    AppWrapper the webhook let in just under it."""
    obj = stuffed("spec.service", LIMIT - json_size(small()) - 200)
    assert size_problem(obj, limit=LIMIT) == ""
    obj["status"] = {"message": "m" * 4 * KIB, "conditions": [{"type": "Dispatched"}] * 10}
    assert json_size(obj) > LIMIT
    assert size_problem(obj, limit=LIMIT) == ""


def _update(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    return {
        "uid": "r1",
        "operation": "UPDATE",
        "namespace": "team",
        "userInfo": {"username": "alice"},
        "object": new,
        "oldObject": old,
    }


async def test_a_metadata_update_may_not_take_it_past_the_limit() -> None:
    config = Config(max_appwrapper_bytes=LIMIT, unattributed="allow")
    hub = FakeKube(name="hub")
    admission = Gatekeeper(config=config, hub=hub, discovery=[hub], signing_keys=lambda: [])
    old = small()
    grown = small()
    grown["metadata"]["annotations"] = {"note": "n" * LIMIT}
    answer = await admission.validate(_update(old, grown))
    assert answer["allowed"] is False
    assert "at most 65,536 are accepted" in answer["status"]["message"]
    # One already past it (stored while the webhook was away) still loses its finalizer.
    stored = stuffed("spec.service", 100 * KIB)
    stored["metadata"]["finalizers"] = ["workload.codeflare.dev/finalizer"]
    released = {**stored, "metadata": {**stored["metadata"], "finalizers": []}}
    assert (await admission.validate(_update(stored, released)))["allowed"] is True


def test_an_object_too_deep_for_orjson_is_still_measured() -> None:
    deep: dict[str, Any] = {"x": "y" * 70 * KIB}
    for _ in range(300):
        deep = {"d": deep}
    obj = small()
    obj["spec"]["service"] = deep
    assert appwrapper_size(obj) > LIMIT
    assert "its largest field is spec.service.d.d" in size_problem(obj, limit=LIMIT)


def test_the_default_fits_a_large_real_appwrapper_many_times_over() -> None:
    ray_like = small()
    generic = ray_like["spec"]["resources"]["GenericItems"]
    template = generic[0]["generictemplate"]
    env = [{"name": f"VAR_{i}", "value": "v" * 40} for i in range(40)]
    template["spec"]["template"]["spec"]["containers"][0]["env"] = env
    generic.extend({"generictemplate": {**template, "kind": "Service"}} for _ in range(4))
    assert appwrapper_size(ray_like) * 20 < DEFAULT_MAX_APPWRAPPER_BYTES


# -- what is kept of one stored anyway ---------------------------------------------------


def test_one_above_the_limit_is_kept_as_a_stub_without_its_spec() -> None:
    obj = stuffed("spec.service", 100 * KIB)
    obj["metadata"]["annotations"] = {"note": "n" * 10 * KIB}
    obj["metadata"]["labels"] = {"workload.codeflare.dev/queue": "team"}
    obj["status"] = {"state": "Pending"}
    kept = slimmer(LIMIT)(obj)
    assert kept["spec"] == {}
    assert kept[OVERSIZE] == size_problem(obj, limit=LIMIT)
    assert kept["metadata"] == {
        "name": "a",
        "namespace": "team",
        "uid": "u1",
        "resourceVersion": "7",
        "labels": {"workload.codeflare.dev/queue": "team"},
    }
    assert kept["status"] == {"state": "Pending"}
    assert json_size(kept) < 2 * KIB
    within = slimmer(LIMIT)(small())
    assert OVERSIZE not in within
    assert within["spec"] == small()["spec"]


def test_a_stub_reads_as_an_invalid_spec_with_the_size_message() -> None:
    models = AppWrapperReader(
        allowed_kinds=frozenset({"Deployment"}), priority_class=lambda name: None
    )
    obj = stuffed("spec.service", 100 * KIB)
    stub = slimmer(LIMIT)(obj)
    found = models.workload(models.parse(stub), priority=0, now=_now())
    assert found == InvalidSpec(size_problem(obj, limit=LIMIT))
    # The same AppWrapper edited back within the limit (a new version) reads as before.
    fixed = slimmer(LIMIT)({**small(), "metadata": {**small()["metadata"], "resourceVersion": "8"}})
    assert not isinstance(models.workload(models.parse(fixed), priority=0, now=_now()), InvalidSpec)


def _now() -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC)


async def test_the_webhook_refuses_it_before_reading_it() -> None:
    config = Config(max_appwrapper_bytes=LIMIT, unattributed="allow")
    hub = FakeKube(name="hub")
    admission = Gatekeeper(config=config, hub=hub, discovery=[hub], signing_keys=lambda: [])
    obj = stuffed("spec.resources.Items", 100 * KIB)
    assert await admission.spec_problems(obj, "team") == [size_problem(obj, limit=LIMIT)]
    assert await admission.spec_problems(small(), "team") == []


async def test_a_stored_one_ends_failed_and_its_spec_is_never_held() -> None:
    async with fake_env(max_appwrapper_bytes=LIMIT) as env:
        big = stuffed("spec.service", 100 * KIB)
        del big["metadata"]["uid"], big["metadata"]["resourceVersion"]
        del big["metadata"]["namespace"]
        await env.apply(big)
        await env.reconcile("a")
        await env.reconcile("a")
        stored = await env.get("a")
        failed = next(c for c in stored["status"]["conditions"] if c["type"] == "Failed")
        assert (stored["status"]["state"], failed["reason"]) == ("Failed", "InvalidSpec")
        # Measured as first seen (before its finalizer and status): about the stored size.
        assert re.fullmatch(
            r"the AppWrapper is 10[23],[0-9]{3} bytes as JSON; at most 65,536 are accepted"
            r" \(the dispatcher's max_appwrapper_bytes\); its largest field is"
            r" spec\.service\.spec\.note \(102,402 bytes\)",
            failed["message"],
        ), failed["message"]
        held = env.manager.appwrappers.store["team/a"]
        assert held["spec"] == {}
        assert json_size(held) < 8 * KIB
        current = env.manager.status.current("team/a")
        assert current is not None
        assert current["spec"] == {}
        assert env.manager.scheduler.cycles == 0
