"""Conversion between AppWrapper v1beta1 and v1beta2 (dispatcher/core/convert.py): round
trips keep every field, whichever generation the object was written in; the status table."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.names import generated_name
from dispatcher.core.convert import (
    RESERVED_ANNOTATIONS,
    V1BETA1,
    V1BETA1_FIELDS,
    V1BETA2,
    V1BETA2_FIELDS,
    ConversionError,
    convert,
    to_v1beta1,
    to_v1beta2,
)
from dispatcher.core.v1beta2status import (
    OBJECTS_MADE,
    component_status,
    v1beta2_phase,
    v1beta2_status,
)

# -- strategies ----------------------------------------------------------------------------

names = st.text("abcdefgh-", min_size=1, max_size=6)
leaves = st.none() | st.booleans() | st.integers(-5, 5) | names
json_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=8,
)
string_maps = st.dictionaries(names, names, max_size=2)
# Never empty: the API server leaves an empty map out (ObjectMeta's omitempty).
annotations = st.dictionaries(
    st.text("abc./-", min_size=1, max_size=8).filter(lambda k: k not in RESERVED_ANNOTATIONS),
    names,
    min_size=1,
    max_size=2,
)


@st.composite
def templates(draw: st.DrawFn) -> dict[str, Any]:
    template: dict[str, Any] = {}
    if draw(st.booleans()):
        template["kind"] = draw(st.sampled_from(["Job", "Pod", "RayCluster", "Service"]))
    if draw(st.booleans()):
        template["metadata"] = {"name": draw(st.sampled_from(["a", "b"]))}
    if draw(st.booleans()):
        template["spec"] = draw(json_values)
    return template


pod_sets = st.lists(
    st.fixed_dictionaries({"path": names}, optional={"replicas": st.integers(0, 9)}), max_size=2
)
pod_set_infos = st.lists(
    st.fixed_dictionaries(
        {},
        optional={"labels": string_maps, "nodeSelector": string_maps, "annotations": string_maps},
    ),
    max_size=2,
)
shared_item_fields = {"podSets": pod_sets, "podSetInfos": pod_set_infos, "annotations": string_maps}

v1beta1_items = st.fixed_dictionaries(
    {},
    optional={
        "generictemplate": templates(),
        **shared_item_fields,
        "custompodresources": st.lists(
            st.fixed_dictionaries(
                {"replicas": st.integers(0, 4)},
                optional={"requests": st.dictionaries(st.just("cpu"), st.just("1"))},
            ),
            max_size=2,
        ),
        "completionstatus": names,
        "replicas": st.integers(0, 3),
        "priorityslope": st.just(0.5),
    },
)
v1beta1_specs = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.integers(-3, 3),
        "priorityClassName": names,
        "preemptible": st.booleans(),
        "suspend": st.booleans(),
        "schedulingSpec": st.dictionaries(st.sampled_from(["minAvailable", "requeuing"]), leaves),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "GenericItems": st.lists(v1beta1_items, max_size=3),
                "Items": st.lists(st.dictionaries(names, leaves, max_size=2), max_size=1),
            },
        ),
    },
)
v1beta1_conditions = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(
                ["Init", "Queueing", "Dispatched", "Running", "Completed", "Failed", "Backoff"]
            ),
            "status": st.sampled_from(["True", "False"]),
        },
        optional={
            "reason": st.sampled_from(["FrontOfQueue.", "PodsRunning"]),
            "lastTransitionMicroTime": st.just("2024-05-01T12:00:00.000001Z"),
        },
    ),
    # Never empty where present: an empty list and none are the same to every reader.
    min_size=1,
    max_size=4,
)
v1beta1_statuses = st.fixed_dictionaries(
    {},
    optional={
        "state": st.sampled_from(["Pending", "Running"]),
        "conditions": v1beta1_conditions,
        "requeueCount": st.integers(0, 3),
        "dispatchedObjects": st.lists(st.dictionaries(names, names, max_size=2), max_size=2),
    },
)


def metadata() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"name": st.just("aw"), "namespace": st.just("ns")},
        optional={"annotations": annotations, "labels": string_maps},
    )


v1beta1_objects = st.fixed_dictionaries(
    {"apiVersion": st.just(V1BETA1), "kind": st.just("AppWrapper"), "metadata": metadata()},
    optional={"spec": v1beta1_specs, "status": v1beta1_statuses},
)
components = st.fixed_dictionaries({"template": templates()}, optional=shared_item_fields)
v1beta2_objects = st.fixed_dictionaries(
    {
        "apiVersion": st.just(V1BETA2),
        "kind": st.just("AppWrapper"),
        "metadata": metadata(),
        "spec": st.fixed_dictionaries(
            {"components": st.lists(components, max_size=3)},
            optional={"suspend": st.booleans(), "managedBy": names},
        ),
    },
    # No status: a status written in v1beta2 is never kept (test_a_status_written_in_v1beta2_
    # is_dropped).
)


# -- round trips ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(v1beta1_objects)
def test_v1beta1_round_trip_keeps_every_field(obj: dict[str, Any]) -> None:
    before = copy.deepcopy(obj)
    there = convert(obj, V1BETA2)
    assert there["apiVersion"] == V1BETA2
    assert convert(there, V1BETA1) == before
    assert obj == before  # the input is never changed


@settings(max_examples=300, deadline=None)
@given(v1beta2_objects)
def test_v1beta2_round_trip_keeps_every_field(obj: dict[str, Any]) -> None:
    there = convert(obj, V1BETA1)
    assert there["apiVersion"] == V1BETA1
    assert convert(there, V1BETA2) == obj


@settings(max_examples=100, deadline=None)
@given(v1beta1_objects)
def test_v1beta2_view_of_a_stored_object_survives_an_update_through_it(
    obj: dict[str, Any],
) -> None:
    """An update in v1beta2 converts the stored status there and back (the API server keeps
    the old status on a main-resource update): nothing of the v1beta1 status is lost."""
    viewed = to_v1beta2(obj)
    viewed["metadata"].setdefault("labels", {})["edited"] = "yes"
    back = to_v1beta1(viewed)
    assert back.get("status") == obj.get("status")
    assert back["metadata"]["labels"]["edited"] == "yes"


# -- what goes where -----------------------------------------------------------------------


def job(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}}


def test_shared_fields_are_native_in_both_and_mcad_fields_go_to_the_annotation() -> None:
    obj = {
        "apiVersion": V1BETA1,
        "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "ns"},
        "spec": {
            "priority": 5,
            "suspend": True,
            "resources": {
                "GenericItems": [
                    {
                        "generictemplate": job("j"),
                        "podSets": [{"path": "template.spec.template", "replicas": 2}],
                        "completionstatus": "Complete",
                    }
                ]
            },
        },
    }
    there = to_v1beta2(obj)
    assert there["spec"] == {
        "suspend": True,
        "components": [
            {"template": job("j"), "podSets": [{"path": "template.spec.template", "replicas": 2}]}
        ],
    }
    assert json.loads(there["metadata"]["annotations"][V1BETA1_FIELDS]) == {
        "priority": 5,
        "items": [{"$ref": "Job/j", "completionstatus": "Complete"}],
    }


def test_a_fresh_v1beta2_object_carries_no_annotation_in_v1beta1() -> None:
    obj = {
        "apiVersion": V1BETA2,
        "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "ns"},
        "spec": {"components": [{"template": job("j")}]},
    }
    there = to_v1beta1(obj)
    assert there["spec"] == {"resources": {"GenericItems": [{"generictemplate": job("j")}]}}
    assert "annotations" not in there["metadata"]


def test_managed_by_is_kept_in_the_v1beta2_annotation() -> None:
    obj = {
        "apiVersion": V1BETA2,
        "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "ns"},
        "spec": {"components": [], "managedBy": "kueue.x-k8s.io/multikueue"},
    }
    there = to_v1beta1(obj)
    assert json.loads(there["metadata"]["annotations"][V1BETA2_FIELDS]) == {
        "managedBy": "kueue.x-k8s.io/multikueue"
    }


def test_mcad_fields_follow_their_object_when_components_are_reordered() -> None:
    stored = {
        "apiVersion": V1BETA1,
        "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "ns"},
        "spec": {
            "resources": {
                "GenericItems": [
                    {"generictemplate": job("a"), "completionstatus": "Complete"},
                    {"generictemplate": job("b"), "completionstatus": "Failed"},
                ]
            }
        },
    }
    viewed = to_v1beta2(stored)
    viewed["spec"]["components"].reverse()
    items = to_v1beta1(viewed)["spec"]["resources"]["GenericItems"]
    assert [(i["generictemplate"]["metadata"]["name"], i["completionstatus"]) for i in items] == [
        ("b", "Failed"),
        ("a", "Complete"),
    ]


@pytest.mark.parametrize(
    ("obj", "desired", "field"),
    [
        pytest.param({"apiVersion": "v1"}, V1BETA2, "apiVersion", id="not-an-appwrapper"),
        pytest.param({"apiVersion": V1BETA1}, "workload.codeflare.dev/v9", "desired", id="v9"),
        pytest.param(
            {"apiVersion": V1BETA2, "metadata": {}, "spec": {"components": [{"x": 1}]}},
            V1BETA1,
            "spec.components[0]",
            id="unknown-component-field",
        ),
    ],
)
def test_what_cannot_be_converted_is_refused_naming_the_field(
    obj: dict[str, Any], desired: str, field: str
) -> None:
    with pytest.raises(ConversionError, match=field.replace("[", r"\[").replace("]", r"\]")):
        convert(obj, desired)


@pytest.mark.parametrize("text", ["{", "[1]", "plain words", "[" * 5000, "{}" * 3])
@pytest.mark.parametrize("key", RESERVED_ANNOTATIONS)
def test_a_hand_written_reserved_annotation_is_dropped_not_fatal(text: str, key: str) -> None:
    """Not the conversion's JSON: dropped, both ways, never a failure (failing would make
    every list of the namespace fail in the other version) nor a source of anything."""
    obj = {
        "apiVersion": V1BETA1,
        "kind": "AppWrapper",
        "metadata": {"annotations": {key: text, "kept": "yes"}},
        "spec": {"resources": {"GenericItems": []}},
    }
    there = to_v1beta2(obj)
    assert there["metadata"]["annotations"] == {"kept": "yes"}
    assert there["spec"] == {"components": []}
    assert to_v1beta1(there) == {**obj, "metadata": {"annotations": {"kept": "yes"}}}


def test_v1beta1_fields_too_large_for_an_annotation_are_left_out_and_a_write_back_refused() -> None:
    """The API server refuses annotations over 256 KiB together, and a refused conversion
    fails every list of the namespace: the v1beta2 view says they are left out, and a change
    made through it is refused (it would lose them), naming what to do."""
    obj = {
        "apiVersion": V1BETA1,
        "kind": "AppWrapper",
        "metadata": {"name": "big", "annotations": {"a": "b"}},
        "spec": {"service": {"blob": "x" * 300_000}, "resources": {"GenericItems": []}},
    }
    there = to_v1beta2(obj)
    assert json.loads(there["metadata"]["annotations"][V1BETA1_FIELDS]) == {
        "$omitted": len(json.dumps({"service": {"blob": "x" * 300_000}}, separators=(",", ":")))
    }
    assert there["spec"] == {"components": []}
    with pytest.raises(ConversionError, match="change it as v1beta1"):
        to_v1beta1(there)


# -- the status table ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("true", "want"),
    [
        pytest.param(set(), "Suspended", id="new"),
        pytest.param({"Init", "Queueing"}, "Suspended", id="queued"),
        pytest.param({"Init", "Queueing", "Backoff"}, "Resetting", id="backoff"),
        # Running as the AppWrapper controller means it: its objects are made, whether or
        # not their pods run yet (that is PodsReady); Resuming while they are being made.
        pytest.param({"Dispatched"}, "Resuming", id="dispatched-objects-not-made"),
        pytest.param({"Dispatched", OBJECTS_MADE}, "Running", id="objects-made"),
        pytest.param({"Dispatched", "Running"}, "Running", id="pods-running"),
        pytest.param({"Dispatched", "Running", OBJECTS_MADE}, "Running", id="both"),
        pytest.param({"Backoff", OBJECTS_MADE}, "Resetting", id="made-then-requeued"),
        pytest.param({"Init", "Queueing", "HeadOfLine"}, "Suspended", id="head-of-line"),
        pytest.param({"Dispatched", "Running", "Preempted"}, "Suspending", id="evicting"),
        pytest.param({"Dispatched", "Running", "Completed"}, "Succeeded", id="completed"),
        pytest.param({"Dispatched", "Failed"}, "Failed", id="failed"),
    ],
)
def test_phase_table(true: set[str], want: str) -> None:
    assert v1beta2_phase(true) == want


def condition(type_: str, status: str = "True", reason: str = "R") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": f"{type_} says"}


@pytest.mark.parametrize(
    ("conditions", "want_true"),
    [
        pytest.param([condition("Queueing")], set(), id="queued"),
        pytest.param(
            [condition("Dispatched")], {"QuotaReserved", "ResourcesDeployed"}, id="dispatched"
        ),
        pytest.param(
            [condition("Dispatched"), condition("Running")],
            {"QuotaReserved", "ResourcesDeployed", "PodsReady"},
            id="running",
        ),
        pytest.param(
            [condition("Dispatched"), condition("Preempted")],
            {"QuotaReserved", "ResourcesDeployed", "DeletingResources"},
            id="evicting",
        ),
        pytest.param(
            [condition("Requeued"), condition("Backoff"), condition("Dispatched", "False")],
            {"Unhealthy"},
            id="requeued",
        ),
        pytest.param(
            [condition("Queueing"), condition("QuotaHeld")], {"QuotaReserved"}, id="held-for-checks"
        ),
        pytest.param(
            [condition("QuotaHeld", "False"), condition("Dispatched")],
            {"QuotaReserved", "ResourcesDeployed"},
            id="checks-passed-dispatched",
        ),
    ],
)
def test_condition_table(conditions: list[dict[str, Any]], want_true: set[str]) -> None:
    status = v1beta2_status({"conditions": conditions})
    got = {c["type"]: c["status"] for c in status["conditions"]}
    assert set(got) == {
        "QuotaReserved",
        "ResourcesDeployed",
        "PodsReady",
        "Unhealthy",
        "DeletingResources",
    }
    assert {t for t, s in got.items() if s == "True"} == want_true


@pytest.mark.parametrize(
    ("made_for", "want"),
    [
        pytest.param("2026-01-01T00:00:02.000000Z", "Running", id="this-attempt-made"),
        pytest.param("2026-01-01T00:00:01.000000Z", "Resuming", id="an-earlier-attempt-made"),
        pytest.param(None, "Resuming", id="none-made"),
    ],
)
def test_running_once_this_attempts_objects_are_made(made_for: str | None, want: str) -> None:
    status: dict[str, Any] = {
        "conditions": [condition("Dispatched"), condition("Running", "False")],
        "lastDispatchedAt": "2026-01-01T00:00:02.000000Z",
    }
    if made_for is not None:
        status["objectsMadeFor"] = made_for
    out = v1beta2_status(status)
    assert out["phase"] == want
    ready = {c["type"]: c["status"] for c in out["conditions"]}
    assert (ready["ResourcesDeployed"], ready["PodsReady"]) == ("True", "False")


def test_suspended_says_so_and_reasons_are_condition_reasons() -> None:
    status = v1beta2_status(
        {"conditions": [condition("Queueing", reason="FrontOfQueue.")], "requeueCount": 2},
        spec={"suspend": True},
    )
    assert status["phase"] == "Suspended"
    assert status["resettingCount"] == 2
    quota = next(c for c in status["conditions"] if c["type"] == "QuotaReserved")
    assert (quota["status"], quota["reason"]) == ("False", "Suspended")
    assert "spec.suspend" in quota["message"]


def test_the_v1beta2_status_is_the_v1beta1_one_and_more() -> None:
    """`kubectl get aw` reads v1beta2: MCAD's fields and conditions are all still there."""
    stored = {"state": "Running", "conditions": [condition("Dispatched")], "pending": 3}
    obj = {"apiVersion": V1BETA1, "kind": "AppWrapper", "metadata": {}, "status": stored}
    status = to_v1beta2(obj)["status"]
    assert (status["state"], status["pending"], status["phase"]) == ("Running", 3, "Resuming")
    assert status["conditions"][0] == condition("Dispatched")
    assert {c["type"] for c in status["conditions"][1:]} == {
        "QuotaReserved",
        "ResourcesDeployed",
        "PodsReady",
        "Unhealthy",
        "DeletingResources",
    }


