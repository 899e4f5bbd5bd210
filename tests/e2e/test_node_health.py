"""Node health by labels on the real API server (docs/node-health.md): a GPU node labelled
`autopilot.ibm.com/gpuhealth=EVICT` (the AppWrapper controller's default rules) has the GPU
gangs on it moved to another node, a v1beta2 one with a reset rule reset in place, an MCAD
one without requeued, while a CPU-only gang on the same node stays; new GPU gangs keep off
it until the label goes. Pods run on KWOK nodes, placed by the real kube-scheduler, which
honours the anti-affinities the dispatcher injected."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.core.faulttolerance import FAILURE_GRACE, RETRY_PAUSE
from dispatcher.core.nodehealth import AUTOPILOT_LABEL
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    conditions,
    deployment,
    get_aw,
    pods_of,
)
from tests.e2e.test_v1beta2 import V2, read, wait_phase

pytestmark = [pytest.mark.cluster]

GPU = "nvidia.com/gpu"
ONE_GPU = {"cpu": "200m", GPU: "1"}


def v1beta2_gpu_app(name: str) -> dict[str, Any]:
    """As the AppWrapper suite's `autopilotjob`, with short grace and pause."""
    return {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name, "annotations": {FAILURE_GRACE: "1s", RETRY_PAUSE: "1s"}},
        "spec": {"components": [{"template": deployment(name, 1, ONE_GPU)}]},
    }


async def running_on(cluster: Any, namespace: str, name: str) -> str | None:
    """The node of the AppWrapper's one running pod, once it is the only one left."""
    pods = await pods_of(cluster, namespace, name)
    if len(pods) != 1 or pods[0]["metadata"].get("deletionTimestamp"):
        return None
    pod = pods[0]
    return str(pod["spec"]["nodeName"]) if pod["status"].get("phase") == "Running" else None


async def label_node(cluster: Any, node: str, value: str | None) -> None:
    setting = f"{AUTOPILOT_LABEL}-" if value is None else f"{AUTOPILOT_LABEL}={value}"
    await cluster.akubectl("label", "node", node, setting, "--overwrite")


async def test_gpu_gangs_move_off_an_evicting_node_and_new_ones_keep_off(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any
) -> None:
    bad = fake_nodes.add("bad", cpu="8", memory="16Gi", gpu=2)
    await run_dispatcher()
    await apply(cluster, namespace, v1beta2_gpu_app("reset"))
    await apply(cluster, namespace, appwrapper("plain", deployment("plain", 1, ONE_GPU)))
    await apply(cluster, namespace, appwrapper("cpu", deployment("cpu", 1, {"cpu": "200m"})))
    for name in ("reset", "plain", "cpu"):
        on = await async_wait_until(
            lambda n=name: running_on(cluster, namespace, n), timeout=60, what=f"{name} runs"
        )
        assert on == bad
    # The GPU pods carry the anti-affinities (the user wrote none); the CPU pod does not.
    gpu_pod = (await pods_of(cluster, namespace, "reset"))[0]["spec"]
    terms = gpu_pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": AUTOPILOT_LABEL, "operator": "NotIn", "values": ["TESTING", "EVICT"]}
            ]
        }
    ]
    cpu_pods = await pods_of(cluster, namespace, "cpu")
    assert "affinity" not in cpu_pods[0]["spec"]

    good = fake_nodes.add("good", cpu="8", memory="16Gi", gpu=2)
    await label_node(cluster, bad, "EVICT")
    await wait_phase(cluster, namespace, "reset", "Resetting", timeout=30)
    for name in ("reset", "plain"):

        async def moved(n: str = name) -> bool:
            return await running_on(cluster, namespace, n) == good

        await async_wait_until(moved, timeout=60, what=f"{name} runs on {good}")
    await wait_phase(cluster, namespace, "reset", "Running", timeout=30)
    reset = await read(cluster, V2, namespace, "reset")
    assert reset["status"]["resettingCount"] == 1  # reset in place, its room kept
    plain = await get_aw(cluster, namespace, "plain")
    requeued = next(c for c in plain["status"]["conditions"] if c["type"] == "Requeued")
    assert requeued["reason"] == "NodeUnhealthy"
    assert bad in requeued["message"]
    out = await cluster.akubectl(
        "get", "events", "-n", namespace, "-o", "json",
        "--field-selector=involvedObject.name=reset,reason=Resetting",
    )  # fmt: skip
    assert any(bad in e["message"] for e in json.loads(out.stdout)["items"])

    # The bad node's GPUs are free but withheld; the good node's are taken: a new GPU gang
    # waits, and the CPU-only gang stays where it is.
    cpu_pod = cpu_pods[0]["metadata"]["name"]
    await apply(cluster, namespace, appwrapper("late", deployment("late", 1, ONE_GPU)))

    async def nothing_moves() -> bool:
        assert (await conditions(cluster, namespace, "late")).get("Dispatched") != "True"
        pods = await pods_of(cluster, namespace, "cpu")
        assert [p["metadata"]["name"] for p in pods] == [cpu_pod]
        assert pods[0]["status"]["phase"] == "Running"
        return True

    await async_holds_for(nothing_moves, seconds=QUIET_SECONDS, what="late waits, cpu stays")

    await label_node(cluster, bad, None)
    on = await async_wait_until(
        lambda: running_on(cluster, namespace, "late"), timeout=60, what="late runs"
    )
    assert on == bad
