"""Random walks of protection from preemption and notice before it (property tests).

In the core: random sequences of submissions (random priorities, sizes and minimum runtimes),
checkpoints and time passing, run through the scheduling cycle with the default policy; no
victim is ever chosen before its protection ends, and where protection alone holds a
preemptor back, the time noted is when it does end. Through the controller on the in-memory
API server: random minimum runtimes (annotations and settings) and notices; no victim is
chosen within its minimum runtime, and no victim's objects are removed before the time its
eviction gave it. `APPWRAPPER_PROTECTION_WALKS` runs more of them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.api.models import parse_time
from dispatcher.core.model import ClusterSnapshot, DispatchedWorkload, QueueMode, Reservation
from dispatcher.core.protection import MINIMUM_RUNTIME, removal_time
from dispatcher.core.scheduling import LowestPriorityFirst, schedule
from testenv.fakeenv import APPWRAPPER, FakeEnv, fake_env
from testenv.manifests import appwrapper, deployment
from tests.unit.builders import cluster, node, pods, res, with_running, workload

WALKS = int(os.environ.get("APPWRAPPER_PROTECTION_WALKS", "0"))
Obj = dict[str, Any]

# -- the core --------------------------------------------------------------------------------

submissions = st.tuples(
    st.just("submit"),
    st.integers(0, 3),  # priority
    st.sampled_from([1, 2, 4, 8]),  # cpu
    st.sampled_from([0.0, 5.0, 30.0, 120.0]),  # minimum runtime
)
waits = st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 7.0, 31.0]))
checkpoints = st.tuples(st.just("checkpoint"), st.integers(0, 20), st.floats(-50, 50))
walks = st.lists(st.one_of(submissions, waits, checkpoints), max_size=40)


@dataclass
class Running:
    key: str
    priority: int
    cpu: int
    dispatched_at: float
    protected_until: float
    checkpointed_at: float = 0.0


@dataclass
class CoreWalk:
    now: float = 1000.0
    pending: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    made: int = 0

    def snapshot(self) -> ClusterSnapshot:
        # Dispatched work is held as reservations (pods not bound yet): evicting one frees
        # its whole gang, wherever the cycle placed it.
        reservations = tuple(
            Reservation(r.key, (pods(1, cpu=r.cpu),), r.priority, r.dispatched_at)
            for r in self.running.values()
        )
        admitted = tuple(
            DispatchedWorkload(
                key=r.key,
                priority=r.priority,
                dispatched_at=r.dispatched_at,
                protected_until=r.protected_until,
                checkpointed_at=r.checkpointed_at,
            )
            for r in self.running.values()
        )
        nodes = (node("n1", cpu=8), node("n2", cpu=8))
        return cluster("c", *nodes, reservations=reservations, admitted=admitted)

    def cycle(self) -> None:
        queued = [
            workload(key, pods(1, cpu=cpu), priority=priority, created_at=float(index))
            for index, (key, (priority, cpu, _)) in enumerate(self.pending.items())
        ]
        noted: dict[str, float] = {}
        result = schedule(
            queued,
            [self.snapshot()],
            mode=QueueMode.BEST_EFFORT_FIFO,
            now=self.now,
            starvation_after=300.0,
            preemption=LowestPriorityFirst(now=self.now, protected=noted),
        )
        for until in noted.values():
            assert until > self.now
        for preempt in result.preemptions:
            for victim in preempt.victims:
                held = self.running.pop(victim)
                assert held.protected_until <= self.now, (victim, held, self.now)
                assert held.priority < self.pending[preempt.key][0]
                self.pending[victim] = (
                    held.priority,
                    held.cpu,
                    held.protected_until - held.dispatched_at,
                )
        for admit in result.admits:
            priority, cpu, minimum = self.pending.pop(admit.key)
            self.running[admit.key] = Running(
                admit.key, priority, cpu, self.now, self.now + minimum
            )

    def step(self, step: tuple[Any, ...]) -> None:
        if step[0] == "submit":
            self.made += 1
            self.pending[f"ns/w{self.made}"] = (step[1], step[2], step[3])
        elif step[0] == "advance":
            self.now += step[1]
        elif self.running:
            held = list(self.running.values())[step[1] % len(self.running)]
            # As the shell holds a declared checkpoint: within [dispatched_at, now].
            held.checkpointed_at = min(max(self.now + step[2], held.dispatched_at), self.now)
        self.cycle()


@settings(max_examples=max(400, WALKS), deadline=None)
@given(walks)
def test_no_victim_is_chosen_within_its_minimum_runtime(steps: list[tuple[Any, ...]]) -> None:
    walk = CoreWalk()
    for step in steps:
        walk.step(step)


class Permissive:
    """Quota rules that allow every lower-priority candidate (the search's other path)."""

    def __init__(self, priority: int) -> None:
        self.priority = priority

    def allowed(self, candidate: DispatchedWorkload) -> bool:
        return candidate.priority < self.priority

    def order(self, candidate: DispatchedWorkload) -> int:
        return candidate.priority % 2

    def still_allowed(self, candidate: DispatchedWorkload) -> bool:
        return True

    def evict(self, key: str) -> Callable[[], None]:
        return lambda: None

    def fits(self) -> bool:
        return True

    def fits_without(self, keys: Iterable[str]) -> bool:
        return True


@settings(max_examples=max(400, WALKS), deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 8), st.floats(0, 100), st.floats(0, 100)),
        max_size=12,
    ),
    st.floats(0, 100),
    st.booleans(),
)
def test_a_search_never_names_a_protected_victim(
    held: list[tuple[int, int, float, float]], now: float, with_rules: bool
) -> None:
    admitted = [
        DispatchedWorkload(
            key=f"ns/a{index}",
            priority=priority,
            dispatched_at=dispatched,
            usage=(("n1", res(cpu=cpu)),),
            protected_until=dispatched + minimum,
        )
        for index, (priority, cpu, dispatched, minimum) in enumerate(held)
    ]
    snapshot = with_running(cluster("c", node("n1", cpu=16)), *admitted)
    preemptor = workload("ns/p", pods(1, cpu=8), priority=5)
    noted: dict[str, float] = {}
    policy = LowestPriorityFirst(now=now, protected=noted)
    victims = policy.choose_victims(preemptor, snapshot, Permissive(5) if with_rules else None)
    by_key = {a.key: a for a in admitted}
    for key in victims or ():
        victim = by_key[key]  # past its minimum runtime, or one with none
        assert victim.protected_until <= max(now, victim.dispatched_at)
    if "ns/p" in noted:
        assert victims is None
        assert noted["ns/p"] > now
        later = LowestPriorityFirst(now=noted["ns/p"])
        rules = Permissive(5) if with_rules else None
        assert later.choose_victims(preemptor, snapshot, rules) is not None


