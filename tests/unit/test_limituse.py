"""How much of its declared limit work uses: the expected ends reservations estimate with."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.core.limituse import LimitUse

HALVES = LimitUse.of([0.5, 0.5, 0.5])
SPREAD = LimitUse.of([0.2, 0.4, 0.6, 0.8, 1.0])


@pytest.mark.parametrize(
    ("use", "started", "limit", "now", "want"),
    [
        pytest.param(LimitUse(), 0.0, 100.0, 10.0, 100.0, id="nothing-recorded-ends-at-its-limit"),
        pytest.param(HALVES, 0.0, 100.0, 10.0, 50.0, id="the-median-share"),
        pytest.param(HALVES, 0.0, 100.0, 60.0, 100.0, id="ran-longer-than-any-recorded"),
        pytest.param(SPREAD, 0.0, 100.0, 0.0, 60.0, id="median-of-all"),
        pytest.param(SPREAD, 0.0, 100.0, 50.0, 80.0, id="median-of-those-that-ran-longer"),
        pytest.param(SPREAD, 0.0, 100.0, 70.0, 90.0, id="an-even-count-halves-the-middle-two"),
        pytest.param(SPREAD, 0.0, 100.0, 150.0, 100.0, id="past-its-limit-its-limit"),
        pytest.param(SPREAD, 0.0, 0.0, 5.0, 0.0, id="no-time-at-all"),
        pytest.param(LimitUse.of([3.0, -1.0, 0.0]), 0.0, 100.0, 0.0, 100.0, id="over-1-is-1"),
    ],
)
def test_expected_end(use: LimitUse, started: float, limit: float, now: float, want: float) -> None:
    assert use.expected_end(started, limit, now) == pytest.approx(want)


def test_typical_is_the_median_share_or_none() -> None:
    assert SPREAD.typical() == pytest.approx(0.6)
    assert LimitUse().typical() is None


shares = st.lists(st.floats(min_value=-1.0, max_value=3.0, allow_nan=False), max_size=40)
times = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
limits = st.floats(min_value=1.0, max_value=1e5, allow_nan=False)


@given(shares, times, limits, times, times)
def test_an_end_is_within_the_limit_after_now_and_never_earlier_seen_later(
    recorded: list[float], started: float, limit: float, first: float, second: float
) -> None:
    use = LimitUse.of(recorded)
    early, late = sorted((started + first % limit, started + second % limit))
    at_early = use.expected_end(started, limit, early)
    at_late = use.expected_end(started, limit, late)
    for seen, end in ((early, at_early), (late, at_late)):
        assert started <= end <= started + limit * (1 + 1e-12)
        assert end >= seen or end == pytest.approx(started + limit)
    assert at_late >= at_early
