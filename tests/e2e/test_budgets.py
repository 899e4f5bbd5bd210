"""Budgets on the real control plane (docs/quotas.md, "Budgets"): a queue's resource-hours per
period, spent as its admitted AppWrappers hold the resource, kept in its status; work whose
declared limit would spend more than is left waits, and is admitted once the spending leaves
the (rolling) period."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testenv.manifests import app_flavor, app_queue, cluster_queue
from testenv.waits import async_wait_until
from tests.e2e.conftest import apply, appwrapper, deployment, get_aw, wait_condition

pytestmark = [pytest.mark.cluster]

DEFAULT = "default-flavor"
LIMIT = 8  # seconds each runs at most: its pods run until the limit stops it


def limited(name: str) -> dict[str, Any]:
    body = deployment(name, 1, {"cpu": "1"})
    return appwrapper(name, body, queue="team", scheduling={"dispatchDuration": {"limit": LIMIT}})


async def message(cluster: Any, namespace: str, name: str) -> str:
    return str(((await get_aw(cluster, namespace, name)).get("status") or {}).get("message") or "")


async def test_a_budget_holds_work_that_would_overspend_until_the_window_renews(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    fake_nodes.add("n", cpu="8", memory="64Gi")
    cq = f"{namespace}-cq"
    # 10.8 cpu-seconds (3 milli-cpu-hours) per rolling 14.4 s: one run of 8 cpu-seconds
    # fits, two do not.
    budget = {"resource": "cpu", "amountHours": "3m", "period": "Rolling", "windowHours": 0.004}
    for obj in (app_flavor(DEFAULT), cluster_queue(cq, {DEFAULT: {"cpu": 4}}, budget=budget)):
        await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))
    await apply(cluster, namespace, app_queue("team", cq))
    await run_dispatcher(usage_sample_seconds=1)
    await apply(cluster, namespace, limited("first"))
    await wait_condition(cluster, namespace, "first", "Dispatched", timeout=30)
    await apply(cluster, namespace, limited("second"))

    async def held() -> str | None:
        found = await message(cluster, namespace, "second")
        return found if "budget" in found else None

    said = await async_wait_until(held, timeout=30, what="the second held by the budget")
    assert said == (
        f"queue {cq}: its budget of 0.003 cpu-hours per rolling 0.004 hours has too little left"
        " for what it may spend: up to 0.002222 cpu-hours (its declared limit)"
    )

    async def spent() -> float | None:
        out = await cluster.akubectl("get", "clusterappqueue", cq, "-o", "json")
        status = (json.loads(out.stdout).get("status") or {}).get("budget") or {}
        value = status.get("spentHours")
        return float(value) if isinstance(value, int | float) and value > 0 else None

    assert await async_wait_until(spent, timeout=30, what="the spending in the queue's status")
    # The first is stopped at its limit; its spending leaves the window 14.4 s later, and the
    # second is admitted.
    await wait_condition(cluster, namespace, "second", "Dispatched", timeout=LIMIT + 15 + 30)


async def test_a_spent_stop_budget_evicts_work_without_a_limit(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    fake_nodes.add("n", cpu="8", memory="64Gi")
    cq = f"{namespace}-cq"
    # 3.6 cpu-seconds (1 milli-cpu-hour) a week; whenExhausted Stop.
    budget = {"resource": "cpu", "amountHours": "1m", "whenExhausted": "Stop"}
    for obj in (app_flavor(DEFAULT), cluster_queue(cq, {DEFAULT: {"cpu": 4}}, budget=budget)):
        await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))
    await apply(cluster, namespace, app_queue("team", cq))
    await run_dispatcher(usage_sample_seconds=1)
    # No limit: admitted while anything is left; stopped once 1 cpu held spends it.
    await apply(
        cluster, namespace, appwrapper("open", deployment("open", 1, {"cpu": "1"}), queue="team")
    )
    await wait_condition(cluster, namespace, "open", "Dispatched", timeout=30)

    async def stopped() -> str | None:
        conditions = (
            (await get_aw(cluster, namespace, "open")).get("status", {}).get("conditions", [])
        )
        requeued = next((c for c in conditions if c["type"] == "Requeued"), None)
        return str(requeued["message"]) if requeued and requeued["status"] == "True" else None

    said = await async_wait_until(stopped, timeout=60, what="the open-ended one stopped")
    assert said.startswith(
        f"queue {cq}: its budget of 0.001 cpu-hours is spent, and it declares no limit"
        " (budget.whenExhausted Stop)"
    )

    # Back in the queue, it waits for the next week, saying why.
    async def waits() -> str | None:
        found = await message(cluster, namespace, "open")
        return found if "is spent, and it declares no limit" in found else None

    await async_wait_until(waits, timeout=30, what="the stopped one waiting for the budget")
