"""Seeded random walks through the controller's life on the in-memory API server.

Each seed drives one controller (loops off, so every step is deterministic) through a random
sequence of steps: AppWrappers applied and deleted, reconciles, scheduling cycles, the
kubelet's work (pods made and bound only where they fit, run, finished, collected), faults
on the controller's next write, time passing, and leader crashes, between steps or at an
exact write inside one. After every step the rules the controller keeps are checked against
what the API server holds; at the end, with faults gone, everything must settle into a
consistent state.

A failure names its seed and prints the steps. Replay one with
`APPWRAPPER_RANDOM_SEED=17 pytest tests/unit/test_controller_random.py` (or `-k seed_17`);
run more with `APPWRAPPER_RANDOM_SEEDS=500`.
"""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dispatcher.core.phase import Phase, phase_of_raw
from dispatcher.core.scheduling import CycleResult
from dispatcher.kube.errors import Conflict, KubeError, ServerError, Unreachable
from testenv.chaos import (
    Chaos,
    Kubelet,
    cpu_milli,
    desired_pods,
    holds_room,
    name_of,
    owner_uid,
    pod_phase,
    true_conditions,
)
from testenv.fakeenv import APPWRAPPER, NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper, deployment, job

Obj = dict[str, Any]
SEEDS = int(os.environ.get("APPWRAPPER_RANDOM_SEEDS", "30"))
STEPS = int(os.environ.get("APPWRAPPER_RANDOM_STEPS", "60"))
ONLY = os.environ.get("APPWRAPPER_RANDOM_SEED", "")
MAX_APPWRAPPERS = 8
SETTLE_ROUNDS = 30


def seeds() -> list[int]:
    if ONLY:
        return [int(s) for s in ONLY.split(",")]
    return list(range(SEEDS))


