"""Where an AppWrapper is in its life, from its conditions alone. Pure, no I/O.

One function answers for the raw object of the watch cache (read on every event, where
validating the whole model would cost too much) and for the parsed model, so the scheduler's
index and the reconciler can never disagree about what an AppWrapper is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from dispatcher.api.models import AppWrapper, ConditionType, Reason

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
