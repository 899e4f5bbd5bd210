"""The reconciler: `reconcile(key) -> Result`, the one creator and deleter of wrapped objects.

Side effects: creates (through its `Maker`, making.py) and deletes wrapped objects in
member clusters; writes status (through the status writer) for every step after the
scheduler's: invalid specs, backoff, Running, Completed, Failed and every requeue; adds and
removes the finalizer.

Only errors about the user's input (an invalid spec; a `TerminalError` or `UserInputError`
from making the objects) fail the user's AppWrapper. What an error met making the objects
means is the one error policy's to say (controller/errors.py `decide`): a bug of the
dispatcher's own leaves it dispatched, says so in its status and is retried with growing
pauses; a dispatch that may succeed later is requeued.

Level-based: it reads the newest AppWrapper (the status writer's overlay or the watch cache)
and makes the world match it, so a missed event or a restart costs nothing:
- new: validate; a spec error ends it Failed, a valid one is left to the scheduler;
- backing off: wait out the pause, then queue it again;
- dispatched: make sure its objects exist (created after the scheduler's write, or adopted
  after a restart), then follow its pods and objects to Running, Completed, Failed, a
  requeue or a reset (resetting.py: its objects removed and made again after a pause, its
  room kept); a member silent for too long requeues it;
- evicting (chosen as a victim): after the notice its eviction gave (notice.py: it may
  complete or fail meanwhile), remove its objects, requeue it;
- Failed: remove its objects once, giving the capacity back;
- deleting: remove its objects wherever they may be, then the finalizer (both ending.py).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from dispatcher.api.constants import FINALIZER
from dispatcher.api.models import AppWrapper, AppWrapperStatus, Reason, Requeuing
from dispatcher.clock import Clock
from dispatcher.cluster.member import Member
from dispatcher.cluster.objects import Wrapped, spec_change
from dispatcher.config import Config
from dispatcher.controller.errors import Action, decide
from dispatcher.controller.lifecycle.ending import Endings
from dispatcher.controller.lifecycle.making import Maker, NotYet
from dispatcher.controller.lifecycle.notice import Notices
from dispatcher.controller.lifecycle.progress import Pacing, measure, seconds_since
from dispatcher.controller.lifecycle.provisioning import Provisioning
from dispatcher.controller.lifecycle.resetting import Resets
from dispatcher.controller.quota.objects import NO_QUOTAS, QuotaLookup
from dispatcher.controller.reading import AppWrapperReader
from dispatcher.controller.status import StatusWriter
from dispatcher.controller.workqueue import Result
from dispatcher.core import checkstatus
from dispatcher.core import conditions as cond
from dispatcher.core.conditions import Transition
from dispatcher.core.faulttolerance import effective_requeuing, retry_policy
from dispatcher.core.lifecycle import Assessment, Progress, Verdict, assess
from dispatcher.core.model import Workload, tracked_pod_count
from dispatcher.core.phase import Phase, initialised, phase_of
from dispatcher.core.retry import retry_delay
from dispatcher.core.workloads import InvalidSpec
from dispatcher.metrics.recorder import Recorder

Obj = dict[str, Any]
C = cond.C
POLL_SECONDS = 2.0
"""When a wrapped object's status was read by GET, look again this much later."""
OWN_ERROR_FIRST_SECONDS = 1.0
OWN_ERROR_MAX_SECONDS = 300.0
"""Pauses (doubling) between attempts to make objects that met an error of the dispatcher's."""
MAKING = "creating the wrapped objects"
"""What the reconciler was doing, in the words of an error's message."""
UNSYNCED_RECHECK_SECONDS = 5.0
"""A dispatched AppWrapper on a member whose caches have not synced: look again then."""


