"""What a dispatched AppWrapper's progress means: keep waiting, Running, Completed, Failed,
requeue or reset. Pure, no I/O: the shell gathers pod counts and wrapped-object conditions,
the functions here decide.

A failure fails the AppWrapper at once (MCAD's rule), unless it carries the v1beta2
fault-tolerance annotations (`core.faulttolerance.retry_policy`): then, as the AppWrapper
controller does, any failed pod makes it unhealthy, it is given `failureGracePeriod` to
recover (a wrapped object's own Failed condition is given none), and then it is reset
(`RESET`: its objects removed and made again, in place) while its resets stay under
`retryLimit`, else Failed.

A wrapped object deleted by someone else while it runs fails it at once, reset rule or not
(`MissingComponent`): the AppWrapper cannot run as written, and making the object again
would undo what someone did on purpose.

Pods on a node whose health labels evict a resource they ask for (`core/nodehealth.py`)
make it unhealthy too, not failed: with a reset rule it is reset after `failureGracePeriod`
(its objects made again keep off that node); without one it is requeued at once, as MCAD
requeues, and never Failed for it (the node's fault, not the user's).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from dispatcher.api.models import Reason, Requeuing
from dispatcher.core.faulttolerance import Retry
from dispatcher.core.retry import retry_delay


class Verdict(Enum):
    WAIT = "wait"
    RUNNING = "running"
    RUNNING_HOLD_COMPLETION = "hold_completion"
    """Every item with a completionstatus reports it; pods still run (MCAD's rule)."""
    COMPLETED = "completed"
    FAILED = "failed"
    REQUEUE = "requeue"
    RESET = "reset"
    """Failed, to be tried again in place (v1beta2 Resetting), keeping its room."""


@dataclass(frozen=True, slots=True)
class Progress:
    """A dispatched AppWrapper at one instant."""

    expected_pods: int  # pods its items declare (inferred or custompodresources)
    min_available: int  # pods that must run for it to count as Running
    pending: int
    running: int
    succeeded: int
    failed: int
    seconds_since_dispatch: float
    requeue_count: int
    reached_running: bool  # Running was True earlier in this attempt
    completion_items: int  # items with a completionstatus
    completed_items: int  # of those, how many show a completion condition
    failed_object: str = ""  # "Job/train: BackoffLimitExceeded" when a wrapped object failed
    missing_object: str = ""  # "Job/train" when a wrapped object made for it is gone
    seconds_failing: float = 0.0  # since it was first seen failing (this attempt)
    evicted_nodes: tuple[str, ...] = ()  # nodes evicting what its pods there ask for

    @property
    def failing(self) -> bool:
        """Failed pods, a failed object, or pods on nodes that evict them: what the failure
        grace period (`seconds_failing`) is counted from."""
        return bool(self.failed or self.failed_object or self.evicted_nodes)


@dataclass(frozen=True, slots=True)
class Assessment:
    verdict: Verdict
    reason: Reason | None = None
    message: str = ""
    recheck_after: float | None = None  # seconds until a time limit may change the verdict


def requeue_window(requeuing: Requeuing, requeue_count: int) -> float | None:
    """Seconds a dispatch may take to reach minAvailable running pods, for this attempt;
    None for no window (`timeInSeconds: 0`): it is never requeued for being slow.

    A window of 0 seconds would requeue every dispatch at its first look, before any pod
    could start: objects created and deleted in a loop. So 0 means no window, as
    `maxTimeInSeconds: 0` means no bound. Negative values never get here (CRD minimum 0,
    and the model refuses them).
    """
    if requeuing.timeInSeconds <= 0:
        return None
    base = float(requeuing.timeInSeconds)
    if requeuing.growthType == "exponential":
        window = retry_delay(base, requeue_count)
    elif requeuing.growthType == "linear":
        window = base * (requeue_count + 1)
    else:
        window = base
    if requeuing.maxTimeInSeconds:
        window = min(window, float(requeuing.maxTimeInSeconds))
    return window


def assess(
    progress: Progress,
    *,
    requeuing: Requeuing,
    duration_limit: int | None,
    retry: Retry | None = None,
) -> Assessment:
    """Decide the next step for a dispatched AppWrapper (first matching rule wins);
    `retry`: its reset rule, None for none (failures fail it)."""
    p = progress
    elapsed = p.seconds_since_dispatch
    done = _done(p)  # 1.
    if done is not None:
        return done
    if p.missing_object:  # 1b. Someone deleted a part of it: it cannot run as written.
        # No grace and no reset, as the AppWrapper controller: the deletion was deliberate.
        return Assessment(
            Verdict.FAILED,
            Reason.MISSING_COMPONENT,
            f"{p.missing_object} was deleted while the AppWrapper ran",
        )
    failed = _failed(p) if retry is None else _reset_or_fail(p, retry)  # 2.
    if failed is None and p.evicted_nodes:
        failed = _move(p, retry)
    if failed is not None:
        return failed
    # 3. Ran past dispatchDuration.limit.
    if duration_limit is not None and duration_limit > 0 and elapsed >= duration_limit:
        return Assessment(
            Verdict.FAILED,
            Reason.DISPATCH_DURATION_EXCEEDED,
            f"dispatched {int(elapsed)}s ago, over dispatchDuration.limit of {duration_limit}s",
        )
    duration_left = (duration_limit - elapsed) if duration_limit else None
    return _running_or_not(p, requeuing, duration_left)  # 4. and 5.


def _done(p: Progress) -> Assessment | None:
    """1. Done: every item with a completionstatus shows it and no pod is left (as MCAD:
    while pods still run or wait it holds, RunningHoldCompletion); or, with none declared,
    every pod it declared has succeeded."""
    seen = p.running + p.pending + p.succeeded + p.failed
    if p.completion_items:
        # Not before its pods were seen: a Deployment reports Progressing as soon as it is
        # created, before any pod exists to hold completion for.
        started = bool(seen) or p.reached_running or not p.expected_pods
        if p.completed_items >= p.completion_items and started:
            reported = f"{p.completed_items} of {p.completion_items} items report completion"
            if p.running or p.pending:
                # No pod count in the message: it would cost a status write per pod ending.
                return Assessment(
                    Verdict.RUNNING_HOLD_COMPLETION,
                    Reason.SOME_ITEMS_COMPLETED,
                    f"{reported}; held until its running and pending pods end",
                )
            return Assessment(Verdict.COMPLETED, Reason.WORKLOAD_COMPLETED, reported)
    elif (
        p.expected_pods > 0
        and p.succeeded >= p.expected_pods
        and p.pending == 0
        and p.running == 0
        and p.failed == 0
    ):
        return Assessment(
            Verdict.COMPLETED, Reason.WORKLOAD_COMPLETED, f"all {p.succeeded} pods succeeded"
        )
    return None


def _failed(p: Progress) -> Assessment | None:
    """2. A wrapped object says it failed, or every pod ended and some failed."""
    if p.failed_object:
        return Assessment(Verdict.FAILED, Reason.PODS_FAILED, p.failed_object)
    # With a completionstatus the object's own Failed condition decides (a Job retries
    # failed pods); without one, pods that all ended with failures mean failure.
    if not p.completion_items and p.failed and p.pending == 0 and p.running == 0:
        return Assessment(
            Verdict.FAILED, Reason.PODS_FAILED, f"{p.failed} pods failed and none are left running"
        )
    return None


def _reset_or_fail(p: Progress, retry: Retry) -> Assessment | None:
    """2. with a reset rule, as the AppWrapper controller: a failed object resets it at
    once; failed pods (even with others still running) after `failure_grace_seconds`;
    past `retry_limit` resets, Failed."""
    if p.failed_object:
        cause, grace = p.failed_object, 0.0
    elif p.failed:
        # No count in the message: it would cost a status write per pod failing.
        cause, grace = "pods failed", retry.failure_grace_seconds
    else:
        return None
    return _reset_after_grace(
        p, retry, cause, grace, waiting=Reason.PODS_FAILED, unless="they recover"
    )


def _move(p: Progress, retry: Retry | None) -> Assessment:
    """2. (no failure) Pods on nodes whose health labels evict them: requeued at once
    without a reset rule; with one, reset after the failure grace (past `retry_limit`
    resets, Failed, as the AppWrapper controller)."""
    cause = f"pods on nodes labelled unhealthy (NoExecute): {', '.join(p.evicted_nodes[:10])}"
    if retry is None:
        return Assessment(Verdict.REQUEUE, Reason.NODE_UNHEALTHY, f"{cause}; requeued")
    return _reset_after_grace(
        p,
        retry,
        cause,
        retry.failure_grace_seconds,
        waiting=Reason.NODE_UNHEALTHY,
        unless="the labels go",
    )


def _reset_after_grace(
    p: Progress, retry: Retry, cause: str, grace: float, *, waiting: Reason, unless: str
) -> Assessment:
    """Unhealthy for `cause`: wait out `grace`, then reset while resets stay under
    `retry_limit`, else Failed."""
    if p.seconds_failing < grace:
        return Assessment(
            Verdict.WAIT,
            waiting,
            f"{cause}; reset after failureGracePeriod {grace:g}s unless {unless}",
            grace - p.seconds_failing,
        )
    if p.requeue_count >= retry.retry_limit:
        return Assessment(
            Verdict.FAILED,
            Reason.RETRY_LIMIT_REACHED,
            f"{cause}; reset {p.requeue_count} times, retryLimit {retry.retry_limit}",
        )
    return Assessment(
        Verdict.RESET,
        Reason.RESETTING,
        f"{cause}; reset {p.requeue_count + 1} of retryLimit {retry.retry_limit}",
    )


def _running_or_not(p: Progress, requeuing: Requeuing, duration_left: float | None) -> Assessment:
    """4. Enough pods run or ran; 5. or not within the window: requeue, or give up after
    maxNumRequeuings."""
    elapsed = p.seconds_since_dispatch
    # Pods that succeeded have run: a short pod may go from Pending to Succeeded between two
    # looks and must count toward minAvailable as if it had been seen Running (as in MCAD).
    active = p.running + p.succeeded
    if active >= p.min_available:
        # No counts in the message: they are in status (running, succeeded), and a message
        # that moved with every pod would cost a status write and an Event per pod.
        message = f"minAvailable {p.min_available} reached (pods running or succeeded)"
        return Assessment(Verdict.RUNNING, Reason.PODS_RUNNING, message, duration_left)
    if p.reached_running:
        return Assessment(
            Verdict.WAIT,
            Reason.MIN_AVAILABLE_NOT_REACHED,
            f"{active} of minAvailable {p.min_available} pods running or succeeded",
            duration_left,
        )
    window = requeue_window(requeuing, p.requeue_count)
    if window is not None and elapsed >= window:
        message = (
            f"{active} of minAvailable {p.min_available} pods running or succeeded "
            f"{int(elapsed)}s after "
            f"dispatch (window {int(window)}s)"
        )
        if requeuing.maxNumRequeuings and p.requeue_count >= requeuing.maxNumRequeuings:
            return Assessment(
                Verdict.FAILED,
                Reason.REQUEUE_LIMIT_REACHED,
                f"{message}; requeued {p.requeue_count} times, maxNumRequeuings "
                f"{requeuing.maxNumRequeuings}",
            )
        return Assessment(Verdict.REQUEUE, Reason.PODS_NOT_RUNNING_IN_TIME, message)
    recheck = None if window is None else window - elapsed
    if duration_left is not None:
        recheck = duration_left if recheck is None else min(recheck, duration_left)
    return Assessment(
        Verdict.WAIT,
        Reason.PODS_NOT_READY,
        f"{active} of minAvailable {p.min_available} pods running or succeeded",
        recheck,
    )
