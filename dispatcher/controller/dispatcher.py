"""The controller: watches AppWrappers on the hub, runs scheduling cycles over member
capacity, and carries out the decisions.

Side effects: all of them — API reads and writes on the hub and members, Events, timers.

Two loops share one `ControllerState`:
- reconcile workers take AppWrapper keys from a work queue and move each AppWrapper along
  its lifecycle (init, watch the dispatched ones, requeue, finish, delete);
- the scheduler runs a cycle whenever something that can change a decision happens
  (an AppWrapper queued, capacity freed), assumes each admission at once, and writes
  status and creates objects in background tasks without blocking the next cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from dispatcher.api.constants import (
    API_VERSION,
    FINALIZER,
    KIND,
    LABEL_NAME,
    LABEL_NAMESPACE,
    PLURAL,
)
from dispatcher.api.models import AppWrapper, AppWrapperStatus, Reason, parse_time, status_to_kube
from dispatcher.config import Config
from dispatcher.controller.collector import KNOWN_KINDS, collect
from dispatcher.controller.members import Member
from dispatcher.controller.objects import (
    DispatchError,
    Wrapped,
    completion,
    create_all,
    delete_all,
    ensure_namespace,
    wrapped_objects,
)
from dispatcher.controller.state import (
    NOT_SCHEDULED,
    Assumed,
    ControllerState,
    Holding,
    Obj,
    Standing,
)
from dispatcher.controller.workqueue import WorkQueue
from dispatcher.core import conditions as cond
from dispatcher.core.conditions import Transition
from dispatcher.core.lifecycle import Progress, Verdict, assess
from dispatcher.core.model import (
    AdmittedWorkload,
    ClusterSnapshot,
    PodSet,
    Reservation,
    Workload,
    pod_count,
)
from dispatcher.core.scheduling import (
    Claim,
    CycleResult,
    HonourClaims,
    LowestPriorityFirst,
    schedule,
)
from dispatcher.core.workloads import InvalidSpec
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import Conflict, KubeError, NotFound
from dispatcher.kube.events import EventRecorder
from dispatcher.kube.informer import Informer

APPWRAPPERS = ResourceInfo(API_VERSION, KIND, PLURAL, namespaced=True)
PRIORITY_CLASSES = ResourceInfo(
    "scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False
)
C = cond.C
CYCLE_BATCH_SECONDS = 0.005
CYCLE_BATCH_MAX_SECONDS = 0.25
WAITING_REWRITE_SECONDS = 10.0
WAITING_REFRESH_SECONDS = 300.0
WAITING_WRITERS = 16
COLLECT_EVERY = 60.0
"""Seconds between sweeps of a member for objects no hub AppWrapper places there."""
COUNTS_INTERVAL = 5.0
"""Seconds between status writes that only update pod counts."""
CLAIM_TIMEOUT = 120.0
"""Seconds a preemptor keeps its claim on the room its victims free before choosing anew."""


def _utc(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def _seconds_since(stamp: str | None, now: float) -> float:
    if not stamp:
        return 0.0
    try:
        return now - parse_time(stamp).timestamp()
    except ValueError:
        return 0.0


class Dispatcher:
    """Create with the hub client and members; `run()` until cancelled."""

    def __init__(
        self,
        *,
        config: Config,
        hub: KubeClient,
        members: list[Member],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.hub = hub
        self.members = {m.name: m for m in members}
        self.clock = clock
        self.state = ControllerState()
        self.queue = WorkQueue()
        self.events = EventRecorder(hub)
        self.appwrappers = Informer(
            hub,
            APPWRAPPERS,
            transform=_without_bookkeeping,
            # A finished one is read again only when it is deleted: kept as text.
            cold=lambda obj: _phase_of(obj) == "finished",
        )
        self.states: Counter[str] = Counter()
        """AppWrappers in the cache by status.state, kept by the watch handler (metrics)."""
        self.priority_classes = Informer(hub, PRIORITY_CLASSES)
        self.allowed_kinds = frozenset(config.allowed_kinds)
        self.preemption = LowestPriorityFirst() if config.preemption else None
        self._kick = asyncio.Event()
        self._dispatch_slots = asyncio.Semaphore(config.dispatch_concurrency)
        self._background: set[asyncio.Task[None]] = set()
        self._collecting: set[str] = set()
        self.cycles = 0
        self._cycle_seconds = 0.0
        self._group: asyncio.TaskGroup | None = None
        self._waiting: dict[str, str] = {}
        """key -> "why it waits" to write (behind the head), oldest first."""
        self._waiting_ready = asyncio.Event()
        self.preemptions = 0
        self.ready = asyncio.Event()
        self.log = structlog.get_logger("dispatcher")
        self.appwrappers.add_handler(self._on_appwrapper)
        self.priority_classes.add_handler(self._on_priority_class)
        for member in members:
            member.capacity.on_change = self._on_capacity
            member.pods.add_handler(self._on_pod)

    # -- wiring ------------------------------------------------------------------------

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._group = group
            group.create_task(self.appwrappers.run(), name="appwrappers")
            group.create_task(self.priority_classes.run(), name="priorityclasses")
            group.create_task(self.events.run(), name="events")
            for member in self.members.values():
                group.create_task(member.run(), name=f"member-{member.name}")
            # Workers start only once every cache has synced: decisions on a partial view
            # could overcommit (pods not yet seen) or double-create (dispatches not yet seen).
            await self.appwrappers.synced.wait()
            await self.priority_classes.synced.wait()
            for member in self.members.values():
                await member.wait_synced()
            self.log.info(
                "caches_synced", appwrappers=len(self.appwrappers.store), members=list(self.members)
            )
            for key in list(self.appwrappers.store):
                self.queue.add(key)
            for index in range(self.config.workers):
                group.create_task(self._worker(), name=f"worker-{index}")
            group.create_task(self._scheduler(), name="scheduler")
            for index in range(WAITING_WRITERS):
                group.create_task(self._waiting_writer(), name=f"waiting-writer-{index}")
            group.create_task(self._upkeep(), name="members-upkeep")
            self.ready.set()
            self._kick.set()

    def _on_appwrapper(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if old is not None:
            self.states[_state_of(old)] -= 1
        if new is not None:
            self.states[_state_of(new)] += 1
        obj = new or old
        if obj is None:
            return
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        if new is None:
            self.state.forget(key)
            self.state.phases.pop(key, None)
            self._kick.set()
            return
        self.queue.add(key)
        phase = (_phase_of(new), new["metadata"].get("generation"))
        if self.state.phases.get(key) != phase:
            # Only a change of phase (or of spec) can change a decision; our own status
            # writes on a waiting AppWrapper must not trigger cycle after cycle.
            self.state.phases[key] = phase
            if phase[0] == "finished":
                self.state.retire(key)
            self._kick.set()

    def _on_capacity(self, reason: str) -> None:
        if reason != "pod-changed":
            self._kick.set()

    def _on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        labels = (new or old or {}).get("metadata", {}).get("labels") or {}
        name = labels.get(LABEL_NAME)
        if name:
            self.queue.add(f"{labels.get(LABEL_NAMESPACE)}/{name}")

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- reading ---------------------------------------------------------------------

    def _current(self, key: str) -> Obj | None:
        return self.state.latest(key, self.appwrappers.store.get(key))

    def _priority(self, aw: AppWrapper) -> tuple[int, str]:
        """Effective priority and, if the class is unknown, the error."""
        name = aw.spec.priorityClassName
        if not name:
            return aw.spec.priority, ""
        found = self.priority_classes.store.get(name)
        if found is None:
            return aw.spec.priority, f"PriorityClass {name!r} not found"
        return int(found.get("value", 0)), ""

    def _member_of(self, status: AppWrapperStatus) -> Member | None:
        if not status.clusterName and len(self.members) == 1:
            # Dispatched before the cluster was recorded (by MCAD, which had no clusterName):
            # in single-cluster mode there is only one place it can be.
            return next(iter(self.members.values()))
        return self.members.get(status.clusterName or "")

    async def _write_status(
        self, obj: Obj, status: AppWrapperStatus, transitions: list[Transition | None]
    ) -> Obj:
        """One status write with optimistic concurrency, and an Event for what changed."""
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": obj["metadata"]["name"],
                "namespace": obj["metadata"]["namespace"],
                "resourceVersion": obj["metadata"]["resourceVersion"],
            },
            "status": status_to_kube(status),
        }
        written = await self.hub.replace(
            APPWRAPPERS, obj["metadata"]["namespace"], obj["metadata"]["name"], body, sub="status"
        )
        key = f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        self.state.written[key] = _without_bookkeeping(written)
        happened = [t for t in transitions if t is not None and t.reason]
        if happened:
            # One Event per write, named after its last (weightiest) step and telling every
            # step: a queued-and-dispatched AppWrapper costs the API server one Event, not two.
            self.events.record(
                written,
                reason=happened[-1].reason,
                message="; ".join(t.message for t in happened),
                warning=any(t.warning for t in happened),
            )
        return written

    # -- reconcile -------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            log = self.log.bind(appwrapper=key.split("/", 1)[1], namespace=key.split("/", 1)[0])
            try:
                await self._reconcile(key)
                self.queue.forget(key)
            except Conflict:
                # Someone (often our own earlier write) changed it: re-read and go again.
                self.queue.add(key)
            except KubeError as exc:
                delay = self.queue.retry(key)
                log.warning("reconcile_failed", error=str(exc)[:300], retry_in=round(delay, 2))
            except Exception:
                delay = self.queue.retry(key)
                log.exception("reconcile_crashed", retry_in=round(delay, 2))
            finally:
                self.queue.done(key)

    async def _reconcile(self, key: str) -> None:
        obj = self._current(key)
        if obj is None:
            return
        now = self.clock()
        try:
            aw = self.state.parse(obj)
        except ValidationError as exc:
            await self._fail_unreadable(obj, exc, now)
            return
        if aw.metadata.deletionTimestamp:
            await self._finalize(aw, obj)
            return
        status = (aw.status or AppWrapperStatus()).editable_copy()
        if cond.is_terminal(status):
            await self._after_terminal(aw, status)
            return
        if FINALIZER not in aw.metadata.finalizers:
            obj = await self._add_finalizer(obj)
        priority, priority_error = self._priority(aw)
        if cond.is_new(status):
            await self._initialize(aw, obj, status, priority, priority_error, now)
            return
        if status.is_true(C.BACKOFF):
            await self._backoff(aw, obj, status, now)
            return
        if cond.is_dispatched(status):
            await self._watch_dispatched(aw, obj, status, now)
            return
        if cond.set_priority(status, priority):
            await self._write_status(obj, status, [])
        self._kick.set()

    async def _fail_unreadable(self, obj: Obj, exc: ValidationError, now: float) -> None:
        status = AppWrapperStatus()
        message = "spec does not match the AppWrapper API: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        if (obj.get("status") or {}).get("message") == message:
            return
        transition = cond.mark_failed(status, Reason.INVALID_SPEC, message, now=_utc(now))
        await self._write_status(obj, status, [transition])

    async def _add_finalizer(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        patch = {
            "metadata": {
                "finalizers": [*(meta.get("finalizers") or []), FINALIZER],
                "resourceVersion": meta["resourceVersion"],
            }
        }
        written = await self.hub.merge_patch(APPWRAPPERS, meta["namespace"], meta["name"], patch)
        self.state.written[f"{meta['namespace']}/{meta['name']}"] = _without_bookkeeping(written)
        return written

    async def _initialize(
        self,
        aw: AppWrapper,
        obj: Obj,
        status: AppWrapperStatus,
        priority: int,
        priority_error: str,
        now: float,
    ) -> None:
        """A new AppWrapper: a spec error ends it at once; a valid one goes to the scheduler,
        whose first decision (dispatch or wait) writes Init and Queueing with it, saving a
        status write per AppWrapper."""
        moment = _utc(now)
        problem = priority_error
        if not problem:
            workload = self.state.workload(
                aw, priority=priority, allowed_kinds=self.allowed_kinds, now=moment
            )
            if isinstance(workload, InvalidSpec):
                problem = workload.message
        if not problem:
            self._kick.set()
            return
        transitions = [
            cond.initialize(status, priority=priority, now=moment),
            cond.mark_failed(status, Reason.INVALID_SPEC, problem, now=moment),
        ]
        self.log.info(
            "appwrapper_invalid",
            appwrapper=aw.metadata.name,
            namespace=aw.metadata.namespace,
            reason=problem[:300],
        )
        await self._write_status(obj, status, transitions)

    async def _backoff(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, now: float
    ) -> None:
        backoff = status.condition(C.BACKOFF)
        pause = aw.spec.schedulingSpec.requeuing.pauseTimeInSeconds
        seconds = self.config.requeue_pause_seconds if pause is None else float(pause)
        waited = _seconds_since(backoff.lastTransitionMicroTime if backoff else None, now)
        if waited < seconds:
            self.queue.add_after(aw.key, seconds - waited)
            return
        transition = cond.end_backoff(status, now=_utc(now))
        await self._write_status(obj, status, [transition])
        self._kick.set()

    async def _watch_dispatched(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, now: float
    ) -> None:
        key = aw.key
        if key in self.state.dispatching:
            return  # the dispatch task finishes first; it re-queues the key
        member = self._member_of(status)
        moment = _utc(now)
        if member is None:
            message = f"dispatched to cluster {status.clusterName!r}, which is not configured"
            transition = cond.mark_requeued(
                status, Reason.CLUSTER_UNREACHABLE, message, now=moment, backoff=False
            )
            await self._write_status(obj, status, [transition])
            return
        # Built only when needed: it deep-copies every template, and this runs on every
        # pod change of every dispatched AppWrapper.
        objects: list[Wrapped] = []
        stamp = status.lastDispatchedAt or ""
        if self.state.ensured.get(key) != stamp:
            objects = wrapped_objects(aw, owner_reference=member.is_hub)
            # After a restart (or a crash between the status write and the creates), make
            # sure the objects exist; existing ones carrying our uid are adopted.
            try:
                await create_all(
                    member.client, aw.metadata.namespace, objects, uid=aw.metadata.uid or ""
                )
                self.state.ensured[key] = stamp
            except DispatchError as exc:
                await self._dispatch_failed(aw, obj, status, exc, now)
                return
        counts = member.capacity.pod_counts(key)
        transitions: list[Transition | None] = []
        changed = cond.set_pod_counts(
            status,
            pending=counts.pending,
            running=counts.running,
            succeeded=counts.succeeded,
            failed=counts.failed,
        )
        workload = self.state.workload(
            aw, priority=status.priority or 0, allowed_kinds=self.allowed_kinds, now=moment
        )
        expected = pod_count(workload.pod_sets) if isinstance(workload, Workload) else 0
        min_available = aw.spec.schedulingSpec.minAvailable
        if min_available is None:
            min_available = expected
        completion_items = sum(1 for item in aw.spec.items if item.completion_conditions())
        done_items, failed_object, polled = 0, "", False
        # Wrapped objects report completion through their own status, read only once no
        # pod is pending or running: before that they cannot be done. It comes from a watch
        # cache of that kind (whose changes wake this reconcile); until that cache has
        # synced, from a GET, looked at again a little later.
        settled = counts.pending == 0 and counts.running == 0
        if completion_items and settled:
            objects = objects or wrapped_objects(aw, owner_reference=member.is_hub)
            result = await completion(
                member.client,
                aw.metadata.namespace,
                objects,
                uid=aw.metadata.uid or "",
                caches=await self._wrapped_caches(member, objects),
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
        if verdict.verdict is Verdict.RUNNING:
            transitions.append(cond.mark_running(status, message, now=moment))
        elif verdict.verdict is Verdict.COMPLETED:
            transitions.append(cond.mark_completed(status, message, now=moment))
        elif verdict.verdict is Verdict.FAILED:
            assert verdict.reason is not None
            transitions.append(cond.mark_failed(status, verdict.reason, message, now=moment))
        elif verdict.verdict is Verdict.REQUEUE:
            assert verdict.reason is not None
            await self._remove_objects(aw, member)
            transitions.append(
                cond.mark_requeued(status, verdict.reason, message, now=moment, backoff=True)
            )
        if polled and verdict.verdict in (Verdict.RUNNING, Verdict.WAIT):
            self.queue.add_after(key, 2.0)  # the object's own status may lag its pods
        if verdict.recheck_after is not None:
            self.queue.add_after(key, max(verdict.recheck_after, 0.05))
        if any(t is not None for t in transitions):
            await self._write_status(obj, status, transitions)
            if not cond.is_terminal(status):  # a finished one's bookkeeping is dropped
                self.state.counts_written[key] = now
        elif changed:
            # Pod counts alone move often (every pod start); write them at most every few
            # seconds so a large gang does not cost a status write per pod.
            since = now - self.state.counts_written.get(key, 0.0)
            if since >= COUNTS_INTERVAL:
                await self._write_status(obj, status, [])
                self.state.counts_written[key] = now
            else:
                self.queue.add_after(key, COUNTS_INTERVAL - since)

    async def _wrapped_caches(self, member: Member, objects: list[Wrapped]) -> dict[str, Informer]:
        """Watch caches for the kinds of `objects` that report completion, started on first
        need (a kind unknown to the member has none: its objects are read, and missed, by GET)."""
        caches: dict[str, Informer] = {}
        for obj in objects:
            if not obj.completion:
                continue
            try:
                info = await member.client.resource_info(obj.api_version, obj.kind)
            except KubeError:
                continue
            informer, new = member.wrapped_informer(info)
            if new and self._group is not None:
                informer.add_handler(self._on_pod)  # same labels: wake the owner
                self._group.create_task(informer.run(), name=f"{member.name}-{info.plural}")
            caches[f"{obj.api_version}/{obj.kind}"] = informer
        return caches

    async def _dispatch_failed(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, exc: DispatchError, now: float
    ) -> None:
        moment = _utc(now)
        message = f"creating the wrapped objects failed: {exc}"
        if exc.permanent:
            transition = cond.mark_failed(status, Reason.DISPATCH_FAILED, message, now=moment)
        else:
            transition = cond.mark_requeued(
                status, Reason.DISPATCH_FAILED, message, now=moment, backoff=True
            )
        self.log.warning(
            "dispatch_failed",
            appwrapper=aw.metadata.name,
            namespace=aw.metadata.namespace,
            cluster=status.clusterName,
            reason=str(exc)[:300],
            permanent=exc.permanent,
        )
        await self._write_status(obj, status, [transition])

    async def _remove_objects(self, aw: AppWrapper, member: Member) -> list[str]:
        """Delete `aw`'s wrapped objects in `member` (only those carrying its uid); returns
        the ones still there."""
        return await delete_all(
            member.client,
            aw.metadata.namespace,
            wrapped_objects(aw, owner_reference=member.is_hub),
            uid=aw.metadata.uid or "",
        )

    async def _after_terminal(self, aw: AppWrapper, status: AppWrapperStatus) -> None:
        """Failed AppWrappers give their capacity back: their objects are removed once."""
        if not status.is_true(C.FAILED):
            return
        member = self._member_of(status)
        attempt = (aw.metadata.uid or "", status.lastDispatchedAt or "")
        if member is None or self.state.cleaned.get(aw.key) == attempt:
            return
        if await self._remove_objects(aw, member):
            self.queue.add_after(aw.key, 1.0)
        else:
            self.state.cleaned[aw.key] = attempt

    async def _finalize(self, aw: AppWrapper, obj: Obj) -> None:
        """Deletion: remove the wrapped objects wherever they may be, then our finalizer."""
        if FINALIZER not in aw.metadata.finalizers:
            return
        status = aw.status or AppWrapperStatus()
        member = self._member_of(status)
        targets = [member] if member is not None else list(self.members.values())
        remaining: list[str] = []
        for target in targets:
            try:
                remaining += await self._remove_objects(aw, target)
            except KubeError as exc:
                self.log.warning(
                    "deleting_objects_failed",
                    appwrapper=aw.metadata.name,
                    namespace=aw.metadata.namespace,
                    cluster=target.name,
                    error=str(exc)[:300],
                )
                remaining.append(f"{target.name}: {exc}")
        if remaining:
            self.log.info(
                "waiting_for_objects_to_go",
                appwrapper=aw.metadata.name,
                namespace=aw.metadata.namespace,
                remaining=remaining[:5],
            )
            self.queue.add_after(aw.key, 0.5)
            return
        meta = obj["metadata"]
        patch = {
            "metadata": {
                "finalizers": [f for f in meta.get("finalizers") or [] if f != FINALIZER],
                "resourceVersion": meta["resourceVersion"],
            }
        }
        with contextlib.suppress(NotFound):
            await self.hub.merge_patch(APPWRAPPERS, meta["namespace"], meta["name"], patch)
        self.state.forget(aw.key)
        self._kick.set()

    # -- scheduling -------------------------------------------------------------------

    async def _scheduler(self) -> None:
        while True:
            await self._kick.wait()
            # Gather the burst of changes that usually follows one (a batch of applies, a
            # gang's pods starting) into one cycle instead of one cycle per change. Waiting
            # twice as long as the last cycle took keeps cycles to about a third of the
            # process's time under a long queue, leaving the rest to the writes they start.
            await asyncio.sleep(
                max(CYCLE_BATCH_SECONDS, min(2 * self._cycle_seconds, CYCLE_BATCH_MAX_SECONDS))
            )
            self._kick.clear()
            started = time.perf_counter()
            pending, snapshots = self._snapshot()
            if not pending:
                self._cycle_seconds = time.perf_counter() - started
                continue
            policy = None
            now = self.clock()
            for key, claim in list(self.state.claims.items()):
                # An old claim is let go, so a preemptor whose room went elsewhere may
                # choose again (before the cycle: it must not name stale victims).
                if now - claim.at > CLAIM_TIMEOUT:
                    del self.state.claims[key]
            if self.preemption is not None:
                policy = HonourClaims(self.preemption, dict(self.state.claims))
            result = schedule(
                pending,
                snapshots,
                mode=self.config.queue_mode,
                now=self.clock(),
                starvation_after=self.config.starvation_after_seconds,
                preemption=policy,
            )
            self.cycles += 1
            self._apply(result)
            self._cycle_seconds = time.perf_counter() - started
            self.log.debug(
                "cycle",
                cycle=self.cycles,
                pending=len(pending),
                admitted=len(result.admits),
                seconds=round(self._cycle_seconds, 4),
            )
            # Let the writes this cycle started make progress before the next cycle.
            await asyncio.sleep(0)

    def _snapshot(self) -> tuple[list[Workload], list[ClusterSnapshot]]:
        """Phase 1: queued workloads and, per member, capacity minus what dispatched ones hold."""
        now = _utc(self.clock())
        pending: list[Workload] = []
        held: dict[str, list[tuple[str, Workload, float]]] = {name: [] for name in self.members}
        # This loop visits every AppWrapper on every cycle: names bound once, and each
        # AppWrapper's standing re-derived only when its object changed.
        store = self.appwrappers.store
        state = self.state
        written, assumed, standings = state.written, state.assumed, state.standings
        dispatching = state.dispatching
        for key, (phase, _) in state.phases.items():
            if key in written:
                obj = state.latest(key, store.get(key))
            elif phase in SCHEDULED_PHASES:
                obj = store.get(key)
            else:
                continue  # finished, backing off or going away: holds nothing, wants nothing
            if obj is None:
                continue
            guess = assumed.get(key)
            if guess is not None:
                if guess.cluster in held:
                    held[guess.cluster].append((key, guess.workload, guess.at))
                continue
            version = obj["metadata"].get("resourceVersion")
            cached = standings.get(key)
            if cached is not None and cached[0] == version:
                standing = cached[1]
            else:
                standing = self._derive_standing(obj, now)
                standings[key] = (version, standing)
            if standing.held is not None:
                if standing.cluster in held:
                    held[standing.cluster].append((key, standing.held, standing.dispatched_at))
            elif standing.pending is not None and key not in dispatching:
                pending.append(standing.pending)
        if not pending:
            # Nothing to decide: what the dispatched ones hold is not worth deriving (most
            # cycles of a burst's tail, where pods starting keep kicking the scheduler).
            return pending, []
        snapshots = []
        for name, member in self.members.items():
            reservations, admitted = self._holdings(member, held[name])
            snapshot = member.capacity.snapshot(
                tuple(reservations),
                reachable=member.reachable(),
            )
            snapshots.append(
                ClusterSnapshot(
                    name=snapshot.name,
                    nodes=snapshot.nodes,
                    reservations=snapshot.reservations,
                    labels=snapshot.labels,
                    reachable=snapshot.reachable,
                    admitted=tuple(admitted),
                )
            )
        return pending, snapshots

    def _derive_standing(self, obj: Obj, now: datetime) -> Standing:
        """What `obj` is to the scheduler (kept until its resourceVersion moves)."""
        if obj["metadata"].get("deletionTimestamp"):
            return NOT_SCHEDULED
        try:
            aw = self.state.parse(obj)
        except ValidationError:
            return NOT_SCHEDULED
        status = aw.status
        if cond.is_new(status) and FINALIZER not in aw.metadata.finalizers:
            return NOT_SCHEDULED  # the reconciler has not taken it in yet
        if cond.is_dispatched(status):
            assert status is not None
            workload = self.state.workload(
                aw, priority=status.priority or 0, allowed_kinds=self.allowed_kinds, now=now
            )
            if not isinstance(workload, Workload):
                return NOT_SCHEDULED
            dispatched = now.timestamp() - _seconds_since(status.lastDispatchedAt, now.timestamp())
            cluster = status.clusterName or ""
            return Standing(held=workload, cluster=cluster, dispatched_at=dispatched)
        if cond.is_queued(status) or cond.is_new(status):
            priority, error = self._priority(aw)
            if error:
                return NOT_SCHEDULED
            workload = self.state.workload(
                aw, priority=priority, allowed_kinds=self.allowed_kinds, now=now
            )
            if isinstance(workload, Workload):
                return Standing(pending=workload)
        return NOT_SCHEDULED

    def _on_priority_class(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        # A queued AppWrapper's priority comes from its class: derive every standing again.
        self.state.standings.clear()
        self._kick.set()

    def _holdings(
        self, member: Member, held: list[tuple[str, Workload, float]]
    ) -> tuple[list[Reservation], list[AdmittedWorkload]]:
        """Reservations for dispatched pods not yet on a node, and what each one uses."""
        reservations: list[Reservation] = []
        admitted: list[AdmittedWorkload] = []
        for key, workload, dispatched_at in held:
            revision = member.capacity.owner_revision(key)
            holding = self.state.holdings.get(key)
            if (
                holding is None
                or holding.revision != revision
                or holding.workload is not workload
                or holding.dispatched_at != dispatched_at
            ):
                holding = _holding(member, key, workload, dispatched_at, revision)
                self.state.holdings[key] = holding
            if holding.reservation is not None:
                reservations.append(holding.reservation)
            admitted.append(holding.admitted)
        return reservations, admitted

    def _apply(self, result: CycleResult) -> None:
        """Phase 2: assume each admission now; write and create in the background."""
        now = self.clock()
        pending_by_key: dict[str, Workload] = {}
        for admit in result.admits:
            entry = self.state.workloads.get(admit.key)
            if entry is None or not isinstance(entry[1], Workload):
                continue
            workload = entry[1]
            pending_by_key[admit.key] = workload
            self.state.assumed[admit.key] = Assumed(
                workload=workload, cluster=admit.cluster, at=now
            )
            self.state.dispatching.add(admit.key)
            self._spawn(self._dispatch(admit.key, admit.cluster), name=f"dispatch-{admit.key}")
        for wait in result.waits:
            self._note_waiting(wait.key, wait.message, head=wait.key == result.head_key, now=now)
        self._claim(result, now)

    def _claim(self, result: CycleResult, now: float) -> None:
        """Start evictions for new preemptions; keep claims only while they are needed."""
        waiting = {w.key for w in result.waits}
        for key in list(self.state.claims):
            if key not in waiting:  # admitted, or no longer queued
                del self.state.claims[key]
        for preempt in result.preemptions:
            if preempt.key in self.state.claims:
                continue
            self.state.claims[preempt.key] = Claim(preempt.cluster, preempt.victims, now)
            self.preemptions += len(preempt.victims)
            preemptor = self._current(preempt.key)
            if preemptor is not None:
                self.events.record(
                    preemptor,
                    reason="Preempting",
                    message=f"evicting {', '.join(preempt.victims)} in cluster {preempt.cluster}",
                )
            for victim in preempt.victims:
                obj = self._current(victim)
                stamp = ((obj or {}).get("status") or {}).get("lastDispatchedAt") or ""
                if victim in self.state.dispatching or self.state.evicted.get(victim) == stamp:
                    continue
                self.state.evicted[victim] = stamp
                self.state.dispatching.add(victim)
                self._spawn(self._evict(victim, preempt.key, stamp), name=f"evict-{victim}")

    def _note_waiting(self, key: str, message: str, *, head: bool, now: float) -> None:
        """Say why it waits, without rewriting status on every cycle of a long queue.

        The head's message is kept current. Behind it, a new kind of reason is written within
        WAITING_REWRITE_SECONDS, but numbers that merely moved only every
        WAITING_REFRESH_SECONDS: with capacity churning, every waiting AppWrapper's numbers
        change on every cycle, and 10k of them would cost the API server a thousand status
        writes a second."""
        last = self.state.waiting_written.get(key)
        if last is not None and not head:
            written, when = last
            if written == message:
                return
            if _without_numbers(written) == _without_numbers(message):
                if now - when < WAITING_REFRESH_SECONDS:
                    return
            elif now - when < WAITING_REWRITE_SECONDS:
                return
        elif last is not None and last[0] == message:
            return
        self.state.waiting_written[key] = (message, now)
        self._waiting.pop(key, None)
        if head:  # one per cycle, and the one users watch: written at once
            self._spawn(self._write_waiting(key, message, head), name=f"waiting-{key}")
            return
        # The others are queued for a few writers rather than a task each: the first cycle
        # over a queue of 10k AppWrappers would otherwise start 10k writes at once, each
        # holding memory while it waits for the API server. A newer message replaces one
        # not yet written.
        self._waiting[key] = message
        self._waiting_ready.set()

    async def _waiting_writer(self) -> None:
        while True:
            while not self._waiting:
                self._waiting_ready.clear()
                await self._waiting_ready.wait()
            key = next(iter(self._waiting))
            message = self._waiting.pop(key)
            try:
                await self._write_waiting(key, message, False)
            except Exception:
                self.log.exception("waiting_status_failed", appwrapper=key)

    async def _write_waiting(self, key: str, message: str, head: bool) -> None:
        obj = self._current(key)
        if obj is None:
            return
        try:
            aw = self.state.parse(obj)
        except ValidationError:
            return
        status = (aw.status or AppWrapperStatus()).editable_copy()
        moment = _utc(self.clock())
        transitions: list[Transition | None] = []
        if cond.is_new(status):
            transitions.append(cond.initialize(status, priority=self._priority(aw)[0], now=moment))
        elif not cond.is_queued(status):
            return
        transitions.append(cond.mark_waiting(status, message, now=moment))
        if head:
            transitions.append(cond.mark_head_of_line(status, now=moment))
        if all(t is None for t in transitions):
            return
        try:
            await self._write_status(obj, status, transitions)
        except Conflict:
            self.state.waiting_written.pop(key, None)
            self._kick.set()
        except KubeError as exc:
            self.state.waiting_written.pop(key, None)
            self.log.debug("waiting_status_not_written", appwrapper=key, error=str(exc)[:200])

    async def _dispatch(self, key: str, cluster: str) -> None:
        """Phase 3 for one admission: status first (it is the claim), then the objects."""
        log = self.log.bind(
            appwrapper=key.split("/", 1)[1], namespace=key.split("/", 1)[0], cluster=cluster
        )
        try:
            async with self._dispatch_slots:
                obj = self._current(key)
                if obj is None:
                    return
                aw = self.state.parse(obj)
                status = (aw.status or AppWrapperStatus()).editable_copy()
                new = cond.is_new(status)
                if not (new or cond.is_queued(status)) or aw.metadata.deletionTimestamp:
                    return
                now = self.clock()
                transitions: list[Transition | None] = []
                if new:
                    transitions.append(
                        cond.initialize(status, priority=self._priority(aw)[0], now=_utc(now))
                    )
                transitions.append(cond.mark_dispatched(status, cluster=cluster, now=_utc(now)))
                try:
                    written = await self._write_status(obj, status, transitions)
                except Conflict:
                    log.debug("dispatch_conflict")
                    return
                except KubeError as exc:
                    log.warning("dispatch_status_failed", error=str(exc)[:300])
                    return
                self.state.waiting_written.pop(key, None)
                # The pods' first counts wait for the next write with a reason (usually
                # Running, a moment later) instead of costing a status write of their own.
                self.state.counts_written[key] = now
                log.info("dispatched", priority=status.priority)
                member = self.members[cluster]
                aw = self.state.parse(written)
                try:
                    if self.config.create_namespaces and not member.is_hub:
                        await ensure_namespace(member.client, aw.metadata.namespace)
                    await create_all(
                        member.client,
                        aw.metadata.namespace,
                        wrapped_objects(aw, owner_reference=member.is_hub),
                        uid=aw.metadata.uid or "",
                    )
                    self.state.ensured[key] = status.lastDispatchedAt or ""
                except (DispatchError, KubeError) as exc:
                    error = (
                        exc
                        if isinstance(exc, DispatchError)
                        else DispatchError(str(exc), permanent=False)
                    )
                    fresh = self._current(key) or written
                    fresh_status = (self.state.parse(fresh).status or status).editable_copy()
                    with contextlib.suppress(KubeError):
                        await self._dispatch_failed(aw, fresh, fresh_status, error, self.clock())
        finally:
            # After a successful status write our own copy (state.written) shows the dispatch
            # and holds the capacity; after a failed one nothing should.
            self.state.assumed.pop(key, None)
            self.state.dispatching.discard(key)
            self.queue.add(key)
            self._kick.set()

    async def _evict(self, key: str, preemptor: str, stamp: str) -> None:
        """Delete a victim's objects and requeue it, saying who took its place."""
        try:
            obj = self._current(key)
            if obj is None:
                return
            aw = self.state.parse(obj)
            status = (aw.status or AppWrapperStatus()).editable_copy()
            member = self._member_of(status)
            if member is None or not cond.is_dispatched(status):
                return
            if (status.lastDispatchedAt or "") != stamp:
                return  # dispatched again since it was chosen: that is not the victim
            entry = self.state.workloads.get(preemptor)
            by_priority = entry[1].priority if entry and isinstance(entry[1], Workload) else "?"
            message = f"preempted by {preemptor}, priority {by_priority}"
            await self._remove_objects(aw, member)
            transition = cond.mark_requeued(
                status,
                Reason.PREEMPTED,
                message,
                now=_utc(self.clock()),
                backoff=True,
                preempted_by=preemptor,
            )
            await self._write_status(obj, status, [transition])
            self.log.info(
                "preempted",
                appwrapper=aw.metadata.name,
                namespace=aw.metadata.namespace,
                cluster=member.name,
                reason=message,
            )
        except KubeError as exc:
            self.log.warning("preemption_failed", appwrapper=key, error=str(exc)[:300])
        finally:
            self.state.dispatching.discard(key)
            self.queue.add(key)
            self._kick.set()

    # -- member upkeep ---------------------------------------------------------------

    async def _upkeep(self, every: float = 2.0) -> None:
        """Requeue work stranded on a silent member; collect objects left in members."""
        last_collected: dict[str, float] = {}
        lost: set[str] = set()
        while True:
            await asyncio.sleep(every)
            for member in self.members.values():
                if member.is_hub:
                    continue  # objects there are owned by their AppWrapper (garbage collector)
                silent = member.silent_for()
                if silent > self.config.member_timeout_seconds:
                    lost.add(member.name)
                    await self._requeue_stranded(member, silent)
                    continue
                if not member.reachable():
                    continue
                came_back = member.name in lost
                due = time.monotonic() - last_collected.get(member.name, 0.0) > COLLECT_EVERY
                if (came_back or due) and member.name not in self._collecting:
                    lost.discard(member.name)
                    last_collected[member.name] = time.monotonic()
                    # In the background: a member that stops answering mid-sweep must not
                    # hold up requeueing the work stranded on it.
                    self._collecting.add(member.name)
                    self._spawn(self._collect(member), name=f"collect-{member.name}")

    async def _requeue_stranded(self, member: Member, silent: float) -> None:
        message = (
            f"cluster {member.name} has not answered for {int(silent)}s; requeued "
            "(its copies are removed when it answers again)"
        )
        for key, (phase, _) in list(self.state.phases.items()):
            # Finished ones are held as text: decoding thousands every round is not free.
            if phase not in SCHEDULED_PHASES and key not in self.state.written:
                continue
            obj = self._current(key)
            if obj is None or key in self.state.dispatching:
                continue
            status_raw = obj.get("status") or {}
            if status_raw.get("clusterName") != member.name:
                continue
            try:
                aw = self.state.parse(obj)
            except ValidationError:
                continue
            status = (aw.status or AppWrapperStatus()).editable_copy()
            if not cond.is_dispatched(status):
                continue
            transition = cond.mark_requeued(
                status, Reason.CLUSTER_UNREACHABLE, message, now=_utc(self.clock()), backoff=False
            )
            try:
                await self._write_status(obj, status, [transition])
            except KubeError as exc:
                self.log.warning(
                    "requeue_failed",
                    appwrapper=aw.metadata.name,
                    namespace=aw.metadata.namespace,
                    error=str(exc)[:200],
                )
                continue
            self.log.warning(
                "requeued_from_silent_cluster",
                appwrapper=aw.metadata.name,
                namespace=aw.metadata.namespace,
                cluster=member.name,
                reason=message,
            )
        self._kick.set()

    async def _collect(self, member: Member) -> None:
        """Remove copies in `member` that no hub AppWrapper places there any more."""
        if not self.appwrappers.synced.is_set():
            self._collecting.discard(member.name)
            return
        keep: dict[str, tuple[str, str]] = {}
        kinds: set[tuple[str, str]] = set(KNOWN_KINDS)
        for key, watched in self.appwrappers.store.items():
            obj = self.state.latest(key, watched) or watched
            meta = obj["metadata"]
            for item in ((obj.get("spec") or {}).get("resources") or {}).get("GenericItems") or []:
                template = item.get("generictemplate") or {}
                if template.get("apiVersion") and template.get("kind"):
                    kinds.add((str(template["apiVersion"]), str(template["kind"])))
            assumed = self.state.assumed.get(key)
            cluster = assumed.cluster if assumed else (obj.get("status") or {}).get("clusterName")
            if cluster and not meta.get("deletionTimestamp"):
                keep[key] = (meta.get("uid", ""), cluster)
        try:
            deleted = await collect(member.client, member=member.name, kinds=kinds, keep=keep)
        except KubeError as exc:
            self.log.warning("collection_failed", cluster=member.name, error=str(exc)[:200])
            return
        finally:
            self._collecting.discard(member.name)
        for what in deleted:
            self.log.info("collected_orphan", cluster=member.name, object=what)

    async def drain(self, timeout: float = 10) -> None:
        """Let in-flight dispatches finish (bounded) before shutdown."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout)
        await self.events.flush(timeout=timeout)


SCHEDULED_PHASES = frozenset({"queued", "dispatched"})


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _without_numbers(message: str) -> str:
    """A waiting message's kind of reason: "needs cpu 2, free 1 of 8" -> "needs cpu #, ..."."""
    return _NUMBER.sub("#", message)


