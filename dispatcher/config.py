"""Dispatcher settings: a YAML file and/or command-line flags. Pure values, no I/O but
`load_config`, which reads the file it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dispatcher import settingsfile
from dispatcher.core.admissionchecks import BEST_EFFORT_ATOMIC, KNOWN_CLASSES
from dispatcher.core.faulttolerance import FaultToleranceBounds
from dispatcher.core.gatekeeping import PriorityPolicy
from dispatcher.core.model import Backfill, QueueMode, Taint
from dispatcher.core.nodehealth import (
    DEFAULT_PREFER_WEIGHT,
    DEFAULT_RESOURCE_TAINTS,
    NodeHealth,
    label_problem,
)
from dispatcher.core.quota.kueue import KueueQuotas
from dispatcher.core.quota.model import FairSharingMode
from dispatcher.core.validation import DEFAULT_ALLOWED_KINDS, DEFAULT_MAX_APPWRAPPER_BYTES


class Fit(StrEnum):
    """When an AppWrapper's pods count as fitting a member cluster."""

    PER_NODE = "per_node"
    """Every pod has a node with room for it (the default)."""
    CLUSTER_TOTAL = "cluster_total"
    """MCAD's accounting: the cluster's free resources add up to the request."""


class DeclaredPodResources(StrEnum):
    """How an item's `custompodresources` is read."""

    AS_WRITTEN = "as_written"
    """MCAD's reading: the declaration is the reservation, whatever the pod templates ask."""
    AT_LEAST_TEMPLATES = "at_least_templates"
    """For a kind whose pods are read, never less than the templates ask in total."""


