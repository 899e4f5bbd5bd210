"""Status transitions of an AppWrapper: conditions, state and stage. Pure, no I/O.

Each transition edits a working copy of `AppWrapperStatus` (the shell makes the copy and
writes it once) and returns a `Transition` naming what happened, for the Event, or None
when it changed nothing, so the shell skips writes that would change nothing
(`set_condition`, `set_priority` and `set_pod_counts` return that as a bool). Conditions
hold one entry per type; a milestone is True once reached in the current attempt, and a
requeue turns the later milestones False with the reason. The admission checks' own
transitions are in `core.checkstatus`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from dispatcher.api.models import (
    CHECK_CONDITION_PREFIX,
    Admission,
    AppWrapperState,
    AppWrapperStatus,
    Condition,
    ConditionType,
    Reason,
    WrappedRef,
    format_micro_time,
)
from dispatcher.core import protection
from dispatcher.core.phase import initialised
from dispatcher.core.validation import clip

C = ConditionType
MILESTONES = (C.INIT, C.QUEUEING, C.HEAD_OF_LINE, C.DISPATCHED, C.RUNNING)


@dataclass(frozen=True, slots=True)
class Transition:
    """What changed, for the Event the shell records (None when nothing did)."""

    reason: str
    message: str
    warning: bool = False

    def __post_init__(self) -> None:
        # Event messages are bounded like status messages (user data can make them long).
        object.__setattr__(self, "message", clip(self.message))


def set_condition(
    status: AppWrapperStatus,
    type_: ConditionType | str,
    *,
    true: bool,
    reason: str,
    message: str = "",
    now: datetime,
) -> bool:
    """Set one condition; the transition time moves only when the status flips."""
    message = clip(message)
    stamp = format_micro_time(now)
    value: Literal["True", "False"] = "True" if true else "False"
    existing = status.condition(type_)
    if existing is None:
        status.conditions.append(
            Condition(
                type=str(type_),
                status=value,
                reason=reason,
                message=message,
                lastTransitionMicroTime=stamp,
                lastUpdateMicroTime=stamp,
            )
        )
        return True
    if existing.status == value and existing.reason == reason and existing.message == message:
        return False
    if existing.status != value:
        existing.lastTransitionMicroTime = stamp
    existing.status = value
    existing.reason = reason
    existing.message = message
    existing.lastUpdateMicroTime = stamp
    return True


def stage_of(status: AppWrapperStatus) -> str:
    """The furthest point of the current attempt, shown as STAGE by `kubectl get aw`."""
    for terminal in (C.FAILED, C.COMPLETED):
        if status.is_true(terminal):
            return terminal.value
    if status.is_true(C.BACKOFF):
        return C.BACKOFF.value
    reached = [m for m in MILESTONES if status.is_true(m)]
    return reached[-1].value if reached else ""


def settle(status: AppWrapperStatus, state: AppWrapperState, message: str) -> bool:
    message = clip(message)
    changed = False
    stage = stage_of(status)
    if status.stage != stage:
        status.stage = stage
        changed = True
    if status.state != state:
        status.state = state
        changed = True
    if status.message != message:
        status.message = message
        changed = True
    return changed


def check_types(status: AppWrapperStatus) -> list[str]:
    """The condition types of its admission checks (`core.checkstatus`)."""
    return [c.type for c in status.conditions if c.type.startswith(CHECK_CONDITION_PREFIX)]


# -- transitions ---------------------------------------------------------------------------


def initialize(status: AppWrapperStatus, *, priority: int, now: datetime) -> Transition | None:
    """A new AppWrapper: Init and Queueing True, state Pending."""
    changed = set_condition(
        status, C.INIT, true=True, reason=Reason.CREATED, message="AppWrapper accepted", now=now
    )
    changed |= set_condition(
        status, C.QUEUEING, true=True, reason=Reason.QUEUED, message="waiting in the queue", now=now
    )
    if status.queuedAt is None:
        status.queuedAt = format_micro_time(now)
        changed = True
    if status.priority != priority:
        status.priority = priority
        changed = True
    changed |= settle(status, AppWrapperState.PENDING, "waiting in the queue")
    return Transition(Reason.QUEUED, f"queued with priority {priority}") if changed else None


def set_priority(status: AppWrapperStatus, priority: int) -> bool:
    if status.priority == priority:
        return False
    status.priority = priority
    return True


def mark_head_of_line(status: AppWrapperStatus, *, now: datetime) -> Transition | None:
    if not set_condition(
        status,
        C.HEAD_OF_LINE,
        true=True,
        reason=Reason.FRONT_OF_QUEUE,
        message="first in line for the next free capacity",
        now=now,
    ):
        return None
    settle(status, AppWrapperState.PENDING, status.message or "")
    return Transition(Reason.FRONT_OF_QUEUE, "at the head of the queue")


def mark_waiting(
    status: AppWrapperStatus,
    message: str,
    *,
    now: datetime,
    reason: Reason = Reason.INSUFFICIENT_RESOURCES,
) -> Transition | None:
    """Not dispatched this cycle; `message` says what it waits for, with numbers; `reason`
    whether for capacity, for its queue's quota, or for its queue to be usable.

    Only the first wait for each reason makes an Event; later changes of the numbers update
    the status alone (an empty Transition), so `kubectl describe` is not flooded.
    """
    before = status.condition(C.DISPATCHED)
    first = before is None or before.reason != reason
    changed = set_condition(
        status, C.DISPATCHED, true=False, reason=reason, message=message, now=now
    )
    changed |= settle(status, AppWrapperState.PENDING, message)
    if not changed:
        return None
    return Transition(reason, message) if first else Transition("", "")


SUSPENDED_MESSAGE = "spec.suspend is true: not dispatched until it is set false"


def mark_suspended(status: AppWrapperStatus, *, priority: int, now: datetime) -> Transition | None:
    """Held by `spec.suspend`: queued as any new one would be (Init, Queueing), not
    dispatched, and Dispatched False says why, as a wait for capacity would."""
    first = None if initialised(status) else initialize(status, priority=priority, now=now)
    waiting = mark_waiting(status, SUSPENDED_MESSAGE, now=now, reason=Reason.SUSPENDED)
    if waiting is not None and waiting.reason:
        return waiting
    return first or waiting


def reached_head(status: AppWrapperStatus, now: datetime) -> None:
    """HeadOfLine True as it is left behind: quota reserved, or dispatched."""
    set_condition(
        status,
        C.HEAD_OF_LINE,
        true=True,
        reason=Reason.FRONT_OF_QUEUE,
        message="reached the head of the queue",
        now=now,
    )


def mark_dispatched(
    status: AppWrapperStatus,
    *,
    cluster: str,
    now: datetime,
    objects: list[WrappedRef] | None = None,
    admission: Admission | None = None,
) -> Transition:
    """All milestones up to Dispatched True; Running not yet. `objects` records what this
    dispatch is for (the objects the spec names now); `admission` its quota, if queued."""
    stamp = format_micro_time(now)
    message = f"dispatched to cluster {cluster}"
    if admission is not None:
        flavors = ", ".join(f.name for f in admission.flavors)
        message += f" (queue {admission.clusterQueue}, flavor {flavors}"
        message += ", borrowing)" if admission.borrowing else ")"
    set_condition(
        status, C.INIT, true=True, reason=Reason.CREATED, message="AppWrapper accepted", now=now
    )
    set_condition(
        status, C.QUEUEING, true=True, reason=Reason.QUEUED, message="waited in the queue", now=now
    )
    reached_head(status, now)
    set_condition(
        status, C.DISPATCHED, true=True, reason=Reason.DISPATCHED, message=message, now=now
    )
    set_condition(
        status,
        C.RUNNING,
        true=False,
        reason=Reason.PODS_NOT_READY,
        message="waiting for pods to run",
        now=now,
    )
    if status.condition(C.PREEMPTED) is not None:
        # Preempted while Dispatched means "being evicted": a new attempt starts unpreempted.
        set_condition(
            status, C.PREEMPTED, true=False, reason=Reason.DISPATCHED, message=message, now=now
        )
    status.preemptedBy = None
    if status.queuedAt is None:
        status.queuedAt = stamp
    status.clusterName = cluster
    status.dispatchedAt = status.dispatchedAt or stamp
    status.lastDispatchedAt = stamp
    status.dispatchedObjects = objects
    status.admission = admission
    settle(status, AppWrapperState.RUNNING, message)
    return Transition(Reason.DISPATCHED, message)


def mark_running(status: AppWrapperStatus, message: str, *, now: datetime) -> Transition | None:
    if not set_condition(
        status, C.RUNNING, true=True, reason=Reason.PODS_RUNNING, message=message, now=now
    ):
        return None
    settle(status, AppWrapperState.RUNNING, message)
    return Transition(Reason.PODS_RUNNING, message)


def mark_running_hold_completion(
    status: AppWrapperStatus, message: str, *, now: datetime
) -> Transition | None:
    """MCAD's RunningHoldCompletion: the items report completion, pods still run. Running
    stays True; `status.state` says it; Completed follows when the pods end."""
    changed = set_condition(
        status,
        C.RUNNING,
        true=True,
        reason=Reason.SOME_ITEMS_COMPLETED,
        message=message,
        now=now,
    )
    if not changed and status.state is AppWrapperState.RUNNING_HOLD_COMPLETION:
        return None
    settle(status, AppWrapperState.RUNNING_HOLD_COMPLETION, message)
    return Transition(Reason.SOME_ITEMS_COMPLETED, message)


def mark_completed(status: AppWrapperStatus, message: str, *, now: datetime) -> Transition | None:
    """Completed, and so Running too: pods that finished ran, however briefly.

    A Job whose pods succeed between two looks is Completed without ever having been seen
    Running; Running turns True in the same write so `kubectl wait --for=condition=Running`
    returns for it as for a longer one.
    """
    changed = False
    if not status.is_true(C.RUNNING):
        changed = set_condition(
            status,
            C.RUNNING,
            true=True,
            reason=Reason.PODS_RUNNING,
            message=f"ran to completion: {message}",
            now=now,
        )
    changed |= set_condition(
        status, C.COMPLETED, true=True, reason=Reason.WORKLOAD_COMPLETED, message=message, now=now
    )
    if not changed:
        return None
    settle(status, AppWrapperState.COMPLETED, message)
    return Transition(Reason.WORKLOAD_COMPLETED, message)


def mark_stalled(
    status: AppWrapperStatus, reason: Reason, message: str, *, now: datetime
) -> Transition | None:
    """Dispatched, its objects not made yet for a reason of the dispatcher's own (it tries
    again): said on Running (False) and in the message; no milestone moves, nothing ends."""
    if not set_condition(status, C.RUNNING, true=False, reason=reason, message=message, now=now):
        return None
    settle(status, status.state or AppWrapperState.RUNNING, message)
    return Transition(reason, message, warning=True)


def mark_failed(
    status: AppWrapperStatus, reason: Reason, message: str, *, now: datetime
) -> Transition | None:
    if not set_condition(status, C.FAILED, true=True, reason=reason, message=message, now=now):
        return None
    # At the requeue limit MCAD names the state Deleted (its objects are removed); the Failed
    # condition says why either way.
    limit = reason is Reason.REQUEUE_LIMIT_REACHED
    settle(status, AppWrapperState.DELETED if limit else AppWrapperState.FAILED, message)
    return Transition(reason, message, warning=True)


def mark_preempting(
    status: AppWrapperStatus,
    *,
    by: str,
    message: str,
    now: datetime,
    reason: Reason = Reason.PREEMPTED_BY_HIGHER_PRIORITY,
    notice: float = 0.0,
) -> Transition | None:
    """Chosen as a preemption victim: still dispatched, its objects are to be removed.

    The write of this status is the eviction: the reconciler removes the objects and
    requeues it, and `preemptedBy` tells any later leader whose room is being freed. With a
    `notice` (seconds), the message (and so the Event) says when its objects are removed, so
    it can checkpoint first; the reconciler reads that time back from it
    (`core.protection.removal_time`), so a restarted dispatcher keeps the same deadline.
    """
    if notice > 0:
        message = protection.with_notice(message, now + timedelta(seconds=notice), notice)
    changed = set_condition(
        status,
        C.PREEMPTED,
        true=True,
        reason=reason,
        message=message,
        now=now,
    )
    if status.preemptedBy != by:
        status.preemptedBy = by
        changed = True
    if not changed:
        return None
    settle(status, status.state or AppWrapperState.RUNNING, message)
    return Transition(reason, message, warning=True)


def end_within_notice(
    status: AppWrapperStatus, reason: Reason, message: str, *, now: datetime
) -> None:
    """A victim that completed or failed (`reason`) within its notice: no longer being
    evicted (Preempted False, no `preemptedBy`), so it ends as it ended, not requeued.
    Written with the Completed or Failed transition, which makes the Event."""
    set_condition(
        status,
        C.PREEMPTED,
        true=False,
        reason=reason,
        message=f"ended within its preemption notice: {message}",
        now=now,
    )
    status.preemptedBy = None


def mark_requeued(
    status: AppWrapperStatus,
    reason: Reason,
    message: str,
    *,
    now: datetime,
    backoff: bool,
    preempted_by: str = "",
) -> Transition:
    """The wrapped objects were (or are being) removed; back to the queue, maybe after a pause."""
    status.requeueCount += 1
    if preempted_by:
        # The reason the eviction gave (priority, reclaim, within the queue) stays.
        chosen = status.condition(C.PREEMPTED)
        set_condition(
            status,
            C.PREEMPTED,
            true=True,
            reason=Reason(chosen.reason)
            if chosen is not None and chosen.reason in set(Reason)
            else Reason.PREEMPTED_BY_HIGHER_PRIORITY,
            message=message,
            now=now,
        )
    set_condition(status, C.REQUEUED, true=True, reason=reason, message=message, now=now)
    for later in (C.HEAD_OF_LINE, C.DISPATCHED, C.RUNNING, C.QUOTA_HELD, *check_types(status)):
        if status.condition(later) is not None:
            set_condition(status, later, true=False, reason=reason, message=message, now=now)
    if backoff:
        set_condition(
            status,
            C.BACKOFF,
            true=True,
            reason=Reason.REQUEUE_BACKOFF,
            message=f"requeued ({message}); waiting before queueing again",
            now=now,
        )
    else:
        set_condition(
            status, C.QUEUEING, true=True, reason=Reason.REQUEUED, message=message, now=now
        )
        if status.is_true(C.BACKOFF):  # requeued in the middle of a reset: no pause owed
            set_condition(status, C.BACKOFF, true=False, reason=reason, message=message, now=now)
    status.clusterName = None
    # status.admission stays until the next dispatch: while this dispatch's pods are still
    # going, the quota they use stays charged to its queue.
    status.pending = status.running = status.succeeded = status.failed = 0
    settle(status, AppWrapperState.PENDING, message)
    return Transition(reason, message, warning=True)


def mark_resetting(status: AppWrapperStatus, message: str, *, now: datetime) -> Transition:
    """Failed, to be tried again in place (v1beta2's Resetting): still Dispatched, so its
    room stays its own (the AppWrapper controller keeps the quota through a reset); Backoff
    True says its objects are being removed and the pause runs from then. Counted in
    `requeueCount` (v1beta2 resettingCount), which the retry limit is held against."""
    status.requeueCount += 1
    set_condition(status, C.RUNNING, true=False, reason=Reason.RESETTING, message=message, now=now)
    set_condition(
        status,
        C.BACKOFF,
        true=True,
        reason=Reason.RESETTING,
        message=f"reset ({message}); its objects are made again after the pause",
        now=now,
    )
    status.pending = status.running = status.succeeded = status.failed = 0
    settle(status, status.state or AppWrapperState.RUNNING, message)
    return Transition(Reason.RESETTING, message, warning=True)


def end_reset(status: AppWrapperStatus, *, now: datetime) -> Transition | None:
    """The pause after a reset is over: a new attempt on the same room, its objects to be
    made again (a new `lastDispatchedAt` tells the reconciler so)."""
    if not status.is_true(C.BACKOFF):
        return None
    message = f"retry {status.requeueCount}: making its objects again"
    set_condition(status, C.BACKOFF, true=False, reason=Reason.RESETTING, message=message, now=now)
    set_condition(
        status, C.RUNNING, true=False, reason=Reason.PODS_NOT_READY, message=message, now=now
    )
    status.lastDispatchedAt = format_micro_time(now)
    settle(status, AppWrapperState.RUNNING, message)
    return Transition(Reason.RESETTING, message)


def end_backoff(status: AppWrapperStatus, *, now: datetime) -> Transition | None:
    if not status.is_true(C.BACKOFF):
        return None
    set_condition(
        status,
        C.BACKOFF,
        true=False,
        reason=Reason.REQUEUE_BACKOFF,
        message="backoff over",
        now=now,
    )
    set_condition(
        status,
        C.QUEUEING,
        true=True,
        reason=Reason.REQUEUED,
        message="queued again after requeue",
        now=now,
    )
    settle(status, AppWrapperState.PENDING, "queued again after requeue")
    return Transition(Reason.REQUEUED, "queued again after backoff")


def set_pod_counts(
    status: AppWrapperStatus, *, pending: int, running: int, succeeded: int, failed: int
) -> bool:
    counts = (pending, running, succeeded, failed)
    if (status.pending, status.running, status.succeeded, status.failed) == counts:
        return False
    status.pending, status.running, status.succeeded, status.failed = counts
    return True
