"""A queued AppWrapper's own situation (core.waiting): what its status says, and when."""

from __future__ import annotations

import re

import pytest

from dispatcher.api.models import Reason
from dispatcher.core.scheduling import schedule
from dispatcher.core.waiting import (
    HEAD_REFRESH_SECONDS,
    REWRITE_SECONDS,
    Situation,
    Written,
    due,
    own_terms,
)
from tests.unit.test_cycle import CASES, NOW

R = Reason


@pytest.mark.parametrize(
    ("message", "want"),
    [
        pytest.param(
            "needs nvidia.com/gpu 4, free 2 of 4",
            "needs nvidia.com/gpu 4, more than is free",
            id="aggregate-free-dropped-ask-kept",
        ),
        pytest.param(
            "needs cpu 4, free 1 of 8; needs memory 8Gi, free 2Gi of 16Gi",
            "needs cpu 4, more than is free; needs memory 8Gi, more than is free",
            id="each-short-resource-named",
        ),
        pytest.param(
            "needs cpu 8, free 2 of 16 on the 3 nodes its pods may use",
            "needs cpu 8, more than is free on the 3 nodes its pods may use",
            id="usable-nodes-kept",
        ),
        pytest.param(
            "resources free in total but no node can hold pod Job/big (nvidia.com/gpu 8): "
            "largest free on a node is nvidia.com/gpu 4 (n1)",
            "resources free in total but no node can hold pod Job/big (nvidia.com/gpu 8)",
            id="roomiest-node-dropped",
        ),
        pytest.param(
            "resources free in total but no node can hold pod RayCluster/glue worker "
            "(cpu 3, memory 16G, nvidia.com/gpu 1) after placing 1 of 2 pods: "
            "largest free on a node is cpu 2, memory 48G, nvidia.com/gpu 1 (n1)",
            "resources free in total but no node can hold pod RayCluster/glue worker "
            "(cpu 3, memory 16G, nvidia.com/gpu 1)",
            id="pods-placed-so-far-dropped",
        ),
        pytest.param(
            "held for acc/w226, queued longer than 300s (starvation guard)",
            "room held for an AppWrapper ahead of it, queued longer than 300s (starvation guard)",
            id="starving-head-not-named",
        ),
        pytest.param(
            "no cluster fits: east: held for acc/w2, which is preempting; west: unreachable",
            "no cluster fits: east: room held for an AppWrapper ahead of it that is preempting;"
            " west: unreachable",
            id="preemptor-not-named",
        ),
        pytest.param(
            "waiting behind ns/big (head of line)",
            "waiting behind the head of line",
            id="strict-head-not-named",
        ),
        pytest.param(
            "waiting behind ns/big (head of queue team)",
            "waiting behind the head of queue team",
            id="strict-queue-head-not-named-queue-kept",
        ),
        pytest.param(
            "needs nvidia.com/gpu 4, free 0 of 4; preempting ns/low-1, ns/low-2 in east",
            "needs nvidia.com/gpu 4, more than is free; preempting lower-priority work",
            id="victims-not-named",
        ),
        pytest.param(
            "queue team: needs nvidia.com/gpu 8; nominal 8, in use 8, cohort can lend 0",
            "queue team: needs nvidia.com/gpu 8; nominal 8",
            id="quota-usage-dropped-nominal-kept",
        ),
        pytest.param(
            "queue team: needs cpu 4 in flavor spot; nominal 2, in use 2, cohort can lend 1,"
            " 1 of its own lent out",
            "queue team: needs cpu 4 in flavor spot; nominal 2",
            id="quota-lending-dropped",
        ),
        pytest.param(
            "AppQueue ns/q is stopped (stopPolicy Hold)",
            "AppQueue ns/q is stopped (stopPolicy Hold)",
            id="its-own-queue-kept",
        ),
        pytest.param("unreachable", "unreachable", id="unchanged"),
    ],
)
def test_own_terms(message: str, want: str) -> None:
    assert own_terms(message) == want


