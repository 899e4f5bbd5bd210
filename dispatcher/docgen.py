"""The settings and flags tables of docs/operations.md, generated from the code so that the
reference cannot drift from what the dispatcher reads.

    python -m dispatcher.docgen            # rewrite the tables in the docs
    python -m dispatcher.docgen --check    # exit 1 if a table is not up to date

A table stands between marker comments (`<!-- settings:begin -->` ... `<!-- settings:end -->`,
the same for `flags`). The settings table holds every field of `Config` at any depth (lists
and maps of models as `members[].name`, `provisioning.checks.*.retry_limit`): its type with
the field's bounds, its default, and the docstring under it in dispatcher/config.py (read as
chartschema.py reads it for the chart's schema). The flags table holds every option of
`appwrapper-dispatcher run` (dispatcher/cli.py) with the setting it sets. Side effects: `main`
reads and writes the files named in DOCS.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dispatcher import cli
from dispatcher.chartschema import field_docstrings
from dispatcher.config import Config

REPO = Path(__file__).resolve().parents[1]
"""The checkout this module runs from (`make venv` installs it in place)."""
DOCS = ("docs/operations.md",)
"""The files (relative to REPO) whose marked tables are generated."""
COMMAND = "python -m dispatcher.docgen"

FLAG_SETTINGS: dict[str, str | None] = {
    "config": None,
    "dev": None,
    "webhook_cert_dir": "webhook.cert_dir",
    "visibility": "visibility.enabled",
}
"""Options of `run` whose destination is not a top-level setting of the same name (cli.main
reads these apart): the setting each sets, or None for none."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of the settings table."""

    path: str
    """`webhook.port`, `members[].name`, `provisioning.checks.*.retry_limit`."""
    kind: str
    default: str
    meaning: str
    value: Any
    """The default as JSON data (Ellipsis: required), for tests that compare the docs."""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _optional_inner(annotation: Any) -> Any:
    """`X` of `X | None`; else `annotation` itself."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _type(annotation: Any) -> str:
    annotation = _optional_inner(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "integer"
    if annotation is float:
        return "number"
    if annotation is str:
        return "string"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if _model_in(annotation) is not None:
        return "mapping"
    if origin is list:
        return f"list of {_plural(args[0])}"
    if origin is dict:
        return f"map of string to {_type(args[1])}"
    return str(annotation)


def _plural(annotation: Any) -> str:
    word = _type(annotation)
    return {"string": "strings", "mapping": "mappings", "integer": "integers"}.get(word, word)


def _bounds(field: FieldInfo) -> str:
    found = []
    for item in field.metadata:
        if isinstance(item, Ge):
            found.append(f"≥ {_number(float(str(item.ge)))}")
        elif isinstance(item, Gt):
            found.append(f"> {_number(float(str(item.gt)))}")
        elif isinstance(item, Le):
            found.append(f"≤ {_number(float(str(item.le)))}")
        elif isinstance(item, Lt):
            found.append(f"< {_number(float(str(item.lt)))}")
        elif isinstance(item, MaxLen):
            found.append(f"at most {item.max_length} long")
        elif isinstance(item, MinLen):
            found.append(f"at least {item.min_length} long")
        elif getattr(item, "pattern", None):
            found.append(f"matching `{item.pattern}`")
    return ", ".join(found)


def default_value(field: FieldInfo) -> Any:
    """The field's default as JSON data (what a settings file would say); Ellipsis when it
    has none (required)."""
    if field.is_required():
        return ...
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list):
        return [v.model_dump(mode="json") if isinstance(v, BaseModel) else v for v in value]
    if isinstance(value, dict):
        return json.loads(
            json.dumps(
                value,
                default=lambda v: v.model_dump(mode="json") if isinstance(v, BaseModel) else v,
            )
        )
    return value


def _default(field: FieldInfo) -> str:
    value = default_value(field)
    if value is ...:
        return "required"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"`{_number(value)}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{json.dumps(value, separators=(', ', ': '))}`"


def settings(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[Setting]:
    """Every field of `model` at any depth, in declaration order, a section's fields right
    after its own row."""
    docs = field_docstrings(model)
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        annotation = _optional_inner(field.annotation)
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        inner = _model_in(annotation)
        below = ""
        if inner is not None:
            below = f"{path}."
        elif origin is list and _model_in(args[0]) is not None:
            inner, below = _model_in(args[0]), f"{path}[]."
        elif origin is dict and _model_in(args[1]) is not None:
            inner, below = _model_in(args[1]), f"{path}.*."
        elif origin is dict and typing.get_origin(args[1]) is list:
            listed = _model_in(typing.get_args(args[1])[0])
            if listed is not None:
                inner, below = listed, f"{path}.*[]."
        meaning = docs.get(name, "")
        if not meaning and inner is not None:
            meaning = " ".join((inner.__doc__ or "").split())
        kind = _type(field.annotation)
        bounds = _bounds(field)
        yield Setting(
            path=path,
            kind=f"{kind}, {bounds}" if bounds else kind,
            default="" if _model_in(annotation) else _default(field),
            meaning=meaning,
            value=default_value(field),
        )
        if inner is not None:
            yield from settings(inner, below)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_table() -> str:
    lines = [
        f"<!-- Generated by `{COMMAND}` from dispatcher/config.py (its docstrings): edit there."
        " -->",
        "",
        "| Setting | Type | Default | Meaning |",
        "|---|---|---|---|",
    ]
    for s in settings():
        lines.append(f"| `{s.path}` | {_cell(s.kind)} | {_cell(s.default)} | {_cell(s.meaning)} |")
    return "\n".join(lines)


def run_options() -> list[argparse.Action]:
    """The options of `appwrapper-dispatcher run`, in the order --help lists them."""
    root = cli.parser()
    commands = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    run = commands.choices["run"]
    return [a for a in run._actions if a.option_strings and a.dest != "help"]


def flag_setting(action: argparse.Action) -> str | None:
    """The setting `action` sets, as the table shows it; None for none. KeyError for an
    option that is neither a top-level setting nor in FLAG_SETTINGS."""
    if action.dest in FLAG_SETTINGS:
        return FLAG_SETTINGS[action.dest]
    if action.dest not in Config.model_fields:
        raise KeyError(f"{action.option_strings[0]}: no setting {action.dest}; see FLAG_SETTINGS")
    return action.dest


def _invocation(action: argparse.Action) -> str:
    flag = action.option_strings[-1]
    if action.nargs == 0:
        return flag
    if action.choices:
        return f"{flag} {{{','.join(str(c) for c in action.choices)}}}"
    return f"{flag} {action.metavar or action.dest.upper()}"


def flags_table() -> str:
    lines = [
        f"<!-- Generated by `{COMMAND}` from dispatcher/cli.py: edit there. -->",
        "",
        "| Flag | Setting | Meaning |",
        "|---|---|---|",
    ]
    meanings = {s.path: s.meaning for s in settings()}
    for action in run_options():
        setting = flag_setting(action)
        if setting is not None and action.nargs == 0 and action.const is not None:
            shown = f"`{setting}: {json.dumps(action.const)}`"
        else:
            shown = f"`{setting}`" if setting else ""
        meaning = action.help or meanings.get(setting or "", "")
        lines.append(f"| `{_invocation(action)}` | {shown} | {_cell(meaning)} |")
    return "\n".join(lines)


TABLES = {"settings": settings_table, "flags": flags_table}


def rewritten(text: str) -> str:
    """`text` with each marked table (TABLES) replaced by what the code says now."""
    for name, render in TABLES.items():
        begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
        start = text.find(begin)
        stop = text.find(end, start)
        if start >= 0 and stop >= 0:
            text = f"{text[:start]}{begin}\n{render()}\n{text[stop:]}"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND)
    parser.add_argument("--check", action="store_true", help="exit 1 if a table differs")
    args = parser.parse_args(argv)
    stale = []
    for doc in DOCS:
        path = REPO / doc
        text = path.read_text()
        new = rewritten(text)
        if new != text:
            stale.append(doc)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"{', '.join(stale)} out of date: run {COMMAND}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
