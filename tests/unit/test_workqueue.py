"""The work queue's vocabulary: what a handler's Result asks of it."""

from __future__ import annotations

import math

import pytest

from dispatcher.controller.workqueue import Result


@pytest.mark.parametrize(
    ("result", "want_requeue_after"),
    [
        pytest.param(Result.done(), None, id="done-never-again"),
        pytest.param(Result.now(), 0.0, id="now-at-once"),
        pytest.param(Result.after(2.5), 2.5, id="after-seconds"),
        pytest.param(Result.soonest(None, None), None, id="soonest-of-nothing-is-done"),
        pytest.param(Result.soonest(None, 3.0, 1.0), 1.0, id="soonest-shortest"),
        pytest.param(Result.soonest(0.0, 4.0), 0.0, id="soonest-zero-is-now"),
    ],
)
def test_result_says_what_it_means(result: Result, want_requeue_after: float | None) -> None:
    assert result.requeue_after == want_requeue_after


@pytest.mark.parametrize(
    "seconds", [0.0, -1.0, math.inf, math.nan], ids=["zero", "negative", "inf", "nan"]
)
def test_after_refuses_what_is_not_a_delay(seconds: float) -> None:
    """Zero is `now()`; a delay that is no delay at all is a bug of the caller's."""
    with pytest.raises(ValueError, match="seconds > 0"):
        Result.after(seconds)


def test_done_and_now_differ() -> None:
    """controller-runtime's zero means "no requeue"; here "done" and "now" cannot be
    mistaken for one another."""
    assert Result.done() != Result.now()
