"""Plain values the core decides over: pod sets, nodes, cluster snapshots, workloads.

Pure, no I/O. Everything here is a frozen dataclass built by the shell from watch
caches (nodes, pods, AppWrappers) and handed to the core; the core never mutates them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from dispatcher.api.resources import EMPTY, Resources
from dispatcher.core.namespaces import Wildcard

PODS = "pods"
"""The resource every pod asks one of (`core.podsets.pod_requests` adds it): a node's
allocatable `pods` (the kubelet's max-pods, 110 by default) bounds how many pods it runs,
whatever else they request."""

ONE_POD = 1000  # one `pods`, in milli-units

UNLIMITED_PODS = 10**9 * ONE_POD
"""The `pods` the fit gives a node that reports none in its allocatable (or 0, which
Resources cannot tell from absent): a cluster whose nodes never report it keeps working as
if pods per node were not modelled. Larger than any count that passes validation."""


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # "Equal" | "Exists"
    value: str = ""
    effect: str = ""  # "" matches every effect
    seconds: int | None = None  # tolerationSeconds (NoExecute): carried, not modelled

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
    tracked: bool = True
    """Whether its pods carry the dispatcher's labels, so that they are seen and count
    toward minAvailable. A RayJob's default submitter pod is made by KubeRay from no
    template of the user's: it is fitted and reserved, but never seen."""
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


def tracked_pod_count(pod_sets: tuple[PodSet, ...]) -> int:
    """The pods that will carry the dispatcher's labels (the default of minAvailable)."""
    return sum(p.count for p in pod_sets if p.tracked)


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
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
class DispatchedWorkload:
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
    ends_at: float | None = None
    """When its declared limit (`dispatchDuration.limit`) ends it at the latest: its room is
    free from then on (reservations count on it). None: no limit, it may run for ever."""
    protected_until: float = 0.0
    """Not a preemption victim before this: its dispatch plus its minimum runtime."""
    checkpointed_at: float = 0.0
    """The last checkpoint it declared (0: none): preempting it loses the runtime since."""


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """A member cluster at one instant, as the scheduling cycle sees it."""

    name: str
    nodes: tuple[NodeSnapshot, ...]
    reservations: tuple[Reservation, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    reachable: bool = True
    admitted: tuple[DispatchedWorkload, ...] = ()  # dispatched AppWrappers (preemption candidates)
    namespaces: frozenset[str] | None = None
    """The hub namespaces whose AppWrappers may come here by name (a member's `namespaces`
    mapping); None: every one (the hub itself)."""
    wildcard: Wildcard | None = None
    """What a member's `"*"` key takes besides `namespaces` (None: no `"*"` key)."""

    def takes(self, namespace: str) -> bool:
        """Whether AppWrappers of hub namespace `namespace` may come here."""
        return not self.refusal(namespace)

    def refusal(self, namespace: str) -> str:
        """ "" when AppWrappers of hub namespace `namespace` may come here; else why not:
        `NOT_MAPPED`, or why the `"*"` key does not take it."""
        if self.namespaces is None or namespace in self.namespaces:
            return ""
        if self.wildcard is None:
            return NOT_MAPPED
        return self.wildcard.refusal(namespace)


NOT_MAPPED = "not mapped"
"""`ClusterSnapshot.refusal` of a namespace its member's mapping does not name at all."""


LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
"""The operators of a Kubernetes label selector's `matchExpressions`."""


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One `matchExpressions` entry, read as Kubernetes reads a label selector's."""

    key: str
    operator: str  # one of LABEL_OPERATORS (workloads.py refuses any other)
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        if self.operator == "NotIn":  # an absent label is not in any set
            return self.key not in labels or labels[self.key] not in self.values
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        return False  # unknown: matches nothing rather than everything


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an AppWrapper may go: allowed cluster names (None = any) and a label selector
    (`matchLabels` and `matchExpressions`, all of which must hold)."""

    clusters: frozenset[str] | None = None
    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelRequirement, ...] = ()

    @property
    def anywhere(self) -> bool:
        """Whether every cluster is allowed (the usual case, checked without hashing)."""
        return self.clusters is None and not self.match_labels and not self.match_expressions

    def allows(self, cluster: ClusterSnapshot) -> bool:
        if self.clusters is not None and cluster.name not in self.clusters:
            return False
        labels = cluster.labels
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            requirement.matches(labels) for requirement in self.match_expressions
        )


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
    queue_name: str = ""  # the AppQueue it names ("" = none; see `core.quota.resolve`)
    charge_pod_sets: tuple[PodSet, ...] | None = None
    """What its pod templates ask, where a declaration (custompodresources) read as written
    asks less: quotas charge these unless the queue charges as declared. None: `pod_sets`."""
    checked: bool = False
    """Its admission checks passed in this attempt: it is fitted, never held for them again."""
    kind: str = ""
    """The kind of its first item, as written (what the pending list and its estimates say)."""
    duration_limit: float | None = None
    """Its `dispatchDuration.limit` in seconds, None for none (the start estimates, and
    whether it may backfill room reserved for another)."""
    minimum_runtime: float = 0.0
    """Seconds it asks to run before it may be preempted (its annotation; the queue caps
    it, and gives its own where it asks none)."""
    user: str = ""
    """Who created it, as its signed creator record says ("" when not known): per-user
    fair sharing and limits count it for that user."""
    groups: tuple[str, ...] = ()
    """That user's groups, as the same record says (per-group limits)."""
    # Its pod sets' shapes: what its fit depends on (see `PodSet.shape`).
    shape: tuple[str, ...] = field(init=False, repr=False, compare=False)
    charge_shape: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shape = tuple([p.shape for p in self.pod_sets])
        object.__setattr__(self, "shape", shape)
        charged = self.charge_pod_sets
        object.__setattr__(
            self, "charge_shape", shape if charged is None else tuple([p.shape for p in charged])
        )

    def with_pod_sets(self, pod_sets: tuple[PodSet, ...]) -> Workload:
        """The same workload with other pods (`dataclasses.replace` costs several times
        more, and a quota cycle makes one for each flavor it tries)."""
        return Workload(
            self.key,
            self.priority,
            self.created_at,
            pod_sets,
            self.placement,
            self.queued_since,
            self.preemptible,
            self.queue_name,
            self.charge_pod_sets,
            self.checked,
            self.kind,
            self.duration_limit,
            self.minimum_runtime,
        )


class QueueMode(StrEnum):
    STRICT_FIFO = "StrictFIFO"
    BEST_EFFORT_FIFO = "BestEffortFIFO"


class Backfill(StrEnum):
    """Whether work behind a reserved gang may use the room reserved for it."""

    NEVER = "Never"
    """No reservations: the head waits as its queueing strategy says. (Not "Off": YAML 1.1,
    which kubectl's parser reads, takes an unquoted Off for false.)"""
    DECLARED = "Declared"
    """A head that fits nowhere reserves the nodes it will fit on, from the earliest time the
    running work's declared limits free them; work behind it may use reserved room only if
    its own declared limit ends it before then (EASY backfill). Work without a limit never
    uses reserved room."""
