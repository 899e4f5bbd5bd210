"""What pods a wrapped object will make, and labelling the pods it makes. Pure, no I/O.

Works on raw template dicts (the `generictemplate` of an AppWrapper item, a complete
Kubernetes object). `infer_pod_sets` turns a template into `PodSet`s the fit check reads;
`pod_sets_from_custom` does the same for MCAD's explicit `custompodresources`;
`inject_labels` returns a copy of a template whose object and pod templates carry the
AppWrapper's labels (so the pods can be found, counted and adopted).

Every inference error is a `QuantityError` (a `ValueError`) whose message names the object
(kind/name) and the container or field at fault, ready to show the user.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from dispatcher.api.quantity import QuantityError
from dispatcher.api.resources import EMPTY, Resources
from dispatcher.core.model import ONE_POD, PODS, PodSet, Toleration
from dispatcher.core.quota.flavors import applies
from dispatcher.core.quota.model import Flavor

__all__ = [
    "MAX_PODS",
    "cannot_infer",
    "infer_pod_sets",
    "inject_labels",
    "pod_requests",
    "pod_sets_from_custom",
]

MAX_PODS = 100_000
"""Most pods one AppWrapper may make. Far more than a real gang; it refuses the absurd
count (10^9 replicas of a pod that asks for nothing) before anything adds it up."""

_APPS_KINDS = frozenset({"Deployment", "StatefulSet", "ReplicaSet"})

# (API group, kind) of the objects whose pods `_infer` reads. A kind of the same name in
# another group (some CRD that happens to be called "Job") is not one of them.
_WORKLOAD_KINDS = frozenset(
    {
        ("", "Pod"),
        *(("apps", kind) for kind in _APPS_KINDS),
        ("batch", "Job"),
        ("ray.io", "RayCluster"),
        ("ray.io", "RayJob"),
        ("ray.io", "RayService"),
        ("kubeflow.org", "PyTorchJob"),
    }
)

# (API group, kind) of the objects known to make no pods of their own. Any kind in neither
# set must declare its pods (`custompodresources`, `[]` for none): counting an unknown kind
# as zero pods would let a RayService of 100 GPU workers, or any operator's CRD, jump the
# queue. Group-exact for the same reason: a Knative `Service` makes pods.
_PODLESS_KINDS = frozenset(
    {
        ("", "ConfigMap"),
        ("", "Endpoints"),
        ("", "LimitRange"),
        ("", "PersistentVolumeClaim"),
        ("", "ResourceQuota"),
        ("", "Secret"),
        ("", "Service"),
        ("", "ServiceAccount"),
        ("discovery.k8s.io", "EndpointSlice"),
        ("extensions", "Ingress"),
        ("extensions", "NetworkPolicy"),
        ("networking.k8s.io", "Ingress"),
        ("networking.k8s.io", "NetworkPolicy"),
        ("policy", "PodDisruptionBudget"),
        ("rbac.authorization.k8s.io", "Role"),
        ("rbac.authorization.k8s.io", "RoleBinding"),
        ("route.openshift.io", "Route"),
        ("scheduling.sigs.k8s.io", "PodGroup"),
        ("scheduling.volcano.sh", "PodGroup"),
        ("scheduling.x-k8s.io", "PodGroup"),
    }
)
_KNOWN_NAMES = frozenset(kind for _, kind in _WORKLOAD_KINDS | _PODLESS_KINDS)


def _group(template: Mapping[str, Any]) -> str | None:
    """The API group of the object ("" for the core group), None when apiVersion is absent."""
    api_version = template.get("apiVersion")
    if not isinstance(api_version, str) or not api_version:
        return None
    return api_version.rpartition("/")[0]


def _is(template: Mapping[str, Any], kind: str, group: str) -> bool:
    """True when the template is `kind` in `group` (an absent apiVersion matches any group)."""
    if template.get("kind") != kind:
        return False
    actual = _group(template)
    return actual is None or actual == group


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _name(template: Mapping[str, Any]) -> str:
    return f"{template.get('kind', '?')}/{_mapping(template.get('metadata')).get('name', '?')}"


def _count(value: Any, *, default: int, where: str, field_name: str) -> int:
    """A replica-like count: absent/null means `default`; anything but an int >= 0 is an error."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise QuantityError(f"{where}: {field_name} must be a non-negative integer, not {value!r}")
    return value


