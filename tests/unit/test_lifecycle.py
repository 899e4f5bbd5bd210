"""What a dispatched AppWrapper's progress means (pure decision table)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from dispatcher.api.models import Reason, Requeuing
from dispatcher.core.lifecycle import Progress, Verdict, assess, requeue_window

BASE = Progress(
    expected_pods=3,
    min_available=3,
    pending=3,
    running=0,
    succeeded=0,
    failed=0,
    seconds_since_dispatch=10,
    requeue_count=0,
    reached_running=False,
    completion_items=0,
    completed_items=0,
)
REQUEUING = Requeuing(timeInSeconds=60, maxNumRequeuings=2)

CASES = [
    ("waiting-in-window", {}, None, Verdict.WAIT, Reason.PODS_NOT_READY),
    ("running", {"pending": 0, "running": 3}, None, Verdict.RUNNING, Reason.PODS_RUNNING),
    (
        "min-available-partial",
        {"pending": 1, "running": 2, "min_available": 2},
        None,
        Verdict.RUNNING,
        Reason.PODS_RUNNING,
    ),
    (
        "all-succeeded",
        {"pending": 0, "succeeded": 3},
        None,
        Verdict.COMPLETED,
        Reason.WORKLOAD_COMPLETED,
    ),
    (
        "completion-items-pods-left",
        {"completion_items": 1, "completed_items": 1, "pending": 0, "running": 3},
        None,
        Verdict.RUNNING_HOLD_COMPLETION,
        Reason.SOME_ITEMS_COMPLETED,
    ),
    (
        "completion-items-pods-pending",
        {"completion_items": 2, "completed_items": 2, "pending": 1, "running": 0},
        None,
        Verdict.RUNNING_HOLD_COMPLETION,
        Reason.SOME_ITEMS_COMPLETED,
    ),
    (
        "completion-items-no-pod-left",
        {"completion_items": 1, "completed_items": 1, "pending": 0, "running": 0, "succeeded": 3},
        None,
        Verdict.COMPLETED,
        Reason.WORKLOAD_COMPLETED,
    ),
    (
        # A Deployment reports Progressing before any of its pods exists.
        "completion-items-before-any-pod",
        {"completion_items": 1, "completed_items": 1, "pending": 0, "running": 0},
        None,
        Verdict.WAIT,
        Reason.PODS_NOT_READY,
    ),
    (
        "completion-items-one-short",
        {"completion_items": 2, "completed_items": 1, "pending": 0, "running": 3},
        None,
        Verdict.RUNNING,
        Reason.PODS_RUNNING,
    ),
    (
        "object-failed",
        {"failed_object": "Job/x failed: BackoffLimitExceeded"},
        None,
        Verdict.FAILED,
        Reason.PODS_FAILED,
    ),
    ("pods-failed", {"pending": 0, "failed": 3}, None, Verdict.FAILED, Reason.PODS_FAILED),
    (
        "object-deleted-while-running",
        {"missing_object": "Job/x", "running": 3},
        None,
        Verdict.FAILED,
        Reason.MISSING_COMPONENT,
    ),
    (
        # Done first: an object its TTL removed after it completed takes nothing back.
        "object-deleted-after-all-succeeded",
        {"missing_object": "Job/x", "pending": 0, "succeeded": 3},
        None,
        Verdict.COMPLETED,
        Reason.WORKLOAD_COMPLETED,
    ),
    (
        "window-passed",
        {"seconds_since_dispatch": 61},
        None,
        Verdict.REQUEUE,
        Reason.PODS_NOT_RUNNING_IN_TIME,
    ),
    (
        "requeue-limit",
        {"seconds_since_dispatch": 1000, "requeue_count": 2},
        None,
        Verdict.FAILED,
        Reason.REQUEUE_LIMIT_REACHED,
    ),
    (
        "duration-limit",
        {"pending": 0, "running": 3, "seconds_since_dispatch": 100},
        90,
        Verdict.FAILED,
        Reason.DISPATCH_DURATION_EXCEEDED,
    ),
    # Succeeded pods have run: they count toward minAvailable with the running ones.
    (
        "succeeded-only-reach-min-available",
        {"pending": 0, "succeeded": 3, "completion_items": 1},
        None,
        Verdict.RUNNING,
        Reason.PODS_RUNNING,
    ),
    (
        "running-plus-succeeded-reach-min-available",
        {"pending": 0, "running": 1, "succeeded": 2},
        None,
        Verdict.RUNNING,
        Reason.PODS_RUNNING,
    ),
    (
        "brief-pod-succeeded-before-seen-running",
        {
            "expected_pods": 1,
            "min_available": 1,
            "pending": 0,
            "succeeded": 1,
            "completion_items": 1,
        },
        None,
        Verdict.RUNNING,
        Reason.PODS_RUNNING,
    ),
    (
        "succeeded-after-window-not-requeued",
        {"pending": 0, "succeeded": 3, "completion_items": 1, "seconds_since_dispatch": 1000},
        None,
        Verdict.RUNNING,
        Reason.PODS_RUNNING,
    ),
    (
        "succeeded-after-running-keeps-running",
        {"pending": 0, "running": 1, "succeeded": 2, "reached_running": True},
        None,
        Verdict.RUNNING,
        Reason.PODS_RUNNING,
    ),
    (
        "too-few-running-or-succeeded-waits",
        {"pending": 1, "running": 1, "succeeded": 1},
        None,
        Verdict.WAIT,
        Reason.PODS_NOT_READY,
    ),
    (
        "brief-pods-all-succeeded-complete",
        {"pending": 0, "succeeded": 3, "seconds_since_dispatch": 0.5},
        None,
        Verdict.COMPLETED,
        Reason.WORKLOAD_COMPLETED,
    ),
    (
        "no-pods-service-only",
        {"expected_pods": 0, "min_available": 0, "pending": 0},
        None,
        Verdict.RUNNING,
        Reason.PODS_RUNNING,
    ),
]


@pytest.mark.parametrize(
    ("changes", "limit", "want_verdict", "want_reason"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_assess(changes, limit, want_verdict, want_reason) -> None:
    result = assess(replace(BASE, **changes), requeuing=REQUEUING, duration_limit=limit)
    assert result.verdict is want_verdict
    assert result.reason == want_reason
    assert result.message


def test_wait_says_when_to_look_again() -> None:
    result = assess(BASE, requeuing=REQUEUING, duration_limit=30)
    assert result.recheck_after == pytest.approx(20)


@pytest.mark.parametrize(
    ("growth", "count", "cap", "want"),
    [
        pytest.param("exponential", 0, 0, 60, id="exp-first"),
        pytest.param("exponential", 3, 0, 480, id="exp-third"),
        pytest.param("exponential", 3, 200, 200, id="exp-capped"),
        pytest.param("linear", 2, 0, 180, id="linear"),
        pytest.param("none", 5, 0, 60, id="none"),
    ],
)
def test_requeue_window(growth, count, cap, want) -> None:
    requeuing = Requeuing(timeInSeconds=60, growthType=growth, maxTimeInSeconds=cap)
    assert requeue_window(requeuing, count) == want


def test_succeeded_pods_are_named_in_the_running_message() -> None:
    progress = replace(BASE, pending=0, running=1, succeeded=2)
    result = assess(progress, requeuing=REQUEUING, duration_limit=None)
    assert result.message == "minAvailable 3 reached (pods running or succeeded)"


def test_waiting_message_counts_succeeded_pods() -> None:
    progress = replace(BASE, pending=1, running=1, succeeded=1)
    result = assess(progress, requeuing=REQUEUING, duration_limit=None)
    assert result.message == "2 of minAvailable 3 pods running or succeeded"


@pytest.mark.parametrize(
    ("growth", "count", "cap"),
    [
        pytest.param("exponential", 0, 0, id="exp-first"),
        pytest.param("exponential", 7, 100, id="exp-later-capped"),
        pytest.param("linear", 3, 0, id="linear"),
        pytest.param("none", 0, 0, id="none"),
    ],
)
def test_zero_time_means_no_requeue_window(growth: str, count: int, cap: int) -> None:
    requeuing = Requeuing(timeInSeconds=0, growthType=growth, maxTimeInSeconds=cap)
    assert requeue_window(requeuing, count) is None


@pytest.mark.parametrize("elapsed", [0.0, 1.0, 86_400.0 * 365])
def test_zero_time_never_requeues_a_slow_dispatch(elapsed: float) -> None:
    """`timeInSeconds: 0` once requeued every dispatch at its first look (a window of 0
    seconds), creating and deleting the objects in a loop; now it waits for good."""
    requeuing = Requeuing(timeInSeconds=0, maxNumRequeuings=1)
    progress = replace(BASE, seconds_since_dispatch=elapsed, requeue_count=1)
    result = assess(progress, requeuing=requeuing, duration_limit=None)
    assert result.verdict is Verdict.WAIT
    assert result.reason == Reason.PODS_NOT_READY
    assert result.recheck_after is None  # no window to look at again


def test_zero_time_keeps_the_dispatch_duration_limit() -> None:
    requeuing = Requeuing(timeInSeconds=0)
    waiting = assess(BASE, requeuing=requeuing, duration_limit=30)
    assert waiting.verdict is Verdict.WAIT
    assert waiting.recheck_after == pytest.approx(20)
    late = replace(BASE, seconds_since_dispatch=31)
    assert assess(late, requeuing=requeuing, duration_limit=30).verdict is Verdict.FAILED


def test_zero_max_time_is_no_bound() -> None:
    requeuing = Requeuing(timeInSeconds=10, growthType="exponential", maxTimeInSeconds=0)
    assert requeue_window(requeuing, 4) == 160


@pytest.mark.parametrize("field", ["timeInSeconds", "maxTimeInSeconds"])
def test_negative_requeue_times_are_refused(field: str) -> None:
    with pytest.raises(ValidationError):
        Requeuing.model_validate({field: -1})
