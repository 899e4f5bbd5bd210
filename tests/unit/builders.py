"""Small builders for the core's values and for raw Kubernetes templates, used by unit tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.api.resources import Resources
from dispatcher.core.model import (
    ONE_POD,
    PODS,
    ClusterSnapshot,
    DispatchedWorkload,
    NodeSnapshot,
    Placement,
    PodSet,
    Reservation,
    Taint,
    Toleration,
    Workload,
)
from dispatcher.core.scheduling import CycleResult
from dispatcher.core.scheduling.placement import (
    ClusterRoom,
    Gang,
    NodeAssignment,
    Refusal,
)

GPU = "nvidia.com/gpu"


def res(cpu: float | str = 0, memory: str | None = None, gpu: int = 0, **other: str) -> Resources:
    """Resources from people units: res(cpu=2, memory="4Gi", gpu=1)."""
    raw: dict[str, Any] = {"cpu": cpu, GPU: gpu}
    if memory is not None:
        raw["memory"] = memory
    raw.update({k.replace("_", "-"): v for k, v in other.items()})
    return Resources.parse(raw)


def node(
    name: str,
    *,
    cpu: float | str = 8,
    memory: str = "64Gi",
    gpu: int = 0,
    used: Resources | None = None,
    labels: Mapping[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    ready: bool = True,
    unschedulable: bool = False,
    max_pods: int | None = None,
) -> NodeSnapshot:
    """A node; `max_pods` None reports no allocatable `pods` (any number fits)."""
    allocatable = res(cpu=cpu, memory=memory, gpu=gpu)
    if max_pods is not None:
        allocatable = allocatable + {PODS: max_pods * ONE_POD}
    return NodeSnapshot(
        name=name,
        allocatable=allocatable,
        requested=used if used is not None else Resources(),
        labels=dict(labels or {}),
        taints=taints,
        ready=ready,
        unschedulable=unschedulable,
    )


def pods(
    count: int = 1,
    *,
    cpu: float | str = 0,
    memory: str | None = None,
    gpu: int = 0,
    name: str = "",
    selector: Mapping[str, str] | None = None,
    tolerations: tuple[Toleration, ...] = (),
) -> PodSet:
    """`count` pods, each asking for one `pods` besides the rest, as inferred ones do."""
    return PodSet(
        count=count,
        requests=res(cpu=cpu, memory=memory, gpu=gpu) + {PODS: ONE_POD},
        node_selector=tuple(sorted((selector or {}).items())),
        tolerations=tolerations,
        name=name,
    )


def workload(
    key: str,
    *pod_sets: PodSet,
    priority: int = 0,
    created_at: float = 0.0,
    queued_since: float | None = None,
    placement: Placement | None = None,
    preemptible: bool = True,
    queue: str = "",
) -> Workload:
    return Workload(
        key=key,
        priority=priority,
        created_at=created_at,
        pod_sets=pod_sets,
        placement=placement or Placement(),
        queued_since=created_at if queued_since is None else queued_since,
        preemptible=preemptible,
        queue_name=queue,
    )


def cluster(
    name: str,
    *nodes: NodeSnapshot,
    reservations: tuple[Reservation, ...] = (),
    labels: Mapping[str, str] | None = None,
    reachable: bool = True,
    admitted: tuple[DispatchedWorkload, ...] = (),
) -> ClusterSnapshot:
    return ClusterSnapshot(
        name=name,
        nodes=nodes,
        reservations=reservations,
        labels=dict(labels or {}),
        reachable=reachable,
        admitted=admitted,
    )


def reservation(key: str, *pod_sets: PodSet, priority: int = 0) -> Reservation:
    return Reservation(key=key, pod_sets=pod_sets, priority=priority)


def running(
    key: str,
    *,
    priority: int = 0,
    dispatched_at: float = 0.0,
    usage: Mapping[str, Resources] | None = None,
    preemptible: bool = True,
) -> DispatchedWorkload:
    return DispatchedWorkload(
        key=key,
        priority=priority,
        dispatched_at=dispatched_at,
        preemptible=preemptible,
        usage=tuple((usage or {}).items()),
    )


def with_running(snapshot: ClusterSnapshot, *admitted: DispatchedWorkload) -> ClusterSnapshot:
    """The snapshot with these AppWrappers' pods bound: their usage added to their nodes."""
    extra: dict[str, Resources] = {}
    for a in admitted:
        for node_name, used in a.usage:
            extra[node_name] = extra.get(node_name, Resources()) + used
    nodes = tuple(
        NodeSnapshot(
            name=n.name,
            allocatable=n.allocatable,
            requested=n.requested + extra.get(n.name, Resources()),
            labels=n.labels,
            taints=n.taints,
            ready=n.ready,
            unschedulable=n.unschedulable,
        )
        for n in snapshot.nodes
    )
    return ClusterSnapshot(
        name=snapshot.name,
        nodes=nodes,
        reservations=snapshot.reservations,
        labels=snapshot.labels,
        reachable=snapshot.reachable,
        admitted=snapshot.admitted + admitted,
    )


# -- raw Kubernetes templates ---------------------------------------------------------


