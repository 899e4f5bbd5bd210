"""Quotas for teams on the real control plane: queues capping admissions, every broken
link answered, cohorts lending and reclaiming, flavors steering pods, the queues' status
as `kubectl get` shows it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher import metrics
from testenv.manifests import app_cohort, app_flavor, app_queue, cluster_queue
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    deployment,
    get_aw,
    pods_of,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]

DEFAULT = "default-flavor"
GPU = "nvidia.com/gpu"


def work(name: str, cpu: str, queue: str, **kwargs: Any) -> dict[str, Any]:
    """An AppWrapper of one single-pod Deployment asking for `cpu` (pods run until removed)."""
    return appwrapper(name, deployment(name, 1, {"cpu": cpu}), queue=queue, **kwargs)


async def apply_cluster(cluster: Any, obj: dict[str, Any]) -> None:
    await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))


async def message_of(cluster: Any, namespace: str, name: str) -> str:
    status = (await get_aw(cluster, namespace, name)).get("status") or {}
    return str(status.get("message") or "")


async def wait_message(cluster: Any, namespace: str, name: str, text: str) -> str:
    async def says() -> str | None:
        message = await message_of(cluster, namespace, name)
        return message if text in message else None

    return await async_wait_until(says, timeout=30, what=f"{name} says {text!r}")


async def dispatched(cluster: Any, namespace: str, name: str) -> bool:
    aw = await get_aw(cluster, namespace, name)
    return any(
        c["type"] == "Dispatched" and c["status"] == "True"
        for c in (aw.get("status") or {}).get("conditions", [])
    )


async def not_dispatched(cluster: Any, namespace: str, *names: str) -> bool:
    for name in names:
        if await dispatched(cluster, namespace, name):
            return False
    return True


async def one_queue(cluster: Any, namespace: str, fake_nodes: Any) -> str:
    """An 8-cpu node, and a ClusterAppQueue of 4 cpu that AppQueue `team` submits to."""
    fake_nodes.add("n", cpu="8", memory="64Gi")
    cq = f"{namespace}-cq"
    await apply_cluster(cluster, app_flavor(DEFAULT))
    await apply_cluster(cluster, cluster_queue(cq, {DEFAULT: {"cpu": 4}}))
    await apply(cluster, namespace, app_queue("team", cq))
    return cq


async def get_table(cluster: Any, *args: str) -> list[dict[str, str]]:
    """`kubectl get` as a user reads it: each row's cells by column heading."""
    out = await cluster.akubectl("get", *args)
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    header = lines[0]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " ")]
    names = header.split()
    rows = []
    for line in lines[1:]:
        cells = [
            line[a:b].strip() for a, b in zip(starts, [*starts[1:], len(line) + 1], strict=True)
        ]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


