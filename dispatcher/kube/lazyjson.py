"""Watch events decoded only as far as a cache reads them. No I/O.

A pod watch event is about 8 KB of JSON (managed fields, environment, probes, volumes,
container statuses), of which the pod cache keeps a few hundred bytes. orjson builds a Python
object for every value of it; simdjson (pysimdjson) parses the text into its own compact form
in a fraction of that time, and a cache's `LazyTransform` then reads the fields it keeps
through proxies, so only those become Python objects.

A proxy points into the parser's buffer and lives only until `LazyEvents` returns: whatever is
kept must be copied out (`plain`). Reading a key that is absent costs an exception inside the
proxy (microseconds), so a transform looks absent keys up in `fields(obj)` instead.

simdjson finds the first of two equal keys in one object where orjson and the json module keep
the last; the API server writes every object from Go structs and maps, which never repeat a
key. Anything else this path cannot read (a BOOKMARK or ERROR event, text simdjson refuses, a
shape the transform does not expect: it returns None) is decoded whole as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import simdjson

Obj = dict[str, Any]
LazyObject = simdjson.Object
LazyArray = simdjson.Array
LazyTransform = Callable[[LazyObject], Obj | None]
"""A cache's transform over a lazily decoded object: the same result as its transform over
the whole decoded object, or None where it cannot tell (the caller decodes it whole)."""

CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


def plain(value: Any) -> Any:
    """A value read through a proxy as ordinary Python objects (a copy that outlives the
    parser)."""
    if isinstance(value, LazyObject):
        return value.as_dict()
    if isinstance(value, LazyArray):
        return value.as_list()
    return value


def fields(obj: LazyObject) -> set[str]:
    """The keys of `obj`: look absent keys up here rather than with `get`."""
    return set(obj)


class LazyEvents:
    """Reads watch event lines with one parser, reused line after line (its buffers are
    allocated once). Not for use from two threads."""

    def __init__(self, transform: LazyTransform) -> None:
        self._transform = transform
        self._parser = simdjson.Parser()

    def __call__(self, line: bytes) -> tuple[str, Obj] | None:
        """(event type, transformed object) of a change event, or None: decode it whole."""
        try:
            return self._read(line)
        except RuntimeError:
            # A proxy of an earlier event still alive (held by a traceback, say) stops the
            # parser from being reused: a new one reads this line.
            self._parser = simdjson.Parser()
        except Exception:  # text or a shape this path does not take: the whole decode will
            return None
        try:
            return self._read(line)
        except Exception:
            return None

    def _read(self, line: bytes) -> tuple[str, Obj] | None:
        document = self._parser.parse(line)
        if not isinstance(document, LazyObject) or fields(document) != {"type", "object"}:
            return None
        kind = document["type"]
        obj = document["object"]
        if kind not in CHANGES or not isinstance(obj, LazyObject):
            return None
        slim = self._transform(obj)
        if slim is None:
            return None
        return str(kind), slim


__all__ = ["LazyArray", "LazyEvents", "LazyObject", "LazyTransform", "fields", "plain"]
