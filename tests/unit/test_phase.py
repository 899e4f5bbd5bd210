"""One derivation of where an AppWrapper is in its life (core/phase.py).

The status-level questions (`dispatched`, `finished`, `initialised`, `queueing`) replaced the
`is_*` helpers of core/conditions.py; copies of those helpers are kept here as the oracle, and
every combination of the conditions they read, and random condition lists, must get the
answers they gave. The status-level phase must also agree with the phase the scheduler's index
reads off the raw object.
"""

from __future__ import annotations

import itertools
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.models import AppWrapperStatus, Condition, ConditionType, Reason
from dispatcher.core.phase import (
    Phase,
    dispatched,
    finished,
    initialised,
    phase_of_raw,
    queueing,
    status_phase,
)

C = ConditionType

# -- the oracle: the helpers of core/conditions.py as they were --------------------------------


def old_is_terminal(status: AppWrapperStatus | None) -> bool:
    return status is not None and (status.is_true(C.COMPLETED) or status.is_true(C.FAILED))


def old_is_dispatched(status: AppWrapperStatus | None) -> bool:
    return status is not None and status.is_true(C.DISPATCHED) and not old_is_terminal(status)


def old_is_new(status: AppWrapperStatus | None) -> bool:
    return status is None or status.condition(C.INIT) is None


def old_is_queued(status: AppWrapperStatus | None) -> bool:
    return (
        status is not None
        and status.is_true(C.QUEUEING)
        and not status.is_true(C.DISPATCHED)
        and not status.is_true(C.BACKOFF)
        and not old_is_terminal(status)
    )


# -- builders --------------------------------------------------------------------------------

Value = Literal["True", "False"] | None
"""A condition's status, or None: the status holds no condition of that type."""

READ = (C.INIT, C.QUEUEING, C.DISPATCHED, C.BACKOFF, C.COMPLETED, C.FAILED, C.PREEMPTED)
"""Every type the old helpers (and the callers around them) read."""


def condition(type_: str, value: Literal["True", "False"], reason: str = "R") -> Condition:
    return Condition(type=type_, status=value, reason=reason)


def status_of(values: dict[str, Value], *, held: Value = None) -> AppWrapperStatus:
    status = AppWrapperStatus(
        conditions=[condition(t, v) for t, v in values.items() if v is not None]
    )
    if held is not None:
        status.conditions.append(condition(C.QUOTA_HELD, held, Reason.CHECK_PENDING))
    return status


def answers(status: AppWrapperStatus | None) -> dict[str, bool]:
    """What each caller asks, in the words it used before."""
    return {
        "terminal": finished(status),
        "dispatched": dispatched(status),
        "new": not initialised(status),
        "queued": queueing(status),
        # scheduler: queued for the scheduler, or new (its first decision writes Init)
        "schedulable": not initialised(status) or queueing(status),
        # provisioning: past its admission checks, nothing more to mark
        "past_checks": dispatched(status) or finished(status),
        # scheduler: a victim that can still be chosen
        "evictable": status_phase(status) is Phase.DISPATCHED,
    }


def old_answers(status: AppWrapperStatus | None) -> dict[str, bool]:
    return {
        "terminal": old_is_terminal(status),
        "dispatched": old_is_dispatched(status),
        "new": old_is_new(status),
        "queued": old_is_queued(status),
        "schedulable": old_is_new(status) or old_is_queued(status),
        "past_checks": old_is_dispatched(status) or old_is_terminal(status),
        "evictable": old_is_dispatched(status)
        and not (status is not None and status.is_true(C.PREEMPTED)),
    }


# -- named cases -----------------------------------------------------------------------------

T: Value = "True"
F: Value = "False"


