"""Pure helpers for `fakekube.FakeKube`: label and field selectors, JSON merge patch (RFC 7386),
the kinds served from the start, the comparisons the API server makes on update, deep copies
through JSON, and injected faults. No I/O."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dispatcher.kube.errors import BadRequest, KubeError
from dispatcher.kube.jsoncodec import encode

Obj = dict[str, Any]
Selector = Callable[[Obj], bool]


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One served kind. `custom`: a CustomResourceDefinition's kind (list items keep kind and
    apiVersion; a PUT must carry a resourceVersion). `generation`: the server keeps
    metadata.generation for it. `status`: it has a status subresource."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool
    status: bool = False
    generation: bool = False
    custom: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.api_version, self.kind)

    def scope(self, namespace: str | None) -> str:
        """The namespace its objects are kept under ("" for a cluster-scoped kind)."""
        return (namespace or "") if self.namespaced else ""


BUILTIN_KINDS = (
    KindSpec("v1", "Pod", "pods", True, status=True),
    KindSpec("v1", "Service", "services", True, status=True),
    KindSpec("v1", "ConfigMap", "configmaps", True),
    KindSpec("v1", "Secret", "secrets", True),
    KindSpec("v1", "Namespace", "namespaces", False, status=True),
    KindSpec("v1", "Node", "nodes", False, status=True),
    KindSpec("v1", "Event", "events", True),
    KindSpec("coordination.k8s.io/v1", "Lease", "leases", True),
    KindSpec("scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", False),
    KindSpec("apps/v1", "Deployment", "deployments", True, status=True, generation=True),
    KindSpec("apps/v1", "StatefulSet", "statefulsets", True, status=True, generation=True),
    KindSpec("apps/v1", "ReplicaSet", "replicasets", True, status=True, generation=True),
    KindSpec("batch/v1", "Job", "jobs", True, status=True, generation=True),
    KindSpec("workload.codeflare.dev/v1beta1", "AppWrapper", "appwrappers", True, True, True, True),
    KindSpec("ray.io/v1", "RayCluster", "rayclusters", True, True, True, True),
    KindSpec("ray.io/v1", "RayJob", "rayjobs", True, True, True, True),
)

_TERM = re.compile(
    r"^\s*(?:(?P<neg>!)\s*(?P<absent>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?)\s*$"
)


def _split_terms(text: str) -> list[str]:
    """Comma-separated terms; commas inside `in (a,b)` do not separate."""
    terms, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    return [t for t in [*terms, current] if t.strip()]


def _holds(op: str, key: str, values: frozenset[str], labels: Mapping[str, str]) -> bool:
    if op == "in":
        return labels.get(key) in values
    if op == "notin":  # also true without the label
        return labels.get(key) not in values
    return (key in labels) == (op == "exists")


def label_selector(text: str) -> Selector:
    """`k=v`, `k==v`, `k!=v` (also true without the label), `k`, `!k`, `k in (..)`, `k notin
    (..)`, all of them required. A malformed one is a BadRequest, as on the real server."""
    terms: list[tuple[str, str, frozenset[str]]] = []
    for term in _split_terms(text):
        match = _TERM.match(term)
        if not match:
            raise BadRequest(f"unable to parse requirement: {term!r}", status=400)
        if match["neg"]:
            terms.append(("absent", match["absent"], frozenset()))
        elif match["op"]:
            terms.append(
                (
                    "notin" if match["op"] == "!=" else "in",
                    match["key"],
                    frozenset([match["value"]]),
                )
            )
        elif match["setop"]:
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            terms.append((match["setop"], match["key"], values))
        else:
            terms.append(("exists", match["key"], frozenset()))

    def selected(obj: Obj) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(_holds(op, key, values, labels) for op, key, values in terms)

    return selected


def field_selector(text: str) -> Selector:
    """Only what API servers support for every kind: metadata.name and metadata.namespace,
    with `=`, `==` or `!=`."""
    terms: list[tuple[str, bool, str]] = []
    for term in _split_terms(text):
        match = re.match(r"^\s*metadata\.(name|namespace)\s*(==|!=|=)\s*([\w.-]*)\s*$", term)
        if not match:
            raise BadRequest(f"field label not supported: {term!r}", status=400)
        terms.append((match[1], match[2] != "!=", match[3]))

    def selected(obj: Obj) -> bool:
        meta = obj.get("metadata", {})
        return all((meta.get(f, "") == value) == equal for f, equal, value in terms)

    return selected


def selector_of(query: Mapping[str, str] | None) -> Selector:
    """The object test a list or watch query asks for."""
    labels = label_selector((query or {}).get("labelSelector", ""))
    fields = field_selector((query or {}).get("fieldSelector", ""))
    return lambda obj: labels(obj) and fields(obj)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def without(obj: Obj, *fields: str) -> Obj:
    """`obj` minus some top-level fields (a shallow copy), for comparisons."""
    return {k: v for k, v in obj.items() if k not in fields}


def same_content(old: Obj, new: Obj) -> bool:
    """No-op update: equal once resourceVersion and managedFields are set aside."""
    volatile = ("resourceVersion", "managedFields")
    return without(old, "metadata") == without(new, "metadata") and without(
        old.get("metadata", {}), *volatile
    ) == without(new.get("metadata", {}), *volatile)


@dataclass
class Change:
    """One stored change, kept for watches: `old` is None for ADDED; for DELETED, `new` is
    the last state at the deletion's version."""

    version: int
    key: tuple[str, str]
    type: str
    old: Obj | None
    new: Obj


