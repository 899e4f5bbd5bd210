"""The controller under faults, on the in-memory API server with every loop running: the
fence after a lost Lease, a member that does not answer at start, conflicts that repeat."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import pytest

from dispatcher.clock import ManualClock
from dispatcher.cluster.member import NODES, Member
from dispatcher.cluster.objects import ensure_namespace
from dispatcher.config import Config, MemberConfig
from dispatcher.controller.manager import Manager
from dispatcher.controller.scheduling.waiting import RETRY_SECONDS
from dispatcher.controller.status import APPWRAPPERS
from dispatcher.kube.errors import Conflict, Forbidden, ServerError
from testenv.fakeenv import NAMESPACE, fake_env, node
from testenv.fakekube import FakeKube
from testenv.manifests import appwrapper, job

JOB = ("batch/v1", "Job")


def status_of(fake: FakeKube, name: str) -> dict[str, object]:
    found = [o for o in fake.objects(*APPWRAPPERS_KEY) if o["metadata"]["name"] == name]
    return dict(found[0].get("status") or {}) if found else {}


APPWRAPPERS_KEY = (APPWRAPPERS.group_version, APPWRAPPERS.kind)


async def until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"never happened within {timeout}s: {what}")
        await asyncio.sleep(0.001)


async def settle(turns: int = 200) -> None:
    """Turns of the event loop, no time: what is ready to run runs (the fake answers at
    once); what waits for the clock still waits."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def cycles(manager: Manager, count: int) -> None:
    """`count` more scheduling cycles, each kicked so that each decides again."""
    for _ in range(count):
        done = manager.cycles
        manager.scheduler.kick()
        await until(lambda: manager.cycles > done, "a scheduling cycle")  # noqa: B023


async def test_fence_cancels_in_flight_writes_and_refuses_new_ones() -> None:
    async with fake_env(loops=True, workers=4, dispatch_concurrency=4) as env:
        await env.add_node("n1", cpu="1000")
        env.fake.latency = 0.005  # writes are in flight when the fence comes
        for index in range(40):
            await env.apply(appwrapper(f"a{index}", job(f"a{index}", 1, {"cpu": "1"})))
        await until(lambda: env.fake.counts["replace"] >= 5, "dispatches under way")
        env.manager.fence()
        writes = env.fake.writes
        assert not env.manager.ready.is_set()
        # New work arrives; nothing this replica does may reach the server any more.
        env.fake.latency = 0.0
        await env.apply(appwrapper("late", job("late", 1, {"cpu": "1"})))
        writes += 1  # the test's own create
        await settle()
        # Nothing of the manager is left to write, now or when its loops' time comes.
        assert not env.manager._children
        env.clock.advance(3600)
        await settle()
        assert env.fake.writes == writes
        assert env.manager.fenced
        assert env.manager.status.fenced


async def test_repeated_conflicts_back_off_and_a_success_resets() -> None:
    async with fake_env(loops=True) as env:
        await env.add_node("n1", cpu="8")
        env.fake.fail_next(
            "merge_patch", kind="AppWrapper", error=Conflict("changed", status=409), times=10_000
        )
        await env.apply(appwrapper("a", job("a", 1, {"cpu": "1"})))
        key = f"{NAMESPACE}/a"
        await until(lambda: env.manager.reconciles[key] >= 2, "the first retry, at once")
        await settle()
        # The next ones wait for the clock: 10 ms, doubling. Without backoff, thousands.
        assert env.manager.reconciles[key] == 2
        for reconciles, delay in ((3, 0.01), (4, 0.02), (5, 0.04), (6, 0.08), (7, 0.16)):
            env.clock.advance(delay / 2)
            await settle()
            assert env.manager.reconciles[key] == reconciles - 1, "retried before its time"
            env.clock.advance(delay / 2 + 1e-6)
            due = reconciles
            await until(lambda: env.manager.reconciles[key] >= due, "a retry, when due")  # noqa: B023
            assert env.manager.reconciles[key] == reconciles
        assert env.manager.queue.failures(key) == 7  # each reconcile met a Conflict
        env.fake._faults.clear()
        env.clock.advance(0.32)
        await until(lambda: env.manager.queue.failures(key) == 0, "a success resets")
        assert "workload.codeflare.dev/finalizer" in (await env.get("a"))["metadata"]["finalizers"]


@contextlib.asynccontextmanager
async def two_members(
    fault: str,
    *,
    servers: tuple[FakeKube, FakeKube, ManualClock] | None = None,
) -> AsyncIterator[tuple[Manager, FakeKube, FakeKube]]:
    """A hub (also member `local`) and a member `remote` whose API server does not answer,
    or answers but forbids listing pods (`fault`: "unreachable", "forbidden", "none")."""
    if servers is None:
        clock = ManualClock()
        hub = FakeKube(name="hub", clock=clock.time)
        remote = FakeKube(name="remote", clock=clock.time)
        await ensure_namespace(hub, NAMESPACE)
    else:
        hub, remote, clock = servers
    if fault == "unreachable":
        remote.unreachable = True
    elif fault == "forbidden":
        denied = Forbidden("pods is forbidden", status=403)
        remote.fail_next("list", kind="Pod", error=denied, times=10_000)
    config = Config(
        members=[
            MemberConfig(name="local"),
            MemberConfig(
                name="remote",
                kubeconfig="remote",
                namespaces={"*": "*"},
                wildcard_reserved=["*-system"],
                create_namespaces=True,
            ),
        ],
        health_port=0,
        requeue_pause_seconds=0.0,
        member_sync_timeout_seconds=0.3,
        unattributed="allow",
    )
    members = [
        Member.build(config.members[0], hub, is_hub=True, clock=clock),
        Member.build(config.members[1], remote, is_hub=False, clock=clock),
    ]
    manager = Manager(config=config, hub=hub, members=members, clock=clock)
    task = asyncio.get_running_loop().create_task(manager.run())
    try:
        yield manager, hub, remote
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def add_node(fake: FakeKube, name: str, cpu: str) -> None:
    body = node(name, {"cpu": cpu})
    created = await fake.create(NODES, None, body)
    created["status"] = body["status"]
    await fake.replace(NODES, None, name, created, sub="status")


