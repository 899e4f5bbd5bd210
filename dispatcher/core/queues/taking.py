"""One scheduling cycle over the queue manager's active work. Pure, no I/O.

`take` runs `core.scheduling.schedule` on the workloads the `QueueManager` has not parked
(already in order: nothing is sorted), then parks what the cycle refused by the event that
can change its answer, so that the next cycle costs what its woken and new work costs, not
what the whole backlog costs. Decisions are `schedule`'s own: an active workload is
decided exactly as before; a parked one is one whose answer could not have changed, and
gets no new `Wait` (its last one still says why). An event wakes the first workload of each
parked question and the next one only once that one is admitted, so right after an event
the order between two questions may differ from a cycle over all pending work (within a
StrictFIFO line it never does); nothing that could be admitted stays parked
(`tests/unit/test_queues.py`). A line's head is its first pending workload, active or
parked: the first a cycle refused is reported as head only when it is that.

Not parked, as their answer may change from one cycle to the next on its own: a workload
that asked for victims and got some (it is preempting), and one past the starvation
guard's limit that holds clusters, and a head that holds a reservation (`schedule`'s
`backfill`: it is derived again each cycle, and keeps later work off its nodes only in a
cycle that tries it). One past the limit whose clusters were all held already
(by an older one) is parked by its question; when a hold ends (a cluster held in the last
cycle is not in this one), capacity-parked work is woken for the next cycle and the result
says so (`again`), so that it is tried at once. A StrictFIFO head that blocks its line is
parked by its own question like any other; those behind it are parked behind it until it
goes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from dispatcher.api.models import Reason
from dispatcher.core.limituse import LimitUse
from dispatcher.core.model import Backfill, ClusterSnapshot, QueueMode, Workload
from dispatcher.core.queues.manager import QueueManager, Wake
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling.cycle import schedule
from dispatcher.core.scheduling.decisions import CycleResult
from dispatcher.core.scheduling.kept import KeptRooms
from dispatcher.core.scheduling.preemption import PreemptionPolicy
from dispatcher.core.scheduling.reservation import ReservationInfo

__all__ = ["take"]

_WAKE = {
    Reason.INSUFFICIENT_RESOURCES: Wake.CAPACITY,
    Reason.QUOTA_EXCEEDED: Wake.QUOTA,
    Reason.QUEUE_NOT_READY: Wake.LINE,
}


def take(
    manager: QueueManager,
    clusters: Sequence[ClusterSnapshot],
    *,
    mode: QueueMode,
    now: float,
    starvation_after: float,
    preemption: PreemptionPolicy | None,
    quotas: QuotaView | None = None,
    held_before: frozenset[str] = frozenset(),
    per_line: int | None = None,
    limit: int | None = None,
    prepare: Callable[[list[Workload]], list[Workload]] | None = None,
    capacity_checks: tuple[str, ...] = (),
    kept: KeptRooms | None = None,
    backfill: Backfill = Backfill.NEVER,
    reserved_before: Mapping[str, ReservationInfo] | None = None,
    limit_use: LimitUse | None = None,
) -> CycleResult:
    """One cycle over `manager.active()`; admitted work leaves the manager, refused work
    is parked. `held_before`: the clusters the previous cycle held (its `held`): when one
    is no longer held, capacity-parked work is woken for the next cycle (`again`).
    `prepare`: given the active work in order, returns what `schedule` decides on (in
    the same order: translated, e.g. for a pooled fit; the manager keeps the original).
    `limit`: decide at most that many (the first in order); with more active, the result
    says `again` and the next cycle takes the rest, so that no cycle costs more than
    `limit` decisions however many an event woke.
    `kept`: the clusters' states from the last cycle; `backfill`: for work with no queue
    (see `schedule`)."""
    manager.wake_starving(now - starvation_after)
    active = manager.active(per_line, None if limit is None else limit + 1)
    more = limit is not None and len(active) > limit
    if more:
        del active[limit:]
    result = schedule(
        prepare(active) if prepare is not None else active,
        clusters,
        mode=mode,
        now=now,
        starvation_after=starvation_after,
        preemption=preemption,
        quotas=quotas,
        presorted=True,
        capacity_checks=capacity_checks,
        kept=kept,
        backfill=backfill,
        reserved_before=reserved_before,
        limit_use=limit_use,
    )
    for admit in result.admits:
        manager.admitted(admit.key, preemption=preemption is not None)
    result = _with_true_heads(manager, result)
    preempting = {p.key for p in result.preemptions}
    for head in result.blocking - preempting:  # those after it wait for it, parked with it
        manager.blocked(head)
    for wait in result.waits:
        key = wait.key
        if key in preempting or key in result.holders or key in result.reservations:
            continue
        if manager.is_parked(key):
            continue
        workload = manager.workload(key)
        if workload is None:
            continue
        starving = now - workload.queued_since > starvation_after
        wake = _WAKE.get(wait.reason, Wake.CAPACITY)
        manager.park(key, wake, root=_root(manager, key, quotas), starving=starving)
    # A hold that ended frees its clusters for what waited behind it: the next cycle.
    if (held_before - result.held and manager.capacity_freed()) or more:
        result = replace(result, again=True)
    return result


def _with_true_heads(manager: QueueManager, result: CycleResult) -> CycleResult:
    """The cycle saw the active work only: the first it did not admit in a line is that
    line's head only when no parked workload goes before it. (Else each cycle over newly
    woken or arrived work would mark its first one HeadOfLine: seen as 3,827 such writes
    while 10,000 queued AppWrappers were first decided, 250 a cycle.)"""
    heads = frozenset(key for key in result.heads if manager.is_first(key))
    if heads == result.heads:
        return result
    head_key = next((key for key in result.order if key in heads), None)
    return replace(result, heads=heads, head_key=head_key)


def _root(manager: QueueManager, key: str, quotas: QuotaView | None) -> str:
    line = manager.line_of(key)
    if not line or quotas is None:
        return ""
    node = quotas.tree.queue_nodes.get(line)
    return quotas.tree.root(node).name if node is not None else ""