@pytest.mark.parametrize(
    ("status", "want_phase", "want_true"),
    [
        pytest.param(None, Phase.QUEUED, {"new", "schedulable"}, id="no-status"),
        pytest.param(status_of({}), Phase.QUEUED, {"new", "schedulable"}, id="no-conditions"),
        pytest.param(
            status_of({C.QUEUEING: T}),
            Phase.QUEUED,
            {"new", "queued", "schedulable"},
            id="queueing-without-init-is-still-new",
        ),
        pytest.param(status_of({C.INIT: T}), Phase.QUEUED, set(), id="init-only-is-not-queueing"),
        pytest.param(
            status_of({C.INIT: F, C.QUEUEING: T}),
            Phase.QUEUED,
            {"queued", "schedulable"},
            id="init-false-is-initialised",
        ),
        pytest.param(
            status_of({C.INIT: T, C.QUEUEING: T}),
            Phase.QUEUED,
            {"queued", "schedulable"},
            id="queued",
        ),
        pytest.param(
            status_of({C.INIT: T, C.QUEUEING: T}, held=T),
            Phase.QUEUED,
            {"queued", "schedulable"},
            id="held-for-checks-is-queueing",
        ),
        pytest.param(
            status_of({C.INIT: T, C.QUEUEING: T, C.DISPATCHED: T}),
            Phase.DISPATCHED,
            {"dispatched", "past_checks", "evictable"},
            id="dispatched",
        ),
        pytest.param(
            status_of({C.INIT: T, C.QUEUEING: T, C.DISPATCHED: T, C.PREEMPTED: T}),
            Phase.EVICTING,
            {"dispatched", "past_checks"},
            id="evicting",
        ),
        pytest.param(
            status_of({C.INIT: T, C.QUEUEING: T, C.DISPATCHED: F, C.BACKOFF: T}),
            Phase.BACKOFF,
            set(),
            id="backoff",
        ),
        pytest.param(
            status_of({C.INIT: T, C.QUEUEING: T, C.DISPATCHED: T, C.BACKOFF: T}),
            Phase.DISPATCHED,
            {"dispatched", "past_checks", "evictable"},
            id="resetting-stays-dispatched",
        ),
        pytest.param(
            status_of({C.INIT: T, C.DISPATCHED: T, C.COMPLETED: T}),
            Phase.FINISHED,
            {"terminal", "past_checks"},
            id="completed",
        ),
        pytest.param(
            status_of({C.FAILED: T}),
            Phase.FINISHED,
            {"terminal", "new", "schedulable", "past_checks"},
            id="failed-before-init",
        ),
    ],
)
def test_status_phase_table(
    status: AppWrapperStatus | None, want_phase: Phase, want_true: set[str]
) -> None:
    assert status_phase(status) is want_phase
    got = answers(status)
    assert {name for name, yes in got.items() if yes} == want_true
    assert got == old_answers(status)


# -- every combination ------------------------------------------------------------------------


def test_every_combination_answers_as_the_old_helpers() -> None:
    """Each type read absent, False or True, with QuotaHeld too: 3^8 statuses."""
    choices: tuple[Value, ...] = (None, "False", "True")
    checked = 0
    for values in itertools.product(choices, repeat=len(READ)):
        for held in choices:
            status = status_of(dict(zip(READ, values, strict=True)), held=held)
            assert answers(status) == old_answers(status), status.conditions
            checked += 1
    assert answers(None) == old_answers(None)
    assert checked == 3 ** (len(READ) + 1)


# -- random condition lists -------------------------------------------------------------------

TYPES = [*READ, C.QUOTA_HELD, C.HEAD_OF_LINE, C.RUNNING, C.REQUEUED, "AdmissionCheck.prov", "X"]

conditions = st.lists(
    st.builds(
        condition,
        st.sampled_from([str(t) for t in TYPES]),
        st.sampled_from(["True", "False"]),
        st.sampled_from(["R", Reason.CHECK_PENDING, Reason.CHECKS_READY]),
    ),
    max_size=12,
)


@settings(max_examples=500, deadline=None)
@given(conditions)
def test_random_conditions_answer_as_the_old_helpers(found: list[Condition]) -> None:
    """Any list, duplicates of a type included (a status MCAD wrote: its first entry counts)."""
    status = AppWrapperStatus(conditions=found)
    assert answers(status) == old_answers(status)


@settings(max_examples=500, deadline=None)
@given(conditions, st.booleans())
def test_the_status_phase_is_the_phase_of_the_raw_object(
    found: list[Condition], suspended: bool
) -> None:
    """With one entry per type, the status alone says what the scheduler's index reads off
    the raw object, but for what the status does not hold: quota held for checks (RESERVED)
    and `spec.suspend` (SUSPENDED) are QUEUED by the status."""
    unique = list({c.type: c for c in found}.values())
    status = AppWrapperStatus(conditions=unique)
    raw = phase_of_raw(
        {"metadata": {}, "spec": {"suspend": suspended}, "status": status.model_dump()}
    )
    from_status = status_phase(status)
    if raw in (Phase.RESERVED, Phase.SUSPENDED):
        assert from_status is Phase.QUEUED
    else:
        assert from_status is raw
    deleting = phase_of_raw(
        {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": status.model_dump()}
    )
    assert deleting is Phase.DELETING
    assert dispatched(status) == (raw in (Phase.DISPATCHED, Phase.EVICTING))
    assert finished(status) == (raw is Phase.FINISHED)
    assert not (queueing(status) and (dispatched(status) or finished(status)))
