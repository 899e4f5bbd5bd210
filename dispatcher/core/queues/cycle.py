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
(`tests/unit/test_queues.py`).

Not parked, as their answer may change from one cycle to the next on its own: a workload
that asked for victims and got some (it is preempting), and one past the starvation
guard's limit (it holds clusters). A StrictFIFO head that blocks its line is parked by its
own question like any other; those behind it are parked behind it until it goes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dispatcher.api.models import Reason
from dispatcher.core.model import ClusterSnapshot, QueueMode, Workload
from dispatcher.core.queues.manager import QueueManager, Wake
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling.cycle import CycleResult, schedule
from dispatcher.core.scheduling.preemption import PreemptionPolicy

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
    prepare: Callable[[list[Workload]], list[Workload]] | None = None,
    capacity_checks: tuple[str, ...] = (),
) -> CycleResult:
    """One cycle over `manager.active()`; admitted work leaves the manager, refused work
    is parked. `held_before`: the clusters the previous cycle held (its `held`): while
    any is held, capacity-parked work is tried again (the hold may end this cycle).
    `prepare`: given the active work in order, returns what `schedule` decides on (in
    the same order: translated, e.g. for a pooled fit; the manager keeps the original)."""
    manager.wake_starving(now - starvation_after)
    if held_before:
        manager.capacity_freed()
    active = manager.active(per_line)
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
    )
    for admit in result.admits:
        manager.admitted(admit.key, preemption=preemption is not None)
    preempting = {p.key for p in result.preemptions}
    for head in result.blocking - preempting:  # those after it wait for it, parked with it
        manager.blocked(head)
    for wait in result.waits:
        key = wait.key
        if key in preempting or manager.is_parked(key):
            continue
        workload = manager.workload(key)
        if workload is None or now - workload.queued_since > starvation_after:
            continue
        manager.park(key, _WAKE.get(wait.reason, Wake.CAPACITY), root=_root(manager, key, quotas))
    return result


def _root(manager: QueueManager, key: str, quotas: QuotaView | None) -> str:
    line = manager.line_of(key)
    if not line or quotas is None:
        return ""
    node = quotas.tree.queue_nodes.get(line)
    return quotas.tree.root(node).name if node is not None else ""
