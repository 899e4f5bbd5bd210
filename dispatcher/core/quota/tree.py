"""The cohort tree and the amounts each queue may use. Pure, no I/O.

Queues are leaves; cohorts are inner nodes and may have a parent cohort and quotas of their
own. The amounts follow the hierarchical model Kueue documents:

- a node's *subtree quota* is its own nominal quota plus what each child puts in: a child
  keeps back `max(0, subtree - lending_limit)` of its subtree (its *guaranteed* part; all of
  it is lendable when it sets no lending limit) and puts the rest into the parent;
- a node's usage beyond its guaranteed part is usage of its parent;
- what a queue may still take is what is left of its guaranteed part plus what its parent
  may still give it, capped by its borrowing limit: `available` walks up the tree.

A queue borrows a (flavor, resource) when its usage there is above its nominal quota.
A cohort that is its own ancestor (a cycle) is cut from its parent here, so nothing ever
loops; every queue under it is reported inactive (`problems`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dispatcher.core.quota.model import FlavorResource, QuotaSetup, ResourceGroup

__all__ = ["QuotaLedger", "QuotaTree", "TreeNode"]


@dataclass(frozen=True, slots=True)
class TreeNode:
    kind: str  # "queue" | "cohort"
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"


class QuotaTree:
    """The structure and the quotas, fixed for one setup; usage lives in a `QuotaLedger`."""

    def __init__(self, setup: QuotaSetup) -> None:
        self.setup = setup
        self.parent: dict[TreeNode, TreeNode | None] = {}
        self.children: dict[TreeNode, list[TreeNode]] = {}
        self.nominal: dict[TreeNode, dict[FlavorResource, int]] = {}
        self.borrowing_limit: dict[TreeNode, dict[FlavorResource, int]] = {}
        self.lending_limit: dict[TreeNode, dict[FlavorResource, int]] = {}
        self.weight: dict[TreeNode, float] = {}
        self.problems: dict[str, list[str]] = {}  # queue name -> why it is inactive
        self.subtree: dict[TreeNode, dict[FlavorResource, int]] = {}
        self.guaranteed: dict[TreeNode, dict[FlavorResource, int]] = {}
        self._build()
        # Looked up for every question a cycle asks: made once per setup.
        self.queue_nodes = {name: TreeNode("queue", name) for name in setup.queues}
        self.roots = {node: self.path(node)[-1] for node in self.parent}
        self.most: dict[tuple[str, FlavorResource], int] = {}
        """(queue, fr) -> what the queue may take with nothing in use, once asked."""

    # -- structure ----------------------------------------------------------------------

    def _build(self) -> None:
        setup = self.setup
        for name, queue in setup.queues.items():
            node = TreeNode("queue", name)
            self._add(node, queue.groups, queue.weight)
            self.problems[name] = list(queue.problems)
            for group in queue.groups:
                for fq in group.flavors:
                    if fq.flavor not in setup.flavors:
                        self.problems[name].append(f"flavor {fq.flavor} does not exist")
            if queue.cohort:
                self._link(node, self._cohort(queue.cohort))
            else:
                self.parent[node] = None
        for name in list(setup.cohorts):
            self._cohort(name)
        cyclic = self._cut_loops()
        for name in setup.queues:
            path = self.path(TreeNode("queue", name))
            for node in path[1:]:
                if node in cyclic:
                    self.problems[name].append(f"cohort cycle: {cyclic[node]}")
                    break
            for node in path[1:]:
                cohort = setup.cohorts.get(node.name)
                if cohort is not None and cohort.problems:
                    self.problems[name].append(f"cohort {node.name}: {'; '.join(cohort.problems)}")
        for root in [n for n, p in self.parent.items() if p is None]:
            self._amounts(root)

    def _add(self, node: TreeNode, groups: Iterable[ResourceGroup], weight: float) -> None:
        self.children.setdefault(node, [])
        self.weight[node] = weight if weight > 0 else 1.0
        nominal = self.nominal.setdefault(node, {})
        borrowing = self.borrowing_limit.setdefault(node, {})
        lending = self.lending_limit.setdefault(node, {})
        for group in groups:
            for fq in group.flavors:
                for resource, quota in fq.quotas.items():
                    fr = (fq.flavor, resource)
                    nominal[fr] = quota.nominal
                    if quota.borrowing_limit is not None:
                        borrowing[fr] = quota.borrowing_limit
                    if quota.lending_limit is not None:
                        lending[fr] = quota.lending_limit

    def _cohort(self, name: str) -> TreeNode:
        """The cohort's node, made on first mention (a cohort named only by its members
        is a cohort with no quota of its own)."""
        node = TreeNode("cohort", name)
        if node in self.parent:
            return node
        spec = self.setup.cohorts.get(name)
        self._add(node, spec.groups if spec else (), 1.0)  # fair sharing weighs queues
        self.parent[node] = None
        if spec is not None and spec.parent:
            self._link(node, self._cohort(spec.parent))
        return node

    def _link(self, child: TreeNode, parent: TreeNode) -> None:
        self.parent[child] = parent
        self.children.setdefault(parent, []).append(child)

    def _cut_loops(self) -> dict[TreeNode, str]:
        """Cut every cohort cycle; returns each cohort on one with the cycle's text."""
        cyclic: dict[TreeNode, str] = {}
        for start in [n for n in self.parent if n.kind == "cohort"]:
            seen: list[TreeNode] = []
            node: TreeNode | None = start
            while node is not None and node not in seen and node not in cyclic:
                seen.append(node)
                node = self.parent.get(node)
            if node is None or node in cyclic or node not in seen:
                continue
            loop = seen[seen.index(node) :]
            text = " -> ".join(n.name for n in [*loop, node])
            for member in loop:
                cyclic[member] = text
            top = loop[-1]  # its parent closes the loop: cut there
            parent = self.parent[top]
            assert parent is not None
            self.children[parent].remove(top)
            self.parent[top] = None
        return cyclic

    def path(self, node: TreeNode) -> list[TreeNode]:
        """The node and its ancestors, nearest first."""
        path = [node]
        parent = self.parent.get(node)
        while parent is not None:
            path.append(parent)
            parent = self.parent.get(parent)
        return path

    def _amounts(self, node: TreeNode) -> None:
        """Subtree and guaranteed amounts, children first."""
        subtree = dict(self.nominal[node])
        for child in self.children[node]:
            self._amounts(child)
            for fr, amount in self.subtree[child].items():
                subtree[fr] = subtree.get(fr, 0) + amount - self.guaranteed[child].get(fr, 0)
        self.subtree[node] = subtree
        lending = self.lending_limit[node]
        self.guaranteed[node] = {
            fr: max(0, amount - lending[fr]) for fr, amount in subtree.items() if fr in lending
        }

    def root(self, node: TreeNode) -> TreeNode:
        return self.roots[node]

    def queues_under(self, node: TreeNode) -> list[str]:
        if node.kind == "queue":
            return [node.name]
        return [q for child in self.children[node] for q in self.queues_under(child)]