def placed(clusters: list[str]) -> dict[str, object]:
    return {"clusterScheduling": {"clusters": [{"name": c} for c in clusters]}}


@pytest.mark.parametrize("fault", ["unreachable", "forbidden"])
async def test_a_dead_member_at_start_does_not_hold_back_the_live_one(fault: str) -> None:
    async with two_members(fault) as (manager, hub, remote):
        await add_node(hub, "n1", "8")
        await asyncio.wait_for(manager.ready.wait(), 5)
        assert not manager.members["remote"].synced
        assert not manager.members["remote"].reachable()
        await hub.create(APPWRAPPERS, NAMESPACE, appwrapper("here", job("here", 1, {"cpu": "1"})))
        await hub.create(
            APPWRAPPERS,
            NAMESPACE,
            appwrapper("there", job("there", 1, {"cpu": "1"}), scheduling=placed(["remote"])),
        )
        await until(lambda: status_of(hub, "here").get("clusterName") == "local", "dispatched")
        await cycles(manager, 3)
        # Never dispatched to a member whose pods are not known.
        assert status_of(hub, "there").get("clusterName") is None
        # The member answers: it joins, and what waited for it goes there.
        remote.unreachable = False
        remote._faults.clear()
        await add_node(remote, "r1", "8")
        await until(lambda: manager.members["remote"].synced, "the member syncs", 10)
        await until(
            lambda: status_of(hub, "there").get("clusterName") == "remote",
            "dispatched to the member once it has synced",
            10,
        )


def condition(fake: FakeKube, name: str, type_: str, field: str = "status") -> str | None:
    conditions = status_of(fake, name).get("conditions") or []
    assert isinstance(conditions, list)
    found = [c for c in conditions if c.get("type") == type_]
    return str(found[0][field]) if found else None


async def test_work_on_a_member_down_at_restart_is_not_judged_until_it_syncs() -> None:
    """A restart while a member is down: what runs there is neither re-created nor requeued
    on an empty view of its pods; only the member timeout moves it, as for a silent one."""
    clock = ManualClock()
    hub = FakeKube(name="hub", clock=clock.time)
    remote = FakeKube(name="remote", clock=clock.time)
    await ensure_namespace(hub, NAMESPACE)
    await add_node(remote, "r1", "8")
    spec = {**placed(["remote"]), "requeuing": {"timeInSeconds": 1}}
    async with two_members("none", servers=(hub, remote, clock)) as (manager, _, _):
        await asyncio.wait_for(manager.ready.wait(), 5)
        await hub.create(
            APPWRAPPERS,
            NAMESPACE,
            appwrapper("there", job("there", 1, {"cpu": "1"}), scheduling=spec),
        )
        await until(lambda: len(remote.objects(*JOB)) == 1, "its Job made in the member")
    async with two_members("unreachable", servers=(hub, remote, clock)) as (manager, _, _):
        await asyncio.wait_for(manager.ready.wait(), 5)
        clock.advance(30)  # long past requeuing.timeInSeconds, short of the member timeout
        await manager.reconciler.reconcile(f"{NAMESPACE}/there")
        assert condition(hub, "there", "Dispatched") == "True"
        assert condition(hub, "there", "Requeued") is None
        clock.advance(31)  # past member_timeout_seconds (60): handled as a silent member
        manager.upkeep.tick()
        await until(lambda: condition(hub, "there", "Requeued") == "True", "requeued")
        assert condition(hub, "there", "Requeued", "reason") == "ClusterUnreachable"


async def test_a_waiting_status_the_server_refused_is_written_later_without_another_event() -> None:
    """A queued AppWrapper is parked after its first decision and decided again only on an
    event: when the write of that decision fails, it is tried again by itself, or the
    AppWrapper would stay without any condition."""
    async with fake_env(loops=True) as env:
        await env.add_node("n1", cpu="1")
        await env.apply(appwrapper("big", job("big", 1, {"cpu": "4"})))
        env.fake.fail_next(
            "replace", kind="AppWrapper", name="big", error=ServerError("down", status=500)
        )
        await until(
            lambda: all(f.times == 0 for f in env.fake._faults), "its first waiting write, refused"
        )
        assert "Queueing" not in str(status_of(env.fake, "big").get("conditions"))
        env.clock.advance(RETRY_SECONDS)  # the writer's own time; nothing else happens
        await until(
            lambda: "Queueing" in str(status_of(env.fake, "big").get("conditions")),
            "its first waiting status, written again by itself",
        )
