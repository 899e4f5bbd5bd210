"""The admission rules (dispatcher.core.admission): creator records, signatures, updates,
priority policy."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.core.admission import (
    SIGNATURE,
    USER,
    Access,
    Creator,
    PriorityPolicy,
    PriorityRule,
    attribution,
    priority_problems,
    record_patch,
    refusal,
    sign,
    update_problems,
    wants_nonpreemptible,
)

KEY = b"k" * 32
ALICE = Creator("alice", "u-1", ("team-a", "system:authenticated"))


def appwrapper(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "team-a"},
        "spec": {"resources": {"GenericItems": [{"generictemplate": {"kind": "Pod"}}]}, **spec},
    }


def apply_patch(obj: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """The subset of RFC 6902 that record_patch emits: add under /metadata/annotations."""
    out = copy.deepcopy(obj)
    for op in patch:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = op["value"]
    return out


def created(obj: dict[str, Any], user: Creator = ALICE) -> dict[str, Any]:
    return apply_patch(obj, record_patch(operation="CREATE", obj=obj, old=None, user=user, key=KEY))


def test_create_records_the_user_and_the_record_verifies() -> None:
    obj = created(appwrapper())
    found = attribution(obj, [KEY])
    assert found.creator == ALICE
    assert found.problem == ""
    assert json.loads(obj["metadata"]["annotations"][USER])["username"] == "alice"


def test_create_overwrites_a_record_the_user_wrote() -> None:
    forged = appwrapper()
    forged["metadata"]["annotations"] = {USER: Creator("admin").annotation(), SIGNATURE: "v1:00"}
    obj = created(forged)
    assert attribution(obj, [KEY]).creator == ALICE


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda o: o["metadata"]["annotations"].pop(USER), "no record"),
        (lambda o: o["metadata"]["annotations"].pop(SIGNATURE), "not signed"),
        (lambda o: o["spec"].update(priority=5), "not signed"),
        (lambda o: o["metadata"].update(namespace="team-b"), "not signed"),
        (
            lambda o: o["metadata"]["annotations"].update({USER: Creator("admin").annotation()}),
            "not signed",
        ),
        (lambda o: o["metadata"]["annotations"].update({USER: "{not json"}), "not signed"),
    ],
)
def test_anything_changed_past_the_webhook_is_unattributed(change: Any, why: str) -> None:
    obj = created(appwrapper())
    change(obj)
    found = attribution(obj, [KEY])
    assert found.creator is None
    assert why in found.problem


def test_another_key_does_not_verify() -> None:
    assert attribution(created(appwrapper()), [b"other" * 8]).creator is None
    assert attribution(created(appwrapper()), [b"other" * 8, KEY]).creator == ALICE


def test_update_keeps_the_record_and_signs_the_new_spec() -> None:
    old = created(appwrapper())
    new = copy.deepcopy(old)
    new["spec"]["priority"] = 3
    del new["metadata"]["annotations"][USER]  # kubectl replace of a file without it
    patched = apply_patch(
        new,
        record_patch(operation="UPDATE", obj=new, old=old, user=Creator("bob"), key=KEY),
    )
    assert attribution(patched, [KEY]).creator == ALICE


def test_update_never_signs_a_record_that_did_not_verify() -> None:
    old = appwrapper()
    old["metadata"]["annotations"] = {USER: Creator("admin").annotation()}
    new = copy.deepcopy(old)
    patched = apply_patch(
        new, record_patch(operation="UPDATE", obj=new, old=old, user=ALICE, key=KEY)
    )
    assert attribution(patched, [KEY]).creator is None


def test_update_leaves_a_changed_record_for_the_validating_webhook_to_refuse() -> None:
    old = created(appwrapper())
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][USER] = Creator("admin").annotation()
    patch = record_patch(operation="UPDATE", obj=new, old=old, user=ALICE, key=KEY)
    assert all(op["path"] != "/metadata/annotations/workload.codeflare.dev~1user" for op in patch)
    assert update_problems(apply_patch(new, patch), old)


def test_update_of_metadata_only_needs_no_patch() -> None:
    old = created(appwrapper())
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = ["x"]
    assert record_patch(operation="UPDATE", obj=new, old=old, user=ALICE, key=KEY) == []


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=12,
    ),
    st.text(max_size=8),
)
def test_signature_covers_every_part_of_the_spec(spec: Any, extra: str) -> None:
    record = ALICE.annotation()
    signed = sign(KEY, "ns", record, spec)
    assert sign(KEY, "ns", record, copy.deepcopy(spec)) == signed
    assert sign(KEY, "ns", record, {"wrapped": spec, "x": extra}) != signed
    assert sign(KEY, "ns" + extra + "!", record, spec) != signed


def dispatched(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["status"] = {"conditions": [{"type": "Dispatched", "status": "True"}]}
    return out


def test_items_of_a_dispatched_appwrapper_cannot_change() -> None:
    old = dispatched(created(appwrapper()))
    new = copy.deepcopy(old)
    new["spec"]["resources"]["GenericItems"].append({"generictemplate": {"kind": "Service"}})
    assert any(
        "cannot change while the AppWrapper is dispatched" in p for p in update_problems(new, old)
    )
    queued = copy.deepcopy(new)
    queued.pop("status")
    assert update_problems(queued, {**old, "status": {}}) == []


def test_the_record_cannot_change() -> None:
    old = created(appwrapper())
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][USER] = Creator("admin").annotation()
    assert any("cannot change" in p for p in update_problems(new, old))
    added = appwrapper()
    added["metadata"]["annotations"] = {USER: Creator("admin").annotation()}
    assert any("cannot change" in p for p in update_problems(added, appwrapper()))


POLICY = PriorityPolicy(
    namespaces={
        "team-a": PriorityRule(classes=["dev", "prod"], max_priority=100, min_priority=0),
    }
)


@pytest.mark.parametrize(
    ("namespace", "spec", "class_value", "expected"),
    [
        ("team-a", {"priorityClassName": "dev"}, 10, ""),
        ("team-a", {"priorityClassName": "high"}, 10, "not one namespace team-a may use"),
        ("team-a", {"priority": 100}, None, ""),
        ("team-a", {"priority": 101}, None, "above the highest this namespace may use (100)"),
        ("team-a", {"priority": -1}, None, "below the lowest"),
        ("other", {"priority": 9_000_000_000_000_000_000}, None, "above the highest"),
        ("other", {"priority": 1_000_000_000}, None, ""),
        ("other", {"priorityClassName": "system-node-critical"}, 2_000_001_000, "reserved"),
        ("other", {"priorityClassName": "big"}, 2_000_000_000, "has value 2000000000, above"),
        ("other", {"priorityClassName": "normal"}, 50, ""),
    ],
)
def test_priority_policy(
    namespace: str, spec: dict[str, Any], class_value: int | None, expected: str
) -> None:
    problems = priority_problems(spec, namespace=namespace, policy=POLICY, class_value=class_value)
    if expected:
        assert len(problems) == 1, problems
        assert expected in problems[0]
    else:
        assert problems == []


def test_nonpreemptible_is_asked_only_when_newly_requested() -> None:
    assert wants_nonpreemptible({"preemptible": False}, None)
    assert not wants_nonpreemptible({"preemptible": True}, None)
    assert not wants_nonpreemptible({}, None)
    assert not wants_nonpreemptible({"preemptible": False}, {"spec": {"preemptible": False}})
    assert wants_nonpreemptible({"preemptible": False}, {"spec": {}})


def test_refusal_names_each_right_and_its_items() -> None:
    message = refusal(
        ALICE,
        {
            Access("create", "", "pods", "team-a"): ["item 0 (Pod/p)"],
            Access("create", "networking.k8s.io", "networkpolicies", "team-a"): [
                "item 1 (NetworkPolicy/n)"
            ],
        },
    )
    assert "item 0 (Pod/p): alice may not create pods in namespace team-a" in message
    assert "alice may not create networkpolicies.networking.k8s.io in namespace team-a" in message
