"""What a dispatched AppWrapper holds in its member: the pods it declared that are not yet
on a node (a reservation) and what its bound pods use per node. Pure, no I/O.

Rule 1 (never overcommit) rests on this: from the dispatch until its pods are bound, an
AppWrapper's declared pods are charged as a reservation; once bound, each pod is counted at
its real requests on its node (by the capacity cache) and leaves the reservation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from dispatcher.api.resources import Resources
from dispatcher.core.model import DispatchedWorkload, PodSet, Reservation, Workload


class OwnedPod(Protocol):
    """A pod of the AppWrapper as the capacity cache records it."""

    @property
    def node(self) -> str: ...

    @property
    def requests(self) -> Resources: ...

    @property
    def occupies_node(self) -> bool: ...

    @property
    def deleting(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Occupancy:
    """A dispatched AppWrapper's reservation (None once every pod is bound) and usage."""

    reservation: Reservation | None
    admitted: DispatchedWorkload


def occupancy(
    workload: Workload,
    pods: Iterable[OwnedPod],
    *,
    dispatched_at: float,
    checkpointed_at: float = 0.0,
) -> Occupancy:
    """What `workload`, dispatched at `dispatched_at` and owning `pods`, holds now; when its
    declared limit ends it, until when it is protected from preemption (its
    `minimum_runtime`, as its queue allows it), and its last declared checkpoint."""
    owned = list(pods)
    # A pod on its way out (an earlier attempt's, its objects deleted) still uses its node
    # but is not one of the gang's: the objects made again will make another in its place.
    remaining = unplaced(
        workload.pod_sets, [p.requests for p in owned if p.node and not p.deleting]
    )
    reservation = None
    if remaining:
        reservation = Reservation(
            key=workload.key,
            pod_sets=remaining,
            priority=workload.priority,
            dispatched_at=dispatched_at,
            preemptible=workload.preemptible,
        )
    usage: dict[str, Resources] = {}
    for pod in owned:
        if pod.occupies_node:
            usage[pod.node] = usage[pod.node] + pod.requests if pod.node in usage else pod.requests
    limit = workload.duration_limit
    admitted = DispatchedWorkload(
        key=workload.key,
        priority=workload.priority,
        dispatched_at=dispatched_at,
        preemptible=workload.preemptible,
        usage=tuple(sorted(usage.items())),
        ends_at=None if limit is None else dispatched_at + limit,
        protected_until=dispatched_at + workload.minimum_runtime,
        checkpointed_at=checkpointed_at,
    )
    return Occupancy(reservation, admitted)


def unplaced(pod_sets: tuple[PodSet, ...], placed: Sequence[Resources]) -> tuple[PodSet, ...]:
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