_FREE = re.compile(r"free [\d.]+\w* of")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_no_situation_of_a_real_cycle_names_another_appwrapper(case: object) -> None:
    """Every message a real cycle gives, in its owner's terms behind the head, names no other
    pending AppWrapper and no free amount (the cycle's wording is held to `own_terms`)."""
    result = schedule(
        case.pending,  # type: ignore[attr-defined]
        case.clusters,  # type: ignore[attr-defined]
        mode=case.mode,  # type: ignore[attr-defined]
        now=NOW,
        starvation_after=case.starvation_after,  # type: ignore[attr-defined]
        preemption=case.preemption,  # type: ignore[attr-defined]
    )
    keys = {w.key for w in case.pending}  # type: ignore[attr-defined]
    for wait in result.waits:
        situation = Situation.of(wait.message, wait.reason, head=False)
        others = [k for k in keys - {wait.key} if k in situation.message]
        assert others == [], (wait.message, situation.message)
        assert not _FREE.search(situation.message), situation.message


def _situation(
    message: str, *, head: bool = False, reason: Reason = R.INSUFFICIENT_RESOURCES
) -> Situation:
    return Situation.of(message, reason, head=head)


SHORT = "needs cpu 4, free 2 of 8"
SHORT_LATER = "needs cpu 4, free 3 of 8"
HELD = "held for ns/a, queued longer than 300s (starvation guard)"
HELD_OTHER = "held for ns/b, queued longer than 300s (starvation guard)"
T = 1_000.0


@pytest.mark.parametrize(
    ("last", "now_situation", "now", "want"),
    [
        pytest.param(None, _situation(SHORT), T, T, id="first-wait-at-once"),
        pytest.param(
            Written(_situation(SHORT), T),
            _situation(SHORT_LATER),
            T + 1,
            None,
            id="others-churn-moves-free-room-no-write",
        ),
        pytest.param(
            Written(_situation(SHORT), T),
            _situation(SHORT_LATER),
            T + 86_400,
            None,
            id="no-periodic-refresh-either",
        ),
        pytest.param(
            Written(_situation(HELD), T),
            _situation(HELD_OTHER),
            T + 1,
            None,
            id="held-for-someone-else-now-no-write",
        ),
        pytest.param(
            Written(_situation(SHORT), T),
            _situation(HELD),
            T + 60,
            T + 60,
            id="its-fit-changed-kind-written",
        ),
        pytest.param(
            Written(_situation(SHORT), T),
            _situation(HELD),
            T + 1,
            T + REWRITE_SECONDS,
            id="kind-change-soon-after-a-write-waits",
        ),
        pytest.param(
            Written(_situation(SHORT), T),
            _situation("queue team: needs cpu 4; nominal 2, in use 2", reason=R.QUOTA_EXCEEDED),
            T + 60,
            T + 60,
            id="reason-changed-written",
        ),
        pytest.param(
            Written(_situation(SHORT), T),
            _situation(SHORT, head=True),
            T + 60,
            T + 60,
            id="became-head-written",
        ),
        pytest.param(
            Written(_situation(SHORT, head=True), T),
            _situation(SHORT_LATER),
            T + 60,
            T + 60,
            id="ceased-to-be-head-written",
        ),
        pytest.param(
            Written(_situation(SHORT, head=True), T),
            _situation(SHORT_LATER, head=True),
            T + 1,
            T + HEAD_REFRESH_SECONDS,
            id="head-numbers-live-but-spaced",
        ),
        pytest.param(
            Written(_situation(SHORT, head=True), T),
            _situation(SHORT, head=True),
            T + 60,
            None,
            id="head-unchanged-no-write",
        ),
    ],
)
def test_due(
    last: Written | None, now_situation: Situation, now: float, want: float | None
) -> None:
    assert due(last, now_situation, now=now) == want


def test_the_head_message_is_kept_live() -> None:
    assert _situation(SHORT, head=True).message == SHORT
    assert _situation(SHORT).message == "needs cpu 4, more than is free"
