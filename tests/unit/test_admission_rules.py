"""The admission rules (dispatcher.core.gatekeeping): creator records, signatures, updates,
priority policy."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.core.gatekeeping import (
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
    return apply_patch(
        obj, record_patch(operation="CREATE", obj=obj, old=None, user=user, keys=[KEY])
    )


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


BOB = Creator("bob", "u-2", ("team-a", "system:authenticated"))


def edited(old: dict[str, Any], change: Any, user: Creator, keys: list[bytes]) -> dict[str, Any]:
    """`old` changed by `change(new)`, then through the mutating webhook as `user`."""
    new = copy.deepcopy(old)
    change(new)
    return apply_patch(
        new, record_patch(operation="UPDATE", obj=new, old=old, user=user, keys=keys)
    )


def set_priority(obj: dict[str, Any]) -> None:
    obj["spec"]["priority"] = 3


def drop_record_and_set_priority(obj: dict[str, Any]) -> None:
    del obj["metadata"]["annotations"][USER]  # kubectl replace of a file without it
    obj["spec"]["priority"] = 3


def forge_record_and_set_priority(obj: dict[str, Any]) -> None:
    obj["metadata"]["annotations"][USER] = Creator("admin", "", ("system:masters",)).annotation()
    obj["spec"]["priority"] = 3


def add_label(obj: dict[str, Any]) -> None:
    obj["metadata"]["labels"] = {"team": "a"}


def drop_record(obj: dict[str, Any]) -> None:
    del obj["metadata"]["annotations"][USER]


OLD_KEY = b"o" * 32


@pytest.mark.parametrize(
    ("change", "editor", "signed_with", "want_record", "want_problems"),
    [
        # A change of the spec is a new request: the record names whoever made it.
        pytest.param(set_priority, BOB, KEY, BOB, [], id="editor-becomes-the-record"),
        pytest.param(set_priority, ALICE, KEY, ALICE, [], id="creator-edits-own"),
        pytest.param(drop_record_and_set_priority, BOB, KEY, BOB, [], id="replace-without-it"),
        pytest.param(forge_record_and_set_priority, BOB, KEY, BOB, [], id="forged-overwritten"),
        # Signed with a retired key: a spec change is signed with the current one.
        pytest.param(set_priority, BOB, OLD_KEY, BOB, [], id="old-key-spec-change"),
        # Metadata only: the record stays, signed again with the current key.
        pytest.param(add_label, BOB, KEY, ALICE, [], id="label-keeps-record"),
        pytest.param(add_label, BOB, OLD_KEY, ALICE, [], id="label-re-signs-old-key"),
        pytest.param(drop_record, BOB, KEY, ALICE, [], id="metadata-replace-without-it"),
    ],
)
def test_update_records_and_signs(
    change: Any,
    editor: Creator,
    signed_with: bytes,
    want_record: Creator,
    want_problems: list[str],
) -> None:
    old = apply_patch(
        appwrapper(),
        record_patch(
            operation="CREATE", obj=appwrapper(), old=None, user=ALICE, keys=[signed_with]
        ),
    )
    new = edited(old, change, editor, [KEY, OLD_KEY])
    assert attribution(new, [KEY]).creator == want_record  # verifies with the current key
    assert update_problems(new, old, editor) == want_problems


def test_update_never_signs_a_record_that_did_not_verify() -> None:
    old = appwrapper()
    old["metadata"]["annotations"] = {USER: Creator("admin").annotation()}
    patched = edited(old, add_label, ALICE, [KEY])
    assert attribution(patched, [KEY]).creator is None


def test_a_spec_change_makes_an_unverified_record_the_editors() -> None:
    """Not laundering: the validating webhook checks every right of the editor."""
    old = appwrapper()
    old["metadata"]["annotations"] = {USER: Creator("admin").annotation()}
    patched = edited(old, set_priority, ALICE, [KEY])
    assert attribution(patched, [KEY]).creator == ALICE


@pytest.mark.parametrize(
    ("record", "editor", "want"),
    [
        pytest.param(BOB, BOB, "", id="the-editor"),
        pytest.param(ALICE, BOB, "with this change of the spec it names bob", id="the-creator"),
        pytest.param(None, BOB, "with this change of the spec it names bob", id="none"),
        pytest.param(
            Creator("bob", "u-2", ("system:masters",)), BOB, "it names bob", id="more-groups"
        ),
    ],
)
def test_a_spec_change_must_record_the_editor(
    record: Creator | None, editor: Creator, want: str
) -> None:
    old = created(appwrapper())
    new = copy.deepcopy(old)
    new["spec"]["priority"] = 3
    if record is None:
        del new["metadata"]["annotations"][USER]
    else:
        new["metadata"]["annotations"][USER] = record.annotation()
    problems = update_problems(new, old, editor)
    if want:
        assert len(problems) == 1, problems
        assert want in problems[0]
    else:
        assert problems == []


def test_update_leaves_a_changed_record_for_the_validating_webhook_to_refuse() -> None:
    old = created(appwrapper())
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][USER] = Creator("admin").annotation()
    patch = record_patch(operation="UPDATE", obj=new, old=old, user=ALICE, keys=[KEY])
    assert all(op["path"] != "/metadata/annotations/workload.codeflare.dev~1user" for op in patch)
    assert update_problems(apply_patch(new, patch), old, ALICE)


def test_update_of_metadata_only_needs_no_patch() -> None:
    old = created(appwrapper())
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = ["x"]
    assert record_patch(operation="UPDATE", obj=new, old=old, user=ALICE, keys=[KEY]) == []


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
        "cannot change while the AppWrapper is dispatched" in p
        for p in update_problems(new, old, ALICE)
    )
    queued = copy.deepcopy(new)
    queued.pop("status")
    assert update_problems(queued, {**old, "status": {}}, ALICE) == []


def test_the_record_cannot_change() -> None:
    old = created(appwrapper())
    new = copy.deepcopy(old)
    new["metadata"]["annotations"][USER] = Creator("admin").annotation()
    assert any("cannot change" in p for p in update_problems(new, old, ALICE))
    added = appwrapper()
    added["metadata"]["annotations"] = {USER: Creator("admin").annotation()}
    assert any("cannot change" in p for p in update_problems(added, appwrapper(), ALICE))


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


def test_extra_round_trips_and_old_records_read_as_they_were() -> None:
    info = {
        "username": "carol",
        "uid": "u-3",
        "groups": ["g"],
        "extra": {"scopes.example.com": ["read", "write"], "authn.example.com/method": ["oidc"]},
    }
    carol = Creator.from_user_info(info)
    assert carol.extra == (
        ("authn.example.com/method", ("oidc",)),
        ("scopes.example.com", ("read", "write")),
    )
    assert Creator.from_annotation(carol.annotation()) == carol
    assert carol.extra_map() == {
        "authn.example.com/method": ["oidc"],
        "scopes.example.com": ["read", "write"],
    }
    # Without extra the record is the text it always was, so old signatures still verify.
    assert ALICE.annotation() == (
        '{"username":"alice","uid":"u-1","groups":["team-a","system:authenticated"]}'
    )
    old = created(appwrapper())
    assert attribution(old, [KEY]).creator == ALICE
    signed = created(appwrapper(), carol)
    assert attribution(signed, [KEY]).creator == carol
    assert "extra" in json.loads(signed["metadata"]["annotations"][USER])


@pytest.mark.parametrize(
    "extra",
    [pytest.param([], id="list"), pytest.param({"k": "v"}, id="not-a-list"), {"k": [1]}],
)
def test_a_record_with_malformed_extra_is_no_record(extra: Any) -> None:
    text = json.dumps({"username": "x", "uid": "", "groups": [], "extra": extra})
    assert Creator.from_annotation(text) is None
