"""Pydantic models of the AppWrapper custom resource (workload.codeflare.dev/v1beta1). Pure, no I/O.

Python attribute names are the wire names (`schedulingSpec`, `minAvailable`, `requeueCount`,
`generictemplate`, ...) so that code reads like the YAML it handles. The two capitalised MCAD
names are the exception: `resources.GenericItems` is `generic_items` and the legacy
`resources.Items` is `legacy_items`; both names are accepted on input and the wire names are
written on output (`by_alias=True`).

The models accept every object the CRD (crds/appwrapper.yaml) admits, so `AppWrapper.from_kube`
only fails on objects that did not come through the API server. Quantities in
`custompodresources` are kept as written; `CustomPodResource.effective_requests()` parses them
and raises `QuantityError` naming the resource and value.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from dispatcher.api.names import generated_for
from dispatcher.api.resources import Resources

GROUP: Final = "workload.codeflare.dev"
VERSION: Final = "v1beta1"
API_VERSION: Final = "workload.codeflare.dev/v1beta1"
KIND: Final = "AppWrapper"
PLURAL: Final = "appwrappers"
SHORT_NAME: Final = "aw"

Int = Annotated[int, Field(strict=True)]
"""An integer; booleans, floats and numeric strings are rejected as the CRD rejects them."""
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]
Quantity = str | int | float
"""A Kubernetes quantity as written ("500m", "16Gi", 2); parsed by dispatcher.api.quantity."""
GrowthType = Literal["exponential", "linear", "none"]
ConditionStatus = Literal["True", "False", "Unknown"]


class AppWrapperState(StrEnum):
    """MCAD's summary state, `status.state`."""

    PENDING = "Pending"
    RUNNING = "Running"
    RUNNING_HOLD_COMPLETION = "RunningHoldCompletion"
    """MCAD's: every item with a completionstatus reports it, but pods still run."""
    COMPLETED = "Completed"
    FAILED = "Failed"
    DELETED = "Deleted"


class ConditionType(StrEnum):
    """`status.conditions[].type`. Milestones run Init -> Queueing -> HeadOfLine -> Dispatched
    -> Running -> Completed; Backoff, Failed, Preempted and Requeued say what went wrong."""

    INIT = "Init"
    QUEUEING = "Queueing"
    HEAD_OF_LINE = "HeadOfLine"
    BACKOFF = "Backoff"
    DISPATCHED = "Dispatched"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    QUOTA_HELD = "QuotaHeld"
    """True while its queue's quota is held for it and its admission checks run (nothing is
    created yet); still True, with `AdmissionChecksReady`, once they passed and it is fitted
    on the nodes as usual; False with the reason of a retry or a requeue."""


CHECK_CONDITION_PREFIX = "AdmissionCheck."
"""`AdmissionCheck.<name>`: one condition per admission check, True once the check is Ready
for the current attempt (docs/autoscaling.md)."""


