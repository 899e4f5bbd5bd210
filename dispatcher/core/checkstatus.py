"""Status transitions of an AppWrapper's admission checks (docs/autoscaling.md). Pure, no I/O.

An AppWrapper whose queue names admission checks is first reserved (`QuotaHeld` True,
reason `ChecksPending`) with one condition per check (`CHECK_CONDITION_PREFIX` + its name);
each check's state is set as its provisioner answers; all of them Ready turns `QuotaHeld`'s
reason to `ChecksReady`, and the AppWrapper is fitted on the nodes again. The transitions
follow `core.conditions`' contract: edit a working copy, return the `Transition` or None.
"""

from __future__ import annotations

from datetime import datetime

from dispatcher.api.models import (
    CHECK_CONDITION_PREFIX,
    Admission,
    AppWrapperState,
    AppWrapperStatus,
    ConditionType,
    Reason,
)
from dispatcher.core import conditions as cond


def check_condition(name: str) -> str:
    """The condition type that shows admission check `name`'s state."""
    return CHECK_CONDITION_PREFIX + name


def checks_ready(status: AppWrapperStatus | None) -> bool:
    """Its admission checks passed in this attempt: it is fitted on the nodes, not held."""
    if status is None:
        return False
    reserved = status.condition(ConditionType.QUOTA_HELD)
    return (
        reserved is not None
        and reserved.status == "True"
        and reserved.reason == Reason.CHECKS_READY
    )


def mark_reserved(
    status: AppWrapperStatus,
    *,
    checks: tuple[str, ...],
    admission: Admission | None,
    now: datetime,
) -> cond.Transition:
    """Quota held, admission checks to run (each Pending): nothing is created yet."""
    names = ", ".join(checks)
    where = f" in queue {admission.clusterQueue}" if admission is not None else ""
    message = f"quota reserved{where}; waiting for admission checks: {names}"
    cond.reached_head(status, now)
    cond.set_condition(
        status,
        ConditionType.QUOTA_HELD,
        true=True,
        reason=Reason.CHECKS_PENDING,
        message=message,
        now=now,
    )
    for name in checks:
        cond.set_condition(
            status,
            check_condition(name),
            true=False,
            reason=Reason.CHECK_PENDING,
            message="not started",
            now=now,
        )
    if admission is not None:
        status.admission = admission
    cond.settle(status, AppWrapperState.PENDING, message)
    return cond.Transition(Reason.CHECKS_PENDING, message)


def mark_check(
    status: AppWrapperStatus, name: str, reason: Reason, message: str, *, now: datetime
) -> cond.Transition | None:
    """One check's state; all of them Ready hands the AppWrapper back to the fit."""
    ready = reason is Reason.CHECK_READY
    changed = cond.set_condition(
        status, check_condition(name), true=ready, reason=reason, message=message, now=now
    )
    if not changed:
        return None
    pending = [c for c in cond.check_types(status) if not status.is_true(c)]
    held = status.condition(ConditionType.QUOTA_HELD)
    if not pending and held is not None and held.status == "True":
        # Stays True (its transition time names this reservation:
        # controller/lifecycle/provisioning.py).
        text = "admission checks ready; fitting on the nodes"
        cond.set_condition(
            status,
            ConditionType.QUOTA_HELD,
            true=True,
            reason=Reason.CHECKS_READY,
            message=text,
            now=now,
        )
        cond.settle(status, AppWrapperState.PENDING, text)
        return cond.Transition(Reason.CHECKS_READY, text)
    if reason is Reason.CHECK_READY:
        return None
    cond.settle(status, AppWrapperState.PENDING, f"admission check {name}: {message}")
    return cond.Transition(
        reason, f"admission check {name}: {message}", warning=reason is Reason.CHECK_RETRY
    )


def retry_checks(status: AppWrapperStatus, message: str, *, now: datetime) -> cond.Transition:
    """Back to the queue without a requeue (a booking expired before dispatch): its quota is
    given back and it is reserved again by a later cycle, with a new attempt of its checks."""
    for name in cond.check_types(status):
        cond.set_condition(
            status, name, true=False, reason=Reason.CHECK_RETRY, message=message, now=now
        )
    cond.set_condition(
        status,
        ConditionType.QUOTA_HELD,
        true=False,
        reason=Reason.CHECK_RETRY,
        message=message,
        now=now,
    )
    cond.settle(status, AppWrapperState.PENDING, message)
    return cond.Transition(Reason.CHECK_RETRY, message, warning=True)
