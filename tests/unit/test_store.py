"""The informer's object store: cold objects are held as text and read back equal."""

from __future__ import annotations

import sys
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.kube.store import ObjectStore

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


def finished(obj: dict[str, Any]) -> bool:
    return bool(obj.get("done"))


@given(st.dictionaries(st.text(max_size=5), json_values, max_size=5), st.booleans())
def test_reads_return_what_was_stored(obj: dict[str, Any], done: bool) -> None:
    store = ObjectStore(finished)
    stored = {**obj, "done": done}
    store["k"] = stored
    assert store["k"] == stored
    assert store.get("k") == stored
    assert dict(store.items()) == {"k": stored}
    assert list(store.values()) == [stored]
    assert store.packed() == (1 if done else 0)


def test_cold_objects_are_held_as_text_and_hot_ones_as_given() -> None:
    store = ObjectStore(finished)
    hot = {"metadata": {"name": "a"}}
    store["a"] = hot
    store["b"] = {"metadata": {"name": "b"}, "done": True}
    assert store["a"] is hot  # no copy on the hot path
    assert store["b"] is not store["b"]  # a fresh decode per read
    assert store.packed() == 1
    assert sorted(store) == ["a", "b"]
    assert len(store) == 2
    assert "b" in store


def test_a_cold_object_turning_hot_is_held_as_given() -> None:
    store = ObjectStore(finished)
    store["a"] = {"done": True}
    again = {"done": False, "deleting": True}
    store["a"] = again
    assert store["a"] is again
    assert store.packed() == 0


def test_pop_and_missing_keys() -> None:
    store = ObjectStore(finished)
    store["a"] = {"done": True, "x": "é"}
    assert store.pop("a") == {"done": True, "x": "é"}
    assert store.pop("a") is None
    assert store.get("a") is None
    assert store.get("a", {"d": 1}) == {"d": 1}


def test_text_is_smaller_than_the_decoded_object() -> None:
    obj = {
        "status": {
            "conditions": [
                {"type": t, "status": "True", "reason": "R", "message": "m" * 20}
                for t in ("Queueing", "Dispatched", "Running", "Completed")
            ]
        },
        "done": True,
    }

    def deep_size(value: Any) -> int:
        size = sys.getsizeof(value)
        if isinstance(value, dict):
            size += sum(deep_size(k) + deep_size(v) for k, v in value.items())
        elif isinstance(value, list):
            size += sum(deep_size(v) for v in value)
        return size

    store = ObjectStore(finished)
    store["a"] = obj
    packed = store._items["a"]
    assert isinstance(packed, bytes)
    assert sys.getsizeof(packed) * 2 < deep_size(obj)
