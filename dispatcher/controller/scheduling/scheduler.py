"""The scheduler: refresh -> snapshot -> take -> assume -> a status-only write -> publish.

Side effects: status writes on the hub (admissions and evictions), Events.

It owns what it keeps between cycles (`SchedulerState`, state.py: the queues, the quota in
use, who holds room) and is the only one to change it, inside `cycle`. It wakes on anything
that can change a decision (an AppWrapper queued, capacity freed, a node changed), carries
what changed in the passive scheduler cache into its state, takes a snapshot of the members,
runs `core.queues.take` (the cycle over the work not parked; what it refuses is parked until
an event can change its answer, keeping its last waiting status), and for each decision:
- an admission is assumed in the cache at once (the next cycle sees the room in use), then
  written as the `Dispatched` condition; the reconciler, woken by the write, creates the
  objects. A failed write drops the assumption and the AppWrapper is decided again;
- an eviction is written as the victim's `Preempted` condition (with `preemptedBy`, and the
  time its objects go when it is given notice); the reconciler removes the victim's objects
  then and requeues it. A preemptor that protection alone holds back (its victims' minimum
  runtimes) says until when, and a cycle runs at that time;
- a wait goes to the waiting writer, which decides whether it is worth a status write.

Then it publishes: those who only read (the queues' status, the metrics) get a frozen
`SchedulerView` of what the cycle left (`view`), and are told when it changed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from dispatcher.api.models import (
    Admission,
    AppWrapper,
    AppWrapperStatus,
    FlavorAssignment,
    Reason,
)
from dispatcher.clock import Clock
from dispatcher.cluster.member import Member
from dispatcher.config import Config, Fit
from dispatcher.controller.reading import AppWrapperReader
from dispatcher.controller.scheduling.cache import Assumed, SchedulerCache
from dispatcher.controller.scheduling.protecting import ProtectionNote
from dispatcher.controller.scheduling.state import SchedulerState
from dispatcher.controller.scheduling.view import EMPTY, SchedulerView
from dispatcher.controller.scheduling.waiting import WaitingWriter
from dispatcher.controller.status import Change, StatusWriter
from dispatcher.controller.visibility.pending import Found, Pending, in_line_order
from dispatcher.core import checkstatus
from dispatcher.core import conditions as cond
from dispatcher.core.conditions import Transition
from dispatcher.core.limituse import LimitUse
from dispatcher.core.mentions import recorded_preemptor
from dispatcher.core.model import Workload
from dispatcher.core.phase import Phase, initialised, queueing, status_phase
from dispatcher.core.protection import notice_seconds
from dispatcher.core.queues import take
from dispatcher.core.quota.budget import Spent
from dispatcher.core.quota.flavors import charge_of, with_flavors
from dispatcher.core.quota.history import UsageHistory
from dispatcher.core.quota.resolve import Queued, QueueProblem, resolve
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import (
    CycleResult,
    HonourClaims,
    LowestPriorityFirst,
    PreemptionPolicy,
    Wait,
)
from dispatcher.core.scheduling.kept import KeptRooms
from dispatcher.core.scheduling.pooled import anywhere, pooled
from dispatcher.core.scheduling.preemption import evicting, why_evicted
from dispatcher.core.scheduling.reservation import ReservationInfo
from dispatcher.kube.errors import Conflict, KubeError
from dispatcher.metrics.recorder import Recorder

Observer = Callable[[CycleResult | None, list[Workload], float, Pending | None], None]
"""Sees each cycle: its result, the work it judged, and how to list what is pending."""

BATCH_SECONDS = 0.005
DECISIONS_PER_CYCLE = 250
"""A cycle decides at most this many workloads (the first in order) and the next cycle,
run at once, the rest: an event that wakes thousands (quota given back in a large cohort)
costs several short cycles, not one long one that holds up the event loop. About 0.08 ms a
decision with quotas and flavors on 3 x 1,000 nodes (`benchmarks.queues_bench`)."""
BATCH_MAX_SECONDS = 0.25


class Scheduler:
    def __init__(
        self,
        *,
        config: Config,
        cache: SchedulerCache,
        models: AppWrapperReader,
        status: StatusWriter,
        waiting: WaitingWriter,
        members: Mapping[str, Member],
        clock: Clock,
        wrote: Callable[[str], None],
        quota_tree: Callable[[], QuotaTree] | None = None,
        quota_history: Callable[[], Mapping[str, UsageHistory]] | None = None,
        quota_spent: Callable[[], Mapping[str, Spent]] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self._config = config
        self._recorder = recorder or Recorder()
        self._observe: Observer | None = None
        self._limit_use: Callable[[], LimitUse] = LimitUse  # none recorded: ends at limits
        self._waits: dict[str, Wait] = {}
        """The last wait of each pending one (and of some that left: pruned in bulk)."""
        self._resolved: dict[str, Queued | QueueProblem | None] = {}
        self._held: frozenset[str] = frozenset()  # the clusters the last cycle held
        self._reserved: Mapping[str, ReservationInfo] = {}  # the last cycle's, by head
        self._kept = KeptRooms()  # each member's free room, brought from cycle to cycle
        self._quota_tree = quota_tree
        self._quota_history = quota_history  # `Usage` fair sharing: the queues' use over time
        self._quota_spent = quota_spent  # what queues with budgets spent of them
        self._cache = cache
        self.state = SchedulerState(cache, members)
        """What the scheduler keeps between cycles: changed by `cycle` alone."""
        self._published: tuple[int, SchedulerView] = (-1, EMPTY)
        self._cycles_run = 0  # every cycle, one that found nothing to decide too
        self._running: tuple[tuple[str, float, str], ...] = ()
        """What held room as the last cycle ended (`running`)."""
        self._told: tuple[int, int] = (-1, -1)
        self._listeners: list[Callable[[], None]] = []
        self._models = models
        self._status = status
        self._waiting = waiting
        self._members = members
        self._clock = clock
        provisioning = config.provisioning
        self._capacity_checks = (
            tuple(provisioning.capacity_only_checks) if provisioning.enabled else ()
        )
        self._wrote = wrote  # a status write about this key landed: the reconciler goes on
        self._preempting = config.preemption
        self._protection = ProtectionNote(clock, self.kick)
        self._kick = asyncio.Event()
        self._slots = asyncio.Semaphore(config.dispatch_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._cycle_seconds = 0.0
        self.cycles = 0
        self.preemptions = 0
        self.preemptions_by_queue: Counter[str] = Counter()
        """Victims chosen for preemptors of each cluster queue (metrics)."""
        self.considered: Counter[str] = Counter()
        """Cycles that decided about each AppWrapper in its current life (hop metrics)."""
        self._log = structlog.get_logger("scheduler")

    def kick(self) -> None:
        """Something that can change a decision happened: run a cycle soon."""
        self._kick.set()

    async def run(self) -> None:
        while True:
            await self._kick.wait()
            # Gather the burst of changes that usually follows one (a batch of applies, a
            # gang's pods starting) into one cycle. Waiting twice as long as the last cycle
            # took keeps cycles to about a third of the process's time under a long queue,
            # leaving the rest to the writes they start. Real time, not the clock's: the
            # wait is a share of the process's time, measured against what the last cycle
            # really took (perf_counter), and a test's manual clock must not hold cycles up.
            await asyncio.sleep(max(BATCH_SECONDS, min(2 * self._cycle_seconds, BATCH_MAX_SECONDS)))
            self.cycle()
            # Let the writes this cycle started make progress before the next cycle.
            await asyncio.sleep(0)

    def cycle(self) -> CycleResult | None:
        """One scheduling cycle; its writes run in the background. None if nothing waits."""
        self._kick.clear()
        self._cycles_run += 1
        started = time.perf_counter()
        now = self._clock.time()
        tree = self._quota_tree() if self._quota_tree is not None else None
        # 1. What changed since the last cycle is carried into the queues and the usage
        #    (a deletion too: what left must leave the pending list).
        self.state.refresh(now, tree)
        queues = self.state.queues
        if self._protection.take_over():  # the end of a protection is no event that wakes
            queues.capacity_freed()
        if not self._cache.anything_queued() or not len(queues):
            self._running = tuple(self.state.running())
            self._observe_none(now)
            self._cycle_seconds = time.perf_counter() - started
            self._publish()
            return None
        # 2. The members' room (waking capacity-parked work if it changed) and the claims.
        snapshot = self.state.snapshot(now)
        policy: PreemptionPolicy | None = None
        protected: dict[str, float] = {}
        if self._preempting:
            # Built each cycle: protection from preemption is judged at the cycle's time,
            # and where it alone holds a preemptor back, the policy notes until when.
            policy = HonourClaims(
                LowestPriorityFirst(now=now, protected=protected), snapshot.claims
            )
        clusters = snapshot.clusters
        pooled_fit = self._config.fit is Fit.CLUSTER_TOTAL
        if pooled_fit:
            clusters = [pooled(c) for c in clusters]
        self._kept.keep_only([c.name for c in clusters])
        quotas = self._quota_view(tree, pooled_fit) if tree is not None else None
        judged: list[Workload] = []

        def prepare(active: list[Workload]) -> list[Workload]:
            judged.extend(active)  # as written: what an admission records
            return [anywhere(w) for w in active] if pooled_fit else active

        # 3. The cycle over the work not parked; what it refused is parked.
        result = take(
            queues,
            clusters,
            mode=self._config.queue_mode,
            now=now,
            starvation_after=self._config.starvation_after_seconds,
            preemption=policy,
            quotas=quotas,
            held_before=self._held,
            limit=DECISIONS_PER_CYCLE,
            prepare=prepare,
            capacity_checks=self._capacity_checks,
            kept=self._kept,
            backfill=self._config.backfill,
            reserved_before=self._reserved,
            limit_use=self._limit_use(),
        )
        self._reserved = result.reservations
        result = self._protection.noted(result, protected, now)
        self._held = result.held
        if result.again:  # more to decide: a hold ended, or more was active than one takes
            self.kick()
        self.cycles += 1
        self.considered.update(w.key for w in judged)
        # 4. Assume, write, note the waits.
        self._apply(result, judged, now, tree)
        self._running = tuple(self.state.running())
        self._keep_waits(result)
        if self._observe is not None:
            self._observe(result, judged, now, self._pending_now)
        self._cycle_seconds = time.perf_counter() - started
        self._recorder.cycle(self._cycle_seconds, admitted=bool(result.admits))
        self._publish()
        self._log.debug(
            "cycle",
            cycle=self.cycles,
            pending=len(queues),
            judged=len(judged),
            admitted=len(result.admits),
            seconds=round(self._cycle_seconds, 4),
        )
        return result

    def _quota_view(self, tree: QuotaTree, pooled_fit: bool) -> QuotaView:
        """This cycle's view of the quotas: the charges kept, and the queues' use over time
        and budgets as last sampled."""
        history = self._quota_history() if self._quota_history is not None else None
        spent = self._quota_spent() if self._quota_spent is not None else None
        return QuotaView(
            tree,
            usage=self.state.usage(),
            place_flavors=not pooled_fit,
            history=history,
            spent=spent,
        )

    def _publish(self) -> None:
        """The cycle is over: readers are told if who is pending or what is charged moved
        (they then read `view`, built once for all of them)."""
        moved = (self.state.queues.changes, self.state.charges_changed)
        if moved != self._told:
            self._told = moved
            for listener in self._listeners:
                listener()

    def pending_changes(self) -> int:
        """Moves when who is pending changed (only ever in a cycle)."""
        return self.state.queues.changes

    def running(self) -> Iterator[tuple[str, float, str]]:
        """(key, dispatched at, cluster queue or "") of what held room as the last cycle
        ended."""
        return iter(self._running)

    def observe_with(self, observe: Observer, limit_use: Callable[[], LimitUse]) -> None:
        """Hand every cycle's order and waits to `observe`, and estimate reservations'
        starts with `limit_use`: the pending list's (controller/visibility/pending.py),
        which sees the work that ended."""
        self._observe = observe
        self._limit_use = limit_use

    def on_published(self, listener: Callable[[], None]) -> None:
        """Call `listener` after a cycle that changed the pending work or the charges."""
        self._listeners.append(listener)

    def view(self) -> SchedulerView:
        """What the last cycle left, frozen: the same copy for every read until the next."""
        built, view = self._published
        if built != self._cycles_run:
            view = self.state.view(self._waits, self.cycles, self._running)
            self._published = (self._cycles_run, view)
        return view

    def _observe_none(self, now: float) -> None:
        self._held = frozenset()
        if self._observe is not None:
            self._observe(None, [], now, None)

    def _keep_waits(self, result: CycleResult) -> None:
        """The last wait of each pending one: a parked one's still says why (it is not
        judged again until an event), for the pending list and the metrics."""
        waits, resolved = self._waits, self._resolved
        for admit in result.admits:
            waits.pop(admit.key, None)
            resolved.pop(admit.key, None)
        for wait in result.waits:
            waits[wait.key] = wait
            resolved[wait.key] = result.resolved.get(wait.key)
        queues = self.state.queues
        if len(waits) > 2 * len(queues) + 64:  # amortized: those that left the queues
            for key in [k for k in waits if k not in queues]:
                del waits[key]
                resolved.pop(key, None)

    def waits(self) -> dict[str, Wait]:
        """Why each pending AppWrapper waits: its wait in the last cycle that judged it."""
        queues = self.state.queues
        return {k: w for k, w in self._waits.items() if k in queues}

    def _pending_now(self) -> Iterator[Found]:
        """Every pending workload now, in line order, with its last wait (the pending
        list merges the last cycle's order with it)."""
        tree = self._quota_tree() if self._quota_tree is not None else None

        def resolve_now(workload: Workload) -> Queued | QueueProblem | None:
            if tree is None:
                return None
            return resolve(workload.key.partition("/")[0], workload.queue_name, tree.setup, tree)

        return in_line_order(self.state.queues, self._waits, self._resolved, resolve_now)

    def _apply(
        self, result: CycleResult, pending: list[Workload], now: float, tree: QuotaTree | None
    ) -> None:
        by_key = {w.key: w for w in pending}
        for admit in result.admits:
            decided = by_key[admit.key]
            admission: Admission | None = None
            if admit.assignment is None or tree is None:
                self.state.assume(admit.key, Assumed(decided, admit.cluster, now))
            else:
                chosen = admit.assignment.flavors
                made = with_flavors(decided, chosen, tree.setup.flavors)
                spec = tree.setup.queues.get(admit.queue)
                charge = charge_of(admit.key, admit.queue, made, chosen, admitted_at=now, spec=spec)
                assumed = Assumed(made, admit.cluster, now, charge, admit.local)
                self.state.assume(admit.key, assumed)
                admission = Admission(
                    queue=admit.local,
                    clusterQueue=admit.queue,
                    flavors=[FlavorAssignment(name=f, resources=list(r)) for f, r in chosen],
                    borrowing=admit.assignment.borrows,
                )
            self._waiting.forget(admit.key)
            self._spawn(
                self._admit(admit.key, admit.cluster, decided, admission, admit.checks),
                f"admit-{admit.key}",
            )
        for wait in result.waits:
            head = wait.key in result.heads
            self._waiting.note(wait.key, wait.message, head=head, now=now, reason=wait.reason)
        for preempt in result.preemptions:
            victims = [v for v in preempt.victims if self._evictable(v)]
            if not victims:
                continue  # a claim named again: its evictions are under way
            preemptor = by_key[preempt.key]
            self.preemptions += len(victims)
            if preempt.queue:
                self.preemptions_by_queue[preempt.queue] += len(victims)
            obj = self._status.current(preempt.key)
            if obj is not None:
                self._status.record(
                    obj,
                    reason="Preempting",
                    message=evicting(preempt.key, victims, preempt.cluster),
                )
            uid = str((obj or {}).get("metadata", {}).get("uid") or "")
            for victim in victims:
                self.state.start(victim)
                reason, message = why_evicted(
                    victim,
                    self._cache.charge_of(victim),
                    preemptor=preempt.key,
                    preemptor_uid=uid,
                    priority=preemptor.priority,
                    queue=preempt.queue,
                )
                self._recorder.preempted(preempt.queue, reason.value)
                by = recorded_preemptor(preempt.key, uid=uid, victim=victim)
                notice = self._notice(victim, tree)
                self._spawn(
                    self._evict(victim, preempt.key, message, reason, recorded=by, notice=notice),
                    f"evict-{victim}",
                )

    def stop(self, key: str, message: str) -> None:
        """Evict `key` for its queue's spent budget (`budget.whenExhausted: Stop`), as a
        preemption victim is evicted: with its queue's notice, then requeued."""
        if not self._evictable(key):
            return  # being evicted already, or no longer dispatched
        tree = self._quota_tree() if self._quota_tree is not None else None
        self.state.start(key)
        notice = self._notice(key, tree)
        self._spawn(
            self._evict(key, "", message, Reason.BUDGET_EXHAUSTED, recorded="", notice=notice),
            f"stop-{key}",
        )

    def _notice(self, victim: str, tree: QuotaTree | None) -> float:
        """Seconds `victim` is told before its objects are removed: its cluster queue's
        notice, or the settings' for work admitted through none."""
        charge = self._cache.charge_of(victim)
        queue = None
        if charge is not None and tree is not None:
            queue = tree.setup.queues.get(charge.queue)
        return notice_seconds(queue, self._config.protection)

    def _evictable(self, key: str) -> bool:
        return self._cache.phase(key) is Phase.DISPATCHED and not self._cache.busy(key)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _admit(
        self,
        key: str,
        cluster: str,
        decided: Workload,
        admission: Admission | None = None,
        checks: tuple[str, ...] = (),
    ) -> None:
        """The admission is one status write: Dispatched to `cluster` (and Init/Queueing
        when this is its first decision), for the spec `decided` was fitted from. With no
        `cluster`: QuotaHeld, its admission `checks` to run (nothing is made yet)."""
        log = self._log.bind(appwrapper=key, cluster=cluster)

        def dispatch(obj: dict[str, Any]) -> Change | None:
            aw = self._models.parse(obj)
            status = (aw.status or AppWrapperStatus()).editable_copy()
            new = not initialised(status)
            if not (new or queueing(status)) or aw.metadata.deletionTimestamp:
                return None
            moment = datetime.fromtimestamp(self._clock.time(), UTC)
            current = self._models.workload(aw, priority=decided.priority, now=moment)
            if not isinstance(current, Workload) or (current.pod_sets, current.placement) != (
                decided.pod_sets,
                decided.placement,
            ):
                # Edited since the cycle fitted it: the objects recorded with this write
                # would be ones nobody fitted. The next cycle decides on the new spec.
                log.info("spec_changed_before_admission")
                return None
            transitions: list[Transition | None] = []
            if new:
                priority, _ = self._models.priority(aw)
                transitions.append(cond.initialize(status, priority=priority, now=moment))
            if not cluster:
                transitions.append(
                    checkstatus.mark_reserved(
                        status, checks=checks, admission=admission, now=moment
                    )
                )
                made.append((aw, status))
                return Change(status, transitions)
            # The objects are recorded with the dispatch: the reconciler creates these
            # only, and cleanup deletes these, whatever the spec is edited to later.
            objects = [item.ref() for item in aw.spec.items]
            transitions.append(
                cond.mark_dispatched(
                    status, cluster=cluster, now=moment, objects=objects, admission=admission
                )
            )
            made.append((aw, status))
            return Change(status, transitions)

        made: list[tuple[AppWrapper, AppWrapperStatus]] = []
        try:
            async with self._slots:
                written = await self._status.update(key, dispatch)
                if written is not None and not cluster:
                    log.info("quota_reserved", checks=",".join(checks))
                    self._wrote(key)
                elif written is not None:
                    aw, status = made[-1]
                    self._recorder.admitted(aw, status, self._clock.time() - decided.queued_since)
                    log.info("dispatched", priority=status.priority)
                    self._wrote(key)
        except Conflict:
            log.debug("dispatch_conflict")
        except (KubeError, ValidationError) as exc:
            log.warning("dispatch_status_failed", error=str(exc)[:300])
        finally:
            self._cache.finish(key)
            self.kick()

    async def _evict(
        self,
        key: str,
        preemptor: str,
        message: str,
        reason: Reason,
        *,
        recorded: str,
        notice: float = 0.0,
    ) -> None:
        """The eviction is one status write on the victim: Preempted, by whom (`recorded`:
        `preemptor` as the victim's status may name it, `core.mentions.recorded_preemptor`),
        and, given a `notice` (seconds), when its objects are removed (the reconciler waits
        until then; the condition's Event tells the victim, so it can checkpoint).

        A Conflict means only that something else wrote the victim meanwhile (its pod
        counts, most often): the update is made again on the newest object, as long as the
        victim is still dispatched. Dropping it would leave the preemptor with part of the
        room it was promised, waiting for a victim nobody evicts."""

        def preempt(obj: dict[str, Any]) -> Change | None:
            aw = self._models.parse(obj)
            status = (aw.status or AppWrapperStatus()).editable_copy()
            if status_phase(status) is not Phase.DISPATCHED:  # not evicting already
                return None
            moment = datetime.fromtimestamp(self._clock.time(), UTC)
            transition = cond.mark_preempting(
                status, by=recorded, message=message, now=moment, reason=reason, notice=notice
            )
            return Change(status, [transition])

        try:
            if await self._status.update(key, preempt) is not None:
                self._log.info(
                    "preempted", appwrapper=key, preemptor=preemptor, reason=message, notice=notice
                )
                self._wrote(key)
        except (KubeError, ValidationError) as exc:
            self._log.warning("preemption_failed", appwrapper=key, error=str(exc)[:300])
        finally:
            self._cache.finish(key)
            self.kick()

    def fence(self) -> None:
        """Cancel every admission and eviction in flight (the Lease is lost)."""
        for task in list(self._tasks):
            task.cancel()
        self._waiting.fence()

    async def drain(self, timeout: float) -> None:
        """Let in-flight writes finish (bounded) before shutdown."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)
        await self._waiting.drain(timeout)
