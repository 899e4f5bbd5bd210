"""Usage over time (core/quota/history.py): decay, the status form read back, the share."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.core.quota.history import (
    MAX_USERS,
    Decayed,
    UsageHistory,
    usage_share,
)

DAY = 86400.0
WEEK = 7 * DAY
TAU = WEEK / math.log(2)


def test_use_held_for_ever_tends_to_rate_times_tau_and_halves_each_half_life() -> None:
    held = Decayed(0.0).advance(100 * WEEK, {"gpu": 8.0}, WEEK)
    assert held.values["gpu"] == pytest.approx(8.0 * TAU)
    assert held.rate("gpu", WEEK) == pytest.approx(8.0)
    idle = held.advance(101 * WEEK, {}, WEEK)
    assert idle.values["gpu"] == pytest.approx(4.0 * TAU)
    assert idle.rate("gpu", WEEK) == pytest.approx(4.0)


def test_one_step_equals_many_small_ones() -> None:
    once = Decayed(0.0).advance(DAY, {"gpu": 3.0}, WEEK)
    stepped = Decayed(0.0)
    for hour in range(1, 25):
        stepped = stepped.advance(hour * 3600.0, {"gpu": 3.0}, WEEK)
    assert stepped.values["gpu"] == pytest.approx(once.values["gpu"])


def test_a_clock_that_stepped_back_changes_nothing() -> None:
    held = Decayed(DAY, {"gpu": 5.0})
    assert held.advance(DAY - 10, {"gpu": 100.0}, WEEK) is held


def test_users_beyond_the_bound_are_dropped_least_used_first() -> None:
    held = {f"u{i:03d}": {"gpu": float(i + 1)} for i in range(MAX_USERS + 10)}
    history = UsageHistory().advance(3600.0, {"gpu": 1.0}, held, WEEK)
    assert len(history.users) == MAX_USERS
    assert "u000" not in history.users
    assert f"u{MAX_USERS + 9:03d}" in history.users


def test_a_user_whose_use_decayed_to_nothing_and_holds_nothing_is_forgotten() -> None:
    history = UsageHistory(Decayed(0.0), {"gone": Decayed(0.0, {})})
    assert "gone" not in history.advance(10.0, {}, {}, WEEK).users


def test_the_status_form_reads_back() -> None:
    history = UsageHistory().advance(DAY, {"gpu": 2.0}, {"alice": {"gpu": 2.0}}, WEEK)
    again = UsageHistory.from_status(history.to_status())
    assert again.queue.at == pytest.approx(DAY)
    assert again.queue.values["gpu"] == pytest.approx(history.queue.values["gpu"], abs=1e-3)
    assert again.users["alice"].values["gpu"] == pytest.approx(
        history.users["alice"].values["gpu"], abs=1e-3
    )


@pytest.mark.parametrize(
    "found",
    [
        None,
        "text",
        [],
        {},
        {"sampledAt": "yesterday"},
        {"sampledAt": True},
        {"sampledAt": float("nan")},
        {"sampledAt": 1.0, "resources": {"gpu": "many"}, "users": "alice"},
        {"sampledAt": 1.0, "resources": {"gpu": -5, "cpu": float("inf"), "x": True}},
        {"sampledAt": 1.0, "users": [{"name": 5}, {"resources": {}}, "bob", {"name": "c"}]},
    ],
)
def test_a_record_that_does_not_read_is_left_out(found: object) -> None:
    history = UsageHistory.from_status(found)
    assert all(v > 0 and math.isfinite(v) for v in history.queue.values.values())
    assert all(d.values for d in history.users.values())


def test_a_huge_record_is_read_bounded() -> None:
    found = {
        "sampledAt": 1.0,
        "resources": {f"r{i}": 1.0 for i in range(10_000)},
        "users": [{"name": "x" * 100_000 + str(i), "resources": {"gpu": 1}} for i in range(500)],
    }
    history = UsageHistory.from_status(found)
    assert len(history.queue.values) <= 32
    assert len(history.users) <= MAX_USERS
    assert all(len(name) <= 256 for name in history.users)


def test_the_share_counts_history_and_holding_over_capacity_and_weight() -> None:
    steady = Decayed(0.0).advance(10 * WEEK, {"gpu": 6.0}, WEEK)  # rate about 6
    capacity = {"gpu": 12.0}
    assert usage_share(steady, {}, capacity, half_life=WEEK) == pytest.approx(0.5, rel=1e-3)
    assert usage_share(steady, {"gpu": 6.0}, capacity, half_life=WEEK) == pytest.approx(
        1.0, rel=1e-3
    )
    assert usage_share(None, {"gpu": 3.0}, capacity, half_life=WEEK, weight=2.0) == 0.125
    assert usage_share(None, {}, {"gpu": 0.0}, half_life=WEEK) == 0.0


rates = st.dictionaries(st.sampled_from(["gpu", "cpu"]), st.floats(0.0, 1e6), max_size=2)


@given(st.lists(st.tuples(st.floats(0.0, 10 * DAY), rates), max_size=12), st.floats(60.0, 4 * WEEK))
def test_decayed_use_is_never_negative_and_never_above_what_was_held(
    steps: list[tuple[float, dict[str, float]]], half_life: float
) -> None:
    decayed, at, held_total = Decayed(0.0), 0.0, {"gpu": 0.0, "cpu": 0.0}
    for gap, held in steps:
        at += gap
        decayed = decayed.advance(at, held, half_life)
        for resource in held_total:
            held_total[resource] += held.get(resource, 0.0) * gap
        for resource, value in decayed.values.items():
            assert 0.0 < value <= held_total[resource] * (1 + 1e-9) + 1e-6
