"""The list+watch cache against the real API server: a relist in pages sees everything."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
from typing import Any

from dispatcher.kube.client import TLS_READ_BUFFER, KubeClient, ResourceInfo
from dispatcher.kube.informer import Informer
from testenv.waits import async_wait_until

CONFIGMAPS = ResourceInfo("v1", "ConfigMap", "configmaps", namespaced=True)


async def test_relist_in_pages_keeps_every_object_and_then_watches(
    cluster: Any, namespace: str
) -> None:
    client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig))
    try:
        for index in range(7):
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"cm-{index}", "labels": {"informer-test": namespace}},
                "data": {"index": str(index)},
            }
            await client.create(CONFIGMAPS, namespace, body)
        # Pages of 3 over 7 objects: the server hands out continue tokens twice.
        informer = Informer(
            client, CONFIGMAPS, label_selector=f"informer-test={namespace}", page_size=3
        )
        seen: list[str] = []
        informer.add_handler(lambda kind, old, new: seen.append(kind))
        task = asyncio.create_task(informer.run())
        try:
            await asyncio.wait_for(informer.synced.wait(), 30)
            assert sorted(informer.store) == [f"{namespace}/cm-{i}" for i in range(7)]
            assert informer.relists == 1
            assert seen == ["ADDED"] * 7
            assert informer.store[f"{namespace}/cm-4"]["kind"] == "ConfigMap"

            await client.delete(CONFIGMAPS, namespace, "cm-0")

            async def gone() -> bool:
                return f"{namespace}/cm-0" not in informer.store

            await async_wait_until(gone, timeout=30, what="the watch shows the deletion")
            assert seen[-1] == "DELETED"
        finally:
            task.cancel()
    finally:
        await client.close()


async def test_answers_larger_than_the_tls_read_buffer_arrive_whole(
    cluster: Any, namespace: str
) -> None:
    client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig))
    try:
        assert asyncio.sslproto.SSLProtocol.max_size <= TLS_READ_BUFFER
        filler = "x" * 40_000
        for index in range(5):
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"big-{index}"},
                "data": {"filler": filler, "index": str(index)},
            }
            await client.create(CONFIGMAPS, namespace, body)
        listing = await client.list(CONFIGMAPS, namespace)
        big = [i for i in listing["items"] if i["metadata"]["name"].startswith("big-")]
        assert len(big) == 5
        assert all(i["data"]["filler"] == filler for i in big)
    finally:
        await client.close()
