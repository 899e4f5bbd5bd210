"""The quota side of choosing preemption victims. Pure, no I/O.

`QuotaRules` is handed to the one victim search (`scheduling.preemption`) when the
preemptor is in a cluster queue: it says who may be a victim under the queue's policies,
in which order they are tried, and whether the preemptor's quota fits once victims are
gone. The search then takes victims until quota and capacity both fit, and gives back
every victim that is not needed for either.

Who may be a victim of a preemptor P in cluster queue Q (always only preemptible work):
- in Q: by `withinClusterQueue` (lower priority; or also equal priority admitted after P
  was created);
- in another queue of Q's cohort tree: by `reclaimWithinCohort` (lower priority, or any),
  only while that queue borrows what P needs (a queue within its nominal quota is never
  preempted for another's sake); if P would itself borrow, only by
  `borrowWithinCohort` (lower priority, up to its threshold);
- with no queue (admitted on capacity alone): lower priority, as without quotas;
- in a queue outside Q's tree: never (quota already keeps them apart).
With fair sharing (and `fair_sharing_preemption`), priorities do not limit reclaim within the
cohort: another queue's work may be taken while that queue, without it, would still hold at
least the weighted share the preemptor's queue holds once admitted.
Other queues' work is tried first (reclaiming what was lent), then lowest priority, then
the least runtime lost (since its dispatch or its last declared checkpoint), then most
recently dispatched. Work still within its minimum runtime is no victim under any policy:
the search leaves it out before asking these rules (`scheduling.preemption`), so a queue's
policies never reach a protected AppWrapper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dispatcher.core.model import DispatchedWorkload, Workload
from dispatcher.core.quota.flavors import Assignment
from dispatcher.core.quota.model import (
    BorrowPreemption,
    Charge,
    QueueSpec,
    Reclaim,
    WithinQueue,
)
from dispatcher.core.quota.tree import QuotaLedger, TreeNode

__all__ = ["CapacityOnly", "QuotaRules"]


@dataclass
class QuotaRules:
    workload: Workload
    queue: QueueSpec
    assignment: Assignment
    ledger: QuotaLedger  # a copy: the search charges and gives back on it
    charges: Mapping[str, Charge]
    fair: bool = False  # fair sharing with preemption: shares, not priorities, decide reclaim

    def allowed(self, candidate: DispatchedWorkload) -> bool:
        """Whether the queue's policies let the preemptor evict `candidate` at all."""
        if not candidate.preemptible:
            return False
        mine = self.workload
        charge = self.charges.get(candidate.key)
        if charge is None:
            return candidate.priority < mine.priority
        queue = self.queue
        if charge.queue == queue.name:
            if candidate.priority < mine.priority:
                return queue.within is not WithinQueue.NEVER
            return (
                queue.within is WithinQueue.LOWER_OR_NEWER_EQUAL
                and candidate.priority == mine.priority
                and charge.admitted_at > mine.created_at
            )
        tree = self.ledger.tree
        other = TreeNode("queue", charge.queue)
        if other not in tree.parent:
            return False
        root = tree.root(TreeNode("queue", queue.name))
        if root.kind != "cohort" or tree.root(other) != root:
            return False
        if queue.reclaim is Reclaim.NEVER:
            return False
        if self.fair:
            return True  # `still_allowed` compares the shares as victims are taken
        if queue.reclaim is Reclaim.LOWER_PRIORITY and candidate.priority >= mine.priority:
            return False
        if self.assignment.borrows:
            if queue.borrow_preemption is BorrowPreemption.NEVER:
                return False
            threshold = queue.borrow_threshold
            return candidate.priority < mine.priority and (
                threshold is None or candidate.priority <= threshold
            )
        return True

    def order(self, candidate: DispatchedWorkload) -> int:
        charge = self.charges.get(candidate.key)
        return 0 if charge is not None and charge.queue != self.queue.name else 1

    def still_allowed(self, candidate: DispatchedWorkload) -> bool:
        """Another queue's work stays a victim only while its queue still borrows some
        of what the preemptor needs (with the victims taken so far given back)."""
        charge = self.charges.get(candidate.key)
        if charge is None or charge.queue == self.queue.name:
            return True
        if not any(self.ledger.borrowed(charge.queue, fr) > 0 for fr in self.assignment.amounts):
            return False
        if not self.fair:
            return True
        # Fair sharing: take from a queue only while it would keep at least the share the
        # preemptor's queue will have once admitted (so the two never trade places back).
        ledger = self.ledger
        ledger.add(self.queue.name, self.assignment.amounts)
        mine = ledger.share(self.queue.name)
        ledger.add(self.queue.name, self.assignment.amounts, -1)
        ledger.add(charge.queue, charge.amounts, -1)
        theirs = ledger.share(charge.queue)
        ledger.add(charge.queue, charge.amounts)
        return theirs >= mine

    def evict(self, key: str) -> Callable[[], None]:
        """Give back `key`'s charge on the ledger; returns the undo."""
        charge = self.charges.get(key)
        if charge is None:
            return lambda: None
        self.ledger.add(charge.queue, charge.amounts, -1)
        return lambda: self.ledger.add(charge.queue, charge.amounts)

    def fits(self) -> bool:
        return all(
            self.ledger.available(self.queue.name, fr) >= amount
            for fr, amount in self.assignment.amounts.items()
        )

    def fits_without(self, keys: Iterable[str]) -> bool:
        undo = [self.evict(key) for key in keys]
        try:
            return self.fits()
        finally:
            for step in reversed(undo):
                step()


@dataclass
class CapacityOnly:
    """The rules for a preemptor with no queue, when queues exist: capacity is all it
    needs, and work admitted through a queue is not its to take (that queue's quota
    guarantees it); lower-priority work with no queue is, as without quotas."""

    workload: Workload
    charges: Mapping[str, Charge]

    def allowed(self, candidate: DispatchedWorkload) -> bool:
        return (
            candidate.preemptible
            and candidate.priority < self.workload.priority
            and candidate.key not in self.charges
        )

    def order(self, candidate: DispatchedWorkload) -> int:
        return 1

    def still_allowed(self, candidate: DispatchedWorkload) -> bool:
        return True

    def evict(self, key: str) -> Callable[[], None]:
        return lambda: None

    def fits(self) -> bool:
        return True

    def fits_without(self, keys: Iterable[str]) -> bool:
        return True
