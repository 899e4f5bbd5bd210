"""JSON to and from the API server: orjson for nearly everything, the json module for what
orjson refuses, and an iterative reader for objects nested deeper than the interpreter's
recursion allows.

No I/O. The iterative reader and writer are dispatcher.core.jsontext's (why: its docstring).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from dispatcher.core import jsontext
from dispatcher.core.jsontext import DEEP_DECODE_LIMIT, decode_deep
from dispatcher.kube.errors import Undecodable

__all__ = ["DEEP_DECODE_LIMIT", "decode", "decode_deep", "encode"]


def encode(body: Any) -> bytes:
    """A request body as JSON. orjson (a sixth of the json module's time) takes nearly all;
    what it refuses (an integer past 64 bits, nesting past 255 levels) the json module
    writes, at any depth (`jsontext.dumps`)."""
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return jsontext.dumps(body).encode()


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
