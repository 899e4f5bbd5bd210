"""Per-user limits on the real control plane (docs/quotas.md, "Per-user limits"): the user is
the one the admission webhook's signed creator record names, applied as each user with
`kubectl --as`; a user at the queue's limit waits, saying so, while another is admitted."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testenv.manifests import app_flavor, app_queue, cluster_queue
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e import test_security
from tests.e2e.conftest import QUIET_SECONDS, appwrapper, get_aw, wait_condition
from tests.e2e.test_security import pod

pytestmark = [pytest.mark.cluster]

secure = test_security.secure  # alice, bob and the webhook configurations
DEFAULT = "default-flavor"


async def dispatched(cluster: Any, namespace: str, name: str) -> bool:
    aw = await get_aw(cluster, namespace, name)
    return any(
        c["type"] == "Dispatched" and c["status"] == "True"
        for c in (aw.get("status") or {}).get("conditions", [])
    )


async def test_a_user_at_the_limit_waits_and_another_user_is_admitted(
    secure, quotas, fake_nodes, run_dispatcher
):
    cluster, namespace = secure.cluster, secure.namespace
    secure.grant("alice", "workloads", {"/pods": ["create", "get"]})
    fake_nodes.add("n", cpu="8", memory="64Gi")
    cq = f"{namespace}-cq"
    limits = {"userLimits": {"maxRunning": 1}}
    for obj in (app_flavor(DEFAULT), cluster_queue(cq, {DEFAULT: {"cpu": 4}}, **limits)):
        await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))
    await cluster.akubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(app_queue("team", cq))
    )
    await run_dispatcher(**secure.settings())
    for name, user in (("alice-1", "alice"), ("alice-2", "alice"), ("bob-1", "bob")):
        await secure.apply(appwrapper(name, pod(name), queue="team"), user=user)
    for name in ("alice-1", "bob-1"):
        await wait_condition(cluster, namespace, name, "Dispatched", timeout=60)

    async def told() -> str | None:
        message = str(
            ((await get_aw(cluster, namespace, "alice-2")).get("status") or {}).get("message") or ""
        )
        return message if "per-user limit" in message else None

    message = await async_wait_until(told, timeout=30, what="alice's second told why")
    assert message == (
        f"queue {cq}: user alice has 1 admitted, its per-user limit (userLimits.maxRunning 1)"
    )

    async def alice_waits() -> bool:
        return not await dispatched(cluster, namespace, "alice-2")

    await async_holds_for(alice_waits, seconds=QUIET_SECONDS, what="alice held to one")
    # Her first goes; her second is admitted.
    await cluster.akubectl("delete", "appwrapper", "alice-1", "-n", namespace, "--wait=false")
    await wait_condition(cluster, namespace, "alice-2", "Dispatched", timeout=60)


async def test_a_group_at_its_limit_holds_its_members(secure, quotas, fake_nodes, run_dispatcher):
    """alice and bob apply as members of group ml (`kubectl --as-group`): the signed record
    names the group, and the queue's limit for ml holds bob while alice's runs."""
    cluster, namespace = secure.cluster, secure.namespace
    secure.grant("alice", "workloads", {"/pods": ["create", "get"]})
    fake_nodes.add("n", cpu="8", memory="64Gi")
    cq = f"{namespace}-cq"
    limits = {"groupLimits": [{"group": "ml", "maxRunning": 1}]}
    for obj in (app_flavor(DEFAULT), cluster_queue(cq, {DEFAULT: {"cpu": 4}}, **limits)):
        await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))
    await cluster.akubectl(
        "apply", "-n", namespace, "-f", "-", input=json.dumps(app_queue("team", cq))
    )
    await run_dispatcher(**secure.settings())
    for name, user in (("alice-1", "alice"), ("bob-1", "bob")):
        body = json.dumps(appwrapper(name, pod(name), queue="team"))
        await cluster.akubectl(
            "apply", "-n", namespace, "-f", "-", f"--as={user}", "--as-group=ml", input=body
        )
        if name == "alice-1":
            await wait_condition(cluster, namespace, name, "Dispatched", timeout=60)

    async def told() -> str | None:
        status = (await get_aw(cluster, namespace, "bob-1")).get("status") or {}
        message = str(status.get("message") or "")
        return message if "groupLimits" in message else None

    message = await async_wait_until(told, timeout=30, what="bob told why he waits")
    assert (
        message == f"queue {cq}: group ml has 1 admitted, its limit (groupLimits[ml].maxRunning 1)"
    )
    await cluster.akubectl("delete", "appwrapper", "alice-1", "-n", namespace, "--wait=false")
    await wait_condition(cluster, namespace, "bob-1", "Dispatched", timeout=60)