class Reason(StrEnum):
    """`status.conditions[].reason` values the dispatcher sets (docs/api.md says which goes
    with which condition type)."""

    CREATED = "Created"
    # Where MCAD names the same step, its reason is used (its tools and users read them).
    QUEUED = "AwaitingHeadOfLine"
    REQUEUED = "Requeued"
    FRONT_OF_QUEUE = "FrontOfQueue."  # sic, MCAD's
    REQUEUE_BACKOFF = "RequeueBackoff"
    DISPATCHED = "AppWrapperRunnable"
    INSUFFICIENT_RESOURCES = "InsufficientResources"
    QUOTA_EXCEEDED = "QuotaExceeded"
    QUEUE_NOT_READY = "QueueNotReady"
    DISPATCH_FAILED = "DispatchFailed"
    PODS_RUNNING = "PodsRunning"
    PODS_NOT_READY = "PodsNotReady"
    MIN_AVAILABLE_NOT_REACHED = "MinAvailableNotReached"
    WORKLOAD_COMPLETED = "PodsCompleted"
    SOME_ITEMS_COMPLETED = "SomeItemsCompleted"
    INVALID_SPEC = "InvalidSpec"
    REQUEUE_LIMIT_REACHED = "RequeueLimitReached"
    RESETTING = "Resetting"
    """Failed, and reset to be tried again (the v1beta2 fault-tolerance annotations): its
    objects are removed, it keeps its room, and they are made again after the pause."""
    RETRY_LIMIT_REACHED = "RetryLimitReached"
    DISPATCH_DURATION_EXCEEDED = "DispatchDurationExceeded"
    PODS_FAILED = "PodsFailed"
    MISSING_COMPONENT = "MissingComponent"
    """Failed: a wrapped object was deleted by someone else while it ran."""
    PREEMPTED_BY_HIGHER_PRIORITY = "PreemptedByHigherPriority"
    RECLAIMED_WITHIN_COHORT = "ReclaimedWithinCohort"
    PREEMPTED_WITHIN_QUEUE = "PreemptedWithinQueue"
    PODS_NOT_RUNNING_IN_TIME = "PodsNotRunningInTime"
    PREEMPTED = "Preempted"
    CLUSTER_UNREACHABLE = "ClusterUnreachable"
    SPEC_CHANGED = "SpecChanged"
    QUEUE_DRAINED = "QueueDrained"
    BUDGET_EXHAUSTED = "BudgetExhausted"
    FORBIDDEN = "Forbidden"
    SUSPENDED = "Suspended"
    CHECKS_PENDING = "AdmissionChecksPending"
    """QuotaHeld: its quota is held while its admission checks run."""
    CHECKS_READY = "AdmissionChecksReady"
    """QuotaHeld (True): every check passed; it is fitted on the nodes as usual."""
    CHECK_PENDING = "Pending"
    CHECK_READY = "Ready"
    CHECK_RETRY = "Retry"
    CHECK_MISCONFIGURED = "CheckMisconfigured"
    NODE_UNHEALTHY = "NodeUnhealthy"
    """Some of its pods are on a node whose health labels evict what they ask for
    (docs/node-health.md): reset after its failure grace, or requeued."""
    CAPACITY_REVOKED = "CapacityRevoked"
    """Requeued: the provisioner took back the capacity its admission check had provided."""
    PROVISIONING_FAILED = "ProvisioningFailed"
    """Failed: the provisioner refused its ProvisioningRequest as many times as allowed."""
    """`spec.suspend` is true: held (Dispatched False), or its objects removed (Requeued)."""


