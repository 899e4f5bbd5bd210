"""JSON to and from the API server: orjson for nearly everything, the json module for what
orjson refuses, and an iterative reader for objects nested deeper than the interpreter's
recursion allows.

No I/O. Why an iterative reader of our own: a user's object may be nested up to the API
server's own limit (10,000 levels), and both orjson (1,024) and the json module (the
recursion limit, about 1,000) refuse it; failing the list or watch that carries it would stall
every reader of that resource. Raising the process's recursion limit for a moment is not safe:
the limit is shared by every thread, and the interpreter's compiler checks it did not change
under it (a SystemError in whichever thread was compiling).
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from dispatcher.kube.errors import Undecodable

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


def encode(body: Any) -> bytes:
    """A request body as JSON. orjson (a sixth of the json module's time) takes nearly all;
    what it refuses (an integer past 64 bits) the json module writes."""
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return json.dumps(body).encode()


def decode(data: bytes | str) -> Any:
    """JSON from the server: orjson (decoding every watch event is most of what a watch
    costs), else the json module, which takes what orjson refuses: nesting past 1,024
    levels. (orjson reads an integer past 64 bits as a float, as the API server itself keeps
    one.) An answer nested deeper than the json module's recursion allows is read by
    `decode_deep`, rather than failing the list or watch that carries it."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except RecursionError:
        pass
    try:
        return decode_deep(data.decode() if isinstance(data, bytes) else data)
    except ValueError as exc:
        raise Undecodable(f"an answer could not be decoded: {exc}") from None


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
