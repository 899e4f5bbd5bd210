"""Which API groups a wrapped kind may come from, decided before any discovery request.

The allow-list (`allowed_kinds`) holds kind names only. Without a group, `kind: Pod` with
`apiVersion: x1.example/v1` passes it, and finding out that no cluster serves it costs a
discovery request on the hub and on every member. The kinds the dispatcher knows are pinned
here to the groups that really serve them, so such an item is refused by name alone; a kind
this table does not know (an operator's own CRD) may come from any group, as before, unless
the operator pins it too (`webhook.kind_groups`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["KNOWN_GROUPS", "group_of", "group_problem"]

KNOWN_GROUPS: Mapping[str, frozenset[str]] = {
    "ConfigMap": frozenset({""}),
    "PersistentVolumeClaim": frozenset({""}),
    "Pod": frozenset({""}),
    "Secret": frozenset({""}),
    "Service": frozenset({""}),
    "ServiceAccount": frozenset({""}),
    "Deployment": frozenset({"apps"}),
    "ReplicaSet": frozenset({"apps"}),
    "StatefulSet": frozenset({"apps"}),
    "Job": frozenset({"batch"}),
    "Ingress": frozenset({"networking.k8s.io"}),
    "NetworkPolicy": frozenset({"networking.k8s.io"}),
    # Coscheduling's PodGroup under its old and new group, and Volcano's.
    "PodGroup": frozenset(
        {"scheduling.sigs.k8s.io", "scheduling.x-k8s.io", "scheduling.volcano.sh"}
    ),
    "PyTorchJob": frozenset({"kubeflow.org"}),
    "RayCluster": frozenset({"ray.io"}),
    "RayJob": frozenset({"ray.io"}),
    "RayService": frozenset({"ray.io"}),
    "Route": frozenset({"route.openshift.io"}),
}
"""Kind -> the groups that serve it, for the kinds of the default allow-list (and Secret)."""


def group_of(api_version: str) -> str:
    """The API group of an apiVersion ("" for the core group's "v1")."""
    return api_version.rpartition("/")[0]


def group_problem(
    api_version: str, kind: str, extra: Mapping[str, Sequence[str]] | None = None
) -> str:
    """Why `kind` may not come from `api_version`'s group ("" when it may). `extra` (the
    operator's `webhook.kind_groups`) replaces the built-in groups of the kinds it names."""
    groups = frozenset(extra[kind]) if extra and kind in extra else KNOWN_GROUPS.get(kind)
    group = group_of(api_version)
    if groups is None or group in groups:
        return ""
    named = ", ".join(sorted(g or "the core group (v1)" for g in groups))
    return (
        f"kind {kind} of API group {group or 'core'!r} is not allowed: "
        f"{kind} is only wrapped from {named}"
    )