def _effective_requests(resources: Mapping[str, Any], *, label: str) -> Resources:
    """`requests`, each absent request falling back to the limit (as Kubernetes defaults it)."""
    try:
        limits = Resources.parse(_mapping(resources.get("limits")))
        requests = Resources.parse(_mapping(resources.get("requests")))
    except QuantityError as exc:
        raise QuantityError(f"{label}: {exc}") from None
    if not limits:
        return requests
    merged = dict(limits.items())
    merged.update(requests.items())
    # An explicit request of 0 is dropped by Resources, but it still overrides the limit.
    for name, value in _mapping(resources.get("requests")).items():
        if value is not None:
            merged[str(name)] = requests[str(name)]
    return Resources(merged)


def _container_requests(container: Mapping[str, Any], *, where: str) -> Resources:
    label = f"{where} container {container.get('name', '?')!r}"
    return _effective_requests(_mapping(container.get("resources")), label=label)


def _containers(spec: Mapping[str, Any], key: str, *, where: str) -> list[Mapping[str, Any]]:
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(c, Mapping) for c in value):
        raise QuantityError(f"{where}: spec.{key} must be a list of containers")
    return value


def pod_requests(spec: Mapping[str, Any], *, where: str) -> Resources:
    """What one pod with this spec asks the scheduler for.

    As Kubernetes computes it: the sum of the containers (and of restartable "sidecar" init
    containers, which keep running beside them), or, if larger per resource, what the init
    phase needs at its peak (each ordinary init container runs alone, beside the sidecars
    started before it); plus the pod `overhead` (set by a RuntimeClass); plus `pods: 1`,
    the pod's place among the node's allocatable `pods`. Both the pods the dispatcher
    expects (pod sets) and the live pods it counts (capacity cache) come from here, so the
    two always agree.
    """
    containers = _containers(spec, "containers", where=where)
    init_containers = _containers(spec, "initContainers", where=where)
    total = EMPTY
    for container in containers:
        total = total + _container_requests(container, where=where)
    sidecars = EMPTY
    init_peak = EMPTY
    for container in init_containers:
        requests = _container_requests(container, where=where)
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + requests
            init_peak = init_peak.max(sidecars)
        else:
            init_peak = init_peak.max(sidecars + requests)
    result = (total + sidecars).max(init_peak)
    try:
        overhead = Resources.parse(_mapping(spec.get("overhead")))
    except QuantityError as exc:
        raise QuantityError(f"{where} overhead: {exc}") from None
    return _one_pod(result + overhead)


def _one_pod(requests: Resources) -> Resources:
    """`requests` asking for exactly one pod (containers cannot request `pods`; a
    declaration that names it is overridden: a pod is one pod)."""
    if requests.get(PODS) == ONE_POD:
        return requests
    items = dict(requests.items())
    items[PODS] = ONE_POD
    return Resources(items)


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    raw = spec.get("tolerations")
    if not isinstance(raw, list):
        return ()
    return tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in raw
        if isinstance(t, Mapping)
    )


def _pod_set(pod_template: Any, *, count: int, name: str) -> PodSet | None:
    """`count` pods made from a pod template ({metadata, spec}); None when count is 0."""
    if count == 0:
        return None
    spec = _mapping(_mapping(pod_template).get("spec"))
    selector = _mapping(spec.get("nodeSelector"))
    return PodSet(
        count=count,
        requests=pod_requests(spec, where=name),
        node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
        tolerations=_tolerations(spec),
        name=name,
    )


