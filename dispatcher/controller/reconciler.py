"""The reconciler: `reconcile(key) -> Result`, the one creator and deleter of wrapped objects.

Side effects: creates and deletes wrapped objects in member clusters; writes status (through
the status writer) for every step after the scheduler's: invalid specs, backoff, Running,
Completed, Failed and every requeue; adds and removes the finalizer.

Level-based: it reads the newest AppWrapper (the status writer's overlay or the watch cache)
and makes the world match it, so a missed event or a restart costs nothing:
- new: validate; a spec error ends it Failed, a valid one is left to the scheduler;
- backing off: wait out the pause, then queue it again;
- dispatched: make sure its objects exist (created after the scheduler's write, or adopted
  after a restart), then follow its pods and objects to Running, Completed, Failed or a
  requeue; a member silent for too long requeues it;
- evicting (chosen as a victim): remove its objects, requeue it;
- Failed: remove its objects once, giving the capacity back;
- deleting: remove its objects wherever they may be, then the finalizer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from dispatcher.api.constants import FINALIZER
from dispatcher.api.models import AppWrapper, AppWrapperStatus, Reason, parse_time
from dispatcher.clock import Clock
from dispatcher.cluster.member import Member
from dispatcher.config import Config
from dispatcher.controller.admission import Admission
from dispatcher.controller.models import Models
from dispatcher.controller.objects import (
    DispatchError,
    Wrapped,
    completion,
    create_all,
    delete_all,
    dispatched_objects,
    prepare_namespace,
    spec_change,
    target_namespace,
    wrapped_identities,
    wrapped_objects,
)
from dispatcher.controller.quotas import NO_QUOTAS, QuotaLookup
from dispatcher.controller.status import StatusWriter
from dispatcher.core import conditions as cond
from dispatcher.core.conditions import Transition
from dispatcher.core.lifecycle import Progress, Verdict, assess
from dispatcher.core.model import Workload, pod_count
from dispatcher.core.phase import Phase, phase_of
from dispatcher.core.workloads import InvalidSpec
from dispatcher.kube.errors import KubeError
from dispatcher.metrics.recorder import Recorder

Obj = dict[str, Any]
C = cond.C
COUNTS_INTERVAL = 5.0
"""Seconds between status writes that only update pod counts."""
TERMINATING_RETRY = 0.5
"""Seconds before trying again to create objects whose earlier copies are being deleted."""
TERMINATING_LIMIT = 300.0
"""Seconds after dispatch that a dispatch waits for earlier copies to go before it requeues."""
POLL_SECONDS = 2.0
"""When a wrapped object's status was read by GET, look again this much later."""
TERMINATING_POLL_SECONDS = 1.0
"""How often a dispatch waiting for an earlier attempt's pods to go looks again (their
deletion also wakes it)."""
UNSYNCED_RECHECK_SECONDS = 5.0
"""A dispatched AppWrapper on a member whose caches have not synced: look again then."""
RELEASED_KEPT = 4096


@dataclass(frozen=True, slots=True)
class Result:
    """What should happen next: `requeue_after` seconds, reconcile again (None: only when
    something changes)."""

    requeue_after: float | None = None


DONE = Result()


def _seconds_since(stamp: str | None, now: float) -> float:
    if not stamp:
        return 0.0
    try:
        return now - parse_time(stamp).timestamp()
    except ValueError:
        return 0.0


def _soonest(*delays: float | None) -> Result:
    given = [d for d in delays if d is not None]
    return Result(min(given)) if given else DONE


