"""Budgets (core/quota/budget.py): periods, what was spent, what running work may still spend."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.core.model import QueueMode, Workload
from dispatcher.core.quota.budget import (
    SLICES,
    Budget,
    BudgetPeriod,
    Spent,
    WhenExhausted,
    committed,
    period_start,
    to_stop,
)
from dispatcher.core.quota.model import Charge
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import CycleResult, schedule
from tests.unit.builders import cluster, node, pods, workload
from tests.unit.quota_builders import charge, queue, setup

HOUR = 3600.0
WED = datetime(2026, 11, 25, 15, 30, tzinfo=UTC).timestamp()  # a Wednesday afternoon


def at(*when: int) -> float:
    return datetime(*when, tzinfo=UTC).timestamp()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("period", "want"),
    [
        (BudgetPeriod.DAY, at(2026, 11, 25)),
        (BudgetPeriod.WEEK, at(2026, 11, 23)),  # Monday
        (BudgetPeriod.MONTH, at(2026, 11, 1)),
        (BudgetPeriod.ROLLING, WED - 10 * HOUR),
    ],
)
def test_the_period_now_falls_in(period: BudgetPeriod, want: float) -> None:
    assert period_start(WED, Budget("gpu", 1.0, period, window=10 * HOUR)) == want


def test_what_was_spent_counts_in_its_period_and_a_turn_renews_it() -> None:
    daily = Budget("gpu", 100.0, BudgetPeriod.DAY)
    spent = Spent().advance(at(2026, 11, 25, 22), 0.0, daily)  # first sample: nothing before
    spent = spent.advance(at(2026, 11, 26, 2), 8000.0, daily)  # 2 h before midnight, 2 after
    assert spent.total(daily, at(2026, 11, 26, 2)) == 8000.0 * 2 * HOUR
    assert list(spent.slices) == [at(2026, 11, 26)]  # the 25th's 2 h left with its day
    later = spent.advance(at(2026, 11, 27, 1), 0.0, daily)
    assert later.total(daily, at(2026, 11, 27, 1)) == 0.0  # a new day: renewed
    assert list(later.slices) == []


def test_a_rolling_window_lets_old_spending_go_slice_by_slice() -> None:
    rolling = Budget("gpu", 1.0, BudgetPeriod.ROLLING, window=48 * HOUR)
    spent = Spent().advance(0.0, 0.0, rolling).advance(HOUR, 1000.0, rolling)
    assert spent.total(rolling, HOUR) == 1000.0 * HOUR
    assert spent.total(rolling, 48 * HOUR) == 1000.0 * HOUR  # still inside
    assert spent.total(rolling, 49 * HOUR + 1) == 0.0  # its slice left the window


def test_running_work_commits_what_its_limit_leaves() -> None:
    running = [(0.0, 100.0, 2000.0), (50.0, None, 9999.0), (0.0, 10.0, 1000.0)]
    assert committed(running, 40.0) == 2000.0 * 60


def test_the_status_form_reads_back_and_a_bad_one_is_left_out() -> None:
    weekly = Budget("gpu", 50 * 1000 * HOUR, BudgetPeriod.WEEK)
    spent = Spent().advance(WED, 0.0, weekly).advance(WED + HOUR, 4000.0, weekly)
    status = spent.to_status(weekly, WED + HOUR)
    assert status["spentHours"] == 4.0
    assert status["remainingHours"] == 46.0
    assert Spent.from_status(status) == spent
    for bad in (None, [], {"sampledAt": "x"}, {"sampledAt": 1.0, "slices": [[1, "a"], "b", [2]]}):
        assert Spent.from_status(bad).slices == {}


@given(
    st.sampled_from(list(BudgetPeriod)),
    st.lists(st.tuples(st.floats(1.0, 40 * HOUR), st.floats(0.0, 1e6)), max_size=15),
)
def test_spent_is_never_more_than_what_was_held_nor_negative(
    period: BudgetPeriod, steps: list[tuple[float, float]]
) -> None:
    budget = Budget("gpu", 1.0, period, window=24 * HOUR)
    now = WED
    spent = Spent().advance(now, 0.0, budget)
    held_total = 0.0
    for gap, held in steps:
        now += gap
        spent = spent.advance(now, held, budget)
        held_total += gap * held
        total = spent.total(budget, now)
        assert 0.0 <= total <= held_total * (1 + 1e-6) + 1e-3
        assert len(spent.slices) <= SLICES + 1


# -- held to in a cycle (core/quota/view.py `budget_refusal`) ---------------------------------

TEN_HOURS = Budget("cpu", 10 * 1000 * HOUR, BudgetPeriod.WEEK)  # 10 cpu-hours a week


def job(key: str, limit_hours: float | None, at_: float = 0.0) -> Workload:
    made = workload(key, pods(1, cpu=1, name=f"Job/{key}"), queue="team", created_at=at_)
    return replace(made, duration_limit=None if limit_hours is None else limit_hours * HOUR)


def run_budget(
    pending: list[Workload], spent: Spent | None = None, charges: list[Charge] = ()
) -> CycleResult:
    quotas = setup(queue("team", {"cpu": "64"}, budget=TEN_HOURS))
    return schedule(
        pending,
        [cluster("c", node("n1", cpu=64))],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=WED,
        starvation_after=1e9,
        preemption=None,
        quotas=QuotaView(QuotaTree(quotas), charges, spent={"team": spent} if spent else {}),
    )


def test_work_with_limits_is_admitted_while_what_it_may_spend_fits() -> None:
    result = run_budget([job("ns/a", 4), job("ns/b", 4, 1), job("ns/c", 4, 2), job("ns/d", 2, 3)])
    assert [a.key for a in result.admits] == ["ns/a", "ns/b", "ns/d"]
    assert {w.key: w.message for w in result.waits}["ns/c"] == (
        "queue team: its budget of 10 cpu-hours per week has too little left for what it may"
        " spend: up to 4 cpu-hours (its declared limit)"
    )


def test_what_was_spent_and_what_running_work_may_spend_count() -> None:
    spent = Spent(WED, {period_start(WED, TEN_HOURS): 5 * 1000 * HOUR})  # 5 h spent
    running = [
        replace(charge("ns/r", "team", {"cpu": "1"}, admitted_at=WED - HOUR), limit=4 * HOUR)
    ]
    result = run_budget([job("ns/a", 3), job("ns/b", 2, 1)], spent, running)  # 3 h committed
    assert [a.key for a in result.admits] == ["ns/b"]


def test_work_without_a_limit_runs_while_anything_is_left() -> None:
    almost = Spent(WED, {period_start(WED, TEN_HOURS): 9.5 * 1000 * HOUR})
    assert [a.key for a in run_budget([job("ns/x", None)], almost).admits] == ["ns/x"]
    gone = Spent(WED, {period_start(WED, TEN_HOURS): 10 * 1000 * HOUR})
    result = run_budget([job("ns/x", None)], gone)
    assert result.admits == ()
    assert result.waits[0].message == (
        "queue team: its budget of 10 cpu-hours per week is spent, and it declares no limit"
    )


def test_last_weeks_spending_is_not_this_weeks() -> None:
    last_week = Spent(WED, {period_start(WED - 7 * 24 * HOUR, TEN_HOURS): 10 * 1000 * HOUR})
    assert [a.key for a in run_budget([job("ns/a", 4)], last_week).admits] == ["ns/a"]


@given(st.lists(st.tuples(st.integers(1, 4), st.sampled_from([1.0, 2.0, 5.0])), max_size=30))
def test_work_with_limits_never_commits_past_the_budget(jobs: list[tuple[int, float]]) -> None:
    pending = [
        replace(job(f"ns/w{i}", hours, i), pod_sets=(pods(1, cpu=cpu, name=f"Job/w{i}"),))
        for i, (cpu, hours) in enumerate(jobs)
    ]
    result = run_budget(pending)
    by_key = {w.key: w for w in pending}
    committed_total = sum(
        by_key[a.key].pod_sets[0].requests["cpu"] * (by_key[a.key].duration_limit or 0.0)
        for a in result.admits
    )
    assert committed_total <= TEN_HOURS.amount


def test_a_spent_stop_budget_stops_running_work_without_a_limit() -> None:
    stop = Budget("cpu", 10 * 1000 * HOUR, BudgetPeriod.WEEK, when_exhausted=WhenExhausted.STOP)
    spent = Spent(WED, {period_start(WED, stop): 10 * 1000 * HOUR})
    running = [("ns/open", None), ("ns/bounded", 3600.0)]
    assert to_stop(stop, spent, WED, running) == ["ns/open"]
    finish = replace(stop, when_exhausted=WhenExhausted.FINISH)
    assert to_stop(finish, spent, WED, running) == []
    some_left = Spent(WED, {period_start(WED, stop): 9 * 1000 * HOUR})
    assert to_stop(stop, some_left, WED, running) == []
