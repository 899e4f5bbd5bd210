"""What the scheduler publishes after each cycle for those who only read it.

No I/O. The queues' status (quota/objects.py), the metrics' pending figures and the manager's
draining check read a `SchedulerView`; none of them reaches into the scheduler's state or
makes it refresh. The scheduler builds one on the first read after a cycle and hands the same
frozen copy to every read until the next (`Scheduler.view`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dispatcher.core.model import Workload
from dispatcher.core.quota.model import Charge
from dispatcher.core.scheduling import Wait


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """The state a cycle left: the charges held (by key; those still charged while a
    requeued one's pods go are `releasing`), the AppQueue each was admitted through, the
    pending workloads with their last waits, and what holds room."""

    cycle: int = 0
    """The cycle that left it (0: none has run)."""
    charges: Mapping[str, Charge] = field(default_factory=dict)
    local_of: Mapping[str, str] = field(default_factory=dict)
    releasing: frozenset[str] = frozenset()
    pending: tuple[Workload, ...] = ()
    waits: Mapping[str, Wait] = field(default_factory=dict)
    """The last wait of each pending one that a cycle judged."""
    running: tuple[tuple[str, float, str], ...] = ()
    """(key, dispatched at, cluster queue or "") of each one that holds room."""

    def admitted_in(self, queues: set[str], locals_: set[str]) -> list[str]:
        """Keys charged to one of `queues` or admitted through one of `locals_` (not those
        only releasing a requeued dispatch's charge)."""
        return [
            key
            for key, charge in self.charges.items()
            if key not in self.releasing
            and (charge.queue in queues or self.local_of.get(key, "") in locals_)
        ]


EMPTY = SchedulerView()
