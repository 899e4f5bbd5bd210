"""One scheduling cycle's view of the quotas: the tree, what admitted work uses, and the
questions the cycle asks. Pure, no I/O.

Built from the setup and the charges of every dispatched AppWrapper (across all member
clusters: quota is accounted in the hub). The cycle resolves each workload's queue, asks
which flavor assignments may take it, charges each admission, and hands the victim search
the queue's rules. Answers about a (queue, request) are remembered until the next charge.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.core.model import Workload
from dispatcher.core.quota.flavors import Assignment, QuotaRefusal, candidates, with_flavors
from dispatcher.core.quota.model import Charge, QueueSpec
from dispatcher.core.quota.resolve import Queued, QueueProblem, resolve
from dispatcher.core.quota.tree import Ledger, Node, QuotaTree
from dispatcher.core.quota.victims import QuotaRules

__all__ = ["QuotaView"]


class QuotaView:
    def __init__(self, tree: QuotaTree, charges: Sequence[Charge] = ()) -> None:
        self.tree = tree
        self.setup = tree.setup
        self.ledger = Ledger(tree)
        self.charges = {c.key: c for c in charges}
        for charge in charges:
            if Node("queue", charge.queue) in tree.parent:
                self.ledger.add(charge.queue, charge.amounts)
        self.version = 0
        self._answers: dict[
            tuple[str, tuple[str, ...]], tuple[int, list[Assignment] | QuotaRefusal]
        ] = {}

    def resolve(self, workload: Workload) -> Queued | QueueProblem | None:
        namespace = workload.key.partition("/")[0]
        return resolve(namespace, workload.queue_name, self.setup, self.tree)

    def spec(self, queue: str) -> QueueSpec:
        return self.setup.queues[queue]

    def candidates(self, queue: str, workload: Workload) -> list[Assignment] | QuotaRefusal:
        key = (queue, workload.shape)
        known = self._answers.get(key)
        if known is not None and known[0] == self.version:
            return known[1]
        found = candidates(self.spec(queue), workload.pod_sets, self.ledger, self.setup.flavors)
        self._answers[key] = (self.version, found)
        return found

    def flavored(self, workload: Workload, assignment: Assignment) -> Workload:
        return with_flavors(workload, assignment.flavors, self.setup.flavors)

    def admit(self, queue: str, assignment: Assignment) -> None:
        self.ledger.add(queue, assignment.amounts)
        self.version += 1

    def rules(self, workload: Workload, queue: str, assignment: Assignment) -> QuotaRules:
        return QuotaRules(
            workload=workload,
            queue=self.spec(queue),
            assignment=assignment,
            ledger=self.ledger.copy(),
            charges=self.charges,
            fair=self.setup.fair_sharing and self.setup.fair_preemption,
        )