def _ray_cluster_pod_sets(spec: Mapping[str, Any], *, name: str) -> Iterator[PodSet | None]:
    """Head: one pod. Each worker group: replicas (default minReplicas, default 1) x numOfHosts."""
    head = _mapping(spec.get("headGroupSpec"))
    if head:
        yield _pod_set(head.get("template"), count=1, name=f"{name} head")
    groups = spec.get("workerGroupSpecs")
    for index, group in enumerate(groups if isinstance(groups, list) else []):
        group = _mapping(group)
        group_name = group.get("groupName")
        label = f"{name} worker {group_name}" if group_name else f"{name} worker {index}"
        where = f"{label} (workerGroupSpecs[{index}])"
        min_replicas = _count(
            group.get("minReplicas"), default=1, where=where, field_name="minReplicas"
        )
        replicas = _count(
            group.get("replicas"), default=min_replicas, where=where, field_name="replicas"
        )
        hosts = _count(group.get("numOfHosts"), default=1, where=where, field_name="numOfHosts")
        yield _pod_set(group.get("template"), count=replicas * hosts, name=label)


SUBMITTER_MODES = frozenset({"K8sJobMode"})
"""RayJob submission modes in which KubeRay makes a submitter pod (a Job of one pod that runs
`ray job submit`). HTTPMode submits over HTTP from the operator, InteractiveMode waits for the
user, SidecarMode runs it in the head pod: none makes a pod of its own."""
SUBMITTER_DEFAULT_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
"""KubeRay's default submitter container's requests, where the RayJob names no
`submitterPodTemplate`."""


def _ray_job_submitter(spec: Mapping[str, Any], *, name: str) -> PodSet | None:
    mode = spec.get("submissionMode") or "K8sJobMode"
    if mode not in SUBMITTER_MODES:
        return None
    label = f"{name} submitter"
    template = spec.get("submitterPodTemplate")
    if isinstance(template, Mapping):
        return _pod_set(template, count=1, name=label)
    return PodSet(
        count=1,
        requests=_one_pod(Resources.parse(SUBMITTER_DEFAULT_REQUESTS)),
        name=label,
        tracked=False,
    )


def _infer(template: Mapping[str, Any]) -> Iterator[PodSet | None]:
    name = _name(template)
    spec = _mapping(template.get("spec"))
    kind = template.get("kind")
    if not isinstance(kind, str):
        return  # (a kind that is no string is validation's to report; it makes no pods)
    if _is(template, "Pod", ""):
        yield _pod_set(template, count=1, name=name)
    elif kind in _APPS_KINDS and _is(template, str(kind), "apps"):
        replicas = _count(spec.get("replicas"), default=1, where=name, field_name="spec.replicas")
        yield _pod_set(spec.get("template"), count=replicas, name=name)
    elif _is(template, "Job", "batch"):
        pods = _count(spec.get("parallelism"), default=1, where=name, field_name="spec.parallelism")
        completions = spec.get("completions")
        if completions is not None:
            pods = min(
                pods, _count(completions, default=1, where=name, field_name="spec.completions")
            )
        yield _pod_set(spec.get("template"), count=pods, name=name)
    elif _is(template, "RayCluster", "ray.io"):
        yield from _ray_cluster_pod_sets(spec, name=name)
    elif _is(template, "RayService", "ray.io"):
        # The serving cluster. During a zero-downtime upgrade KubeRay runs a second cluster
        # beside it for a while; that one is not counted (the gang is what must start at once).
        yield from _ray_cluster_pod_sets(_mapping(spec.get("rayClusterConfig")), name=name)
    elif _is(template, "RayJob", "ray.io"):
        # A RayJob that uses an existing cluster (spec.clusterSelector) makes no cluster pods;
        # its submitter pod is counted either way, as Kueue counts it.
        cluster_spec = _mapping(spec.get("rayClusterSpec"))
        if cluster_spec:
            yield from _ray_cluster_pod_sets(cluster_spec, name=name)
        yield _ray_job_submitter(spec, name=name)
    elif _is(template, "PyTorchJob", "kubeflow.org"):
        replica_specs = _mapping(spec.get("pytorchReplicaSpecs"))
        for role, replica_spec in replica_specs.items():
            replica_spec = _mapping(replica_spec)
            where = f"{name} {role}"
            replicas = _count(
                replica_spec.get("replicas"), default=1, where=where, field_name="replicas"
            )
            yield _pod_set(replica_spec.get("template"), count=replicas, name=where)
    # Any other kind makes none that we know of: see `cannot_infer`.


