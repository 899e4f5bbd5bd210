"""Reservation with backfill on the real control plane (docs/scheduling.md, "Reservations and
backfill"): a gang that fits only once running work's declared limits end reserves its nodes;
a short job backfills the reserved room, one without a limit does not; a dispatcher restarted
in the meantime derives the same reservation from the status of what runs."""

from __future__ import annotations

import re
from typing import Any

import pytest

from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    conditions,
    deployment,
    get_aw,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]

LIMIT = 45
RESERVED = re.compile(r"reserved (\d+) nodes? in cluster (\S+) from (\S+)")


def gpus(count: int) -> dict[str, Any]:
    return {"cpu": "1", "nvidia.com/gpu": str(count)}


def limited(name: str, pods: int, count: int, limit: int | None) -> dict[str, Any]:
    scheduling = {"dispatchDuration": {"limit": limit}} if limit is not None else None
    return appwrapper(name, deployment(name, pods, gpus(count)), scheduling=scheduling)


async def message(cluster: Any, namespace: str, name: str) -> str:
    return str((await get_aw(cluster, namespace, name)).get("status", {}).get("message") or "")


async def dispatched(cluster: Any, namespace: str, name: str) -> bool:
    return (await conditions(cluster, namespace, name)).get("Dispatched") == "True"


async def test_a_reserved_gang_is_backfilled_by_short_work_and_kept_across_a_restart(
    cluster, namespace, fake_nodes, run_dispatcher
):
    for suffix in ("a", "b", "c"):
        fake_nodes.add(suffix, cpu="16", memory="64Gi", gpu=8)
    await run_dispatcher()
    # One node held by work that declares no end: never part of a reservation.
    await apply(cluster, namespace, limited("forever", 1, 8, None))
    await wait_condition(cluster, namespace, "forever", "Running")
    for name in ("limited-1", "limited-2"):
        await apply(cluster, namespace, limited(name, 1, 4, LIMIT))
    for name in ("limited-1", "limited-2"):
        await wait_condition(cluster, namespace, name, "Running")

    # The hero needs two whole nodes: it fits when both limited ones end, not before.
    await apply(cluster, namespace, limited("hero", 2, 8, None))

    async def reserved() -> re.Match[str] | None:
        return RESERVED.search(await message(cluster, namespace, "hero"))

    first = await async_wait_until(reserved, timeout=30, what="the hero's reservation")
    assert first[1] == "2"
    assert "declared limits" in await message(cluster, namespace, "hero")

    # Short work (its limit ends it long before the reservation starts) backfills; work
    # without a limit waits, told why, and stays out over a window.
    await apply(cluster, namespace, limited("quick", 1, 4, 10))
    await wait_condition(cluster, namespace, "quick", "Dispatched", timeout=30)
    await apply(cluster, namespace, limited("unbounded", 1, 4, None))

    async def told() -> bool:
        return "declares no limit" in await message(cluster, namespace, "unbounded")

    await async_wait_until(told, timeout=30, what="the unbounded one told why it waits")
    await async_holds_for(
        lambda: _not(dispatched(cluster, namespace, "unbounded")),
        seconds=QUIET_SECONDS,
        what="work without a limit stays off reserved nodes",
    )

    # A new dispatcher derives the same reservation (the same start) from what runs.
    await run_dispatcher(restart=True)
    again = await async_wait_until(reserved, timeout=30, what="the reservation after a restart")
    assert again.groups() == first.groups()
    assert not await dispatched(cluster, namespace, "unbounded")

    # The limits end the running work; the hero starts on its reserved nodes.
    await wait_condition(cluster, namespace, "hero", "Dispatched", timeout=LIMIT + 60)
    assert not await dispatched(cluster, namespace, "unbounded")


async def _not(check: Any) -> bool:
    return not await check
