"""Pydantic models of the quota kinds (crds/queues.yaml): ClusterAppQueue, AppQueue,
AppCohort, AppFlavor. No I/O.

They accept what the CRD admits; quantities stay as written here (strings or integers) and
are parsed where the core reads them (`core.quota.read`), so a bad one makes its queue
inactive with a message instead of making the object unreadable.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dispatcher.api.models import ClusterSelector

QUEUE_KINDS = {
    "ClusterAppQueue": "clusterappqueues",
    "AppQueue": "appqueues",
    "AppCohort": "appcohorts",
    "AppFlavor": "appflavors",
}
"""kind -> plural, all in the AppWrapper's group and version."""

Quantity = str | int | float


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class Metadata(_Model):
    name: str
    namespace: str | None = None
    generation: int | None = None
    uid: str | None = None
    resourceVersion: str | None = None
    deletionTimestamp: str | None = None
    finalizers: list[str] = Field(default_factory=list)


class ResourceQuota(_Model):
    name: str
    nominalQuota: Quantity
    borrowingLimit: Quantity | None = None
    lendingLimit: Quantity | None = None


class FlavorQuotas(_Model):
    name: str
    resources: list[ResourceQuota] = Field(default_factory=list)


class ResourceGroup(_Model):
    coveredResources: list[str] = Field(default_factory=list)
    flavors: list[FlavorQuotas] = Field(default_factory=list)


class BorrowWithinCohort(_Model):
    policy: str = "Never"
    maxPriorityThreshold: int | None = None


class Preemption(_Model):
    withinClusterQueue: str = "Never"
    reclaimWithinCohort: str = "Never"
    borrowWithinCohort: BorrowWithinCohort = Field(default_factory=BorrowWithinCohort)
    minimumRuntimeSeconds: int = Field(default=0, ge=0, le=7 * 24 * 3600)
    """Ours: seconds its AppWrappers run before they may be preempted (and the most one may
    ask with its annotation)."""
    noticeSeconds: int = Field(default=0, ge=0, le=3600)
    """Ours: seconds a victim is told before its objects are removed."""


class FlavorFungibility(_Model):
    whenCanBorrow: str = "Borrow"
    whenCanPreempt: str = "TryNextFlavor"


class FairSharing(_Model):
    weight: Quantity | None = None


class UserLimits(_Model):
    """Ours: what each user (the signed creator record's) may hold in the queue at once."""

    maxRunning: int | None = Field(default=None, ge=1, le=1_000_000)
    maxResources: dict[str, Quantity] = Field(default_factory=dict, max_length=32)


class GroupLimits(UserLimits):
    """Ours: what the users of one group (as the signed creator record names their groups)
    may hold in the queue at once, together."""

    group: str = Field(min_length=1, max_length=253)


class BudgetSpec(_Model):
    """Ours: at most `amountHours` of `resource` x hours per period (docs/quotas.md,
    "Budgets")."""

    resource: str = Field(min_length=1, max_length=253)
    amountHours: Quantity
    period: Literal["Day", "Week", "Month", "Rolling"] = "Week"
    windowHours: float = Field(default=168.0, gt=0, le=24 * 366)
    whenExhausted: Literal["Finish", "Stop"] = "Finish"


class ClusterAppQueueSpec(_Model):
    cohort: str | None = None
    namespaceSelector: ClusterSelector | None = None
    queueingStrategy: str = "BestEffortFIFO"
    resourceGroups: list[ResourceGroup] = Field(default_factory=list)
    preemption: Preemption = Field(default_factory=Preemption)
    flavorFungibility: FlavorFungibility = Field(default_factory=FlavorFungibility)
    fairSharing: FairSharing | None = None
    stopPolicy: str = "None"
    quotaCharge: str = "AtLeastTemplates"
    """AtLeastTemplates: an AppWrapper is charged at least what its pod templates ask;
    AsDeclared: what placement reserves (`declared_pod_resources`)."""
    admissionChecks: list[str] = Field(default_factory=list)
    """Admission checks (the dispatcher's `provisioning.checks` names) run for an AppWrapper
    whose pods fit no member's nodes: its quota is held meanwhile (docs/autoscaling.md)."""
    backfill: str = "Declared"
    """Ours: Declared (its head reserves nodes, work that ends first backfills them) or
    Never."""
    userLimits: UserLimits | None = None
    groupLimits: list[GroupLimits] = Field(default_factory=list, max_length=32)
    budget: BudgetSpec | None = None
    """Ours: at most this much held by each user at once (docs/quotas.md, "Per-user
    limits")."""


class ClusterAppQueue(_Model):
    metadata: Metadata
    spec: ClusterAppQueueSpec = Field(default_factory=ClusterAppQueueSpec)


class AppQueueSpec(_Model):
    clusterQueue: str
    stopPolicy: str = "None"


class AppQueue(_Model):
    metadata: Metadata
    spec: AppQueueSpec


class AppCohortSpec(_Model):
    parent: str | None = None
    resourceGroups: list[ResourceGroup] = Field(default_factory=list)


class AppCohort(_Model):
    metadata: Metadata
    spec: AppCohortSpec = Field(default_factory=AppCohortSpec)


class TaintSpec(_Model):
    key: str
    value: str = ""
    effect: str = "NoSchedule"


class TolerationSpec(_Model):
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    tolerationSeconds: int | None = None


class AppFlavorSpec(_Model):
    nodeLabels: dict[str, str] = Field(default_factory=dict)
    nodeTaints: list[TaintSpec] = Field(default_factory=list)
    tolerations: list[TolerationSpec] = Field(default_factory=list)


class AppFlavor(_Model):
    metadata: Metadata
    spec: AppFlavorSpec = Field(default_factory=AppFlavorSpec)


def parse(kind: str, obj: dict[str, Any]) -> ClusterAppQueue | AppQueue | AppCohort | AppFlavor:
    """The model of one quota object (raises pydantic.ValidationError)."""
    if kind == "ClusterAppQueue":
        return ClusterAppQueue.model_validate(obj)
    if kind == "AppQueue":
        return AppQueue.model_validate(obj)
    if kind == "AppCohort":
        return AppCohort.model_validate(obj)
    return AppFlavor.model_validate(obj)
