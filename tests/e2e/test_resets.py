"""A v1beta2 AppWrapper's failure follows its fault-tolerance annotations, on the real API
server: within `failureGracePeriodDuration` nothing happens; then it is reset (phase
Resetting, still dispatched), its objects made again after `retryPausePeriodDuration`, up
to `retryLimit` resets (`status.resettingCount`), then Failed and its objects removed.
A pod fails as a kubelet reports it: its status patched to Failed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.core.faulttolerance import FAILURE_GRACE, RETRY_LIMIT, RETRY_PAUSE
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import QUIET_SECONDS, apply, pods_of
from tests.e2e.test_v1beta2 import V1, V2, read, v1beta2_app, wait_phase

pytestmark = [pytest.mark.cluster]


async def fail_a_pod(cluster: Any, namespace: str, name: str) -> str:
    """Report one running pod of `name` Failed, as its kubelet would; its name."""

    async def running() -> list[str]:
        pods = await pods_of(cluster, namespace, name)
        return [
            p["metadata"]["name"]
            for p in pods
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    await async_wait_until(running, timeout=60, what=f"a running pod of {name}")
    pod = (await running())[0]
    await cluster.akubectl(
        "patch", "pod", pod, "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"phase": "Failed"}}),
    )  # fmt: skip
    return pod


def annotated(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    app = v1beta2_app(name)
    app["metadata"]["annotations"] = annotations
    return app


async def test_failed_pods_reset_then_fail_at_the_retry_limit(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any
) -> None:
    fake_nodes.add("n", cpu="4", memory="8Gi")
    await run_dispatcher()
    quick = {FAILURE_GRACE: "0s", RETRY_LIMIT: "1", RETRY_PAUSE: "2s"}
    await apply(cluster, namespace, annotated("quick", quick))
    # Graced for an hour: its failed pod is left to its own controller meanwhile.
    await apply(cluster, namespace, annotated("graced", {FAILURE_GRACE: "1h"}))
    await wait_phase(cluster, namespace, "quick", "Running")
    await wait_phase(cluster, namespace, "graced", "Running")
    await fail_a_pod(cluster, namespace, "graced")
    first = await fail_a_pod(cluster, namespace, "quick")

    await wait_phase(cluster, namespace, "quick", "Resetting", timeout=30)
    resetting = await read(cluster, V1, namespace, "quick")
    true = {c["type"] for c in resetting["status"]["conditions"] if c["status"] == "True"}
    assert {"Dispatched", "Backoff"} <= true  # keeps its room through the reset
    assert resetting["status"]["requeueCount"] == 1

    # After the pause its objects are made again: a new pod runs, the failed one is gone.
    await wait_phase(cluster, namespace, "quick", "Running", timeout=60)
    names = {p["metadata"]["name"] for p in await pods_of(cluster, namespace, "quick")}
    assert first not in names
    assert (await read(cluster, V2, namespace, "quick"))["status"]["resettingCount"] == 1

    # The second failure is past retryLimit 1: Failed, its objects removed.
    await fail_a_pod(cluster, namespace, "quick")
    await wait_phase(cluster, namespace, "quick", "Failed", timeout=30)
    failed = await read(cluster, V1, namespace, "quick")
    reason = next(c["reason"] for c in failed["status"]["conditions"] if c["type"] == "Failed")
    assert reason == "RetryLimitReached"
    assert (await read(cluster, V2, namespace, "quick"))["status"]["resettingCount"] == 1

    async def deployment_gone() -> bool:
        out = await cluster.akubectl("get", "deployment", "quick", "-n", namespace, check=False)
        return out.returncode != 0

    await async_wait_until(deployment_gone, timeout=30, what="quick's Deployment removed")

    async def graced_untouched() -> bool:
        status = (await read(cluster, V2, namespace, "graced"))["status"]
        assert status["phase"] == "Running", status
        assert "resettingCount" not in status, status
        return True

    await async_holds_for(graced_untouched, seconds=QUIET_SECONDS, what="graced not reset")
