"""v1beta2's declared podSets and podSetInfos (dispatcher/core/declared.py), read through
the item readings the scheduler uses (core/workloads.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.api.models import GenericItem
from dispatcher.api.quantity import QuantityError
from dispatcher.api.resources import Resources
from dispatcher.core.declared import dispatch_template, parse_path
from dispatcher.core.model import ONE_POD, PODS
from dispatcher.core.podsets import MAX_PODS
from dispatcher.core.workloads import item_pod_sets


def pod_template(cpu: str = "1") -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}


def custom_kind() -> dict[str, Any]:
    """A kind the dispatcher cannot infer: only declared podSets say what it makes."""
    return {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "metadata": {"name": "t"},
        "spec": {"roles": [{"template": pod_template("1")}, {"template": pod_template("2")}]},
    }


def item(template: dict[str, Any], **fields: Any) -> GenericItem:
    return GenericItem.model_validate({"generictemplate": template, **fields})


def sets(it: GenericItem) -> list[tuple[int, Resources, tuple[tuple[str, str], ...]]]:
    return [(p.count, p.requests - {PODS: ONE_POD}, p.node_selector) for p in item_pod_sets(it)]


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("template.spec.template", ["spec", "template"]),
        ("template.spec.workerGroupSpecs[0].template", ["spec", "workerGroupSpecs", 0, "template"]),
        ("template", []),
    ],
)
def test_parse_path(path: str, want: list[str | int]) -> None:
    assert parse_path(path) == want


def test_declared_pod_sets_replace_inference_for_any_kind() -> None:
    declared = item(
        custom_kind(),
        podSets=[
            {"path": "template.spec.roles[0].template", "replicas": 2},
            {"path": "template.spec.roles[1].template"},
        ],
    )
    assert sets(declared) == [
        (2, Resources.parse({"cpu": "1"}), ()),
        (1, Resources.parse({"cpu": "2"}), ()),
    ]


@pytest.mark.parametrize(
    ("pod_sets", "want"),
    [
        pytest.param(
            [{"path": "template.spec.nowhere"}],
            "podSets[0].path 'template.spec.nowhere': no field 'nowhere' there",
            id="path-to-nowhere",
        ),
        pytest.param(
            [{"path": "template.spec.roles[5].template"}],
            "podSets[0].path 'template.spec.roles[5].template': no element [5] there",
            id="index-past-the-end",
        ),
        pytest.param(
            [{"path": "template.spec.roles"}],
            "is not a pod template",
            id="not-a-pod-template",
        ),
        pytest.param(
            [{"path": "spec.roles[0].template"}],
            "must start with 'template'",
            id="not-rooted-at-template",
        ),
        pytest.param(
            [{"path": "template.spec.roles[0].template", "replicas": MAX_PODS + 1}],
            f"podSets[0].replicas {MAX_PODS + 1}: more than {MAX_PODS} pods",
            id="replicas-past-the-limit",
        ),
    ],
)
def test_bad_declarations_name_the_field(pod_sets: list[dict[str, Any]], want: str) -> None:
    with pytest.raises(QuantityError, match=want.replace("[", r"\[").replace("]", r"\]")):
        item_pod_sets(item(custom_kind(), podSets=pod_sets))


def job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"parallelism": 2, "template": pod_template()},
    }


def test_pod_set_infos_are_fitted_with_and_injected_at_dispatch() -> None:
    info = {
        "labels": {"team": "a"},
        "annotations": {"note": "x"},
        "nodeSelector": {"zone": "z1"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
    }
    it = item(job(), podSetInfos=[info])
    assert sets(it) == [(2, Resources.parse({"cpu": "1"}), (("zone", "z1"),))]
    (pod_set,) = item_pod_sets(it)
    assert [t.key for t in pod_set.tolerations] == ["gpu"]
    made = dispatch_template(it, {"workload.codeflare.dev/appwrapper": "aw"})
    template = made["spec"]["template"]
    assert template["metadata"] == {"labels": {"team": "a"}, "annotations": {"note": "x"}}
    assert template["spec"]["nodeSelector"] == {"zone": "z1"}
    assert "nodeSelector" not in job()["spec"]["template"]["spec"]  # the input is untouched


def test_more_infos_than_pod_templates_is_refused() -> None:
    with pytest.raises(QuantityError, match="podSetInfos has 2 entries but the object has 1"):
        item_pod_sets(item(job(), podSetInfos=[{}, {}]))


def test_declared_pod_templates_get_the_labels() -> None:
    it = item(custom_kind(), podSets=[{"path": "template.spec.roles[1].template"}])
    made = dispatch_template(it, {"workload.codeflare.dev/appwrapper": "aw"})
    roles = made["spec"]["roles"]
    assert roles[1]["template"]["metadata"]["labels"] == {"workload.codeflare.dev/appwrapper": "aw"}
    assert "metadata" not in roles[0]["template"]
