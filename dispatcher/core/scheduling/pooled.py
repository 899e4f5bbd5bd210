"""Cluster-total fit, MCAD's accounting, offered as a setting (`fit: cluster_total`).

MCAD dispatches an AppWrapper when a cluster's free resources add up to what it asks, whether
or not any node could hold one of its pods; kube-scheduler then leaves such pods Pending until
the AppWrapper is requeued for being slow. The dispatcher's own rule is per-node fit (every pod
has a node). To decide MCAD's way with the same cycle, each member is seen as one node holding
all its schedulable nodes have, and pods as going anywhere (node selectors and tolerations,
which MCAD ignores as well, set aside).
"""

from __future__ import annotations

from dataclasses import replace

from dispatcher.api.resources import EMPTY, Resources
from dispatcher.core.model import PODS, ClusterSnapshot, NodeSnapshot, PodSet, Workload

POOL = "(cluster total)"
"""The one node a member is seen as."""


def pooled(cluster: ClusterSnapshot) -> ClusterSnapshot:
    """`cluster` as one node: what its schedulable nodes have and have given, added up. The
    node count of pods is not bounded (MCAD does not count pods per node)."""
    nodes = [n for n in cluster.nodes if n.schedulable]
    allocatable = _without_pods(sum((n.allocatable for n in nodes), EMPTY))
    requested = _without_pods(sum((n.requested for n in nodes), EMPTY))
    pool = NodeSnapshot(name=POOL, allocatable=allocatable, requested=requested)
    return replace(
        cluster,
        nodes=(pool,),
        reservations=tuple(
            replace(r, pod_sets=_anywhere(r.pod_sets)) for r in cluster.reservations
        ),
        admitted=tuple(
            replace(a, usage=((POOL, sum((u for _, u in a.usage), EMPTY)),) if a.usage else ())
            for a in cluster.admitted
        ),
    )


def anywhere(workload: Workload) -> Workload:
    """`workload` with its pods free to go to any node."""
    return replace(workload, pod_sets=_anywhere(workload.pod_sets))


def _anywhere(pod_sets: tuple[PodSet, ...]) -> tuple[PodSet, ...]:
    return tuple(replace(p, node_selector=(), tolerations=()) for p in pod_sets)


def _without_pods(resources: Resources) -> Resources:
    return Resources({k: v for k, v in resources.items() if k != PODS})
