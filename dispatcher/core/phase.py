"""Where an AppWrapper is in its life, from its conditions alone. Pure, no I/O.

One function (`phase`) answers for the raw object of the watch cache (read on every event,
where validating the whole model would cost too much), for the parsed model, and for a
status alone (`status_phase`: what a status write checks before it writes, and what the
standing reads), so the scheduler's index, the reconciler and the standing can never
disagree about what an AppWrapper is. The status-level questions (`dispatched`, `finished`,
`queueing`) are that phase; `initialised` is the one fact it does not hold: a new
AppWrapper is QUEUED before its first conditions are written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from dispatcher.api.models import AppWrapper, AppWrapperStatus, ConditionType, Reason

C = ConditionType


class Phase(StrEnum):
    QUEUED = "queued"
    """Waiting for the scheduler (new ones too: its first decision writes Init/Queueing)."""
    RESERVED = "reserved"
    """Its queue's quota held for it while its admission checks run: nothing created yet."""
    DISPATCHED = "dispatched"
    """Admitted to a member: its objects exist or are being made."""
    EVICTING = "evicting"
    """Dispatched and chosen as a preemption victim: its objects are being removed."""
    BACKOFF = "backoff"
    """Requeued, pausing before it queues again."""
    FINISHED = "finished"
    """Completed or Failed."""
    DELETING = "deleting"
    """Being deleted: its objects go, then the finalizer."""
    SUSPENDED = "suspended"
    """Not dispatched, and held there by `spec.suspend`: the scheduler does not see it."""


SCHEDULED = frozenset({Phase.QUEUED, Phase.RESERVED, Phase.DISPATCHED, Phase.EVICTING})
"""Phases the scheduler reads: the ones that want room or quota, or hold it."""


def phase(
    true_conditions: Iterable[str], *, deleting: bool, suspended: bool = False, held: bool = False
) -> Phase:
    """The phase given the types of the conditions that are True (and `spec.suspend`: a
    dispatched one stays DISPATCHED until the reconciler has removed its objects; `held`:
    QuotaHeld is True for checks still running, `_held`)."""
    if deleting:
        return Phase.DELETING
    true = set(true_conditions)
    if C.COMPLETED in true or C.FAILED in true:
        return Phase.FINISHED
    if C.DISPATCHED in true:
        return Phase.EVICTING if C.PREEMPTED in true else Phase.DISPATCHED
    if C.BACKOFF in true:
        return Phase.BACKOFF
    if held and C.QUOTA_HELD in true:
        return Phase.RESERVED
    return Phase.SUSPENDED if suspended else Phase.QUEUED


def _held(type_: object, status: object, reason: object) -> bool:
    """QuotaHeld True for admission checks still running (with `AdmissionChecksReady` it
    stays True, keeping its transition time, while the AppWrapper is fitted again)."""
    return type_ == C.QUOTA_HELD and status == "True" and reason != Reason.CHECKS_READY


def phase_of_raw(obj: Mapping[str, Any]) -> Phase:
    """The phase of an AppWrapper as the API server returns it (a dict)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return phase(
        (str(c.get("type")) for c in conditions if c.get("status") == "True"),
        deleting=bool(obj["metadata"].get("deletionTimestamp")),
        suspended=(obj.get("spec") or {}).get("suspend") is True,
        held=any(_held(c.get("type"), c.get("status"), c.get("reason")) for c in conditions),
    )


def phase_of(aw: AppWrapper) -> Phase:
    """The phase of a parsed AppWrapper."""
    conditions = aw.status.conditions if aw.status is not None else []
    return phase(
        (c.type for c in conditions if c.status == "True"),
        deleting=bool(aw.metadata.deletionTimestamp),
        suspended=aw.spec.suspend,
        held=any(_held(c.type, c.status, c.reason) for c in conditions),
    )


def status_phase(status: AppWrapperStatus | None) -> Phase:
    """The phase a status alone gives: not deleting, not suspended, and quota held for
    admission checks read as QUEUED (the object's metadata and spec, and `phase_of`, say
    those). With no status, or no conditions yet, it is QUEUED: `initialised` tells a new
    one apart. Where a type appears twice (a status MCAD wrote), its first entry counts,
    as in `AppWrapperStatus.is_true`."""
    if status is None:
        return phase((), deleting=False)
    first = {c.type: c.status for c in reversed(status.conditions)}
    return phase((t for t, value in first.items() if value == "True"), deleting=False)


def dispatched(status: AppWrapperStatus | None) -> bool:
    """Dispatched in the current attempt and not finished (EVICTING too): its objects exist
    or are being made."""
    return status_phase(status) in (Phase.DISPATCHED, Phase.EVICTING)


def finished(status: AppWrapperStatus | None) -> bool:
    """Completed or Failed."""
    return status_phase(status) is Phase.FINISHED


def initialised(status: AppWrapperStatus | None) -> bool:
    """Given its first conditions (Init), by the reconciler or the scheduler's first
    decision. One that is not is QUEUED all the same, but not `queueing`."""
    return status is not None and status.condition(C.INIT) is not None


def queueing(status: AppWrapperStatus | None) -> bool:
    """Waiting for the scheduler, and said so: QUEUED by its status and Queueing True (held
    for its admission checks too). A new one is QUEUED but not yet queueing."""
    return (
        status is not None and status.is_true(C.QUEUEING) and status_phase(status) is Phase.QUEUED
    )
