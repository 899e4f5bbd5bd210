"""Each cluster queue's use over time, for fair sharing in `Usage` mode (`core.quota.history`):
kept in memory, written into the queue's status and read back from it. Side effects: none of
its own (the quotas' status write carries what `status_of` gives).

A queue's history is read from its `status.usageHistory` the first time the queue is sampled,
so a restarted dispatcher, or a new leader, goes on from the last write. Each sample advances
it with what the queue's admitted AppWrappers held since the last sample (summed per resource
over flavors, and per user: the signed creator's), and notes what they hold now for the next:
a change of what is held changes what a queue's status shows, so a sample follows it within
the status loop's pace, and the loop also samples every `fair_sharing_sample_seconds`. What
was held while no dispatcher ran is counted as what is held at the first sample after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dispatcher.core.quota.history import Decayed, UsageHistory
from dispatcher.core.quota.model import Charge

__all__ = ["UsageHistories"]

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
        return history.to_status() if history is not None else None

    def histories(self) -> Mapping[str, UsageHistory]:
        """Every queue's history as of the last sample (what a scheduling cycle reads)."""
        return self._published
