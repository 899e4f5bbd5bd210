"""The settings file read with the place of every value, so that a mistake in it is reported
as `FILE:LINE: field: what is wrong` (the CLI exits 2 with it), never as a parser's traceback.

Side effects: reads the file it is given.

PyYAML's `compose` keeps each node's position; `safe_load` does not. So the file is composed
once, turned into plain values by the same safe constructor, and a pydantic error's `loc`
(the path of keys and indexes to the field) is looked up in the node tree for its line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError


class SettingsError(ValueError):
    """The settings file cannot be used; the message names the file, the line and the field."""


CONFIGMAP_KEY = "config.yaml"
"""The key of the settings file in the ConfigMap the manifests and the chart mount."""


def read(path: Path) -> tuple[dict[str, Any], yaml.Node | None]:
    """The settings in `path` as a mapping, and its node tree (None for an empty file)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"{path}: {exc.strerror or exc}") from None
    return parse(text, str(path))


def parse(text: str, name: str) -> tuple[dict[str, Any], yaml.Node | None]:
    """The settings in `text` (called `name` in messages) and its node tree."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if node is None:
            return {}, None
        value = yaml.SafeLoader(text).construct_document(node)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{name}:{_where(exc)} not YAML: {_problem(exc)}") from None
    if not isinstance(value, dict):
        raise SettingsError(
            f"{name}:{node.start_mark.line + 1}: expected a mapping of settings, "
            f"got {type(value).__name__}"
        )
    return value, node


def unwrapped(path: Path) -> tuple[dict[str, Any], yaml.Node | None, str]:
    """What `read` gives, and the name to report it by; where `path` is the ConfigMap that
    holds the settings file (manifests/config.yaml), the file in it, its lines counted from
    the start of that value."""
    value, node = read(path)
    if value.get("kind") != "ConfigMap":
        return value, node, str(path)
    text = (value.get("data") or {}).get(CONFIGMAP_KEY)
    if not isinstance(text, str):
        raise SettingsError(f"{path}: a ConfigMap without data.{CONFIGMAP_KEY}")
    name = f"{path} (data.{CONFIGMAP_KEY})"
    inner, inner_node = parse(text, name)
    return inner, inner_node, name


def problems(
    path: Path | str | None,
    node: yaml.Node | None,
    error: ValidationError,
    flags: Iterable[str] = (),
) -> str:
    """Every error of `error` as `FILE:LINE: field: message`, one a line (the line of the
    nearest value the field's path reaches: the key itself is absent when it is missing); a
    setting given by a flag (`flags`) is named as the flag."""
    given = set(flags)
    lines = []
    for found in error.errors():
        loc = [part for part in found["loc"] if not isinstance(part, str) or part]
        field = _dotted(loc) or "(top level)"
        if loc and loc[0] in given:
            where = "a flag"
        else:
            line = _line(node, loc)
            where = f"{path}:{line}" if path and line else str(path or "settings")
        lines.append(f"{where}: {field}: {found['msg']}")
    return "\n".join(lines)


def _dotted(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _line(node: yaml.Node | None, loc: Iterable[Any]) -> int | None:
    """1-based line of the value at `loc` in `node`, or of the deepest part of it found."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node, line = child, child.start_mark.line + 1
    return line


def _child(node: yaml.Node, part: Any) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                found: yaml.Node = value
                return found
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        child: yaml.Node = node.value[part]
        return child
    return None


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f"{mark.line + 1}:{mark.column + 1}:" if mark is not None else ""


def _problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    context = getattr(exc, "context", None)
    return " ".join(str(p) for p in (context, problem) if p) or str(exc).splitlines()[0]
