"""Quota specs as plain values: queues, cohorts, flavors, and what admitted work uses.

Pure, no I/O. Amounts are integers in milli-units (as `Resources`), keyed by
(flavor, resource): a queue's quota for `nvidia.com/gpu` in flavor `a100` is a different
amount from its quota in flavor `t4`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from dispatcher.core.model import (
    Backfill,
    LabelRequirement,
    PodSet,
    QueueMode,
    Taint,
    Toleration,
    Workload,
)
from dispatcher.core.quota.budget import Budget

FlavorResource = tuple[str, str]
"""(flavor name, resource name): the unit quota is kept in."""


@dataclass(frozen=True, slots=True)
class Quota:
    """One resource in one flavor: what the owner has (`nominal`), at most how much more
    it may take from its cohort (`borrowing_limit`, None = no limit), and at most how much
    of its own it lends to the cohort (`lending_limit`, None = all of it)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    """One flavor's quotas within a resource group."""

    flavor: str
    quotas: Mapping[str, Quota]  # resource -> quota


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    """Resources that are assigned a flavor together (a pod's cpu and memory come from the
    same nodes), with the flavors to try in order of preference."""

    covered: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


class WithinQueue(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    LOWER_OR_NEWER_EQUAL = "LowerOrNewerEqualPriority"


class Reclaim(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"
    ANY = "Any"


class BorrowPreemption(StrEnum):
    NEVER = "Never"
    LOWER_PRIORITY = "LowerPriority"


class StopPolicy(StrEnum):
    NONE = "None"
    HOLD = "Hold"  # admit nothing new; what runs keeps running
    HOLD_AND_DRAIN = "HoldAndDrain"  # admit nothing new and evict what runs


class QuotaCharge(StrEnum):
    """What a queue charges an AppWrapper it admits (`spec.quotaCharge`)."""

    AT_LEAST_TEMPLATES = "AtLeastTemplates"
    """Never less than its pod templates ask: a declaration cannot shrink the charge."""
    AS_DECLARED = "AsDeclared"
    """What placement reserves (`declared_pod_resources`; MCAD: as written)."""


class WhenCanBorrow(StrEnum):
    BORROW = "Borrow"  # take the first flavor that fits, borrowing if need be
    TRY_NEXT_FLAVOR = "TryNextFlavor"  # prefer a later flavor that fits without borrowing


class FairSharingMode(StrEnum):
    """What fair sharing compares: what queues borrow now (`Instant`, Kueue's fair sharing),
    or what they used over time, decayed with a half-life, plus what they hold now (`Usage`:
    `core.quota.history`; users within a queue are compared the same way)."""

    INSTANT = "Instant"
    USAGE = "Usage"


class WhenCanPreempt(StrEnum):
    PREEMPT = "Preempt"
    TRY_NEXT_FLAVOR = "TryNextFlavor"


@dataclass(frozen=True, slots=True)
class Selector:
    """A label selector: every `match_labels` pair and every requirement must hold.
    The empty selector matches everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[LabelRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.match_expressions
        )


@dataclass(frozen=True, slots=True)
class UserLimit:
    """What each user may hold in a queue at once: AppWrappers admitted (None: any number)
    and resources, summed over flavors (milli-units; a resource not named: no limit)."""

    max_running: int | None = None
    max_resources: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A cluster queue."""

    name: str
    groups: tuple[ResourceGroup, ...] = ()
    cohort: str | None = None
    namespaces: Selector | None = None  # None admits no namespace (as Kueue's nil selector)
    strategy: QueueMode = QueueMode.BEST_EFFORT_FIFO
    within: WithinQueue = WithinQueue.NEVER
    reclaim: Reclaim = Reclaim.NEVER
    borrow_preemption: BorrowPreemption = BorrowPreemption.NEVER
    borrow_threshold: int | None = None  # borrowing may preempt priorities up to this
    when_can_borrow: WhenCanBorrow = WhenCanBorrow.BORROW
    when_can_preempt: WhenCanPreempt = WhenCanPreempt.TRY_NEXT_FLAVOR
    weight: float = 1.0  # fair sharing: a higher weight is entitled to a larger share
    stop: StopPolicy = StopPolicy.NONE
    charge: QuotaCharge = QuotaCharge.AT_LEAST_TEMPLATES
    checks: tuple[str, ...] = ()
    """Admission checks (names) an AppWrapper that fits no member's nodes waits on, holding
    its quota, before it is fitted again (docs/autoscaling.md)."""
    backfill: Backfill = Backfill.DECLARED
    """Whether its head reserves nodes, and work behind it backfills them (`Backfill`)."""
    minimum_runtime: float = 0.0
    """Seconds its AppWrappers run before they may be preempted: the default for those that
    ask none, and the most one may ask (0: none, and asks are capped by the setting)."""
    notice_seconds: float = 0.0
    """Seconds a victim of a preemption is told before its objects are removed."""
    user_limit: UserLimit | None = None
    """What each user may hold in it at once (`core.quota.view.QuotaView.user_refusal`)."""
    group_limits: Mapping[str, UserLimit] = field(default_factory=dict)
    """Per group: what its users may hold in it at once, together."""
    budget: Budget | None = None
    """Resource-hours it may spend per period (`core.quota.budget`)."""
    problems: tuple[str, ...] = ()  # found while reading the object (e.g. a bad quantity)

    def charged(self, workload: Workload) -> tuple[PodSet, ...]:
        """The pods this queue charges `workload` for."""
        if workload.charge_pod_sets is None or self.charge is QuotaCharge.AS_DECLARED:
            return workload.pod_sets
        return workload.charge_pod_sets

    def charged_shape(self, workload: Workload) -> tuple[str, ...]:
        """What the charge depends on (`Workload.shape` of the charged pods)."""
        if workload.charge_pod_sets is None or self.charge is QuotaCharge.AS_DECLARED:
            return workload.shape
        return workload.charge_shape

    def quota(self, flavor: str, resource: str) -> Quota | None:
        for group in self.groups:
            if resource in group.covered:
                for fq in group.flavors:
                    if fq.flavor == flavor:
                        return fq.quotas.get(resource)
        return None


@dataclass(frozen=True, slots=True)
class CohortSpec:
    """A cohort: queues (and cohorts) that lend to each other; it may have a parent and
    quotas of its own, which its members may borrow."""

    name: str
    parent: str | None = None
    groups: tuple[ResourceGroup, ...] = ()
    problems: tuple[str, ...] = ()  # found while reading the object


@dataclass(frozen=True, slots=True)
class Flavor:
    """Nodes of one kind: the labels that select them, the taints they carry, and the
    tolerations pods admitted in this flavor get."""

    name: str
    node_labels: tuple[tuple[str, str], ...] = ()
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class LocalQueue:
    """A namespaced queue users submit to, pointing at a cluster queue."""

    namespace: str
    name: str
    cluster_queue: str
    stop: StopPolicy = StopPolicy.NONE
    problems: tuple[str, ...] = ()  # why it admits nothing (e.g. Kueue's of the same name)


@dataclass(frozen=True, slots=True)
class QuotaSetup:
    """Every quota object, as read in one snapshot. Empty means no quotas: the dispatcher
    then admits on cluster capacity alone."""

    queues: Mapping[str, QueueSpec] = field(default_factory=dict)
    cohorts: Mapping[str, CohortSpec] = field(default_factory=dict)
    flavors: Mapping[str, Flavor] = field(default_factory=dict)
    local_queues: Mapping[tuple[str, str], LocalQueue] = field(default_factory=dict)
    namespace_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    fair_sharing: bool = False
    fair_preemption: bool = True  # with fair sharing: preempt to restore fair shares
    fair_mode: FairSharingMode = FairSharingMode.INSTANT
    half_life: float = 7 * 86400.0
    """`Usage` mode: seconds after which use counts half (`core.quota.history`)."""
    queue_required: bool = False  # with queues: an AppWrapper without one waits

    @property
    def enabled(self) -> bool:
        return bool(self.queues or self.local_queues)


@dataclass(frozen=True, slots=True)
class Charge:
    """What one admitted AppWrapper uses of its queue's quota."""

    key: str
    queue: str
    amounts: Mapping[FlavorResource, int]
    priority: int = 0
    admitted_at: float = 0.0
    preemptible: bool = True
    user: str = ""  # who created it (its signed record), "" when not known
    groups: tuple[str, ...] = ()  # that user's groups, as the same record says
    limit: float | None = None  # its declared `dispatchDuration.limit`, seconds (budgets)
