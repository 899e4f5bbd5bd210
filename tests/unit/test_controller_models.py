"""How the controller reads AppWrappers: a bounded model cache, slimmed objects."""

from __future__ import annotations

import copy
import json
from typing import Any

from dispatcher.controller import reading as reading_module
from dispatcher.controller.reading import LAST_APPLIED, AppWrapperReader
from dispatcher.controller.reading import without_bookkeeping as _without_bookkeeping
from testenv.manifests import appwrapper, deployment


def stored(name: str, version: str) -> dict[str, Any]:
    obj = appwrapper(name, deployment(name, 1, {"cpu": "1"}))
    obj["metadata"].update(namespace="ns", uid=f"uid-{name}", resourceVersion=version)
    return obj


def new_models() -> AppWrapperReader:
    return AppWrapperReader(
        allowed_kinds=frozenset({"Deployment"}), priority_class=lambda name: None
    )


def test_parse_reuses_a_model_until_the_resource_version_moves() -> None:
    state = new_models()
    first = state.parse(stored("a", "1"))
    assert state.parse(stored("a", "1")) is first
    assert state.parse(stored("a", "2")) is not first


def test_parse_cache_keeps_only_the_most_recently_used(monkeypatch: Any) -> None:
    monkeypatch.setattr(reading_module, "PARSED_LIMIT", 3)
    state = new_models()
    models = {name: state.parse(stored(name, "1")) for name in ("a", "b", "c")}
    state.parse(stored("a", "1"))  # "a" is now the most recent, "b" the oldest
    state.parse(stored("d", "1"))
    assert sorted(state._parsed) == ["ns/a", "ns/c", "ns/d"]
    assert state.parse(stored("a", "1")) is models["a"]
    assert state.parse(stored("b", "1")) is not models["b"]  # parsed again, still equal
    assert state.parse(stored("b", "1")) == models["b"]


def test_bookkeeping_is_dropped_and_everything_else_kept() -> None:
    obj = stored("a", "1")
    obj["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    obj["metadata"]["annotations"] = {LAST_APPLIED: "{...}", "team": "ml"}
    spec = copy.deepcopy(obj["spec"])
    slim = _without_bookkeeping(obj)
    assert "managedFields" not in slim["metadata"]
    assert slim["metadata"]["annotations"] == {"team": "ml"}
    assert slim["spec"] == spec
    assert slim["metadata"]["uid"] == "uid-a"
    assert _without_bookkeeping({"kind": "AppWrapper"}) == {"kind": "AppWrapper"}


def test_slimmed_appwrappers_share_their_keys() -> None:
    first, second = (
        _without_bookkeeping(json.loads(json.dumps(stored(name, "1")))) for name in ("a", "b")
    )
    key_a = next(iter(first["spec"]))
    key_b = next(k for k in second["spec"] if k == key_a)
    assert key_a is key_b  # one string for both objects, not an equal copy each


def test_parsing_does_not_verify_and_verify_checks_once_per_version() -> None:
    checked: list[str] = []

    def attribution(obj: dict[str, Any]) -> str:
        checked.append(obj["metadata"]["resourceVersion"])
        return "no creator record"

    state = AppWrapperReader(
        allowed_kinds=frozenset({"Deployment"}),
        priority_class=lambda name: None,
        attribution=attribution,
    )
    first = stored("a", "1")
    model = state.parse(first)
    assert checked == []  # reading is not verifying
    assert state.refusal(model, first) == "no creator record"
    assert state.verify(first) == "no creator record"
    assert checked == ["1"]
    second = stored("a", "2")
    assert state.refusal(state.parse(second), second) == "no creator record"
    assert checked == ["1", "2"]
    state.forget("ns/a")
    assert state.verify(second) == "no creator record"
    assert checked == ["1", "2", "2"]