class _Model(BaseModel):
    """Base: unknown fields are dropped (the CRD prunes them anyway); names or aliases accepted."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")


# ---------------------------------------------------------------------------------------------
# spec


class CustomPodResource(_Model):
    """`replicas` pods, each asking for `requests` (and capped by `limits`)."""

    replicas: NonNegativeInt
    requests: dict[str, Quantity] = Field(default_factory=dict)
    limits: dict[str, Quantity] | None = None

    def effective_requests(self) -> Resources:
        """Per-pod requests as Kubernetes sees them: a resource with only a limit requests
        the limit. Raises QuantityError naming the resource and the value."""
        return Resources.parse({**(self.limits or {}), **self.requests})


class PodSetRef(_Model):
    """One pod template of a wrapped object, by its path in the object (v1beta2's podSet)."""

    path: str
    """Dotted, with [i] for list elements, as the AppWrapper controller writes it:
    `template.spec.template`, `template.spec.workerGroupSpecs[0].template`."""
    replicas: NonNegativeInt | None = None
    """Pods made from it; None: read off the object, else 1."""
    annotations: dict[str, str] = Field(default_factory=dict)


class PodSetInfo(_Model):
    """What is added, at dispatch, to the pod template of the podSet at the same index."""

    model_config = ConfigDict(extra="allow")

    annotations: dict[str, str] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    schedulingGates: list[dict[str, Any]] = Field(default_factory=list)


class GenericItem(_Model):
    """One wrapped Kubernetes object and what its pods will ask for.

    `replicas`, `minavailable`, `allocated`, `priority`, `priorityslope` and `metadata` are
    MCAD fields that were never used; they are accepted and ignored. Unknown fields are kept
    (`model_extra`), as MCAD YAML in the wild carries odd ones.
    """

    model_config = ConfigDict(extra="allow")

    generictemplate: dict[str, Any] = Field(default_factory=dict)
    """Absent is accepted here, as MCAD's CRD accepts it; the AppWrapper then fails
    (InvalidSpec), as it does under MCAD."""
    custompodresources: list[CustomPodResource] | None = None
    completionstatus: str | None = None
    # v1beta2's, carried in v1beta1 (docs/appwrapper-compatibility.md)
    podSets: list[PodSetRef] | None = None
    """Declared pod templates; None: inferred from the object."""
    podSetInfos: list[PodSetInfo] = Field(default_factory=list)
    annotations: dict[str, str] = Field(default_factory=dict)
    # legacy, ignored
    replicas: Int | None = None
    minavailable: Int | None = None
    allocated: Int | None = None
    priority: Int | None = None
    priorityslope: float | None = None
    metadata: dict[str, Any] | None = None
    _digest: str | None = PrivateAttr(default=None)
    """digest(), once per model: a dispatched AppWrapper's items are compared with those
    recorded at dispatch on every change of its pods, and a parsed model is never edited."""

    def ref(self) -> WrappedRef:
        """Which object this item makes (its name as written; the namespace is always the
        AppWrapper's), with the fingerprint of its content."""
        template = self.generictemplate
        return WrappedRef(
            apiVersion=str(template.get("apiVersion") or ""),
            kind=str(template.get("kind") or ""),
            name=str((template.get("metadata") or {}).get("name") or ""),
            digest=self.digest(),
        )

    def digest(self) -> str:
        """A short fingerprint of what this item creates and declares. Recorded at dispatch,
        so that an edit of its content afterwards is seen: the object created would no
        longer be the one that was fitted (fewer pods declared than run is an overcommit).
        A template that cannot be serialised (nested too deep) gets one that matches no
        recorded fingerprint."""
        if self._digest is None:
            self._digest = self._fingerprint()
        return self._digest

    def _fingerprint(self) -> str:
        declared = None
        if self.custompodresources is not None:
            declared = [
                c.model_dump(mode="json", exclude_unset=True) for c in self.custompodresources
            ]
        content = {
            "template": self.generictemplate,
            "declared": declared,
            "completion": self.completionstatus,
        }
        try:
            text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
        except (RecursionError, ValueError, TypeError):
            return "unreadable"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def completion_conditions(self) -> tuple[str, ...]:
        """The condition types of the wrapped object that mean "done", e.g. ("Complete",)."""
        if not self.completionstatus:
            return ()
        return tuple(part.strip() for part in self.completionstatus.split(",") if part.strip())


class AppWrapperResources(_Model):
    generic_items: list[GenericItem] = Field(default_factory=list, alias="GenericItems")
    legacy_items: list[dict[str, Any]] = Field(default_factory=list, alias="Items")
    """MCAD's pre-generic item list; accepted and ignored."""


class Requeuing(_Model):
    """If fewer than minAvailable pods run within the window after dispatch, requeue."""

    timeInSeconds: NonNegativeInt = 300
    maxTimeInSeconds: NonNegativeInt = 0
    """Cap on the grown window; 0 means no cap."""
    growthType: GrowthType = "exponential"
    maxNumRequeuings: NonNegativeInt = 0
    """Requeues allowed before the AppWrapper is Failed; 0 means unlimited."""
    # MCAD kept its bookkeeping in the spec; accepted, not used (status.requeueCount counts).
    initialTimeInSeconds: NonNegativeInt | None = None
    pauseTimeInSeconds: NonNegativeInt | None = None
    numRequeuings: NonNegativeInt | None = None


class DispatchDuration(_Model):
    limit: NonNegativeInt | None = None
    """Seconds a dispatched AppWrapper may run before it is stopped and Failed."""
    # MCAD legacy, ignored
    expected: Int | None = None
    overrun: bool | None = None


class ClusterReference(_Model):
    name: str


class LabelSelectorRequirement(_Model):
    key: str
    operator: str
    values: list[str] = Field(default_factory=list)


class ClusterSelector(_Model):
    matchLabels: dict[str, str] = Field(default_factory=dict)
    matchExpressions: list[LabelSelectorRequirement] = Field(default_factory=list)


class ClusterScheduling(_Model):
    clusters: list[ClusterReference] = Field(default_factory=list)
    """Member clusters the AppWrapper may go to; empty means any."""
    clusterSelector: ClusterSelector | None = None
    """A label selector over the member clusters' configured labels."""


class SchedulingSpec(_Model):
    minAvailable: NonNegativeInt | None = None
    """Pods that must run for the AppWrapper to count as Running; None means all it declared."""
    requeuing: Requeuing = Field(default_factory=Requeuing)
    dispatchDuration: DispatchDuration = Field(default_factory=DispatchDuration)
    clusterScheduling: ClusterScheduling | None = None
    # MCAD legacy, ignored
    nodeSelector: dict[str, str] | None = None
    dispatchingWindow: dict[str, Any] | None = None


class AppWrapperSpec(_Model):
    priority: Int = 0
    priorityClassName: str | None = None
    """A scheduling.k8s.io/v1 PriorityClass whose value replaces `priority`."""
    suspend: bool = Field(default=False, strict=True)
    """True: not dispatched, and stopped if it was, until set false (v1beta2's field)."""
    preemptible: bool = Field(default=True, strict=True)
    """False: never evicted to make room for a higher-priority AppWrapper."""
    resources: AppWrapperResources = Field(default_factory=AppWrapperResources)
    schedulingSpec: SchedulingSpec = Field(default_factory=SchedulingSpec)
    # MCAD legacy, ignored
    priorityslope: float | None = None
    service: dict[str, Any] | None = None
    selector: dict[str, Any] | None = None

    @property
    def items(self) -> list[GenericItem]:
        """The wrapped objects (`resources.GenericItems`)."""
        return self.resources.generic_items


# ---------------------------------------------------------------------------------------------
# status


class Condition(_Model):
    """One entry per type. `type` is a str so that conditions other controllers wrote (MCAD's
    PreemptCandidate, ...) still parse; compare it with `ConditionType` members."""

    type: str
    status: ConditionStatus
    reason: str = ""
    message: str = ""
    lastTransitionMicroTime: str | None = None
    """RFC 3339 with microseconds, e.g. 2024-05-01T12:00:00.000000Z (see format_micro_time)."""
    lastUpdateMicroTime: str | None = None


class WrappedRef(_Model):
    """One wrapped object the dispatcher created, in the AppWrapper's namespace."""

    model_config = ConfigDict(frozen=True)

    apiVersion: str
    kind: str
    name: str
    digest: str | None = None
    """Fingerprint of the item's content at dispatch (`GenericItem.digest`); absent in
    records written before it existed, which are then compared by identity only."""

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name}"

    @property
    def identity(self) -> tuple[str, str, str]:
        return (self.apiVersion, self.kind, self.name)


