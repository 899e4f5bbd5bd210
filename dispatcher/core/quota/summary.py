"""What each queue's status says: counts, usage and borrowing, and whether it is active.
Pure, no I/O.

Built from the quota tree, the charges of every admitted AppWrapper and the queue each
pending AppWrapper resolved to, so `kubectl get clusterappqueues` shows pending, admitted
and usage the way the Kueue guides show them for ClusterQueues.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from dispatcher.api.quantity import format_milli
from dispatcher.core.quota.model import Charge, FlavorResource, StopPolicy
from dispatcher.core.quota.resolve import Queued
from dispatcher.core.quota.tree import QuotaLedger, QuotaTree

__all__ = ["QueueSummary", "summarize"]


@dataclass
class QueueSummary:
    pending: int = 0
    admitted: int = 0
    reserving: int = 0  # admitted, plus requeued ones whose pods still hold quota
    usage: dict[FlavorResource, int] = field(default_factory=dict)
    borrowed: dict[FlavorResource, int] = field(default_factory=dict)
    active: bool = True
    reason: str = "Ready"
    message: str = "can admit AppWrappers"

    def flavors_usage(self, *, borrowed: bool = True) -> list[dict[str, object]]:
        """The status' `flavorsUsage`: per flavor, per resource, total (and borrowed: a
        cluster queue borrows, an AppQueue only uses)."""
        by_flavor: dict[str, list[dict[str, str]]] = {}
        for (flavor, resource), total in sorted(self.usage.items()):
            entry = {"name": resource, "total": format_milli(total, resource)}
            if borrowed:
                amount = self.borrowed.get((flavor, resource), 0)
                entry["borrowed"] = format_milli(amount, resource)
            by_flavor.setdefault(flavor, []).append(entry)
        return [{"name": f, "resources": r} for f, r in by_flavor.items()]


def _stopped(stop: StopPolicy) -> str:
    if stop is StopPolicy.HOLD_AND_DRAIN:
        return "stopPolicy HoldAndDrain: admits nothing new and requeues what it admitted"
    return f"stopPolicy {stop}: admits nothing new; what it admitted runs on"


def summarize(
    tree: QuotaTree,
    charges: Iterable[Charge],
    pending: Iterable[Queued],
    local_of: Mapping[str, str],
    releasing: Collection[str] = (),
) -> tuple[dict[str, QueueSummary], dict[str, QueueSummary]]:
    """(cluster queue -> summary, AppQueue "namespace/name" -> summary). `local_of` maps an
    admitted AppWrapper's key to the AppQueue it came through; `releasing` are charged
    but no longer admitted (requeued, their pods still going)."""
    setup = tree.setup
    ledger = QuotaLedger(tree)
    queues = {name: QueueSummary() for name in setup.queues}
    locals_ = {f"{ns}/{name}": QueueSummary() for ns, name in setup.local_queues}
    for charge in charges:
        queue = queues.get(charge.queue)
        if queue is None:
            continue
        ledger.add(charge.queue, charge.amounts)
        admitted = charge.key not in releasing
        queue.reserving += 1
        queue.admitted += admitted
        local = locals_.get(local_of.get(charge.key, ""))
        if local is not None:
            local.reserving += 1
            local.admitted += admitted
            for fr, amount in charge.amounts.items():
                local.usage[fr] = local.usage.get(fr, 0) + amount
    for queued in pending:
        if queued.queue in queues:
            queues[queued.queue].pending += 1
        if queued.local in locals_:
            locals_[queued.local].pending += 1
    for name, summary in queues.items():
        spec = setup.queues[name]
        for group in spec.groups:
            for fq in group.flavors:
                for resource in group.covered:
                    fr = (fq.flavor, resource)
                    summary.usage[fr] = ledger.used(name, fr)
                    summary.borrowed[fr] = ledger.borrowed(name, fr)
        problems = tree.problems.get(name) or []
        if problems:
            summary.active, summary.reason = False, "Inactive"
            summary.message = "; ".join(problems)
        elif spec.stop is not StopPolicy.NONE:
            summary.active, summary.reason = False, "Stopped"
            summary.message = _stopped(spec.stop)
        elif spec.namespaces is None:
            summary.message = "admits no namespace (namespaceSelector unset; {} admits all)"
        over = [
            f"{fr[1]} in {fr[0]}: {format_milli(ledger.used(name, fr), fr[1])} in use,"
            f" quota {format_milli(ledger.available(name, fr, empty=True), fr[1])}"
            for fr in summary.usage
            if summary.active and ledger.available(name, fr) < 0
        ]
        if over:
            summary.message = "over its quota (lowered below use): admits nothing more of " + (
                "; ".join(over)
            )
    for key, summary in locals_.items():
        namespace, _, local_name = key.partition("/")
        lq = setup.local_queues[(namespace, local_name)]
        target = setup.queues.get(lq.cluster_queue)
        if lq.stop is not StopPolicy.NONE:
            summary.active, summary.reason = False, "Stopped"
            summary.message = _stopped(lq.stop)
        elif target is None:
            summary.active, summary.reason = False, "ClusterQueueMissing"
            summary.message = f"cluster queue {lq.cluster_queue} does not exist"
        elif not queues[target.name].active:
            summary.active, summary.reason = False, "ClusterQueueInactive"
            summary.message = f"cluster queue {target.name}: {queues[target.name].message}"
        else:
            summary.message = f"submits to cluster queue {target.name}"
    return queues, locals_