class Walk:
    """One seed's random walk: the steps, the log to replay it, the checks."""

    def __init__(self, seed: int, env: FakeEnv) -> None:
        self.rng = random.Random(seed)
        self.env = env
        self.chaos = Chaos(env)
        self.kubelet = Kubelet(env, self.chaos, self.rng)
        self.log: list[str] = []
        self.applied = 0
        self.deleted: set[str] = set()
        self.names: list[str] = []

    def note(self, text: str) -> None:
        self.log.append(f"{len(self.log):3d} {text}")

    def replay(self) -> str:
        return "\n".join(self.log)

    # -- reading the API server -----------------------------------------------------------

    def appwrappers(self) -> dict[str, Obj]:
        return {name_of(o): o for o in self.env.objects(*APPWRAPPER)}

    def wrapped_of(self, aw: Obj) -> list[Obj]:
        uid = aw["metadata"]["uid"]
        return [o for o in self.kubelet.wrapped() if owner_uid(o) == uid]

    # -- steps ----------------------------------------------------------------------------

    async def apply(self) -> None:
        if self.applied >= MAX_APPWRAPPERS:
            return await self.reconcile()
        name = f"aw{self.applied}"
        self.applied += 1
        pods, cpu, priority = self.rng.randint(1, 3), self.rng.randint(1, 3), self.rng.randint(0, 3)
        if self.rng.random() < 0.5:
            item = deployment(name, pods, {"cpu": str(cpu)})
            body = appwrapper(name, item, priority=priority)
        else:
            body = appwrapper(name, job(name, pods, {"cpu": str(cpu)}), priority=priority)
            body["spec"]["resources"]["GenericItems"][0]["completionstatus"] = "Complete"
        kind = body["spec"]["resources"]["GenericItems"][0]["generictemplate"]["kind"]
        self.note(f"apply {name}: {kind} of {pods} pods x {cpu} cpu, priority {priority}")
        with self.chaos.as_test():
            await self.env.apply(body)
        self.names.append(name)

    async def reconcile(self) -> None:
        names = sorted(self.appwrappers())
        if not names:
            return
        name = self.rng.choice(names)
        errors = self.chaos.errors
        try:
            after = await self.env.reconcile(name)
            self.note(f"reconcile {name} -> requeue after {after}")
        except KubeError as exc:
            self.note(f"reconcile {name} -> {type(exc).__name__}: {exc}")
        if self.chaos.errors == errors and not self.chaos.crashed:
            await self.check_reconciled(name)

    async def cycle(self) -> None:
        self.chaos.round += 1
        before = len(self.chaos.evictions)
        await self.env.cycle()
        evicted = [f"{e.victim} for {e.preemptor}" for e in self.chaos.evictions[before:]]
        self.note(f"cycle {self.chaos.round}" + (f": evicted {evicted}" if evicted else ""))

    async def kubelet_step(self) -> None:
        action = self.rng.choice(["make", "make", "bind", "start", "finish", "collect"])
        if action == "make":
            done = await self.kubelet.make_pods(limit=self.rng.randint(1, 3))
        elif action == "bind":
            done = await self.kubelet.bind()
        elif action == "start":
            done = await self.kubelet.start(0.6)
        elif action == "finish":
            done = await self.kubelet.finish(0.6)
        else:
            done = await self.kubelet.collect(0.6)
        self.note(f"kubelet {action}: {done}")

    async def delete(self) -> None:
        names = sorted(set(self.appwrappers()) - self.deleted)
        if not names:
            return
        name = self.rng.choice(names)
        self.note(f"delete {name}")
        self.deleted.add(name)
        with self.chaos.as_test():
            await self.env.delete(name)

    async def fault(self) -> None:
        method, kinds = self.rng.choice(
            [
                ("replace", ["AppWrapper"]),
                ("merge_patch", ["AppWrapper"]),
                ("create", ["Deployment", "Job"]),
                ("delete", ["Deployment", "Job"]),
            ]
        )
        kind = self.rng.choice(kinds)
        error = self.rng.choice(
            [Conflict("chaos: conflict"), ServerError("chaos: 500"), Unreachable("chaos: down")]
        )
        self.note(f"fault: next {method} of a {kind} raises {type(error).__name__}")
        self.env.fake.fail_next(method, kind=kind, error=error)

    async def advance(self) -> None:
        seconds = self.rng.choice([1, 5, 30, 130, 400])
        self.note(f"clock +{seconds}s")
        self.env.clock.advance(seconds)
        await self.heard_from_member()

    async def heard_from_member(self) -> None:
        """Time passed on the manual clock, not in the event loop, so the member's ping
        did not run: record the answer it would have got."""
        member = self.env.manager.members["local"]
        member.last_answer = self.env.clock.monotonic()

    async def restart(self) -> None:
        self.note("crash: a new leader")
        await self.chaos.restart()

    async def arm_crash(self) -> None:
        writes = self.rng.randint(0, 3)
        self.note(f"the leader will crash after {writes} more writes")
        self.chaos.crash_after(writes)

    async def step(self) -> None:
        steps: list[tuple[int, Callable[[], Awaitable[None]]]] = [
            (8, self.apply),
            (24, self.reconcile),
            (14, self.cycle),
            (20, self.kubelet_step),
            (2, self.delete),
            (6, self.fault),
            (4, self.advance),
            (2, self.restart),
            (3, self.arm_crash),
        ]
        [chosen] = self.rng.choices([s for _, s in steps], weights=[w for w, _ in steps])
        await chosen()
        if self.chaos.crashed:
            self.note(f"crash at write {self.chaos.controller_writes}: a new leader")
            await self.chaos.restart()

    # -- the rules --------------------------------------------------------------------------

    def check(self) -> None:
        self.check_capacity()
        self.check_objects()
        self.check_evictions()

    def check_capacity(self) -> None:
        """Rule 1: never overcommit. Per node, bound pods fit (the kubelet binds only where
        they do); for the cluster, bound pods plus the pods dispatched AppWrappers will still
        make fit the allocatable total."""
        free = self.kubelet.free()
        assert all(room >= 0 for room in free.values()), f"a node is overcommitted: {free}"
        nodes = self.env.objects("v1", "Node")
        total = sum(cpu_milli_of_node(n) for n in nodes)
        pods = self.kubelet.pods()
        bound = sum(cpu_milli(p) for p in pods if holds_room(p))
        coming: dict[str, int] = {}
        for name, aw in self.appwrappers().items():
            true = true_conditions(aw)
            if "Dispatched" not in true or true & {"Completed", "Failed"}:
                continue
            if "Preempted" in true or aw["metadata"].get("deletionTimestamp"):
                continue  # an evicted or deleted one makes no more pods
            # Rule 1 as the scheduler keeps it: a dispatched AppWrapper holds its declared
            # pods; those of its pods (any attempt's: they carry its uid) already bound are
            # counted on their nodes, the rest are still to come.
            declared = sum(
                desired_pods(item["generictemplate"])
                * cpu_milli(item["generictemplate"]["spec"]["template"])
                for item in aw["spec"]["resources"]["GenericItems"]
            )
            placed = sum(
                cpu_milli(p)
                for p in pods
                if owner_uid(p) == aw["metadata"]["uid"]
                and p["spec"].get("nodeName")
                and pod_phase(p) != "Failed"
            )
            if declared > placed:
                coming[name] = declared - placed
        assert bound + sum(coming.values()) <= total, (
            f"the cluster is overcommitted: {bound}m bound + {coming} to come "
            f"> {total}m allocatable"
        )

    def check_objects(self) -> None:
        """Rule 2: every wrapped object belongs to a live AppWrapper, and none exists for
        one that is queued or backing off."""
        appwrappers = self.appwrappers()
        uids = {aw["metadata"]["uid"]: name for name, aw in appwrappers.items()}
        for obj in self.kubelet.wrapped():
            assert owner_uid(obj) in uids, f"{obj['kind']}/{name_of(obj)} has no AppWrapper"
        for name, aw in appwrappers.items():
            if phase_of_raw(aw) in (Phase.QUEUED, Phase.BACKOFF):
                found = [f"{o['kind']}/{name_of(o)}" for o in self.wrapped_of(aw)]
                requeued = next(
                    (
                        c.get("reason")
                        for c in (aw.get("status") or {}).get("conditions") or []
                        if c.get("type") == "Requeued"
                    ),
                    None,
                )
                assert not found, (
                    f"{name} is {phase_of_raw(aw).value} (requeued: {requeued}) but has {found}"
                )

    async def check_reconciled(self, name: str) -> None:
        """After a reconcile that met no error: a dispatched AppWrapper's objects exist, a
        failed, deleting or evicted one's are gone."""
        aw = self.appwrappers().get(name)
        if aw is None:
            return
        phase, true = phase_of_raw(aw), true_conditions(aw)
        found = self.wrapped_of(aw)
        if phase is Phase.DISPATCHED:
            wanted = len(aw["spec"]["resources"]["GenericItems"])
            # Objects are made again only once an earlier attempt's pods have gone.
            terminating = [
                name_of(p)
                for p in self.kubelet.pods()
                if owner_uid(p) == aw["metadata"]["uid"] and p["metadata"].get("deletionTimestamp")
            ]
            if not terminating:
                assert len(found) == wanted, f"{name} is dispatched, reconciled, has {found}"
        elif phase in (Phase.DELETING, Phase.EVICTING) or "Failed" in true:
            assert not found, f"{name} is {phase.value} ({sorted(true)}) and reconciled: {found}"

    def check_evictions(self) -> None:
        """Rule 4: never evict twice for one need. While a victim evicted for a preemptor
        still holds its room (evicting, or its pods still bound and running) and the claim
        has not expired, no other cycle evicts anyone else for that preemptor; its admission
        starts a new need."""
        assert not self.chaos.violations, self.chaos.violations

    # -- the end ----------------------------------------------------------------------------

    async def settle(self) -> CycleResult | None:
        """No more faults or crashes: the kubelet does all its work, every AppWrapper is
        reconciled, cycles run, until nothing changes."""
        self.note("settle")
        self.chaos.disarm()
        result: CycleResult | None = None
        quiet = 0
        for _ in range(SETTLE_ROUNDS):
            before, errors = self.fingerprint(), self.chaos.errors
            await self.heard_from_member()
            await self.kubelet.collect()
            await self.kubelet.bind()
            await self.kubelet.make_pods()
            await self.kubelet.start()
            for name in sorted(self.appwrappers()):
                try:
                    await self.env.reconcile(name)
                except KubeError as exc:  # a fault injected before the settling
                    self.note(f"settle: reconcile {name} -> {type(exc).__name__}: {exc}")
            self.chaos.round += 1
            await self.env.caught_up()
            result = self.env.manager.scheduler.cycle()
            await self.env.manager.scheduler.drain(timeout=5)
            await self.env.caught_up()
            self.check()
            calm = self.fingerprint() == before and self.chaos.errors == errors
            quiet = quiet + 1 if calm else 0
            if quiet >= 2:
                return result
        raise AssertionError(f"nothing settled in {SETTLE_ROUNDS} rounds:\n{self.state()}")

    def fingerprint(self) -> frozenset[tuple[str, str, str]]:
        kinds = [APPWRAPPER, ("apps/v1", "Deployment"), ("batch/v1", "Job"), ("v1", "Pod")]
        return frozenset(
            (o["kind"], name_of(o), o["metadata"]["resourceVersion"])
            for kind in kinds
            for o in self.env.objects(*kind)
        )

    def state(self) -> str:
        lines = []
        for name, aw in sorted(self.appwrappers().items()):
            status = aw.get("status") or {}
            lines.append(
                f"{name}: {phase_of_raw(aw).value} {sorted(true_conditions(aw))} "
                f"preemptedBy={status.get('preemptedBy')} objects="
                f"{[name_of(o) for o in self.wrapped_of(aw)]}"
            )
        for pod in self.kubelet.pods():
            lines.append(
                f"pod {name_of(pod)} on {pod['spec'].get('nodeName')} {pod_phase(pod)} "
                f"{cpu_milli(pod)}m"
            )
        return "\n".join(lines)

    def check_settled(self) -> None:
        """Rule 3: no AppWrapper lost. Each one is dispatched with its objects, queued with
        a reason to wait (the last cycle that judged it gave one: a parked one is not
        judged again until an event can change its answer), or finished; deleted ones are
        gone."""
        appwrappers = self.appwrappers()
        waiting = {k: w.message for k, w in self.env.manager.scheduler.waits().items()}
        for name in self.deleted:
            assert name not in appwrappers, f"{name} was deleted but is still there"
        for name in self.names:
            assert name in appwrappers or name in self.deleted, f"{name} was lost"
        for name, aw in appwrappers.items():
            phase = phase_of_raw(aw)
            if phase is Phase.DISPATCHED:
                assert self.wrapped_of(aw), f"{name} is dispatched without objects"
            elif phase is Phase.QUEUED:
                assert waiting.get(f"{NAMESPACE}/{name}"), f"{name} is queued with no reason"
            else:
                assert phase is Phase.FINISHED, f"{name} is stuck {phase.value}"

    async def play(self) -> None:
        for node in range(self.rng.randint(1, 3)):
            cpu = str(self.rng.randint(3, 6))
            self.note(f"node n{node}: {cpu} cpu")
            await self.env.add_node(f"n{node}", cpu=cpu)
        for _ in range(STEPS):
            await self.step()
            self.check()
        await self.settle()
        self.check_settled()