async def test_a_queue_caps_admissions_and_every_broken_link_is_named(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    fake_nodes.add("big", cpu="16", memory="64Gi")
    cq = f"{namespace}-cq"
    dispatcher = await run_dispatcher()
    # Submitted to a queue that does not exist yet: it waits, saying so.
    await apply(cluster, namespace, work("early", "1", "team"))
    await wait_message(cluster, namespace, "early", f"AppQueue {namespace}/team does not exist")
    await apply(cluster, namespace, app_queue("team", cq))
    await wait_message(
        cluster, namespace, "early", f"points at cluster queue {cq}, which does not exist"
    )
    await apply_cluster(cluster, cluster_queue(cq, {DEFAULT: {"cpu": 2, "memory": "8G"}}))
    await wait_message(cluster, namespace, "early", "flavor default-flavor does not exist")
    await apply_cluster(cluster, app_flavor(DEFAULT))
    await wait_condition(cluster, namespace, "early", "Dispatched")

    await apply(cluster, namespace, work("second", "1", "team"))
    await wait_condition(cluster, namespace, "second", "Dispatched")
    await apply(cluster, namespace, work("third", "1", "team"))
    message = await wait_message(cluster, namespace, "third", f"queue {cq}:")
    assert message == f"queue {cq}: needs cpu 1; nominal 2, in use 2, cohort can lend 0"
    found = {
        c["type"]: c for c in (await get_aw(cluster, namespace, "third"))["status"]["conditions"]
    }
    assert found["Dispatched"]["reason"] == "QuotaExceeded"  # not a capacity wait
    described = (await cluster.akubectl("describe", "aw", "third", "-n", namespace)).stdout
    assert "QuotaExceeded" in described
    await apply(cluster, namespace, work("huge", "4", "team"))
    await wait_message(cluster, namespace, "huge", "needs cpu 4, the most it can ever have is 2")
    await async_holds_for(
        lambda: not_dispatched(cluster, namespace, "third", "huge"),
        seconds=QUIET_SECONDS,
        what="over-quota AppWrappers stay queued",
    )

    # As the guides show it: pending and admitted per queue, usage per flavor and resource.
    async def queue_counts() -> dict[str, str] | None:
        (row,) = await get_table(cluster, "clusterappqueue", cq)
        return row if (row["PENDING"], row["ADMITTED"]) == ("2", "2") else None

    row = await async_wait_until(queue_counts, timeout=15, what="ClusterAppQueue counts")
    assert (row["NAME"], row["COHORT"], row["ACTIVE"]) == (cq, "", "True")
    (row,) = await get_table(cluster, "appqueues", "-n", namespace)
    assert row["NAME"] == "team"
    assert (row["CLUSTERQUEUE"], row["PENDING"], row["ADMITTED"], row["ACTIVE"]) == (
        cq,
        "2",
        "2",
        "True",
    )
    usage = json.loads(
        (await cluster.akubectl("get", "caq", cq, "-o", "jsonpath={.status.flavorsUsage}")).stdout
    )
    assert usage == [
        {
            "name": DEFAULT,
            "resources": [
                {"name": "cpu", "total": "2", "borrowed": "0"},
                {"name": "memory", "total": "0", "borrowed": "0"},
            ],
        }
    ]
    (flavor_row,) = await get_table(cluster, "appflavor", DEFAULT)
    assert flavor_row["USED-BY"] == f"cluster queues {cq}"
    scraped = metrics.render(dispatcher)
    assert f'appwrapper_dispatcher_queue_pending{{queue="{cq}"}} 2.0' in scraped
    assert (
        f'appwrapper_dispatcher_queue_usage{{flavor="{DEFAULT}",queue="{cq}",resource="cpu"}} 2.0'
        in scraped
    )
    admission = (await get_aw(cluster, namespace, "early"))["status"]["admission"]
    assert admission == {
        "queue": f"{namespace}/team",
        "clusterQueue": cq,
        "flavors": [{"name": DEFAULT, "resources": ["cpu", "memory"]}],
        "borrowing": False,
    }

    # Room in the queue again: the next in line goes.
    await cluster.akubectl("delete", "appwrapper", "early", "-n", namespace, "--timeout=60s")
    await wait_condition(cluster, namespace, "third", "Dispatched")


async def test_bad_queue_setups_are_refused_or_reported(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    fake_nodes.add("big", cpu="16", memory="64Gi")
    cq = f"{namespace}-cq"
    await apply_cluster(cluster, app_flavor(DEFAULT))
    # Rejected at apply by the CRD: a negative quota, a malformed one, an unknown policy.
    for bad, error in [
        (-1, "nominalQuota"),
        ("two", "nominalQuota"),
    ]:
        result = await cluster.akubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(cluster_queue(cq, {DEFAULT: {"cpu": bad}})),
            check=False,
        )
        assert result.returncode != 0
        assert error in result.stderr
    wrong_policy = cluster_queue(
        cq, {DEFAULT: {"cpu": 1}}, preemption={"withinClusterQueue": "Always"}
    )
    result = await cluster.akubectl("apply", "-f", "-", input=json.dumps(wrong_policy), check=False)
    assert "withinClusterQueue" in result.stderr

    # Admits only namespaces labelled team=a; covers cpu and memory only.
    await apply_cluster(
        cluster,
        cluster_queue(
            cq,
            {DEFAULT: {"cpu": 4, "memory": "8G"}},
            namespaceSelector={"matchLabels": {"team": "a"}},
        ),
    )
    await apply(cluster, namespace, app_queue("team", cq))
    await run_dispatcher()
    await apply(cluster, namespace, work("outsider", "1", "team"))
    await wait_message(
        cluster, namespace, "outsider", f"cluster queue {cq} does not admit namespace {namespace}"
    )
    await cluster.akubectl("label", "namespace", namespace, "team=a")
    await wait_condition(cluster, namespace, "outsider", "Dispatched")

    gpu = appwrapper("gpu", deployment("gpu", 1, {"cpu": "1", "nvidia.com/gpu": "1"}), queue="team")
    await apply(cluster, namespace, gpu)
    await wait_message(cluster, namespace, "gpu", f"queue {cq} does not cover nvidia.com/gpu")

    # A quota lowered below what is in use: nothing is evicted, nothing new is admitted,
    # and the queue's status says so.
    await apply(cluster, namespace, work("more", "2", "team"))
    await wait_condition(cluster, namespace, "more", "Dispatched")
    await apply_cluster(
        cluster,
        cluster_queue(
            cq,
            {DEFAULT: {"cpu": 1, "memory": "8G"}},
            namespaceSelector={"matchLabels": {"team": "a"}},
        ),
    )
    await apply(cluster, namespace, work("late", "1", "team"))
    await wait_message(cluster, namespace, "late", f"queue {cq}: needs cpu 1; nominal 1")

    async def still_running() -> bool:
        return await dispatched(cluster, namespace, "outsider") and await dispatched(
            cluster, namespace, "more"
        )

    await async_holds_for(still_running, seconds=QUIET_SECONDS, what="nothing evicted")

    async def over_quota() -> str | None:
        out = await cluster.akubectl(
            "get", "caq", cq, "-o", "jsonpath={.status.conditions[0].message}"
        )
        return out.stdout if "over its quota" in out.stdout else None

    await async_wait_until(over_quota, timeout=15, what="status says over quota")

    # A cohort cycle: reported on the queue, never looped on.
    await apply_cluster(
        cluster,
        {
            "apiVersion": "workload.codeflare.dev/v1beta1",
            "kind": "AppCohort",
            "metadata": {"name": f"{namespace}-x"},
            "spec": {"parent": f"{namespace}-y"},
        },
    )
    await apply_cluster(
        cluster,
        {
            "apiVersion": "workload.codeflare.dev/v1beta1",
            "kind": "AppCohort",
            "metadata": {"name": f"{namespace}-y"},
            "spec": {"parent": f"{namespace}-x"},
        },
    )
    looped = cluster_queue(f"{cq}-looped", {DEFAULT: {"cpu": 1}}, cohort=f"{namespace}-x")
    await apply_cluster(cluster, looped)

    async def inactive() -> str | None:
        out = await cluster.akubectl(
            "get",
            "caq",
            f"{cq}-looped",
            "-o",
            "jsonpath={.status.conditions[0].status} {.status.conditions[0].message}",
        )
        return out.stdout if out.stdout.startswith("False") else None

    text = await async_wait_until(inactive, timeout=15, what="looped queue inactive")
    assert f"cohort cycle: {namespace}-x -> {namespace}-y -> {namespace}-x" in text

    # A flavor that matches no node: the wait names it.
    await apply_cluster(cluster, app_flavor(f"{namespace}-nowhere", {"tier": "nowhere"}))
    await apply_cluster(
        cluster, cluster_queue(f"{cq}-nowhere", {f"{namespace}-nowhere": {"cpu": 4}})
    )
    await apply(cluster, namespace, app_queue("nowhere", f"{cq}-nowhere"))
    await apply(cluster, namespace, work("stranded", "1", "nowhere"))
    message = await wait_message(cluster, namespace, "stranded", "no schedulable node matches")
    assert message.endswith(f"(in flavor {namespace}-nowhere)")


async def test_a_borrower_gives_back_what_it_borrowed_and_keeps_its_own(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    fake_nodes.add("n", cpu="8", memory="64Gi")
    cohort = f"{namespace}-cohort"
    a, b = f"{namespace}-a", f"{namespace}-b"
    await apply_cluster(cluster, app_flavor(DEFAULT))
    await apply_cluster(
        cluster,
        cluster_queue(
            a, {DEFAULT: {"cpu": 4}}, cohort=cohort, preemption={"reclaimWithinCohort": "Any"}
        ),
    )
    await apply_cluster(cluster, cluster_queue(b, {DEFAULT: {"cpu": 4}}, cohort=cohort))
    await apply(cluster, namespace, app_queue("a", a))
    await apply(cluster, namespace, app_queue("b", b))
    await run_dispatcher()
    # A is idle: B borrows 2 of A's 4.
    for index in range(3):
        await apply(cluster, namespace, work(f"b{index}", "2", "b"))
        await wait_condition(cluster, namespace, f"b{index}", "Dispatched")
    assert (await get_aw(cluster, namespace, "b2"))["status"]["admission"]["borrowing"] is True

    # A wants its own back.
    await apply(cluster, namespace, work("a0", "4", "a"))
    await wait_condition(cluster, namespace, "a0", "Running", timeout=60)
    aw = await get_aw(cluster, namespace, "b2")
    assert aw["status"]["preemptedBy"] == f"{namespace}/a0" or not await dispatched(
        cluster, namespace, "b2"
    )

    async def b_keeps_its_own() -> bool:
        return (
            await dispatched(cluster, namespace, "b0")
            and await dispatched(cluster, namespace, "b1")
            and not await dispatched(cluster, namespace, "b2")
        )

    await async_holds_for(b_keeps_its_own, seconds=QUIET_SECONDS, what="b keeps its nominal quota")


async def test_flavors_fill_on_demand_then_spot_and_pods_land_on_their_nodes(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    on_demand = fake_nodes.add("od", cpu="4", memory="64Gi", labels={"tier": f"{namespace}-od"})
    spot = fake_nodes.add("spot", cpu="8", memory="64Gi", labels={"tier": f"{namespace}-spot"})
    cq = f"{namespace}-cq"
    await apply_cluster(cluster, app_flavor("on-demand", {"tier": f"{namespace}-od"}))
    await apply_cluster(cluster, app_flavor("spot", {"tier": f"{namespace}-spot"}))
    await apply_cluster(cluster, cluster_queue(cq, {"on-demand": {"cpu": 4}, "spot": {"cpu": 8}}))
    await apply(cluster, namespace, app_queue("team", cq))
    await run_dispatcher()
    for index in range(6):
        await apply(cluster, namespace, work(f"w{index}", "1", "team"))
    for index in range(6):
        await wait_condition(cluster, namespace, f"w{index}", "Running", timeout=60)
    where: dict[str, list[str]] = {}
    for index in range(6):
        aw = await get_aw(cluster, namespace, f"w{index}")
        flavor = aw["status"]["admission"]["flavors"][0]["name"]
        (pod,) = await pods_of(cluster, namespace, f"w{index}")
        assert (
            pod["spec"]["nodeSelector"]["tier"]
            == f"{namespace}-{'od' if flavor == 'on-demand' else 'spot'}"
        )
        where.setdefault(flavor, []).append(pod["spec"]["nodeName"])
    assert sorted(where) == ["on-demand", "spot"]
    assert where["on-demand"] == [on_demand] * 4
    assert where["spot"] == [spot] * 2


async def test_hold_and_drain_evicts_and_holds_until_the_queue_reopens(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    cq = await one_queue(cluster, namespace, fake_nodes)
    await run_dispatcher()
    for name in ("one", "two"):
        await apply(cluster, namespace, work(name, "1", "team"))
        await wait_condition(cluster, namespace, name, "Running", timeout=60)

    await cluster.akubectl(
        "patch", "caq", cq, "--type=merge", "-p", '{"spec":{"stopPolicy":"HoldAndDrain"}}'
    )
    for name in ("one", "two"):
        await wait_message(cluster, namespace, name, f"cluster queue {cq} is stopped")
    aw = await get_aw(cluster, namespace, "one")
    found = {c["type"]: c for c in aw["status"]["conditions"]}
    assert found["Dispatched"]["status"] == "False"
    assert (found["Requeued"]["status"], found["Requeued"]["reason"]) == ("True", "QueueDrained")
    await async_holds_for(
        lambda: not_dispatched(cluster, namespace, "one", "two"),
        seconds=QUIET_SECONDS,
        what="a drained queue admits nothing",
    )
    await cluster.akubectl(
        "patch", "caq", cq, "--type=merge", "-p", '{"spec":{"stopPolicy":"None"}}'
    )
    for name in ("one", "two"):
        await wait_condition(cluster, namespace, name, "Running", timeout=60)


async def test_a_three_level_tree_shares_by_weight(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    fake_nodes.add("n", cpu="16", memory="64Gi")
    root, mid = f"{namespace}-root", f"{namespace}-mid"
    light, heavy = f"{namespace}-light", f"{namespace}-heavy"
    await apply_cluster(cluster, app_flavor(DEFAULT))
    await apply_cluster(cluster, app_cohort(root))  # its quota comes last (below)
    await apply_cluster(cluster, app_cohort(mid, root))
    # Nothing of their own: all either runs is lent down the tree from the root's 6 cpu.
    for name, weight in ((light, "1"), (heavy, "2")):
        await apply_cluster(
            cluster,
            cluster_queue(name, {DEFAULT: {"cpu": 0}}, cohort=mid, fairSharing={"weight": weight}),
        )
    await apply(cluster, namespace, app_queue("light", light))
    await apply(cluster, namespace, app_queue("heavy", heavy))
    for index in range(6):
        await apply(cluster, namespace, work(f"l{index}", "1", "light"))
        await apply(cluster, namespace, work(f"h{index}", "1", "heavy"))
    await run_dispatcher(fair_sharing=True)
    # Every one taken in and waiting (no quota anywhere yet); then the root's quota, one
    # object, so that one cycle decides all twelve together.
    for prefix in ("l", "h"):
        for index in range(6):
            await wait_message(cluster, namespace, f"{prefix}{index}", "can ever have is 0")
    await apply_cluster(cluster, app_cohort(root, flavors={DEFAULT: {"cpu": 6}}))

    async def admitted() -> tuple[int, int] | None:
        counts = []
        for prefix in ("l", "h"):
            count = 0
            for index in range(6):
                count += await dispatched(cluster, namespace, f"{prefix}{index}")
            counts.append(count)
        return (counts[0], counts[1]) if sum(counts) == 6 else None

    assert await async_wait_until(admitted, timeout=30, what="six admitted") == (2, 4)
    # (A new kind of reason is written within the waiting writer's 10 s.) Behind the head
    # of its queue, its status says its own terms: what the queue uses and the cohort lends
    # move with others' work, and are the pending list's and the queue's status's to tell.
    message = await wait_message(cluster, namespace, "l5", f"queue {light}: needs cpu 1; nominal 0")
    assert message == f"queue {light}: needs cpu 1; nominal 0"


async def test_a_queue_deleted_with_admitted_work_stays_until_it_finishes(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    cq = await one_queue(cluster, namespace, fake_nodes)
    await run_dispatcher()
    await apply(cluster, namespace, work("running", "1", "team"))
    await wait_condition(cluster, namespace, "running", "Running", timeout=60)

    async def guarded() -> bool:
        out = await cluster.akubectl("get", "caq", cq, "-o", "jsonpath={.metadata.finalizers}")
        return "workload.codeflare.dev/finalizer" in out.stdout

    await async_wait_until(guarded, timeout=15, what="the queue's finalizer")
    await cluster.akubectl("delete", "caq", cq, "--wait=false")
    await apply(cluster, namespace, work("late", "1", "team"))
    await wait_message(cluster, namespace, "late", f"cluster queue {cq} is inactive: being deleted")

    async def queue_stays() -> bool:
        out = await cluster.akubectl("get", "caq", cq, "-o", "name", check=False)
        return out.returncode == 0 and await dispatched(cluster, namespace, "running")

    await async_holds_for(queue_stays, seconds=QUIET_SECONDS, what="queue kept while in use")
    await cluster.akubectl("delete", "appwrapper", "running", "-n", namespace, "--timeout=60s")

    async def queue_gone() -> bool:
        out = await cluster.akubectl("get", "caq", cq, "-o", "name", check=False)
        return out.returncode != 0

    await async_wait_until(queue_gone, timeout=30, what="queue deleted once unused")
    await wait_message(
        cluster, namespace, "late", f"points at cluster queue {cq}, which does not exist"
    )


async def test_an_under_declared_appwrapper_is_charged_by_its_templates(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    """custompodresources declaring 1m CPU over a Deployment asking 8 GPUs: placement reads
    the declaration (declared_pod_resources: as_written, the default), the queue charges
    the templates, so a second such AppWrapper finds the GPUs taken and waits."""
    fake_nodes.add("gpus", cpu="32", memory="64Gi", gpu=16)
    cq = f"{namespace}-cq"
    await apply_cluster(cluster, app_flavor(DEFAULT))
    await apply_cluster(cluster, cluster_queue(cq, {DEFAULT: {"cpu": 8, GPU: 8}}))
    await apply(cluster, namespace, app_queue("team", cq))
    await run_dispatcher()
    tiny = [{"replicas": 1, "requests": {"cpu": "1m"}}]
    for name in ("first", "second"):
        template = deployment(name, 1, {"cpu": "1", GPU: "8"})
        await apply(cluster, namespace, appwrapper(name, template, queue="team", custom=tiny))
    await wait_condition(cluster, namespace, "first", "Dispatched")
    message = await wait_message(cluster, namespace, "second", f"queue {cq}:")
    assert message == f"queue {cq}: needs {GPU} 8; nominal 8, in use 8, cohort can lend 0"
    found = {
        c["type"]: c for c in (await get_aw(cluster, namespace, "second"))["status"]["conditions"]
    }
    assert found["Dispatched"]["reason"] == "QuotaExceeded"

    async def usage() -> list[dict[str, Any]] | None:
        out = await cluster.akubectl("get", "caq", cq, "-o", "jsonpath={.status.flavorsUsage}")
        found = json.loads(out.stdout or "null")
        return found if found and found[0]["resources"][1]["total"] == "8" else None

    shown = await async_wait_until(usage, timeout=15, what="the queue shows the templates' use")
    assert shown == [
        {
            "name": DEFAULT,
            "resources": [
                {"name": "cpu", "total": "1", "borrowed": "0"},
                {"name": GPU, "total": "8", "borrowed": "0"},
            ],
        }
    ]
    await async_holds_for(
        lambda: not_dispatched(cluster, namespace, "second"),
        seconds=QUIET_SECONDS,
        what="the second under-declared AppWrapper stays queued",
    )
