"""What the dispatcher counts, and refuses to guess: RayService pods, kinds it cannot read,
pods per node, absurd pod counts (cluster selector expressions: test_selectors.py).

A tenant must not get a gang past the queue by wrapping a kind whose pods are not counted,
by asking for nothing but pods, or by writing a selector the dispatcher would ignore.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.models import AppWrapper, GenericItem
from dispatcher.api.quantity import QuantityError
from dispatcher.api.resources import Resources
from dispatcher.cluster.capacity import CapacityCache, slim_pod
from dispatcher.core.model import (
    ONE_POD,
    PODS,
    UNLIMITED_PODS,
    ClusterSnapshot,
    PodSet,
    QueueMode,
    Workload,
    pod_count,
)
from dispatcher.core.podsets import MAX_PODS, cannot_infer, infer_pod_sets, pod_requests
from dispatcher.core.scheduling import Wait, schedule
from dispatcher.core.scheduling.placement import ClusterRoom, NodeAssignment
from dispatcher.core.validation import DEFAULT_ALLOWED_KINDS
from dispatcher.core.workloads import InvalidSpec, item_pod_sets, workload_of
from testenv.manifests import appwrapper
from tests.unit.builders import (
    GPU,
    cluster,
    container,
    deployment,
    job,
    node,
    node_free,
    obj,
    pod,
    pod_spec,
    pods,
    ray_cluster,
    ray_cluster_spec,
    res,
    try_place,
    worker_group,
    workload,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GPU_WORKER = pod_spec(container(requests={"cpu": "4", "memory": "16Gi"}, limits={GPU: 8}))
HEAD = pod_spec(container(requests={"cpu": "2", "memory": "8Gi"}))


def ray_service(
    name: str, *workers: dict[str, Any], head: dict[str, Any] | None = None
) -> dict[str, Any]:
    return obj(
        "RayService",
        name,
        api_version="ray.io/v1",
        spec={
            "serveConfigV2": "applications: []",
            "rayClusterConfig": ray_cluster_spec(head, *workers),
        },
    )


def workload_or_error(
    *items: dict[str, Any], custom: list[dict[str, Any]] | None = None, **spec: Any
) -> Workload | InvalidSpec:
    raw = appwrapper("aw", *items, custom=custom, scheduling=spec.get("scheduling"))
    raw["metadata"].update(namespace="ns", uid="u1")
    return workload_of(AppWrapper.from_kube(raw), priority=0, allowed_kinds=None, now=NOW)


def counted(*items: dict[str, Any], custom: list[dict[str, Any]] | None = None) -> Workload:
    result = workload_or_error(*items, custom=custom)
    assert isinstance(result, Workload), result
    return result


def refused(*items: dict[str, Any], custom: list[dict[str, Any]] | None = None, **spec: Any) -> str:
    result = workload_or_error(*items, custom=custom, **spec)
    assert isinstance(result, InvalidSpec), result
    return result.message


def table(pod_sets: tuple[PodSet, ...]) -> list[tuple[str, int, Resources]]:
    """(name, count, requests without the one `pods` every pod asks for)."""
    return [(p.name, p.count, p.requests - {PODS: ONE_POD}) for p in pod_sets]


# -- RayService: its cluster's pods, as a RayCluster's ---------------------------------------


RAY_SERVICE_CASES: list[Any] = [
    pytest.param(
        ray_service("serve", worker_group("gpu", GPU_WORKER, replicas=100), head=HEAD),
        [
            ("RayService/serve head", 1, res(cpu=2, memory="8Gi")),
            ("RayService/serve worker gpu", 100, res(cpu=4, memory="16Gi", gpu=8)),
        ],
        id="hundred-gpu-workers",
    ),
    pytest.param(
        ray_service("serve", worker_group("w", GPU_WORKER, min_replicas=3), head=HEAD),
        [
            ("RayService/serve head", 1, res(cpu=2, memory="8Gi")),
            ("RayService/serve worker w", 3, res(cpu=4, memory="16Gi", gpu=8)),
        ],
        id="replicas-default-to-minReplicas",
    ),
    pytest.param(
        ray_service("serve", worker_group("tpu", GPU_WORKER, replicas=2, hosts=4), head=HEAD),
        [
            ("RayService/serve head", 1, res(cpu=2, memory="8Gi")),
            ("RayService/serve worker tpu", 8, res(cpu=4, memory="16Gi", gpu=8)),
        ],
        id="multi-host-groups",
    ),
    pytest.param(
        ray_service("serve", head=HEAD),
        [("RayService/serve head", 1, res(cpu=2, memory="8Gi"))],
        id="head-only",
    ),
]


@pytest.mark.parametrize(("template", "want"), RAY_SERVICE_CASES)
def test_ray_service_pods_are_its_cluster_config(
    template: dict[str, Any], want: list[tuple[str, int, Resources]]
) -> None:
    assert table(infer_pod_sets(template)) == want


def test_ray_service_counts_as_the_same_ray_cluster() -> None:
    workers = (worker_group("a", GPU_WORKER, replicas=5), worker_group("b", HEAD, min_replicas=2))
    service = infer_pod_sets(ray_service("x", *workers, head=HEAD))
    cluster_pods = infer_pod_sets(ray_cluster("x", HEAD, *workers))
    assert [(p.count, p.requests) for p in service] == [(p.count, p.requests) for p in cluster_pods]


def test_ray_service_of_800_gpus_waits_on_a_cluster_of_16() -> None:
    """The defect: its pods counted as none, it was dispatched at once, past the queue."""
    aw = counted(ray_service("serve", worker_group("gpu", GPU_WORKER, replicas=100), head=HEAD))
    assert pod_count(aw.pod_sets) == 101
    snapshot = cluster("c", node("g1", cpu=64, gpu=8), node("g2", cpu=64, gpu=8))
    result = schedule(
        [aw],
        [snapshot],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=0.0,
        starvation_after=1e9,
        preemption=None,
    )
    assert result.admits == ()
    (wait,) = [d for d in result.waits if isinstance(d, Wait)]
    assert "nvidia.com/gpu 800, free 16 of 16" in wait.message


# -- kinds: read, known to make no pods, or declared ----------------------------------------


PODLESS = [
    obj("Service", "s"),
    obj("ConfigMap", "c"),
    obj("Secret", "s"),
    obj("PersistentVolumeClaim", "p"),
    obj("ServiceAccount", "sa"),
    obj("NetworkPolicy", "np", api_version="networking.k8s.io/v1"),
    obj("Ingress", "i", api_version="networking.k8s.io/v1"),
    obj("Route", "r", api_version="route.openshift.io/v1"),
    obj("PodGroup", "pg", api_version="scheduling.x-k8s.io/v1alpha1"),
    obj("PodGroup", "pg", api_version="scheduling.sigs.k8s.io/v1alpha1"),
    obj("PodGroup", "pg", api_version="scheduling.volcano.sh/v1beta1"),
]


@pytest.mark.parametrize("template", PODLESS, ids=lambda t: f"{t['apiVersion']}/{t['kind']}")
def test_kinds_known_to_make_no_pods_count_zero(template: dict[str, Any]) -> None:
    assert cannot_infer(template) is None
    assert counted(template).pod_sets == ()


UNREADABLE_CASES: list[Any] = [
    pytest.param(
        obj("InferenceService", "llm", api_version="serving.kserve.io/v1beta1"),
        "kind InferenceService: cannot infer its pods; declare them in custompodresources",
        id="third-party-crd",
    ),
    pytest.param(
        obj("DaemonSet", "ds", api_version="apps/v1", spec={"template": {"spec": pod_spec()}}),
        "kind DaemonSet: cannot infer its pods",
        id="daemonset-one-per-node",
    ),
    pytest.param(
        obj("Job", "j", api_version="example.com/v1", spec={"parallelism": 50}),
        "kind Job (example.com/v1): cannot infer its pods",
        id="known-name-other-group",
    ),
    pytest.param(
        obj("Service", "knative", api_version="serving.knative.dev/v1"),
        "kind Service (serving.knative.dev/v1): cannot infer its pods",
        id="knative-service-makes-pods",
    ),
]


@pytest.mark.parametrize(("template", "want"), UNREADABLE_CASES)
def test_kinds_it_cannot_read_are_refused_unless_declared(
    template: dict[str, Any], want: str
) -> None:
    message = refused(template)
    assert message.startswith("item 0: ")
    assert want in message
    declared = counted(template, custom=[{"replicas": 3, "requests": {"cpu": "2"}}])
    assert table(declared.pod_sets) == [("custompodresources[0]", 3, res(cpu=2))]
    assert counted(template, custom=[]).pod_sets == ()  # an empty list declares none


def test_every_kind_allowed_by_default_is_read_or_known_to_make_no_pods() -> None:
    usual_versions = {
        "ConfigMap": "v1",
        "Deployment": "apps/v1",
        "Ingress": "networking.k8s.io/v1",
        "Job": "batch/v1",
        "NetworkPolicy": "networking.k8s.io/v1",
        "PersistentVolumeClaim": "v1",
        "Pod": "v1",
        "PodGroup": "scheduling.x-k8s.io/v1alpha1",
        "PyTorchJob": "kubeflow.org/v1",
        "RayCluster": "ray.io/v1",
        "RayJob": "ray.io/v1",
        "RayService": "ray.io/v1",
        "ReplicaSet": "apps/v1",
        "Route": "route.openshift.io/v1",
        "Service": "v1",
        "ServiceAccount": "v1",
        "StatefulSet": "apps/v1",
    }
    assert set(usual_versions) == DEFAULT_ALLOWED_KINDS
    for kind, version in usual_versions.items():
        assert cannot_infer(obj(kind, "x", api_version=version)) is None, kind


# A hypothesis property: an object that makes pods is never counted as making none.

_COUNT = st.integers(min_value=1, max_value=50)


@st.composite
def pod_making_objects(draw: st.DrawFn) -> dict[str, Any]:
    """An object that makes at least one pod: a kind we read, or any other."""
    spec = pod_spec(container(requests={"cpu": draw(st.sampled_from(["0", "1", "250m"]))}))
    choice = draw(st.integers(min_value=0, max_value=7))
    if choice == 0:
        return pod("p", spec)
    if choice == 1:
        kind = draw(st.sampled_from(["Deployment", "StatefulSet", "ReplicaSet"]))
        return deployment("d", spec, replicas=draw(_COUNT), kind=kind)
    if choice == 2:
        return job("j", spec, parallelism=draw(_COUNT), completions=draw(_COUNT))
    if choice in (3, 4):
        workers = [
            worker_group(f"w{i}", spec, replicas=draw(_COUNT)) for i in range(draw(_COUNT) % 3)
        ]
        if choice == 3:
            return ray_cluster("r", spec, *workers)
        return ray_service("r", *workers, head=spec)
    # Kinds we do not read, under names and groups of every sort.
    kind = draw(st.sampled_from(["Job", "Deployment", "Service", "Workload", "LeaderWorkerSet"]))
    group = draw(st.sampled_from(["example.com/v1", "serving.knative.dev/v1", "x.io/v2"]))
    return obj(
        kind, "o", api_version=group, spec={"replicas": draw(_COUNT), "template": {"spec": spec}}
    )


@settings(max_examples=300, deadline=None)
@given(template=pod_making_objects(), declare=st.booleans())
def test_an_object_that_makes_pods_never_counts_zero_unless_declared(
    template: dict[str, Any], declare: bool
) -> None:
    custom = [{"replicas": 2, "requests": {"cpu": "1"}}] if declare else None
    item = GenericItem.model_validate({"generictemplate": template, "custompodresources": custom})
    try:
        pod_sets = item_pod_sets(item)
    except QuantityError as exc:
        error = str(exc)
        assert not declare
        assert "cannot infer its pods; declare them in custompodresources" in error
        return
    assert pod_count(pod_sets) > 0
    assert all(p.requests[PODS] == ONE_POD for p in pod_sets)


# -- pods per node --------------------------------------------------------------------------


def test_every_pod_asks_for_one_pods() -> None:
    assert pod_requests(pod_spec(container(requests={"cpu": "1"})), where="p") == (
        res(cpu=1) + {PODS: ONE_POD}
    )
    assert pod_requests({"containers": [{"name": "c"}]}, where="p") == Resources({PODS: ONE_POD})


def test_live_pods_count_against_the_nodes_pods() -> None:
    cache = CapacityCache(cluster="c")
    cache.on_node(
        "ADDED",
        None,
        {
            "metadata": {"name": "n1", "resourceVersion": "1"},
            "spec": {},
            "status": {
                "allocatable": {"cpu": "8", "pods": "3"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        },
    )
    for index in range(2):
        body = {
            "metadata": {"name": f"p{index}", "namespace": "ns", "resourceVersion": "1"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},  # no requests at all
            "status": {"phase": "Running"},
        }
        cache.on_pod("ADDED", None, slim_pod(body))
    (state,) = cache.snapshot().nodes
    assert state.free[PODS] == ONE_POD
    # The pod that takes the last place fits; a second one does not.
    room = ClusterRoom(cache.snapshot())
    assert try_place(room, [pods(1)]).ok
    assert try_place(room, [pods(1)]).reason == "needs pods 1, free 0 of 3"


PODS_FIT_CASES: list[Any] = [
    pytest.param(
        (node("n1", max_pods=110), node("n2", max_pods=110)),
        (pods(1_000_000, name="Job/many"),),
        "needs pods 1000000, free 220 of 220",
        id="million-no-request-pods",
    ),
    pytest.param(
        (node("n1", max_pods=110, used=Resources({PODS: 100 * ONE_POD})), node("n2", max_pods=110)),
        (pods(121, name="Job/many"),),
        "needs pods 121, free 120 of 220",
        id="live-pods-take-places",
    ),
    pytest.param(
        (node("n1", max_pods=110), node("n2", max_pods=110)),
        (pods(220, name="Job/many"),),
        [NodeAssignment(0, "n1", 110), NodeAssignment(0, "n2", 110)],
        id="exactly-full",
    ),
    pytest.param(
        (node("n1", cpu=64, max_pods=2), node("n2", cpu=64, max_pods=2)),
        (pods(3, cpu=1, name="Job/small"),),
        [NodeAssignment(0, "n1", 2), NodeAssignment(0, "n2", 1)],
        id="pods-bind-before-cpu",
    ),
    pytest.param(
        (
            node("n1", cpu=64, max_pods=1, used=Resources({PODS: ONE_POD})),
            node("n2", cpu=2),
        ),
        (pods(1, cpu=4, name="Job/x"),),
        "resources free in total but no node can hold pod Job/x (cpu 4): largest free on a "
        "node is cpu 2 (n2)",
        id="pods-not-binding-not-named",
    ),
    pytest.param(
        # Places in total (11), cpu in total (64), but the node with the cpu has one place.
        (node("n1", cpu=64, max_pods=1), node("n2", cpu=0, max_pods=10)),
        (pods(2, cpu=2, name="Job/small"),),
        "resources free in total but no node can hold pod Job/small (cpu 2, pods 1) after "
        "placing 1 of 2 pods: largest free on a node is cpu 62, pods 0 (n1)",
        id="pods-binding-named",
    ),
    pytest.param(
        (node("n1"), node("n2")),
        (pods(MAX_PODS, name="Job/many"),),
        [NodeAssignment(0, "n1", MAX_PODS)],
        id="nodes-that-do-not-report-pods-take-any-number",
    ),
    pytest.param(
        (node("n1", max_pods=0), node("n2", max_pods=4)),
        (pods(50, name="Job/many"),),
        # Best fit by places: the node with the fewest first.
        [NodeAssignment(0, "n2", 4), NodeAssignment(0, "n1", 46)],
        id="zero-reads-as-unreported",
    ),
]


@pytest.mark.parametrize(("nodes", "pod_sets", "want"), PODS_FIT_CASES)
def test_pods_per_node_fit(
    nodes: tuple[Any, ...], pod_sets: tuple[PodSet, ...], want: str | list[NodeAssignment]
) -> None:
    tried = try_place(ClusterRoom(cluster("c", *nodes)), pod_sets)
    if isinstance(want, str):
        assert tried.reason == want
    else:
        assert tried.ok, tried.reason
        assert list(tried.assignments) == want


def test_a_billion_pod_gang_costs_nodes_not_pods() -> None:
    """Placement fills a node with as many pods as it holds in one step: a gang's count
    never sets the number of steps (the count itself is refused before, by validation)."""
    huge = (pods(10**9, name="Job/huge"),)
    small = ClusterRoom(cluster("c", *[node(f"n{i}", max_pods=110) for i in range(50)]))
    unreported = ClusterRoom(cluster("c", *[node(f"n{i}") for i in range(50)]))
    started = time.perf_counter()
    assert try_place(small, huge).reason == "needs pods 1000000000, free 5500 of 5500"
    assert try_place(unreported, huge).assignments == (NodeAssignment(0, "n0", 10**9),)
    assert time.perf_counter() - started < 1.0


def test_existing_messages_do_not_name_pods_when_it_is_not_short() -> None:
    state = ClusterRoom(cluster("c", node("n1", gpu=8, max_pods=110), node("n2", gpu=8)))
    assert try_place(state, [pods(3, gpu=8, name="Job/x")]).reason == (
        "needs nvidia.com/gpu 24, free 16 of 16"
    )


# A hypothesis property: no node is given more pods than its allocatable `pods`.


@st.composite
def pods_worlds(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[tuple[PodSet, ...]]]:
    nodes = []
    for index in range(draw(st.integers(min_value=1, max_value=6))):
        max_pods = draw(st.sampled_from([None, 0, 1, 2, 3, 5, 110]))
        used = draw(st.integers(min_value=0, max_value=max_pods or 4))
        nodes.append(
            node(
                f"n{index}",
                cpu=draw(st.sampled_from([1, 4, 16])),
                max_pods=max_pods,
                used=Resources({PODS: used * ONE_POD, "cpu": 0}),
            )
        )
    gangs = [
        tuple(
            pods(draw(st.integers(min_value=1, max_value=40)), cpu=draw(st.sampled_from([0, 0, 1])))
            for _ in range(draw(st.integers(min_value=1, max_value=3)))
        )
        for _ in range(draw(st.integers(min_value=1, max_value=8)))
    ]
    return cluster("c", *nodes), gangs


@settings(max_examples=300, deadline=None)
@given(world=pods_worlds())
def test_no_node_is_given_more_pods_than_it_allows(
    world: tuple[ClusterSnapshot, list[tuple[PodSet, ...]]],
) -> None:
    snapshot, gangs = world
    state = ClusterRoom(snapshot)
    given_pods = {n.name: 0 for n in snapshot.nodes}
    for gang in gangs:
        tried = try_place(state, gang)
        for assignment in tried.assignments:
            given_pods[assignment.node] += assignment.count
    for state_node in snapshot.nodes:
        allowed = state_node.allocatable[PODS] // ONE_POD  # 0: not reported, any number
        already = state_node.requested[PODS] // ONE_POD
        if allowed:
            assert already + given_pods[state_node.name] <= allowed
            assert node_free(state, state_node.name)[PODS] >= 0


# -- absurd counts are refused before the scheduler sees them --------------------------------


REFUSED_COUNTS: list[Any] = [
    pytest.param(
        deployment("huge", replicas=10**9),
        f"the items make 1000000000 pods; an AppWrapper may make at most {MAX_PODS}",
        id="billion-replica-deployment",
    ),
    pytest.param(
        ray_service("serve", worker_group("w", replicas=50_001, hosts=2), head=HEAD),
        f"the items make 100003 pods; an AppWrapper may make at most {MAX_PODS}",
        id="ray-service-hosts",
    ),
]


@pytest.mark.parametrize(("template", "want"), REFUSED_COUNTS)
def test_absurd_pod_counts_are_invalid(template: dict[str, Any], want: str) -> None:
    assert refused(template) == want


def test_declared_absurd_counts_are_invalid_too() -> None:
    message = refused(obj("ConfigMap", "c"), custom=[{"replicas": 10**9}])
    assert message == f"the items make 1000000000 pods; an AppWrapper may make at most {MAX_PODS}"


def test_the_limit_itself_is_allowed() -> None:
    assert pod_count(counted(deployment("d", replicas=MAX_PODS)).pod_sets) == MAX_PODS


@pytest.mark.parametrize(
    ("as_written", "want"),
    [
        pytest.param(True, [("custompodresources[0]", 1, res(cpu=8))], id="as-written"),
        pytest.param(False, [("Deployment/d", 4, res(cpu=1))], id="at-least-templates"),
    ],
)
def test_fewer_declared_pods_than_the_object_makes(
    as_written: bool, want: list[tuple[str, int, Resources]]
) -> None:
    """As written (MCAD's reading, the default), the declaration is the reservation. Never
    below the templates: `pods` is a resource like the others, and a declaration of 1 pod
    for a Deployment of 4 would let 3 pods in uncounted."""
    spec = pod_spec(container(requests={"cpu": "1"}))
    item = GenericItem.model_validate(
        {
            "generictemplate": deployment("d", spec, replicas=4),
            "custompodresources": [{"replicas": 1, "requests": {"cpu": "8"}}],
        }
    )
    assert table(item_pod_sets(item, as_written=as_written)) == want


@pytest.mark.parametrize("as_written", [True, False])
def test_a_declaration_at_or_above_the_templates_is_used_either_way(as_written: bool) -> None:
    spec = pod_spec(container(requests={"cpu": "1"}))
    item = GenericItem.model_validate(
        {
            "generictemplate": deployment("d", spec, replicas=2),
            "custompodresources": [{"replicas": 2, "requests": {"cpu": "2"}}],
        }
    )
    assert table(item_pod_sets(item, as_written=as_written)) == [
        ("custompodresources[0]", 2, res(cpu=2))
    ]


def test_unlimited_pods_are_beyond_any_valid_appwrapper() -> None:
    assert UNLIMITED_PODS > MAX_PODS * ONE_POD
    assert workload("k", pods(1)).pod_sets[0].requests[PODS] == ONE_POD
