"""How a dispatched AppWrapper does: its pods counted from its member's capacity cache (into
its status), its wrapped objects' completion and presence read, gathered into the
`core.lifecycle.Progress` that `assess` judges (with the nodes whose health labels evict its
pods there, read from the capacity cache). Wrapped objects report completion through their
own status, also while pods run (MCAD's RunningHoldCompletion), and their deletion by
someone else: from a watch cache of each wrapped kind, whose changes wake the owner, and
until that cache has synced from a GET, looked at again a little later."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from dispatcher.api.models import AppWrapper, AppWrapperStatus, parse_time
from dispatcher.cluster.member import Member
from dispatcher.cluster.objects import (
    Wrapped,
    completion,
    missing,
    target_namespace,
    wrapped_identities,
)
from dispatcher.core import conditions as cond
from dispatcher.core.lifecycle import Progress

C = cond.C


def seconds_since(stamp: str | None, now: float) -> float:
    if not stamp:
        return 0.0
    try:
        return now - parse_time(stamp).timestamp()
    except ValueError:
        return 0.0


async def measure(
    aw: AppWrapper,
    status: AppWrapperStatus,
    member: Member,
    objects: list[Wrapped],
    *,
    expected: int,
    now: float,
    look_for_missing: bool,
    wake_owner: Callable[[str, dict[str, Any] | None, dict[str, Any] | None], None],
    start_task: Callable[[Coroutine[Any, Any, None], str], None],
) -> tuple[Progress, bool, bool]:
    """Its progress, whether the pod counts in `status` changed, and whether some object's
    status was read by GET (it will not announce itself: look again later). `expected`: the
    pods it declared that are tracked; `look_for_missing`: whether its objects were all made
    before this look (then one that is gone was deleted by someone else)."""
    counts = member.capacity.pod_counts(aw.key, aw.metadata.uid or "")
    changed = cond.set_pod_counts(
        status,
        pending=counts.pending,
        running=counts.running,
        succeeded=counts.succeeded,
        failed=counts.failed,
    )
    min_available = aw.spec.schedulingSpec.minAvailable
    if min_available is None:
        min_available = expected
    completion_items = sum(1 for item in aw.spec.items if item.completion_conditions())
    objects = objects or wrapped_identities(aw)
    # Every wrapped kind's watch cache, started at the first look: a deletion, or a
    # completion, then wakes this AppWrapper. Not for Pods: the capacity cache holds every
    # pod of an AppWrapper already (a wrapped Pod deleted is a pod lost, as before).
    kinds = [(o.api_version, o.kind) for o in objects if (o.api_version, o.kind) != ("v1", "Pod")]
    completing = [(o.api_version, o.kind) for o in objects if o.completion]
    caches = await member.wrapped_caches(
        kinds, completion=completing, on_change=wake_owner, start_task=start_task
    )
    # Mapped: its objects were created there by this process, same settings.
    namespace = target_namespace(member, aw.metadata.namespace)
    uid = aw.metadata.uid or ""
    gone: str | None = ""
    if look_for_missing:
        gone = await missing(member.client, namespace, objects, uid=uid, caches=caches)
    done_items, failed_object, polled = 0, "", gone is None
    if completion_items:
        result = await completion(member.client, namespace, objects, uid=uid, caches=caches)
        completion_items, done_items = result.items, result.done
        failed_object, polled = result.failed, polled or result.polled
    progress = Progress(
        expected_pods=expected,
        min_available=min_available,
        pending=counts.pending,
        running=counts.running,
        succeeded=counts.succeeded,
        failed=counts.failed,
        seconds_since_dispatch=seconds_since(status.lastDispatchedAt, now),
        requeue_count=status.requeueCount,
        reached_running=status.is_true(C.RUNNING),
        completion_items=completion_items,
        completed_items=done_items,
        failed_object=failed_object,
        missing_object=gone or "",
        evicted_nodes=member.capacity.evicted_nodes(aw.key, aw.metadata.uid or ""),
    )
    return progress, changed, polled


COUNTS_INTERVAL = 5.0
"""Seconds between status writes that only update pod counts."""


class Pacing:
    """When a dispatched AppWrapper's pod counts are written with no milestone in them. Pod
    counts alone move often (every pod start): written at most every COUNTS_INTERVAL, so a
    large gang does not cost a write per pod (the first ones after a dispatch wait for the
    Running write that usually follows). Only counts are paced: the record that its objects
    are made is written at once (`Reconciler._record_made`)."""

    def __init__(self) -> None:
        self._counts_written: dict[str, float] = {}
        """key -> when its status was last written."""

    def written(self, key: str, now: float) -> None:
        """Its status was written (the counts with it)."""
        self._counts_written[key] = now

    def wait(
        self, key: str, status: AppWrapperStatus, now: float, *, counts_changed: bool
    ) -> float | None:
        """Seconds until a write of the counts alone is due (0: now; None: none is)."""
        if not counts_changed:
            return None
        last = self._counts_written.get(key)
        if last is None:
            last = now - seconds_since(status.lastDispatchedAt, now)
        return max(COUNTS_INTERVAL - (now - last), 0.0)

    def forget(self, key: str) -> None:
        self._counts_written.pop(key, None)
