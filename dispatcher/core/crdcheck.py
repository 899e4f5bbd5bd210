"""Whether the AppWrapper CRD installed in the hub is one this dispatcher can serve. Pure,
no I/O: `dispatcher/kube/preflight.py` reads the CRD and refuses to start on a problem.

The AppWrapper v1beta2 controller (project-codeflare/appwrapper) defines a CRD of the same
name, `appwrappers.workload.codeflare.dev`, serving `v1beta2` only, with no conversion. This
dispatcher reads `v1beta1`; our CRD serves `v1beta2` too, converted by the dispatcher's own
webhook. The two CRDs are told apart by that conversion: `v1beta2` is understood only where
the CRD converts with a webhook at the path `CONVERT_PATH` (ours), since without it the API
server would hand v1beta2 objects to this dispatcher relabelled as `v1beta1` but shaped as
the other version. Where the CRD serves or has stored (`status.storedVersions`, which keeps
every version objects were ever written in) a version it cannot read that way, starting
would fail those objects or, worse, take over another controller's work; so the dispatcher
refuses and says what is installed and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CONVERTED", "CONVERT_PATH", "UNDERSTOOD", "CrdVersions", "crd_problem", "versions_of"]

UNDERSTOOD = ("v1beta1",)
"""The AppWrapper versions this dispatcher reads and writes."""
CONVERTED = ("v1beta2",)
"""The versions it understands only through its conversion webhook."""
CONVERT_PATH = "/convert"
"""The path of the dispatcher's conversion webhook (dispatcher/kube/webhook.py)."""

WHAT_TO_DO = (
    "it is likely the CRD of another AppWrapper controller (the AppWrapper v1beta2 "
    "controller, project-codeflare/appwrapper), or ours applied over it. Do not apply "
    "crds/appwrapper.yaml over it: run one AppWrapper controller per cluster, or move one "
    "of them (and its AppWrappers) to another cluster"
)


@dataclass(frozen=True, slots=True)
class CrdVersions:
    """What a CustomResourceDefinition says about its versions."""

    served: tuple[str, ...]
    """`spec.versions[]` with `served: true`."""
    not_served: tuple[str, ...]
    """`spec.versions[]` with `served: false`."""
    stored: tuple[str, ...]
    """`status.storedVersions`: every version objects have been stored in."""
    converts: bool = False
    """Whether `spec.conversion` is a webhook at `CONVERT_PATH` (by service or URL)."""


def versions_of(crd: Mapping[str, Any]) -> CrdVersions:
    """The versions of a CustomResourceDefinition as the API server returned it."""
    spec = crd.get("spec")
    status = crd.get("status")
    listed = spec.get("versions") if isinstance(spec, Mapping) else None
    stored = status.get("storedVersions") if isinstance(status, Mapping) else None
    versions = [v for v in listed if isinstance(v, Mapping)] if isinstance(listed, list) else []
    return CrdVersions(
        served=tuple(str(v.get("name")) for v in versions if v.get("served") is True),
        not_served=tuple(str(v.get("name")) for v in versions if v.get("served") is not True),
        stored=tuple(str(s) for s in stored) if isinstance(stored, list) else (),
        converts=_converts(spec.get("conversion") if isinstance(spec, Mapping) else None),
    )


def _converts(conversion: Any) -> bool:
    if not isinstance(conversion, Mapping) or conversion.get("strategy") != "Webhook":
        return False
    config = (conversion.get("webhook") or {}).get("clientConfig") or {}
    if not isinstance(config, Mapping):
        return False
    service = config.get("service")
    if isinstance(service, Mapping):
        return service.get("path") == CONVERT_PATH
    url = str(config.get("url") or "")
    return url.split("?", 1)[0].endswith(CONVERT_PATH)


def crd_problem(
    name: str, versions: CrdVersions | None, *, understood: tuple[str, ...] = UNDERSTOOD
) -> str | None:
    """Why this dispatcher must not start on the CRD `name` (None: absent), or None when it
    may. Checked in order: versions stored that it cannot read, versions served that it does
    not understand, none of its own served."""
    if versions is not None and versions.converts:
        understood = (*understood, *CONVERTED)
    reads = ", ".join(understood)
    if versions is None:
        return (
            f"CustomResourceDefinition {name} is not installed: apply this dispatcher's CRDs "
            "first (kubectl apply -f crds/)"
        )
    stored = ", ".join(versions.stored)
    foreign_stored = [v for v in versions.stored if v not in understood]
    if foreign_stored:
        return (
            f"CustomResourceDefinition {name} has stored objects as "
            f"{', '.join(foreign_stored)} (status.storedVersions: {stored}); this dispatcher "
            f"reads {reads} only (v1beta2 only through its own conversion webhook, which "
            f"this CRD does not name) and would misread them: {WHAT_TO_DO}"
        )
    foreign_served = [v for v in versions.served if v not in understood]
    if foreign_served:
        return (
            f"CustomResourceDefinition {name} serves {', '.join(versions.served)}; this "
            f"dispatcher understands {reads} only, not {', '.join(foreign_served)}: {WHAT_TO_DO}"
        )
    if not any(v in versions.served for v in understood):
        served = ", ".join(versions.served) or "no version"
        return (
            f"CustomResourceDefinition {name} serves {served}, not {reads}: apply this "
            "dispatcher's CRD (kubectl apply -f crds/) if no other controller uses it"
        )
    return None
