"""Queue order, queue modes and what counts as capacity, on the real control plane."""

from __future__ import annotations

import json

import pytest

from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    conditions,
    deployment,
    get_aw,
    pods_of,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]


async def dispatched(cluster, namespace, name) -> bool:
    return (await conditions(cluster, namespace, name)).get("Dispatched") == "True"


async def test_higher_priority_goes_first_then_older(
    cluster, namespace, fake_nodes, run_dispatcher
):
    # Queue three while nothing fits, then free room for exactly one at a time.
    blocker = deployment("blocker", 1, {"cpu": "4"})
    fake_nodes.add("n1", cpu="4", memory="16Gi")
    await run_dispatcher(preemption=False)
    await apply(cluster, namespace, appwrapper("blocker", blocker))
    await wait_condition(cluster, namespace, "blocker", "Running")
    for name, priority in (("low-old", 1), ("low-new", 1), ("high", 10)):
        await apply(
            cluster,
            namespace,
            appwrapper(name, deployment(name, 1, {"cpu": "4"}), priority=priority),
        )
        await async_wait_until(
            lambda name=name: _has_message(cluster, namespace, name),
            timeout=30,
            what=f"{name} waiting",
        )
    order = []
    for _ in range(3):
        await cluster.akubectl(
            "delete",
            "appwrapper",
            "-n",
            namespace,
            *(["blocker"] if not order else [order[-1]]),
            "--timeout=60s",
        )

        async def newly_dispatched(done=tuple(order)) -> list[str] | None:
            names = [
                name
                for name in ("high", "low-old", "low-new")
                if name not in done and await dispatched(cluster, namespace, name)
            ]
            return names or None

        # Room for exactly one at a time: each step dispatches one, the highest then oldest.
        names = await async_wait_until(newly_dispatched, timeout=60, what="next dispatch")
        assert len(names) == 1, names
        order.append(names[0])
    assert order == ["high", "low-old", "low-new"]


async def _has_message(cluster, namespace, name) -> bool:
    status = (await get_aw(cluster, namespace, name)).get("status") or {}
    return bool(status.get("message")) and status.get("state") == "Pending"


@pytest.mark.parametrize(
    ("mode", "small_passes"),
    [
        pytest.param("StrictFIFO", False, id="strict-blocks"),
        pytest.param("BestEffortFIFO", True, id="best-effort-passes"),
    ],
)
async def test_queue_mode(cluster, namespace, fake_nodes, run_dispatcher, mode, small_passes):
    node = fake_nodes.add("n1", cpu="4", memory="16Gi")
    # Another workload holds half the node, so the big one could fit later but not now.
    other = deployment("other", 1, {"cpu": "2"}, nodeSelector={"kubernetes.io/hostname": node})
    await apply(cluster, namespace, other)
    await async_wait_until(
        lambda: _running_pods(cluster, namespace, "app=other"), timeout=60, what="other pod"
    )
    await run_dispatcher(queue_mode=mode, starvation_after_seconds=3600, preemption=False)
    await apply(
        cluster, namespace, appwrapper("big", deployment("big", 1, {"cpu": "4"}), priority=5)
    )
    await async_wait_until(
        lambda: _has_message(cluster, namespace, "big"), timeout=30, what="big waiting"
    )
    await apply(cluster, namespace, appwrapper("small", deployment("small", 1, {"cpu": "1"})))
    if small_passes:
        await wait_condition(cluster, namespace, "small", "Running")
    else:
        message = await async_wait_until(
            lambda: _message_containing(cluster, namespace, "small", "behind"),
            timeout=30,
            what="small blocked behind the head",
        )
        # Its status is its own: who is ahead of it is the pending list's (kubectl aw list),
        # not written into every AppWrapper behind the head.
        assert f"{namespace}/big" not in message

    async def as_the_mode_says() -> bool:
        # big never fits (another workload holds half the node); small passes it or not.
        assert not await dispatched(cluster, namespace, "big")
        assert await dispatched(cluster, namespace, "small") is small_passes
        return True

    await async_holds_for(as_the_mode_says, seconds=QUIET_SECONDS, what=f"{mode} order")


async def _message_containing(cluster, namespace, name, text) -> str | None:
    status = (await get_aw(cluster, namespace, name)).get("status") or {}
    message = status.get("message") or ""
    return message if text in message else None


async def test_other_pods_and_unusable_nodes_do_not_count(
    cluster, namespace, fake_nodes, run_dispatcher
):
    usable = fake_nodes.add("usable", cpu="4", memory="16Gi")
    fake_nodes.add("cordoned", cpu="16", memory="64Gi")
    fake_nodes.add(
        "tainted",
        cpu="16",
        memory="64Gi",
        taints=[{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}],
    )
    await cluster.akubectl("cordon", f"{namespace}-cordoned")
    # A pod that is not the dispatcher's holds 3 of the 4 usable CPUs.
    other = deployment("other", 1, {"cpu": "3"}, nodeSelector={"kubernetes.io/hostname": usable})
    await apply(cluster, namespace, other)
    await async_wait_until(
        lambda: _running_pods(cluster, namespace, "app=other"), timeout=60, what="other pod"
    )
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("two-cpus", deployment("two", 1, {"cpu": "2"})))
    message = await async_wait_until(
        lambda: _message_containing(cluster, namespace, "two-cpus", "cpu"),
        timeout=30,
        what="cpu message",
    )
    assert "needs cpu 2, free 1 of 4 on the 1 nodes its pods may use" in message

    async def still_waiting() -> bool:
        assert not await dispatched(cluster, namespace, "two-cpus")
        assert await pods_of(cluster, namespace, "two-cpus") == []
        return True

    await async_holds_for(still_waiting, seconds=QUIET_SECONDS, what="two-cpus waits, no pods")

    await cluster.akubectl("delete", "deployment", "other", "-n", namespace)
    await wait_condition(cluster, namespace, "two-cpus", "Running")


async def _running_pods(cluster, namespace, selector) -> bool:
    out = await cluster.akubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    items = json.loads(out.stdout)["items"]
    return bool(items) and all(p["status"].get("phase") == "Running" for p in items)


async def test_not_ready_node_does_not_count(cluster, namespace, fake_nodes, run_dispatcher):
    # A node KWOK does not manage never becomes Ready.
    name = f"{namespace}-unmanaged"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": fake_nodes.pool},
        "status": {
            "allocatable": {"cpu": "32", "memory": "64Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "64Gi", "pods": "110"},
        },
    }
    await cluster.akubectl("apply", "-f", "-", input=json.dumps(node))
    fake_nodes.names.append(name)
    await run_dispatcher()
    await apply(cluster, namespace, appwrapper("needs-cpu", deployment("w", 1, {"cpu": "1"})))
    message = await async_wait_until(
        lambda: _message_containing(cluster, namespace, "needs-cpu", "cpu"),
        timeout=30,
        what="no capacity message",
    )
    # The NotReady node's 32 CPUs are not counted: the pool has none.
    assert message == "needs cpu 1, free 0 of 0"

    async def still_waiting() -> bool:
        status = (await get_aw(cluster, namespace, "needs-cpu")).get("status") or {}
        assert (status.get("state"), status.get("message")) == ("Pending", message), status
        assert await pods_of(cluster, namespace, "needs-cpu") == []
        return True

    await async_holds_for(still_waiting, seconds=QUIET_SECONDS, what="needs-cpu waits")
