"""Priorities, preemption and starvation-free queueing on the real control plane."""

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
    job,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]

PRIORITY_CLASSES = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: aw-test-dev}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: aw-test-prod}
value: 1000
"""


async def _condition(cluster, namespace, name, condition) -> bool:
    return (await conditions(cluster, namespace, name)).get(condition) == "True"


async def test_prod_preempts_dev_and_dev_resumes(cluster, namespace, fake_nodes, run_dispatcher):
    await cluster.akubectl("apply", "-f", "-", input=PRIORITY_CLASSES)
    fake_nodes.add("gpu", cpu="8", memory="32Gi", gpu=1)
    await run_dispatcher()
    for name in ("dev-1", "dev-2"):
        aw = appwrapper(name, deployment(name, 1, {"cpu": "1", "nvidia.com/gpu": "1"}))
        aw["spec"]["priorityClassName"] = "aw-test-dev"
        await apply(cluster, namespace, aw)
    await wait_condition(cluster, namespace, "dev-1", "Running")
    first_dev = "dev-1"
    table = (await cluster.akubectl("get", "aw", "-n", namespace)).stdout
    assert "100" in table  # the class's value is the priority shown

    prod = appwrapper(
        "prod", job("prod", 1, {"cpu": "1", "nvidia.com/gpu": "1"}), completion="Complete"
    )
    prod["spec"]["priorityClassName"] = "aw-test-prod"
    await apply(cluster, namespace, prod)

    await wait_condition(cluster, namespace, first_dev, "Preempted", timeout=60)
    victim = (await get_aw(cluster, namespace, first_dev))["status"]
    preempted = next(c for c in victim["conditions"] if c["type"] == "Preempted")
    assert f"preempted by {namespace}/prod, priority 1000" in preempted["message"]
    assert victim["requeueCount"] == 1
    await wait_condition(cluster, namespace, "prod", "Completed", timeout=90)

    async def a_dev_runs_again() -> bool:
        return await _condition(cluster, namespace, "dev-1", "Running") or await _condition(
            cluster, namespace, "dev-2", "Running"
        )

    await async_wait_until(a_dev_runs_again, timeout=60, what="dev resumes")
    described = (await cluster.akubectl("describe", "aw", first_dev, "-n", namespace)).stdout
    assert "Preempted" in described


async def test_unknown_priority_class_is_a_clear_error(
    cluster, namespace, fake_nodes, run_dispatcher
):
    await run_dispatcher()
    aw = appwrapper("classless", deployment("c", 1, {"cpu": "1"}))
    aw["spec"]["priorityClassName"] = "no-such-class"
    await apply(cluster, namespace, aw)
    await wait_condition(cluster, namespace, "classless", "Failed")
    status = (await get_aw(cluster, namespace, "classless"))["status"]
    assert "PriorityClass 'no-such-class' not found" in status["message"]


@pytest.mark.parametrize(
    ("victim_settings", "dispatcher_settings"),
    [
        pytest.param({"preemptible": False}, {}, id="non-preemptible"),
        pytest.param({}, {"preemption": False}, id="feature-off"),
        pytest.param({"priority": 50}, {}, id="equal-priority"),
    ],
)
async def test_no_preemption_when_not_allowed(
    cluster, namespace, fake_nodes, run_dispatcher, victim_settings, dispatcher_settings
):
    fake_nodes.add("n1", cpu="2", memory="8Gi")
    dispatcher = await run_dispatcher(**dispatcher_settings)
    victim = appwrapper("victim", deployment("victim", 1, {"cpu": "2"}), priority=1)
    victim["spec"].update(victim_settings)
    await apply(cluster, namespace, victim)
    await wait_condition(cluster, namespace, "victim", "Running")
    await apply(
        cluster, namespace, appwrapper("urgent", deployment("urgent", 1, {"cpu": "2"}), priority=50)
    )

    async def urgent_waits() -> str | None:
        status = (await get_aw(cluster, namespace, "urgent")).get("status") or {}
        return status.get("message") if status.get("state") == "Pending" else None

    await async_wait_until(urgent_waits, timeout=30, what="urgent waiting")

    async def nothing_preempted() -> bool:
        status = (await get_aw(cluster, namespace, "victim")).get("status") or {}
        seen = {c["type"]: c["status"] for c in status.get("conditions", [])}
        assert seen.get("Running") == "True", status
        assert seen.get("Preempted") != "True", status
        assert status.get("requeueCount", 0) == 0, status
        assert (await conditions(cluster, namespace, "urgent")).get("Dispatched") != "True"
        assert dispatcher.preemptions == 0
        return True

    await async_holds_for(nothing_preempted, seconds=QUIET_SECONDS, what="no preemption")


async def test_big_gang_is_not_starved_by_small_ones(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("n1", cpu="4", memory="16Gi")
    # starvation_after=0: a head that does not fit holds its cluster at once (the contrast,
    # small ones passing a head, is test_queue_mode[best-effort-passes]).
    await run_dispatcher(starvation_after_seconds=0, preemption=False)
    await apply(cluster, namespace, appwrapper("small-0", deployment("s0", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "small-0", "Running")
    await apply(cluster, namespace, appwrapper("big", deployment("big", 1, {"cpu": "4"})))
    await async_wait_until(
        lambda: _message_has(cluster, namespace, "big", "needs cpu 4"),
        timeout=30,
        what="big waiting",
    )
    for index in (1, 2):
        await apply(
            cluster,
            namespace,
            appwrapper(f"small-{index}", deployment(f"s{index}", 1, {"cpu": "1"})),
        )
    for index in (1, 2):
        await async_wait_until(
            lambda index=index: _message_has(
                cluster, namespace, f"small-{index}", "starvation guard"
            ),
            timeout=30,
            what="small ones held back for the big one",
        )

    async def none_dispatched(*names: str) -> bool:
        return not [n for n in names if await _condition(cluster, namespace, n, "Dispatched")]

    await async_holds_for(
        lambda: none_dispatched("small-1", "small-2", "big"),
        seconds=QUIET_SECONDS,
        what="small ones (and big, which does not fit yet) held back",
    )
    await cluster.akubectl("delete", "aw", "small-0", "-n", namespace, "--timeout=60s")
    await wait_condition(cluster, namespace, "big", "Running", timeout=60)
    await async_holds_for(
        lambda: none_dispatched("small-1", "small-2"),
        seconds=QUIET_SECONDS,
        what="small ones still held back once big runs",
    )


async def _message_has(cluster, namespace, name, text) -> bool:
    status = (await get_aw(cluster, namespace, name)).get("status") or {}
    return text in (status.get("message") or "")


async def test_highest_priority_waits_only_for_the_eviction(
    cluster, namespace, fake_nodes, run_dispatcher
):
    nodes = [fake_nodes.add(suffix, cpu="4", memory="16Gi") for suffix in ("a", "b")]
    dispatcher = await run_dispatcher()
    for index in range(8):  # a full cluster of mixed low priorities
        name = f"low-{index}"
        # Pinned, alternating: where kube-scheduler breaks ties decides which lows share a
        # node, and with it whether a victim coming back may rightly evict a lower one.
        pinned = {"kubernetes.io/hostname": nodes[index % 2]}
        await apply(
            cluster,
            namespace,
            appwrapper(
                name,
                deployment(name, 1, {"cpu": "1"}, nodeSelector=pinned),
                priority=index % 3,
            ),
        )
    for index in range(8):
        await wait_condition(cluster, namespace, f"low-{index}", "Running")
    await apply(
        cluster,
        namespace,
        appwrapper("urgent", deployment("urgent", 2, {"cpu": "2"}), priority=100),
    )
    await wait_condition(cluster, namespace, "urgent", "Running", timeout=60)
    # Exactly the room it needed was taken: 4 CPUs, per node, from the lowest priorities.
    preempted = [
        f"low-{i}"
        for i in range(8)
        if await _condition(cluster, namespace, f"low-{i}", "Preempted")
    ]
    assert len(preempted) == 4
    assert dispatcher.preemptions == 4
    # Priority 2 was never needed: two CPUs per node can always come from priorities 0 and 1.
    assert not [name for name in preempted if int(name.split("-")[1]) % 3 == 2]


async def test_a_victim_of_another_namespace_is_not_told_the_preemptors_name(
    cluster, namespace, fake_nodes, run_dispatcher
):
    """Team B's high-priority AppWrapper preempts team A's: A's owner reads, in `kubectl
    describe` (conditions, preemptedBy, Events), that another namespace's AppWrapper took
    the room, with its uid for an administrator, never its name or namespace; B's owner
    is told one AppWrapper of another namespace was evicted, not which."""
    other = f"{namespace}-b"
    cluster.kubectl("delete", "namespace", other, "--ignore-not-found", "--wait=true", timeout=120)
    cluster.kubectl("create", "namespace", other)
    try:
        fake_nodes.add("gpu", cpu="8", memory="32Gi", gpu=1)
        await run_dispatcher()
        await apply(
            cluster,
            namespace,
            appwrapper("low", deployment("low", 1, {"cpu": "1", "nvidia.com/gpu": "1"})),
        )
        await wait_condition(cluster, namespace, "low", "Running")
        intruder = appwrapper(
            "intruder-x7", deployment("intruder-x7", 1, {"cpu": "1", "nvidia.com/gpu": "1"})
        )
        intruder["spec"]["priority"] = 1000
        await apply(cluster, other, intruder)
        await wait_condition(cluster, namespace, "low", "Preempted", timeout=60)
        uid = (await get_aw(cluster, other, "intruder-x7"))["metadata"]["uid"]

        async def described() -> str | None:
            out = (await cluster.akubectl("describe", "aw", "low", "-n", namespace)).stdout
            return out if "Requeued" in out else None

        text = await async_wait_until(described, timeout=60, what="the victim requeued")
        assert f"preempted by another namespace's AppWrapper (UID: {uid}), priority 1000" in text
        assert "intruder" not in text
        assert f"{other}/" not in text
        status = (await get_aw(cluster, namespace, "low"))["status"]
        assert status.get("preemptedBy") in (uid, None)  # None once dispatched again
        await wait_condition(cluster, other, "intruder-x7", "Running", timeout=60)
        mine = (await cluster.akubectl("describe", "aw", "intruder-x7", "-n", other)).stdout
        assert "evicting another namespace's AppWrapper in cluster" in mine
        assert f"{namespace}/low" not in mine
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
