"""Quota in use, kept on charge and release. Pure, no I/O.

`Charges` holds every admitted AppWrapper's `Charge` and a `QuotaLedger` (usage per queue, cohort,
flavor and resource) that is updated by each charge and each release, never recomputed from
all of them: a cycle's `QuotaView` starts from a copy of it (`QuotaView(tree, usage=...)`),
which costs the size of the tree, not the number of admitted AppWrappers. The ledger's
usage of a node depends only on the totals charged under it, so the order of charges and
releases does not matter (`tests/unit/test_quota_charges.py` checks it against a recompute).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dispatcher.core.quota.model import Charge
from dispatcher.core.quota.tree import QuotaLedger, QuotaTree

__all__ = ["Charges"]


class Charges:
    def __init__(self, tree: QuotaTree, charges: Iterable[Charge] = ()) -> None:
        self.tree = tree
        self.ledger = QuotaLedger(tree)
        self._charges: dict[str, Charge] = {}
        for charge in charges:
            self.charge(charge)

    @property
    def charges(self) -> Mapping[str, Charge]:
        """Every charge held, by AppWrapper key (read-only: change it through `charge`)."""
        return self._charges

    def charge(self, charge: Charge) -> str:
        """Record `charge` (replacing the key's earlier one). Returns the root of the
        cohort tree whose usage changed ("" if its queue is not in the tree)."""
        released = self.release(charge.key)
        self._charges[charge.key] = charge
        node = self.tree.queue_nodes.get(charge.queue)
        if node is None:
            return released
        self.ledger.add(charge.queue, charge.amounts)
        return self.tree.root(node).name

    def release(self, key: str) -> str:
        """Give `key`'s charge back (finished, requeued, deleted, its pods gone). Returns
        the root of the cohort tree that got quota back ("" if none)."""
        charge = self._charges.pop(key, None)
        if charge is None:
            return ""
        node = self.tree.queue_nodes.get(charge.queue)
        if node is None:
            return ""
        self.ledger.add(charge.queue, charge.amounts, -1)
        return self.tree.root(node).name

    def __len__(self) -> int:
        return len(self._charges)
