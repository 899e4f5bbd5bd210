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


def test_the_controllers_record_goes_on_from_the_status_it_wrote() -> None:
    """Sampled, written into the queue's status, read back by a new dispatcher: the same
    history, advanced from where it stopped with what is held at its first sample."""
    from dispatcher.controller.quota.usage import UsageHistories
    from dispatcher.core.quota.model import Charge

    held = [
        Charge("ns/a", "team", {("f", "gpu"): 4000}, user="alice"),
        Charge("ns/b", "team", {("f", "gpu"): 2000}, user="bob"),
        Charge("ns/c", "other", {("f", "gpu"): 1000}),
    ]
    first = UsageHistories(WEEK)
    first.sample(0.0, ["team", "other"], held, lambda name: None)
    first.sample(DAY, ["team", "other"], held, lambda name: None)
    written = {"status": {"usageHistory": first.status_of("team")}}
    assert first.histories()["team"].users.keys() == {"alice", "bob"}
    assert first.histories()["other"].users == {}  # work with no signed creator is nobody's

    again = UsageHistories(WEEK)  # a restart: nothing in memory, the status read back
    again.sample(2 * DAY, ["team"], held, lambda name: written if name == "team" else None)
    straight = UsageHistories(WEEK)
    straight.sample(0.0, ["team"], held, lambda name: None)
    straight.sample(2 * DAY, ["team"], held, lambda name: None)
    for user in ("alice", "bob"):
        assert again.histories()["team"].users[user].values["gpu"] == pytest.approx(
            straight.histories()["team"].users[user].values["gpu"], rel=1e-6
        )
    assert again.histories()["team"].queue.values["gpu"] == pytest.approx(
        straight.histories()["team"].queue.values["gpu"], rel=1e-6
    )
    assert "other" not in again.histories()  # a queue gone is forgotten


def test_a_record_from_a_clock_ahead_counts_from_now() -> None:
    ahead = UsageHistory(Decayed(DAY, {"gpu": 5.0}), {"alice": Decayed(DAY, {"gpu": 5.0})})
    now = ahead.not_after(DAY - 100.0)
    assert now.queue == Decayed(DAY - 100.0, {"gpu": 5.0})
    later = now.advance(DAY - 50.0, {"gpu": 1.0}, {"alice": {"gpu": 1.0}}, WEEK)
    assert later.queue.values["gpu"] > 5.0 * 0.999
    assert later.users["alice"].values["gpu"] > 5.0 * 0.999


def test_each_interval_counts_what_was_held_during_it() -> None:
    from dispatcher.controller.quota.usage import UsageHistories
    from dispatcher.core.quota.model import Charge

    record = UsageHistories(WEEK)
    record.sample(0.0, ["team"], [], lambda name: None)
    held = [Charge("ns/a", "team", {("f", "gpu"): 4000}, user="alice")]
    record.sample(DAY, ["team"], held, lambda name: None)  # nothing was held until now
    assert record.histories()["team"].queue.values == {}
    record.sample(2 * DAY, ["team"], [], lambda name: None)  # 4 held for the day since
    want = Decayed(DAY).advance(2 * DAY, {"gpu": 4000.0}, WEEK).values["gpu"]
    assert record.histories()["team"].queue.values["gpu"] == pytest.approx(want)
    assert record.histories()["team"].users["alice"].values["gpu"] == pytest.approx(want)


def test_a_queue_without_a_record_used_nothing_before_it_was_first_sampled() -> None:
    from dispatcher.controller.quota.usage import UsageHistories
    from dispatcher.core.quota.model import Charge

    record = UsageHistories(WEEK)
    held = [Charge("ns/a", "team", {("f", "gpu"): 4000})]
    record.sample(1.8e9, ["team"], held, lambda name: {"status": {}})
    assert record.histories()["team"].queue == Decayed(1.8e9, {})
