"""The v1beta2 status of an AppWrapper (`phase`, `conditions`, `resettingCount`,
`componentStatus`), read off the v1beta1 status the dispatcher writes. Pure, no I/O: one
table, `PHASES`, and one for the conditions, `CONDITIONS`; the conversion (core/convert.py)
calls `v1beta2_status` and `component_status`.

Works on the status as JSON (a dict), as the conversion does: a status written by an older
dispatcher or by MCAD converts too, whatever it holds.

Phases, first row that matches wins (v1beta1 condition types that are True). `Running`
means what it means to the AppWrapper controller: the components were created; whether
minAvailable pods run is the `PodsReady` condition (v1beta1 `Running`). "Objects made" is
`status.objectsMadeFor` equal to `status.lastDispatchedAt` (written by the reconciler once
this attempt's objects all exist), and reads here as the pseudo-type `OBJECTS_MADE`:

| v1beta1 (True)            | v1beta2 phase | why                                           |
|---------------------------|---------------|-----------------------------------------------|
| Completed                 | Succeeded     |                                               |
| Failed                    | Failed        |                                               |
| Dispatched + Preempted    | Suspending    | evicted: its objects are being removed        |
| Dispatched + Backoff      | Resetting     | reset in place: objects removed, made again   |
| Dispatched + Running      | Running       | minAvailable pods run (`PodsReady`)           |
| Dispatched + objects made | Running       | its objects are made (pods: `PodsReady`)      |
| Dispatched                | Resuming      | quota reserved, objects being made            |
| Backoff                   | Resetting     | requeued, pausing before it queues again      |
| (anything else)           | Suspended     | queued, or held by `spec.suspend`             |
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from dispatcher.api.names import generated_for

SUSPENDED: Final = "Suspended"
RESUMING: Final = "Resuming"
RUNNING: Final = "Running"
OBJECTS_MADE: Final = "(objects made)"
"""Not a condition type: that this attempt's objects all exist (`objects_made`)."""
SUSPENDING: Final = "Suspending"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
RESETTING: Final = "Resetting"

PHASES: Final[tuple[tuple[frozenset[str], str], ...]] = (
    (frozenset({"Completed"}), SUCCEEDED),
    (frozenset({"Failed"}), FAILED),
    (frozenset({"Dispatched", "Preempted"}), SUSPENDING),
    (frozenset({"Dispatched", "Backoff"}), RESETTING),
    (frozenset({"Dispatched", "Running"}), RUNNING),
    (frozenset({"Dispatched", OBJECTS_MADE}), RUNNING),
    (frozenset({"Dispatched"}), RESUMING),
    (frozenset({"Backoff"}), RESETTING),
)
"""(v1beta1 condition types that must all be True, v1beta2 phase); else Suspended."""

CONDITIONS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("QuotaReserved", ("Dispatched",)),
    ("ResourcesDeployed", ("Dispatched",)),
    ("PodsReady", ("Running",)),
    ("Unhealthy", ("Requeued", "Backoff")),
    ("DeletingResources", ("Preempted", "Dispatched")),
)
"""(v1beta2 type, v1beta1 types that must all be True): the v1beta2 condition is True
exactly then. Its reason, message and time come from the first of those v1beta1 conditions
the status holds (True or False: the latest word on it)."""

V1BETA2_CONDITION_TYPES: Final = frozenset(name for name, _ in CONDITIONS)
HELD: Final = "QuotaHeld"
"""v1beta1's condition for quota held while admission checks run: QuotaReserved in v1beta2
too (docs/autoscaling.md)."""

_REASON_OK = re.compile(r"[^A-Za-z0-9_,:]")


def v1beta2_phase(true_types: Iterable[str]) -> str:
    """The v1beta2 phase for the v1beta1 condition types that are True."""
    true = set(true_types)
    for needed, name in PHASES:
        if needed <= true:
            return name
    return SUSPENDED


def objects_made(status: Mapping[str, Any]) -> bool:
    """Whether the latest attempt's objects all exist (the reconciler's record)."""
    attempt = status.get("lastDispatchedAt")
    return bool(attempt) and status.get("objectsMadeFor") == attempt


