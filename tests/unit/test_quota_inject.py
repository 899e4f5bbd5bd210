"""What a chosen flavor does to the wrapped objects: its node labels and tolerations go
into every pod template that requests a resource of its group, in every kind; and which
label names an AppWrapper's queue."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.model import Taint, Toleration
from dispatcher.core.podsets import infer_pod_sets, inject_flavors, pod_templates
from dispatcher.core.quota.flavors import flavored
from dispatcher.core.workloads import queue_name_of
from tests.unit.builders import (
    GPU,
    container,
    deployment,
    pod,
    pod_spec,
    pytorch_job,
    ray_cluster,
    ray_job,
    worker_group,
)
from tests.unit.quota_builders import flavor

SPOT = flavor(
    "spot",
    {"tier": "spot"},
    taints=[Taint("spot", "true")],
    tolerations=[Toleration("spot", "Equal", "true", "NoSchedule")],
)
A100 = flavor("a100", {"gpu": "a100"})


def cpu_only() -> dict[str, Any]:
    return pod_spec(container(requests={"cpu": "1"}))


def with_gpu() -> dict[str, Any]:
    return pod_spec(container(requests={"cpu": "1"}, limits={GPU: "1"}))


def specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [t["spec"] for t in pod_templates(obj)]


@pytest.mark.parametrize(
    "obj",
    [
        pod("p", with_gpu()),
        deployment("d", with_gpu()),
        deployment("s", with_gpu(), kind="StatefulSet"),
        ray_job("rj", with_gpu(), worker_group("w", with_gpu())),
        pytorch_job("pt", with_gpu(), with_gpu()),
    ],
    ids=["Pod", "Deployment", "StatefulSet", "RayJob", "PyTorchJob"],
)
def test_every_pod_template_of_every_kind_gets_the_flavor(obj: dict[str, Any]) -> None:
    inject_flavors(obj, [(SPOT, ("cpu", GPU))])
    found = specs(obj)
    assert found
    for spec in found:
        assert spec["nodeSelector"] == {"tier": "spot"}
        assert spec["tolerations"] == [
            {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ]


def test_a_gpu_flavor_goes_to_the_gpu_workers_not_the_cpu_head() -> None:
    cluster = ray_cluster("rc", cpu_only(), worker_group("gpu", with_gpu(), replicas=2))
    # The cycle fitted the pods by the same rule: flavored pod sets select the same nodes.
    pod_sets = flavored(infer_pod_sets(cluster), [("a100", (GPU,))], {"a100": A100})
    inject_flavors(cluster, [(A100, (GPU,))])
    head, workers = specs(cluster)
    assert "nodeSelector" not in head
    assert workers["nodeSelector"] == {"gpu": "a100"}
    assert [dict(p.node_selector) for p in pod_sets] == [{}, {"gpu": "a100"}]


def test_injection_keeps_what_the_template_had_and_adds_a_toleration_once() -> None:
    spec = pod_spec(
        container(requests={"cpu": "1"}),
        node_selector={"zone": "a"},
        tolerations=[{"key": "spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    )
    obj = deployment("d", spec)
    inject_flavors(obj, [(SPOT, ("cpu",))])
    inject_flavors(obj, [(SPOT, ("cpu",))])
    (found,) = specs(obj)
    assert found["nodeSelector"] == {"zone": "a", "tier": "spot"}
    assert len(found["tolerations"]) == 1


def test_the_queue_label_is_ours_else_kueues() -> None:
    assert queue_name_of({"workload.codeflare.dev/queue-name": "a"}) == "a"
    assert queue_name_of({"kueue.x-k8s.io/queue-name": "user-queue"}) == "user-queue"
    both = {"workload.codeflare.dev/queue-name": "a", "kueue.x-k8s.io/queue-name": "b"}
    assert queue_name_of(both) == "a"
    assert queue_name_of({}) == ""
