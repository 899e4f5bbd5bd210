"""A hub and a member on the in-memory API server, every loop running: the member's
`namespaces` mapping decides whether an AppWrapper may go there and where its objects go;
a missing member namespace is created or reported; two hub namespaces sharing one member
namespace keep apart; the collector sweeps where the mapping puts objects, and only there.

tests/e2e/test_multicluster.py runs the same on real API servers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from dispatcher.api.constants import FIELD_MANAGER, LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.clock import ManualClock
from dispatcher.cluster.member import NODES, PODS, Member
from dispatcher.cluster.objects import NAMESPACES, ensure_namespace
from dispatcher.config import Config, MemberConfig
from dispatcher.controller.manager import Manager
from dispatcher.controller.status import APPWRAPPERS
from dispatcher.kube.client import ResourceInfo
from testenv.fakeenv import node
from testenv.fakekube import FakeKube
from testenv.manifests import appwrapper, deployment
from tests.unit.test_controller_faults import cycles, until

DEPLOYMENTS = ResourceInfo("apps/v1", "Deployment", "deployments", namespaced=True)
Obj = dict[str, Any]


@dataclass
class Env:
    manager: Manager
    hub: FakeKube
    west: FakeKube

    def aw(self, namespace: str, name: str) -> Obj | None:
        for obj in self.hub.objects(APPWRAPPERS.group_version, APPWRAPPERS.kind):
            meta = obj["metadata"]
            if (meta["namespace"], meta["name"]) == (namespace, name):
                return obj
        return None

    def status(self, namespace: str, name: str) -> Obj:
        return dict((self.aw(namespace, name) or {}).get("status") or {})

    def condition(self, namespace: str, name: str, type_: str) -> Obj:
        found = [c for c in self.status(namespace, name).get("conditions") or []]
        return next((c for c in found if c["type"] == type_), {})

    def deployments(self) -> dict[tuple[str, str], Obj]:
        return {
            (d["metadata"]["namespace"], d["metadata"]["name"]): d
            for d in self.west.objects("apps/v1", "Deployment")
        }

    async def apply(self, namespace: str, name: str, obj_name: str | None = None) -> str:
        body = appwrapper(name, deployment(obj_name or name, 1, {"cpu": "1"}))
        created = await self.hub.create(APPWRAPPERS, namespace, body)
        return str(created["metadata"]["uid"])


@contextlib.asynccontextmanager
async def hub_and_west(**west: Any) -> AsyncIterator[Env]:
    """A hub holding AppWrappers in team-a and team-b (not a member itself) and a member
    `west` with `west` as its settings."""
    clock = ManualClock()
    hub = FakeKube(name="hub", clock=clock.time)
    remote = FakeKube(name="west", clock=clock.time)
    for namespace in ("team-a", "team-b"):
        await ensure_namespace(hub, namespace)
    body = node("w1", {"cpu": "16"})
    created = await remote.create(NODES, None, body)
    await remote.replace(NODES, None, "w1", {**created, "status": body["status"]}, sub="status")
    config = Config(
        members=[MemberConfig(name="west", kubeconfig="west", **west)],
        health_port=0,
        requeue_pause_seconds=0.0,
        unattributed="allow",
    )
    members = [Member.build(config.members[0], remote, is_hub=False, clock=clock)]
    manager = Manager(config=config, hub=hub, members=members, clock=clock)
    task = asyncio.get_running_loop().create_task(manager.run())
    try:
        await asyncio.wait_for(manager.ready.wait(), 5)
        yield Env(manager, hub, remote)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def created_namespaces(fake: FakeKube) -> list[str | None]:
    return [c[3] for c in fake.calls if c[:2] == ("create", "Namespace")]


async def run_pod(fake: FakeKube, namespace: str, name: str, labels: dict[str, str]) -> None:
    """Play the Deployment controller and kubelet in the member."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": "w1", "containers": [{"name": "c", "resources": {}}]},
    }
    await fake.create(PODS, namespace, pod)
    await fake.merge_patch(PODS, namespace, name, {"status": {"phase": "Running"}}, sub="status")


async def test_an_unmapped_namespace_waits_and_never_reaches_the_member() -> None:
    async with hub_and_west(namespaces={"team-b": "team-b"}, create_namespaces=True) as env:
        await env.apply("team-a", "x")
        want = "cluster west: namespace team-a is not mapped to it (members[].namespaces)"
        await until(lambda: env.status("team-a", "x").get("message") == want, "the message")
        await cycles(env.manager, 3)  # none may send it there
        assert not env.status("team-a", "x").get("clusterName")
        assert env.deployments() == {}
        assert not created_namespaces(env.west)


