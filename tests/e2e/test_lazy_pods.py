"""Real pods' watch events, read lazily (`kube/lazyjson.py`, `slim_pod_lazy`), give what the
whole decode and `slim_pod` give (tests/unit/test_lazy_pods.py: the same over generated
shapes)."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.api.constants import LABEL_NAME, LABEL_UID
from dispatcher.cluster.capacity import slim_pod, slim_pod_lazy
from dispatcher.cluster.member import PODS
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.jsoncodec import decode
from dispatcher.kube.lazyjson import LazyEvents
from testenv.waits import async_wait_until

RUNTIME_CLASSES = ResourceInfo("node.k8s.io/v1", "RuntimeClass", "runtimeclasses", namespaced=False)


def pod(name: str, node_selector: dict[str, str], **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "250m"}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_NAME: "aw", LABEL_UID: "u1", "app": "x"}},
        "spec": {
            "containers": [container],
            "nodeSelector": node_selector,
            "tolerations": [{"operator": "Exists"}],
            **spec,
        },
    }


async def test_real_pod_events_read_lazily_equal_the_whole_decode(
    cluster: Any, namespace: str, fake_nodes: Any
) -> None:
    fake_nodes.add("n")
    client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig))
    runtime_class = f"{namespace}-overhead"[:63]
    lines: list[bytes] = []
    events: list[dict[str, Any]] = []

    def keep(line: bytes) -> Any:
        lines.append(line)
        return decode(line)

    async def watch(version: str) -> None:
        async for event in client.watch(
            PODS, resource_version=version, namespace=namespace, decode_line=keep
        ):
            events.append(event)

    def seen(name: str, test: Any) -> bool:
        changes = (e for e in events if e["type"] != "BOOKMARK")
        return any(e["object"]["metadata"]["name"] == name and test(e) for e in changes)

    await client.create(
        RUNTIME_CLASSES,
        None,
        {"metadata": {"name": runtime_class}, "handler": "runc",
         "overhead": {"podFixed": {"cpu": "50m", "memory": "16Mi"}}},
    )  # fmt: skip
    listing = await client.list(PODS, namespace)
    task = asyncio.create_task(watch(listing["metadata"]["resourceVersion"]))
    try:
        here = fake_nodes.pool
        sidecar = {"name": "s", "image": "busybox", "restartPolicy": "Always",
                   "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "1"}}}  # fmt: skip
        init = {"name": "i", "image": "busybox", "resources": {"requests": {"memory": "1Gi"}}}
        await client.create(PODS, namespace, pod("plain", here))
        await client.create(
            PODS,
            namespace,
            pod("rich", here, initContainers=[init, sidecar], runtimeClassName=runtime_class),
        )
        await client.create(PODS, namespace, pod("nowhere", {"no": "such-node"}))
        held = pod("held", here)
        held["metadata"]["finalizers"] = ["example.com/hold"]
        await client.create(PODS, namespace, held)

        async def running() -> bool:
            return all(
                seen(n, lambda e: e["object"]["status"].get("phase") == "Running")
                for n in ("plain", "rich", "held")
            )

        await async_wait_until(running, timeout=60, what="KWOK runs the pods")
        await client.delete(PODS, namespace, "held")
        await client.merge_patch(
            PODS, namespace, "nowhere", {"status": {"phase": "Succeeded"}}, sub="status"
        )

        async def ended() -> bool:
            terminating = seen("held", lambda e: e["object"]["metadata"].get("deletionTimestamp"))
            done = seen("nowhere", lambda e: e["object"]["status"].get("phase") == "Succeeded")
            return terminating and done

        await async_wait_until(ended, timeout=60, what="a pod terminating and one finished")
        await client.merge_patch(PODS, namespace, "held", {"metadata": {"finalizers": None}})

        async def deleted() -> bool:
            return seen("held", lambda e: e["type"] == "DELETED")

        await async_wait_until(deleted, timeout=60, what="the held pod deleted")
    finally:
        task.cancel()
        await client.delete(RUNTIME_CLASSES, None, runtime_class)
        await client.close()

    lazily = LazyEvents(slim_pod_lazy)
    kinds = set()
    for line in list(lines):
        event = decode(line)
        kinds.add(event["type"])
        if event["type"] == "BOOKMARK":
            assert lazily(line) is None  # left to the whole decode
        else:
            assert lazily(line) == (event["type"], slim_pod(event["object"])), line[:200]
    assert kinds >= {"ADDED", "MODIFIED", "DELETED"}
    rich = next(e["object"] for e in events if e["object"]["metadata"]["name"] == "rich")
    kept = slim_pod(rich)["spec"]
    assert kept["overhead"] == {"cpu": "50m", "memory": "16Mi"}  # what the admission set
    assert kept["initContainers"][1]["restartPolicy"] == "Always"
