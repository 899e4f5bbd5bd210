"""Plain values the core decides over: pod sets, nodes, cluster snapshots, workloads.

Pure, no I/O. Everything here is a frozen dataclass built by the shell from watch
caches (nodes, pods, AppWrappers) and handed to the core; the core never mutates them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from dispatcher.api.resources import EMPTY, Resources


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # "Equal" | "Exists"
    value: str = ""
    effect: str = ""  # "" matches every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute

    @property
    def repels(self) -> bool:
        """PreferNoSchedule only steers the scheduler; it never keeps a pod off a node."""
        return self.effect in ("NoSchedule", "NoExecute")


@dataclass(frozen=True, slots=True)
class PodSet:
    """`count` identical pods, each asking for `requests`, with their placement constraints."""

    count: int
    requests: Resources
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    name: str = ""  # where it came from, for messages: "RayCluster/glue head"
    # What the fit of these pods depends on (not the name), canonical and as one string:
    # every AppWrapper has its own `Resources` and `Toleration` objects, and the scheduling
    # cycle looks gangs up by shape thousands of times; a string caches its hash and
    # compares as a memcmp (the repr of a tuple of ints and strings is unambiguous).
    shape: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = (
            self.count,
            sorted([(r, v) for r, v in self.requests.items() if v]),
            self.node_selector,
            [(t.key, t.operator, t.value, t.effect) for t in self.tolerations],
        )
        object.__setattr__(self, "shape", repr(shape))

    @property
    def total(self) -> Resources:
        return self.requests.scale(self.count)


def total_requests(pod_sets: tuple[PodSet, ...]) -> Resources:
    result = EMPTY
    for pod_set in pod_sets:
        result = result + pod_set.total
    return result


def pod_count(pod_sets: tuple[PodSet, ...]) -> int:
    return sum(p.count for p in pod_sets)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node as the capacity cache sees it. `requested` sums non-terminal pods bound to it."""

    name: str
    allocatable: Resources
    requested: Resources = EMPTY
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable

    @property
    def free(self) -> Resources:
        return self.allocatable - self.requested

    def admits(self, pod_set: PodSet) -> bool:
        """Whether the pods' selector and tolerations let them onto this node (ignoring room)."""
        if not self.schedulable:
            return False
        for key, value in pod_set.node_selector:
            if self.labels.get(key) != value:
                return False
        return all(
            any(t.tolerates(taint) for t in pod_set.tolerations)
            for taint in self.taints
            if taint.repels
        )


@dataclass(frozen=True, slots=True)
class Reservation:
    """Pods a dispatched AppWrapper declared that are not yet bound to a node.

    They hold capacity until they appear (rule 1: never overcommit in that window).
    """

    key: str
    pod_sets: tuple[PodSet, ...]
    priority: int = 0
    dispatched_at: float = 0.0
    preemptible: bool = True


@dataclass(frozen=True, slots=True)
class AdmittedWorkload:
    """A dispatched AppWrapper in a member cluster, as preemption sees it.

    `usage` is what its pods that are already bound use, per node (these requests are also
    inside the nodes' `requested`). Its pods that are not bound yet are the `Reservation` with
    the same `key` in `ClusterSnapshot.reservations`: one place for them, so they are never
    counted twice. Evicting it frees both.
    """

    key: str
    priority: int
    dispatched_at: float
    preemptible: bool = True
    usage: tuple[tuple[str, Resources], ...] = ()  # (node name, requests of its pods there)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """A member cluster at one instant, as the scheduling cycle sees it."""

    name: str
    nodes: tuple[NodeState, ...]
    reservations: tuple[Reservation, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    reachable: bool = True
    admitted: tuple[AdmittedWorkload, ...] = ()  # dispatched AppWrappers (preemption candidates)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an AppWrapper may go: allowed cluster names (None = any) and a label selector."""

    clusters: frozenset[str] | None = None
    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    """(key, operator, values): In, NotIn, Exists, DoesNotExist, as Kubernetes' selectors."""

    @property
    def anywhere(self) -> bool:
        return self.clusters is None and not self.match_labels and not self.match_expressions

    def allows(self, cluster: ClusterSnapshot) -> bool:
        if self.clusters is not None and cluster.name not in self.clusters:
            return False
        labels = cluster.labels
        if not all(labels.get(k) == v for k, v in self.match_labels):
            return False
        for key, operator, values in self.match_expressions:
            present = key in labels
            if operator == "In" and not (present and labels[key] in values):
                return False
            if operator == "NotIn" and present and labels[key] in values:
                return False
            if operator == "Exists" and not present:
                return False
            if operator == "DoesNotExist" and present:
                return False
        return True


@dataclass(frozen=True, slots=True)
class Workload:
    """A queued AppWrapper as the core sees it."""

    key: str  # "namespace/name"
    priority: int
    created_at: float  # seconds since the epoch; older goes first at equal priority
    pod_sets: tuple[PodSet, ...]
    placement: Placement = Placement()
    queued_since: float = 0.0  # when it became head-of-line eligible (starvation guard)
    preemptible: bool = True
    # Its pod sets' shapes: what its fit depends on (see `PodSet.shape`).
    shape: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple([p.shape for p in self.pod_sets]))


class QueueMode(StrEnum):
    STRICT_FIFO = "StrictFIFO"
    BEST_EFFORT_FIFO = "BestEffortFIFO"