class FlavorAssignment(_Model):
    """The flavor chosen for one resource group, and the group's resources."""

    name: str
    resources: list[str] = Field(default_factory=list)


class Admission(_Model):
    """Where the quota of the latest dispatch is accounted."""

    queue: str
    """The AppQueue it was submitted through ("namespace/name")."""
    clusterQueue: str
    flavors: list[FlavorAssignment] = Field(default_factory=list)
    borrowing: bool = False
    """Whether it borrowed from its cohort when it was admitted."""


class AppWrapperStatus(_Model):
    state: AppWrapperState | None = None
    stage: str | None = None
    """The latest milestone reached in the current attempt (a ConditionType value), e.g.
    Queueing, Dispatched, Running; shown by `kubectl get`."""
    conditions: list[Condition] = Field(default_factory=list)
    clusterName: str | None = None
    """The member cluster the AppWrapper is dispatched to."""
    pending: NonNegativeInt = 0
    running: NonNegativeInt = 0
    succeeded: NonNegativeInt = 0
    failed: NonNegativeInt = 0
    requeueCount: NonNegativeInt = 0
    """Times the AppWrapper was requeued after dispatch (MCAD's numberOfRequeueings)."""
    queuedAt: str | None = None
    """When the dispatcher first saw the AppWrapper (RFC 3339)."""
    dispatchedAt: str | None = None
    """First dispatch (RFC 3339); kept across requeues."""
    lastDispatchedAt: str | None = None
    objectsMadeFor: str | None = None
    """The `lastDispatchedAt` of the attempt whose objects were all made (created or adopted):
    equal to it once this attempt's are, so nothing needs clearing. The v1beta2 phase is
    Running from then on (Resuming before), as the AppWrapper controller's."""
    preemptedBy: str | None = None
    """"namespace/name" of the AppWrapper whose preemption evicted this one (the victim's own
    record of who its room is for); cleared when it is dispatched again."""
    dispatchedObjects: list[WrappedRef] | None = None
    """The wrapped objects of the latest dispatch, recorded with it: only these are created,
    and these are what cleanup deletes, whatever the spec says later (None: dispatched
    before the record existed, by MCAD; the spec is used)."""
    admission: Admission | None = None
    """With quotas: the queue, flavors and borrowing of the latest dispatch (kept when it is
    requeued: its quota stays charged while that dispatch's pods are still going)."""
    message: str | None = None
    priority: Int | None = None
    """Effective priority (from priorityClassName when set)."""
    observedGeneration: Int | None = None
    # MCAD's names for facts held above, for tools written against MCAD: written from those
    # facts on every status write (`mcad_fields`), never read back.
    canrun: bool | None = None
    isdispatched: bool | None = None
    queuejobstate: str | None = None
    controllerfirsttimestamp: str | None = None
    numberOfRequeueings: Int | None = None
    systempriority: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _derived_not_read(cls, value: object) -> object:
        # MCAD's fields are derived at each write: what a status holds is ours, never a copy
        # read back (an MCAD-written one may disagree with it).
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if k not in MCAD_STATUS_FIELDS}
        return value

    @field_validator("state", mode="before")
    @classmethod
    def _known_state(cls, value: object) -> object:
        # Status written by MCAD may hold "" or a state of its own; the dispatcher re-derives the
        # state, so an unknown one reads as "not set" rather than making the object unreadable.
        if isinstance(value, str) and value not in set(AppWrapperState):
            return None
        return value

    def editable_copy(self) -> AppWrapperStatus:
        """A copy to change and write (its conditions copied too): a deep copy of the whole
        model was a fifth of a reconcile's time."""
        return self.model_copy(update={"conditions": [c.model_copy() for c in self.conditions]})

    def condition(self, type_: ConditionType | str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def is_true(self, type_: ConditionType | str) -> bool:
        found = self.condition(type_)
        return found is not None and found.status == "True"


# ---------------------------------------------------------------------------------------------
# the object


class ObjectMeta(_Model):
    """The parts of metadata the dispatcher reads; everything else is kept (`model_extra`)."""

    model_config = ConfigDict(extra="allow")

    name: str = ""
    namespace: str = ""
    uid: str | None = None
    resourceVersion: str | None = None
    generation: Int | None = None
    creationTimestamp: str | None = None
    deletionTimestamp: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)


