"""Multi-cluster dispatch: a hub holding AppWrappers, two member control planes of its own.

Each member takes the hub namespaces its `namespaces` mapping names, and puts their objects
in the namespace it maps them to; most tests map the test's namespace to itself, created in
the member on first use.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher.config import MemberConfig
from testenv.localcluster import LocalCluster, ensure_binaries
from testenv.manifests import app_flavor, app_queue, cluster_queue
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    deployment,
    get_aw,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def members(cluster_workdir: Path) -> Iterator[dict[str, LocalCluster]]:
    binaries = ensure_binaries()
    started: dict[str, LocalCluster] = {}
    try:
        for name in ("east", "west"):
            started[name] = LocalCluster.start(name, cluster_workdir, binaries=binaries)
        yield started
    finally:
        for member in started.values():
            member.stop()


class MemberNodes:
    def __init__(self, members: dict[str, LocalCluster], pool: str) -> None:
        self.members = members
        self.pool = pool
        self.made: list[tuple[str, str]] = []

    def add(self, member: str, suffix: str, **kwargs: Any) -> str:
        name = f"{self.pool}-{suffix}"[:63]
        self.members[member].add_node(name, labels={"appwrapper.test/pool": self.pool}, **kwargs)
        self.members[member].wait_nodes_ready([name])
        self.made.append((member, name))
        return name

    def cleanup(self) -> None:
        for member, name in self.made:
            self.members[member].kubectl("delete", "node", name, "--wait=false", check=False)


@pytest.fixture
def member_nodes(members, namespace) -> Iterator[MemberNodes]:
    nodes = MemberNodes(members, namespace)
    yield nodes
    nodes.cleanup()


def member_configs(members, namespace, **extra: dict[str, Any]) -> list[MemberConfig]:
    """Every member, taking the test's namespace under its own name (created when missing,
    with no Pod Security label: the test pods set no securityContext), unless `extra`
    (member name -> settings) says otherwise."""
    pool = {"appwrapper.test/pool": namespace}
    settings: dict[str, Any] = {
        "namespaces": {namespace: namespace},
        "create_namespaces": True,
        "namespace_labels": {},
    }
    return [
        MemberConfig(
            name=name,
            kubeconfig=str(cluster.kubeconfig),
            node_selector=pool,
            labels={"region": name},
            **(settings | extra.get(name, {})),
        )
        for name, cluster in members.items()
    ]


def gpu_deployment(name: str, replicas: int, gpus: int) -> dict[str, Any]:
    return deployment(name, replicas, {"cpu": "1", "nvidia.com/gpu": str(gpus)})


async def member_objects(member: LocalCluster, namespace: str, kind: str = "deployments"):
    out = await member.akubectl("get", kind, "-n", namespace, "-o", "json", check=False)
    if out.returncode != 0:
        return []
    return [i["metadata"]["name"] for i in json.loads(out.stdout)["items"]]


async def test_lands_where_it_fits_and_reports_back(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("west", "gpu", gpu=4)
    member_nodes.add("east", "cpu", gpu=0)
    await run_dispatcher(members=member_configs(members, namespace))
    await apply(cluster, namespace, appwrapper("train", gpu_deployment("train", 2, 2)))
    await wait_condition(cluster, namespace, "train", "Running", timeout=90)
    status = (await get_aw(cluster, namespace, "train"))["status"]
    assert status["clusterName"] == "west"
    assert status["running"] == 2

    async def only_west_runs_it() -> bool:
        assert await member_objects(members["west"], namespace) == ["train"]
        assert await member_objects(members["east"], namespace) == []
        assert await member_objects(cluster, namespace) == []  # the hub runs nothing itself
        return True

    await async_holds_for(only_west_runs_it, seconds=QUIET_SECONDS, what="objects only in west")
    table = (await cluster.akubectl("get", "aw", "-n", namespace)).stdout
    assert "west" in table


async def test_gang_stays_within_one_cluster(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("east", "a", gpu=2)
    member_nodes.add("west", "a", gpu=2)
    await run_dispatcher(members=member_configs(members, namespace))
    await apply(cluster, namespace, appwrapper("four", gpu_deployment("four", 4, 1)))

    async def waits_everywhere() -> str | None:
        message = ((await get_aw(cluster, namespace, "four")).get("status") or {}).get(
            "message"
        ) or ""
        return message if "east" in message and "west" in message else None

    message = await async_wait_until(waits_everywhere, timeout=30, what="per-member message")
    assert "nvidia.com/gpu 4" in message
    member_nodes.add("east", "b", gpu=2)
    await wait_condition(cluster, namespace, "four", "Running", timeout=90)
    assert (await get_aw(cluster, namespace, "four"))["status"]["clusterName"] == "east"


@pytest.mark.parametrize(
    ("scheduling", "want"),
    [
        pytest.param({"clusters": [{"name": "east"}]}, "east", id="clusters"),
        pytest.param(
            {"clusterSelector": {"matchLabels": {"region": "west"}}}, "west", id="cluster-selector"
        ),
    ],
)
async def test_cluster_scheduling_is_honoured(
    cluster, namespace, members, member_nodes, run_dispatcher, scheduling, want
):
    member_nodes.add("east", "n", cpu="8")
    member_nodes.add("west", "n", cpu="8")
    await run_dispatcher(members=member_configs(members, namespace))
    for index in range(3):
        await apply(
            cluster,
            namespace,
            appwrapper(
                f"pinned-{index}",
                deployment(f"pinned-{index}", 1, {"cpu": "1"}),
                scheduling={"clusterScheduling": scheduling},
            ),
        )
    for index in range(3):
        await wait_condition(cluster, namespace, f"pinned-{index}", "Running", timeout=60)
        status = (await get_aw(cluster, namespace, f"pinned-{index}"))["status"]
        assert status["clusterName"] == want


async def test_deletion_and_orphans_are_cleaned_in_members(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("east", "n", cpu="8")
    configs = member_configs(members, namespace)
    await run_dispatcher(members=configs)
    await apply(cluster, namespace, appwrapper("gone", deployment("gone", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "gone", "Running", timeout=60)
    await cluster.akubectl("delete", "aw", "gone", "-n", namespace, "--timeout=60s")
    assert await member_objects(members["east"], namespace) == []

    # An orphan: objects the dispatcher made in a member for a hub AppWrapper that no longer
    # exists (as if it was deleted while the dispatcher was down and its finalizer forced
    # off). Made under the dispatcher's field manager: objects that only wear its labels are
    # someone else's and are never collected.
    orphan = deployment("orphan", 1, {"cpu": "1"})
    orphan["metadata"]["labels"] = {
        "workload.codeflare.dev/appwrapper": "vanished",
        "workload.codeflare.dev/appwrapper-namespace": namespace,
        "workload.codeflare.dev/appwrapper-uid": "0000-gone",
    }
    await members["east"].akubectl(
        "create",
        "--field-manager=appwrapper-dispatcher",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(orphan),
    )
    # A restarted dispatcher sweeps members once they answer.
    await run_dispatcher(restart=True, members=configs)

    async def collected() -> bool:
        return "orphan" not in await member_objects(members["east"], namespace)

    await async_wait_until(collected, timeout=30, what="orphan collected")


async def test_silent_member_work_moves_elsewhere(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("east", "n", cpu="4")
    configs = member_configs(members, namespace)
    await run_dispatcher(members=configs, member_timeout_seconds=5)
    pinned = {"clusterScheduling": {"clusters": [{"name": "east"}, {"name": "west"}]}}
    await apply(
        cluster,
        namespace,
        appwrapper("mover", deployment("mover", 1, {"cpu": "2"}), scheduling=pinned),
    )
    await wait_condition(cluster, namespace, "mover", "Running", timeout=60)
    assert (await get_aw(cluster, namespace, "mover"))["status"]["clusterName"] == "east"
    member_nodes.add("west", "n", cpu="4")
    members["east"].pause_api()
    try:

        async def moved_west() -> bool:
            status = (await get_aw(cluster, namespace, "mover")).get("status") or {}
            return status.get("clusterName") == "west" and status.get("state") == "Running"

        await async_wait_until(moved_west, timeout=90, what="requeued to west")
        status = (await get_aw(cluster, namespace, "mover"))["status"]
        requeued = next(c for c in status["conditions"] if c["type"] == "Requeued")
        assert requeued["reason"] == "ClusterUnreachable"
    finally:
        members["east"].resume_api()

    async def east_cleaned() -> bool:
        return await member_objects(members["east"], namespace) == []

    await async_wait_until(east_cleaned, timeout=60, what="stale copy removed from east")
    assert await member_objects(members["west"], namespace) == ["mover"]


async def test_many_appwrappers_never_overcommit_a_member(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("east", "n", cpu="6", memory="64Gi")
    member_nodes.add("west", "n", cpu="4", memory="64Gi")
    await run_dispatcher(members=member_configs(members, namespace))
    for index in range(16):
        await apply(
            cluster, namespace, appwrapper(f"w{index}", deployment(f"w{index}", 1, {"cpu": "1"}))
        )

    async def ten_running() -> bool:
        out = await cluster.akubectl("get", "aw", "-n", namespace, "-o", "json")
        items = json.loads(out.stdout)["items"]
        return sum(1 for i in items if (i.get("status") or {}).get("state") == "Running") == 10

    await async_wait_until(ten_running, timeout=90, what="10 of 16 running (all that fit)")
    for name, limit in (("east", 6), ("west", 4)):
        out = await members[name].akubectl("get", "pods", "-n", namespace, "-o", "json")
        pods = [
            p
            for p in json.loads(out.stdout)["items"]
            if p["status"].get("phase") in ("Pending", "Running")
        ]
        assert len(pods) == limit
        assert all(p["status"]["phase"] == "Running" for p in pods)


async def test_member_down_at_start_does_not_hold_back_the_hub(
    cluster, namespace, members, member_nodes, fake_nodes, run_dispatcher
):
    """A member whose API server does not answer when the dispatcher starts: dispatching to
    the hub's own member starts anyway (after at most member_sync_timeout_seconds); nothing
    goes to the silent member until its caches have synced; then it joins."""
    fake_nodes.add("n", cpu="4")
    member_nodes.add("east", "n", cpu="4")
    configs = [
        MemberConfig(name="local", node_selector=fake_nodes.pool),
        *member_configs(members, namespace),
    ]
    members["east"].pause_api()
    try:
        started = time.monotonic()
        await run_dispatcher(members=configs)
        assert time.monotonic() - started < 30
        only = {"clusterScheduling": {"clusters": [{"name": "local"}]}}
        await apply(
            cluster,
            namespace,
            appwrapper("here", deployment("here", 1, {"cpu": "1"}), scheduling=only),
        )
        east = {"clusterScheduling": {"clusters": [{"name": "east"}]}}
        await apply(
            cluster,
            namespace,
            appwrapper("there", deployment("there", 1, {"cpu": "1"}), scheduling=east),
        )
        await wait_condition(cluster, namespace, "here", "Running", timeout=60)
        assert (await get_aw(cluster, namespace, "here"))["status"]["clusterName"] == "local"

        async def not_dispatched() -> bool:
            status = (await get_aw(cluster, namespace, "there")).get("status") or {}
            assert not status.get("clusterName"), status
            return True

        await async_holds_for(not_dispatched, seconds=QUIET_SECONDS, what="nothing to east")
    finally:
        members["east"].resume_api()
    await wait_condition(cluster, namespace, "there", "Running", timeout=90)
    assert (await get_aw(cluster, namespace, "there"))["status"]["clusterName"] == "east"


async def test_a_queue_in_the_hub_caps_admissions_across_members(
    cluster, namespace, members, member_nodes, run_dispatcher, quotas
):
    # Room for all four in the members (8 cpu each); the queue's quota is 4 cpu in all.
    member_nodes.add("east", "n", cpu="8")
    member_nodes.add("west", "n", cpu="8")
    cq = f"{namespace}-cq"
    for obj in (app_flavor("default-flavor"), cluster_queue(cq, {"default-flavor": {"cpu": 4}})):
        await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))
    await apply(cluster, namespace, app_queue("team", cq))
    await run_dispatcher(members=member_configs(members, namespace))
    for index in range(4):
        spread = {"clusterScheduling": {"clusters": [{"name": "east" if index % 2 else "west"}]}}
        body = deployment(f"w{index}", 1, {"cpu": "2"})
        await apply(
            cluster, namespace, appwrapper(f"w{index}", body, queue="team", scheduling=spread)
        )

    async def two_admitted() -> list[str] | None:
        placed = []
        for index in range(4):
            status = (await get_aw(cluster, namespace, f"w{index}")).get("status") or {}
            if status.get("clusterName"):
                placed.append(status["clusterName"])
        return placed if len(placed) == 2 else None

    placed = await async_wait_until(two_admitted, timeout=30, what="two of four admitted")
    assert sorted(placed) == ["east", "west"]  # the oldest two, one in each member

    async def still_two() -> bool:
        placed = await two_admitted()
        return placed is not None

    await async_holds_for(still_two, seconds=QUIET_SECONDS, what="the hub's quota caps both")
    waiting = [
        ((await get_aw(cluster, namespace, f"w{index}")).get("status") or {}).get("message", "")
        for index in range(4)
    ]
    # The head's message is live ("..., in use 4"); the one behind it says its own terms.
    assert sum(m.startswith(f"queue {cq}: needs cpu 2; nominal 4") for m in waiting) == 2


# -- namespaces in members (members[].namespaces) -------------------------------------------


async def labelled_anywhere(member: LocalCluster, namespace: str) -> list[str]:
    """Deployments anywhere in the member made for AppWrappers of hub namespace `namespace`."""
    out = await member.akubectl(
        "get",
        "deployments",
        "-A",
        "-l",
        f"workload.codeflare.dev/appwrapper-namespace={namespace}",
        "-o",
        "json",
    )
    return [
        f"{i['metadata']['namespace']}/{i['metadata']['name']}"
        for i in json.loads(out.stdout)["items"]
    ]


async def aw_message(cluster, namespace: str, name: str) -> str:
    return str(((await get_aw(cluster, namespace, name)).get("status") or {}).get("message", ""))


async def test_an_unmapped_namespace_never_reaches_a_member(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("east", "n", cpu="8")
    member_nodes.add("west", "n", cpu="8")
    elsewhere = {"namespaces": {"some-other-team": "some-other-team"}}
    configs = member_configs(members, namespace, east=elsewhere, west=elsewhere)
    await run_dispatcher(members=configs)
    await apply(cluster, namespace, appwrapper("lost", deployment("lost", 1, {"cpu": "1"})))
    want = (
        f"clusters east, west: namespace {namespace} is not mapped to them (members[].namespaces)"
    )

    async def says_why() -> bool:
        return await aw_message(cluster, namespace, "lost") == want

    await async_wait_until(says_why, timeout=30, what="the mapping named as the reason")

    async def never_dispatched() -> bool:
        status = (await get_aw(cluster, namespace, "lost")).get("status") or {}
        assert not status.get("clusterName"), status
        assert status.get("message") == want, status
        for member in members.values():
            assert await labelled_anywhere(member, namespace) == []
        return True

    await async_holds_for(never_dispatched, seconds=QUIET_SECONDS, what="nothing in members")


async def test_a_namespace_mapped_to_another_name_runs_there(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("west", "n", cpu="8")
    there = f"{namespace}-w"[:63]
    await members["west"].akubectl("create", "namespace", there)
    try:
        mapped = {"namespaces": {namespace: there}, "create_namespaces": False}
        configs = member_configs(members, namespace, west=mapped)
        await run_dispatcher(members=configs)
        await apply(cluster, namespace, appwrapper("moved", deployment("moved", 2, {"cpu": "1"})))
        await wait_condition(cluster, namespace, "moved", "Running", timeout=90)
        status = (await get_aw(cluster, namespace, "moved"))["status"]
        assert status["clusterName"] == "west"
        assert status["running"] == 2  # its pods, counted from the mapped namespace
        assert await labelled_anywhere(members["west"], namespace) == [f"{there}/moved"]
        assert await member_objects(members["west"], namespace) == []
        out = await members["west"].akubectl("get", "pods", "-n", there, "-o", "json")
        pods = json.loads(out.stdout)["items"]
        assert len(pods) == 2
        assert all(
            p["metadata"]["labels"]["workload.codeflare.dev/appwrapper-namespace"] == namespace
            for p in pods
        )

        await cluster.akubectl("delete", "aw", "moved", "-n", namespace, "--timeout=60s")
        assert await member_objects(members["west"], there) == []
    finally:
        await members["west"].akubectl("delete", "namespace", there, "--wait=false", check=False)


async def test_create_namespaces_makes_the_member_namespace_with_its_labels(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("west", "n", cpu="8")
    there = f"{namespace}-c"[:63]
    labels = {
        "appwrapper.test/made-by": "dispatcher",
        "pod-security.kubernetes.io/warn": "baseline",
    }
    made = {"namespaces": {namespace: there}, "namespace_labels": labels}
    await run_dispatcher(members=member_configs(members, namespace, west=made))
    try:
        await apply(cluster, namespace, appwrapper("fresh", deployment("fresh", 1, {"cpu": "1"})))
        await wait_condition(cluster, namespace, "fresh", "Running", timeout=90)
        out = await members["west"].akubectl("get", "namespace", there, "-o", "json")
        got = json.loads(out.stdout)["metadata"].get("labels") or {}
        assert {k: got.get(k) for k in labels} == labels
        assert await member_objects(members["west"], there) == ["fresh"]
    finally:
        await members["west"].akubectl("delete", "namespace", there, "--wait=false", check=False)


async def test_a_missing_member_namespace_fails_with_the_message(
    cluster, namespace, members, member_nodes, run_dispatcher
):
    member_nodes.add("west", "n", cpu="8")
    absent = f"{namespace}-absent"[:63]
    missing = {"namespaces": {namespace: absent}, "create_namespaces": False}
    await run_dispatcher(members=member_configs(members, namespace, west=missing))
    await apply(cluster, namespace, appwrapper("nowhere", deployment("nowhere", 1, {"cpu": "1"})))
    await wait_condition(cluster, namespace, "nowhere", "Failed", timeout=60)
    status = (await get_aw(cluster, namespace, "nowhere"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DispatchFailed"
    assert failed["message"] == (
        f"creating the wrapped objects failed: namespace {absent} does not exist in cluster "
        "west: create it there, or set members[].create_namespaces"
    )
    out = await members["west"].akubectl("get", "namespace", absent, check=False)
    assert out.returncode != 0  # never created
