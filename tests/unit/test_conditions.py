"""Status transitions: one entry per type, milestones, requeue flips, stage and state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.models import AppWrapperStatus, Reason
from dispatcher.core import conditions as cond
from dispatcher.core.phase import dispatched, finished, queueing

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def true_types(status: AppWrapperStatus) -> set[str]:
    return {c.type for c in status.conditions if c.status == "True"}


def test_running_appwrapper_shows_every_milestone_true() -> None:
    status = AppWrapperStatus()
    cond.initialize(status, priority=3, now=T0)
    cond.mark_dispatched(status, cluster="east", now=T0)
    cond.mark_running(status, "2 pods running", now=T0)
    assert true_types(status) == {"Init", "Queueing", "HeadOfLine", "Dispatched", "Running"}
    assert (status.state, status.stage, status.clusterName) == ("Running", "Running", "east")
    assert status.priority == 3


def test_requeue_turns_later_milestones_false_with_the_reason() -> None:
    status = AppWrapperStatus()
    cond.initialize(status, priority=0, now=T0)
    cond.mark_dispatched(status, cluster="east", now=T0)
    cond.mark_requeued(
        status, Reason.PODS_NOT_RUNNING_IN_TIME, "0 of 2 running", now=T0, backoff=True
    )
    assert status.requeueCount == 1
    assert status.clusterName is None
    for later in ("HeadOfLine", "Dispatched", "Running"):
        condition = status.condition(later)
        assert condition is not None
        assert condition.status == "False"
        assert condition.reason == Reason.PODS_NOT_RUNNING_IN_TIME
    assert status.stage == "Backoff"
    assert not queueing(status)
    cond.end_backoff(status, now=T0 + timedelta(seconds=5))
    assert queueing(status)
    assert status.stage == "Queueing"


def test_transition_time_moves_only_when_status_flips() -> None:
    status = AppWrapperStatus()
    assert cond.set_condition(status, cond.C.RUNNING, true=False, reason="a", now=T0)
    later = T0 + timedelta(seconds=9)
    assert cond.set_condition(status, cond.C.RUNNING, true=False, reason="b", now=later)
    running = status.condition("Running")
    assert running is not None
    assert running.lastTransitionMicroTime == "2026-01-01T00:00:00.000000Z"
    assert running.lastUpdateMicroTime == "2026-01-01T00:00:09.000000Z"
    assert not cond.set_condition(status, cond.C.RUNNING, true=False, reason="b", now=later)


def test_waiting_makes_one_event_per_attempt() -> None:
    status = AppWrapperStatus()
    cond.initialize(status, priority=0, now=T0)
    first = cond.mark_waiting(status, "needs cpu 4, free 2 of 8", now=T0)
    second = cond.mark_waiting(status, "needs cpu 4, free 3 of 8", now=T0)
    same = cond.mark_waiting(status, "needs cpu 4, free 3 of 8", now=T0)
    assert first is not None
    assert first.reason == Reason.INSUFFICIENT_RESOURCES
    assert second is not None
    assert second.reason == ""  # status changes, no new Event
    assert same is None
    assert status.message == "needs cpu 4, free 3 of 8"


@pytest.mark.parametrize(
    ("terminal", "state"),
    [
        pytest.param("completed", "Completed", id="completed"),
        pytest.param("failed", "Failed", id="failed"),
    ],
)
def test_terminal_states(terminal: str, state: str) -> None:
    status = AppWrapperStatus()
    cond.initialize(status, priority=0, now=T0)
    cond.mark_dispatched(status, cluster="c", now=T0)
    if terminal == "completed":
        cond.mark_completed(status, "done", now=T0)
    else:
        cond.mark_failed(status, Reason.PODS_FAILED, "boom", now=T0)
    assert status.state == state
    assert status.stage == state
    assert finished(status)
    assert not dispatched(status)
    assert not queueing(status)


def _dispatched(*, running: bool) -> AppWrapperStatus:
    status = AppWrapperStatus()
    cond.initialize(status, priority=0, now=T0)
    cond.mark_dispatched(status, cluster="c", now=T0)
    if running:
        cond.mark_running(status, "1 pods running", now=T0)
    return status


LATER = T0 + timedelta(seconds=3)


@pytest.mark.parametrize(
    ("running_before", "want_running_message", "want_running_since"),
    [
        # A pod that ran and succeeded between two looks: never seen Running.
        pytest.param(False, "ran to completion: all 1 pods succeeded", LATER, id="never-seen"),
        # Seen Running earlier: that entry, its message and its time, are kept.
        pytest.param(True, "1 pods running", T0, id="seen-running"),
    ],
)
def test_completed_implies_running(
    running_before: bool, want_running_message: str, want_running_since: datetime
) -> None:
    status = _dispatched(running=running_before)
    transition = cond.mark_completed(status, "all 1 pods succeeded", now=LATER)
    # One transition, so one status write carries both conditions.
    assert transition == cond.Transition(Reason.WORKLOAD_COMPLETED, "all 1 pods succeeded")
    assert true_types(status) >= {"Running", "Completed"}
    running = status.condition("Running")
    assert running is not None
    assert running.reason == Reason.PODS_RUNNING
    assert running.message == want_running_message
    assert running.lastTransitionMicroTime == want_running_since.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert (status.state, status.stage) == ("Completed", "Completed")


def test_completed_twice_changes_nothing() -> None:
    status = _dispatched(running=False)
    assert cond.mark_completed(status, "done", now=T0) is not None
    before = status.model_copy(deep=True)
    assert cond.mark_completed(status, "done", now=LATER) is None
    assert status == before


def test_completed_after_a_requeue_marks_the_new_attempt_running() -> None:
    status = _dispatched(running=True)
    cond.mark_requeued(status, Reason.PREEMPTED, "preempted", now=T0, backoff=False)
    cond.mark_dispatched(status, cluster="c", now=LATER)
    cond.mark_completed(status, "done", now=LATER)
    running = status.condition("Running")
    assert running is not None
    assert (running.status, running.reason) == ("True", Reason.PODS_RUNNING)


STEPS = st.sampled_from(["init", "wait", "head", "dispatch", "run", "requeue", "backoff_end"])


@settings(max_examples=300, deadline=None)
@given(st.lists(STEPS, max_size=30))
def test_any_sequence_keeps_one_entry_per_type(steps: list[str]) -> None:
    status = AppWrapperStatus()
    now = T0
    for step in steps:
        now += timedelta(seconds=1)
        if step == "init":
            cond.initialize(status, priority=1, now=now)
        elif step == "wait":
            cond.mark_waiting(status, f"msg {now.second}", now=now)
        elif step == "head":
            cond.mark_head_of_line(status, now=now)
        elif step == "dispatch":
            cond.mark_dispatched(status, cluster="c", now=now)
        elif step == "run":
            cond.mark_running(status, "ok", now=now)
        elif step == "requeue":
            cond.mark_requeued(status, Reason.PREEMPTED, "x", now=now, backoff=True)
        else:
            cond.end_backoff(status, now=now)
        types = [c.type for c in status.conditions]
        assert len(types) == len(set(types))
        assert not (queueing(status) and dispatched(status))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["dispatch", "run", "requeue"]), max_size=20))
def test_completed_is_never_shown_without_running(steps: list[str]) -> None:
    status = AppWrapperStatus()
    cond.initialize(status, priority=1, now=T0)
    now = T0
    for step in [*steps, "dispatch", "complete"]:
        now += timedelta(seconds=1)
        if step == "dispatch":
            cond.mark_dispatched(status, cluster="c", now=now)
        elif step == "run":
            cond.mark_running(status, "ok", now=now)
        elif step == "requeue":
            cond.mark_requeued(status, Reason.PREEMPTED, "x", now=now, backoff=False)
        elif step == "complete" and dispatched(status):
            cond.mark_completed(status, "done", now=now)
    assert status.is_true(cond.C.COMPLETED)
    assert status.is_true(cond.C.RUNNING)


@pytest.mark.parametrize(
    ("reason", "state"),
    [
        pytest.param(Reason.REQUEUE_LIMIT_REACHED, "Deleted", id="requeue-limit-as-mcad"),
        pytest.param(Reason.PODS_FAILED, "Failed", id="pods-failed"),
        pytest.param(Reason.INVALID_SPEC, "Failed", id="invalid"),
    ],
)
def test_failed_state_names_the_end_as_mcad(reason: Reason, state: str) -> None:
    status = AppWrapperStatus()
    cond.mark_failed(status, reason, "done", now=T0)
    assert status.state == state
    assert "Failed" in true_types(status)
