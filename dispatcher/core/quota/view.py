"""One scheduling cycle's view of the quotas: the tree, what admitted work uses, and the
questions the cycle asks. Pure, no I/O.

Built from the setup and the charges of every dispatched AppWrapper (across all member
clusters: quota is accounted in the hub), or from a copy of a `Charges` kept on charge and
release. The cycle resolves each workload's queue, asks
which flavor assignments may take it, charges each admission, and hands the victim search
the queue's rules. Answers about a (queue, request) are remembered until the next charge.
With fair sharing it answers each queue's share, and in `Usage` mode each user's in a
queue, from the queues' usage histories (`core.quota.history`) and what they hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatcher.api.quantity import format_milli
from dispatcher.api.resources import Resources
from dispatcher.core.model import PodSet, QueueMode, Workload
from dispatcher.core.quota.budget import HOUR, BudgetPeriod, Spent, committed
from dispatcher.core.quota.charges import Charges
from dispatcher.core.quota.flavors import (
    Assignment,
    Mode,
    QuotaRefusal,
    candidates,
    flavored,
    request_of,
)
from dispatcher.core.quota.history import UsageHistory, usage_share
from dispatcher.core.quota.model import (
    Charge,
    FairSharingMode,
    FlavorResource,
    QueueSpec,
    UserLimit,
)
from dispatcher.core.quota.resolve import Queued, QueueProblem, resolve
from dispatcher.core.quota.tree import QuotaLedger, QuotaTree
from dispatcher.core.quota.victims import QuotaRules

__all__ = ["QuotaView"]


def _admissible(found: list[Assignment] | QuotaRefusal) -> bool:
    return not isinstance(found, QuotaRefusal) and any(a.admissible for a in found)


class QuotaView:
    def __init__(
        self,
        tree: QuotaTree,
        charges: Sequence[Charge] = (),
        *,
        place_flavors: bool = True,
        usage: Charges | None = None,
        history: Mapping[str, UsageHistory] | None = None,
        spent: Mapping[str, Spent] | None = None,
    ) -> None:
        """`place_flavors` False: fit pods as if flavors selected no nodes (a pooled member
        has none to select; the pods still get the flavor's labels when made). With
        `usage` (kept on charge and release), its ledger is copied and `charges` unused.
        `history`: each queue's use over time (`Usage` fair sharing); `spent`: what each
        queue with a budget spent of it (`core.quota.budget`)."""
        self.tree = tree
        self.history: Mapping[str, UsageHistory] = history or {}
        self.spent: Mapping[str, Spent] = spent or {}
        self._committing: dict[str, float] = {}  # queue -> what this cycle's admissions may spend
        self._budget_base: dict[str, float] = {}  # queue -> spent + what running work may spend
        self._capacity: dict[str, dict[str, float]] = {}  # root cohort -> per resource
        self._users: dict[tuple[str, str], _Held] | None = None
        self._groups: dict[tuple[str, str], _Held] | None = None
        self.place_flavors = place_flavors
        self.setup = tree.setup
        self.version = 0
        self._answers: dict[
            tuple[str, tuple[str, ...]], tuple[int, list[Assignment] | QuotaRefusal]
        ] = {}
        self._resolved: dict[tuple[str, str], Queued | QueueProblem | None] = {}
        self._flavored: dict[tuple[tuple[str, ...], object], tuple[PodSet, ...]] = {}
        self._requests: dict[tuple[str, ...], Resources] = {}
        if usage is not None:
            assert usage.tree is tree, "usage kept for another setup's tree"
            self.ledger = usage.ledger.copy()
            self.charges: Mapping[str, Charge] = usage.charges
            return
        self.ledger = QuotaLedger(tree)
        self.charges = {c.key: c for c in charges}
        # Summed per queue first: the walk up the tree depends only on the running total.
        totals: dict[str, dict[FlavorResource, int]] = {}
        for charge in charges:
            if charge.queue in tree.queue_nodes:
                total = totals.setdefault(charge.queue, {})
                for fr, amount in charge.amounts.items():
                    total[fr] = total.get(fr, 0) + amount
        for queue, total in totals.items():
            self.ledger.add(queue, total)

    def resolve(self, workload: Workload) -> Queued | QueueProblem | None:
        namespace = workload.key.partition("/")[0]
        key = (namespace, workload.queue_name)
        if key not in self._resolved:
            self._resolved[key] = resolve(namespace, workload.queue_name, self.setup, self.tree)
        return self._resolved[key]

    def spec(self, queue: str) -> QueueSpec:
        return self.setup.queues[queue]

    def candidates(self, queue: str, workload: Workload) -> list[Assignment] | QuotaRefusal:
        spec = self.spec(queue)
        shape = spec.charged_shape(workload)
        key = (queue, shape)
        known = self._answers.get(key)
        # Within a cycle usage only grows (victim searches work on copies), so modes only
        # fall: an answer with nothing admissible stays so for the rest of it (its figures
        # may lag), and one whose first assignment keeps its mode still ranks it first
        # (the others are checked again before an admission, `fits`).
        if known is not None:
            if known[0] == self.version or not _admissible(known[1]):
                return known[1]
            first = known[1][0]  # type: ignore[index]
            if first.admissible and self._mode(queue, first) is first.mode:
                self._answers[key] = (self.version, known[1])
                return known[1]
        pods = spec.charged(workload)
        request = self._requests.get(shape)
        if request is None:
            request = self._requests[shape] = request_of(pods)
        found = candidates(spec, pods, self.ledger, self.setup.flavors, request)
        self._answers[key] = (self.version, found)
        return found

    def flavored(self, workload: Workload, assignment: Assignment) -> Workload:
        if not self.place_flavors:
            return workload
        key = (workload.shape, assignment.flavors)
        pod_sets = self._flavored.get(key)
        if pod_sets is None:
            pod_sets = self._flavored[key] = flavored(
                workload.pod_sets, assignment.flavors, self.setup.flavors
            )
        return workload if pod_sets is workload.pod_sets else workload.with_pod_sets(pod_sets)

    def _mode(self, queue: str, assignment: Assignment) -> Mode:
        """What `assignment` is now: FIT within nominal, BORROW, or PREEMPT (no room)."""
        ledger = self.ledger
        nominals = self.tree.nominal[self.tree.queue_nodes[queue]]
        mode = Mode.FIT
        for fr, amount in assignment.amounts.items():
            if amount > ledger.available(queue, fr):
                return Mode.PREEMPT
            if ledger.used(queue, fr) + amount > nominals.get(fr, 0):
                mode = Mode.BORROW
        return mode

    def fits(self, queue: str, assignment: Assignment) -> bool:
        """Whether the queue still has the quota `assignment` charges."""
        return self._mode(queue, assignment) >= Mode.BORROW

    def admit(self, queue: str, assignment: Assignment, workload: Workload | None = None) -> None:
        """Charge `assignment` to `queue` (for `workload`'s user, and against the queue's
        budget what its declared limit may spend)."""
        self.ledger.add(queue, assignment.amounts)
        self.version += 1
        user = workload.user if workload is not None else ""
        if self._users is not None:
            self._users.setdefault((queue, user), _Held()).add(assignment.amounts)
        if self._groups is not None and workload is not None:
            for group in workload.groups:
                self._groups.setdefault((queue, group), _Held()).add(assignment.amounts)
        budget = self.setup.queues[queue].budget
        limit = workload.duration_limit if workload is not None else None
        if budget is not None and limit is not None:
            cost = _held_of(assignment.amounts, budget.resource) * limit
            self._committing[queue] = self._committing.get(queue, 0.0) + cost

    def share(self, queue: str) -> float:
        """Fair sharing: the queue's share (the lowest is served first): `Instant`, what it
        borrows now (`QuotaLedger.share`); `Usage`, its use over time and now."""
        if self.setup.fair_mode is FairSharingMode.INSTANT:
            return self.ledger.share(queue)
        tree = self.tree
        node = tree.queue_nodes[queue]
        holding: dict[str, float] = {}
        _add(holding, self.ledger.usage[node])
        history = self.history.get(queue)
        return usage_share(
            history.queue if history is not None else None,
            holding,
            self._capacity_of(queue),
            half_life=self.setup.half_life,
            weight=tree.weight[node],
        )

    def user_share(self, queue: str, user: str) -> float | None:
        """`Usage` mode, in a BestEffortFIFO queue: `user`'s share of the queue (the lowest
        is served first); None where users are not ordered."""
        setup = self.setup
        if setup.fair_mode is FairSharingMode.INSTANT:
            return None
        if setup.queues[queue].strategy is QueueMode.STRICT_FIFO:
            return None
        history = self.history.get(queue)
        return usage_share(
            history.users.get(user) if history is not None else None,
            self._held_by(queue, user).amounts,
            self._capacity_of(queue),
            half_life=setup.half_life,
        )

    def user_refusal(self, queue: str, workload: Workload) -> QuotaRefusal | None:
        """Why `workload`'s user, or one of their groups, may not have it admitted in
        `queue` now, by the queue's per-user or per-group limits (None: they may). Work with
        no signed record counts as one user, of no group."""
        spec = self.setup.queues[queue]
        checks: list[tuple[UserLimit, _Held, str, str]] = []
        if spec.user_limit is not None:
            who = f"user {workload.user}" if workload.user else "work with no signed creator record"
            held = self._held_by(queue, workload.user)
            checks.append((spec.user_limit, held, f"{who} has", "its per-user limit (userLimits"))
        for group in workload.groups:
            limit = spec.group_limits.get(group)
            if limit is not None:
                held = self._held_by_group(queue, group)
                checks.append(
                    (limit, held, f"group {group} has", f"its limit (groupLimits[{group}]")
                )
        asked = request_of(spec.charged(workload)) if checks else None
        for limit, held, who, field in checks:
            if limit.max_running is not None and held.count >= limit.max_running:
                return QuotaRefusal(
                    f"queue {queue}: {who} {held.count} admitted, {field}.maxRunning"
                    f" {limit.max_running})",
                    user=True,
                )
            assert asked is not None
            for resource, most in limit.max_resources.items():
                wanted = held.amounts.get(resource, 0.0) + asked.get(resource, 0)
                if wanted > most:
                    holder = who.removesuffix(" has")
                    return QuotaRefusal(
                        f"queue {queue}: {holder} would hold {resource}"
                        f" {format_milli(int(wanted), resource)}, over {field}.maxResources"
                        f" {format_milli(most, resource)})",
                        never=asked.get(resource, 0) > most,
                        user=True,
                    )
        return None

    def _held_by_group(self, queue: str, group: str) -> _Held:
        if self._groups is None:
            self._groups = {}
            for charge in self.charges.values():
                for name in charge.groups:
                    self._groups.setdefault((charge.queue, name), _Held()).add(charge.amounts)
        return self._groups.get((queue, group)) or _Held()

    def budget_refusal(self, queue: str, workload: Workload, now: float) -> QuotaRefusal | None:
        """Why the queue's budget keeps `workload` out now (None: it does not). Work with a
        declared limit fits only if what was spent, what running work's limits may still
        spend (this cycle's admissions too, `admit`) and what it may spend itself fit the
        amount; work without one while anything is left (`core.quota.budget`)."""
        budget = self.setup.queues[queue].budget
        if budget is None:
            return None
        resource = budget.resource
        asked = request_of(self.spec(queue).charged(workload)).get(resource, 0)
        limit = workload.duration_limit
        cost = asked * limit if limit is not None else 0.0
        base = self._budget_base.get(queue)
        if base is None:  # once per cycle: the charges change only by this cycle's admissions
            spent = self.spent.get(queue, Spent())
            running = [
                (c.admitted_at, c.limit, _held_of(c.amounts, resource))
                for c in self.charges.values()
                if c.queue == queue
            ]
            since = spent.at if spent.at is not None else now
            unsampled = sum(held for _, _, held in running) * max(0.0, now - since)
            base = spent.total(budget, now) + unsampled + committed(running, now)
            self._budget_base[queue] = base
        bound = base + self._committing.get(queue, 0.0)
        if (limit is not None and bound + cost <= budget.amount) or (
            limit is None and bound < budget.amount
        ):
            return None
        per = (
            budget.period.value.lower()
            if budget.period is not BudgetPeriod.ROLLING
            else f"rolling {budget.window / HOUR:g} hours"
        )
        head = f"queue {queue}: its budget of {_hours(budget.amount)} {resource}-hours per {per}"
        if limit is None:
            return QuotaRefusal(f"{head} is spent, and it declares no limit")
        return QuotaRefusal(
            f"{head} has too little left for what it may spend: up to {_hours(cost)}"
            f" {resource}-hours (its declared limit)",
            never=cost > budget.amount,
        )

    def _held_by(self, queue: str, user: str) -> _Held:
        if self._users is None:
            self._users = {}
            for charge in self.charges.values():
                self._users.setdefault((charge.queue, charge.user), _Held()).add(charge.amounts)
        return self._users.get((queue, user)) or _Held()

    def _capacity_of(self, queue: str) -> dict[str, float]:
        """What the queue's root cohort (or the queue alone) has, per resource."""
        tree = self.tree
        root = tree.roots[tree.queue_nodes[queue]]
        found = self._capacity.get(root.name)
        if found is None:
            found = self._capacity[root.name] = {}
            _add(found, tree.subtree[root])
        return found

    def rules(self, workload: Workload, queue: str, assignment: Assignment) -> QuotaRules:
        return QuotaRules(
            workload=workload,
            queue=self.spec(queue),
            assignment=assignment,
            ledger=self.ledger.copy(),
            charges=self.charges,
            fair=self.setup.fair_sharing and self.setup.fair_preemption,
        )


def _add(into: dict[str, float], amounts: Mapping[FlavorResource, int]) -> None:
    """`amounts` summed per resource, over flavors, into `into`."""
    for (_, resource), amount in amounts.items():
        into[resource] = into.get(resource, 0.0) + amount


class _Held:
    """What one user holds in one queue: AppWrappers admitted and resources."""

    __slots__ = ("amounts", "count")

    def __init__(self) -> None:
        self.count = 0
        self.amounts: dict[str, float] = {}

    def add(self, amounts: Mapping[FlavorResource, int]) -> None:
        self.count += 1
        _add(self.amounts, amounts)


def _held_of(amounts: Mapping[FlavorResource, int], resource: str) -> float:
    return float(sum(amount for (_, name), amount in amounts.items() if name == resource))


def _hours(milli_seconds: float) -> str:
    """Milli-units x seconds as units x hours, for people."""
    return f"{milli_seconds / 1000 / HOUR:.4g}"
