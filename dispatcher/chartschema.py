"""The Helm chart's values schema (charts/appwrapper-dispatcher/values.schema.json), generated
from the settings model so that `helm install` refuses a setting the dispatcher would refuse
at start (an unknown key, a wrong type, a value out of range).

    python -m dispatcher.chartschema            # write the file
    python -m dispatcher.chartschema --check    # exit 1 if the file is not up to date

`config` is `Config.model_json_schema()` (its models under `$defs`), each property described
by the docstring under its field in dispatcher/config.py; the chart's own values (image,
replicas, switches) are described here. Side effects: `main` reads and writes that one file.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import json
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from dispatcher.config import Config

SCHEMA_FILE = (
    Path(__file__).resolve().parents[1] / "charts/appwrapper-dispatcher/values.schema.json"
)
"""In the checkout this module runs from (`make venv` installs it in place)."""

_STRING = {"type": "string"}
_STRINGS = {"type": "array", "items": _STRING}
_STRING_MAP = {"type": "object", "additionalProperties": _STRING}
_OBJECT = {"type": "object"}


def _closed(description: str, **properties: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "additionalProperties": False,
        "properties": properties,
    }


def _described(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "description": description}


WRAPPED_KIND = _closed(
    "Where a wrapped kind lives, for the dispatcher's ClusterRole.",
    apiGroups=_described('The API groups that serve it ("" is the core group).', _STRINGS),
    resources=_described("Its resource names (plural).", _STRINGS),
    watch={
        "type": "boolean",
        "description": "Ignored (kept so older values still install): every wrapped kind is "
        "listed and watched, label-selected, to learn its completion and deletion.",
    },
)
WRAPPED_KIND["required"] = ["apiGroups", "resources"]

_SERVICE_ACCOUNT = _closed("A ServiceAccount.", name=_STRING, namespace=_STRING)
_SERVICE_ACCOUNT["required"] = ["name", "namespace"]

CHART_VALUES: dict[str, Any] = {
    "image": _closed(
        "The dispatcher's image (the repository's Dockerfile).",
        repository=_STRING,
        tag=_described("Empty: the chart's appVersion.", _STRING),
        digest=_described("sha256:...; set, it wins over the tag.", _STRING),
        pullPolicy={"enum": ["Always", "IfNotPresent", "Never"]},
    ),
    "imagePullSecrets": {"type": "array", "items": _OBJECT},
    "replicas": {
        "type": "integer",
        "minimum": 0,
        "description": "More than one needs config.leader_election (on by default).",
    },
    "nameOverride": _STRING,
    "fullnameOverride": _STRING,
    "serviceAccount": _closed(
        "The dispatcher's ServiceAccount.",
        create=_described("false: none made; serviceAccount.name is bound.", {"type": "boolean"}),
        name=_described("Empty: the full name.", _STRING),
        annotations=_STRING_MAP,
    ),
    "podSecurityContext": _described(
        "The pods' securityContext (default: no fixed user, for OpenShift).", _OBJECT
    ),
    "securityContext": _described("The dispatcher container's securityContext.", _OBJECT),
    "livenessProbe": _described("Empty: none. HTTPS added with metrics.secure.", _OBJECT),
    "readinessProbe": _described("Empty: none. HTTPS added with metrics.secure.", _OBJECT),
    "startupProbe": _described("Empty: none. HTTPS added with metrics.secure.", _OBJECT),
    "strategy": _described("The Deployment's update strategy (empty: Kubernetes').", _OBJECT),
    "resources": _described("The dispatcher container's requests and limits.", _OBJECT),
    "podAnnotations": _STRING_MAP,
    "podLabels": _STRING_MAP,
    "nodeSelector": _STRING_MAP,
    "tolerations": {"type": "array", "items": _OBJECT},
    "topologySpreadConstraints": {"type": "array", "items": _OBJECT},
    "affinity": _described("Empty: replicas spread over nodes when possible.", _OBJECT),
    "priorityClassName": _STRING,
    "extraEnv": _described(
        "More environment variables for the dispatcher container.",
        {"type": "array", "items": _OBJECT},
    ),
    "extraArgs": _described("More arguments for the dispatcher (after the chart's).", _STRINGS),
    "extraVolumes": _described(
        "More pod volumes (a client CA, members' kubeconfigs).", {"type": "array", "items": _OBJECT}
    ),
    "extraVolumeMounts": _described(
        "More mounts for the dispatcher container.", {"type": "array", "items": _OBJECT}
    ),
    "podDisruptionBudget": _closed(
        "Keeps replicas through node drains (they serve the webhook).",
        enabled={"type": "boolean"},
        minAvailable={"type": ["integer", "string"]},
    ),
    "config": {
        "$ref": "#/$defs/Config",
        "description": "The dispatcher's settings (dispatcher/config.py), its settings file.",
    },
    "rbac": _closed(
        "The dispatcher's ClusterRole.",
        wrappedKinds={
            "type": "object",
            "description": "Kind -> where it lives, for each kind of config.allowed_kinds.",
            "additionalProperties": WRAPPED_KIND,
        },
    ),
    "quotas": _closed(
        "The quota kinds: their CRDs and everyone's rights on them.",
        enabled={"type": "boolean"},
    ),
    "visibility": _closed(
        "Who may ask the visibility API (config.visibility.enabled turns it on).",
        readers=_described("Groups bound to its reader ClusterRole.", _STRINGS),
    ),
    "certManager": _closed(
        "The webhook's certificate from cert-manager instead of the dispatcher's own.",
        enabled={"type": "boolean"},
        issuerRef=_described("Empty: the chart's self-signed Issuer.", _OBJECT),
    ),
    "metrics": _closed(
        "The metrics Service (config.health_port).",
        secure=_described(
            "HTTPS, and scrapers' tokens and rights reviewed (config.metrics set by the chart).",
            {"type": "boolean"},
        ),
        readerServiceAccounts=_described(
            "ServiceAccounts bound to the metrics-reader ClusterRole.",
            {"type": "array", "items": _SERVICE_ACCOUNT},
        ),
        serviceMonitor=_closed(
            "A Prometheus Operator ServiceMonitor for it.",
            enabled={"type": "boolean"},
            interval=_STRING,
            labels=_STRING_MAP,
            tlsConfig=_described("Set: replaces the chart's certificate check.", _OBJECT),
        ),
        podMonitor=_closed(
            "A Prometheus Operator PodMonitor for the pods' health ports.",
            enabled={"type": "boolean"},
            interval=_STRING,
            labels=_STRING_MAP,
            bearerTokenSecret=_described(
                "{name, key} of a Secret holding a scraper's token (needed with secure).",
                _OBJECT,
            ),
            tlsConfig=_described("Set: replaces the chart's certificate check.", _OBJECT),
        ),
        prometheusRule=_closed(
            "A PrometheusRule with the alerts docs/operations.md recommends.",
            enabled={"type": "boolean"},
            labels=_STRING_MAP,
            inadmissibleWindow=_described("Inadmissible more than this long ago.", _STRING),
            severity=_STRING,
            **{"for": _described("How long before it fires.", _STRING)},
        ),
    ),
    "grafanaDashboard": _closed(
        "manifests/grafana's dashboard in a ConfigMap for Grafana's sidecar.",
        enabled={"type": "boolean"},
        namespace=_described("Empty: the release's.", _STRING),
        labels=_described("The label the sidecar watches.", _STRING_MAP),
        annotations=_STRING_MAP,
    ),
    "networkPolicy": _closed(
        "Ingress to the webhook port from the API server's addresses only.",
        enabled={"type": "boolean"},
        apiServerCIDRs=_described("Needed when enabled.", _STRINGS),
    ),
    "statusPolicy": _closed(
        "AppWrapper status written by the dispatcher alone (ValidatingAdmissionPolicy).",
        enabled={"type": "boolean"},
        extraWriters=_described("More usernames that may write it.", _STRINGS),
    ),
    "userRoles": _closed(
        "The roles for people: <prefix>-user, -admin and -viewer.",
        enabled={"type": "boolean"},
    ),
}


def _models(model: type[BaseModel]) -> Iterator[type[BaseModel]]:
    """`model` and every model its fields hold, at any depth (lists, dicts, unions)."""
    seen: set[type[BaseModel]] = set()
    todo: list[Any] = [model]
    while todo:
        annotation = todo.pop()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation in seen:
                continue
            seen.add(annotation)
            yield annotation
            todo.extend(field.annotation for field in annotation.model_fields.values())
        elif isinstance(annotation, types.UnionType) or typing.get_origin(annotation):
            todo.extend(typing.get_args(annotation))


def field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the string literal right under its declaration in the class body (how
    dispatcher/config.py documents each setting), joined into one paragraph."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def _describe(schema: dict[str, Any], model: type[BaseModel]) -> None:
    properties = schema.get("properties", {})
    for name, text in field_docstrings(model).items():
        if name in properties:
            properties[name]["description"] = text


def config_schema() -> dict[str, Any]:
    """`Config.model_json_schema()` with each field's docstring as its description; its
    models under `$defs`, `Config` among them."""
    schema = Config.model_json_schema()
    defs: dict[str, Any] = schema.pop("$defs", {})
    by_name = {model.__name__: model for model in _models(Config)}
    for name, definition in defs.items():
        if name in by_name:
            _describe(definition, by_name[name])
    _describe(schema, Config)
    schema["description"] = "The dispatcher's settings file (dispatcher/config.py)."
    return {**defs, "Config": schema}


def values_schema() -> dict[str, Any]:
    """The whole values.schema.json."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Values of the appwrapper-dispatcher chart",
        "description": (
            "Generated by `python -m dispatcher.chartschema` from dispatcher/config.py: "
            "do not edit."
        ),
        "type": "object",
        "additionalProperties": False,
        "properties": CHART_VALUES,
        "$defs": config_schema(),
    }


def render() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatcher.chartschema")
    parser.add_argument("--out", type=Path, default=SCHEMA_FILE)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python -m dispatcher.chartschema")
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
