"""Pod-set inference from wrapped objects, custompodresources, and label injection."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dispatcher.api.quantity import QuantityError
from dispatcher.api.resources import Resources
from dispatcher.core.model import ONE_POD, PODS, PodSet, Toleration, pod_count, tracked_pod_count
from dispatcher.core.podsets import infer_pod_sets, inject_labels, pod_sets_from_custom
from tests.unit.builders import (
    GPU,
    container,
    deployment,
    job,
    obj,
    pod,
    pod_spec,
    pod_template,
    pytorch_job,
    ray_cluster,
    ray_job,
    res,
    worker_group,
)

ONE_CPU = pod_spec(container(requests={"cpu": "1", "memory": "1Gi"}))
GPU_WORKER = pod_spec(container(requests={"cpu": "3", "memory": "16G"}, limits={GPU: 1}))


ONE_CPU_CONTAINER = {"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}


def with_spec(template: dict[str, Any], **fields: Any) -> dict[str, Any]:
    template["spec"].update(fields)
    return template


def test_only_a_submitter_from_the_users_template_is_tracked() -> None:
    """KubeRay's default submitter pod carries none of the dispatcher's labels: it is fitted
    and reserved, but does not count toward minAvailable; one from the RayJob's own
    template is labelled at dispatch like every other pod template."""
    default = infer_pod_sets(ray_job("rj", ONE_CPU))
    assert [(p.name, p.tracked) for p in default] == [
        ("RayJob/rj head", True),
        ("RayJob/rj submitter", False),
    ]
    assert tracked_pod_count(default) == 1
    assert pod_count(default) == 2
    own = with_spec(
        ray_job("rj", ONE_CPU), submitterPodTemplate={"spec": {"containers": [ONE_CPU_CONTAINER]}}
    )
    assert all(p.tracked for p in infer_pod_sets(own))
    labelled = inject_labels(own, {"l": "v"})
    assert labelled["spec"]["submitterPodTemplate"]["metadata"]["labels"] == {"l": "v"}


def counts(pod_sets: tuple[PodSet, ...]) -> list[tuple[str, int, Resources]]:
    """(name, count, requests) per pod set; every pod asks for one `pods`, which the tables
    leave out."""
    assert all(p.requests[PODS] == ONE_POD for p in pod_sets)
    return [(p.name, p.count, p.requests - {PODS: ONE_POD}) for p in pod_sets]


INFERENCE_CASES: list[Any] = [
    pytest.param(pod("p", ONE_CPU), [("Pod/p", 1, res(cpu=1, memory="1Gi"))], id="pod"),
    pytest.param(
        pod(
            "two-containers",
            pod_spec(
                container("a", requests={"cpu": "500m"}),
                container("b", requests={"cpu": "1500m", "memory": "1Gi"}),
            ),
        ),
        [("Pod/two-containers", 1, res(cpu=2, memory="1Gi"))],
        id="containers-sum",
    ),
    pytest.param(
        pod(
            "init",
            pod_spec(
                container("a", requests={"cpu": "1", "memory": "2Gi"}),
                container("b", requests={"cpu": "1"}),
                init=(
                    container("init1", requests={"cpu": "3", "memory": "1Gi"}),
                    container("init2", requests={"cpu": "1", GPU: 1}),
                ),
            ),
        ),
        [("Pod/init", 1, res(cpu=3, memory="2Gi", gpu=1))],
        id="init-containers-as-max",
    ),
    pytest.param(
        pod(
            "sidecar",
            pod_spec(
                container("main", requests={"cpu": "1"}),
                init=(
                    container("proxy", requests={"cpu": "500m"}, restart_policy="Always"),
                    container("setup", requests={"cpu": "2"}),
                ),
            ),
        ),
        [("Pod/sidecar", 1, res(cpu="2500m"))],
        id="sidecar-init-container-runs-beside",
    ),
    pytest.param(
        pod(
            "limits",
            pod_spec(
                container(requests={"cpu": "500m"}, limits={"cpu": "2", "memory": "4Gi", GPU: 2})
            ),
        ),
        [("Pod/limits", 1, res(cpu="500m", memory="4Gi", gpu=2))],
        id="request-falls-back-to-limit",
    ),
    pytest.param(
        pod("zero", pod_spec(container(requests={"cpu": 0}, limits={"cpu": "2"}))),
        [("Pod/zero", 1, Resources())],
        id="explicit-zero-request-beats-limit",
    ),
    pytest.param(
        pod("overhead", pod_spec(container(requests={"cpu": "1"}), overhead={"cpu": "250m"})),
        [("Pod/overhead", 1, res(cpu="1250m"))],
        id="overhead-added",
    ),
    pytest.param(
        deployment("web", ONE_CPU, replicas=3),
        [("Deployment/web", 3, res(cpu=1, memory="1Gi"))],
        id="deployment",
    ),
    pytest.param(
        deployment("web", ONE_CPU),
        [("Deployment/web", 1, res(cpu=1, memory="1Gi"))],
        id="deployment-default-1",
    ),
    pytest.param(deployment("web", ONE_CPU, replicas=0), [], id="deployment-scaled-to-0"),
    pytest.param(
        deployment("db", ONE_CPU, replicas=2, kind="StatefulSet"),
        [("StatefulSet/db", 2, res(cpu=1, memory="1Gi"))],
        id="statefulset",
    ),
    pytest.param(
        deployment("rs", ONE_CPU, replicas=4, kind="ReplicaSet"),
        [("ReplicaSet/rs", 4, res(cpu=1, memory="1Gi"))],
        id="replicaset",
    ),
    pytest.param(job("j", ONE_CPU), [("Job/j", 1, res(cpu=1, memory="1Gi"))], id="job-default"),
    pytest.param(
        job("j", ONE_CPU, parallelism=4),
        [("Job/j", 4, res(cpu=1, memory="1Gi"))],
        id="job-parallelism",
    ),
    pytest.param(
        job("j", ONE_CPU, parallelism=4, completions=2),
        [("Job/j", 2, res(cpu=1, memory="1Gi"))],
        id="job-completions-below-parallelism",
    ),
    pytest.param(
        job("j", ONE_CPU, parallelism=4, completions=10),
        [("Job/j", 4, res(cpu=1, memory="1Gi"))],
        id="job-completions-above-parallelism",
    ),
    pytest.param(
        job("j", ONE_CPU, completions=5),
        [("Job/j", 1, res(cpu=1, memory="1Gi"))],
        id="job-completions-default-parallelism",
    ),
    pytest.param(
        ray_cluster(
            "glue",
            ONE_CPU,
            worker_group("small", GPU_WORKER, replicas=2),
            worker_group("multi", GPU_WORKER, replicas=2, hosts=4),
            worker_group("floor", ONE_CPU, min_replicas=3),
            worker_group("bare", ONE_CPU),
        ),
        [
            ("RayCluster/glue head", 1, res(cpu=1, memory="1Gi")),
            ("RayCluster/glue worker small", 2, res(cpu=3, memory="16G", gpu=1)),
            ("RayCluster/glue worker multi", 8, res(cpu=3, memory="16G", gpu=1)),
            ("RayCluster/glue worker floor", 3, res(cpu=1, memory="1Gi")),
            ("RayCluster/glue worker bare", 1, res(cpu=1, memory="1Gi")),
        ],
        id="raycluster-v1",
    ),
    pytest.param(
        ray_cluster(
            "old", ONE_CPU, worker_group("w", GPU_WORKER, replicas=1), api_version="ray.io/v1alpha1"
        ),
        [
            ("RayCluster/old head", 1, res(cpu=1, memory="1Gi")),
            ("RayCluster/old worker w", 1, res(cpu=3, memory="16G", gpu=1)),
        ],
        id="raycluster-v1alpha1",
    ),
    pytest.param(
        ray_job("rj", ONE_CPU, worker_group("w", GPU_WORKER, replicas=2)),
        [
            ("RayJob/rj head", 1, res(cpu=1, memory="1Gi")),
            ("RayJob/rj worker w", 2, res(cpu=3, memory="16G", gpu=1)),
            ("RayJob/rj submitter", 1, res(cpu="500m", memory="200Mi")),
        ],
        id="rayjob-default-submitter-kuberays-requests",
    ),
    pytest.param(
        with_spec(
            ray_job("rj", ONE_CPU),
            submitterPodTemplate={"spec": {"containers": [ONE_CPU_CONTAINER]}},
        ),
        [
            ("RayJob/rj head", 1, res(cpu=1, memory="1Gi")),
            ("RayJob/rj submitter", 1, res(cpu=1, memory="1Gi")),
        ],
        id="rayjob-submitter-template",
    ),
    pytest.param(
        with_spec(ray_job("rj", ONE_CPU), submissionMode="HTTPMode"),
        [("RayJob/rj head", 1, res(cpu=1, memory="1Gi"))],
        id="rayjob-httpmode-no-submitter",
    ),
    pytest.param(
        obj("RayJob", "existing", api_version="ray.io/v1", spec={"clusterSelector": {"a": "b"}}),
        [("RayJob/existing submitter", 1, res(cpu="500m", memory="200Mi"))],
        id="rayjob-on-existing-cluster-only-its-submitter",
    ),
    pytest.param(
        pytorch_job("pt", ONE_CPU, GPU_WORKER, workers=3),
        [
            ("PyTorchJob/pt Master", 1, res(cpu=1, memory="1Gi")),
            ("PyTorchJob/pt Worker", 3, res(cpu=3, memory="16G", gpu=1)),
        ],
        id="pytorchjob",
    ),
    pytest.param(obj("Service", "svc", spec={"ports": []}), [], id="service"),
    pytest.param(obj("ConfigMap", "cm"), [], id="configmap"),
    pytest.param(obj("Secret", "s"), [], id="secret"),
    pytest.param(
        obj("PodGroup", "pg", api_version="scheduling.sigs.k8s.io/v1alpha1"), [], id="podgroup"
    ),
    pytest.param(
        obj("Job", "other", api_version="example.com/v1", spec={"template": pod_template()}),
        [],
        id="job-kind-of-another-group",
    ),
]


@pytest.mark.parametrize(("template", "want"), INFERENCE_CASES)
def test_infer_pod_sets(template: dict[str, Any], want: list[tuple[str, int, Resources]]) -> None:
    assert counts(infer_pod_sets(template)) == want


def test_placement_constraints_are_carried() -> None:
    spec = pod_spec(
        container(requests={"cpu": "1"}),
        node_selector={"zone": "b", "accelerator": "a100"},
        tolerations=[
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "team", "value": "ml"},
        ],
    )
    (pod_set,) = infer_pod_sets(deployment("web", spec, replicas=2))
    assert pod_set.node_selector == (("accelerator", "a100"), ("zone", "b"))
    assert pod_set.tolerations == (
        Toleration(key="gpu", operator="Exists", effect="NoSchedule"),
        Toleration(key="team", operator="Equal", value="ml"),
    )


MALFORMED_CASES: list[Any] = [
    pytest.param(
        deployment("web", pod_spec(container("main", requests={"cpu": "2 cores"}))),
        ["Deployment/web", "'main'", "cpu", "2 cores"],
        id="request",
    ),
    pytest.param(
        ray_cluster(
            "glue", ONE_CPU, worker_group("w", pod_spec(container("ray", limits={GPU: "x"})))
        ),
        ["RayCluster/glue worker w", "'ray'", GPU],
        id="limit-in-worker",
    ),
    pytest.param(
        pod("p", pod_spec(init=(container("setup", requests={"memory": "1.5.2"}),))),
        ["Pod/p", "'setup'", "memory"],
        id="init-container",
    ),
    pytest.param(
        pod("p", pod_spec(overhead={"cpu": "-1"})), ["Pod/p", "overhead", "cpu"], id="overhead"
    ),
    pytest.param(
        deployment("web", replicas="three"), ["Deployment/web", "replicas"], id="replicas"
    ),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("template", "want_in_message"), MALFORMED_CASES)
def test_malformed_input_names_object_and_container(
    template: dict[str, Any], want_in_message: list[str]
) -> None:
    with pytest.raises(QuantityError) as raised:
        infer_pod_sets(template)
    for part in want_in_message:
        assert part in str(raised.value)


CUSTOM_CASES: list[Any] = [
    pytest.param(
        [{"replicas": 2, "requests": {"cpu": "1", "memory": "1Gi"}}],
        [("custompodresources[0]", 2, res(cpu=1, memory="1Gi"))],
        id="requests",
    ),
    pytest.param(
        [{"replicas": 4, "requests": {"cpu": "500m"}, "limits": {"cpu": "1", GPU: 1}}],
        [("custompodresources[0]", 4, res(cpu="500m", gpu=1))],
        id="limit-fallback",
    ),
    pytest.param(
        [{"requests": {"cpu": "1"}}, {"replicas": 0, "requests": {"cpu": "1"}}],
        [("custompodresources[0]", 1, res(cpu=1))],
        id="default-replicas-and-zero",
    ),
]


@pytest.mark.parametrize(("custom", "want"), CUSTOM_CASES)
def test_pod_sets_from_custom(
    custom: list[dict[str, Any]], want: list[tuple[str, int, Resources]]
) -> None:
    assert counts(pod_sets_from_custom(custom)) == want


def test_custom_malformed_names_entry() -> None:
    with pytest.raises(QuantityError, match=r"custompodresources\[1\]: cpu"):
        pod_sets_from_custom([{"requests": {"cpu": "1"}}, {"requests": {"cpu": "lots"}}])


LABELS = {"workload.codeflare.dev/appwrapper": "aw1", "workload.codeflare.dev/namespace": "ns"}


def pod_template_labels(template: dict[str, Any], *path: Any) -> dict[str, str]:
    node: Any = template
    for step in path:
        node = node[step]
    return dict(node["metadata"]["labels"])


INJECT_CASES: list[Any] = [
    pytest.param(pod("p"), [()], id="pod"),
    pytest.param(deployment("web"), [("spec", "template")], id="deployment"),
    pytest.param(deployment("db", kind="StatefulSet"), [("spec", "template")], id="statefulset"),
    pytest.param(deployment("rs", kind="ReplicaSet"), [("spec", "template")], id="replicaset"),
    pytest.param(
        obj("DaemonSet", "ds", api_version="apps/v1", spec={"template": pod_template()}),
        [("spec", "template")],
        id="daemonset",
    ),
    pytest.param(job("j"), [("spec", "template")], id="job"),
    pytest.param(
        ray_cluster("glue", None, worker_group("a"), worker_group("b")),
        [
            ("spec", "headGroupSpec", "template"),
            ("spec", "workerGroupSpecs", 0, "template"),
            ("spec", "workerGroupSpecs", 1, "template"),
        ],
        id="raycluster",
    ),
    pytest.param(
        ray_job("rj", None, worker_group("a")),
        [
            ("spec", "rayClusterSpec", "headGroupSpec", "template"),
            ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template"),
        ],
        id="rayjob",
    ),
    pytest.param(
        pytorch_job("pt"),
        [
            ("spec", "pytorchReplicaSpecs", "Master", "template"),
            ("spec", "pytorchReplicaSpecs", "Worker", "template"),
        ],
        id="pytorchjob",
    ),
    pytest.param(obj("Service", "svc"), [], id="service-object-only"),
]


@pytest.mark.parametrize(("template", "pod_template_paths"), INJECT_CASES)
def test_inject_labels(template: dict[str, Any], pod_template_paths: list[tuple[Any, ...]]) -> None:
    before = copy.deepcopy(template)
    labelled = inject_labels(template, LABELS)
    assert template == before, "the input must not be mutated"
    assert pod_template_labels(labelled).items() >= LABELS.items()
    for path in pod_template_paths:
        assert pod_template_labels(labelled, *path).items() >= LABELS.items(), path


def test_inject_labels_keeps_selector_and_other_labels() -> None:
    template = deployment("web")
    template["metadata"]["labels"] = {"team": "ml", "workload.codeflare.dev/appwrapper": "old"}
    labelled = inject_labels(template, LABELS)
    assert labelled["spec"]["selector"] == {"matchLabels": {"app": "web"}}
    assert labelled["spec"]["template"]["metadata"]["labels"] == {"app": "web", **LABELS}
    assert labelled["metadata"]["labels"] == {"team": "ml", **LABELS}
    assert template["metadata"]["labels"]["workload.codeflare.dev/appwrapper"] == "old"


def test_inject_labels_creates_missing_metadata() -> None:
    template = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": None}}
    assert inject_labels(template, LABELS)["metadata"]["labels"] == LABELS
    bare_template = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {}}}}
    labelled = inject_labels(bare_template, LABELS)
    assert labelled["spec"]["template"]["metadata"]["labels"] == LABELS
    assert "metadata" not in bare_template["spec"]["template"]