class Reconciler:
    def __init__(
        self,
        *,
        config: Config,
        reader: AppWrapperReader,
        status: StatusWriter,
        members: Mapping[str, Member],
        clock: Clock,
        schedule_soon: Callable[[], None],
        start_task: Callable[[Coroutine[Any, Any, None], str], None],
        wake_owner: Callable[[str, Obj | None, Obj | None], None],
        maker: Maker,
        quotas: QuotaLookup | None = None,
        recorder: Recorder | None = None,
        provisioning: Provisioning | None = None,
    ) -> None:
        self._config = config
        self._provisioning = provisioning
        self._maker = maker
        self._resets = Resets(maker)
        self._recorder = recorder or Recorder()
        self._quotas = quotas or NO_QUOTAS
        self._reader = reader
        self._status = status
        self._members = members
        self._clock = clock
        self._schedule_soon = schedule_soon
        self._start_task = start_task
        self._wake_owner = wake_owner
        self._ensured: dict[str, str] = {}
        """key -> lastDispatchedAt of the attempt whose objects are known to exist."""
        self._pacing = Pacing()
        self._own_errors: dict[str, int] = {}
        """key -> dispatcher's own errors met making its objects since they last were made."""
        self._endings = Endings(
            maker=maker, status=status, members=members, schedule_soon=schedule_soon
        )
        self._notices = Notices(
            config=config,
            reader=reader,
            status=status,
            clock=clock,
            wake_owner=wake_owner,
            start_task=start_task,
            recorder=self._recorder,
        )
        self._log = structlog.get_logger("reconciler")

    def forget(self, key: str) -> None:
        """It finished or went: drop what only a live AppWrapper needs."""
        self._ensured.pop(key, None)
        self._pacing.forget(key)
        self._own_errors.pop(key, None)
        self._resets.forget(key)

    def forget_all(self, key: str) -> None:
        self.forget(key)
        self._endings.forget(key)

    def _moment(self) -> tuple[float, datetime]:
        now = self._clock.time()
        return now, datetime.fromtimestamp(now, UTC)

    def member_of(self, status: AppWrapperStatus) -> Member | None:
        if not status.clusterName and len(self._members) == 1:
            # Dispatched before the cluster was recorded (by MCAD, which had no clusterName):
            # in single-cluster mode there is only one place it can be.
            return next(iter(self._members.values()))
        return self._members.get(status.clusterName or "")

    async def reconcile(self, key: str) -> Result:
        obj = self._status.current(key)
        if obj is None:
            return Result.done()
        try:
            aw = self._reader.parse(obj)
        except ValidationError as exc:
            if await self._endings.unreadable(obj, exc, now=self._moment()[1]):
                self.forget_all(key)
            return Result.done()
        phase = phase_of(aw)
        status = (aw.status or AppWrapperStatus()).editable_copy()
        if phase is Phase.DELETING:
            return await self._finalize(aw, obj)
        if phase is Phase.FINISHED:
            return await self._after_terminal(aw, status)
        if FINALIZER not in aw.metadata.finalizers:
            obj = await self._status.set_finalizer(obj, present=True)
        if phase is Phase.SUSPENDED or (phase is Phase.DISPATCHED and aw.spec.suspend):
            return await self._suspend(aw, obj, status, dispatched=phase is Phase.DISPATCHED)
        if not initialised(status):
            await self._initialize(aw, obj, status)
            return Result.done()
        if phase is Phase.BACKOFF:
            return await self._backoff(aw, obj, status)
        if phase is Phase.EVICTING:
            return await self._evict(aw, obj, status)
        if phase is Phase.DISPATCHED:
            return await self._follow(aw, obj, status)
        checks_after = None
        if self._provisioning is not None and (
            phase is Phase.RESERVED or checkstatus.checks_ready(status)
        ):
            # Held for its admission checks, or passed them and not fitted yet (a booking
            # can expire meanwhile): controller/lifecycle/provisioning.py carries them a step.
            checks_after = await self._provisioning.follow(aw, obj)
            if phase is Phase.RESERVED:
                return Result.done() if checks_after is None else Result.after(checks_after)
        priority, problem = self._reader.priority(aw)
        found = None if problem else self._spec_problem(aw, obj, priority)
        if found is not None:
            # Edited while queued (or requeued after an edit): the scheduler would skip it
            # for ever; say why instead.
            transition = cond.mark_failed(status, *found, now=self._moment()[1])
            await self._status.write(obj, status, [transition])
            return Result.done()
        if cond.set_priority(status, priority):
            await self._status.write(obj, status, [])
        self._schedule_soon()
        return Result.done() if checks_after is None else Result.after(checks_after)

    async def _initialize(self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus) -> None:
        """A new AppWrapper: a spec error ends it at once; a valid one goes to the scheduler,
        whose first decision (dispatch or wait) writes Init and Queueing with it, saving a
        status write per AppWrapper."""
        moment = self._moment()[1]
        priority, problem = self._reader.priority(aw)
        found = (Reason.INVALID_SPEC, problem) if problem else self._spec_problem(aw, obj, priority)
        if found is None:
            self._schedule_soon()
            return
        reason, problem = found
        transitions = [
            cond.initialize(status, priority=priority, now=moment),
            cond.mark_failed(status, reason, problem, now=moment),
        ]
        self._log.info(
            "appwrapper_invalid",
            appwrapper=aw.metadata.name,
            namespace=aw.metadata.namespace,
            reason=problem[:300],
        )
        await self._status.write(obj, status, transitions)

    def _spec_problem(self, aw: AppWrapper, obj: Obj, priority: int) -> tuple[Reason, str] | None:
        """Why `aw` can never be dispatched as written: its spec is invalid, or it may not
        be dispatched whatever the room (`AppWrapperReader.refusal`); None when neither."""
        workload = self._reader.workload(aw, priority=priority, now=self._moment()[1])
        if isinstance(workload, InvalidSpec):
            return Reason.INVALID_SPEC, workload.message
        refusal = self._reader.refusal(aw, obj)
        return (Reason.FORBIDDEN, refusal) if refusal else None

    async def _backoff(self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus) -> Result:
        now, moment = self._moment()
        backoff = status.condition(C.BACKOFF)
        seconds = self._pause(aw)
        waited = seconds_since(backoff.lastTransitionMicroTime if backoff else None, now)
        if waited < seconds:
            return Result.after(seconds - waited)
        await self._status.write(obj, status, [cond.end_backoff(status, now=moment)])
        self._schedule_soon()
        return Result.done()

    def _requeuing(self, aw: AppWrapper) -> Requeuing:
        """The spec's requeuing with the v1beta2 fault-tolerance annotations applied."""
        requeuing, annotations = aw.spec.schedulingSpec.requeuing, aw.metadata.annotations
        return effective_requeuing(requeuing, annotations, self._config.fault_tolerance.bounds())

    def _pause(self, aw: AppWrapper) -> float:
        """The backoff after a requeue."""
        pause = self._requeuing(aw).pauseTimeInSeconds
        return self._config.requeue_pause_seconds if pause is None else float(pause)

    async def _requeue(
        self,
        aw: AppWrapper,
        obj: Obj,
        status: AppWrapperStatus,
        reason: Reason,
        message: str,
        *,
        backoff: bool,
        remove_from: Member | None,
        preempted_by: str = "",
    ) -> None:
        """Every requeue: remove the objects (unless their member is out of reach; the
        collector takes them when it answers again), then back to the queue."""
        if remove_from is not None:
            await self._maker.remove(aw, remove_from)
        transition = cond.mark_requeued(
            status,
            reason,
            message,
            now=self._moment()[1],
            backoff=backoff,
            preempted_by=preempted_by,
        )
        await self._status.write(obj, status, [transition])
        self._recorder.evicted(status, reason.value)
        self.forget(aw.key)
        self._log.info(
            "requeued",
            appwrapper=aw.metadata.name,
            namespace=aw.metadata.namespace,
            reason=reason.value,
            message=message[:300],
        )
        self._schedule_soon()

    async def _suspend(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, *, dispatched: bool
    ) -> Result:
        """`spec.suspend`: a dispatched one has its objects removed and is requeued; a
        queued one is held, saying why."""
        if dispatched:
            await self._requeue(
                aw,
                obj,
                status,
                Reason.SUSPENDED,
                cond.SUSPENDED_MESSAGE,
                backoff=False,
                remove_from=self.member_of(status),
            )
            return Result.done()
        priority, _ = self._reader.priority(aw)
        transition = cond.mark_suspended(status, priority=priority, now=self._moment()[1])
        if transition is not None:
            await self._status.write(obj, status, [transition])
        return Result.done()

    async def _evict(self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus) -> Result:
        member = self.member_of(status)
        if member is not None and member.lost(self._config.member_timeout_seconds):
            member = None  # out of reach: the collector removes its copies when it answers
        elif member is not None:
            # Its objects stay until the time its eviction gave it (notice.py).
            waiting = await self._notices.follow(aw, obj, status, member)
            if waiting is not None:
                return waiting
        await self._requeue(
            aw,
            obj,
            status,
            Reason.PREEMPTED,
            self._notices.eviction_message(aw, status),
            backoff=True,
            remove_from=member,
            preempted_by=status.preemptedBy or "",
        )
        return Result.done()

    async def _follow(self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus) -> Result:
        """A dispatched AppWrapper, step by step: its member still there; its dispatch still
        wanted; its objects there; its pods and objects counted; the verdict acted on."""
        member = self.member_of(status)
        stranded = self._stranded(member, status)
        if member is None or stranded:
            await self._requeue(
                aw,
                obj,
                status,
                Reason.CLUSTER_UNREACHABLE,
                stranded,
                backoff=False,
                remove_from=None,
            )
            return Result.done()
        if not member.synced:
            # Its pods are not known yet (it has not answered since the start): judging them
            # would be deciding on a partial view. Its sync, or upkeep, brings this back.
            return Result.after(UNSYNCED_RECHECK_SECONDS)
        unwanted = await self._unwanted(aw, status)
        if unwanted is not None:
            reason, message = unwanted
            await self._requeue(aw, obj, status, reason, message, backoff=False, remove_from=member)
            # After an edit, back here at once: a new spec that is invalid, or no longer
            # attributed, is answered here (the scheduler passes over it without a word).
            return Result.now() if reason is Reason.SPEC_CHANGED else Result.done()
        if status.is_true(C.BACKOFF):  # dispatched and backing off: a reset
            return await self._resetting(aw, obj, status, member)
        objects: list[Wrapped] = []
        if self._ensured.get(aw.key) != (status.lastDispatchedAt or ""):
            ensured = await self._ensure_objects(aw, obj, status, member)
            if isinstance(ensured, Result):
                return ensured
            objects, obj = ensured
        if self._ensured.get(aw.key) and status.objectsMadeFor != status.lastDispatchedAt:
            obj = await self._record_made(obj, status)
        progress, counts_changed, polled = await self._progress(aw, status, member, objects)
        retry = retry_policy(aw.metadata.annotations, self._config.fault_tolerance.bounds())
        failing_for = self._resets.seconds_failing(
            aw.key, status, failing=progress.failing, now=self._clock.time()
        )
        verdict = assess(
            replace(progress, seconds_failing=failing_for),
            requeuing=self._requeuing(aw),
            duration_limit=aw.spec.schedulingSpec.dispatchDuration.limit,
            retry=retry,
        )
        return await self._act_on(aw, obj, status, member, verdict, counts_changed, polled)

    async def _resetting(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, member: Member
    ) -> Result:
        now, moment = self._moment()
        retry = retry_policy(aw.metadata.annotations, self._config.fault_tolerance.bounds())
        pause = retry.pause_seconds if retry is not None else self._pause(aw)
        step = await self._resets.step(aw, status, member, now=now, moment=moment, pause=pause)
        if step.transition is None:
            return Result.after(step.wait)
        await self._status.write(obj, status, [step.transition])
        return Result.now()  # make its objects again

    def _stranded(self, member: Member | None, status: AppWrapperStatus) -> str:
        """Why an AppWrapper dispatched to `member` cannot be followed there ("" if it can)."""
        if member is None:
            return f"dispatched to cluster {status.clusterName!r}, which is not configured"
        if member.lost(self._config.member_timeout_seconds):
            return (
                f"cluster {member.name} has not answered for {int(member.silent_for())}s; "
                "requeued (its copies are removed when it answers again)"
            )
        return ""

    async def _unwanted(
        self, aw: AppWrapper, status: AppWrapperStatus
    ) -> tuple[Reason, str] | None:
        """Why its dispatch is no longer wanted as made, if it is not: its queue drained,
        its objects edited (what was dispatched goes, and the new spec is validated and
        fitted like any other before anything of it is created), or its provisioned
        capacity revoked (as for a lost node)."""
        drained = self._quotas.draining(status)
        if drained:
            return Reason.QUEUE_DRAINED, drained
        change = spec_change(aw)
        if change:
            return (
                Reason.SPEC_CHANGED,
                f"the wrapped objects changed after dispatch ({change}); requeued so the new "
                "spec is validated and scheduled again",
            )
        revoked = await self._provisioning.revoked(aw) if self._provisioning else ""
        return (Reason.CAPACITY_REVOKED, revoked) if revoked else None

    async def _ensure_objects(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, member: Member
    ) -> tuple[list[Wrapped], Obj] | Result:
        """Make this attempt's objects exist in `member` (the maker's step): the objects
        built and the AppWrapper as read, or what to do when they cannot be (yet)."""
        try:
            made = await self._maker.ensure(aw, obj, status, member)
        except Exception as exc:
            return await self._making_failed(aw, obj, status, member, exc)
        self._own_errors.pop(aw.key, None)
        if isinstance(made, NotYet):
            return Result.after(made.seconds)
        self._ensured[aw.key] = status.lastDispatchedAt or ""
        return made.objects, obj

    async def _record_made(self, obj: Obj, status: AppWrapperStatus) -> Obj:
        """Write at once, once per attempt, that its objects all exist (`objectsMadeFor`:
        v1beta2's phase Running, the AppWrapper controller's meaning). Not paced to ride on
        a later write: pods the objects make may be ready before that write comes, and the
        phase must not trail what a user can already see (a status write takes
        milliseconds; a pod's scheduling and start take longer). Level-based: should the
        write fail, the next reconcile writes it."""
        status.objectsMadeFor = status.lastDispatchedAt
        return await self._status.write(obj, status, [])

    async def _progress(
        self, aw: AppWrapper, status: AppWrapperStatus, member: Member, objects: list[Wrapped]
    ) -> tuple[Progress, bool, bool]:
        """How it does (`controller.progress.measure`), with the pods it declared."""
        now, moment = self._moment()
        workload = self._reader.workload(aw, priority=status.priority or 0, now=moment)
        expected = tracked_pod_count(workload.pod_sets) if isinstance(workload, Workload) else 0
        return await measure(
            aw,
            status,
            member,
            objects,
            expected=expected,
            now=now,
            # Made by an earlier look of this process (not just now: a watch cache may not
            # have seen a create yet, and a GET per object per dispatch is not worth it).
            look_for_missing=not objects
            and bool(status.lastDispatchedAt)
            and status.objectsMadeFor == status.lastDispatchedAt,
            wake_owner=self._wake_owner,
            start_task=self._start_task,
        )

    async def _act_on(
        self,
        aw: AppWrapper,
        obj: Obj,
        status: AppWrapperStatus,
        member: Member,
        verdict: Assessment,
        counts_changed: bool,
        polled: bool,
    ) -> Result:
        """Write what the verdict says (a requeue, a milestone, or pod counts alone, paced by
        `progress.Pacing`) and when to look again."""
        key = aw.key
        now, moment = self._moment()
        was_running = status.is_true(C.RUNNING)
        message = verdict.message
        if verdict.verdict is Verdict.REQUEUE:
            assert verdict.reason is not None
            await self._requeue(
                aw, obj, status, verdict.reason, message, backoff=True, remove_from=member
            )
            return Result.done()
        if verdict.verdict is Verdict.RESET:
            await self._status.write(
                obj, status, [cond.mark_resetting(status, message, now=moment)]
            )
            self.forget(key)
            return Result.now()  # remove its objects
        transition: Transition | None = None
        if verdict.verdict is Verdict.RUNNING:
            transition = cond.mark_running(status, message, now=moment)
        elif verdict.verdict is Verdict.RUNNING_HOLD_COMPLETION:
            transition = cond.mark_running_hold_completion(status, message, now=moment)
        elif verdict.verdict is Verdict.COMPLETED:
            transition = cond.mark_completed(status, message, now=moment)
        elif verdict.verdict is Verdict.FAILED:
            assert verdict.reason is not None
            transition = cond.mark_failed(status, verdict.reason, message, now=moment)
        watching = verdict.verdict in (
            Verdict.RUNNING,
            Verdict.WAIT,
            Verdict.RUNNING_HOLD_COMPLETION,
        )
        poll = POLL_SECONDS if polled and watching else None
        recheck = None if verdict.recheck_after is None else max(verdict.recheck_after, 0.05)
        if transition is not None:
            await self._status.write(obj, status, [transition])
            self._pacing.written(key, now)  # the counts with it
            if not was_running and status.is_true(C.RUNNING):  # Running at last
                self._recorder.running(aw, status, seconds_since(status.lastDispatchedAt, now))
            if verdict.verdict is Verdict.FAILED:
                return await self._after_terminal(aw, status)  # give the capacity back
            return Result.soonest(poll, recheck)
        # Pod counts alone move often (every pod start): written at most every few seconds
        # so a large gang does not cost a status write per pod; the first ones after a
        # dispatch wait for the Running write that usually follows.
        wait = self._pacing.wait(key, status, now, counts_changed=counts_changed)
        if wait == 0:
            await self._status.write(obj, status, [])
            self._pacing.written(key, now)
            return Result.soonest(poll, recheck)
        return Result.soonest(poll, recheck, wait)

    async def _making_failed(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, member: Member, exc: Exception
    ) -> Result:
        """An error met making the objects, acted on as the one policy decides: the user's
        ends it Failed (its capacity given back); a dispatch that may succeed later is
        requeued (its room given back); the dispatcher's own leaves it dispatched (its room
        held), says so in its status (once per error) and is tried again with growing
        pauses, as the work queue does. A Conflict or NotFound is the work queue's."""
        decision = decide(exc, doing=MAKING)
        if decision.action in (Action.RERUN, Action.FORGET):
            raise exc
        now = self._moment()[1]
        where = {
            "appwrapper": aw.metadata.name,
            "namespace": aw.metadata.namespace,
            "cluster": status.clusterName,
        }
        if decision.action is Action.RETRY:
            attempts = self._own_errors.get(aw.key, 0)
            self._own_errors[aw.key] = attempts + 1
            delay = retry_delay(OWN_ERROR_FIRST_SECONDS, attempts, OWN_ERROR_MAX_SECONDS)
            self._log.error(
                "dispatch_crashed", **where, attempts=attempts + 1, retry_in=delay, exc_info=exc
            )
            stalled = cond.mark_stalled(status, Reason.DISPATCH_FAILED, decision.message, now=now)
            if stalled is not None:
                await self._status.write(obj, status, [stalled])
            return Result.after(delay)
        assert decision.reason is not None  # FAIL and REQUEUE carry one
        fail = decision.action is Action.FAIL
        self._log.warning("dispatch_failed", **where, reason=decision.message[:300], users=fail)
        if fail:
            transition = cond.mark_failed(status, decision.reason, decision.message, now=now)
            await self._status.write(obj, status, [transition])
            return await self._after_terminal(aw, status)
        # create_all removed what this attempt created, but not objects made before a
        # restart (or adopted): they hold room nothing reserves once it is requeued.
        await self._requeue(
            aw, obj, status, decision.reason, decision.message, backoff=True, remove_from=member
        )
        # Nothing of this attempt may be left to wake it (no objects, so no pod events):
        # the end of the pause must come back by itself.
        return Result.soonest(self._pause(aw))

    async def _after_terminal(self, aw: AppWrapper, status: AppWrapperStatus) -> Result:
        """Failed AppWrappers give their capacity back: their objects are removed once.
        Completed ones keep theirs (finished pods hold nothing; logs stay readable)."""
        self.forget(aw.key)
        if not status.is_true(C.FAILED):
            return Result.done()
        return await self._endings.clean_failed(aw, status, self.member_of(status))

    async def _finalize(self, aw: AppWrapper, obj: Obj) -> Result:
        """Deletion: its objects removed wherever they may be, then the finalizer."""
        member = self.member_of(aw.status or AppWrapperStatus())
        if not await self._endings.finalize(aw, obj, member):
            return Result.after(0.5)
        self.forget_all(aw.key)
        return Result.done()


__all__ = ["Reconciler", "Result"]
