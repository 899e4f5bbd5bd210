"""Semantic checks of wrapped objects before anything is created. Pure, no I/O.

The CRD schema rejects malformed YAML at `kubectl apply`; what it cannot see is checked here
(rules 6 and 7): every item is a complete, namespaced object of an allowed kind, in the
AppWrapper's own namespace, with quantities that parse, and no two items name the same
object. Errors are plain sentences for the AppWrapper's status; an empty list means valid.
Whether the kind exists in the target cluster is the shell's check (it needs discovery).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.api.quantity import QuantityError
from dispatcher.core.podsets import infer_pod_sets

__all__ = [
    "DEFAULT_ALLOWED_KINDS",
    "DEFAULT_CLUSTER_SCOPED",
    "validate_appwrapper",
    "validate_item",
]

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
        "Secret",
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
    errors: list[str] = []
    kind = _text(template.get("kind"))
    metadata = _metadata(template)
    if _text(template.get("apiVersion")) is None:
        errors.append("missing apiVersion")
    if kind is None:
        errors.append("missing kind")
    if _text(metadata.get("name")) is None:
        hint = " (generateName is not supported)" if metadata.get("generateName") else ""
        errors.append(f"missing metadata.name{hint}")
    item_namespace = metadata.get("namespace")
    if item_namespace and item_namespace != namespace:
        errors.append(
            f"metadata.namespace {item_namespace!r} differs from the AppWrapper's namespace "
            f"{namespace!r}; wrapped objects are created in the AppWrapper's namespace"
        )
    if kind is not None:
        if kind in cluster_scoped_kinds:
            errors.append(f"kind {kind} is cluster-scoped; only namespaced objects may be wrapped")
        elif allowed_kinds is not None and kind not in allowed_kinds:
            errors.append(
                f"kind {kind} is not allowed (allowed: {', '.join(sorted(allowed_kinds))})"
            )
    try:
        infer_pod_sets(template)
    except QuantityError as exc:
        errors.append(str(exc))
    return errors


def _describe(template: Any) -> str:
    if not isinstance(template, Mapping):
        return "?"
    kind = _text(template.get("kind")) or "?"
    name = _text(_metadata(template).get("name")) or "?"
    return f"{kind}/{name}"


def validate_appwrapper(
    items: Sequence[Mapping[str, Any]],
    *,
    namespace: str,
    allowed_kinds: frozenset[str] | None = DEFAULT_ALLOWED_KINDS,
    cluster_scoped_kinds: frozenset[str] = DEFAULT_CLUSTER_SCOPED,
) -> list[str]:
    """Every error of every item, each prefixed "item I (Kind/name): ".

    I is the 0-based index in `spec.resources.GenericItems`. Two items naming the same
    (kind, name) are an error on the later one.
    """
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
