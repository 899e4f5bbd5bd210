"""What MCAD users and their tools rely on, kept: MCAD's labels on every wrapped object and pod
template; an item without a template accepted, then failed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dispatcher.api.constants import LABEL_UID, MCAD_LABEL_APPWRAPPER, MCAD_LABEL_RESOURCE
from dispatcher.api.models import AppWrapper
from dispatcher.cluster.objects import wrapped_objects
from dispatcher.core.validation import is_label_value
from dispatcher.core.workloads import InvalidSpec, workload_of
from testenv.manifests import appwrapper, deployment, job, service


def _built(aw: dict[str, Any]) -> list[dict[str, Any]]:
    aw["metadata"]["uid"] = "u-1"
    model = AppWrapper.from_kube(aw)
    return [w.body for w in wrapped_objects(model, owner_reference=True)]


def _ray_cluster(name: str) -> dict[str, Any]:
    pod = {"spec": {"containers": [{"name": "ray", "image": "ray"}]}}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "headGroupSpec": {"template": pod},
            "workerGroupSpecs": [{"groupName": "w", "replicas": 2, "template": pod}],
        },
    }


def test_every_object_and_pod_template_carries_mcad_labels() -> None:
    bodies = _built(
        appwrapper(
            "train",
            deployment("web", 2, {"cpu": "1"}),
            job("batch", 1, {"cpu": "1"}),
            service("front"),
            _ray_cluster("ray"),
        )
    )
    templates = [
        bodies[0]["spec"]["template"],
        bodies[1]["spec"]["template"],
        bodies[3]["spec"]["headGroupSpec"]["template"],
        bodies[3]["spec"]["workerGroupSpecs"][0]["template"],
    ]
    names = ["web", "batch", "front", "ray"]
    for body, name in zip(bodies, names, strict=True):
        labels = body["metadata"]["labels"]
        assert labels[MCAD_LABEL_APPWRAPPER] == "train"
        assert labels[MCAD_LABEL_RESOURCE] == name
        assert labels[LABEL_UID] == "u-1"  # ours still there: they decide ownership
    for template, name in zip(templates, ["web", "batch", "ray", "ray"], strict=True):
        labels = template["metadata"]["labels"]
        assert labels[MCAD_LABEL_APPWRAPPER] == "train"
        assert labels[MCAD_LABEL_RESOURCE] == name


def test_a_name_that_is_no_label_value_leaves_that_label_out() -> None:
    long_name = "a" * 64  # a valid object name, too long for a label value
    [body] = _built(appwrapper("train", deployment(long_name, 1, {"cpu": "1"})))
    labels = body["metadata"]["labels"]
    assert MCAD_LABEL_RESOURCE not in labels
    assert labels[MCAD_LABEL_APPWRAPPER] == "train"


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("", True),
        ("a", True),
        ("a.b_c-d", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("-a", False),
        ("a-", False),
        ("a b", False),
        ("\uff41", False),  # a full-width letter
        ("a\n", False),
    ],
)
def test_label_values(text: str, valid: bool) -> None:
    assert is_label_value(text) is valid


def test_an_item_without_a_template_is_accepted_then_invalid() -> None:
    """MCAD's CRD and client accept it; the AppWrapper then fails, naming the item."""
    raw = appwrapper("bad", deployment("d", 1, {"cpu": "1"}))
    raw["spec"]["resources"]["GenericItems"].append({"replicas": 1})
    raw["metadata"].update(namespace="ns", uid="u")
    model = AppWrapper.from_kube(raw)
    result = workload_of(model, priority=0, allowed_kinds=None, now=datetime.now(UTC))
    assert isinstance(result, InvalidSpec)
    assert result.message == "item 1: no generictemplate (the object to create)"
