"""Which cluster queue an AppWrapper is accounted in. Pure, no I/O.

An AppWrapper names an AppQueue of its namespace (its queue label, or the namespace's
`default` AppQueue); the AppQueue names a cluster queue. Every broken link gets a message
that says which one, and the AppWrapper waits with it (it dispatches as soon as the link is
mended). An AppWrapper that names no queue, when its namespace has no default AppQueue and
none is required, has no queue: it is admitted on capacity alone, as without quotas.
"""

from __future__ import annotations

from dataclasses import dataclass

from dispatcher.api.constants import DEFAULT_QUEUE
from dispatcher.core.quota.model import QuotaSetup, StopPolicy
from dispatcher.core.quota.tree import QuotaTree

__all__ = ["QueueProblem", "Queued", "resolve"]


@dataclass(frozen=True, slots=True)
class Queued:
    local: str  # "namespace/name" of the AppQueue
    queue: str  # the cluster queue


@dataclass(frozen=True, slots=True)
class QueueProblem:
    message: str
    local: str = ""  # the AppQueue and cluster queue, as far as they resolved (for counts)
    queue: str = ""


def resolve(
    namespace: str, queue_name: str, setup: QuotaSetup, tree: QuotaTree
) -> Queued | QueueProblem | None:
    """The cluster queue of an AppWrapper in `namespace` naming `queue_name` ("" = none).
    One that names a queue always waits for it, even with no queues at all."""
    name = queue_name
    if not name:
        if not setup.enabled:
            return None
        if (namespace, DEFAULT_QUEUE) not in setup.local_queues:
            if setup.queue_required:
                return QueueProblem(
                    f"no queue: label the AppWrapper with a queue name, or create AppQueue"
                    f" {DEFAULT_QUEUE} in namespace {namespace}"
                )
            return None
        name = DEFAULT_QUEUE
    local = setup.local_queues.get((namespace, name))
    if local is None:
        return QueueProblem(f"AppQueue {namespace}/{name} does not exist")
    where = f"{namespace}/{name}"
    if local.problems:
        return QueueProblem(f"queue {where} is inactive: {'; '.join(local.problems)}", where)
    if local.stop is not StopPolicy.NONE:
        return QueueProblem(
            f"AppQueue {where} is stopped (stopPolicy {local.stop})", where, local.cluster_queue
        )
    queue = setup.queues.get(local.cluster_queue)
    if queue is None:
        return QueueProblem(
            f"AppQueue {where} points at cluster queue {local.cluster_queue}, which does not exist",
            where,
        )
    problems = tree.problems.get(queue.name)
    if problems:
        return QueueProblem(
            f"cluster queue {queue.name} is inactive: {'; '.join(problems)}", where, queue.name
        )
    if queue.stop is not StopPolicy.NONE:
        return QueueProblem(
            f"cluster queue {queue.name} is stopped (stopPolicy {queue.stop})", where, queue.name
        )
    if queue.namespaces is None:
        return QueueProblem(
            f"cluster queue {queue.name} admits no namespace (its namespaceSelector is unset;"
            " {} admits all)",
            where,
            queue.name,
        )
    if not queue.namespaces.matches(setup.namespace_labels.get(namespace, {})):
        return QueueProblem(
            f"cluster queue {queue.name} does not admit namespace {namespace}"
            " (its namespaceSelector does not match the namespace's labels)",
            where,
            queue.name,
        )
    return Queued(f"{namespace}/{name}", queue.name)