def v1beta2_status(status: Mapping[str, Any], *, spec: Any = None) -> dict[str, Any]:
    """The v1beta2 fields of a v1beta1 `status` (`spec` says whether it is suspended)."""
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    by_type = {str(c.get("type")): c for c in conditions}
    true = {t for t, c in by_type.items() if c.get("status") == "True"}
    made = {OBJECTS_MADE} if objects_made(status) else set()
    out: dict[str, Any] = {"phase": v1beta2_phase(true | made)}
    requeues = status.get("requeueCount")
    if isinstance(requeues, int) and requeues > 0:
        out["resettingCount"] = requeues
    written = [_condition(name, needed, by_type, true) for name, needed in CONDITIONS]
    if HELD in true and "Dispatched" not in true:
        # Held for its admission checks: its quota is reserved, nothing is deployed yet.
        written.append(_condition("QuotaReserved", (HELD,), by_type, true))
    suspended = isinstance(spec, Mapping) and spec.get("suspend") is True
    if suspended and out["phase"] == SUSPENDED:
        written.append(
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Suspended",
                "message": "spec.suspend is true: the AppWrapper waits until it is unsuspended",
            }
        )
    # One entry per type: a later entry for the same type replaces the earlier one.
    out["conditions"] = list({c["type"]: c for c in written}.values())
    return out


def _condition(
    name: str,
    needed: tuple[str, ...],
    by_type: Mapping[str, Mapping[str, Any]],
    true: set[str],
) -> dict[str, Any]:
    holds = set(needed) <= true
    source = next((by_type[t] for t in needed if t in by_type), None)
    condition: dict[str, Any] = {
        "type": name,
        "status": "True" if holds else "False",
        "reason": _reason(source, holds),
        "message": str((source or {}).get("message") or ""),
    }
    when = (source or {}).get("lastTransitionMicroTime")
    if when:
        condition["lastTransitionTime"] = _seconds(str(when))
    return condition


def _reason(source: Mapping[str, Any] | None, holds: bool) -> str:
    # metav1.Condition's reason is CamelCase without dots (MCAD's "FrontOfQueue." has one).
    text = _REASON_OK.sub("", str((source or {}).get("reason") or ""))
    return text or ("Yes" if holds else "No")


def _seconds(micro: str) -> str:
    """metav1.Time (RFC 3339 to the second) of a MicroTime string."""
    head = micro.split(".", 1)[0].rstrip("Z")
    return f"{head}Z"


def component_status(
    components: Sequence[Mapping[str, Any]], status: Mapping[str, Any], *, seed: str
) -> list[dict[str, Any]]:
    """v1beta2's `status.componentStatus`: one entry per component (the object made of it:
    name, kind, apiVersion, its declared pod sets, `ResourcesDeployed`) once the objects of
    an attempt were made, else none. The name of a `generateName` component is the one the
    dispatcher gives it (`generated_for`, seeded by the AppWrapper's uid: `seed`)."""
    if not status.get("objectsMadeFor"):
        return []
    deployed = objects_made(status) and any(
        isinstance(c, Mapping) and c.get("type") == "Dispatched" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    out = []
    for index, component in enumerate(components):
        template = component.get("template")
        template = template if isinstance(template, Mapping) else {}
        metadata = template.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        name = generated_for(metadata, seed, index) or metadata.get("name")
        entry: dict[str, Any] = {
            "name": str(name or ""),
            "kind": str(template.get("kind") or ""),
            "apiVersion": str(template.get("apiVersion") or ""),
            "conditions": [
                {
                    "type": "ResourcesDeployed",
                    "status": "True" if deployed else "False",
                    "reason": "Deployed" if deployed else "NotDeployed",
                    "message": "",
                }
            ],
        }
        pod_sets = component.get("podSets")
        if isinstance(pod_sets, list) and pod_sets:
            entry["podSets"] = pod_sets
        out.append(entry)
    return out
