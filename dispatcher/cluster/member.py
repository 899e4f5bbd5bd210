"""Member clusters: a client, node and pod watch caches, and capacity accounting for each.

Side effects: holds connections to member API servers; `run` watches them until cancelled.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from dispatcher.api.constants import FIELD_MANAGER, LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.clock import Clock, SystemClock
from dispatcher.cluster.capacity import TERMINAL_PHASES, CapacityCache, slim_metadata, slim_pod
from dispatcher.config import MemberConfig
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError
from dispatcher.kube.informer import Informer

NODES = ResourceInfo("v1", "Node", "nodes", namespaced=False)
PODS = ResourceInfo("v1", "Pod", "pods", namespaced=True)


def _slim_node(node: dict[str, object]) -> dict[str, object]:
    # Images and volumes lists on real nodes are large and never read here.
    status = dict(node.get("status") or {})  # type: ignore[call-overload]
    for key in ("images", "volumesInUse", "volumesAttached", "nodeInfo", "daemonEndpoints"):
        status.pop(key, None)
    return {**node, "status": status}


def _slim_wrapped(obj: dict[str, Any]) -> dict[str, Any]:
    """What reading a wrapped object's completion needs: who owns it, whether the dispatcher
    made it (its own managedFields entry, not a look-alike's), and its conditions."""
    meta = obj.get("metadata") or {}
    ours = [
        {"manager": FIELD_MANAGER}
        for entry in meta.get("managedFields") or []
        if entry.get("manager") == FIELD_MANAGER
    ][:1]
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            **slim_metadata(meta, (LABEL_NAME, LABEL_NAMESPACE, LABEL_UID)),
            "managedFields": ours,
        },
        "status": {"conditions": (obj.get("status") or {}).get("conditions") or []},
    }


def _finished_pod(pod: dict[str, Any]) -> bool:
    # A finished pod's store entry is read again only when it is deleted.
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


@dataclass
class Member:
    name: str
    client: KubeApi
    is_hub: bool
    capacity: CapacityCache
    clock: Clock = field(default_factory=SystemClock)
    nodes: Informer = field(init=False)
    pods: Informer = field(init=False)
    last_answer: float = 0.0  # monotonic time of the last successful probe
    started: float = 0.0  # monotonic time `run` began (silence before the first sync)
    wrapped: dict[str, Informer] = field(default_factory=dict)
    """"apiVersion/kind" -> watch cache of our wrapped objects of that kind that report
    completion (e.g. Jobs): read from here instead of one GET per object."""

    def __post_init__(self) -> None:
        steady = self.clock.monotonic
        self.nodes = Informer(self.client, NODES, transform=_slim_node, monotonic=steady)
        self.pods = Informer(
            self.client, PODS, transform=slim_pod, cold=_finished_pod, monotonic=steady
        )
        self.nodes.add_handler(self.capacity.on_node)
        self.pods.add_handler(self.capacity.on_pod)

    @classmethod
    def build(
        cls, config: MemberConfig, client: KubeApi, *, is_hub: bool, clock: Clock | None = None
    ) -> Member:
        capacity = CapacityCache(
            cluster=config.name,
            labels=dict(config.labels),
            node_selector=dict(config.node_selector),
        )
        return cls(
            name=config.name,
            client=client,
            is_hub=is_hub,
            capacity=capacity,
            clock=clock or SystemClock(),
        )

    async def run(self) -> None:
        if not self.started:
            self.started = self.clock.monotonic()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.nodes.run(), name=f"{self.name}-nodes")
            group.create_task(self.pods.run(), name=f"{self.name}-pods")
            group.create_task(self._probe(), name=f"{self.name}-probe")

    def wrapped_informer(self, info: ResourceInfo) -> tuple[Informer, bool]:
        """The watch cache for wrapped objects of `info`'s kind, and whether it is new (the
        caller starts it). Only objects carrying our uid label are listed and watched."""
        key = f"{info.group_version}/{info.kind}"
        existing = self.wrapped.get(key)
        if existing is not None:
            return existing, False
        informer = Informer(
            self.client,
            info,
            label_selector=LABEL_UID,
            transform=_slim_wrapped,
            # Read only to learn completion, once an AppWrapper's pods have all finished.
            cold=lambda _obj: True,
            optional=True,
            monotonic=self.clock.monotonic,
        )
        self.wrapped[key] = informer
        return informer, True

    async def _probe(self, every: float = 2.0) -> None:
        """A watch on a server that stopped answering can stay silent for minutes; a short
        request every few seconds tells an outage from a quiet cluster."""
        while True:
            try:
                await self.client.ping(timeout=every * 2)
                self.last_answer = self.clock.monotonic()
            except KubeError:
                pass
            await asyncio.sleep(every)

    async def wait_synced(self) -> None:
        await self.nodes.synced.wait()
        await self.pods.synced.wait()

    @property
    def synced(self) -> bool:
        """Whether its node and pod caches have been listed in full at least once."""
        return self.nodes.synced.is_set() and self.pods.synced.is_set()

    def silent_for(self) -> float:
        """Seconds since the member last answered (0 while it answers). Until its caches
        have synced, since it was started: one that never answers, or forbids the lists,
        is handled like one gone silent."""
        if not self.synced:
            return max(0.0, self.clock.monotonic() - self.started) if self.started else 0.0
        last = max(self.last_answer, min(self.nodes.last_contact, self.pods.last_contact))
        if last == 0:
            return 0.0
        return max(0.0, self.clock.monotonic() - last)

    def reachable(self, *, grace: float = 6.0) -> bool:
        """Synced and answering within `grace` seconds: only such a member gets new
        dispatches (never one whose pods are not all known)."""
        return self.synced and self.silent_for() < grace
