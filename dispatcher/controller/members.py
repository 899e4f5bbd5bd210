"""Member clusters: a client, node and pod watch caches, and capacity accounting for each.

Side effects: holds connections to member API servers; `run` watches them until cancelled.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from dispatcher.capacity.cache import CapacityCache, slim_pod
from dispatcher.config import MemberConfig
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.informer import Informer

NODES = ResourceInfo("v1", "Node", "nodes", namespaced=False)
PODS = ResourceInfo("v1", "Pod", "pods", namespaced=True)


def _slim_node(node: dict[str, object]) -> dict[str, object]:
    # Images and volumes lists on real nodes are large and never read here.
    status = dict(node.get("status") or {})  # type: ignore[call-overload]
    for key in ("images", "volumesInUse", "volumesAttached", "nodeInfo", "daemonEndpoints"):
        status.pop(key, None)
    return {**node, "status": status}


@dataclass
class Member:
    name: str
    client: KubeClient
    is_hub: bool
    capacity: CapacityCache
    nodes: Informer = field(init=False)
    pods: Informer = field(init=False)

    def __post_init__(self) -> None:
        self.nodes = Informer(self.client, NODES, transform=_slim_node)
        self.pods = Informer(self.client, PODS, transform=slim_pod)
        self.nodes.add_handler(self.capacity.on_node)
        self.pods.add_handler(self.capacity.on_pod)

    @classmethod
    def build(cls, config: MemberConfig, client: KubeClient, *, is_hub: bool) -> Member:
        capacity = CapacityCache(
            cluster=config.name,
            labels=dict(config.labels),
            node_selector=dict(config.node_selector),
        )
        return cls(name=config.name, client=client, is_hub=is_hub, capacity=capacity)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self.nodes.run(), name=f"{self.name}-nodes")
            group.create_task(self.pods.run(), name=f"{self.name}-pods")

    async def wait_synced(self) -> None:
        await self.nodes.synced.wait()
        await self.pods.synced.wait()

    def reachable(self, *, timeout: float) -> bool:
        """Healthy watches, or a silence shorter than `timeout` (a brief blip is not an outage)."""
        if self.nodes.healthy and self.pods.healthy:
            return True
        last = min(self.nodes.last_contact, self.pods.last_contact)
        return last > 0 and time.monotonic() - last < timeout
