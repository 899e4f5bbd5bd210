"""Fair sharing by use over time on the real control plane (docs/quotas.md, "Fair over
time"): a queue's use is kept in its status, a restarted dispatcher (and a new leader after a
SIGKILL) goes on from it, and the queue that used less is served first where the queues'
present use alone would not tell them apart."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from testenv.manifests import app_cohort, app_flavor, app_queue, cluster_queue
from testenv.waits import async_wait_until, wait_until
from tests.e2e import test_leader
from tests.e2e.conftest import apply, appwrapper, deployment, get_aw

pytestmark = [pytest.mark.cluster]

replicas = test_leader.replicas  # the same fixture: dispatcher processes with leader election

DEFAULT = "default-flavor"
USAGE = {"fair_sharing": True, "fair_sharing_mode": "Usage", "usage_sample_seconds": 1}


def work(name: str, cpu: str, queue: str) -> dict[str, Any]:
    return appwrapper(name, deployment(name, 1, {"cpu": cpu}), queue=queue)


async def dispatched(cluster: Any, namespace: str, name: str) -> bool:
    aw = await get_aw(cluster, namespace, name)
    return any(
        c["type"] == "Dispatched" and c["status"] == "True"
        for c in (aw.get("status") or {}).get("conditions", [])
    )


async def cpu_used(cluster: Any, queue: str) -> float:
    """What the queue's status says it used (decayed cpu milli-seconds)."""
    out = await cluster.akubectl("get", "clusterappqueue", queue, "-o", "json")
    history = (json.loads(out.stdout).get("status") or {}).get("usageHistory") or {}
    return float((history.get("resources") or {}).get("cpu", 0.0))


async def test_use_is_kept_in_status_across_a_restart_and_the_lighter_queue_goes_first(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    fake_nodes.add("n", cpu="8", memory="64Gi")
    root = f"{namespace}-root"
    steady, bursty = f"{namespace}-steady", f"{namespace}-bursty"
    for obj in (
        app_flavor(DEFAULT),
        app_cohort(root, flavors={DEFAULT: {"cpu": 4}}),
        cluster_queue(steady, {DEFAULT: {"cpu": 0}}, cohort=root),
        cluster_queue(bursty, {DEFAULT: {"cpu": 0}}, cohort=root),
    ):
        await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))
    await apply(cluster, namespace, app_queue("steady", steady))
    await apply(cluster, namespace, app_queue("bursty", bursty))
    await run_dispatcher(**USAGE)
    for index in range(4):
        await apply(cluster, namespace, work(f"s{index}", "1", "steady"))

    async def all_running() -> bool:
        return all([await dispatched(cluster, namespace, f"s{i}") for i in range(4)])

    await async_wait_until(all_running, timeout=60, what="steady's four admitted")
    # 4 cpu held: the record grows by about 4,000 milli-cpu-seconds a second.
    threshold = 4000.0 * 8

    async def used_enough() -> float | None:
        found = await cpu_used(cluster, steady)
        return found if found >= threshold else None

    before = await async_wait_until(used_enough, timeout=90, what="steady's use recorded")

    # A new dispatcher reads the record back: its first sample is at least what was written
    # (a record started afresh would hold a few seconds' worth, far below it).
    manager = await run_dispatcher(restart=True, **USAGE)

    async def read_back() -> float | None:
        history = manager.quotas.histories().get(steady)
        return history.queue.values.get("cpu") if history is not None else None

    again = await async_wait_until(read_back, timeout=30, what="the record read back")
    assert again >= before * 0.999

    # Both queues hold nothing once steady's work goes: present use ties them, and the older
    # AppWrapper (steady's) would go first; by use over time the bursty one does.
    await apply(cluster, namespace, work("s-next", "3", "steady"))
    await apply(cluster, namespace, work("b-next", "3", "bursty"))
    for index in range(4):
        await cluster.akubectl("delete", "appwrapper", f"s{index}", "-n", namespace, "--wait=false")
    await async_wait_until(
        lambda: dispatched(cluster, namespace, "b-next"), timeout=60, what="bursty's admitted"
    )
    assert not await dispatched(cluster, namespace, "s-next")  # 3 of the 4 cpu are bursty's


def test_use_survives_a_sigkill_and_a_leader_change(
    replicas, quotas, fake_nodes, cluster, namespace
):
    """Two dispatcher processes with leader election: the leader's record of a queue's use
    is in the queue's status; killed (SIGKILL), the new leader goes on from it, never from
    nothing."""
    fake_nodes.add("n", cpu="8", memory="64Gi")
    cq = f"{namespace}-cq"
    for obj in (app_flavor(DEFAULT), cluster_queue(cq, {DEFAULT: {"cpu": 4}})):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(app_queue("team", cq)))
    replicas.start("first", **USAGE)
    replicas.wait_leads("first", timeout=30)
    replicas.start("second", **USAGE)
    replicas.wait_standing_by("second")
    for name in ("w0", "w1"):
        body = work(name, "1", "team")
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))

    def used() -> float:
        out = cluster.kubectl("get", "clusterappqueue", cq, "-o", "json")
        history = (json.loads(out.stdout).get("status") or {}).get("usageHistory") or {}
        return float((history.get("resources") or {}).get("cpu", 0.0))

    # 2 cpu held: about 2,000 milli-cpu-seconds a second.
    wait_until(lambda: used() >= 2000.0 * 6, timeout=90, what="the leader's record of use")
    before = used()
    replicas.processes["first"].send_signal(signal.SIGKILL)
    replicas.processes["first"].wait(10)
    replicas.wait_leads("second")
    seen: list[float] = []

    def grown() -> bool:
        seen.append(used())
        return seen[-1] > before + 2000.0 * 3

    wait_until(grown, timeout=60, what="the new leader's record grown from the old one")
    assert min(seen) >= before * 0.999  # never written back from nothing
