"""`run --dev` and the AppWrapper CRD's two forms (dispatcher/devmode.py, crd_for_dev;
dispatcher/core/crdforms.py): converting through this machine when the API server reaches
it, else readable; never a CRD that is not ours. The forms themselves: the shipped CRD is
the readable one, and each form is the other's exact inverse on what it changes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from dispatcher.core.crdforms import converting, is_ours, readable
from dispatcher.devmode import crd_for_dev, kubectl_discovery_cache

REPO = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((REPO / "crds" / "appwrapper.yaml").read_text())
INSTALLED = {
    "service": {
        "namespace": "appwrapper-system",
        "name": "appwrapper-dispatcher-webhook",
        "path": "/convert",
        "port": 443,
    }
}


def apply_patch(doc: dict, patch: list[dict]) -> dict:  # type: ignore[type-arg]
    """RFC 6902's `test` and `replace`, the only operations the manifests' patches use (as the
    API server applies them: a failed test refuses the whole patch)."""
    doc = copy.deepcopy(doc)
    for op in patch:
        *parents, last = [int(p) if p.isdigit() else p for p in op["path"].split("/")[1:]]
        target = doc
        for part in parents:
            target = target[part]
        if op["op"] == "test":
            assert target[last] == op["value"], op
        else:
            assert op["op"] == "replace", op
            assert last in (range(len(target)) if isinstance(target, list) else target), op
            target[last] = op["value"]
    return doc


def served(crd: dict) -> dict[str, bool]:  # type: ignore[type-arg]
    return {v["name"]: v["served"] for v in crd["spec"]["versions"]}


def test_the_shipped_crd_is_the_readable_form() -> None:
    assert readable(CRD) == CRD
    assert served(CRD) == {"v1beta1": True, "v1beta2": False}
    assert CRD["spec"]["conversion"] == {"strategy": "None"}


def test_reached_the_conversion_calls_this_machine() -> None:
    before = copy.deepcopy(CRD)
    changed = crd_for_dev(CRD, 4443)
    assert changed is not None
    assert changed["spec"]["conversion"]["webhook"]["clientConfig"] == {
        "url": "https://127.0.0.1:4443/convert"
    }
    assert served(changed) == {"v1beta1": True, "v1beta2": True}
    assert before == CRD


def test_not_reached_or_left_by_a_killed_run_it_is_readable() -> None:
    left = converting(CRD, {"url": "https://127.0.0.1:9/convert"})
    assert crd_for_dev(left, None) == CRD
    assert crd_for_dev(CRD, None) == CRD


def test_a_crd_not_ours_is_left_alone() -> None:
    theirs = {
        "spec": {
            "conversion": {"strategy": "None"},
            "versions": [{"name": "v1beta2", "served": True, "storage": True}],
        }
    }
    assert not is_ours(theirs)
    assert crd_for_dev(theirs, 4443) is None
    assert crd_for_dev(theirs, None) is None
    assert crd_for_dev({"spec": {}}, None) is None


def test_a_conversion_elsewhere_than_convert_is_refused() -> None:
    with pytest.raises(ValueError, match="/convert"):
        converting(CRD, {"url": "https://127.0.0.1:9/mutate-appwrapper"})


def test_the_manifests_patches_are_the_two_forms() -> None:
    """manifests/crd-patches/conversion.json turns the shipped CRD into the installed
    converting form, readable.json turns it back (the JSON patches the docs give users)."""
    on = json.loads((REPO / "manifests" / "crd-patches" / "conversion.json").read_text())
    off = json.loads((REPO / "manifests" / "crd-patches" / "readable.json").read_text())
    installed = apply_patch(CRD, on)
    assert installed == converting(CRD, INSTALLED)
    assert apply_patch(installed, off) == CRD


@pytest.mark.parametrize(
    ("server", "environ", "wanted"),
    [
        ("https://127.0.0.1:6443", {}, "/home/u/.kube/cache/discovery/127.0.0.1_6443"),
        ("http://api.example.com", {}, "/home/u/.kube/cache/discovery/api.example.com"),
        (
            "https://[::1]:6443/prefix",
            {"KUBECACHEDIR": "/c"},
            "/c/discovery/___1__6443/prefix",
        ),
    ],
)
def test_kubectls_discovery_cache_is_named_as_kubectl_names_it(
    server: str, environ: dict[str, str], wanted: str
) -> None:
    assert str(kubectl_discovery_cache(server, environ=environ, home=Path("/home/u"))) == wanted
