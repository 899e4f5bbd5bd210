"""An informer's objects by key, holding the ones its owner calls cold as compact JSON.

No I/O.

A decoded object costs about four times its JSON text in Python dicts and strings. A
dispatcher keeps every AppWrapper it has ever seen until it is deleted, and most of them,
once finished, are never read again until someone deletes them: those are kept as text and
decoded on each read (a few tens of microseconds). Readers get a fresh dict for a cold
object each time; like every object handed out by an informer, it must not be changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

Obj = dict[str, Any]

_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


class ObjectStore:
    """key -> object, read like a dict; objects for which `cold` holds are kept packed."""

    def __init__(self, cold: Callable[[Obj], bool] | None = None) -> None:
        self._items: dict[str, Obj | bytes] = {}
        self._cold = cold

    def __setitem__(self, key: str, obj: Obj) -> None:
        if self._cold is not None and self._cold(obj):
            try:
                self._items[key] = _encode(obj).encode()
                return
            except (RecursionError, ValueError, TypeError):
                pass  # user data too deep (or odd) for the encoder: kept decoded instead
        self._items[key] = obj

    def __getitem__(self, key: str) -> Obj:
        return _unpacked(self._items[key])

    def get(self, key: str, default: Obj | None = None) -> Obj | None:
        value = self._items.get(key)
        return default if value is None else _unpacked(value)

    def pop(self, key: str, default: Obj | None = None) -> Obj | None:
        value = self._items.pop(key, None)
        return default if value is None else _unpacked(value)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def keys(self) -> Iterator[str]:
        return iter(self._items)

    def values(self) -> Iterator[Obj]:
        return (_unpacked(v) for v in self._items.values())

    def items(self) -> Iterator[tuple[str, Obj]]:
        return ((k, _unpacked(v)) for k, v in self._items.items())

    def packed(self) -> int:
        """How many objects are held as text (for metrics and tests)."""
        return sum(1 for v in self._items.values() if isinstance(v, bytes))


def _unpacked(value: Obj | bytes) -> Obj:
    if isinstance(value, bytes):
        decoded: Obj = json.loads(value)
        return decoded
    return value
