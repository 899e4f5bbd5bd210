"""A small provisioner for tests and the demo: what the cluster autoscaler does with a
ProvisioningRequest, on a cluster with no cloud behind it.

It reads the ProvisioningRequests of one namespace on the real API server (a list every
`period` seconds), and for each one it has not answered yet:

- `provision` (the default): after `delay` seconds, one KWOK node per pod of every pod set,
  sized from the pod set's PodTemplate (its requests, node selector labels) and labelled
  with `labels` (a test's node pool), all made before any is reported; once every node is
  Ready, `Accepted` and `Provisioned`. All or none: a node that cannot be made removes the
  ones made and the request is `Failed`;
- `refuse`: `Failed` (as a stockout would be reported);
- `expire`: `Provisioned` and `BookingExpired` in one write, and no node made: a booking
  that ran out before the dispatcher looked (its nodes already scaled down again);
- `revoke`: provisioned, then `expire_after` seconds later its nodes removed and
  `CapacityRevoked`;
- `squat`: as `provision`, but before the nodes are reported a pod of other work (not an
  AppWrapper's) is bound to the last node made and fills it: kube-scheduler placing someone
  else's pod on the new nodes before the gang is placed. `squatters` names those pods.

`mode` may be changed while it runs (a test refuses the first attempts, then provisions);
with `then`, the first request is answered in `mode` and every later one in `then` (no race
between a test switching the mode and the dispatcher's next request).
Nodes it made are deleted by `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from dispatcher.api.quantity import parse_milli
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import AlreadyExists, KubeError, NotFound
from testenv.kubectl import node_manifest

REQUESTS = ResourceInfo(
    "autoscaling.x-k8s.io/v1", "ProvisioningRequest", "provisioningrequests", True
)
TEMPLATES = ResourceInfo("v1", "PodTemplate", "podtemplates", True)
NODES = ResourceInfo("v1", "Node", "nodes", False)
PODS = ResourceInfo("v1", "Pod", "pods", True)
Mode = Literal["provision", "refuse", "expire", "revoke", "squat"]


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _node_size(requests: Mapping[str, str]) -> dict[str, Any]:
    """node_manifest's knobs for a node that holds exactly one such pod (and no more)."""
    cpu = requests.get("cpu", "100m")
    memory = requests.get("memory", "64Mi")
    gpu = requests.get("nvidia.com/gpu")
    extra = {k: v for k, v in requests.items() if k not in ("cpu", "memory", "nvidia.com/gpu")}
    return {
        "cpu": cpu,
        "memory": memory,
        "gpu": int(parse_milli(gpu) // 1000) if gpu else 0,
        "pods": 110,
        "extra": extra,
    }


class TestProvisioner:
    __test__ = False  # not a pytest class

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        *,
        labels: Mapping[str, str],
        mode: Mode = "provision",
        then: Mode | None = None,
        delay: float = 0.0,
        expire_after: float = 1.0,
        period: float = 0.1,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.labels = dict(labels)
        self.mode: Mode = mode
        self._then = then
        self.delay = delay
        self.expire_after = expire_after
        self.period = period
        self.answered: dict[str, str] = {}
        """Request name -> what it was answered (Provisioned, Failed, BookingExpired...)."""
        self.nodes: dict[str, list[str]] = {}
        """Request name -> the nodes made for it."""
        self.provisioned_in: dict[str, float] = {}
        """Request name -> seconds from first seeing it to reporting it Provisioned."""
        self.squatters: dict[str, str] = {}
        """Request name -> the pod put on one of its nodes (`squat`)."""
        self._client: KubeClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._later: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> TestProvisioner:
        self._client = await KubeClient.connect(kubeconfig=str(self.kubeconfig))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="provisioner")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        for task in (self._task, *self._later):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._later.clear()
        self._task = None
        client = self._client
        if client is None:
            return
        for names in self.nodes.values():
            for name in names:
                with contextlib.suppress(KubeError):
                    await client.delete(NODES, None, name)
        await client.close()
        self._client = None

    @property
    def client(self) -> KubeClient:
        assert self._client is not None, "use `async with TestProvisioner(...)`"
        return self._client

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(KubeError):
                listed = await self.client.list(REQUESTS, self.namespace)
                for request in listed.get("items") or []:
                    name = request["metadata"]["name"]
                    if name not in self.answered:
                        self.answered[name] = "Accepted"
                        self._spawn(self._answer(request))
            await asyncio.sleep(self.period)  # a provisioner's loop period, not a wait for a state

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._later.add(task)
        task.add_done_callback(self._later.discard)

    async def _answer(self, request: dict[str, Any]) -> None:
        name = request["metadata"]["name"]
        seen = time.monotonic()
        await self._condition(name, "Accepted", "Accepted", "the test provisioner took it")
        if self.delay:
            await asyncio.sleep(self.delay)  # the provisioner's own time (a scale-up)
        mode = self.mode
        if self._then is not None:
            self.mode, self._then = self._then, None
        if mode == "refuse":
            await self._condition(name, "Failed", "NoCapacity", "test provisioner: refused")
            self.answered[name] = "Failed"
            return
        if mode == "expire":
            await self._condition(name, "Provisioned", "Provisioned", "booked", "BookingExpired")
            self.answered[name] = "BookingExpired"
            return
        try:
            made = await self._make_nodes(request)
        except KubeError as exc:
            await self._condition(name, "Failed", "ScaleUpFailed", f"test provisioner: {exc}")
            self.answered[name] = "Failed"
            return
        self.nodes[name] = made
        if mode == "squat" and made:
            self.squatters[name] = await self._squat(made[-1])
        await self._wait_ready(made)
        if name in self.squatters:
            await self._wait_running(self.squatters[name])
        await self._condition(name, "Provisioned", "Provisioned", f"{len(made)} nodes added")
        self.answered[name] = "Provisioned"
        self.provisioned_in[name] = time.monotonic() - seen
        if mode == "revoke":
            await asyncio.sleep(self.expire_after)  # the booking's lifetime
            await self._drain_and_remove(made)  # taken back, as spot capacity is
            await self._condition(name, "CapacityRevoked", "Revoked", "test provisioner: revoked")
            self.answered[name] = "CapacityRevoked"

    async def _squat(self, node: str) -> str:
        """A pod of no AppWrapper bound to `node`, asking for all of its cpu and GPUs."""
        allocatable = (await self.client.get(NODES, None, node)).get("status", {}).get(
            "allocatable"
        ) or {}
        asked = {k: v for k, v in allocatable.items() if k in ("cpu", "nvidia.com/gpu")}
        limits = {k: v for k, v in asked.items() if k != "cpu"}
        name = f"squatter-{node}"[:63].rstrip("-")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "nodeName": node,
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "squatter",
                        "image": "squatter",
                        "resources": {"requests": asked, "limits": limits},
                    }
                ],
            },
        }
        with contextlib.suppress(AlreadyExists):
            await self.client.create(PODS, self.namespace, pod)
        return name

    async def _wait_running(self, pod: str) -> None:
        while True:
            with contextlib.suppress(NotFound):
                found = await self.client.get(PODS, self.namespace, pod)
                if (found.get("status") or {}).get("phase") == "Running":
                    return
            await asyncio.sleep(0.05)  # polling KWOK's pod stages

    async def _drain_and_remove(self, nodes: list[str]) -> None:
        """Delete the pods on `nodes` (KWOK ends them while it still manages the node), then
        the nodes: a reclaimed node's pods go with it. Cordoned first, so that no pod made
        to replace one lands there meanwhile."""
        for node in nodes:
            with contextlib.suppress(KubeError):
                await self.client.merge_patch(NODES, None, node, {"spec": {"unschedulable": True}})
        for node in nodes:
            with contextlib.suppress(KubeError):
                listed = await self.client.list(
                    PODS, None, query={"fieldSelector": f"spec.nodeName={node}"}
                )
                for pod in listed.get("items") or []:
                    meta = pod["metadata"]
                    with contextlib.suppress(KubeError):
                        await self.client.delete(PODS, meta["namespace"], meta["name"])
        for node in nodes:
            with contextlib.suppress(KubeError):
                await self.client.delete(NODES, None, node)

    async def _make_nodes(self, request: dict[str, Any]) -> list[str]:
        """One node per pod, all of them or none."""
        made: list[str] = []
        base = request["metadata"]["name"][-40:].strip("-")
        try:
            for index, pod_set in enumerate(request["spec"]["podSets"]):
                template = await self.client.get(
                    TEMPLATES, self.namespace, pod_set["podTemplateRef"]["name"]
                )
                spec = template["template"]["spec"]
                requests: dict[str, str] = {}
                for container in spec.get("containers") or []:
                    for key, value in (
                        (container.get("resources") or {}).get("requests") or {}
                    ).items():
                        requests[key] = str(value)
                selector = dict(spec.get("nodeSelector") or {})
                for pod in range(int(pod_set["count"])):
                    node = f"{base}-{index}-{pod}"
                    manifest = node_manifest(
                        node, labels={**selector, **self.labels}, **_node_size(requests)
                    )
                    with contextlib.suppress(AlreadyExists):
                        await self.client.create(NODES, None, manifest)
                    made.append(node)
        except KubeError:
            for node in made:
                with contextlib.suppress(KubeError):
                    await self.client.delete(NODES, None, node)
            raise
        return made

    async def _wait_ready(self, names: list[str]) -> None:
        pending = set(names)
        while pending:
            for name in list(pending):
                with contextlib.suppress(NotFound):
                    node = await self.client.get(NODES, None, name)
                    conditions = (node.get("status") or {}).get("conditions") or []
                    taints = (node.get("spec") or {}).get("taints") or []
                    ready = any(
                        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
                    )
                    if ready and not any("not-ready" in t.get("key", "") for t in taints):
                        pending.discard(name)
            if pending:
                await asyncio.sleep(0.05)  # polling KWOK's node stages

    async def _condition(self, name: str, kind: str, reason: str, message: str, *more: str) -> None:
        """Set condition `kind` (and each of `more`, with its own name as reason) True."""
        kinds = (kind, *more)
        with contextlib.suppress(NotFound):
            current = await self.client.get(REQUESTS, self.namespace, name)
            conditions = [
                c
                for c in (current.get("status") or {}).get("conditions") or []
                if c["type"] not in kinds
            ]
            conditions += [
                {
                    "type": k,
                    "status": "True",
                    "reason": reason if k == kind else k,
                    "message": message,
                    "lastTransitionTime": _stamp(),
                }
                for k in kinds
            ]
            await self.client.merge_patch(
                REQUESTS, self.namespace, name, {"status": {"conditions": conditions}}, "status"
            )