def cpu_milli_of_node(node: Obj) -> int:
    return cpu_milli({"spec": {"containers": [{"resources": {"requests": node_cpu(node)}}]}})


def node_cpu(node: Obj) -> dict[str, str]:
    return {"cpu": node["status"]["allocatable"].get("cpu", "0")}


@pytest.mark.parametrize("seed", seeds(), ids=lambda seed: f"seed_{seed}")
async def test_random_steps_keep_the_controller_rules(seed: int) -> None:
    async with fake_env() as env:
        walk = Walk(seed, env)
        try:
            await walk.play()
        except AssertionError as exc:
            raise AssertionError(
                f"seed {seed}: {exc}\nsteps (replay with APPWRAPPER_RANDOM_SEED={seed}):\n"
                f"{walk.replay()}\nstate:\n{walk.state()}"
            ) from exc


async def test_transient_create_error_on_existing_objects_removes_them() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="4")
        await env.apply(appwrapper("a", deployment("a", 1, {"cpu": "1"})))
        await env.reconcile("a")
        await env.cycle()
        await env.reconcile("a")  # its Deployment is made
        await env.pods("a", 1)
        await env.restart()  # a new leader ensures the objects again
        env.fake.fail_next("create", kind="Deployment", error=ServerError("overloaded"))
        await env.reconcile("a")
        conditions = await env.conditions("a")
        assert conditions["Dispatched"] == "False"  # requeued: DispatchFailed
        assert env.objects("apps/v1", "Deployment") == []
