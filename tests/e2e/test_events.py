"""Events against the real API server: a repeat is one Event with its count patched, and the
message limit the docs state is the API server's truth for core/v1 Events."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.kube.client import KubeClient
from dispatcher.kube.events import CUT, EVENTS, MESSAGE_LIMIT, EventRecorder
from testenv.localcluster import ExistingCluster, LocalCluster


def _about(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": "told", "namespace": namespace, "uid": "u-told"},
    }


async def _posted(recorder: EventRecorder) -> None:
    task = asyncio.create_task(recorder.run(workers=2))
    try:
        await recorder.flush(10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_repeats_are_one_event_and_long_messages_are_cut_with_a_pointer(
    cluster: LocalCluster | ExistingCluster, namespace: str
) -> None:
    client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), name="test")
    try:
        now = [1_000_000.0]
        recorder = EventRecorder(client, clock=lambda: now[0])
        recorder.record(_about(namespace), reason="Queued", message="queued with priority 0")
        recorder.record(_about(namespace), reason="Queued", message="queued with priority 0")
        await _posted(recorder)
        now[0] += 60
        recorder.record(_about(namespace), reason="Queued", message="queued with priority 0")
        recorder.record(_about(namespace), reason="Long", message="x" * 5000)
        await _posted(recorder)
        items = (await client.list(EVENTS, namespace))["items"]
        by_reason = {e["reason"]: e for e in items}
        assert sorted(e["reason"] for e in items) == ["Long", "Queued"]
        assert by_reason["Queued"]["count"] == 3
        assert by_reason["Queued"]["firstTimestamp"] != by_reason["Queued"]["lastTimestamp"]
        assert (recorder.created, recorder.patched) == (2, 1)
        long = by_reason["Long"]["message"]
        assert len(long) == MESSAGE_LIMIT
        assert long.endswith(CUT)

        # The API server itself takes a core/v1 Event (no eventTime) of any message length:
        # the 1,024 limit is the dispatcher's choice, not the server's.
        body = {**by_reason["Long"], "message": "y" * 8000}
        body["metadata"] = {"name": "told.long", "namespace": namespace}
        created = await client.create(EVENTS, namespace, body)
        assert len(created["message"]) == 8000
    finally:
        await client.close()
