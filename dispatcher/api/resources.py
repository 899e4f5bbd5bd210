"""Resource vectors over any resource name (cpu, memory, nvidia.com/gpu, ...). Pure, no I/O.

A `Resources` value maps resource names to integer milli-units. It is immutable and
hashable so that the core can share it freely between snapshots.
"""

from __future__ import annotations

from collections.abc import (
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    Sequence,
    ValuesView,
)
from itertools import chain
from typing import Any

from dispatcher.api.quantity import QuantityError, format_milli, parse_milli


class Resources(Mapping[str, int]):
    """An immutable map of resource name -> milli-units; absent names are zero."""

    __slots__ = ("_hash", "_items")

    def __init__(self, items: Mapping[str, int] | Iterable[tuple[str, int]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items: dict[str, int] = {k: v for k, v in pairs if v != 0}
        self._hash: int | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None) -> Resources:
        """Parse a Kubernetes requests/limits/allocatable map; errors name the resource."""
        if not raw:
            return EMPTY
        parsed: dict[str, int] = {}
        for name, value in raw.items():
            try:
                parsed[str(name)] = parse_milli(value)
            except QuantityError as exc:
                raise QuantityError(f"{name}: {exc}") from None
        return cls(parsed)

    @staticmethod
    def columns(values: Sequence[Mapping[str, int]]) -> dict[str, list[int]]:
        """Per resource name (first seen first), its amount in each of `values`, in order,
        zero where absent: one pass per name over the inner dicts, for per-node columns
        of thousands of nodes (a method call per value would cost more than the work)."""
        maps = [v._items if type(v) is Resources else dict(v.items()) for v in values]
        names = dict.fromkeys(chain.from_iterable(maps))
        return {name: [m.get(name, 0) for m in maps] for name in names}

    def __getitem__(self, name: str) -> int:
        return self._items.get(name, 0)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    # The views of the inner dict: the `Mapping` mixins go through `__getitem__` once per
    # name, and the fit check walks these for thousands of nodes every cycle.
    def items(self) -> ItemsView[str, int]:
        return self._items.items()

    def keys(self) -> KeysView[str]:
        return self._items.keys()

    def values(self) -> ValuesView[int]:
        return self._items.values()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._items.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if type(other) is Resources:
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == {k: v for k, v in other.items() if v != 0}
        return NotImplemented

    def __repr__(self) -> str:
        return f"Resources({self.describe()})"

    def __add__(self, other: Mapping[str, int]) -> Resources:
        merged = dict(self._items)
        for name, value in other.items():
            merged[name] = merged.get(name, 0) + value
        return Resources(merged)

    def __sub__(self, other: Mapping[str, int]) -> Resources:
        merged = dict(self._items)
        for name, value in other.items():
            merged[name] = merged.get(name, 0) - value
        return Resources(merged)

    def scale(self, factor: int) -> Resources:
        return Resources({k: v * factor for k, v in self._items.items()})

    def max(self, other: Mapping[str, int]) -> Resources:
        """Per-resource maximum (how init containers combine with the main containers)."""
        names = set(self._items) | set(other)
        return Resources({n: max(self[n], other.get(n, 0)) for n in names})

    def fits_in(self, available: Mapping[str, int]) -> bool:
        """True when every requested resource is within `available` (absent = zero)."""
        return all(value <= available.get(name, 0) for name, value in self._items.items())

    def shortfall(self, available: Mapping[str, int]) -> Resources:
        """What is missing from `available` to hold this request (only positive parts)."""
        return Resources(
            {n: v - available.get(n, 0) for n, v in self._items.items() if v > available.get(n, 0)}
        )

    def describe(self) -> str:
        """People-readable form, e.g. "cpu 3, memory 16Gi, nvidia.com/gpu 1"."""
        return ", ".join(f"{n} {format_milli(v, n)}" for n, v in sorted(self._items.items()))

    def to_kube(self) -> dict[str, str]:
        """Kubernetes quantity strings, e.g. {"cpu": "500m", "memory": "16Gi"}."""
        return {n: format_milli(v, n) for n, v in sorted(self._items.items())}


EMPTY = Resources()
