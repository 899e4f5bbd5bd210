"""What one scheduling cycle decides, as the controller acts on it: admissions, waits,
preemptions, and the `CycleResult` that carries them with what the cycle learned (heads,
holds, reservations, where pods go). Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dispatcher.api.models import Reason
from dispatcher.core.quota.flavors import Assignment
from dispatcher.core.quota.resolve import Queued, QueueProblem
from dispatcher.core.scheduling.placement import NodeAssignment, Placements
from dispatcher.core.scheduling.reservation import ReservationInfo

__all__ = ["Admit", "CycleResult", "Preempt", "Wait"]


@dataclass(frozen=True, slots=True)
class Admit:
    """Dispatch workload `key` to `cluster` (charged to cluster queue `queue`, submitted
    through AppQueue `local`, with the flavors of `assignment`, when it has a queue). With
    `cluster` "": its quota is reserved while admission checks `checks` run."""

    key: str
    cluster: str
    queue: str = ""
    local: str = ""
    assignment: Assignment | None = None
    checks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Wait:
    """Workload `key` stays queued; `message` says why, for `kubectl describe`; `reason`
    whether it waits for capacity, for its queue's quota, or for its queue to be usable."""

    key: str
    message: str
    reason: Reason = Reason.INSUFFICIENT_RESOURCES


@dataclass(frozen=True, slots=True)
class Preempt:
    """Evict `victims` (AppWrapper keys) from `cluster` to make room for workload `key`."""

    key: str
    cluster: str
    victims: tuple[str, ...]
    queue: str = ""  # the preemptor's cluster queue, when it has one


@dataclass(frozen=True, slots=True)
class CycleResult:
    admits: tuple[Admit, ...] = ()
    waits: tuple[Wait, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    head_key: str | None = None  # the first workload in queue order not admitted
    heads: frozenset[str] = frozenset()  # with queues: the first of each queue too
    # What "see the queue" reads (core/visibility.py): every pending key in the order this
    # cycle took them, and the queue each resolved to (with quotas).
    order: tuple[str, ...] = ()
    resolved: Mapping[str, Queued | QueueProblem | None] = field(default_factory=dict)
    held: frozenset[str] = frozenset()  # clusters held for a preemptor or a starving one,
    # or with nodes reserved for a head: when one no longer is, parked work is woken
    holders: frozenset[str] = frozenset()  # the starving ones that hold some of `held`
    again: bool = False  # work was woken for the next cycle (`core.queues.take`): run it soon
    blocking: frozenset[str] = frozenset()  # StrictFIFO heads that block all those after them
    reservations: Mapping[str, ReservationInfo] = field(default_factory=dict)  # head -> its own
    # Where each admission's pods went, node by node (a guess at where they will be bound).
    placements: Mapping[str, tuple[NodeAssignment, ...]] = field(default_factory=Placements)
