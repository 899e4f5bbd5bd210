"""Resets of a failed AppWrapper that carries the v1beta2 fault-tolerance annotations: the
rule read off the annotations (core/faulttolerance.py `retry_policy`), the decision
(core/lifecycle.py `assess` with `retry`), the status steps (core/conditions.py
`mark_resetting`, `end_reset`) and the v1beta2 phase they show (core/v1beta2status.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from dispatcher.api.models import AppWrapperStatus, Reason, Requeuing
from dispatcher.core import conditions as cond
from dispatcher.core.faulttolerance import (
    FAILURE_GRACE,
    RETRY_LIMIT,
    RETRY_PAUSE,
    WARMUP_GRACE,
    FaultToleranceBounds,
    Retry,
    retry_policy,
)
from dispatcher.core.lifecycle import Progress, Verdict, assess
from dispatcher.core.phase import Phase, phase
from dispatcher.core.v1beta2status import v1beta2_status

C = cond.C
BOUNDS = FaultToleranceBounds(grace_period_maximum_seconds=600, retry_limit_maximum=5)


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param({}, None, id="none-mcad-rule"),
        pytest.param({WARMUP_GRACE: "10s"}, None, id="warmup-alone-no-reset"),
        pytest.param({RETRY_LIMIT: "2"}, Retry(60.0, 2, 90.0), id="limit-defaults-rest"),
        pytest.param(
            {FAILURE_GRACE: "0s", RETRY_LIMIT: "2", RETRY_PAUSE: "5s"},
            Retry(0.0, 2, 5.0),
            id="the-suites-annotations",
        ),
        pytest.param({RETRY_LIMIT: "0"}, Retry(60.0, 0, 90.0), id="zero-is-no-retry"),
        pytest.param({FAILURE_GRACE: "2h"}, Retry(600.0, 3, 90.0), id="grace-cut-to-bound"),
        pytest.param({RETRY_LIMIT: "50"}, Retry(60.0, 5, 90.0), id="limit-cut-to-bound"),
        pytest.param({RETRY_PAUSE: "soon"}, Retry(60.0, 3, 90.0), id="malformed-takes-default"),
    ],
)
def test_retry_policy(annotations: dict[str, str], want: Retry | None) -> None:
    assert retry_policy(annotations, BOUNDS) == want


RUNNING = Progress(
    expected_pods=2,
    min_available=2,
    pending=0,
    running=2,
    succeeded=0,
    failed=0,
    seconds_since_dispatch=30,
    requeue_count=0,
    reached_running=True,
    completion_items=0,
    completed_items=0,
)
RETRY = Retry(failure_grace_seconds=10, retry_limit=2, pause_seconds=5)
REQUEUING = Requeuing(timeInSeconds=60, maxNumRequeuings=2)


@pytest.mark.parametrize(
    ("changes", "retry", "want_verdict", "want_reason"),
    [
        pytest.param({}, RETRY, Verdict.RUNNING, Reason.PODS_RUNNING, id="healthy"),
        pytest.param(
            {"running": 1, "failed": 1, "seconds_failing": 3},
            RETRY,
            Verdict.WAIT,
            Reason.PODS_FAILED,
            id="within-grace",
        ),
        pytest.param(
            {"running": 1, "failed": 1, "seconds_failing": 10},
            RETRY,
            Verdict.RESET,
            Reason.RESETTING,
            id="grace-over-others-running",
        ),
        pytest.param(
            {"running": 0, "failed": 2},
            Retry(0, 2, 5),
            Verdict.RESET,
            Reason.RESETTING,
            id="no-grace",
        ),
        pytest.param(
            {"completion_items": 1, "failed_object": "Job/a: BackoffLimitExceeded"},
            RETRY,
            Verdict.RESET,
            Reason.RESETTING,
            id="failed-object-no-grace",
        ),
        pytest.param(
            {"running": 0, "failed": 1, "seconds_failing": 10, "requeue_count": 1},
            RETRY,
            Verdict.RESET,
            Reason.RESETTING,
            id="second-reset",
        ),
        pytest.param(
            {"running": 0, "failed": 1, "seconds_failing": 10, "requeue_count": 2},
            RETRY,
            Verdict.FAILED,
            Reason.RETRY_LIMIT_REACHED,
            id="limit-reached",
        ),
        pytest.param(
            {"running": 0, "failed": 1},
            Retry(0, 0, 5),
            Verdict.FAILED,
            Reason.RETRY_LIMIT_REACHED,
            id="limit-zero-fails-at-once",
        ),
        pytest.param(
            {"running": 2, "failed": 1, "seconds_failing": 60},
            None,
            Verdict.RUNNING,
            Reason.PODS_RUNNING,
            id="mcad-failed-pod-others-running",
        ),
        pytest.param(
            {"running": 0, "failed": 2},
            None,
            Verdict.FAILED,
            Reason.PODS_FAILED,
            id="mcad-all-ended-failed",
        ),
        pytest.param(
            {"running": 0, "succeeded": 2},
            RETRY,
            Verdict.COMPLETED,
            Reason.WORKLOAD_COMPLETED,
            id="success-unchanged",
        ),
        pytest.param(
            {"running": 2, "missing_object": "PyTorchJob/p"},
            RETRY,
            Verdict.FAILED,
            Reason.MISSING_COMPONENT,
            id="deleted-component-fails-without-reset",
        ),
    ],
)
def test_reset_decision(changes, retry, want_verdict, want_reason) -> None:
    got = assess(replace(RUNNING, **changes), requeuing=REQUEUING, duration_limit=None, retry=retry)
    assert (got.verdict, got.reason) == (want_verdict, want_reason)


def test_within_grace_says_when_to_look_again() -> None:
    got = assess(
        replace(RUNNING, running=1, failed=1, seconds_failing=4),
        requeuing=REQUEUING,
        duration_limit=None,
        retry=RETRY,
    )
    assert got.recheck_after == pytest.approx(6.0)


def test_reset_message_counts_resets_not_pods() -> None:
    """No pod count in the message (a status write per pod): the reset number only."""
    a, b = (
        assess(
            replace(RUNNING, running=0, failed=n, seconds_failing=10, requeue_count=1),
            requeuing=REQUEUING,
            duration_limit=None,
            retry=RETRY,
        ).message
        for n in (1, 3)
    )
    assert a == b == "pods failed; reset 2 of retryLimit 2"


T0 = datetime(2026, 11, 27, 3, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 27, 3, 0, 5, tzinfo=UTC)


def _dispatched() -> AppWrapperStatus:
    status = AppWrapperStatus()
    cond.initialize(status, priority=0, now=T0)
    cond.mark_dispatched(status, cluster="local", now=T0)
    cond.mark_running(status, "minAvailable 2 reached", now=T0)
    cond.set_pod_counts(status, pending=0, running=1, succeeded=0, failed=1)
    return status


def _true(status: AppWrapperStatus) -> set[str]:
    return {c.type for c in status.conditions if c.status == "True"}


def test_a_reset_keeps_it_dispatched_and_counts() -> None:
    status = _dispatched()
    transition = cond.mark_resetting(status, "pods failed; reset 1 of retryLimit 2", now=T1)
    assert transition.reason == Reason.RESETTING
    assert status.requeueCount == 1
    assert (status.running, status.failed) == (0, 0)
    # Still Dispatched: the scheduler keeps its room (phase DISPATCHED holds it).
    assert phase(_true(status), deleting=False) is Phase.DISPATCHED
    assert status.is_true(C.BACKOFF)
    assert not status.is_true(C.RUNNING)
    v1beta2 = v1beta2_status(status.model_dump(mode="json", exclude_none=True))
    assert (v1beta2["phase"], v1beta2["resettingCount"]) == ("Resetting", 1)


def test_the_end_of_a_reset_starts_a_new_attempt() -> None:
    status = _dispatched()
    before = status.lastDispatchedAt
    cond.mark_resetting(status, "pods failed", now=T1)
    transition = cond.end_reset(status, now=T1)
    assert transition is not None
    assert transition.reason == Reason.RESETTING
    assert status.lastDispatchedAt != before
    assert status.is_true(C.DISPATCHED)
    assert not status.is_true(C.BACKOFF)
    v1beta2 = v1beta2_status(status.model_dump(mode="json", exclude_none=True))
    assert (v1beta2["phase"], v1beta2["resettingCount"]) == ("Resuming", 1)
    assert cond.end_reset(status, now=T1) is None  # once


def test_suspended_while_resetting_queues_without_a_pause() -> None:
    status = _dispatched()
    cond.mark_resetting(status, "pods failed", now=T0)
    cond.mark_requeued(status, Reason.SUSPENDED, "spec.suspend", now=T1, backoff=False)
    assert phase(_true(status), deleting=False, suspended=True) is Phase.SUSPENDED
