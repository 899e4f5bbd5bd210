"""What the controller remembers: bounded model cache, slimmed AppWrappers, pod revisions."""

from __future__ import annotations

import copy
import json
from dataclasses import fields
from typing import Any

from dispatcher.controller import state as state_module
from dispatcher.controller.dispatcher import LAST_APPLIED, _without_bookkeeping
from dispatcher.controller.state import ControllerState
from dispatcher.testing.manifests import appwrapper, deployment


def stored(name: str, version: str) -> dict[str, Any]:
    obj = appwrapper(name, deployment(name, 1, {"cpu": "1"}))
    obj["metadata"].update(namespace="ns", uid=f"uid-{name}", resourceVersion=version)
    return obj


def test_parse_reuses_a_model_until_the_resource_version_moves() -> None:
    state = ControllerState()
    first = state.parse(stored("a", "1"))
    assert state.parse(stored("a", "1")) is first
    assert state.parse(stored("a", "2")) is not first


def test_parse_cache_keeps_only_the_most_recently_used(monkeypatch: Any) -> None:
    monkeypatch.setattr(state_module, "PARSED_LIMIT", 3)
    state = ControllerState()
    models = {name: state.parse(stored(name, "1")) for name in ("a", "b", "c")}
    state.parse(stored("a", "1"))  # "a" is now the most recent, "b" the oldest
    state.parse(stored("d", "1"))
    assert sorted(state.parsed) == ["ns/a", "ns/c", "ns/d"]
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


def test_finished_then_deleted_appwrappers_leave_nothing_behind() -> None:
    state = ControllerState()
    key = "ns/a"
    state.ensured[key] = "t1"
    state.cleaned[key] = ("uid-a", "t1")
    state.waiting_written[key] = ("waiting", 1.0)
    state.counts_written[key] = 1.0
    state.evicted[key] = "t1"
    state.phases[key] = ("finished", 1)
    state.retire(key)
    assert key not in state.ensured
    assert key not in state.waiting_written
    # A failed one's objects were removed once; that is remembered until it is deleted.
    assert state.cleaned[key] == ("uid-a", "t1")
    state.forget(key)
    state.phases.pop(key)  # the watch handler drops the scheduler's index entry
    for f in fields(state):
        held = getattr(state, f.name)
        assert key not in held, f.name