def _without_bookkeeping(obj: Obj) -> Obj:
    """Drops what the dispatcher never reads and that can be as large as the spec again
    (server-side field ownership, kubectl's copy of the last applied object), and shares
    the keys' strings between objects (each decoded object has its own copy of every key,
    a quarter of its size): thousands of AppWrappers are held in memory."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    shared: Obj = _interned(obj)
    return shared


def _interned(value: Any) -> Any:
    if isinstance(value, dict):
        return {sys.intern(k): _interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interned(v) for v in value]
    return value


def _state_of(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("state") or "New")


def _phase_of(obj: Obj) -> str:
    """A cheap classification of a raw AppWrapper for the scheduler's bookkeeping."""
    if obj["metadata"].get("deletionTimestamp"):
        return "deleting"
    true = {
        c.get("type")
        for c in (obj.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    if "Completed" in true or "Failed" in true:
        return "finished"
    if "Dispatched" in true:
        return "dispatched"
    if "Backoff" in true:
        return "backoff"
    return "queued"


def _holding(
    member: Member, key: str, workload: Workload, dispatched_at: float, revision: int
) -> Holding:
    pods = member.capacity.owned_pods(key)
    remaining = _unplaced(workload.pod_sets, [p.requests for p in pods if p.node])
    reservation = None
    if remaining:
        reservation = Reservation(
            key=workload.key,
            pod_sets=remaining,
            priority=workload.priority,
            dispatched_at=dispatched_at,
            preemptible=workload.preemptible,
        )
    usage: dict[str, Any] = {}
    for pod in pods:
        if pod.holds_capacity:
            usage[pod.node] = usage[pod.node] + pod.requests if pod.node in usage else pod.requests
    admitted = AdmittedWorkload(
        key=workload.key,
        priority=workload.priority,
        dispatched_at=dispatched_at,
        preemptible=workload.preemptible,
        usage=tuple(sorted(usage.items())),
    )
    return Holding(revision, workload, dispatched_at, reservation, admitted)


def _unplaced(pod_sets: tuple[PodSet, ...], placed: list[Any]) -> tuple[PodSet, ...]:
    """Pod sets minus the pods already bound to nodes (their requests are counted there).

    A bound pod is matched to a pod set with the same requests, else to the smallest one,
    so a mismatch between declared and actual requests errs towards reserving more.
    """
    counts = [p.count for p in pod_sets]
    for requests in placed:
        index = next(
            (i for i, p in enumerate(pod_sets) if counts[i] and p.requests == requests), None
        )
        if index is None:
            candidates = [i for i in range(len(pod_sets)) if counts[i]]
            if not candidates:
                break
            index = min(candidates, key=lambda i: sum(pod_sets[i].requests.values()))
        counts[index] -= 1
    return tuple(
        PodSet(
            count=c,
            requests=p.requests,
            node_selector=p.node_selector,
            tolerations=p.tolerations,
            name=p.name,
        )
        for p, c in zip(pod_sets, counts, strict=True)
        if c > 0
    )