class MemberConfig(BaseModel):
    """A member cluster that AppWrappers may be dispatched to."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """A DNS label: what status.clusterName and clusterScheduling.clusters[].name name."""
    kubeconfig: str | None = None
    """Path of its kubeconfig; with neither this nor kubeconfig_secret, the member is the
    hub itself (its own connection)."""
    kubeconfig_secret: str | None = Field(default=None, pattern=r"^[a-z0-9-.]+/[a-z0-9-.]+$")
    """"namespace/name" of a Secret in the hub whose `kubeconfig` key holds the kubeconfig."""
    context: str | None = None
    """Kubeconfig context of the member; unset: the kubeconfig's current context."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Matched by an AppWrapper's schedulingSpec.clusterScheduling.clusterSelector."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """Count only nodes with these labels (a node pool reserved for dispatched work)."""
    namespaces: dict[str, str] = Field(default_factory=dict)
    """Hub namespace -> namespace in this member where its AppWrappers' objects go. An
    AppWrapper whose namespace is not listed never goes to this member; the key "*" maps
    every namespace to the one of the same name (or to the one it names), within
    `wildcard_allowed` and outside `wildcard_reserved`: the dispatcher refuses to start with
    a "*" key and neither. Not read for the hub itself."""
    wildcard_allowed: list[str] = Field(default_factory=list)
    """Hub namespaces a "*" key of `namespaces` may take: names or glob patterns
    (`team-*`); empty: any not reserved. kube-system, kube-public and kube-node-lease are
    never taken by "*"; an entry naming a namespace itself is not checked."""
    wildcard_reserved: list[str] = Field(default_factory=list)
    """Hub namespaces a "*" key never takes: names or glob patterns (`istio-*`)."""
    create_namespaces: bool = False
    """Create a mapped namespace in this member when it is missing there (with
    `namespace_labels`); otherwise it must exist."""
    namespace_labels: dict[str, str] = Field(
        default_factory=lambda: {"pod-security.kubernetes.io/enforce": "restricted"}
    )
    """Labels of the namespaces this member gets created (Pod Security level, team...)."""


class VisibilityConfig(BaseModel):
    """The pending list and web view (docs/operations.md#see-the-queue): an aggregated API
    the API server proxies to every replica; the leader answers, standbys say who leads."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Serve the visibility API on every replica (also the flag --visibility)."""
    host: str = "0.0.0.0"
    """Address it listens on."""
    port: int = Field(default=8444, ge=0, le=65535)
    """0: any free port (tests)."""
    service_name: str = "appwrapper-dispatcher-visibility"
    """The Service in front of it, in `namespace`."""
    namespace: str = "appwrapper-system"
    """The Service the APIService names: the serving certificate names service.namespace.svc."""
    extra_names: list[str] = Field(default_factory=list)
    """More DNS names or IP addresses for the serving certificate."""
    cert_dir: str | None = None
    """tls.crt and tls.key made by someone else; unset: a certificate made at start."""
    requestheader_client_ca_file: str | None = None
    """The front proxy's CA (PEM). Unset: read from ConfigMap
    kube-system/extension-apiserver-authentication, as every aggregated API server does."""
    requestheader_allowed_names: list[str] | None = None
    """Accepted names of the front proxy's client certificate (empty: any the CA signed).
    Unset: from the same ConfigMap."""
    review_qps: float = Field(default=20.0, gt=0)
    """SubjectAccessReviews this API may ask per second (below)."""
    review_burst: int = Field(default=50, ge=1)
    """SubjectAccessReviews this API may ask (per second; at once): on a connection of its
    own, apart from the controller's. Answers are kept `access_review_cache_seconds`; a
    request that needs more reviews than the budget has left is answered 429."""


class MetricsConfig(BaseModel):
    """/metrics, served on `health_port` (docs/operations.md#metrics)."""

    model_config = ConfigDict(extra="forbid")

    refresh_seconds: float = Field(default=5.0, gt=0)
    """How often the leader recomputes the gauges over pending work (pending_workloads,
    local_queue_pending_workloads); a scrape reads the last figures and computes nothing."""
    auth: Literal["none", "kubernetes"] = "none"
    """Who may scrape. `none`: anyone who reaches the port. `kubernetes`: only a caller whose
    bearer token the API server accepts (TokenReview) and who may `get` the non-resource
    URL /metrics (SubjectAccessReview); 401 without a valid token, 403 without the right.
    /healthz and /readyz stay open (the kubelet's probes carry no token). Answers are kept
    `access_review_cache_seconds`."""
    review_qps: float = Field(default=5.0, gt=0)
    """TokenReviews and SubjectAccessReviews /metrics may ask per second (below)."""
    review_burst: int = Field(default=20, ge=1)
    """TokenReviews and SubjectAccessReviews /metrics may ask (per second; at once), on a
    connection of its own: a scrape beyond the budget is answered 429, so a flood of
    made-up tokens costs the API server at most this many reviews."""
    cert_file: str | None = None
    """A PEM certificate for the health port, with `key_file` (below)."""
    key_file: str | None = None
    """A PEM certificate and key: the health port (/healthz, /readyz, /metrics) then serves
    HTTPS only, and the probes must say `scheme: HTTPS`. Read at start (a renewed
    certificate counts from the next restart). Unset: plain HTTP."""

    @model_validator(mode="after")
    def _pair(self) -> MetricsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("metrics.cert_file and metrics.key_file go together")
        return self


class WebhookConfig(BaseModel):
    """The admission webhook every replica serves (HTTPS)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Serve the admission webhook on every replica, leader and standby alike."""
    host: str = "0.0.0.0"
    """Address it listens on."""
    port: int = Field(default=9443, ge=0, le=65535)
    """0: any free port (tests)."""
    namespace: str = "appwrapper-system"
    """Where its Secret lives (the dispatcher's own namespace)."""
    secret_name: str = "appwrapper-dispatcher-webhook"
    """Holds the CA, the serving certificate and the key that signs creator records."""
    service_name: str = "appwrapper-dispatcher-webhook"
    """The Service in front of it: the certificate names service.namespace.svc."""
    extra_names: list[str] = Field(default_factory=list)
    """More DNS names or IP addresses for the certificate (e.g. 127.0.0.1 out of cluster)."""
    cert_dir: str | None = None
    """A directory holding tls.crt and tls.key made by someone else (cert-manager); the
    dispatcher then reloads them when they change and neither makes nor rotates them."""
    mutating_configuration: str = "appwrapper-dispatcher"
    """The MutatingWebhookConfiguration whose caBundle the dispatcher keeps up to date."""
    validating_configuration: str = "appwrapper-dispatcher"
    """The ValidatingWebhookConfiguration whose caBundle the dispatcher keeps up to date."""
    conversion_crd: str | None = "appwrappers.workload.codeflare.dev"
    """The CRD whose conversion webhook (/convert) is this server, and whose caBundle the
    dispatcher keeps up to date too (only where its conversion strategy is Webhook);
    None: not kept (cert-manager's CA injector does it)."""
    cert_validity_seconds: float = Field(default=90 * 86400, gt=0)
    """Validity of each serving certificate (90 days)."""
    ca_validity_seconds: float = Field(default=3650 * 86400, gt=0)
    """Validity of each CA (10 years)."""
    rotate_when_left: float = Field(default=1 / 3, gt=0, lt=1)
    """Renew a certificate when this fraction of its validity is left."""
    client_ca_file: str | None = None
    """PEM bundle of the CA(s) that sign the client certificate the API server presents to
    webhooks (its AdmissionConfiguration's kubeconfigFile). Set: an admission request from a
    caller without a certificate from these CAs, naming one of `client_names`, is refused
    (403; a certificate from another CA fails the TLS handshake). Re-read when it changes.
    Unset: anyone who reaches the port is answered (a warning says so at start)."""
    client_names: list[str] = Field(
        default_factory=lambda: ["kube-apiserver-webhook-client"], min_length=1
    )
    """Accepted common names / DNS names of that client certificate."""
    qps: float = Field(default=50.0, ge=0)
    """Requests per second of the webhook's own API clients (below)."""
    burst: int = Field(default=100, ge=0)
    """The webhook's own API clients (discovery, SubjectAccessReviews, PriorityClasses, its
    Secret): a rate limiter apart from the controller's and the Lease's."""
    max_in_flight: int = Field(default=32, ge=1, le=1024)
    """Admission requests handled at once; more wait (`queue_seconds`), then are refused."""
    queue_seconds: float = Field(default=2.0, ge=0)
    """How long a request beyond `max_in_flight` waits for its turn before it is refused
    (with a message saying so; the API server's own webhook timeout is 10 s)."""
    conversion_max_in_flight: int = Field(default=16, ge=1, le=1024)
    """Conversion requests (the AppWrapper CRD's v1beta1/v1beta2 webhook) handled at once,
    with turns of their own: a flood of conversions never takes an admission request's turn,
    nor the reverse."""
    read_seconds: float = Field(default=5.0, gt=0)
    """How long reading one request's body may take, before any turn is taken; a slower
    sender is answered 408 and never held a turn."""
    max_api_versions: int = Field(default=8, ge=1, le=100)
    """Distinct apiVersions (API group/versions) one AppWrapper's items may name; more is
    refused at apply with the limit named (each one may cost a discovery request)."""
    kind_groups: dict[str, list[str]] = Field(default_factory=dict)
    """Kind -> the API groups it may come from ("" is the core group), on top of the built-in
    table (Pod: core, Deployment: apps, RayCluster: ray.io, ...). An item of such a kind from
    another group is refused at apply without any discovery request. A kind in neither may
    come from any group, as before."""
    unserved_cache_seconds: float = Field(default=10.0, ge=0)
    """How long "no cluster serves this apiVersion and kind" is believed by the webhook."""
    previous_signing_keys: int = Field(default=8, ge=1, le=64)
    """How many retired record-signing keys are kept to verify records signed before a key
    changed (the Secret recreated, or its `signing.key` removed to rotate it)."""
    previous_signing_key_seconds: float = Field(default=90 * 86400, gt=0)
    """How long a retired signing key keeps verifying: an AppWrapper signed with it and not
    updated since ends Forbidden at its next dispatch after that."""


class FaultToleranceConfig(BaseModel):
    """Ceilings on what the AppWrapper controller's fault-tolerance annotations may ask
    (docs/appwrapper-compatibility.md): a value above one is cut to it."""

    model_config = ConfigDict(extra="forbid")

    grace_period_maximum_seconds: float = Field(default=24 * 3600.0, gt=0)
    """Every *GracePeriodDuration and retryPausePeriodDuration (its GracePeriodMaximum)."""
    success_ttl_maximum_seconds: float = Field(default=7 * 24 * 3600.0, gt=0)
    """successTTLDuration."""
    retry_limit_maximum: int = Field(default=100, ge=1)
    """retryLimit."""

    def bounds(self) -> FaultToleranceBounds:
        return FaultToleranceBounds(
            grace_period_maximum_seconds=self.grace_period_maximum_seconds,
            success_ttl_maximum_seconds=self.success_ttl_maximum_seconds,
            retry_limit_maximum=self.retry_limit_maximum,
        )


class HealthLabel(BaseModel):
    """A node label that takes a resource out of service, written like a taint."""

    model_config = ConfigDict(extra="forbid")

    key: str
    """The label's key (autopilot.ibm.com/gpuhealth)."""
    value: str = ""
    """The label's value that takes the resource out of service."""
    effect: Literal["PreferNoSchedule", "NoSchedule", "NoExecute"]
    """What the label does to new pods and running gangs, read as a taint's effect."""

    @model_validator(mode="after")
    def _label(self) -> HealthLabel:
        problem = label_problem(self.key, self.value)
        if problem:
            raise ValueError(problem)
        return self


def _default_resource_taints() -> dict[str, list[HealthLabel]]:
    return {
        resource: [
            HealthLabel.model_validate({"key": t.key, "value": t.value, "effect": t.effect})
            for t in taints
        ]
        for resource, taints in DEFAULT_RESOURCE_TAINTS
    }


class NodeHealthConfig(BaseModel):
    """Node health by labels (docs/node-health.md), the AppWrapper controller's `autopilot`
    settings with its defaults (IBM Autopilot's `autopilot.ibm.com/gpuhealth`). Both
    switches off, or no `resource_taints`, turns it off."""

    model_config = ConfigDict(extra="forbid")

    monitor_nodes: bool = True
    """A node labelled NoSchedule or NoExecute for a resource offers none of it to new
    gangs; a dispatched AppWrapper with pods asking for it on a NoExecute node is moved
    (reset after its failure grace, or requeued)."""
    inject_anti_affinities: bool = True
    """Pod templates asking for a covered resource get node-affinity terms keeping them off
    nodes labelled against it (required for NoSchedule and NoExecute, preferred for
    PreferNoSchedule), added to the user's own."""
    resource_taints: dict[str, list[HealthLabel]] = Field(default_factory=_default_resource_taints)
    """Resource name -> the labels that take it out of service on a node."""
    prefer_no_schedule_weight: int = Field(default=DEFAULT_PREFER_WEIGHT, ge=1, le=100)
    """The weight of the preferred term for PreferNoSchedule labels."""

    def rules(self) -> NodeHealth:
        return NodeHealth(
            resource_taints=tuple(
                (resource, tuple(Taint(t.key, t.value, t.effect) for t in labels))
                for resource, labels in self.resource_taints.items()
            ),
            monitor_nodes=self.monitor_nodes,
            inject_anti_affinities=self.inject_anti_affinities,
            prefer_weight=self.prefer_no_schedule_weight,
        )


class ProvisioningCheckConfig(BaseModel):
    """One ProvisioningRequest admission check (Kueue's ProvisioningRequestConfig)."""

    model_config = ConfigDict(extra="forbid")

    provisioning_class: str = BEST_EFFORT_ATOMIC
    """The ProvisioningRequest class (one of `known_classes`)."""
    parameters: dict[str, str] = Field(default_factory=dict)
    """`spec.parameters` of every request (e.g. ValidUntilSeconds for check-capacity)."""
    retry_limit: int = Field(default=3, ge=0, le=100)
    """Attempts after the first refused one; then the AppWrapper fails, its quota released."""
    backoff_base_seconds: float = Field(default=60.0, ge=0)
    """Pause after the first refusal; it doubles with each attempt, up to the maximum."""
    backoff_max_seconds: float = Field(default=1800.0, ge=0)
    """The longest pause between attempts."""


class ProvisioningConfig(BaseModel):
    """Admission checks that create ProvisioningRequests (docs/autoscaling.md). Off by
    default: without a provisioner (cluster autoscaler) nobody would answer them."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Run the checks below; off, a check a queue names is reported as off, not run."""
    checks: dict[str, ProvisioningCheckConfig] = Field(default_factory=dict)
    """Check name (what a ClusterAppQueue's `admissionChecks` names) -> its settings."""
    capacity_only_checks: list[str] = Field(default_factory=list)
    """Checks run for AppWrappers without a queue (capacity-only work) that fit no node."""
    known_classes: list[str] = Field(default_factory=lambda: list(KNOWN_CLASSES))
    """Classes a provisioner serves here; a check naming another is misconfigured."""
    poll_seconds: float = Field(default=5.0, gt=0)
    """How often a held AppWrapper's checks are looked at again besides the watch of
    requests, which wakes it on every change."""
    fit_timeout_seconds: float = Field(default=30.0, gt=0)
    """Seconds an AppWrapper whose checks all passed may wait to be placed; then it gives
    its booking up and asks again (other work took the nodes made for it)."""


class ProtectionConfig(BaseModel):
    """What protects dispatched work from preemption where no queue says (a ClusterAppQueue's
    `spec.preemption.minimumRuntimeSeconds` and `noticeSeconds` say it for its own)."""

    model_config = ConfigDict(extra="forbid")

    minimum_runtime_seconds: float = Field(default=0.0, ge=0, le=7 * 24 * 3600)
    """Seconds an AppWrapper runs before it may be preempted, where it asks none."""
    max_minimum_runtime_seconds: float = Field(default=3600.0, ge=0, le=7 * 24 * 3600)
    """The most an AppWrapper may ask (`workload.codeflare.dev/minimum-runtime`) where its
    queue sets no minimum runtime of its own."""
    notice_seconds: float = Field(default=0.0, ge=0, le=3600)
    """Seconds a victim is told (condition and Event, with the deadline) before its objects
    are removed."""


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kubeconfig: str | None = None
    """The hub (where AppWrappers live). None: $KUBECONFIG, else the pod's service account."""
    context: str | None = None
    """Kubeconfig context of the hub; unset: the kubeconfig's current context."""
    members: list[MemberConfig] = Field(default_factory=list)
    """Empty: single-cluster mode, the hub is the only member (named `local`)."""
    queue_mode: QueueMode = QueueMode.BEST_EFFORT_FIFO
    """StrictFIFO: the head of the queue blocks everything behind it. BestEffortFIFO: others
    may pass a head that does not fit. With quotas, only for AppWrappers that name no queue."""
    starvation_after_seconds: float = Field(default=300.0, ge=0)
    """BestEffortFIFO: a head waiting this long keeps others from taking what it needs."""
    preemption: bool = True
    """A higher-priority AppWrapper that does not fit may evict strictly lower-priority
    dispatched ones (and, with quotas, what its queue's preemption policies allow)."""
    backfill: Backfill = Backfill.DECLARED
    """Declared: a head that fits nowhere reserves the nodes it will fit on once the running
    work's declared limits end it, and later work may use them only if its own limit ends it
    first. Never: no reservations. With quotas, only for AppWrappers that name no queue (a
    ClusterAppQueue has `spec.backfill`)."""
    protection: ProtectionConfig = Field(default_factory=lambda: ProtectionConfig())
    """Preemption that respects a minimum runtime and gives notice (docs/scheduling.md)."""
    requeue_pause_seconds: float = Field(default=5.0, ge=0)
    """Backoff after a requeue when the AppWrapper sets no requeuing.pauseTimeInSeconds."""
    fault_tolerance: FaultToleranceConfig = Field(default_factory=lambda: FaultToleranceConfig())
    """Bounds on the v1beta2 fault-tolerance annotations."""
    node_health: NodeHealthConfig = Field(default_factory=lambda: NodeHealthConfig())
    """Nodes labelled unhealthy for a resource (docs/node-health.md)."""
    allowed_kinds: list[str] = Field(default_factory=lambda: sorted(DEFAULT_ALLOWED_KINDS))
    """Kinds an AppWrapper may wrap; anything else ends Failed (InvalidSpec)."""
    fit: Fit = Fit.PER_NODE
    """per_node, or cluster_total as MCAD (pods may then wait Pending for a node)."""
    declared_pod_resources: DeclaredPodResources = DeclaredPodResources.AS_WRITTEN
    """How `custompodresources` is read: as written (MCAD), or never below the pod templates."""
    max_appwrapper_bytes: int = Field(
        default=DEFAULT_MAX_APPWRAPPER_BYTES, ge=64 * 1024, le=3 * 1024 * 1024
    )
    """The largest AppWrapper accepted, as JSON (all fields; not managedFields nor kubectl's
    last-applied copy): refused at apply by the webhook; one stored anyway (no webhook) is
    held as a stub and ends Failed. The default fits real RayClusters and PyTorchJobs
    twenty times over (core/validation.py)."""
    fair_sharing: bool = False
    """With quotas: queues that borrow less of their cohort (by weight) are served first."""
    fair_sharing_preemption: bool = True
    """With fair sharing: a queue below its fair share may reclaim from one above it."""
    fair_sharing_mode: FairSharingMode = FairSharingMode.INSTANT
    """With fair sharing, what queues are compared by: `Instant`, what each borrows of its
    cohort now; `Usage`, what each used over time (decayed with the half-life below, kept in
    its status) plus what it holds now, and within a BestEffortFIFO queue its users the same
    way (docs/quotas.md, "Fair over time")."""
    fair_sharing_half_life_seconds: float = Field(default=7 * 86400.0, ge=60, le=366 * 86400.0)
    """`Usage` mode: after this long, what a queue (or user) used counts half."""
    usage_sample_seconds: float = Field(default=300.0, ge=1, le=86400.0)
    """The longest time between two samples of what queues hold, for `Usage` fair sharing
    and budgets (each written into the queue's status); any change of what a queue holds is
    sampled sooner."""
    queue_required: bool = False
    """With quotas: an AppWrapper that names no queue (and whose namespace has no `default`
    AppQueue) waits, instead of being admitted on capacity alone."""
    kueue_quotas: KueueQuotas = KueueQuotas.OFF
    """Read Kueue's own quota objects (kueue.x-k8s.io ClusterQueue, LocalQueue, Cohort,
    ResourceFlavor, WorkloadPriorityClass): `beside` ours, `instead` of ours, or not (`off`).
    Only where their CRDs are installed, and never while Kueue itself runs."""
    kueue_namespace: str = "kueue-system"
    """Where Kueue's leader Lease would be (one of the signs that Kueue itself runs)."""
    allow_exec_kubeconfigs: bool = False
    """Accept a member kubeconfig read from a Secret (`kubeconfig_secret`) whose user runs a
    credential plugin (`exec`, `auth-provider`): whoever may write the Secret would choose a
    program the dispatcher runs. Kubeconfig files, written by the operator, are not checked."""
    member_timeout_seconds: float = Field(default=60.0, gt=0)
    """A member silent this long has its AppWrappers requeued elsewhere."""
    qps: float = Field(default=200.0, ge=0)
    """The controller's requests per second to each API server (0: no limit)."""
    burst: int = Field(default=400, ge=0)
    """Requests allowed above `qps` in a burst."""
    workers: int = Field(default=64, ge=1, le=256)
    """Concurrent reconciles (each key is handled by one worker at a time). Each waits out its
    requests: a backlog found at start without the finalizer (no webhook set it) is taken in
    at about workers / round trip a second."""
    dispatch_concurrency: int = Field(default=64, ge=1, le=1024)
    """Dispatches (status write + object creates) in flight at once."""
    health_port: int = Field(default=8081, ge=0, le=65535)
    """/healthz, /readyz and /metrics (0: not served)."""
    debug_memory: bool = False
    """Serve /debug/memory (where the live memory was allocated: file names and sizes)."""
    unattributed: Literal["refuse", "allow"] = "refuse"
    """An AppWrapper without a creator record signed by the admission webhook (created while
    the webhook was absent, or with a forged record): `refuse` ends it Failed; `allow`
    dispatches it on the dispatcher's own rights, as before the webhook existed."""
    check_at_dispatch: bool = True
    """Before creating an AppWrapper's objects, ask the API server again whether its
    recorded creator may create each of them (SubjectAccessReview, answers cached briefly)."""
    access_review_cache_seconds: float = Field(default=10.0, ge=0)
    """How long the API server's answer to "may this user create X here" is reused (fewer
    requests in a burst; a right taken away counts after at most this long)."""
    webhook: WebhookConfig = Field(default_factory=lambda: WebhookConfig())
    visibility: VisibilityConfig = Field(default_factory=lambda: VisibilityConfig())
    metrics: MetricsConfig = Field(default_factory=lambda: MetricsConfig())
    priority_policy: PriorityPolicy = Field(default_factory=lambda: PriorityPolicy())
    provisioning: ProvisioningConfig = Field(default_factory=lambda: ProvisioningConfig())
    leader_election: bool = False
    """Only the holder of the Lease dispatches; needed for more than one replica."""
    lease_namespace: str = "default"
    """Namespace of the Lease."""
    lease_name: str = "appwrapper-dispatcher"
    """Name of the Lease."""
    lease_duration_seconds: float = Field(default=15.0, gt=0, le=3600)
    """How long a follower waits, after it last saw the Lease change, before taking over."""
    lease_renew_deadline_seconds: float = Field(default=10.0, gt=0)
    """A leader that has not renewed for this long stops writing and exits."""
    lease_retry_period_seconds: float = Field(default=2.0, gt=0)
    """Between renewals (leader) and between attempts to take the Lease (follower)."""
    member_sync_timeout_seconds: float = Field(default=10.0, ge=0)
    """At start, how long dispatching waits for a member's caches; later ones join when
    they sync."""
    log_format: Literal["console", "json"] = "console"
    """console: key=value lines; json: one JSON object per line."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe level logged."""

    @model_validator(mode="after")
    def _lease_timings(self) -> Config:
        # The renew deadline must end before the lease does, or a follower could take over
        # while the old leader still writes; retries must fit within the deadline.
        if not (
            self.lease_retry_period_seconds
            < self.lease_renew_deadline_seconds
            < self.lease_duration_seconds
        ):
            raise ValueError(
                "lease timings: need lease_retry_period_seconds < lease_renew_deadline_seconds"
                " < lease_duration_seconds"
            )
        return self


def load_config(path: Path | None, overrides: dict[str, Any]) -> Config:
    """Settings from `path` (YAML), then `overrides` (flags) on top. SettingsError (a
    ValueError) names the file, the line and the field of every mistake, or the flag."""
    data: dict[str, Any] = {}
    node = None
    if path is not None:
        loaded, node = settingsfile.read(path)
        data.update(loaded)
    flags = {k: v for k, v in overrides.items() if v is not None}
    return validated({**data, **flags}, name=path, node=node, flags=flags)


def validated(
    data: dict[str, Any], *, name: Path | str | None, node: Any, flags: Iterable[str] = ()
) -> Config:
    """`data` as settings; SettingsError naming the file (`name`), the line (from `node`, the
    file's YAML nodes) and the field of every mistake, or the flag."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise settingsfile.SettingsError(settingsfile.problems(name, node, exc, flags)) from None
