"""Gang dispatch on the real control plane: the blog case, per-node fit, simple kinds."""

from __future__ import annotations

import pytest

from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    conditions,
    deployment,
    get_aw,
    load_sample,
    pods_of,
    service,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]

GPU_NODE = {"cpu": "8", "memory": "40Gi", "gpu": 2}


@pytest.mark.kuberay
async def test_two_ray_clusters_capacity_for_one(cluster, namespace, fake_nodes, run_dispatcher):
    for index in (1, 2):
        fake_nodes.add(f"gpu{index}", **GPU_NODE)
    await run_dispatcher()
    await apply(cluster, namespace, load_sample("ray-glue-1.yaml"))
    await wait_condition(cluster, namespace, "glue-1", "Dispatched")
    await apply(cluster, namespace, load_sample("ray-glue-2.yaml"))

    await wait_condition(cluster, namespace, "glue-1", "Running", timeout=120)
    first = await conditions(cluster, namespace, "glue-1")
    for milestone in ("Init", "Queueing", "HeadOfLine", "Dispatched", "Running"):
        assert first[milestone] == "True", first
    ray_pods = await pods_of(cluster, namespace, "glue-1")
    assert sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in ray_pods) == [
        "head",
        "worker",
        "worker",
    ]

    async def second_waits_for_gpu() -> str | None:
        status = (await get_aw(cluster, namespace, "glue-2")).get("status") or {}
        message = status.get("message") or ""
        return message if "nvidia.com/gpu" in message else None

    message = await async_wait_until(second_waits_for_gpu, timeout=30, what="GPU message")
    assert "free 0 of 4" in message
    await async_holds_for(
        lambda: _waits_without_pods(cluster, namespace, "glue-2"),
        seconds=QUIET_SECONDS,
        what="glue-2 waits, no pods",
    )

    await cluster.akubectl("delete", "appwrapper", "glue-1", "-n", namespace, "--timeout=60s")
    await wait_condition(cluster, namespace, "glue-2", "Running", timeout=120)
    assert len(await pods_of(cluster, namespace, "glue-2")) == 3
    assert await pods_of(cluster, namespace, "glue-1") == []


async def test_aggregate_fits_but_no_node_holds_a_pod(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("a", cpu="8", memory="32Gi", gpu=4)
    fake_nodes.add("b", cpu="8", memory="32Gi", gpu=4)
    await run_dispatcher()
    big = deployment("big", 1, {"cpu": "1", "nvidia.com/gpu": "8"})
    await apply(cluster, namespace, appwrapper("eight-gpus", big))

    async def says_no_node() -> str | None:
        status = (await get_aw(cluster, namespace, "eight-gpus")).get("status") or {}
        return status.get("message") if "no node" in (status.get("message") or "") else None

    message = await async_wait_until(says_no_node, timeout=30, what="per-node message")
    assert "nvidia.com/gpu" in message
    await async_holds_for(
        lambda: _waits_without_pods(cluster, namespace, "eight-gpus"),
        seconds=QUIET_SECONDS,
        what="eight-gpus waits, no pods",
    )


async def _waits_without_pods(cluster, namespace, name) -> bool:
    assert (await conditions(cluster, namespace, name))["Dispatched"] == "False"
    assert await pods_of(cluster, namespace, name) == []
    return True


async def test_service_only_appwrapper_dispatches_at_once(
    cluster, namespace, fake_nodes, run_dispatcher
):
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("svc", service("svc")))
    await wait_condition(cluster, namespace, "svc", "Running")
    out = await cluster.akubectl("get", "service", "svc", "-n", namespace, "-o", "name")
    assert out.stdout.strip() == "service/svc"


async def test_service_and_deployment_sample(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1")
    await run_dispatcher()
    await apply(cluster, namespace, load_sample("service-deployment.yaml"))
    name = load_sample("service-deployment.yaml")["metadata"]["name"]
    await wait_condition(cluster, namespace, name, "Running")
    status = (await get_aw(cluster, namespace, name))["status"]
    assert status["running"] >= 2
    assert status["state"] == "Running"
    assert status["stage"] == "Running"


async def test_cluster_total_fit_dispatches_as_mcad_did(
    cluster, namespace, fake_nodes, run_dispatcher
):
    """`fit: cluster_total`, MCAD's accounting, for those who want it: two 425m pods on
    nodes with 500m and 350m free are dispatched (850m free in total), and one of them waits
    Pending for a node, as under MCAD. The default (per-node) keeps the gang queued."""
    fake_nodes.add("a", cpu="500m", memory="8Gi")
    fake_nodes.add("b", cpu="350m", memory="8Gi")
    await run_dispatcher(fit="cluster_total")
    await apply(cluster, namespace, appwrapper("pair", deployment("pair", 2, {"cpu": "425m"})))
    await wait_condition(cluster, namespace, "pair", "Dispatched", timeout=30)

    async def one_runs_one_waits() -> bool:
        phases = sorted(p["status"].get("phase") for p in await pods_of(cluster, namespace, "pair"))
        return phases == ["Pending", "Running"]

    await async_wait_until(one_runs_one_waits, timeout=60, what="one pod Running, one Pending")
    await async_holds_for(one_runs_one_waits, seconds=QUIET_SECONDS, what="the second pod waits")
