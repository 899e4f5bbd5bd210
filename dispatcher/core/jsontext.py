"""JSON text at any depth the API server stores: read and written with an explicit stack
where the json module would recurse. Pure, no I/O.

Why our own: a user's object may be nested up to the API server's own limit (10,000 levels);
orjson refuses past 1,024 (reading) and 255 (writing), and the json module past its recursion
limit (about 1,000). An answer that failed on one such object would fail the list, watch or
conversion that carries it, for every reader. Raising the process's recursion limit for a
moment is not safe: it is shared by every thread, and the interpreter's compiler checks it did
not change under it (a SystemError in whichever thread was compiling).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

DEEP_DECODE_LIMIT = 11_000
"""Nesting the deep reader accepts: the API server stores objects nested up to 10,000 levels."""

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<open>[\[{]) | (?P<close>[\]}]) | (?P<sep>[:,])
      | (?P<string>"(?:[^"\\\x00-\x1f]|\\.)*")
      | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
      | (?P<word>true|false|null)
    )""",
    re.VERBOSE,
)
_WORDS: dict[str, Any] = {"true": True, "false": False, "null": None}


class _Open:
    """A list or object being read: what may come next, and for an object the key whose
    value comes next."""

    __slots__ = ("container", "key", "next")

    def __init__(self, container: list[Any] | dict[str, Any]) -> None:
        self.container = container
        self.key = ""
        self.next = "key_or_close" if isinstance(container, dict) else "value_or_close"


def decode_deep(text: str) -> Any:
    """JSON read with an explicit stack instead of recursion: any nesting up to
    DEEP_DECODE_LIMIT. Strings and numbers are read by the json module (they do not nest).
    ValueError when the text is not one JSON value."""
    stack: list[_Open] = []
    done: list[Any] = []
    pos, end = 0, len(text.rstrip())
    while pos < end:
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ValueError(f"unexpected character at {pos}")
        pos = match.end()
        kind, token = match.lastgroup or "", match.group(match.lastgroup or 0)
        top = stack[-1] if stack else None
        if top is None:
            if done or kind in ("close", "sep"):
                raise ValueError(f"unexpected {token!r} at {pos}")
        elif kind == "close":
            if top.next not in ("key_or_close", "value_or_close", "comma_or_close") or (
                token == "}"
            ) != isinstance(top.container, dict):
                raise ValueError(f"unexpected {token!r} at {pos}")
            stack.pop()
            if stack:
                stack[-1].next = "comma_or_close"
            else:
                done.append(top.container)
            continue
        elif kind == "sep":
            if token == ":" and top.next == "colon":
                top.next = "value"
            elif token == "," and top.next == "comma_or_close":
                top.next = "key" if isinstance(top.container, dict) else "value"
            else:
                raise ValueError(f"unexpected {token!r} at {pos}")
            continue
        elif top.next in ("key", "key_or_close"):
            if kind != "string":
                raise ValueError(f"an object key must be a string, at {pos}")
            top.key, top.next = json.loads(token), "colon"
            continue
        elif top.next not in ("value", "value_or_close"):
            raise ValueError(f"unexpected {token!r} at {pos}")
        value: Any
        if kind == "open":
            value = {} if token == "{" else []
        elif kind == "word":
            value = _WORDS[token]
        else:
            value = json.loads(token)
        if top is not None:
            if isinstance(top.container, list):
                top.container.append(value)
            else:
                top.container[top.key] = value
            top.next = "comma_or_close"
        if kind == "open":
            if len(stack) >= DEEP_DECODE_LIMIT:
                raise ValueError(f"nested deeper than {DEEP_DECODE_LIMIT} levels")
            stack.append(_Open(value))
        elif top is None:
            done.append(value)
    if stack or len(done) != 1:
        raise ValueError("not one complete JSON value")
    return done[0]


def loads(text: str | bytes) -> Any:
    """One JSON value, however deep: the json module, else `decode_deep`. ValueError when the
    text is not one JSON value (or is nested past DEEP_DECODE_LIMIT)."""
    try:
        return json.loads(text)
    except RecursionError:
        pass
    return decode_deep(text.decode() if isinstance(text, bytes) else text)


def dumps(value: Any, *, sort_keys: bool = False) -> str:
    """`value` as compact JSON, however deep: the json module, else `encode_deep`."""
    try:
        return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"))
    except RecursionError:
        return encode_deep(value, sort_keys=sort_keys)


class _Frame:
    """A list or object being written: its members still to write."""

    __slots__ = ("close", "first", "keyed", "members")

    def __init__(self, members: Iterator[Any], close: str, *, keyed: bool) -> None:
        self.members = members
        self.close = close
        self.keyed = keyed
        self.first = True


def encode_deep(value: Any, *, sort_keys: bool = False) -> str:
    """Compact JSON written with an explicit stack instead of recursion (what the json module
    writes, at any depth). Scalars are written by the json module; TypeError for a value JSON
    cannot hold."""
    parts: list[str] = []
    stack: list[_Frame] = []

    def start(item: Any) -> None:
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    raise TypeError(f"an object key must be a string, not {type(key).__name__}")
            members = iter(sorted(item.items()) if sort_keys else item.items())
            parts.append("{")
            stack.append(_Frame(members, "}", keyed=True))
        elif isinstance(item, list | tuple):
            parts.append("[")
            stack.append(_Frame(iter(item), "]", keyed=False))
        else:
            parts.append(json.dumps(item))

    start(value)
    while stack:
        frame = stack[-1]
        member: Any = next(frame.members, _END)
        if member is _END:
            parts.append(frame.close)
            stack.pop()
            continue
        if not frame.first:
            parts.append(",")
        frame.first = False
        if frame.keyed:
            key, member = member
            parts.append(json.dumps(key))
            parts.append(":")
        start(member)
    return "".join(parts)


_END: Any = object()
