"""A preemption victim's notice, for the reconciler: until the time its eviction recorded, its
objects stay, and it is followed only to see whether it ends first. Side effects: writes
status (through the status writer) when it completes or fails within the notice; reads its
member's caches (`progress.measure`).

The time is read from the victim's `Preempted` condition (`core.protection.removal_time`),
never kept in memory: a restarted dispatcher waits for the same time. A victim that completes
or fails within its notice ends as it ended (Completed, or Failed with its objects removed
as any Failed one's), and is not requeued, nor charged any runtime lost; anything else it
does meanwhile (a slow start, a failure a reset would retry) is left to the eviction.

When the objects go, the runtime lost (since its last declared checkpoint, or its dispatch)
is said in its requeue message and counted by its cluster queue
(`appwrapper_dispatcher_preempted_runtime_lost_seconds_total`): a victim that checkpoints
within its notice loses only what it ran since (`eviction_message`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any

import structlog

from dispatcher.api.models import AppWrapper, AppWrapperStatus, parse_time
from dispatcher.clock import Clock
from dispatcher.cluster.member import Member
from dispatcher.config import Config
from dispatcher.controller.lifecycle.progress import measure
from dispatcher.controller.reading import AppWrapperReader
from dispatcher.controller.status import StatusWriter
from dispatcher.controller.workqueue import Result
from dispatcher.core import conditions as cond
from dispatcher.core.faulttolerance import effective_requeuing, retry_policy
from dispatcher.core.lifecycle import Verdict, assess
from dispatcher.core.model import Workload, tracked_pod_count
from dispatcher.core.protection import asked, removal_time, runtime_lost, with_loss
from dispatcher.metrics.recorder import Recorder

Obj = dict[str, Any]
C = cond.C
POLL_SECONDS = 2.0
"""When a wrapped object's status was read by GET, look again this much later."""
UNSYNCED_RECHECK_SECONDS = 5.0
"""Its member's caches have not synced (its pods are not known yet): look again then."""


def removes_at(status: AppWrapperStatus) -> float:
    """When a victim's objects are removed, as its eviction recorded it (0.0: no record)."""
    preempted = status.condition(C.PREEMPTED)
    if preempted is None or preempted.status != "True":
        return 0.0
    try:
        chosen_at = parse_time(preempted.lastTransitionMicroTime or "").timestamp()
    except ValueError:
        return 0.0  # when it was chosen is not known: no notice can be counted from it
    return removal_time(preempted.message, chosen_at)


class Notices:
    def __init__(
        self,
        *,
        config: Config,
        reader: AppWrapperReader,
        status: StatusWriter,
        clock: Clock,
        wake_owner: Callable[[str, Obj | None, Obj | None], None],
        start_task: Callable[[Coroutine[Any, Any, None], str], None],
        recorder: Recorder,
    ) -> None:
        self._config = config
        self._recorder = recorder
        self._reader = reader
        self._status = status
        self._clock = clock
        self._wake_owner = wake_owner
        self._start_task = start_task
        self._log = structlog.get_logger("reconciler")

    def eviction_message(self, aw: AppWrapper, status: AppWrapperStatus) -> str:
        """The requeue message of a victim whose objects are removed now: its `Preempted`
        message and the runtime it loses (counted for its cluster queue)."""
        preempted = status.condition(C.PREEMPTED)
        message = preempted.message if preempted is not None else "preempted"
        if not status.lastDispatchedAt:
            return message
        try:
            dispatched_at = parse_time(status.lastDispatchedAt).timestamp()
        except ValueError:
            return message
        now = self._clock.time()
        checkpoint = asked(aw.metadata.annotations).checkpointed_at
        lost = runtime_lost(dispatched_at=dispatched_at, checkpointed_at=checkpoint, at=now)
        checkpointed = lost < now - dispatched_at
        self._recorder.lost(status, lost)
        return with_loss(message, lost, checkpointed=checkpointed)

    async def follow(
        self, aw: AppWrapper, obj: Obj, status: AppWrapperStatus, member: Member
    ) -> Result | None:
        """What to do with a victim in `member` while its notice runs: wait (until its
        time, or sooner to look again), or, having written that it completed or failed,
        come back at once (it is finished: the reconciler ends it as such). None once the
        notice is over, or when it was given none: its objects are removed now."""
        now = self._clock.time()
        left = removes_at(status) - now
        if left <= 0:
            return None
        if not member.synced:
            return Result.after(min(left, UNSYNCED_RECHECK_SECONDS))
        moment = datetime.fromtimestamp(now, UTC)
        workload = self._reader.workload(aw, priority=status.priority or 0, now=moment)
        expected = tracked_pod_count(workload.pod_sets) if isinstance(workload, Workload) else 0
        progress, _, polled = await measure(
            aw,
            status,
            member,
            [],
            expected=expected,
            now=now,
            look_for_missing=False,
            wake_owner=self._wake_owner,
            start_task=self._start_task,
        )
        bounds = self._config.fault_tolerance.bounds()
        annotations = aw.metadata.annotations
        verdict = assess(
            progress,
            requeuing=effective_requeuing(aw.spec.schedulingSpec.requeuing, annotations, bounds),
            duration_limit=aw.spec.schedulingSpec.dispatchDuration.limit,
            retry=retry_policy(annotations, bounds),
        )
        if verdict.verdict is Verdict.COMPLETED:
            transition = cond.mark_completed(status, verdict.message, now=moment)
        elif verdict.verdict is Verdict.FAILED and verdict.reason is not None:
            transition = cond.mark_failed(status, verdict.reason, verdict.message, now=moment)
        else:
            return Result.soonest(left, POLL_SECONDS if polled else None)
        assert verdict.reason is not None
        cond.end_within_notice(status, verdict.reason, verdict.message, now=moment)
        await self._status.write(obj, status, [transition])
        self._log.info(
            "ended_within_notice",
            appwrapper=aw.metadata.name,
            namespace=aw.metadata.namespace,
            verdict=verdict.verdict.value,
            seconds_left=round(left, 3),
        )
        return Result.now()