def test_an_item_nested_deeper_than_deepcopy_goes_converts_both_ways() -> None:
    # copy.deepcopy takes two frames a level: 500 levels were a RecursionError, and a
    # conversion that fails fails every read of the namespace through v1beta2.
    deep: Any = 1
    for _ in range(500):
        deep = {"a": deep}
    item = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "deep"}, "x": deep}
    obj = {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": "deep", "namespace": "team"},
        "spec": {"resources": {"GenericItems": [{"generictemplate": item}]}},
    }
    there = convert(obj, "workload.codeflare.dev/v1beta2")
    back = convert(there, "workload.codeflare.dev/v1beta1")
    assert back["spec"]["resources"]["GenericItems"][0]["generictemplate"] == item


def _made_status(*, made: bool, dispatched: bool = True) -> dict[str, Any]:
    attempt = "2026-01-01T00:00:00.000000Z"
    return {
        "lastDispatchedAt": attempt,
        "objectsMadeFor": attempt if made else "2025-12-31T00:00:00.000000Z",
        "conditions": [{"type": "Dispatched", "status": "True" if dispatched else "False"}],
    }


def test_component_status_names_each_object_once_made() -> None:
    components = [
        {"template": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"generateName": "j-"}}},
        {
            "template": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}},
            "podSets": [{"replicas": 1}],
        },
    ]
    got = component_status(components, _made_status(made=True), seed="uid-1")
    assert [(c["name"], c["kind"], c["apiVersion"]) for c in got] == [
        (generated_name("j-", "uid-1", 0), "Job", "batch/v1"),
        ("s", "Service", "v1"),
    ]
    assert got[1]["podSets"] == [{"replicas": 1}]
    assert "podSets" not in got[0]
    assert {c["conditions"][0]["status"] for c in got} == {"True"}
    # An earlier attempt's objects were made, this one's not yet: listed, not deployed.
    earlier = component_status(components, _made_status(made=False), seed="uid-1")
    assert {c["conditions"][0]["status"] for c in earlier} == {"False"}
    assert component_status(components, {"conditions": []}, seed="uid-1") == []


def test_component_status_is_in_the_v1beta2_view_and_dropped_on_the_way_back() -> None:
    obj = {
        "apiVersion": V1BETA1,
        "kind": "AppWrapper",
        "metadata": {"name": "a", "namespace": "n", "uid": "u"},
        "spec": {"resources": {"GenericItems": [{"generictemplate": {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}}]}},
        "status": _made_status(made=True),
    }  # fmt: skip
    as_v2 = convert(obj, V1BETA2)
    assert [c["name"] for c in as_v2["status"]["componentStatus"]] == ["p"]
    assert "componentStatus" not in convert(as_v2, V1BETA1)["status"]