class Reconciler:
    def __init__(
        self,
        *,
        config: Config,
        models: Models,
        status: StatusWriter,
        members: Mapping[str, Member],
        clock: Clock,
        schedule_soon: Callable[[], None],
        start_task: Callable[[Coroutine[Any, Any, None], str], None],
        wake_owner: Callable[[str, Obj | None, Obj | None], None],
        quotas: QuotaLookup | None = None,
        admission: Admission | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self._config = config
        self._recorder = recorder or Recorder()
        self._admission = admission
        self._quotas = quotas or NO_QUOTAS
        self._models = models
        self._status = status
        self._members = members
        self._clock = clock
        self._schedule_soon = schedule_soon
        self._start_task = start_task
        self._wake_owner = wake_owner
        self._ensured: dict[str, str] = {}
        """key -> lastDispatchedAt of the attempt whose objects are known to exist."""
        self._cleaned: dict[str, tuple[str, str]] = {}
        """key -> (uid, lastDispatchedAt) of the failed attempt whose objects were removed."""
        self._counts_written: dict[str, float] = {}
        """key -> when pod counts alone were last written."""
        self._released: OrderedDict[str, None] = OrderedDict()
        """uids whose finalizer this replica removed (the most recent RELEASED_KEPT): the
        watch may show such an AppWrapper with its finalizer a moment longer (the answer to
        the last PATCH may carry no newer resourceVersion to read our own write by), and a
        reconcile then would look for its objects and patch again, for nothing."""
        self._log = structlog.get_logger("reconciler")

    def forget(self, key: str) -> None:
        """It finished or went: drop what only a live AppWrapper needs."""
        self._ensured.pop(key, None)
        self._counts_written.pop(key, None)

    def forget_all(self, key: str) -> None:
        self.forget(key)
        self._cleaned.pop(key, None)

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
            return DONE
        try:
            aw = self._models.parse(obj)
        except ValidationError as exc:
            meta = obj.get("metadata") or {}
            if meta.get("deletionTimestamp") and FINALIZER in (meta.get("finalizers") or []):
                # Unreadable, and going: without a model its objects cannot be listed, but
                # the finalizer must not hold it forever. Objects on the hub are owned by it
                # (the garbage collector takes them); members' are swept as orphans.
                await self._status.set_finalizer(obj, present=False)
                self.forget_all(key)
                return DONE
            await self._fail_unreadable(obj, exc)
            return DONE
        phase = phase_of(aw)
        status = (aw.status or AppWrapperStatus()).editable_copy()
        if phase is Phase.DELETING:
            return await self._finalize(aw, obj)
        if phase is Phase.FINISHED:
            return await self._after_terminal(aw, status)
        if FINALIZER not in aw.metadata.finalizers:
            obj = await self._status.set_finalizer(obj, present=True)
        if cond.is_new(status):
            await self._initialize(aw, obj, status)
            return DONE
        if phase is Phase.BACKOFF:
            return await self._backoff(aw, obj, status)
        if phase is Phase.EVICTING:
            await self._evict(aw, obj, status)
            return DONE
        if phase is Phase.DISPATCHED:
            return await self._follow(aw, obj, status)
        priority, problem = self._models.priority(aw)
        if not problem:
            workload = self._models.workload(aw, priority=priority, now=self._moment()[1])
            refusal = self._models.refusal(aw)
            if isinstance(workload, InvalidSpec) or refusal:
                # Edited while queued (or requeued after an edit): the scheduler would skip
                # it for ever; say why instead.
                reason, message = (
                    (Reason.FORBIDDEN, refusal)
                    if refusal
                    else (Reason.INVALID_SPEC, getattr(workload, "message", ""))
                )
                transition = cond.mark_failed(status, reason, message, now=self._moment()[1])
                await self._status.write(obj, status, [transition])
                return DONE
        if cond.set_priority(status, priority):
            await self._status.write(obj, status, [])
        self._schedule_soon()
        return DONE

    async def _fail_unreadable(self, obj: Obj, exc: ValidationError) -> None:
        message = "spec does not match the AppWrapper API: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        if (obj.get("status") or {}).get("message") == message:
            return
        status = AppWrapperStatus()
        transition = cond.mark_failed(status, Reason.INVALID_SPEC, message, now=self._moment()[1])
        await self._status.write(obj, status, [transition])

    async def _initialize(self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus) -> None:
        """A new AppWrapper: a spec error ends it at once; a valid one goes to the scheduler,
        whose first decision (dispatch or wait) writes Init and Queueing with it, saving a
        status write per AppWrapper."""
        moment = self._moment()[1]
        priority, problem = self._models.priority(aw)
        reason = Reason.INVALID_SPEC
        if not problem:
            workload = self._models.workload(aw, priority=priority, now=moment)
            if isinstance(workload, InvalidSpec):
                problem = workload.message
        if not problem:
            problem = self._models.refusal(aw)
            reason = Reason.FORBIDDEN
        if not problem:
            self._schedule_soon()
            return
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

    async def _backoff(self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus) -> Result:
        now, moment = self._moment()
        backoff = status.condition(C.BACKOFF)
        seconds = self._pause(aw)
        waited = _seconds_since(backoff.lastTransitionMicroTime if backoff else None, now)
        if waited < seconds:
            return Result(seconds - waited)
        await self._status.write(obj, status, [cond.end_backoff(status, now=moment)])
        self._schedule_soon()
        return DONE

    def _pause(self, aw: AppWrapper) -> float:
        """The backoff after a requeue."""
        pause = aw.spec.schedulingSpec.requeuing.pauseTimeInSeconds
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
            await self._remove_objects(aw, remove_from)
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

    async def _evict(self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus) -> None:
        preempted = status.condition(C.PREEMPTED)
        member = self.member_of(status)
        if member is not None and member.silent_for() > self._config.member_timeout_seconds:
            member = None  # out of reach: the collector removes its copies when it answers
        await self._requeue(
            aw,
            obj,
            status,
            Reason.PREEMPTED,
            preempted.message if preempted is not None else "preempted",
            backoff=True,
            remove_from=member,
            preempted_by=status.preemptedBy or "",
        )

    async def _follow(self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus) -> Result:
        """A dispatched AppWrapper: its objects exist; its pods and objects say how it does."""
        key = aw.key
        now, moment = self._moment()
        member = self.member_of(status)
        stranded = ""
        if member is None:
            stranded = f"dispatched to cluster {status.clusterName!r}, which is not configured"
        elif not member.is_hub and member.silent_for() > self._config.member_timeout_seconds:
            stranded = (
                f"cluster {member.name} has not answered for {int(member.silent_for())}s; "
                "requeued (its copies are removed when it answers again)"
            )
        if member is not None and not stranded and not member.synced:
            # Its pods are not known yet (it has not answered since the start): judging them
            # would be deciding on a partial view. Its sync, or upkeep, brings this back.
            return Result(UNSYNCED_RECHECK_SECONDS)
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
            return DONE
        drained = self._quotas.draining(status)
        if drained:
            await self._requeue(
                aw, obj, status, Reason.QUEUE_DRAINED, drained, backoff=False, remove_from=member
            )
            return DONE
        change = spec_change(aw)
        if change:
            # Edited after dispatch: what was dispatched goes, and the new spec is validated
            # and fitted like any other before anything of it is created.
            await self._requeue(
                aw,
                obj,
                status,
                Reason.SPEC_CHANGED,
                f"the wrapped objects changed after dispatch ({change}); requeued so the new "
                "spec is validated and scheduled again",
                backoff=False,
                remove_from=member,
            )
            # Back here at once: a new spec that is invalid, or no longer attributed, is
            # answered here (the scheduler passes over it without a word).
            return Result(0.0)
        objects: list[Wrapped] = []
        stamp = status.lastDispatchedAt or ""
        if self._ensured.get(key) != stamp:
            if any(p.deleting for p in member.capacity.owned_pods(key, aw.metadata.uid or "")):
                # An earlier attempt's pods are still terminating: objects made now would
                # make a second gang, bound wherever kube-scheduler finds room (room the
                # dispatcher has given to others) while the first still holds its own.
                return Result(TERMINATING_POLL_SECONDS)
            try:
                # The recorded creator's rights, asked again now: they may have been taken
                # away while it queued, or it may have been created past the webhook.
                refused = (
                    await self._admission.dispatch_problem(obj, member.client)
                    if self._admission is not None
                    else ""
                )
            except KubeError as exc:
                error = DispatchError(f"checking the creator's rights: {exc}", permanent=False)
                return await self._dispatch_failed(aw, obj, status, error, member)
            if refused:
                forbidden = cond.mark_failed(status, Reason.FORBIDDEN, refused, now=moment)
                await self._status.write(obj, status, [forbidden])
                return await self._after_terminal(aw, status)
            # Built only when needed: it deep-copies every template, and following runs on
            # every pod change of every dispatched AppWrapper.
            try:
                objects = wrapped_objects(
                    aw, owner_reference=member.is_hub, flavors=self._quotas.flavors_of(status)
                )
                namespace = await prepare_namespace(member, aw.metadata.namespace)
                made = await create_all(
                    member.client, namespace, objects, uid=aw.metadata.uid or ""
                )
            except (DispatchError, KubeError) as exc:
                error = (
                    exc
                    if isinstance(exc, DispatchError)
                    else DispatchError(str(exc), permanent=False)
                )
                return await self._dispatch_failed(aw, obj, status, error, member)
            except Exception as exc:  # user data must not wedge the AppWrapper
                # Anything else while building or creating comes from the template: retrying
                # would meet it again, so it ends the AppWrapper with the reason.
                error = DispatchError(f"{type(exc).__name__}: {str(exc)[:300]}", permanent=True)
                return await self._dispatch_failed(aw, obj, status, error, member)
            if made.terminating:
                # An earlier attempt's objects are still going (a requeue deleted them):
                # adopting them would leave this attempt with objects about to vanish.
                if _seconds_since(status.lastDispatchedAt, now) > TERMINATING_LIMIT:
                    # Held by a finalizer nobody removes: give the room back and retry later.
                    stuck = DispatchError(
                        f"{', '.join(made.terminating[:5])} still being deleted after "
                        f"{int(TERMINATING_LIMIT)}s",
                        permanent=False,
                    )
                    return await self._dispatch_failed(aw, obj, status, stuck, member)
                self._log.info(
                    "waiting_for_old_objects",
                    appwrapper=aw.metadata.name,
                    namespace=aw.metadata.namespace,
                    objects=list(made.terminating[:5]),
                )
                return Result(TERMINATING_RETRY)
            self._ensured[key] = stamp
        counts = member.capacity.pod_counts(key, aw.metadata.uid or "")
        changed = cond.set_pod_counts(
            status,
            pending=counts.pending,
            running=counts.running,
            succeeded=counts.succeeded,
            failed=counts.failed,
        )
        workload = self._models.workload(aw, priority=status.priority or 0, now=moment)
        expected = pod_count(workload.pod_sets) if isinstance(workload, Workload) else 0
        min_available = aw.spec.schedulingSpec.minAvailable
        if min_available is None:
            min_available = expected
        completion_items = sum(1 for item in aw.spec.items if item.completion_conditions())
        done_items, failed_object, polled = 0, "", False
        # Wrapped objects report completion through their own status, also while pods run
        # (MCAD's RunningHoldCompletion). It comes from a watch cache of that kind (whose
        # changes wake this reconcile); until that cache has synced, from a GET, looked at
        # again a little later.
        if completion_items:
            objects = objects or wrapped_identities(aw)
            result = await completion(
                member.client,
                # Mapped: its objects were created there by this process, same settings.
                target_namespace(member, aw.metadata.namespace),
                objects,
                uid=aw.metadata.uid or "",
                caches=await member.completion_caches(
                    [(o.api_version, o.kind) for o in objects if o.completion],
                    on_change=self._wake_owner,
                    start_task=self._start_task,
                ),
            )
            completion_items, done_items = result.items, result.done
            failed_object, polled = result.failed, result.polled
        progress = Progress(
            expected_pods=expected,
            min_available=min_available,
            pending=counts.pending,
            running=counts.running,
            succeeded=counts.succeeded,
            failed=counts.failed,
            seconds_since_dispatch=_seconds_since(status.lastDispatchedAt, now),
            requeue_count=status.requeueCount,
            reached_running=status.is_true(C.RUNNING),
            completion_items=completion_items,
            completed_items=done_items,
            failed_object=failed_object,
        )
        verdict = assess(
            progress,
            requeuing=aw.spec.schedulingSpec.requeuing,
            duration_limit=aw.spec.schedulingSpec.dispatchDuration.limit,
        )
        message = verdict.message
        transition: Transition | None = None
        if verdict.verdict is Verdict.REQUEUE:
            assert verdict.reason is not None
            await self._requeue(
                aw, obj, status, verdict.reason, message, backoff=True, remove_from=member
            )
            return DONE
        if verdict.verdict is Verdict.RUNNING:
            transition = cond.mark_running(status, message, now=moment)
        elif verdict.verdict is Verdict.HOLD_COMPLETION:
            transition = cond.mark_holding_completion(status, message, now=moment)
        elif verdict.verdict is Verdict.COMPLETED:
            transition = cond.mark_completed(status, message, now=moment)
        elif verdict.verdict is Verdict.FAILED:
            assert verdict.reason is not None
            transition = cond.mark_failed(status, verdict.reason, message, now=moment)
        watching = verdict.verdict in (Verdict.RUNNING, Verdict.WAIT, Verdict.HOLD_COMPLETION)
        poll = POLL_SECONDS if polled and watching else None
        recheck = None if verdict.recheck_after is None else max(verdict.recheck_after, 0.05)
        if transition is not None:
            await self._status.write(obj, status, [transition])
            self._counts_written[key] = now
            if not progress.reached_running and status.is_true(C.RUNNING):  # Running at last
                self._recorder.running(aw, status, _seconds_since(status.lastDispatchedAt, now))
            if verdict.verdict is Verdict.FAILED:
                return await self._after_terminal(aw, status)  # give the capacity back
            return _soonest(poll, recheck)
        if changed:
            # Pod counts alone move often (every pod start); write them at most every few
            # seconds so a large gang does not cost a status write per pod. The first ones
            # after a dispatch wait for the Running write that usually follows.
            last = self._counts_written.get(key)
            if last is None:
                last = now - _seconds_since(status.lastDispatchedAt, now)
            since = now - last
            if since >= COUNTS_INTERVAL:
                await self._status.write(obj, status, [])
                self._counts_written[key] = now
            else:
                return _soonest(poll, recheck, COUNTS_INTERVAL - since)
        return _soonest(poll, recheck)

    async def _dispatch_failed(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, exc: DispatchError, member: Member
    ) -> Result:
        message = f"creating the wrapped objects failed: {exc}"
        self._log.warning(
            "dispatch_failed",
            appwrapper=aw.metadata.name,
            namespace=aw.metadata.namespace,
            cluster=status.clusterName,
            reason=str(exc)[:300],
            permanent=exc.permanent,
        )
        if exc.permanent:
            transition = cond.mark_failed(
                status, Reason.DISPATCH_FAILED, message, now=self._moment()[1]
            )
            await self._status.write(obj, status, [transition])
            return await self._after_terminal(aw, status)
        # create_all removed what this attempt created, but not objects made before a
        # restart (or adopted): they hold room nothing reserves once it is requeued.
        await self._requeue(
            aw, obj, status, Reason.DISPATCH_FAILED, message, backoff=True, remove_from=member
        )
        # Nothing of this attempt may be left to wake it (no objects, so no pod events):
        # the end of the pause must come back by itself.
        return Result(self._pause(aw))

    async def _remove_objects(self, aw: AppWrapper, member: Member) -> list[str]:
        """Delete `aw`'s wrapped objects in `member`: those its latest dispatch recorded (the
        spec may have been edited since), only if they carry its uid; returns the ones still
        there."""
        namespace = member.namespace_for(aw.metadata.namespace)
        if namespace is None:
            return []  # not mapped there (any more): no namespace to look in
        return await delete_all(
            member.client,
            namespace,
            dispatched_objects(aw, owner_reference=member.is_hub),
            uid=aw.metadata.uid or "",
        )

    async def _after_terminal(self, aw: AppWrapper, status: AppWrapperStatus) -> Result:
        """Failed AppWrappers give their capacity back: their objects are removed once.
        Completed ones keep theirs (finished pods hold nothing; logs stay readable)."""
        self.forget(aw.key)
        if not status.is_true(C.FAILED):
            return DONE
        member = self.member_of(status)
        attempt = (aw.metadata.uid or "", status.lastDispatchedAt or "")
        if member is None or self._cleaned.get(aw.key) == attempt:
            return DONE
        if await self._remove_objects(aw, member):
            return Result(1.0)
        self._cleaned[aw.key] = attempt
        return DONE

    async def _finalize(self, aw: AppWrapper, obj: Obj) -> Result:
        """Deletion: remove the wrapped objects wherever they may be, then our finalizer."""
        if FINALIZER not in aw.metadata.finalizers or aw.metadata.uid in self._released:
            return DONE
        member = self.member_of(aw.status or AppWrapperStatus())
        targets = [member] if member is not None else list(self._members.values())
        remaining: list[str] = []
        for target in targets:
            try:
                remaining += await self._remove_objects(aw, target)
            except KubeError as exc:
                self._log.warning(
                    "deleting_objects_failed",
                    appwrapper=aw.metadata.name,
                    namespace=aw.metadata.namespace,
                    cluster=target.name,
                    error=str(exc)[:300],
                )
                remaining.append(f"{target.name}: {exc}")
        if remaining:
            self._log.info(
                "waiting_for_objects_to_go",
                appwrapper=aw.metadata.name,
                namespace=aw.metadata.namespace,
                remaining=remaining[:5],
            )
            return Result(0.5)
        await self._status.set_finalizer(obj, present=False)
        if aw.metadata.uid:
            self._released[aw.metadata.uid] = None
            if len(self._released) > RELEASED_KEPT:
                self._released.popitem(last=False)
        self.forget_all(aw.key)
        self._schedule_soon()
        return DONE


__all__ = ["DONE", "Reconciler", "Result"]