async def test_objects_go_to_the_mapped_namespace_and_pods_there_count() -> None:
    async with hub_and_west(namespaces={"team-a": "batch-a"}) as env:
        await ensure_namespace(env.west, "batch-a")
        uid = await env.apply("team-a", "x")
        await until(lambda: ("batch-a", "x") in env.deployments(), "created in batch-a")
        made = env.deployments()[("batch-a", "x")]
        labels = made["metadata"]["labels"]
        assert made["metadata"]["namespace"] == "batch-a"
        # The hub identity stays in the labels, of the object and of its pods.
        assert (labels[LABEL_NAMESPACE], labels[LABEL_NAME], labels[LABEL_UID]) == (
            "team-a",
            "x",
            uid,
        )
        pod_labels = made["spec"]["template"]["metadata"]["labels"]
        assert pod_labels[LABEL_NAMESPACE] == "team-a"
        assert list(env.deployments()) == [("batch-a", "x")]

        ours = {LABEL_NAME: "x", LABEL_NAMESPACE: "team-a", LABEL_UID: uid}
        await run_pod(env.west, "batch-a", "x-0", ours)
        # A copy of its labels in another namespace of the member counts for nothing.
        await ensure_namespace(env.west, "intruder")
        await run_pod(env.west, "intruder", "spoof", ours)
        await until(
            lambda: env.condition("team-a", "x", "Running").get("status") == "True", "Running"
        )
        assert env.status("team-a", "x").get("running") == 1

        await env.hub.delete(APPWRAPPERS, "team-a", "x")
        await until(lambda: env.aw("team-a", "x") is None, "its finalizer removed")
        assert env.deployments() == {}


@pytest.mark.parametrize(
    ("labels", "want"),
    [
        pytest.param(None, {"pod-security.kubernetes.io/enforce": "restricted"}, id="default"),
        pytest.param({"team": "a"}, {"team": "a"}, id="given"),
    ],
)
async def test_create_namespaces_makes_the_member_namespace_with_its_labels(
    labels: dict[str, str] | None, want: dict[str, str]
) -> None:
    settings: dict[str, Any] = {
        "namespaces": {"*": "*"},
        "wildcard_allowed": ["team-*"],
        "create_namespaces": True,
    }
    if labels is not None:
        settings["namespace_labels"] = labels
    async with hub_and_west(**settings) as env:
        await env.apply("team-a", "x")
        await until(lambda: ("team-a", "x") in env.deployments(), "created in team-a")
        made = await env.west.get(NAMESPACES, None, "team-a")
        assert made["metadata"].get("labels") == want
        assert created_namespaces(env.west) == ["team-a"]


async def test_a_missing_member_namespace_fails_with_the_message() -> None:
    async with hub_and_west(namespaces={"team-a": "batch-a"}) as env:
        await env.apply("team-a", "x")
        await until(
            lambda: env.condition("team-a", "x", "Failed").get("status") == "True", "failed"
        )
        failed = env.condition("team-a", "x", "Failed")
        assert failed["reason"] == "DispatchFailed"
        assert failed["message"] == (
            "creating the wrapped objects failed: namespace batch-a does not exist in cluster "
            "west: create it there, or set members[].create_namespaces"
        )
        assert not created_namespaces(env.west)
        assert env.deployments() == {}


async def test_two_hub_namespaces_in_one_member_namespace_keep_apart() -> None:
    async with hub_and_west(namespaces={"team-a": "shared", "team-b": "shared"}) as env:
        await ensure_namespace(env.west, "shared")
        uid_a = await env.apply("team-a", "x")
        await until(lambda: ("shared", "x") in env.deployments(), "team-a's made")
        # Same name from the other tenant: adoption refuses another AppWrapper's object.
        await env.apply("team-b", "x")
        await until(
            lambda: env.condition("team-b", "x", "Failed").get("status") == "True", "refused"
        )
        assert (
            "Deployment/x already exists in namespace shared and does not belong to this "
            "AppWrapper" in env.condition("team-b", "x", "Failed")["message"]
        )
        # Its failure removed nothing of team-a's.
        kept = env.deployments()[("shared", "x")]["metadata"]["labels"]
        assert (kept[LABEL_NAMESPACE], kept[LABEL_UID]) == ("team-a", uid_a)
        # Other names share the namespace freely.
        await env.apply("team-b", "y")
        await until(lambda: ("shared", "y") in env.deployments(), "team-b's own made")
        assert env.deployments()[("shared", "y")]["metadata"]["labels"][LABEL_NAMESPACE] == (
            "team-b"
        )


async def test_the_collector_sweeps_mapped_namespaces_only() -> None:
    async with hub_and_west(namespaces={"team-a": "batch-a"}) as env:
        for namespace in ("batch-a", "elsewhere"):
            await ensure_namespace(env.west, namespace)
            orphan = deployment("orphan", 1, {"cpu": "1"})
            orphan["metadata"]["labels"] = {
                LABEL_NAME: "vanished",
                LABEL_NAMESPACE: "team-a",
                LABEL_UID: "0000-gone",
            }
            await env.west.create(DEPLOYMENTS, namespace, orphan, field_manager=FIELD_MANAGER)
        env.west.calls.clear()
        env.manager.upkeep.tick()
        await until(lambda: ("batch-a", "orphan") not in env.deployments(), "collected")
        # Outside the mapping it is nobody the dispatcher knows: left alone, never listed.
        assert ("elsewhere", "orphan") in env.deployments()
        lists = {c[2] for c in env.west.calls if c[0] == "list" and c[1] == "Deployment"}
        assert lists == {"batch-a"}
