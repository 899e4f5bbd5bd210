"""Protected runtime and notice before preemption, on the real control plane: a victim is not
preempted before its minimum runtime, and a victim given notice keeps its objects until its
deadline (docs/scheduling.md, "Protected runtime and notice")."""

from __future__ import annotations

import time
from typing import Any

import pytest

from testenv.waits import async_holds_for
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    conditions,
    deployment,
    get_aw,
    job,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]

GPU = {"cpu": "1", "nvidia.com/gpu": "1"}


def _low(name: str, **annotations: str) -> dict[str, Any]:
    aw = appwrapper(name, deployment(name, 1, GPU), priority=1)
    if annotations:
        aw["metadata"]["annotations"] = annotations
    return aw


def _high(name: str) -> dict[str, Any]:
    return appwrapper(name, job(name, 1, GPU), priority=100, completion="Complete")


async def _preempted(cluster: Any, namespace: str, name: str) -> bool:
    return (await conditions(cluster, namespace, name)).get("Preempted") == "True"


async def test_a_protected_victim_is_preempted_only_after_its_minimum_runtime(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("gpu", cpu="4", memory="16Gi", gpu=1)
    await run_dispatcher()
    await apply(
        cluster, namespace, _low("steady", **{"workload.codeflare.dev/minimum-runtime": "20s"})
    )
    await wait_condition(cluster, namespace, "steady", "Running")
    dispatched = time.monotonic()
    await apply(cluster, namespace, _high("urgent"))

    # Inside its 20 s the preemptor waits, and the victim is never preempted (sampled
    # throughout the first 12 s: many scheduling cycles).
    samples = 0
    while time.monotonic() - dispatched < 12:
        assert not await _preempted(cluster, namespace, "steady"), "preempted too early"
        samples += 1
    assert samples > 5
    status = (await get_aw(cluster, namespace, "urgent"))["status"]
    assert "protected" in status.get("message", ""), status
    # Past its minimum runtime it is preempted, and the preemptor runs.
    await wait_condition(cluster, namespace, "steady", "Preempted", timeout=60)
    assert time.monotonic() - dispatched >= 15
    await wait_condition(cluster, namespace, "urgent", "Completed", timeout=90)


async def test_a_victim_keeps_its_objects_until_its_notice_ends(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("gpu", cpu="4", memory="16Gi", gpu=1)
    await run_dispatcher(protection={"notice_seconds": 10})
    await apply(cluster, namespace, _low("told"))
    await wait_condition(cluster, namespace, "told", "Running")
    await apply(cluster, namespace, _high("urgent"))
    await wait_condition(cluster, namespace, "told", "Preempted", timeout=60)
    told = time.monotonic()
    preempted = next(
        c
        for c in (await get_aw(cluster, namespace, "told"))["status"]["conditions"]
        if c["type"] == "Preempted"
    )
    assert "removed at" in preempted["message"], preempted  # the deadline, said
    events = (await cluster.akubectl("describe", "aw", "told", "-n", namespace)).stdout
    assert "removed at" in events

    # Inside the notice its Deployment stays, and the preemptor waits for the room.
    kept = await async_holds_for(
        lambda: _deployment_there(cluster, namespace, "told"),
        seconds=min(QUIET_SECONDS, 6.0),
        what="the victim's objects are kept during its notice",
    )
    assert kept > 1
    assert (await conditions(cluster, namespace, "urgent")).get("Dispatched") != "True"
    await wait_condition(cluster, namespace, "urgent", "Completed", timeout=90)
    assert time.monotonic() - told >= 8  # not before the deadline (10 s, less the lag seen)
    # Its objects went at the deadline (the GPU the preemptor ran on was theirs) and it was
    # requeued (it may well be running again by now: its Deployment is made anew).
    assert (await get_aw(cluster, namespace, "told"))["status"].get("requeueCount", 0) >= 1


async def _deployment_there(cluster: Any, namespace: str, name: str) -> bool:
    out = await cluster.akubectl(
        "get", "deployment", name, "-n", namespace, "--ignore-not-found", "-o", "name"
    )
    return bool(out.stdout.strip())