def cannot_infer(template: Mapping[str, Any]) -> str | None:
    """Why the pods of this object cannot be inferred, or None when `infer_pod_sets` knows
    them (a workload kind it reads, or a kind known to make no pods). An object of which it
    is said must declare its pods in `custompodresources`."""
    kind = template.get("kind")
    group = _group(template)
    if group is None:  # no apiVersion: validation says so; any group of a known name
        if kind in _KNOWN_NAMES:
            return None
    elif (group, kind) in _WORKLOAD_KINDS or (group, kind) in _PODLESS_KINDS:
        return None
    what = f"{kind} ({template.get('apiVersion')})" if kind in _KNOWN_NAMES else f"{kind}"
    return f"kind {what}: cannot infer its pods; declare them in custompodresources"


def infer_pod_sets(template: Mapping[str, Any]) -> tuple[PodSet, ...]:
    """The pods a wrapped object will make, as pod sets; () for kinds that make none and for
    kinds it cannot read (`cannot_infer` tells those apart).

    Supported: Pod; Deployment, StatefulSet, ReplicaSet (spec.replicas, default 1); Job
    (parallelism, default 1, capped by completions); RayCluster, RayJob (spec.rayClusterSpec,
    plus its submitter pod in K8sJobMode, the default: spec.submitterPodTemplate, else
    KubeRay's default of 500m CPU and 200Mi) and RayService (spec.rayClusterConfig) (ray.io,
    any version: the head plus every worker group); PyTorchJob (kubeflow.org: every replica
    type). Node affinity and topology spread are not modelled, only nodeSelector and
    tolerations. Every pod asks for `pods: 1`.
    Raises QuantityError naming the object and container on malformed input.
    """
    return tuple(p for p in _infer(template) if p is not None)


def pod_sets_from_custom(custompodresources: list[dict[str, Any]]) -> tuple[PodSet, ...]:
    """Pod sets from MCAD's `custompodresources` ({replicas, requests, limits} each).

    A request that is absent falls back to the limit of the same resource; `replicas`
    defaults to 1; each pod asks for `pods: 1` as inferred ones do. These pods carry no
    placement constraints (MCAD's field has none).
    """
    result: list[PodSet] = []
    for index, entry in enumerate(custompodresources):
        where = f"custompodresources[{index}]"
        if not isinstance(entry, Mapping):
            raise QuantityError(f"{where}: must be an object with replicas, requests, limits")
        replicas = _count(entry.get("replicas"), default=1, where=where, field_name="replicas")
        requests = _one_pod(_effective_requests(entry, label=where))
        if replicas:
            result.append(PodSet(count=replicas, requests=requests, name=where))
    return tuple(result)


def _label_object(obj: dict[str, Any], labels: Mapping[str, str]) -> None:
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = obj["metadata"] = {}
    existing = metadata.get("labels")
    if not isinstance(existing, dict):
        existing = metadata["labels"] = {}
    existing.update(labels)


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _ray_templates(spec: Any) -> list[Any]:
    if not isinstance(spec, dict):
        return []
    head = spec.get("headGroupSpec")
    found = [head.get("template")] if isinstance(head, dict) else []
    groups = spec.get("workerGroupSpecs")
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, dict):
            found.append(group.get("template"))
    return found


def _pytorch_templates(obj: dict[str, Any]) -> list[Any]:
    replica_specs = _spec(obj).get("pytorchReplicaSpecs")
    if not isinstance(replica_specs, dict):
        return []
    return [r.get("template") for r in replica_specs.values() if isinstance(r, dict)]


