"""Whether the AppWrapper CRD installed in the hub is one this dispatcher can serve. Pure,
no I/O: `dispatcher/kube/preflight.py` reads the CRD and refuses to start on a problem.

The AppWrapper v1beta2 controller (project-codeflare/appwrapper) defines a CRD of the same
name, `appwrappers.workload.codeflare.dev`, serving `v1beta2`. This dispatcher reads
`v1beta1` only, with no conversion: where the CRD serves another version, or stores objects
in one (`status.storedVersions`, which keeps every version objects were ever written in,
even after someone applied our CRD over theirs), the API server would hand those objects to
this dispatcher relabelled as `v1beta1` but shaped as the other version. Starting there
would fail them or, worse, take over another controller's work; so the dispatcher refuses
and says what is installed and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["UNDERSTOOD", "CrdVersions", "crd_problem", "versions_of"]

UNDERSTOOD = ("v1beta1",)
"""The AppWrapper versions this dispatcher reads and writes."""

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
    )


def crd_problem(
    name: str, versions: CrdVersions | None, *, understood: tuple[str, ...] = UNDERSTOOD
) -> str | None:
    """Why this dispatcher must not start on the CRD `name` (None: absent), or None when it
    may. Checked in order: versions stored that it cannot read, versions served that it does
    not understand, none of its own served."""
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
            f"reads {reads} only, without conversion, and would misread them: {WHAT_TO_DO}"
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