def _name_generated(items: list[GenericItem], seed: str) -> None:
    """Give every item whose template has a `generateName` and no name its generated name.
    The template's metadata is replaced, not edited: the parsed object may share it with a
    watch cache, which is never mutated."""
    for index, item in enumerate(items):
        metadata = item.generictemplate.get("metadata")
        if not isinstance(metadata, dict):
            continue
        name = generated_for(metadata, seed, index)
        if name is not None:
            named = {**metadata, "name": name}
            item.generictemplate = {**item.generictemplate, "metadata": named}


class AppWrapper(_Model):
    apiVersion: Literal["workload.codeflare.dev/v1beta1"] = API_VERSION
    kind: Literal["AppWrapper"] = KIND
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: AppWrapperSpec = Field(default_factory=AppWrapperSpec)
    status: AppWrapperStatus | None = None

    @model_validator(mode="after")
    def _generated_names(self) -> AppWrapper:
        # Named once, here, so that building, creating, adopting, deleting, completion and
        # pod sets all read the same name off the template. Seeded by the uid (the name
        # where there is none yet: an object not stored).
        meta = self.metadata
        _name_generated(self.spec.items, meta.uid or f"{meta.namespace}/{meta.name}")
        return self

    @classmethod
    def from_kube(cls, obj: dict[str, Any]) -> AppWrapper:
        """Build from a Kubernetes object (a dict as the API server returns it).
        Raises pydantic.ValidationError with the path of each bad field."""
        return cls.model_validate(obj)

    def to_kube(self) -> dict[str, Any]:
        """The object as Kubernetes expects it (wire names, unset fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    @property
    def key(self) -> str:
        """The work-queue key, "namespace/name"."""
        return f"{self.metadata.namespace}/{self.metadata.name}"


def status_to_kube(status: AppWrapperStatus) -> dict[str, Any]:
    """The status as a JSON-ready dict for a status write (wire names, None left out), with
    MCAD's fields derived afresh."""
    body = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    body.update(mcad_fields(status))
    return body


MCAD_STATUS_FIELDS = frozenset(
    {
        "canrun",
        "isdispatched",
        "queuejobstate",
        "controllerfirsttimestamp",
        "numberOfRequeueings",
        "systempriority",
    }
)


def mcad_fields(status: AppWrapperStatus) -> dict[str, Any]:
    """MCAD's status fields, from this dispatcher's: dispatched (`canrun`, `isdispatched`),
    the latest milestone (`queuejobstate`), first seen, requeues and priority."""
    dispatched = status.is_true(ConditionType.DISPATCHED)
    fields: dict[str, Any] = {
        "canrun": dispatched,
        "isdispatched": dispatched,
        "numberOfRequeueings": status.requeueCount,
    }
    if status.state is AppWrapperState.RUNNING_HOLD_COMPLETION:
        fields["queuejobstate"] = status.state.value
    elif status.stage:
        fields["queuejobstate"] = status.stage
    if status.queuedAt:
        fields["controllerfirsttimestamp"] = status.queuedAt
    if status.priority is not None:
        fields["systempriority"] = float(status.priority)
    return fields


def format_micro_time(moment: datetime) -> str:
    """RFC 3339 in UTC with microseconds, as Kubernetes writes MicroTime.
    A naive datetime is taken to be UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (with or without fractional seconds) to an aware datetime."""
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