def timestamp() -> str:
    return datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def managed_by(manager: str, api_version: str) -> dict[str, Any]:
    """One managedFields entry, as the API server records a write by `manager`."""
    return {
        "manager": manager,
        "operation": "Update",
        "apiVersion": api_version,
        "time": timestamp(),
    }


def keep_server_fields(
    old_meta: dict[str, Any], meta: dict[str, Any], manager: str | None, api_version: str
) -> None:
    """An update's metadata as the API server keeps it: what only the server sets is taken
    from the stored object whatever the client sent, and a new manager (a patcher) gets its
    entry. Field-level ownership is not modelled: earlier managers keep theirs."""
    for server_field in ("uid", "creationTimestamp", "deletionTimestamp", "generation"):
        meta.pop(server_field, None)
        if server_field in old_meta:
            meta[server_field] = old_meta[server_field]
    meta["resourceVersion"] = old_meta["resourceVersion"]
    managers = list(old_meta.get("managedFields") or [])
    if manager and manager not in [entry.get("manager") for entry in managers]:
        managers.append(managed_by(manager, api_version))
    meta.pop("managedFields", None)
    if managers or "managedFields" in old_meta:
        meta["managedFields"] = managers


def bookmark(spec: KindSpec, version: str) -> Obj:
    return {
        "kind": spec.kind,
        "apiVersion": spec.api_version,
        "metadata": {"resourceVersion": version},
    }


def event_for(change: Change, selected: Selector) -> str | None:
    """What a selective watch shows: an object entering or leaving the selection is ADDED or
    DELETED, as the real watch cache reports it."""
    before = change.old is not None and selected(change.old)
    if change.type == "DELETED":
        return "DELETED" if before else None
    after = selected(change.new)
    if before and after:
        return "MODIFIED"
    return "ADDED" if after else "DELETED" if before else None


def copy_json(value: Obj) -> Obj:
    """A deep copy through JSON, as the real server's objects are: templates nested hundreds
    of levels deep must not exhaust the interpreter's stack here (copy.deepcopy takes
    several frames per level)."""
    copied: Obj = json.loads(json.dumps(value))
    return copied


@dataclass
class Fault:
    """An injected failure: the next `times` requests of `method` matching `kind` and `name`."""

    method: str
    kind: str | None
    name: str | None
    error: KubeError
    times: int


def take_fault(
    faults: list[Fault], method: str, kind: str | None, name: str | None
) -> KubeError | None:
    """The error the first matching fault injects (used up one time), or None."""
    for fault in faults:
        if (
            fault.times > 0
            and fault.method == method
            and fault.kind in (None, kind)
            and fault.name in (None, name)
        ):
            fault.times -= 1
            return copy.copy(fault.error)
    return None


CLIENT_MANAGER = "fakekube-client"
"""The manager recorded for a write without a fieldManager. The API server takes the product
name of the client's User-Agent (the dispatcher's: appwrapper-dispatcher); here every client
counts as one other than the dispatcher, so objects planted in tests are not its own."""


def sent_as_client(
    event: dict[str, Any], decode_line: Callable[[bytes], Any] | None
) -> dict[str, Any]:
    """A watch event as the client hands it on: through its line's decoder, if given."""
    if decode_line is None:
        return event
    decoded: dict[str, Any] = decode_line(encode(event) + b"\n")
    return decoded


def object_in(spec: KindSpec, body: Any, namespace: str | None, name: str | None) -> Obj:
    """A copy of a request's object, checked against the URL it was sent to."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object", status=400)
    obj = copy_json(body)
    if (
        obj.get("kind", spec.kind) != spec.kind
        or obj.get("apiVersion", spec.api_version) != spec.api_version
    ):
        raise BadRequest(f"the body is not a {spec.api_version} {spec.kind}", status=400)
    obj["kind"], obj["apiVersion"] = spec.kind, spec.api_version
    meta = obj.setdefault("metadata", {})
    if spec.namespaced:
        if meta.get("namespace", namespace) != namespace:
            raise BadRequest("the namespace of the object does not match the URL", status=400)
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    if name is not None and meta.get("name", name) != name:
        raise BadRequest("the name of the object does not match the URL", status=400)
    if name is not None:
        meta["name"] = name
    return obj
