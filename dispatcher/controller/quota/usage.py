"""Each cluster queue's use over time, for fair sharing in `Usage` mode (`core.quota.history`),
and what each spent of its budget (`core.quota.budget`): kept in memory, written into the
queue's status and read back from it. Side effects: none of their own (the quotas' status
write carries what `status_of` gives).

A queue's history is read from its `status.usageHistory` the first time the queue is sampled,
so a restarted dispatcher, or a new leader, goes on from the last write. Each sample advances
it with what the queue's admitted AppWrappers held since the last sample (summed per resource
over flavors, and per user: the signed creator's), and notes what they hold now for the next:
a change of what is held changes what a queue's status shows, so a sample follows it within
the status loop's pace, and the loop also samples every `usage_sample_seconds`. What
was held while no dispatcher ran is counted as what is held at the first sample after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dispatcher.core.quota.budget import HOUR, Spent, to_stop
from dispatcher.core.quota.history import Decayed, UsageHistory
from dispatcher.core.quota.model import Charge, QueueSpec

__all__ = ["Budgets", "UsageHistories"]

Obj = dict[str, Any]


class UsageHistories:
    def __init__(self, half_life: float) -> None:
        self._half_life = half_life
        self._kept: dict[str, UsageHistory] = {}
        self._held: dict[str, tuple[dict[str, float], dict[str, dict[str, float]]]] = {}
        """Per queue, what it (and each user) held at the last sample: held until this one."""
        self._published: Mapping[str, UsageHistory] = {}

    def sample(
        self,
        now: float,
        queues: Iterable[str],
        charges: Iterable[Charge],
        stored: Callable[[str], Obj | None],
    ) -> None:
        """Advance every queue of `queues` to `now` with what `charges` hold in it; a queue
        not kept yet starts from its stored status (`stored`: the object by name)."""
        held: dict[str, dict[str, float]] = {}
        by_user: dict[str, dict[str, dict[str, float]]] = {}
        for charge in charges:
            queue = held.setdefault(charge.queue, {})
            user = by_user.setdefault(charge.queue, {}).setdefault(charge.user, {})
            for (_, resource), amount in charge.amounts.items():
                queue[resource] = queue.get(resource, 0.0) + amount
                if charge.user:
                    user[resource] = user.get(resource, 0.0) + amount
        kept: dict[str, UsageHistory] = {}
        holding: dict[str, tuple[dict[str, float], dict[str, dict[str, float]]]] = {}
        for name in queues:
            now_held = (held.get(name, {}), {u: h for u, h in by_user.get(name, {}).items() if u})
            history = self._kept.get(name)
            if history is None:
                obj = stored(name)
                found = ((obj or {}).get("status") or {}).get("usageHistory")
                history = UsageHistory.from_status(found).not_after(now)
                if not history.queue.at:  # no record: nothing used before now
                    history = UsageHistory(Decayed(now))
            before = self._held.get(name, now_held)
            kept[name] = history.advance(now, before[0], before[1], self._half_life)
            holding[name] = now_held
        self._kept, self._held = kept, holding  # a queue deleted is forgotten with its object
        self._published = dict(kept)

    def status_of(self, queue: str) -> Obj | None:
        """The queue's `status.usageHistory` (None: not sampled)."""
        history = self._kept.get(queue)
        if history is None:
            return None
        return {**history.to_status(), "halfLifeSeconds": self._half_life}

    def histories(self) -> Mapping[str, UsageHistory]:
        """Every queue's history as of the last sample (what a scheduling cycle reads)."""
        return self._published


class Budgets:
    """What each cluster queue with a budget spent of it (`core.quota.budget.Spent`), kept
    as its use over time is: read back from `status.budget` the first time the queue is
    sampled, advanced at each sample with what was held since the last, written back."""

    def __init__(self) -> None:
        self._kept: dict[str, Spent] = {}
        self._held: dict[str, float] = {}
        self._published: Mapping[str, Spent] = {}

    def sample(
        self,
        now: float,
        queues: Mapping[str, QueueSpec],
        charges: Iterable[Charge],
        stored: Callable[[str], Obj | None],
    ) -> None:
        budgeted = {name: spec.budget for name, spec in queues.items() if spec.budget}
        if not budgeted and not self._kept:
            return
        held: dict[str, float] = {}
        for charge in charges:
            budget = budgeted.get(charge.queue)
            if budget is not None:
                amount = sum(v for (_, r), v in charge.amounts.items() if r == budget.resource)
                held[charge.queue] = held.get(charge.queue, 0.0) + amount
        kept: dict[str, Spent] = {}
        for name, budget in budgeted.items():
            spent = self._kept.get(name)
            if spent is None:
                found = ((stored(name) or {}).get("status") or {}).get("budget")
                spent = Spent.from_status(found)
                if spent.at is not None and spent.at > now:  # a clock ahead wrote it
                    spent = Spent(now, spent.slices)
            before = self._held.get(name, held.get(name, 0.0))
            kept[name] = spent.advance(now, before, budget)
        self._kept, self._held = kept, {name: held.get(name, 0.0) for name in budgeted}
        self._published = dict(kept)

    def status_of(self, queue: str, spec: QueueSpec) -> Obj | None:
        """The queue's `status.budget` (None: it has no budget, or was not sampled)."""
        spent = self._kept.get(queue)
        if spent is None or spec.budget is None or spent.at is None:
            return None
        return spent.to_status(spec.budget, spent.at)

    def spent(self) -> Mapping[str, Spent]:
        """Each budgeted queue's spending as of the last sample (what a cycle reads)."""
        return self._published

    def to_stop(
        self, now: float, queues: Mapping[str, QueueSpec], charges: Iterable[Charge]
    ) -> list[tuple[str, str]]:
        """(AppWrapper, message) of the running work `Stop` budgets spent as of the last
        sample have evicted (`core.quota.budget.to_stop`)."""
        running: dict[str, list[tuple[str, float | None]]] = {}
        for charge in charges:
            running.setdefault(charge.queue, []).append((charge.key, charge.limit))
        found = []
        for name, spent in self._kept.items():
            spec = queues.get(name)
            if spec is None or spec.budget is None:
                continue
            hours = spec.budget.amount / 1000 / HOUR
            message = (
                f"queue {name}: its budget of {hours:g} {spec.budget.resource}-hours is spent,"
                " and it declares no limit (budget.whenExhausted Stop)"
            )
            for key in to_stop(spec.budget, spent, now, running.get(name, ())):
                found.append((key, message))
        return found
