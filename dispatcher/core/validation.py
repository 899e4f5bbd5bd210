"""Semantic checks of wrapped objects before anything is created. Pure, no I/O.

The CRD schema rejects malformed YAML at `kubectl apply`; what it cannot see is checked here
(rules 6 and 7): every item is a complete, namespaced object of an allowed kind, in the
AppWrapper's own namespace, with quantities that parse, asking for no DRA devices (not
charged yet: core/resourceclaims.py), and no two items name the same object. Errors are plain
sentences for the AppWrapper's status; an empty list means valid.
Whether the kind exists in the target cluster is the shell's check (it needs discovery).

Templates are user data of any shape (the CRD preserves unknown fields), so every check here
is total: bounded in size and depth before anything walks a template recursively, and strict
about types and Kubernetes' name grammar before any string reaches a URL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from dispatcher.api.names import GENERATE_NAME_PREFIX_MAX
from dispatcher.api.quantity import QuantityError
from dispatcher.core import protection
from dispatcher.core.podsets import infer_pod_sets
from dispatcher.core.resourceclaims import CLAIM_KINDS, claim_problems

__all__ = [
    "DEFAULT_ALLOWED_KINDS",
    "DEFAULT_CLUSTER_SCOPED",
    "DEFAULT_MAX_APPWRAPPER_BYTES",
    "MAX_ITEMS",
    "MAX_MESSAGE_CHARS",
    "MAX_TEMPLATE_BYTES",
    "MAX_TEMPLATE_DEPTH",
    "annotation_problems",
    "appwrapper_size",
    "bounded_message",
    "clip",
    "identity_problems",
    "oversize_message",
    "size_problem",
    "template_shape",
    "validate_appwrapper",
    "validate_item",
]

MAX_ITEMS = 100
"""Wrapped objects per AppWrapper (the CRD's maxItems says the same)."""
MAX_TEMPLATE_DEPTH = 64
"""Nesting of objects and arrays in one template. Real objects stay below 20; copying,
slimming and encoding a deeper one would recurse toward the interpreter's limit."""
MAX_TEMPLATE_BYTES = 256 * 1024
"""Size of one template as JSON (about; strings counted in characters). The CRD cannot bound
it (templates preserve unknown fields, and schema size limits apply to strings, arrays and
maps only), so validation does."""
DEFAULT_MAX_APPWRAPPER_BYTES = 512 * 1024
"""The whole AppWrapper as JSON (setting `max_appwrapper_bytes`). Twice the largest template
(MAX_TEMPLATE_BYTES), twenty times a large real RayCluster or PyTorchJob (10-25 KB with its
Services), a third of etcd's 1.5 MiB per object: the dispatcher holds every AppWrapper in
memory, and a few dozen at etcd's limit would fill the shipped Deployment's 512Mi."""
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
MAX_MESSAGE_CHARS = 4096
"""Longest status or condition message written. Status shares etcd's 1.5 MiB object limit
with the spec, and a message is written twice (status.message and the condition)."""

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_VERSION = re.compile(r"v[0-9]+((alpha|beta)[0-9]+)?")
_KIND = re.compile(r"[A-Z][A-Za-z0-9]*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_LABEL_NAMED_KINDS = frozenset({"Service"})
"""Kinds whose names must be DNS-1035 labels (they become DNS names themselves)."""


def _ascii_match(pattern: re.Pattern[str], text: str) -> bool:
    # The patterns' classes are ASCII already; isascii() refuses other scripts' look-alike
    # letters and digits cheaply, and would still if a pattern ever used \d (which matches
    # any Unicode digit). fullmatch, unlike "$", does not accept a trailing newline.
    return text.isascii() and pattern.fullmatch(text) is not None


def is_label_value(text: str) -> bool:
    """Whether Kubernetes accepts `text` as a label value (at most 63 characters)."""
    return len(text) <= 63 and _ascii_match(_LABEL_VALUE, text)


def _short(value: Any) -> str:
    """A user value quoted for a message, cut so one field cannot fill the status."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _api_version_problem(value: str) -> str | None:
    group, slash, version = value.rpartition("/")
    if not _ascii_match(_VERSION, version) or len(version) > 63:
        return (
            f"apiVersion {_short(value)} is not GROUP/VERSION or VERSION (VERSION like v1, v2beta1)"
        )
    if slash and (not group or len(group) > 253 or not _ascii_match(_DNS1123_SUBDOMAIN, group)):
        return f"apiVersion {_short(value)}: the group is not a DNS-1123 subdomain"
    return None


def _name_problem(kind: str | None, name: str) -> str | None:
    if kind in _LABEL_NAMED_KINDS:
        if len(name) > 63 or not _ascii_match(_DNS1035_LABEL, name):
            return (
                f"metadata.name {_short(name)} is not a DNS-1035 label (lower case letters, "
                "digits and '-', starting with a letter, at most 63 characters)"
            )
        return None
    if len(name) > 253 or not _ascii_match(_DNS1123_SUBDOMAIN, name):
        return (
            f"metadata.name {_short(name)} is not a DNS-1123 subdomain (lower case letters, "
            "digits, '-' and '.', at most 253 characters)"
        )
    return None


def _unnamed_problem(prefix: Any) -> str:
    # A string generateName was made into a name when the AppWrapper was read
    # (api.names.generated_name): a template reaching here unnamed has none usable.
    if prefix is None or prefix == "" or isinstance(prefix, str):
        return "missing metadata.name"
    return f"missing metadata.name, and metadata.generateName {_short(prefix)} is not a string"


def _made_from(name: str, prefix: Any) -> bool:
    """Whether `name` is one `generated_name` made from the prefix `prefix`."""
    if not isinstance(prefix, str) or not prefix:
        return False
    kept = prefix[:GENERATE_NAME_PREFIX_MAX]
    return name.startswith(kept) and len(name) == len(kept) + 5


def identity_problems(template: Mapping[str, Any]) -> list[str]:
    """What is wrong with the parts of a template that reach a URL: apiVersion, kind,
    metadata.name and metadata.namespace, against Kubernetes' grammar. [] when all are well
    formed (the shell relies on this before building a request path from them)."""
    problems: list[str] = []
    api_version = template.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        problems.append("missing apiVersion" if not api_version else "apiVersion is not a string")
    elif (problem := _api_version_problem(api_version)) is not None:
        problems.append(problem)
    kind = template.get("kind")
    if not isinstance(kind, str) or not kind:
        problems.append("missing kind" if not kind else "kind is not a string")
        kind = None
    elif len(kind) > 63 or not _ascii_match(_KIND, kind):
        problems.append(
            f"kind {_short(kind)} is not a Kubernetes kind (a capital letter, then letters and "
            "digits, at most 63 characters)"
        )
    metadata = template.get("metadata")
    if not isinstance(metadata, Mapping):
        problems.append(
            "missing metadata.name" if metadata is None else "metadata is not an object"
        )
        return problems
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        if name is None or name == "":
            problems.append(_unnamed_problem(metadata.get("generateName")))
        else:
            problems.append("metadata.name is not a string")
    elif (problem := _name_problem(kind, name)) is not None:
        prefix = metadata.get("generateName")
        if _made_from(name, prefix):
            # The name was made from generateName (api.names.generated_name): the prefix
            # is what the user wrote, so it is what the message names.
            problem = (
                f"metadata.generateName {_short(prefix)} does not make a valid name "
                f"(made: {_short(name)}): " + problem.split(" is not ", 1)[-1]
            )
        problems.append(problem)
    namespace = metadata.get("namespace")
    if namespace is not None and namespace != "":
        if not isinstance(namespace, str):
            problems.append("metadata.namespace is not a string")
        elif len(namespace) > 63 or not _ascii_match(_DNS1123_LABEL, namespace):
            problems.append(f"metadata.namespace {_short(namespace)} is not a DNS-1123 label")
    return problems


def _string_map_problem(where: str, value: Any) -> str | None:
    if not isinstance(value, Mapping):
        return f"{where} must be an object of strings, not {type(value).__name__}"
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            return f"{where}[{_short(key)}] must be a string, not {type(item).__name__}"
    return None


def _metadata_type_problems(metadata: Mapping[str, Any], where: str) -> list[str]:
    """The metadata fields the dispatcher adds to or copies must have the types Kubernetes
    gives them: building the object to create merges into them."""
    problems: list[str] = []
    for field in ("labels", "annotations"):
        value = metadata.get(field)
        if value is not None and (problem := _string_map_problem(f"{where}.{field}", value)):
            problems.append(problem)
    owners = metadata.get("ownerReferences")
    if owners is not None and (
        not isinstance(owners, list) or not all(isinstance(o, Mapping) for o in owners)
    ):
        problems.append(f"{where}.ownerReferences must be a list of objects")
    finalizers = metadata.get("finalizers")
    if finalizers is not None and (
        not isinstance(finalizers, list) or not all(isinstance(f, str) for f in finalizers)
    ):
        problems.append(f"{where}.finalizers must be a list of strings")
    return problems


def template_shape(value: Any, *, max_depth: int, max_bytes: int) -> tuple[int, int]:
    """(depth, approximate JSON size) of `value`, walked without recursion.

    The walk stops as soon as either bound is passed (the numbers returned then exceed it but
    are not the whole): a hostile template must cost no more than the limits to reject.
    """
    depth = 0
    size = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, Mapping):
            depth = max(depth, level)
            size += 2 + 2 * len(node)
            for key, child in node.items():
                size += len(key) + 3 if isinstance(key, str) else 8
                stack.append((child, level + 1))
        elif isinstance(node, list | tuple):
            depth = max(depth, level)
            size += 2 + len(node)
            stack.extend((child, level + 1) for child in node)
        elif isinstance(node, str):
            size += len(node) + 2
        else:
            size += 8
        if depth > max_depth or size > max_bytes:
            break
    return depth, size


def _json_size(value: Any) -> int:
    """Bytes of `value` as compact JSON; about, for what orjson refuses (nesting past 255
    levels, an integer past 64 bits)."""
    try:
        return len(orjson.dumps(value))
    except (orjson.JSONEncodeError, TypeError):
        return template_shape(value, max_depth=1 << 62, max_bytes=1 << 62)[1]


def appwrapper_size(obj: Mapping[str, Any]) -> int:
    """Bytes of an AppWrapper as JSON, every field the user writes counted (legacy ones too)
    but the copies the API server and kubectl keep beside the user's object
    (`metadata.managedFields`, the last-applied-configuration annotation), which the
    dispatcher drops on arrival, and `status`, which the dispatcher writes: its own writes
    must never carry an AppWrapper the webhook let in past the limit (status messages are
    bounded by MAX_MESSAGE_CHARS)."""
    size = _json_size(obj)
    if "status" in obj:
        size -= _json_size(obj["status"]) + len('"status":,')
    meta = obj.get("metadata")
    if isinstance(meta, Mapping):
        if "managedFields" in meta:
            size -= _json_size(meta["managedFields"]) + len('"managedFields":,')
        annotations = meta.get("annotations")
        if isinstance(annotations, Mapping) and LAST_APPLIED in annotations:
            size -= _json_size(annotations[LAST_APPLIED]) + len(LAST_APPLIED) + len('"":,')
    return max(size, 0)


def _biggest_field(obj: Mapping[str, Any], *, depth: int = 4) -> tuple[str, int]:
    """(path, bytes) of the largest field, followed down from the top `depth` levels:
    `spec.resources.GenericItems[3].generictemplate`. ("", 0) for an empty object."""
    path, size = "", 0
    node: Any = obj
    for _ in range(depth):
        if isinstance(node, Mapping):
            children = [
                (f"{path}.{key}" if path else str(key), child)
                for key, child in node.items()
                if not (path == "metadata" and key == "managedFields")
            ]
        elif isinstance(node, list) and path:
            children = [(f"{path}[{index}]", child) for index, child in enumerate(node)]
        else:
            break
        if not children:
            break
        sized = [(_json_size(child), name, child) for name, child in children]
        size, path, node = max(sized, key=lambda entry: entry[0])
    return path, size


def oversize_message(size: int, limit: int, field: str, field_size: int) -> str:
    """What an AppWrapper above the size limit is told."""
    where = f"; its largest field is {field} ({field_size:,} bytes)" if field else ""
    return (
        f"the AppWrapper is {size:,} bytes as JSON; at most {limit:,} are accepted"
        f" (the dispatcher's max_appwrapper_bytes){where}"
    )


def size_problem(obj: Mapping[str, Any], *, limit: int) -> str:
    """ "" when the AppWrapper (`appwrapper_size`) is at most `limit` bytes, else why not."""
    size = appwrapper_size(obj)
    if size <= limit:
        return ""
    return oversize_message(size, limit, *_biggest_field(obj))


def annotation_problems(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    """What the admission webhook refuses of the annotations the dispatcher reads on the
    AppWrapper itself (its protection from preemption, core/protection.py), set or changed by
    this request (`old`: the stored object, None at create). Only at the webhook: one stored
    all the same is read as no ask, and never fails the AppWrapper."""
    return protection.annotation_problems(_annotations_of(obj), _annotations_of(old or {}))


def _annotations_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    annotations = _metadata(obj).get("annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def clip(text: str, *, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` cut to `limit` characters, marked as cut."""
    return text if len(text) <= limit else text[: limit - 9] + " ...(cut)"


def bounded_message(problems: Sequence[str], *, limit: int = MAX_MESSAGE_CHARS) -> str:
    """The problems joined with "; ", cut to `limit` characters: "...and N more problems"
    ends a cut list, so the reader knows there is more."""
    if not problems:
        return ""
    text = problems[0] if len(problems) == 1 else "; ".join(problems)
    if len(text) <= limit:
        return text
    kept: list[str] = []
    used = 0
    for problem in problems:
        tail = f"; ...and {len(problems) - len(kept)} more problems"
        cost = len(problem) + (2 if kept else 0)
        if used + cost + len(tail) > limit:
            break
        kept.append(problem)
        used += cost
    if not kept:
        return clip(problems[0], limit=limit)
    return "; ".join(kept) + f"; ...and {len(problems) - len(kept)} more problems"


DEFAULT_CLUSTER_SCOPED: frozenset[str] = frozenset(
    {
        "APIService",
        "CertificateSigningRequest",
        "ClusterIssuer",
        "ClusterRole",
        "ClusterRoleBinding",
        "ComponentStatus",
        "CSIDriver",
        "CSINode",
        "CustomResourceDefinition",
        "FlowSchema",
        "IngressClass",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
        "MutatingWebhookConfiguration",
        "Namespace",
        "Node",
        "PersistentVolume",
        "PodSecurityPolicy",
        "PriorityClass",
        "PriorityLevelConfiguration",
        "RuntimeClass",
        "SelfSubjectAccessReview",
        "SelfSubjectReview",
        "SelfSubjectRulesReview",
        "StorageClass",
        "SubjectAccessReview",
        "TokenReview",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
        "VolumeAttachment",
    }
)
"""Kinds that live outside namespaces; an AppWrapper may only make objects in its own."""

# Secret is left out on purpose. Wrapping a kind means granting the dispatcher `get` on every
# object of that kind in every namespace (after a restart it GETs an object that already
# exists to adopt it), and the dispatcher should not be able to read every Secret in the
# cluster. To wrap Secrets anyway, add Secret to `allowed_kinds` in the settings and a
# `get, create, delete` rule on `secrets` to the dispatcher's ClusterRole (manifests/rbac.yaml).
# The admission webhook then still requires that the user who creates the AppWrapper may
# create Secrets in its namespace: the dispatcher's wider right is not lent to them.
DEFAULT_ALLOWED_KINDS: frozenset[str] = frozenset(
    {
        "ConfigMap",
        "Deployment",
        "Ingress",
        "Job",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "Pod",
        "PodGroup",
        "PyTorchJob",
        "RayCluster",
        "RayJob",
        "RayService",
        "ReplicaSet",
        "Route",
        "Service",
        "ServiceAccount",
        "StatefulSet",
    }
    # Role and RoleBinding are left out on purpose. The dispatcher, not the user, creates the
    # wrapped objects, and Kubernetes' escalation checks (RBAC "escalate"/"bind") apply to the
    # creator: a user who may create AppWrappers could otherwise bind, through the dispatcher's
    # own permissions, a Role granting more than they hold themselves. Operators who accept
    # that (or check the requester) can add them to the configured allow-list.
)
"""The kinds an AppWrapper may wrap unless the configuration says otherwise."""


def _metadata(template: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = template.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def validate_item(
    template: Mapping[str, Any],
    *,
    namespace: str,
    allowed_kinds: frozenset[str] | None,
    cluster_scoped_kinds: frozenset[str],
) -> list[str]:
    """What is wrong with one wrapped object (`generictemplate`); [] when it may be created.

    `allowed_kinds` None allows every namespaced kind.
    """
    if not isinstance(template, Mapping):
        return ["generictemplate is not an object"]
    depth, size = template_shape(
        template, max_depth=MAX_TEMPLATE_DEPTH, max_bytes=MAX_TEMPLATE_BYTES
    )
    if depth > MAX_TEMPLATE_DEPTH:
        # Nothing below walks it: the checks that follow (pod sets, copies) recurse.
        return [f"generictemplate is nested more than {MAX_TEMPLATE_DEPTH} levels deep"]
    if size > MAX_TEMPLATE_BYTES:
        return [f"generictemplate is larger than {MAX_TEMPLATE_BYTES // 1024} KiB"]
    errors = identity_problems(template)
    kind = _text(template.get("kind"))
    metadata = _metadata(template)
    errors += _metadata_type_problems(metadata, "metadata")
    item_namespace = metadata.get("namespace")
    if isinstance(item_namespace, str) and item_namespace and item_namespace != namespace:
        errors.append(
            f"metadata.namespace {_short(item_namespace)} differs from the AppWrapper's "
            f"namespace {namespace!r}; wrapped objects are created in the AppWrapper's namespace"
        )
    if kind is not None and len(kind) <= 63 and _ascii_match(_KIND, kind):
        # (An ill-formed kind is reported above and allowed nowhere.)
        if kind in cluster_scoped_kinds:
            errors.append(f"kind {kind} is cluster-scoped; only namespaced objects may be wrapped")
        elif kind in CLAIM_KINDS:
            pass  # refused below whatever the allow-list says, with the reason
        elif allowed_kinds is not None and kind not in allowed_kinds:
            errors.append(
                f"kind {kind} is not allowed (allowed: {', '.join(sorted(allowed_kinds))})"
            )
    try:
        infer_pod_sets(template)
    except QuantityError as exc:
        errors.append(str(exc))
    # Devices asked for through DRA would be neither charged nor fitted (core/resourceclaims.py).
    errors += claim_problems(template)
    return errors


def _describe(template: Any) -> str:
    if not isinstance(template, Mapping):
        return "?"
    kind = _text(template.get("kind")) or "?"
    name = _text(_metadata(template).get("name")) or "?"
    text = f"{kind}/{name}"
    return text if len(text) <= 80 else text[:77] + "..."


def validate_appwrapper(
    items: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    allowed_kinds: frozenset[str] | None = DEFAULT_ALLOWED_KINDS,
    cluster_scoped_kinds: frozenset[str] = DEFAULT_CLUSTER_SCOPED,
) -> list[str]:
    """Every error of every item, each prefixed "item I (Kind/name): ".

    I is the 0-based index in `spec.resources.GenericItems`. Two items naming the same
    (kind, name) are an error on the later one. More than MAX_ITEMS items is one error, and
    the items are not looked at: the answer must cost little whatever was sent.
    """
    if len(items) > MAX_ITEMS:
        return [f"{len(items)} items; an AppWrapper may wrap at most {MAX_ITEMS}"]
    errors: list[str] = []
    seen: dict[tuple[str, str], int] = {}
    for index, template in enumerate(items):
        prefix = f"item {index} ({_describe(template)}): "
        problems = validate_item(
            template,
            namespace=namespace,
            allowed_kinds=allowed_kinds,
            cluster_scoped_kinds=cluster_scoped_kinds,
        )
        if isinstance(template, Mapping):
            kind = _text(template.get("kind"))
            name = _text(_metadata(template).get("name"))
            if kind is not None and name is not None:
                first = seen.setdefault((kind, name), index)
                if first != index:
                    problems.append(f"duplicate of item {first} (same kind and name)")
        errors.extend(prefix + problem for problem in problems)
    return errors
