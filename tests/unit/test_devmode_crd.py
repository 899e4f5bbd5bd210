"""`run --dev` and the AppWrapper CRD's v1beta2 (dispatcher/devmode.py, crd_for_dev): the
conversion pointed at this machine when the API server reaches it, else v1beta2 not served
for the run, so that `kubectl get aw` works either way."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from dispatcher.devmode import crd_for_dev

CRD = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "appwrapper.yaml").read_text())


def test_reached_the_conversion_calls_this_machine() -> None:
    before = copy.deepcopy(CRD)
    changed = crd_for_dev(CRD, 4443)
    assert changed is not None
    assert changed["spec"]["conversion"]["webhook"]["clientConfig"] == {
        "url": "https://127.0.0.1:4443/convert"
    }
    assert [v["served"] for v in changed["spec"]["versions"]] == [True, True]
    assert before == CRD


def test_not_reached_v1beta2_is_not_served_for_the_run() -> None:
    changed = crd_for_dev(CRD, None)
    assert changed is not None
    served = {v["name"]: v["served"] for v in changed["spec"]["versions"]}
    assert served == {"v1beta1": True, "v1beta2": False}


def test_a_crd_without_conversion_is_left_alone() -> None:
    theirs = {"spec": {"conversion": {"strategy": "None"}, "versions": [{"name": "v1beta2"}]}}
    assert crd_for_dev(theirs, 4443) is None
    assert crd_for_dev({"spec": {}}, None) is None
