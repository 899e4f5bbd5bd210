"""What the simulation benchmarks (backfill_bench, fairness_bench, limits_bench) build alike:
GPU nodes, one-pod-set workloads and GPU queues in the core's terms. No I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.api.resources import Resources
from dispatcher.core.model import NodeSnapshot, PodSet, QueueMode, Workload
from dispatcher.core.quota.model import (
    FlavorQuotas,
    QueueSpec,
    Quota,
    ResourceGroup,
    Selector,
)

GPU = "nvidia.com/gpu"
MILLI = 1000
FLAVOR = "default-flavor"


def gpu_nodes(used: Mapping[str, int], per_node: int) -> tuple[NodeSnapshot, ...]:
    """A node of `per_node` GPUs per name in `used`, with that many GPUs requested on it."""
    return tuple(
        NodeSnapshot(
            name=name,
            allocatable=Resources({GPU: per_node * MILLI}),
            requested=Resources({GPU: gpus * MILLI}),
        )
        for name, gpus in used.items()
    )


def gpu_workload(key: str, arrival: float, pods: int, gpus: int, **fields: Any) -> Workload:
    """`pods` pods of `gpus` GPUs each, arriving (and queued) at `arrival`, priority 0."""
    pod_set = PodSet(count=pods, requests=Resources({GPU: gpus * MILLI}), name="pods")
    return Workload(
        key=key,
        priority=0,
        created_at=arrival,
        pod_sets=(pod_set,),
        queued_since=arrival,
        **fields,
    )


def gpu_queue(name: str, gpus: int, **fields: Any) -> QueueSpec:
    """A BestEffortFIFO cluster queue of `gpus` GPUs in FLAVOR, admitting every namespace."""
    quotas = {GPU: Quota(gpus * MILLI)}
    return QueueSpec(
        name=name,
        groups=(ResourceGroup((GPU,), (FlavorQuotas(FLAVOR, quotas),)),),
        namespaces=Selector(),
        strategy=QueueMode.BEST_EFFORT_FIFO,
        **fields,
    )
