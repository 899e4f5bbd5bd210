"""What the dispatcher counts, seen by a user: a RayService's GPUs, and pods that ask for
nothing but still need a place on a node."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    deployment,
    get_aw,
    wait_condition,
    wait_established,
)

pytestmark = [pytest.mark.cluster]

RAY_IMAGE = "rayproject/ray:2.9.0"


def _ray_pod(cpu: str, memory: str, gpu: int = 0) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    limits: dict[str, Any] = {}
    if gpu:
        requests["nvidia.com/gpu"] = str(gpu)
        limits["nvidia.com/gpu"] = str(gpu)
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    return {"spec": {"containers": [{"name": "ray", "image": RAY_IMAGE, "resources": resources}]}}


def ray_service(name: str, workers: int) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {
                "headGroupSpec": {"rayStartParams": {}, "template": _ray_pod("2", "8Gi")},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": workers,
                        "minReplicas": 0,
                        "maxReplicas": workers,
                        "rayStartParams": {},
                        "template": _ray_pod("4", "16Gi", gpu=8),
                    }
                ],
            },
        },
    }


def _ensure_ray_service_crd(cluster: Any) -> None:
    """The test cluster's KubeRay installs its CRDs; install the RayService one from the
    same build if it is missing (an existing cluster without it cannot run this test)."""
    found = cluster.kubectl("get", "crd", "rayservices.ray.io", check=False)
    if found.returncode == 0:
        return
    binaries = getattr(cluster, "binaries", None)
    if binaries is None:
        pytest.skip("the RayService CRD is not installed in this cluster")
    crd = binaries.kuberay_crds / "ray.io_rayservices.yaml"
    cluster.kubectl("apply", "--server-side", "-f", str(crd))
    wait_established(cluster, "rayservices.ray.io")


async def test_ray_service_larger_than_the_cluster_stays_queued_naming_gpus(
    cluster, namespace, fake_nodes, run_dispatcher
):
    _ensure_ray_service_crd(cluster)
    # 16 GPUs; CPU and memory enough for all 101 pods, so the GPUs alone are short.
    for suffix in ("g1", "g2"):
        fake_nodes.add(suffix, cpu="256", memory="2Ti", gpu=8)
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("serve", ray_service("serve", workers=100)))
    await wait_condition(cluster, namespace, "serve", "Queueing")

    async def waits_for_gpus() -> bool:
        status = (await get_aw(cluster, namespace, "serve"))["status"]
        assert status["state"] == "Pending", status
        assert status["message"] == "needs nvidia.com/gpu 800, free 16 of 16", status
        made = await cluster.akubectl("get", "rayservice", "serve", "-n", namespace, check=False)
        assert "NotFound" in made.stderr, (made.stdout, made.stderr)
        return True

    await async_holds_for(waits_for_gpus, seconds=QUIET_SECONDS, what="the RayService waits")
    described = (await cluster.akubectl("describe", "aw", "serve", "-n", namespace)).stdout
    assert "nvidia.com/gpu 800" in described

    # One that fits is dispatched, and its RayService made: the kind is counted, not refused.
    await apply(cluster, namespace, appwrapper("small", ray_service("small", workers=1)))
    await wait_condition(cluster, namespace, "small", "Dispatched")
    made = await cluster.akubectl("get", "rayservice", "small", "-n", namespace, "-o", "json")
    assert json.loads(made.stdout)["metadata"]["name"] == "small"


async def test_many_pods_that_ask_for_nothing_wait_for_places_on_nodes(
    cluster, namespace, fake_nodes, run_dispatcher
):
    # Two nodes of 10 pods each: 20 places in the pool.
    fake_nodes.add("n1", cpu="64", memory="256Gi", pods=10)
    fake_nodes.add("n2", cpu="64", memory="256Gi", pods=10)
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("crowd", deployment("crowd", 50, {})))
    await wait_condition(cluster, namespace, "crowd", "Queueing")

    async def waits_for_places(free: int) -> bool:
        status = (await get_aw(cluster, namespace, "crowd"))["status"]
        assert status["state"] == "Pending", status
        assert status["message"] == f"needs pods 50, free {free} of 20", status
        out = await cluster.akubectl(
            "get", "deployment", "crowd", "-n", namespace, "--ignore-not-found"
        )
        assert out.stdout.strip() == "", out.stdout
        return True

    await async_holds_for(
        lambda: waits_for_places(20), seconds=QUIET_SECONDS, what="50 pods wait for 20 places"
    )

    # 15 such pods fit the 20 places and run; the 50 still wait, with 5 places left.
    await apply(cluster, namespace, appwrapper("few", deployment("few", 15, {})))
    await wait_condition(cluster, namespace, "few", "Running", timeout=90)

    async def places_taken() -> bool:
        message = (await get_aw(cluster, namespace, "crowd"))["status"].get("message", "")
        return message == "needs pods 50, free 5 of 20"

    await async_wait_until(places_taken, timeout=30, what="the message counts the 15 pods")
    await async_holds_for(
        lambda: waits_for_places(5), seconds=QUIET_SECONDS, what="50 pods wait for 5 places"
    )
    described = (await cluster.akubectl("describe", "aw", "crowd", "-n", namespace)).stdout
    assert "needs pods 50" in described
