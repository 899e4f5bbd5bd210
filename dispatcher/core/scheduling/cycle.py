"""One scheduling cycle: pending workloads + cluster snapshots -> decisions. Pure, no I/O.

`schedule` is a function of its arguments only. It decides; the controller carries the
decisions out (creates the objects of each `Admit`, evicts the victims of each `Preempt`,
writes each `Wait` message to the AppWrapper's status) and runs the next cycle on fresh
snapshots. Every pending workload gets exactly one `Admit` or one `Wait`; a `Preempt`
comes in addition to the `Wait` of the workload that asked for it.

With `quotas` (a `core.quota.view.QuotaView`), a workload with a queue is admitted only when
its queue's quota (with what it may borrow) and one member's nodes both fit it: each flavor
assignment the queue allows is tried in its order until one also fits a member
(`_fit_queued`); victims must free both. A workload with no queue is fitted as without
quotas.

Admission checks (docs/autoscaling.md): a workload whose cluster queue names checks (or, with
`capacity_checks`, one without a queue) and that fits no member's nodes is admitted with no
cluster instead of waiting: its quota is reserved (`Admit.cluster == ""`) while its checks
(a ProvisioningRequest) run, and it asks for no victims. Once they passed (`Workload.checked`)
it is fitted as any other, but first in the cycle, before any queue's head takes room or quota
(`checked_first`). Reservations and backfill: `core.scheduling.reservation`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain

from dispatcher.api.models import Reason
from dispatcher.core.limituse import LimitUse
from dispatcher.core.mentions import for_reader, mention_all, namespace_of
from dispatcher.core.model import Backfill, ClusterSnapshot, QueueMode, Workload
from dispatcher.core.quota.fairshare import fair_order, nominal_first
from dispatcher.core.quota.flavors import Assignment, QuotaRefusal
from dispatcher.core.quota.model import WhenCanPreempt
from dispatcher.core.quota.resolve import Queued, QueueProblem
from dispatcher.core.quota.victims import CapacityOnly, QuotaRules
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling.clusters import (
    CycleScratch,
    Reasons,
    Victims,
    ask_victims,
    best_fit,
    policy_done,
)
from dispatcher.core.scheduling.decisions import Admit, CycleResult, Preempt, Wait
from dispatcher.core.scheduling.kept import KeptRooms
from dispatcher.core.scheduling.placement import Gang, Placements, Refusal
from dispatcher.core.scheduling.preemption import PreemptionPolicy, VictimRules
from dispatcher.core.scheduling.reservation import (
    ReservationInfo,
    Reservations,
    declared_lines,
    fenced_words,
    reserved_words,
)

__all__ = [
    "checked_first",
    "queue_order_key",
    "schedule",
]


def queue_order_key(workload: Workload) -> tuple[int, float, str]:
    """Rule 3: higher priority first, then older (created_at), then key."""
    return (-workload.priority, workload.created_at, workload.key)


@dataclass(slots=True)
class _Tried:
    """Why a workload did not fit, and the victims it asked for (if any)."""

    reasons: Reasons
    why: Refusal
    chosen: Victims | None = None


def _fit(
    workload: Workload,
    cycle: CycleScratch,
    preemption: PreemptionPolicy | None,
    *,
    preempt: bool,
    rules: Callable[[], VictimRules] | None = None,
    context: object = None,
    quota_limit: str = "",
) -> str | _Tried:
    """Place the workload (its pods as they will be made) in the best cluster: the
    cluster's name, or why not (having asked for victims if `preempt`). With a
    `quota_limit` its quota does not fit: it is never placed, only victims are sought."""
    gang = cycle.gang(workload)
    usable = cycle.usable(workload)
    # A gang of the same shape, placement and namespace (when members take only some)
    # refused since the last admission or hold is refused again for the same reasons (the
    # policy's answers also depend on the priority and the queue; without a policy they
    # play no part).
    priority = None if not (preempt and preemption is not None) else workload.priority
    placement = workload.placement
    # Whether victims were sought is part of the question: a plain fit's refusal must not
    # answer a later question that asks for victims.
    asks = preempt and preemption is not None
    where = (None if placement.anywhere else placement, cycle.namespace(workload))
    fenced = cycle.fenced(workload)  # clusters whose reserved nodes it would outlast
    question = (gang.shape, where, priority, context, asks, fenced)
    known = cycle.known_refusal(question)
    if known is not None:
        return _Tried(*known)
    give_back = cycle.fence_off(fenced) if fenced else None
    outcome = best_fit(cycle, gang, usable)
    if give_back is not None:
        give_back()
    if isinstance(outcome, tuple):
        if not quota_limit:
            cycle.admit(workload, outcome[0].name, outcome[1])
            return outcome[0].name
        outcome[1].undo()
        tried = _Tried([], Refusal(quota_limit))
    else:
        tried = _Tried(outcome, cycle.combine(outcome) if usable else cycle.nowhere(workload))
    if preempt and preemption is not None:
        tried.chosen = ask_victims(workload, gang, cycle, usable, preemption, rules, context)
    if not asks or (tried.chosen is None and policy_done(workload, gang, cycle, usable, context)):
        cycle.refused[question] = (cycle.version, tried.reasons, tried.why)
    return tried


def schedule(
    pending: Sequence[Workload],
    clusters: Sequence[ClusterSnapshot],
    *,
    mode: QueueMode,
    now: float,
    starvation_after: float,
    preemption: PreemptionPolicy | None,
    quotas: QuotaView | None = None,
    presorted: bool = False,
    capacity_checks: tuple[str, ...] = (),
    kept: KeptRooms | None = None,
    backfill: Backfill = Backfill.NEVER,
    reserved_before: Mapping[str, ReservationInfo] | None = None,
    limit_use: LimitUse | None = None,
) -> CycleResult:
    """Decide, for every pending workload, admit (where) or wait (why); maybe preempt.

    Each cluster gets one `ClusterRoom` for the whole cycle, so a workload sees the room
    the workloads before it took. Rules kept:

    - StrictFIFO: the first workload that does not fit blocks every later one. A workload
      that could not fit any allowed cluster even if it were empty does not block (waiting
      cannot help it; the controller reports it as larger than the cluster).
    - BestEffortFIFO: later workloads may pass one that does not fit, except that a workload
      queued longer than `starvation_after` seconds holds every cluster it could fit when
      empty: nothing after it is admitted there this cycle, so the room it waits for is not
      taken again and again by smaller ones. One that could not fit even an empty cluster
      holds nothing.
    - Preemption: a workload that fits nowhere asks `preemption` for victims; the cluster
      where it preempts is held for it for the rest of the cycle (its victims' room is its
      claim), and at most one preemption happens per cluster per cycle.
    - Backfill `Declared` (a cluster queue's `backfill`; `backfill` for no queue): a line's
      head that fits nowhere reserves nodes from the earliest time it fits; later work its
      limit does not end by then is kept off them (`core.scheduling.reservation`).
    - With quotas, the queueing strategy is each cluster queue's own: a StrictFIFO head
      blocks only its queue; a workload held back by its queue (a broken link, a stopped
      queue) or by quota holds no cluster. With fair sharing, queues that borrow the least
      weighted share of their cohort go first.

    `presorted`: `pending` is in queue order already (a `core.queues.QueueManager` keeps it
    so); it is not sorted again. `kept`: the clusters' states kept from the last cycle
    (`core.scheduling.kept`), brought up to these snapshots instead of built afresh.
    `reserved_before`: the last cycle's reservations; `limit_use`: how much of their
    declared limits recent work ran (`limituse.LimitUse`): reservations' estimates.
    """
    # 1. Order the queue (`_ordered`).
    in_order = list(pending) if presorted else sorted(pending, key=queue_order_key)
    resolved = {w.key: quotas.resolve(w) for w in in_order} if quotas is not None else {}
    ordered = _ordered(in_order, resolved, quotas)

    # 2. Snapshot: one mutable simulation per cluster, made on first use.
    cycle = CycleScratch(clusters, now, kept)
    reserving = Reservations(
        declared_lines(backfill, quotas), use=limit_use or LimitUse(), before=reserved_before or {}
    )
    decisions = _Decisions(cycle, now=now, starvation_after=starvation_after, reserving=reserving)
    strict_fifo = _strict_fifo(mode, quotas)
    order = decisions.order

    # 3. Fit, or preempt, each workload in order; each ends in one of the outcomes below.
    for workload in ordered:
        order.append(workload.key)
        queued = resolved.get(workload.key)
        if isinstance(queued, QueueProblem):
            decisions.queue_problem(workload, queued)
            continue
        strict = strict_fifo[queued.queue if queued is not None else ""]
        if decisions.waits_behind_head(workload, queued):
            continue
        if queued is None:
            decided, checks = _fit_unqueued(workload, cycle, preemption, quotas, capacity_checks)
            assignment, fitted = None, workload
        else:
            assert quotas is not None
            outcome = _fit_queued(workload, queued, quotas, cycle, preemption)
            if isinstance(outcome, QuotaRefusal):
                decisions.refused_by_quota(workload, queued, outcome, strict=strict)
                continue
            decided, assignment, fitted = outcome
            checks = quotas.spec(queued.queue).checks if not decided else ()
        if isinstance(decided, str):
            decisions.admitted(workload, decided, queued, assignment, checks=checks)
        else:
            # 4. It fits nowhere: say why, maybe preempt, and hold what it is owed.
            decisions.fits_nowhere(workload, fitted, decided, queued, assignment, strict=strict)

    # 5. Hand the decisions back to the controller.
    return decisions.result(resolved)


def _ordered(
    in_order: list[Workload],
    resolved: Mapping[str, Queued | QueueProblem | None],
    quotas: QuotaView | None,
) -> Iterable[Workload]:
    """The order workloads are tried in: `in_order` (priority, then age, then key); with
    quotas, those within their queue's nominal quota before those that would borrow (with
    fair sharing instead, queues that borrow less of their cohort go first). Work whose
    admission checks passed goes before all of that (`checked_first`)."""
    checked, rest = checked_first(in_order)
    ordered: Iterable[Workload] = rest
    if quotas is not None and quotas.setup.fair_sharing:
        ordered = fair_order(rest, resolved, quotas)
    elif quotas is not None:
        ordered = nominal_first(rest, resolved, quotas.ledger, quotas.setup.queues)
    return chain(checked, ordered) if checked else ordered


def checked_first(in_order: list[Workload]) -> tuple[list[Workload], list[Workload]]:
    """`in_order` split into the work whose admission checks passed and the rest, each in
    its order. The first go before any queue's head: they held their quota while nodes were
    provisioned for them, and a head fitted before them could take those nodes (or that
    quota) in the same cycle, leaving them to wait for a booking nobody holds any more."""
    if not any(w.checked for w in in_order):
        return [], in_order
    return [w for w in in_order if w.checked], [w for w in in_order if not w.checked]


def _strict_fifo(mode: QueueMode, quotas: QuotaView | None) -> dict[str, bool]:
    """Whether each cluster queue's strategy is StrictFIFO; for "" (no queue), `mode`'s."""
    strict: dict[str, bool] = {}
    if quotas is not None:
        for name, spec in quotas.setup.queues.items():
            strict[name] = spec.strategy is QueueMode.STRICT_FIFO
    strict[""] = mode is QueueMode.STRICT_FIFO  # (a cluster queue is never named "")
    return strict


def _fit_unqueued(
    workload: Workload,
    cycle: CycleScratch,
    preemption: PreemptionPolicy | None,
    quotas: QuotaView | None,
    capacity_checks: tuple[str, ...],
) -> tuple[str | _Tried, tuple[str, ...]]:
    """A workload with no queue is fitted on capacity alone (as without quotas). With
    `capacity_checks` (and not checked yet), one that fits nowhere is reserved ("") with
    those checks to run, and asks for no victims."""
    checks = () if workload.checked else capacity_checks
    rules: Callable[[], VictimRules] | None = None
    if quotas is not None and quotas.charges:
        # Work admitted through a queue is not a queue-less preemptor's to take.
        rules = partial(CapacityOnly, workload, quotas.charges)
    decided = _fit(workload, cycle, preemption, preempt=not checks, rules=rules, context="")
    if checks and not isinstance(decided, str):
        return "", checks  # reserved: its checks may bring the nodes it needs
    return decided, ()


@dataclass(slots=True)
class _Decisions:
    """What one cycle has decided so far, in queue order: one method per outcome.

    The methods run in the cycle's order, and each later workload reads what the earlier
    ones left: the heads found, the queues blocked behind a StrictFIFO head, the clusters
    held (in `cycle`).
    """

    cycle: CycleScratch
    now: float
    starvation_after: float
    reserving: Reservations
    order: list[str] = field(default_factory=list)  # every pending key, as taken
    admits: list[Admit] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    # queue ("" = none) -> its first refused in queue order (`_head`)
    heads: dict[str, Workload] = field(default_factory=dict)
    blocked: str | None = None  # StrictFIFO: the message of every workload after the head
    blocked_queues: dict[str, Wait] = field(default_factory=dict)  # the same, per cluster queue
    blocking: set[str] = field(default_factory=set)  # the heads that block them
    holders: set[str] = field(default_factory=set)  # starving ones that hold a cluster
    # The AppWrappers named by texts many read (a held cluster, a StrictFIFO head), and
    # those texts as each namespace's messages say them (`_wait`).
    named: set[str] = field(default_factory=set)
    said: dict[tuple[str, str], str] = field(default_factory=dict)

    def _wait(self, key: str, message: str, reason: Reason) -> None:
        """`key` waits: `message` as its owner may read it (`core.mentions`: no AppWrapper of
        another namespace named)."""
        if self.named:
            where = (message, namespace_of(key))
            said = self.said.get(where)
            if said is None:
                said = self.said[where] = for_reader(message, to=key, named=self.named)
            message = said
        self.waits.append(Wait(key, message, reason))

    def queue_problem(self, workload: Workload, problem: QueueProblem) -> None:
        """Its queue cannot be used (a broken link, a stopped queue): it waits, holds nothing
        and blocks nothing."""
        message = self.cycle.messages.setdefault(problem.message, problem.message)
        self._wait(workload.key, message, Reason.QUEUE_NOT_READY)

    def waits_behind_head(self, workload: Workload, queued: Queued | None) -> bool:
        """Whether a StrictFIFO head before it blocks it (its cluster queue's head, or with
        no queue the head of line); if so it waits, saying behind whom. A head with a
        reservation lets pass what ends by its start."""
        if self.reserving.passes(queued.queue if queued else "", workload, self.now):
            return False
        if queued is not None:
            behind = self.blocked_queues.get(queued.queue)
            if behind is None:
                return False
            self._wait(workload.key, behind.message, behind.reason)
            return True
        if self.blocked is None:
            return False
        self._wait(workload.key, self.blocked, Reason.INSUFFICIENT_RESOURCES)
        return True

    def refused_by_quota(
        self, workload: Workload, queued: Queued, refusal: QuotaRefusal, *, strict: bool
    ) -> None:
        """Quota, not capacity, keeps it out: it waits and holds no cluster; as a StrictFIFO
        head it blocks its queue, unless waiting cannot help it (`never`) or its user's own
        limit is what keeps it out (`user`: other users' work is not held up by it)."""
        message = self.cycle.messages.setdefault(refusal.message, refusal.message)
        self._wait(workload.key, message, Reason.QUOTA_EXCEEDED)
        self._head(queued.queue, workload)
        blocks = not (refusal.never or refusal.user)
        if strict and blocks and queued.queue not in self.reserving.passable:
            self._block(workload.key, queued, Reason.QUOTA_EXCEEDED)

    def admitted(
        self,
        workload: Workload,
        cluster: str,
        queued: Queued | None,
        assignment: Assignment | None,
        *,
        checks: tuple[str, ...] = (),
    ) -> None:
        """It fits `cluster` (its quota charged already, with a queue): dispatch it there.
        With `cluster` "": its quota is reserved while admission checks `checks` run."""
        self.admits.append(
            Admit(
                workload.key,
                cluster,
                queue=queued.queue if queued else "",
                local=queued.local if queued else "",
                assignment=assignment,
                checks=checks,
            )
        )

    def fits_nowhere(
        self,
        workload: Workload,
        fitted: Workload,
        tried: _Tried,
        queued: Queued | None,
        assignment: Assignment | None,
        *,
        strict: bool,
    ) -> None:
        """It fits no cluster (`fitted`: with the flavors of `assignment`): it waits saying
        why, preempts if victims were chosen, or reserves as its line's head, and then, as a
        StrictFIFO head, blocks those after it, or, starving under BestEffortFIFO, holds
        every cluster it could fit (unless it reserved)."""
        cycle = self.cycle
        line = queued.queue if queued else ""
        self._head(line, workload)
        gang = cycle.gang(fitted)
        usable = cycle.usable(fitted)
        message = cycle.message(fitted, tried.reasons, tried.why)
        if assignment is not None and assignment.admissible:
            # Capacity refused it in the flavor its quota came from: say which nodes those are.
            message += f" (in flavor {assignment.describe()})"
        if cycle.fences:
            message += fenced_words(cycle, fitted, usable)
        # Its quota keeps it out when no flavor it may use has quota now (it preempts for it).
        quota_bound = assignment is not None and not assignment.admissible
        reason = Reason.QUOTA_EXCEEDED if quota_bound else Reason.INSUFFICIENT_RESOURCES
        self._wait(workload.key, message, reason)
        if tried.chosen is not None:
            # (After `_wait`: its victims are named for it already, and it holds a cluster.)
            self._add(self._preempt(workload, tried.chosen, queued))
        head = tried.chosen is None and not quota_bound and self.heads.get(line) is workload
        reserved = self.reserving.reserve(cycle, line, workload, gang, usable) if head else None
        if reserved is not None:
            self._add(reserved_words(workload.key, reserved))
        if strict:
            blocked = line in self.reserving.passable  # by its head, which reserved
            if not blocked and any(cycle.could_ever_fit(gang, c) for c in usable):
                self._block(workload.key, queued, reason, reserved)
        elif reserved is None and self.now - workload.queued_since > self.starvation_after:
            self._guard_starving(workload, gang, usable)

    def _add(self, words: str) -> None:
        """The last wait's message ends with `words`."""
        wait = self.waits[-1]
        self.waits[-1] = replace(wait, message=wait.message + words)

    def _head(self, queue: str, workload: Workload) -> None:
        """`workload` was refused in `queue`: the queue's head is the first refused in
        queue order, not the first tried (with quotas a later one within nominal quota is
        tried before an earlier one that would borrow: `nominal_first`)."""
        known = self.heads.get(queue)
        if known is None or queue_order_key(workload) < queue_order_key(known):
            self.heads[queue] = workload

    def _preempt(self, workload: Workload, victims: Victims, queued: Queued | None) -> str:
        """Record the preemption and hold its cluster for the preemptor (its victims' room is
        its claim); the words its wait message ends with."""
        queue = queued.queue if queued is not None else ""
        chosen = Preempt(workload.key, victims.cluster, victims.keys, queue=queue)
        self.preemptions.append(chosen)
        self.named.add(workload.key)
        self.cycle.hold(chosen.cluster, f"held for {workload.key}, which is preempting")
        where = "" if len(self.cycle.clusters) == 1 else f" in {chosen.cluster}"
        return f"; preempting {mention_all(chosen.victims, to=workload.key)}{where}"

    def _block(
        self,
        key: str,
        queued: Queued | None,
        reason: Reason,
        reserved: ReservationInfo | None = None,
    ) -> None:
        """StrictFIFO: head `key` blocks every later workload of its cluster queue (with no
        queue, every later workload with no queue); with a reservation, only those that
        its start does not see gone (so its line is not parked behind it, `core.queues`)."""
        if reserved is None:
            self.blocking.add(key)
        else:
            self.reserving.passable[queued.queue if queued else ""] = reserved.latest
        self.named.add(key)
        if queued is None:
            self.blocked = f"waiting behind {key} (head of line)"
        else:
            self.blocked_queues[queued.queue] = Wait(
                "", f"waiting behind {key} (head of queue {queued.queue})", reason
            )

    def _guard_starving(
        self, workload: Workload, gang: Gang, usable: Sequence[ClusterSnapshot]
    ) -> None:
        """The starvation guard: a workload queued too long holds every cluster not held yet
        that it could fit when empty, so smaller ones after it cannot take its room."""
        for cluster in usable:
            if cluster.name in self.cycle.held or cluster.name in self.cycle.fences:
                continue  # (its nodes reserved: what is left there is for backfill)
            if self.cycle.could_ever_fit(gang, cluster):
                self.holders.add(workload.key)
                self.named.add(workload.key)
                self.cycle.hold(
                    cluster.name,
                    f"held for {workload.key}, queued longer than {self.starvation_after:g}s"
                    " (starvation guard)",
                )

    def result(self, resolved: Mapping[str, Queued | QueueProblem | None]) -> CycleResult:
        heads = self.heads
        return CycleResult(
            admits=tuple(self.admits),
            waits=tuple(self.waits),
            preemptions=tuple(self.preemptions),
            head_key=next((w.key for w in heads.values()), None),
            heads=frozenset(w.key for w in heads.values()),
            order=tuple(self.order),
            resolved=resolved,
            held=frozenset(self.cycle.held).union(self.cycle.fences),
            holders=frozenset(self.holders),
            blocking=frozenset(self.blocking),
            reservations=self.reserving.made,
            placements=Placements(
                {
                    w.key: placed
                    for admissions in self.cycle.placed.values()
                    for w, placed in admissions
                }
            ),
        )


def _fit_queued(
    workload: Workload,
    queued: Queued,
    quotas: QuotaView,
    cycle: CycleScratch,
    preemption: PreemptionPolicy | None,
) -> tuple[str | _Tried, Assignment, Workload] | QuotaRefusal:
    """Quota fit and capacity fit together: each flavor assignment the queue allows, in its
    order, until one also fits a cluster (the admission is charged to the queue); else the
    first one's refusal, with the victims that would make quota and capacity fit. Its
    user's limit in the queue comes first (`QuotaView.user_refusal`), then its budget
    (`QuotaView.budget_refusal`)."""
    refused = quotas.user_refusal(queued.queue, workload)
    if refused is None:
        refused = quotas.budget_refusal(queued.queue, workload, cycle.now)
    if refused is not None:
        return refused
    options = quotas.candidates(queued.queue, workload)
    if isinstance(options, QuotaRefusal):
        return options
    spec = quotas.spec(queued.queue)
    first: tuple[_Tried, Assignment, Workload] | None = None
    for index, assignment in enumerate(options):
        # The first is current (`candidates` answers for now); a later one may have lost
        # its quota to this cycle's admissions since the answer was made.
        if index and assignment.admissible and not quotas.fits(queued.queue, assignment):
            continue
        fitted = quotas.flavored(workload, assignment)
        if not assignment.admissible:
            if first is None:
                first = (_Tried([], Refusal(assignment.limit)), assignment, fitted)
            if spec.when_can_preempt is WhenCanPreempt.PREEMPT:
                break
            continue
        decided = _fit(fitted, cycle, preemption, preempt=False)
        if isinstance(decided, str):
            quotas.admit(queued.queue, assignment, workload)
            return decided, assignment, fitted
        if first is None:
            first = (decided, assignment, fitted)
    if first is None:  # every assignment lost its quota to this cycle's admissions
        return QuotaRefusal(f"queue {queued.queue}: its quota went to earlier admissions")
    _, assignment, fitted = first
    if spec.checks and not workload.checked and assignment.admissible:
        # Its quota fits but no member's nodes do: reserve the quota, run the checks.
        quotas.admit(queued.queue, assignment, workload)
        return "", assignment, fitted
    if preemption is None:
        if not assignment.admissible:
            return QuotaRefusal(assignment.limit)
        return first

    def rules() -> QuotaRules:
        return quotas.rules(workload, queued.queue, assignment)

    context = (queued.queue, quotas.version)
    limit = "" if assignment.admissible else assignment.limit
    again = _fit(
        fitted, cycle, preemption, preempt=True, rules=rules, context=context, quota_limit=limit
    )
    if isinstance(again, str):  # admissible, and room appeared (cannot happen: same cycle)
        quotas.admit(queued.queue, assignment, workload)
        return again, assignment, fitted
    if limit and again.chosen is None:
        return QuotaRefusal(limit)
    return again, assignment, fitted
