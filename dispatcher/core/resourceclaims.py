"""DRA (dynamic resource allocation) in wrapped objects: refused until it is charged. Pure.

A pod can ask for devices through `spec.resourceClaims` and its containers'
`resources.claims` instead of extended resources (`nvidia.com/gpu: 8`). The dispatcher
neither charges those devices to a queue nor fits them on nodes (nor keeps them off nodes
whose devices are unhealthy): a gang of claim-only GPU pods would be dispatched as if it
asked for no GPU. Until claims are charged from ResourceSlices, an AppWrapper that uses them
is refused: at apply by the admission webhook, and, if it was stored past the webhook, it
ends Failed (InvalidSpec) before anything of it is created.

Every pod spec in a template is looked at, not only the pod templates `core.podsets` knows
for the kind: any object holding a `containers` list is taken for one (a Deployment's
`spec.template.spec`, a RayCluster worker group's, a JobSet's nested ones, a Pod's `spec`).
What is not a pod spec but looks like one is refused too: the refusal is the safe side.
The wrapped kinds ResourceClaim and ResourceClaimTemplate are refused for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CLAIM_KINDS", "NOT_CHARGED", "claim_fields", "claim_problems"]

CLAIM_KINDS = frozenset({"ResourceClaim", "ResourceClaimTemplate"})
"""Wrapped kinds that exist only to be claimed by pods (resource.k8s.io)."""

NOT_CHARGED = (
    "DRA resource claims are not charged yet (the dispatcher cannot count, place or keep "
    "off unhealthy nodes the devices they ask for); request the devices as extended "
    "resources (such as nvidia.com/gpu) instead"
)

_CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
_SHOWN = 3
"""Fields named in one item's message; the rest are counted."""


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _used(value: Any) -> bool:
    """Whether a claims field asks for anything (absent, null and empty do not)."""
    return value is not None and value != [] and value != {}


def _pod_spec_fields(spec: Mapping[str, Any], path: str) -> list[str]:
    """The claim fields of one pod spec at `path` that are in use."""
    found = [_join(path, "resourceClaims")] if _used(spec.get("resourceClaims")) else []
    for key in _CONTAINER_LISTS:
        containers = spec.get(key)
        for index, container in enumerate(containers if isinstance(containers, list) else []):
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if isinstance(resources, Mapping) and _used(resources.get("claims")):
                found.append(_join(path, f"{key}[{index}].resources.claims"))
    return found


def claim_fields(template: Mapping[str, Any]) -> list[str]:
    """Every field of `template` that asks for DRA devices, as a path from the object's top
    (`spec.workerGroupSpecs[0].template.spec.resourceClaims`), in document order.

    Walked without recursion; the caller bounds the template's size and depth first
    (`core.validation` does)."""
    found: list[str] = []
    stack: list[tuple[Any, str]] = [(template, "")]
    while stack:
        node, path = stack.pop()
        children: list[tuple[Any, str]] = []
        if isinstance(node, Mapping):
            if isinstance(node.get("containers"), list):
                found += _pod_spec_fields(node, path)
            children = [(v, _join(path, str(k))) for k, v in node.items()]
        elif isinstance(node, list):
            children = [(v, f"{path}[{i}]") for i, v in enumerate(node)]
        stack.extend(reversed(children))
    return found


def claim_problems(template: Mapping[str, Any]) -> list[str]:
    """Why this wrapped object is refused for asking for DRA devices; [] when it does not."""
    kind = template.get("kind")
    if isinstance(kind, str) and kind in CLAIM_KINDS:
        return [f"kind {kind}: {NOT_CHARGED}"]
    fields = claim_fields(template)
    if not fields:
        return []
    named = ", ".join(fields[:_SHOWN])
    more = f" and {len(fields) - _SHOWN} more" if len(fields) > _SHOWN else ""
    return [f"{named}{more}: {NOT_CHARGED}"]