class QuotaLedger:
    """Usage of every node of a tree, and what each queue may still take. Mutable: one
    scheduling cycle adds its admissions and tries its evictions on one ledger."""

    def __init__(self, tree: QuotaTree) -> None:
        self.tree = tree
        self.usage: dict[TreeNode, dict[FlavorResource, int]] = {n: {} for n in tree.parent}
        self._shares: dict[str, float] = {}  # a queue's share depends on its usage alone
        # (node, fr) -> what the node may still take, until the next charge: queues of one
        # cohort share their parent's answer.
        self._available_memo: dict[tuple[TreeNode, FlavorResource], int] = {}

    def copy(self) -> QuotaLedger:
        other = QuotaLedger.__new__(QuotaLedger)
        other.tree = self.tree
        other.usage = {node: dict(usage) for node, usage in self.usage.items()}
        other._shares = dict(self._shares)
        other._available_memo = {}
        return other

    def add(self, queue: str, amounts: Mapping[FlavorResource, int], sign: int = 1) -> None:
        """Charge (sign 1) or give back (sign -1) `amounts` to `queue` and, past each
        node's guaranteed part, to its ancestors."""
        tree = self.tree
        self._shares.pop(queue, None)
        self._available_memo.clear()
        start = tree.queue_nodes[queue]
        for fr, amount in amounts.items():
            node: TreeNode | None = start
            delta = sign * amount
            while node is not None and delta:
                usage = self.usage[node]
                guaranteed = tree.guaranteed[node].get(fr, 0)
                before = max(0, usage.get(fr, 0) - guaranteed)
                usage[fr] = usage.get(fr, 0) + delta
                delta = max(0, usage[fr] - guaranteed) - before
                node = tree.parent[node]

    def used(self, queue: str, fr: FlavorResource) -> int:
        return self.usage[self.tree.queue_nodes[queue]].get(fr, 0)

    def available(self, queue: str, fr: FlavorResource, *, empty: bool = False) -> int:
        """What `queue` may still take of `fr`: its own left, plus what its cohort can
        lend it, within its borrowing limit (with `empty`, as if nothing were in use)."""
        if empty:
            most = self.tree.most
            key = (queue, fr)
            if key not in most:
                most[key] = self._available(self.tree.queue_nodes[queue], fr, True)
            return most[key]
        return self._available(self.tree.queue_nodes[queue], fr, False)

    def _available(self, node: TreeNode, fr: FlavorResource, empty: bool) -> int:
        tree = self.tree
        usage = 0 if empty else self.usage[node].get(fr, 0)
        parent = tree.parent[node]
        if parent is None:
            return tree.subtree[node].get(fr, 0) - usage
        guaranteed = tree.guaranteed[node].get(fr, 0)
        local = max(0, guaranteed - usage)
        if empty:
            from_parent = self._available(parent, fr, empty)
        else:
            memo = self._available_memo
            key = (parent, fr)
            if key in memo:
                from_parent = memo[key]
            else:
                from_parent = memo[key] = self._available(parent, fr, empty)
        limit = tree.borrowing_limit[node].get(fr)
        if limit is not None:
            lent_in = tree.subtree[node].get(fr, 0) - guaranteed
            used_in = max(0, usage - guaranteed)
            from_parent = min(from_parent, lent_in - used_in + limit)
        return local + from_parent

    def borrowed(self, queue: str, fr: FlavorResource) -> int:
        node = self.tree.queue_nodes[queue]
        return max(0, self.usage[node].get(fr, 0) - self.tree.nominal[node].get(fr, 0))

    def borrowing(self, queue: str) -> bool:
        node = self.tree.queue_nodes[queue]
        nominal = self.tree.nominal[node]
        return any(used > nominal.get(fr, 0) for fr, used in self.usage[node].items())

    def share(self, queue: str) -> float:
        """Fair sharing: the largest part, over its resources, that the queue borrows of
        what its whole tree could lend, divided by its weight (0 when not borrowing)."""
        known = self._shares.get(queue)
        if known is not None:
            return known
        tree = self.tree
        node = tree.queue_nodes[queue]
        root = tree.roots[node]
        best = 0.0
        if root != node:
            for fr, used in self.usage[node].items():
                borrowed = used - tree.nominal[node].get(fr, 0)
                lendable = tree.subtree[root].get(fr, 0)
                if borrowed > 0 and lendable > 0:
                    best = max(best, borrowed / lendable)
        share = self._shares[queue] = best / tree.weight[node]
        return share
