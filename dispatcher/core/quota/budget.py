"""Budgets: at most so many resource-hours (GPU-hours, say) per queue per period. Pure, no I/O.

A cluster queue's `Budget` names one resource, an amount of it times hours, and a period: a
calendar `Day`, `Week` (from Monday) or `Month` in UTC, or a `Rolling` window of so many hours
ending now. `Spent` is what the queue's admitted AppWrappers held of the resource, integrated
over time, since the period began (for a rolling window, per slice of a 48th of it, the slices
older than the window dropped): the controller samples it as it samples use over time
(`core.quota.history`), and keeps it in the queue's status.

Admission (`refusal`): a workload that declares a limit (`dispatchDuration.limit`) is admitted
only if what was spent, plus what the running work's declared limits may still spend
(`committed`), plus what it may spend itself (its request times its limit) fits the amount:
so work with limits never overdraws it. A workload without a limit cannot say what it will
spend: it is admitted while anything is left, and once the budget is spent the queue's
`WhenExhausted` decides for the running ones: `Finish` lets them run on (the budget is then
overdrawn by what they spend), `Stop` has them evicted and requeued (`to_stop`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

__all__ = [
    "HOUR",
    "Budget",
    "BudgetPeriod",
    "Spent",
    "WhenExhausted",
    "committed",
    "period_start",
]

SLICES = 48
"""A rolling window is kept in this many slices: what left the window leaves it by slices."""

HOUR = 3600.0


class BudgetPeriod(StrEnum):
    DAY = "Day"
    WEEK = "Week"
    MONTH = "Month"
    ROLLING = "Rolling"


class WhenExhausted(StrEnum):
    """What running work without a declared limit does once the budget is spent."""

    FINISH = "Finish"
    STOP = "Stop"


@dataclass(frozen=True, slots=True)
class Budget:
    """`amount` milli-units x seconds of `resource` per `period` (`window` seconds for a
    rolling one)."""

    resource: str
    amount: float
    period: BudgetPeriod = BudgetPeriod.WEEK
    window: float = 7 * 24 * HOUR
    when_exhausted: WhenExhausted = WhenExhausted.FINISH


def period_start(now: float, budget: Budget) -> float:
    """When the period `now` falls in began (seconds since the epoch, UTC); a rolling
    window's start is `now` minus its length."""
    if budget.period is BudgetPeriod.ROLLING:
        return now - budget.window
    moment = datetime.fromtimestamp(now, UTC)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if budget.period is BudgetPeriod.DAY:
        return day.timestamp()
    if budget.period is BudgetPeriod.WEEK:
        return (day - timedelta(days=day.weekday())).timestamp()
    return day.replace(day=1).timestamp()


@dataclass(frozen=True, slots=True)
class Spent:
    """What a queue spent of its budget's resource (milli-units x seconds) as of `at` (None:
    never sampled): per slice start, for a rolling window; per period's start, otherwise."""

    at: float | None = None
    slices: Mapping[float, float] = field(default_factory=dict)

    def total(self, budget: Budget, now: float) -> float:
        """Spent in the period `now` falls in (what fell out of it not counted)."""
        start = period_start(now, budget)
        if budget.period is BudgetPeriod.ROLLING:
            size = budget.window / SLICES
            return sum(v for s, v in self.slices.items() if s + size > start)
        return sum(v for s, v in self.slices.items() if s >= start)

    def advance(self, now: float, held: float, budget: Budget) -> Spent:
        """As of `now`, `held` (milli-units of the resource) having been held since `at`;
        a period's turn in between splits it, and what is older than the period goes."""
        if self.at is None or now <= self.at:  # a first sample, or a clock that stepped back
            since = now if self.at is None else self.at
            return Spent(since, self._kept(budget, since))
        slices = dict(self.slices)
        begin = self.at
        while begin < now:
            key = self._slice(begin, budget)
            end = min(now, self._slice_end(key, budget))
            if held > 0:
                slices[key] = slices.get(key, 0.0) + held * (end - begin)
            begin = end
        return Spent(now, Spent(now, slices)._kept(budget, now))

    def _slice(self, at: float, budget: Budget) -> float:
        if budget.period is BudgetPeriod.ROLLING:
            size = budget.window / SLICES
            return math.floor(at / size) * size
        return period_start(at, budget)

    def _slice_end(self, key: float, budget: Budget) -> float:
        if budget.period is BudgetPeriod.ROLLING:
            return key + budget.window / SLICES
        days = {BudgetPeriod.DAY: 1, BudgetPeriod.WEEK: 7, BudgetPeriod.MONTH: 32}[budget.period]
        return period_start(key + days * 24 * HOUR, budget)  # the next period's start

    def _kept(self, budget: Budget, now: float) -> dict[float, float]:
        start = period_start(now, budget)
        if budget.period is BudgetPeriod.ROLLING:
            size = budget.window / SLICES
            return {s: v for s, v in self.slices.items() if s + size > start}
        return {s: v for s, v in self.slices.items() if s >= start}

    def to_status(self, budget: Budget, now: float) -> dict[str, Any]:
        spent = self.total(budget, now)
        return {
            "sampledAt": None if self.at is None else round(self.at, 3),
            "periodStart": round(period_start(now, budget), 3),
            "slices": [[round(s, 3), round(v, 3)] for s, v in sorted(self.slices.items())],
            "spentHours": round(spent / 1000 / HOUR, 3),
            "remainingHours": round(max(0.0, budget.amount - spent) / 1000 / HOUR, 3),
        }

    @classmethod
    def from_status(cls, found: object) -> Spent:
        """Read back; whatever does not read is left out (never trusted)."""
        if not isinstance(found, Mapping):
            return cls()
        at = found.get("sampledAt")
        if isinstance(at, bool) or not isinstance(at, int | float) or not math.isfinite(at):
            return cls()
        slices: dict[float, float] = {}
        listed = found.get("slices")
        for entry in listed[: SLICES + 1] if isinstance(listed, list) else ():
            readable = isinstance(entry, list) and len(entry) == 2
            if readable and all(_number(v) for v in entry) and entry[1] > 0:
                slices[float(entry[0])] = float(entry[1])
        return cls(float(at), slices)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def to_stop(
    budget: Budget, spent: Spent, now: float, running: Iterable[tuple[str, float | None]]
) -> list[str]:
    """The running work (key, declared limit) a `Stop` budget has evicted once it is spent
    in the period `now` falls in: what declares no limit (work with one ends by it, and was
    admitted only if that fit)."""
    if budget.when_exhausted is not WhenExhausted.STOP or spent.total(budget, now) < budget.amount:
        return []
    return [key for key, limit in running if limit is None]


def committed(running: Iterable[tuple[float, float | None, float]], now: float) -> float:
    """What running work with declared limits may still spend: each (admitted at, limit
    seconds or None, milli-units held) its amount times the time its limit leaves."""
    total = 0.0
    for admitted_at, limit, held in running:
        if limit is not None:
            total += held * max(0.0, admitted_at + limit - now)
    return total