def container(
    name: str = "main",
    *,
    requests: Mapping[str, Any] | None = None,
    limits: Mapping[str, Any] | None = None,
    restart_policy: str | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = dict(requests)
    if limits is not None:
        resources["limits"] = dict(limits)
    result: dict[str, Any] = {"name": name, "image": "busybox", "resources": resources}
    if restart_policy is not None:
        result["restartPolicy"] = restart_policy
    return result


def pod_spec(
    *containers: dict[str, Any],
    init: tuple[dict[str, Any], ...] = (),
    overhead: Mapping[str, Any] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [container()]}
    if init:
        spec["initContainers"] = list(init)
    if overhead is not None:
        spec["overhead"] = dict(overhead)
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations is not None:
        spec["tolerations"] = tolerations
    return spec


def pod_template(spec: dict[str, Any] | None = None, **labels: str) -> dict[str, Any]:
    return {"metadata": {"labels": dict(labels)}, "spec": spec or pod_spec()}


def obj(
    kind: str, name: str, *, api_version: str = "v1", spec: dict[str, Any] | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name},
    }
    if spec is not None:
        result["spec"] = spec
    return result


def pod(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return obj("Pod", name, spec=spec or pod_spec())


def deployment(
    name: str,
    spec: dict[str, Any] | None = None,
    *,
    replicas: int | None = None,
    kind: str = "Deployment",
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "selector": {"matchLabels": {"app": name}},
        "template": pod_template(spec, app=name),
    }
    if replicas is not None:
        body["replicas"] = replicas
    return obj(kind, name, api_version="apps/v1", spec=body)


def job(
    name: str,
    spec: dict[str, Any] | None = None,
    *,
    parallelism: int | None = None,
    completions: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"template": pod_template(spec)}
    if parallelism is not None:
        body["parallelism"] = parallelism
    if completions is not None:
        body["completions"] = completions
    return obj("Job", name, api_version="batch/v1", spec=body)


def worker_group(
    group: str,
    spec: dict[str, Any] | None = None,
    *,
    replicas: int | None = None,
    min_replicas: int | None = None,
    hosts: int | None = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {"groupName": group, "template": pod_template(spec)}
    if replicas is not None:
        result["replicas"] = replicas
    if min_replicas is not None:
        result["minReplicas"] = min_replicas
    if hosts is not None:
        result["numOfHosts"] = hosts
    return result


def ray_cluster_spec(
    head: dict[str, Any] | None = None, *workers: dict[str, Any]
) -> dict[str, Any]:
    return {
        "headGroupSpec": {"rayStartParams": {}, "template": pod_template(head)},
        "workerGroupSpecs": list(workers),
    }


def ray_cluster(
    name: str,
    head: dict[str, Any] | None = None,
    *workers: dict[str, Any],
    api_version: str = "ray.io/v1",
) -> dict[str, Any]:
    return obj("RayCluster", name, api_version=api_version, spec=ray_cluster_spec(head, *workers))


def ray_job(
    name: str, head: dict[str, Any] | None = None, *workers: dict[str, Any]
) -> dict[str, Any]:
    return obj(
        "RayJob",
        name,
        api_version="ray.io/v1",
        spec={"entrypoint": "python main.py", "rayClusterSpec": ray_cluster_spec(head, *workers)},
    )


def pytorch_job(
    name: str,
    master: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    *,
    workers: int | None = None,
) -> dict[str, Any]:
    worker_spec: dict[str, Any] = {"template": pod_template(worker)}
    if workers is not None:
        worker_spec["replicas"] = workers
    return obj(
        "PyTorchJob",
        name,
        api_version="kubeflow.org/v1",
        spec={
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": pod_template(master)},
                "Worker": worker_spec,
            }
        },
    )


# -- the scheduling core's placements, for tests -------------------------------------------


@dataclass(frozen=True)
class Tried:
    """What `try_place` found: `ok` and where the pods went, or the reason with names."""

    ok: bool
    reason: str = ""
    assignments: tuple[NodeAssignment, ...] = ()
    undo: Callable[[], None] = field(default=lambda: None, compare=False)


def try_place(state: ClusterRoom, pod_sets: Sequence[PodSet]) -> Tried:
    """Place a gang in `state` (it stays placed until `undo`), or say why not."""
    placed = state.place(Gang.of(pod_sets))
    if isinstance(placed, Refusal):
        return Tried(ok=False, reason=placed.message(pod_sets))
    return Tried(ok=True, assignments=placed.assignments, undo=placed.undo)


def node_free(state: ClusterRoom, node_name: str) -> Resources:
    """Free room on a schedulable node (KeyError for others)."""
    index = state.index[node_name]
    return Resources({r: column[index] for r, column in state.free.items()})


def free_room(state: ClusterRoom) -> tuple[Resources, list[Resources]]:
    """The aggregate free and each schedulable node's free room, in snapshot order."""
    return Resources(state.free_total), [node_free(state, name) for name in state.names]


def admitted_placements(
    result: CycleResult, pending: Sequence[Workload], clusters: Sequence[ClusterSnapshot]
) -> dict[str, tuple[NodeAssignment, ...]]:
    """Where the cycle's admissions put their pods: each cluster's admissions placed again,
    in order, on a state built from its snapshot (placement is deterministic, and each
    admission saw exactly the admissions to its cluster before it)."""
    by_key = {w.key: w for w in pending}
    states = {c.name: ClusterRoom(c) for c in clusters}
    found: dict[str, tuple[NodeAssignment, ...]] = {}
    for admit in result.admits:
        tried = try_place(states[admit.cluster], by_key[admit.key].pod_sets)
        assert tried.ok, (admit, tried.reason)
        found[admit.key] = tried.assignments
    return found