def _cron_job_templates(obj: dict[str, Any]) -> list[Any]:
    job_template = _spec(obj).get("jobTemplate")
    return [_spec(job_template).get("template")] if isinstance(job_template, dict) else []


_POD_TEMPLATES: dict[str, Callable[[dict[str, Any]], list[Any]]] = {
    # Only the pod template: spec.selector of a Deployment/StatefulSet/ReplicaSet is immutable
    # and need only match a subset of the pod labels, so adding labels never breaks it.
    **{
        kind: lambda obj: [_spec(obj).get("template")]
        for kind in ("Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job")
    },
    "CronJob": _cron_job_templates,
    "RayCluster": lambda obj: _ray_templates(_spec(obj)),
    "RayJob": lambda obj: [
        *_ray_templates(_spec(obj).get("rayClusterSpec")),
        _spec(obj).get("submitterPodTemplate"),
    ],
    "RayService": lambda obj: _ray_templates(_spec(obj).get("rayClusterConfig")),
    "PyTorchJob": _pytorch_templates,
}


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template inside an object, to change in place (for a Pod, the Pod itself);
    what is not a template (malformed user data) is skipped."""
    kind = str(obj.get("kind"))
    if kind == "Pod":
        return [obj]
    walker = _POD_TEMPLATES.get(kind)
    return [t for t in (walker(obj) if walker else []) if isinstance(t, dict)]


def inject_labels(template: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """A deep copy of `template` with `labels` on the object and on every pod template in it.

    The given labels win over labels of the same key already there. The input is never
    mutated. Kinds without pod templates get the labels on the object only.
    """
    result: dict[str, Any] = copy.deepcopy(dict(template))
    _label_object(result, labels)
    if result.get("kind") == "CronJob":
        job_template = _spec(result).get("jobTemplate")
        if isinstance(job_template, dict):
            _label_object(job_template, labels)
    for pod_template in pod_templates(result):
        if pod_template is not result:
            _label_object(pod_template, labels)
    return result


def _requested_names(spec: Mapping[str, Any]) -> set[str]:
    """Resource names a pod spec's containers request or limit (no quantity parsed)."""
    names: set[str] = set()
    for field in ("containers", "initContainers"):
        containers = spec.get(field)
        for container in containers if isinstance(containers, list) else []:
            resources = container.get("resources") if isinstance(container, dict) else None
            for part in ("requests", "limits"):
                amounts = resources.get(part) if isinstance(resources, dict) else None
                if isinstance(amounts, dict):
                    names.update(str(name) for name in amounts)
    return names


def inject_flavors(obj: dict[str, Any], flavors: Sequence[tuple[Flavor, Sequence[str]]]) -> None:
    """In place: every pod template that requests a resource of a flavor's group gets the
    flavor's node labels in its nodeSelector and its tolerations (the rule
    `core.quota.flavors.applies` states, which the scheduling cycle fitted the pods by)."""
    for template in pod_templates(obj):
        spec = template.get("spec")
        if not isinstance(spec, dict):
            continue
        requested = _requested_names(spec)
        for flavor, resources in flavors:
            if not applies(resources, requested):
                continue
            if flavor.node_labels:
                selector = spec.get("nodeSelector")
                if not isinstance(selector, dict):
                    selector = spec["nodeSelector"] = {}
                selector.update(flavor.node_labels)
            if flavor.tolerations:
                tolerations = spec.get("tolerations")
                if not isinstance(tolerations, list):
                    tolerations = spec["tolerations"] = []
                for t in flavor.tolerations:
                    entry: dict[str, Any] = {
                        "key": t.key,
                        "operator": t.operator,
                        "effect": t.effect,
                        "value": t.value if t.operator == "Equal" else "",
                    }
                    entry = {k: v for k, v in entry.items() if v}
                    if t.seconds is not None:
                        entry["tolerationSeconds"] = t.seconds
                    if entry not in tolerations:
                        tolerations.append(entry)
