"""The one doubling rule every retry of the dispatcher's follows (core/retry.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.core.retry import retry_delay


@pytest.mark.parametrize(
    ("first", "failures", "most", "delay"),
    [
        (1.0, 0, 300.0, 1.0),
        (1.0, 1, 300.0, 2.0),
        (1.0, 8, 300.0, 256.0),
        (1.0, 9, 300.0, 300.0),
        (0.01, 3, None, 0.08),
        (60.0, -1, 1800.0, 60.0),  # before the first failure: the first delay
        (1.0, 10**9, 300.0, 300.0),  # a huge count neither overflows nor passes the cap
    ],
)
def test_table(first: float, failures: int, most: float | None, delay: float) -> None:
    assert retry_delay(first, failures, most) == pytest.approx(delay)


@given(
    first=st.floats(min_value=0.001, max_value=100),
    failures=st.integers(min_value=0, max_value=10_000),
    most=st.floats(min_value=0.001, max_value=10_000),
)
def test_never_shorter_than_the_last_nor_past_the_cap(
    first: float, failures: int, most: float
) -> None:
    delay = retry_delay(first, failures, most)
    assert delay <= most
    assert delay >= retry_delay(first, failures - 1, most)
    assert delay == min(most, delay)