# -- the controller ----------------------------------------------------------------------------

ASKS = [None, "0", "5s", "20s", "1m", "2h", "garbage"]
controller_steps = st.lists(
    st.one_of(
        st.tuples(st.just("low"), st.sampled_from(ASKS)),
        st.tuples(st.just("high"), st.integers(2, 9)),
        st.tuples(st.just("advance"), st.sampled_from([1.0, 4.0, 15.0, 45.0])),
    ),
    min_size=1,
    max_size=16,
)


@dataclass
class ControllerWalk:
    env: FakeEnv
    default: float
    cap: float
    made: int = 0
    asks: dict[str, str | None] = field(default_factory=dict)

    def objects(self) -> dict[str, Obj]:
        return {o["metadata"]["name"]: o for o in self.env.objects(*APPWRAPPER)}

    def effective(self, name: str) -> float:
        ask = self.asks.get(name)
        seconds = {None: None, "0": None, "5s": 5, "20s": 20, "1m": 60, "2h": 7200}.get(ask)
        return min(self.default if seconds is None else seconds, self.cap)

    async def step(self, step: tuple[Any, ...]) -> None:
        env = self.env
        if step[0] in ("low", "high"):
            self.made += 1
            name = f"{step[0]}-{self.made}"
            priority = 1 if step[0] == "low" else step[1]
            body = appwrapper(name, deployment(name, 1, {"cpu": "2"}), priority=priority)
            if step[0] == "low":
                self.asks[name] = step[1]
                if step[1] is not None:
                    body["metadata"]["annotations"] = {MINIMUM_RUNTIME: step[1]}
            await env.apply(body)
            await env.reconcile(name)
        else:
            env.clock.advance(step[1])
            env.manager.members["local"].last_answer = env.clock.monotonic()
        await env.cycle()
        for name in sorted(self.objects()):
            await env.reconcile(name)
        await self.kubelet()

    async def kubelet(self) -> None:
        """A pod for each dispatched one that has its Deployment; none for the others."""
        env = self.env
        made = {d["metadata"]["name"] for d in env.objects("apps/v1", "Deployment")}
        have = {p["metadata"]["name"] for p in env.objects("v1", "Pod")}
        for name in self.objects():
            pod = f"{name}-0"
            if name in made and pod not in have:
                await env.pods(name, 1, cpu="2")
            elif name not in made and pod in have:
                await env.remove_pods([pod])
        await env.caught_up()

    def check(self) -> None:
        now = self.env.clock.time()
        made = {d["metadata"]["name"] for d in self.env.objects("apps/v1", "Deployment")}
        for name, obj in self.objects().items():
            status = obj.get("status") or {}
            conditions = {c["type"]: c for c in status.get("conditions") or []}
            preempted = conditions.get("Preempted")
            if preempted is None or preempted["status"] != "True":
                continue
            chosen = parse_time(preempted["lastTransitionMicroTime"]).timestamp()
            since = parse_time(status["lastDispatchedAt"]).timestamp()  # the attempt evicted
            assert chosen >= since + self.effective(name) - 1e-6, (name, chosen, since)
            removes_at = removal_time(preempted["message"], chosen)
            if now < removes_at:
                assert name in made, f"{name}'s objects removed before {removes_at} (now {now})"


async def controller_walk(steps: list[tuple[Any, ...]], notice: int, default: int) -> None:
    protection = {
        "notice_seconds": notice,
        "minimum_runtime_seconds": default,
        "max_minimum_runtime_seconds": 90,
    }
    async with fake_env(protection=protection) as env:
        await env.add_node("n1", cpu="6")
        walk = ControllerWalk(env, default=float(default), cap=90.0)
        for step in steps:
            await walk.step(step)
            walk.check()


@settings(
    max_examples=max(80, WALKS // 10),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(controller_steps, st.sampled_from([0, 10, 30]), st.sampled_from([0, 10, 40]))
def test_the_controller_keeps_minimum_runtimes_and_notices(
    steps: list[tuple[Any, ...]], notice: int, default: int
) -> None:
    asyncio.run(controller_walk(steps, notice, default))
