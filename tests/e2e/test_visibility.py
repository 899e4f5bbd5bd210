"""See the queue, against the real API server: the pending list through the aggregation
layer (`kubectl get --raw` as users with and without rights), the `kubectl aw` plugin as a
user types it, and the web view.

The dispatcher serves the visibility API on 127.0.0.1; an APIService names an ExternalName
Service pointing there (the local control plane runs no kube-proxy), as
`testenv.manifests.visibility_registration` builds it. Each test gets the same
queue: a node with room for one AppWrapper, one running for at most an hour, three waiting.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from dispatcher.config import VisibilityConfig
from dispatcher.controller.manager import Manager
from dispatcher.controller.visibility.api import BASE
from testenv.localcluster import KubectlError, free_port
from testenv.manifests import (
    app_flavor,
    app_queue,
    cluster_queue,
    visibility_registration,
)
from testenv.waits import async_wait_until
from tests.e2e.conftest import (
    StartDispatcher,
    apply,
    appwrapper,
    pod_template,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]


def pod(name: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        **pod_template({"cpu": cpu}),
    }


@dataclass
class Queue:
    cluster: Any
    namespace: str
    dispatcher: Manager

    async def raw(self, path: str, *, user: str) -> dict[str, Any]:
        out = await self.cluster.akubectl("get", "--raw", BASE + path, f"--as={user}")
        return dict(json.loads(out.stdout))


def grant_list(cluster: Any, namespace: str, user: str) -> None:
    """`user` may list AppWrappers in `namespace` (and nothing else there)."""
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "aw-reader", "namespace": namespace},
            "rules": [
                {
                    "apiGroups": ["workload.codeflare.dev"],
                    "resources": ["appwrappers"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        }
    )
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"aw-reader-{user}", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "aw-reader",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )


@pytest_asyncio.fixture
async def queue(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: StartDispatcher
) -> AsyncIterator[Queue]:
    fake_nodes.add("n1", cpu="1")
    dispatcher = await start_visible(cluster, namespace, run_dispatcher)
    # Above the waiting ones' priorities: none of them may preempt it.
    running = appwrapper(
        "long-1",
        pod("long-1", "1"),
        priority=100,
        scheduling={"dispatchDuration": {"limit": 3600}},
    )
    await apply(cluster, namespace, running)
    await wait_condition(cluster, namespace, "long-1", "Dispatched")
    for index, name in enumerate(["wait-a", "wait-b", "wait-c"]):
        await apply(cluster, namespace, appwrapper(name, pod(name, "1"), priority=10 - index))
    state = Queue(cluster, namespace, dispatcher)

    async def listed() -> bool:
        try:
            answer = await state.raw(f"/namespaces/{namespace}/pendingappwrappers", user="alice")
        except KubectlError:
            return False  # the APIService not yet available
        return len(answer["items"]) == 3

    await async_wait_until(listed, timeout=60, what="three pending AppWrappers listed")
    yield state
    unregister(cluster)


async def start_visible(cluster: Any, namespace: str, run_dispatcher: StartDispatcher) -> Manager:
    """A dispatcher serving the visibility API, registered; alice may list AppWrappers."""
    port = free_port()
    for manifest in visibility_registration(port, namespace=namespace):
        cluster.apply(manifest)
    grant_list(cluster, namespace, "alice")
    return await run_dispatcher(
        visibility=VisibilityConfig(
            enabled=True, host="127.0.0.1", port=port, extra_names=["127.0.0.1"]
        )
    )


def unregister(cluster: Any) -> None:
    cluster.kubectl(
        "delete", "apiservice", f"v1alpha1.{BASE.split('/')[2]}", "--ignore-not-found", check=False
    )


async def test_pending_list_positions_and_eta(queue: Queue) -> None:
    ns = queue.namespace
    answer = await queue.raw(f"/namespaces/{ns}/pendingappwrappers", user="alice")
    items = answer["items"]
    assert [(i["metadata"]["name"], i["position"], i["positionInClusterQueue"]) for i in items] == [
        ("wait-a", 1, 1),
        ("wait-b", 2, 2),
        ("wait-c", 3, 3),
    ]
    assert [i["priority"] for i in items] == [10, 9, 8]
    assert items[0]["reason"] == "InsufficientResources"
    assert "cpu" in items[0]["message"]
    # long-1 runs for at most an hour: the head reserves its node from when long-1's limit
    # ends it, and starts then at the latest (docs/scheduling.md, reservations).
    assert "reserved 1 node in cluster local from" in items[0]["message"]
    assert items[0]["eta"]["basis"].startswith("nodes reserved for it from ")
    assert items[0]["reservation"]["cluster"] == "local"
    assert items[0]["reservation"]["nodes"] == [f"{ns}-n1"]  # the one node long-1 holds
    assert "reservation" not in items[1]
    assert items[0]["eta"]["basis"].endswith("(declared limits), at the latest")
    assert items[0]["eta"]["latest"] is True
    assert items[0]["eta"]["at"]
    # Nothing known ends after wait-a (no limit, nothing observed yet).
    assert items[1]["eta"] == {
        "at": None,
        "latest": False,
        "basis": f"unknown: nothing ahead has a known end ({ns}/wait-a next)",
    }
    one = await queue.raw(f"/namespaces/{ns}/pendingappwrappers/wait-b", user="alice")
    assert one["position"] == 2
    capacity = await queue.raw("/clusterappqueues/-/pendingappwrappers", user="alice")
    assert [i["metadata"]["name"] for i in capacity["items"]] == ["wait-a", "wait-b", "wait-c"]


async def test_pending_list_only_where_the_user_may_list(queue: Queue) -> None:
    ns = queue.namespace
    # carol may read the visibility API (every authenticated user may) but not list
    # AppWrappers in the namespace: the namespace's list is refused, the others hide it.
    with pytest.raises(KubectlError) as refused:
        await queue.raw(f"/namespaces/{ns}/pendingappwrappers", user="carol")
    assert f"may not list appwrappers in namespace {ns}" in refused.value.stderr
    everything = await queue.raw("/pendingappwrappers", user="carol")
    assert everything["items"] == []
    assert everything["total"] == 0
    by_queue = await queue.raw("/clusterappqueues/-/pendingappwrappers", user="carol")
    assert by_queue["items"] == []
    mine = await queue.raw("/pendingappwrappers", user="alice")
    assert {i["metadata"]["namespace"] for i in mine["items"]} == {ns}


async def kubectl_aw(cluster: Any, *args: str, check: bool = True) -> Ran:
    """`kubectl aw ...` as a user types it: kubectl finds the plugin on PATH. (Not blocking
    the loop: the dispatcher answering it runs in this one.)"""
    plugin_dir = Path(sys.executable).parent  # the virtualenv's bin, where kubectl-aw is
    kubectl = Path(str(cluster.kubectl_path))
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(plugin_dir), str(kubectl.parent), os.environ["PATH"]]),
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    process = await asyncio.create_subprocess_exec(
        str(kubectl),
        "aw",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    ran = Ran(process.returncode or 0, out.decode(), err.decode())
    if check and ran.returncode:
        raise AssertionError(f"kubectl aw {' '.join(args)}: {ran.stderr}")
    return ran


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


async def test_plugin_commands(queue: Queue) -> None:
    ns, cluster = queue.namespace, queue.cluster
    done = await kubectl_aw(cluster, "list", "-n", ns, "--as=alice")
    assert done.stderr == ""
    listed = done.stdout.splitlines()
    assert listed[0].split() == ["NAME", "STATE", "QUEUE", "POSITION", "ETA"]
    rows = [line.split()[:4] for line in listed[1:]]
    assert rows[:3] == [
        ["wait-a", "Pending", "-", "1"],
        ["wait-b", "Pending", "-", "2"],
        ["wait-c", "Pending", "-", "3"],
    ]
    assert rows[3][0] == "long-1"
    assert rows[3][3] == "-"
    wide = (await kubectl_aw(cluster, "list", "-n", ns, "-o", "wide", "--as=alice")).stdout
    # wait-a reserves long-1's node from when long-1's limit ends it (its estimate's basis).
    assert "nodes reserved for it from" in wide
    as_json = json.loads(
        (await kubectl_aw(cluster, "list", "-n", ns, "-o", "json", "--as=alice")).stdout
    )
    assert [i["name"] for i in as_json["items"]][:3] == ["wait-a", "wait-b", "wait-c"]
    head = (await kubectl_aw(cluster, "why", "wait-a", "-n", ns, "--as=alice")).stdout
    assert f"  reserved: 1 node in cluster local ({ns}-n1), expected from " in head
    why = (await kubectl_aw(cluster, "why", "wait-b", "-n", ns, "--as=alice")).stdout
    assert f"{ns}/wait-b: Pending" in why
    assert "position: 2 overall, 2 in capacity-only work" in why
    assert "InsufficientResources" in why
    missing = await kubectl_aw(cluster, "why", "nope", "-n", ns, "--as=alice", check=False)
    assert missing.returncode == 1
    assert missing.stderr == f'error: appwrapper "nope" not found in namespace {ns}\n'
    refused = await kubectl_aw(cluster, "why", "wait-b", "-n", ns, "--as=carol", check=False)
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert "forbidden" in refused.stderr


async def test_cluster_queue_list_queues_stop_resume_and_view(
    cluster: Any, namespace: str, fake_nodes: Any, quotas: None, run_dispatcher: StartDispatcher
) -> None:
    """With a ClusterAppQueue of 2 cpu: its pending list and its AppQueue's, `kubectl aw
    queues`, `stop --drain` / `resume`, and the web view's queue page."""
    fake_nodes.add("n", cpu="8")
    cq = f"{namespace}-cq"
    for obj in (app_flavor("default-flavor"), cluster_queue(cq, {"default-flavor": {"cpu": 2}})):
        cluster.apply(obj)
    await apply(cluster, namespace, app_queue("team", cq))
    await start_visible(cluster, namespace, run_dispatcher)
    try:
        for name in ("q-1", "q-2", "q-3"):
            await apply(cluster, namespace, appwrapper(name, pod(name, "2"), queue="team"))
        await wait_condition(cluster, namespace, "q-1", "Dispatched")
        state = Queue(cluster, namespace, None)  # type: ignore[arg-type]

        async def two_pending() -> dict[str, Any] | None:
            try:
                answer = await state.raw(f"/clusterappqueues/{cq}/pendingappwrappers", user="alice")
            except KubectlError:
                return None
            return answer if len(answer["items"]) == 2 else None

        answer = await async_wait_until(two_pending, timeout=60, what="two pending in the queue")
        got = [
            (i["metadata"]["name"], i["positionInClusterQueue"], i["appQueue"], i["reason"])
            for i in answer["items"]
        ]
        assert got == [("q-2", 1, "team", "QuotaExceeded"), ("q-3", 2, "team", "QuotaExceeded")]
        local = await state.raw(
            f"/namespaces/{namespace}/appqueues/team/pendingappwrappers", user="alice"
        )
        assert [i["positionInAppQueue"] for i in local["items"]] == [1, 2]

        async def queue_row() -> list[str] | None:
            out = (await kubectl_aw(cluster, "queues")).stdout.splitlines()
            row = next((line.split() for line in out if f" {cq} " in f" {line} "), None)
            return row if row is not None and "cpu=2" in " ".join(row) else None

        row = await async_wait_until(queue_row, timeout=30, what="the queue's usage shown")
        assert row[:6] == ["ClusterAppQueue", cq, "None", "True", "2", "1"]

        stopped = await kubectl_aw(cluster, "stop", cq, "--drain")
        assert stopped.stdout == f"clusterappqueue/{cq} stopPolicy=HoldAndDrain\n"
        policy = cluster.kubectl("get", "clusterappqueue", cq, "-o", "jsonpath={.spec.stopPolicy}")
        assert policy.stdout == "HoldAndDrain"
        await kubectl_aw(cluster, "resume", cq)
        policy = cluster.kubectl("get", "clusterappqueue", cq, "-o", "jsonpath={.spec.stopPolicy}")
        assert policy.stdout == "None"
        missing = await kubectl_aw(cluster, "stop", "no-such-queue", check=False)
        assert (missing.returncode, missing.stderr) == (
            1,
            'error: clusterappqueue "no-such-queue" not found\n',
        )

        # The API server's proxy parses and writes HTML again (its quotes, not ours).
        page = await cluster.akubectl("get", "--raw", f"{BASE}/views/queues", "--as=alice")
        assert f'<h2 class="queue">{cq}</h2>' in page.stdout
        assert f"{namespace}/q-2" in page.stdout
    finally:
        unregister(cluster)


ADMIN = ("--as=root", "--as-group=system:masters")
"""A cluster-wide reader, impersonated as well (the test's own credentials may be anyone)."""


async def test_a_tenant_sees_only_her_queues_and_no_other_namespaces_names(
    cluster: Any, namespace: str, fake_nodes: Any, quotas: None, run_dispatcher: StartDispatcher
) -> None:
    """Team B runs first in a queue both teams share, and has a queue of its own. Alice
    (team A's namespace only, impersonated) sees the shared queue, not B's, and reads B's
    AppWrapper ahead of hers as "another namespace's AppWrapper"; a cluster-wide reader
    reads every name."""
    other = f"{namespace}-b"
    cluster.kubectl("delete", "namespace", other, "--ignore-not-found", "--wait=true", timeout=120)
    cluster.kubectl("create", "namespace", other)
    fake_nodes.add("n", cpu="8")
    shared, own = f"{namespace}-shared", f"{namespace}-b-own"
    only_b = {"matchLabels": {"kubernetes.io/metadata.name": other}}
    for obj in (
        app_flavor("default-flavor"),
        cluster_queue(shared, {"default-flavor": {"cpu": 1}}),
        cluster_queue(own, {"default-flavor": {"cpu": 1}}, namespaceSelector=only_b),
    ):
        cluster.apply(obj)
    await apply(cluster, namespace, app_queue("team", shared))
    await apply(cluster, other, app_queue("team", shared))
    await apply(cluster, other, app_queue("own", own))
    await start_visible(cluster, namespace, run_dispatcher)
    try:
        ahead = appwrapper(
            "b-secret",
            pod("b-secret", "1"),
            queue="team",
            scheduling={"dispatchDuration": {"limit": 3600}},
        )
        await apply(cluster, other, ahead)
        await wait_condition(cluster, other, "b-secret", "Dispatched")
        await apply(cluster, namespace, appwrapper("mine", pod("mine", "1"), queue="team"))

        async def listed(*who: str) -> dict[str, Any] | None:
            path = f"{BASE}/namespaces/{namespace}/pendingappwrappers"
            try:
                out = await cluster.akubectl("get", "--raw", path, *who)
            except KubectlError:
                return None
            items = json.loads(out.stdout)["items"]
            return dict(items[0]) if items and items[0]["eta"]["at"] else None

        mine = await async_wait_until(
            lambda: listed("--as=alice"), timeout=60, what="mine listed with an estimate"
        )
        assert mine["eta"]["basis"].startswith(
            "after another namespace's AppWrapper ends, at the latest "
        )
        assert other not in json.dumps(mine)
        admin = await async_wait_until(
            lambda: listed(*ADMIN), timeout=30, what="a cluster-wide reader's view"
        )
        assert admin["eta"]["basis"].startswith(f"after {other}/b-secret ends, at the latest ")

        page = (await cluster.akubectl("get", "--raw", f"{BASE}/views/queues", "--as=alice")).stdout
        assert f'<h2 class="queue">{shared}</h2>' in page
        assert own not in page
        assert other not in page
        everything = (await cluster.akubectl("get", "--raw", f"{BASE}/views/queues", *ADMIN)).stdout
        assert f'<h2 class="queue">{own}</h2>' in everything
    finally:
        unregister(cluster)
        await cluster.akubectl(
            "delete", "appwrappers", "--all", "-n", other, "--timeout=60s", check=False
        )
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
        # Not waited for: the `quotas` fixture removes what finalizers are left.
        cluster.kubectl(
            "delete", "clusterappqueue", shared, own, "--ignore-not-found", "--wait=false",
            check=False,
        )  # fmt: skip
