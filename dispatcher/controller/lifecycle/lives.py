"""The ledger of AppWrapper lives: how many hold each state, what each life cost (hops:
reconciles, scheduler cycles, status writes), and, when a life ends, who forgets it.

Side effects: a log line per finished life (`lifecycle_hops`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Hops:
    """What one AppWrapper's life cost the controller, counted until it finished."""

    reconciles: int
    cycles: int
    writes: int


class Lives:
    def __init__(
        self,
        *,
        cycles: Counter[str],
        writes: Counter[str],
        live: Callable[[str], bool],
        on_finished: Sequence[Callable[[str], None]],
        on_deleted: Sequence[Callable[[str], None]],
    ) -> None:
        """`cycles` and `writes`: the scheduler's and the status writer's counts per key;
        `live`: whether a key is known and not finished (only those count hops);
        `on_finished`: what each part drops when a life ends; `on_deleted`: when it is gone."""
        self._cycles = cycles
        self._writes = writes
        self._live = live
        self._on_finished = on_finished
        self._on_deleted = on_deleted
        self.states: Counter[str] = Counter()
        """AppWrappers in the cache by status.state, kept by the watch (metrics)."""
        self.reconciles: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        """Sums of hops over the AppWrappers that finished: reconciles, cycles, writes, count."""
        self._log = structlog.get_logger("ledger")

    def observed(self, old: Obj | None, new: Obj | None) -> None:
        """The watch replaced `old` by `new` (either None: added, deleted)."""
        if old is not None:
            self.states[_state_of(old)] -= 1
        if new is not None:
            self.states[_state_of(new)] += 1

    def reconciled(self, key: str) -> None:
        """A worker took `key`: a hop, while it lives (gone or finished, it was counted)."""
        if self._live(key):
            self.reconciles[key] += 1

    def finish(self, key: str) -> None:
        """Its life ended: count its hops; drop what only a live AppWrapper needs."""
        hops = Hops(
            reconciles=self.reconciles.pop(key, 0),
            cycles=self._cycles.pop(key, 0),
            writes=self._writes.pop(key, 0),
        )
        self.finished.update(
            reconciles=hops.reconciles, cycles=hops.cycles, writes=hops.writes, count=1
        )
        self._log.info(
            "lifecycle_hops",
            appwrapper=key,
            reconciles=hops.reconciles,
            cycles=hops.cycles,
            writes=hops.writes,
        )
        for forget in self._on_finished:
            forget(key)

    def delete(self, key: str) -> None:
        """It is gone from the hub: nothing about it is kept."""
        self.reconciles.pop(key, None)
        self._cycles.pop(key, None)
        for forget in self._on_deleted:
            forget(key)


def _state_of(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("state") or "New")
