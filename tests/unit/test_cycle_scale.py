"""The shortcuts of the placement, the cycle and evictions give the answers of plain code.

The placement walks nodes kept sorted by room and remembers per-node failures; the cycle
remembers the answer for a gang shape until the next admission or hold, and places a gang
in the best-fit cluster first without trying the others when the scarcest resource is the
same wherever it fits; an eviction gives back what the victim holds. Each is checked here
against a slow, obviously-correct version of the same rule, on random clusters:

- placements (which nodes, how many pods) against a plain best fit with exact rooms;
- whole cycles against a cycle without those shortcuts (every cluster tried, the
  unchosen placements undone, every answer worked out again), on seeded and on
  hypothesis-drawn worlds;
- evictions against the plain best fit with the victims' charges handed back.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.resources import Resources
from dispatcher.core.mentions import mention, mention_all
from dispatcher.core.model import (
    ONE_POD,
    PODS,
    UNLIMITED_PODS,
    ClusterSnapshot,
    DispatchedWorkload,
    NodeSnapshot,
    Placement,
    PodSet,
    QueueMode,
    Reservation,
    Taint,
    Toleration,
    Workload,
)
from dispatcher.core.scheduling import (
    Admit,
    CycleResult,
    LowestPriorityFirst,
    Preempt,
    PreemptionPolicy,
    Wait,
    queue_order_key,
    schedule,
)
from dispatcher.core.scheduling.evictions import evict
from dispatcher.core.scheduling.placement import ClusterRoom, Gang, NodeAssignment, Refusal
from tests.unit.builders import GPU, free_room, try_place

TAINT = Taint(key=GPU, value="present", effect="NoSchedule")
TOLERATE = Toleration(key=GPU, operator="Exists")
GI = 2**30 * 1000


# -- random worlds ----------------------------------------------------------------------


def _resources(cpu: float, memory_gi: float, gpu: int = 0) -> Resources:
    return Resources({"cpu": int(cpu * 1000), "memory": int(memory_gi * GI), GPU: gpu * 1000})


def _pod_sets(rng: random.Random, name: str) -> tuple[PodSet, ...]:
    result = []
    for index in range(rng.choice([1, 1, 1, 2])):
        gpu = rng.choice([0, 0, 0, 1, 2, 4])
        zone = rng.choice([None, None, None, "a"])
        result.append(
            PodSet(
                count=rng.choice([1, 1, 2, 3, 4, 8]),
                requests=_resources(rng.choice([0.5, 1, 2, 4, 8]), rng.choice([1, 2, 8, 32]), gpu)
                + {PODS: ONE_POD},
                node_selector=(("zone", zone),) if zone else (),
                tolerations=(TOLERATE,) if gpu or rng.random() < 0.1 else (),
                name=f"Job/{name} {index}",
            )
        )
    return tuple(result)


def random_cluster(rng: random.Random, name: str, nodes: int, reservations: int) -> ClusterSnapshot:
    node_states = []
    admitted: list[DispatchedWorkload] = []
    for index in range(nodes):
        node_name = f"{name}-n{index}"
        gpu_node = rng.random() < 0.25
        allocatable = _resources(32, 128, 8) if gpu_node else _resources(16, 64)
        busy = rng.uniform(0.3, 1.0)
        used = Resources({r: int(v * busy * rng.uniform(0.8, 1.0)) for r, v in allocatable.items()})
        # Some nodes run few pods (`pods` binds before cpu does), some do not say.
        max_pods = rng.choice([None, None, 4, 8, 110])
        if max_pods is not None:
            allocatable = allocatable + {PODS: max_pods * ONE_POD}
            used = used + {PODS: int(max_pods * busy) * ONE_POD}
        node_states.append(
            NodeSnapshot(
                name=node_name,
                allocatable=allocatable,
                requested=used,
                labels={"zone": rng.choice("ab")},
                taints=(TAINT,) if gpu_node else (),
                ready=rng.random() > 0.03,
                unschedulable=rng.random() < 0.03,
            )
        )
        if used and rng.random() < 0.8:
            admitted.append(
                DispatchedWorkload(
                    key=f"run/{node_name}",
                    priority=rng.choice([0, 0, 1, 5]),
                    dispatched_at=float(rng.randint(0, 1000)),
                    preemptible=rng.random() < 0.9,
                    usage=((node_name, used),),
                )
            )
    held = []
    for index in range(reservations):
        key = f"starting/{name}-{index}"
        priority = rng.choice([0, 0, 1])
        dispatched_at = float(rng.randint(900, 1100))
        held.append(
            Reservation(
                key=key,
                pod_sets=_pod_sets(rng, key),
                priority=priority,
                dispatched_at=dispatched_at,
            )
        )
        admitted.append(DispatchedWorkload(key=key, priority=priority, dispatched_at=dispatched_at))
    return ClusterSnapshot(
        name=name,
        nodes=tuple(node_states),
        reservations=tuple(held),
        labels={"region": rng.choice(["eu", "us"])},
        reachable=rng.random() > 0.05,
        admitted=tuple(admitted),
    )


def random_pending(rng: random.Random, count: int, clusters: list[str]) -> list[Workload]:
    result = []
    shapes = [_pod_sets(rng, "shape") for _ in range(12)]
    for index in range(count):
        key = f"ns/w{index:04d}"
        shape = rng.choice(shapes)
        pod_sets = tuple(
            PodSet(
                p.count, Resources(dict(p.requests)), p.node_selector, p.tolerations, f"Job/{key}"
            )
            for p in shape
        )
        placement = Placement()
        if rng.random() < 0.15:
            placement = Placement(clusters=frozenset(rng.sample(clusters, 1)))
        elif rng.random() < 0.1:
            placement = Placement(match_labels=(("region", "eu"),))
        created_at = float(rng.randint(0, 500))
        result.append(
            Workload(
                key=key,
                priority=rng.choice([0, 0, 0, 1, 3, 6]),
                created_at=created_at,
                pod_sets=pod_sets,
                placement=placement,
                queued_since=created_at - (5000 if rng.random() < 0.004 else 0),
                preemptible=rng.random() < 0.9,
            )
        )
    return result


# -- placements against a plain best fit ---------------------------------------------------


def ranked(requests: dict[str, int] | Resources) -> dict[str, int]:
    """What ranks nodes by room and pods by size: all but `pods`, unless it is alone."""
    others = {r: v for r, v in requests.items() if r != PODS and v > 0}
    return others or {r: v for r, v in requests.items() if v > 0}


class PlainState:
    """Best fit written out plainly: exact rooms, every candidate node sorted each time."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.nodes = [n for n in snapshot.nodes if n.schedulable]
        # A node that does not report `pods` takes any number of pods.
        allocatable = [
            n.allocatable + {PODS: UNLIMITED_PODS * (PODS not in n.allocatable)} for n in self.nodes
        ]
        self.free = [dict(a - n.requested) for a, n in zip(allocatable, self.nodes, strict=True)]
        self.capacity: dict[str, int] = {}
        for node_allocatable in allocatable:
            for resource, value in node_allocatable.items():
                self.capacity[resource] = self.capacity.get(resource, 0) + value
        self.total: dict[str, int] = {}
        for free in self.free:
            for resource, value in free.items():
                self.total[resource] = self.total.get(resource, 0) + value
        # What each reservation was charged: per node, and in the aggregate.
        self.reserved: dict[str, tuple[list[tuple[int, str, int]], tuple[PodSet, ...]]] = {}
        for reservation in sorted(snapshot.reservations, key=lambda r: (r.dispatched_at, r.key)):
            placed = self.place(reservation.pod_sets, reserve=True)
            assert placed is not None
            self.reserved[reservation.key] = (placed, reservation.pod_sets)

    def evict(self, victim: DispatchedWorkload) -> None:
        """Hand back what `victim` holds: its bound pods, its reservation's charges."""
        names = [n.name for n in self.nodes]
        for node_name, used in victim.usage:
            if node_name in names:
                free = self.free[names.index(node_name)]
                for resource, value in used.items():
                    free[resource] = free.get(resource, 0) + value
                    self.total[resource] = self.total.get(resource, 0) + value
        placed, pod_sets = self.reserved.get(victim.key, ([], ()))
        for index, node_name, count in placed:
            free = self.free[names.index(node_name)]
            for resource, value in pod_sets[index].requests.items():
                free[resource] = free.get(resource, 0) + value * count
        for pod_set in pod_sets:
            for resource, value in pod_set.total.items():
                if value > 0 and pod_set.count > 0:
                    self.total[resource] = self.total.get(resource, 0) + value

    def largest_first(self, pod_sets: tuple[PodSet, ...]) -> list[int]:
        def share(index: int) -> float:
            largest = 0.0
            for resource, value in ranked(pod_sets[index].requests).items():
                cap = self.capacity.get(resource, 0)
                largest = max(largest, value / cap if cap > 0 else math.inf)
            return largest

        return sorted(range(len(pod_sets)), key=lambda i: (-share(i), i))

    def room(self, node: int, resources: list[str]) -> Fraction:
        return sum(
            (Fraction(self.free[node].get(r, 0), self.capacity.get(r, 0) or 1) for r in resources),
            Fraction(0),
        )

    def place(
        self, pod_sets: tuple[PodSet, ...], *, reserve: bool = False
    ) -> list[tuple[int, str, int]] | None:
        totals: dict[str, int] = {}
        for pod_set in pod_sets:
            if pod_set.count > 0:
                for resource, value in pod_set.requests.items():
                    totals[resource] = totals.get(resource, 0) + value * pod_set.count
        if not reserve and any(v > self.total.get(r, 0) for r, v in totals.items() if v > 0):
            return None
        placed: list[tuple[int, str, int]] = []
        undo: list[tuple[int, dict[str, int], int]] = []
        for index in self.largest_first(pod_sets):
            pod_set = pod_sets[index]
            if pod_set.count <= 0:
                continue
            request = {r: v for r, v in pod_set.requests.items() if v > 0}
            candidates = [
                i
                for i, node in enumerate(self.nodes)
                if node.admits(pod_set)
                and all(self.free[i].get(r, 0) >= v for r, v in request.items())
            ]
            candidates.sort(key=lambda i: (self.room(i, sorted(ranked(request))), i))
            remaining = pod_set.count
            for node in candidates:
                if not remaining:
                    break
                room = min(
                    [remaining, *(self.free[node].get(r, 0) // v for r, v in request.items())]
                )
                for resource, value in request.items():
                    self.free[node][resource] = self.free[node].get(resource, 0) - value * room
                placed.append((index, self.nodes[node].name, room))
                undo.append((node, request, room))
                remaining -= room
            if remaining and not reserve:
                for node, request, room in undo:
                    for resource, value in request.items():
                        self.free[node][resource] += value * room
                return None
        for resource, value in totals.items():
            self.total[resource] = self.total.get(resource, 0) - value
        return placed


@pytest.mark.parametrize("seed", range(6))
def test_placements_match_a_plain_best_fit(seed: int) -> None:
    rng = random.Random(seed)
    snapshot = random_cluster(rng, "c", nodes=60, reservations=40)
    state = ClusterRoom(snapshot)
    plain = PlainState(snapshot)
    assert free_room(state)[1] == [Resources(free) for free in plain.free]
    for workload in random_pending(rng, 300, ["c"]):
        result = try_place(state, workload.pod_sets)
        want = plain.place(workload.pod_sets)
        if want is None:
            assert not result.ok, workload.key
        else:
            assert result.ok, (workload.key, result.reason)
            assert result.assignments == tuple(NodeAssignment(p, n, c) for p, n, c in want)
        assert free_room(state)[0] == Resources(plain.total)


# -- whole cycles against the cycle before its shortcuts --------------------------------


def plain_schedule(
    pending: list[Workload],
    clusters: list[ClusterSnapshot],
    *,
    mode: QueueMode,
    now: float,
    starvation_after: float,
    preemption: PreemptionPolicy | None,
) -> CycleResult:
    """The cycle without shortcuts: every usable cluster tried for every workload."""
    ordered = sorted(pending, key=queue_order_key)
    clusters = sorted(clusters, key=lambda c: c.name)
    single = len(clusters) == 1
    states: dict[str, ClusterRoom] = {}
    ever: dict[tuple[str, str], bool] = {}
    held: dict[str, tuple[str, str]] = {}  # cluster -> (holder, why), named per reader
    admitted: dict[str, list[Reservation]] = {}
    no_victims: dict[tuple[str, object], int] = {}
    admits, waits, preemptions = [], [], []
    head_key = None
    blocked = None

    def state(cluster: ClusterSnapshot) -> ClusterRoom:
        if cluster.name not in states:
            states[cluster.name] = ClusterRoom(cluster)
        return states[cluster.name]

    def could_ever_fit(workload: Workload, cluster: ClusterSnapshot) -> bool:
        if not cluster.reachable:
            return True
        key = (cluster.name, workload.key)
        if key not in ever:
            ever[key] = ClusterRoom(cluster, empty=True).fits(Gang.of(workload.pod_sets))
        return ever[key]

    for workload in ordered:
        if blocked is not None:
            behind = mention(blocked, to=workload.key)
            waits.append(Wait(workload.key, f"waiting behind {behind} (head of line)"))
            continue
        usable = [c for c in clusters if workload.placement.allows(c)]
        gang = Gang.of(workload.pod_sets)
        reasons, fitting = [], []
        for cluster in usable:
            if not cluster.reachable:
                # Unreachable only where it would fit the cluster as last seen.
                tried = try_place(state(cluster), workload.pod_sets) if cluster.nodes else None
                if tried is not None and tried.ok:
                    tried.undo()
                fits = tried is None or tried.ok
                reasons.append((cluster.name, "unreachable" if fits else tried.reason))
            elif cluster.name in held:
                short = state(cluster).short_in_total(Gang.of(workload.pod_sets))
                holder, why = held[cluster.name]
                said = f"held for {mention(holder, to=workload.key)}{why}"
                reasons.append((cluster.name, short.text if short else said))
            else:
                result = try_place(state(cluster), workload.pod_sets)
                if result.ok:
                    fitting.append((cluster, result))
                else:
                    reasons.append((cluster.name, result.reason))
        if fitting:
            best_share: tuple[float, str] | None = None
            for resource, value in gang.totals:
                capacity = sum(state(c).capacity_of(resource) for c, _ in fitting)
                share = value / capacity if capacity > 0 else math.inf
                if best_share is None or share > best_share[0]:
                    best_share = (share, resource)
            scarcest = None if best_share is None else best_share[1]
            chosen = min(
                fitting,
                key=lambda f: (0 if scarcest is None else state(f[0]).free_of(scarcest), f[0].name),
            )
            for cluster, result in fitting:
                if cluster is not chosen[0]:
                    result.undo()
            admits.append(Admit(workload.key, chosen[0].name))
            admitted.setdefault(chosen[0].name, []).append(
                Reservation(
                    workload.key, workload.pod_sets, workload.priority, now, workload.preemptible
                )
            )
            continue
        head_key = head_key or workload.key
        if not usable:
            message = "no member cluster matches the placement (clusterScheduling)"
        elif single:
            message = reasons[0][1]
        else:
            message = "no cluster fits: " + "; ".join(f"{n}: {w}" for n, w in reasons)
        chosen_preempt = None
        if preemption is not None:
            for cluster in usable:
                if not cluster.reachable or cluster.name in held:
                    continue
                failed_at = no_victims.get((cluster.name, gang.shape))
                if failed_at is not None and workload.priority <= failed_at:
                    continue
                snapshot = cluster
                if admitted.get(cluster.name):
                    snapshot = ClusterSnapshot(
                        name=cluster.name,
                        nodes=cluster.nodes,
                        reservations=cluster.reservations + tuple(admitted[cluster.name]),
                        labels=cluster.labels,
                        reachable=cluster.reachable,
                        admitted=cluster.admitted,
                    )
                victims = preemption.choose_victims(workload, snapshot)
                if not victims:
                    if victims is None:
                        no_victims[(cluster.name, gang.shape)] = workload.priority
                    continue
                if chosen_preempt is None or len(victims) < len(chosen_preempt.victims):
                    chosen_preempt = Preempt(workload.key, cluster.name, victims)
        if chosen_preempt is not None:
            preemptions.append(chosen_preempt)
            held[chosen_preempt.cluster] = (workload.key, ", which is preempting")
            where = "" if single else f" in {chosen_preempt.cluster}"
            victims = mention_all(chosen_preempt.victims, to=workload.key)
            message += f"; preempting {victims}{where}"
        waits.append(Wait(workload.key, message))
        if mode is QueueMode.STRICT_FIFO:
            if any(could_ever_fit(workload, c) for c in usable):
                blocked = workload.key
        elif now - workload.queued_since > starvation_after:
            for cluster in usable:
                if could_ever_fit(workload, cluster):
                    held.setdefault(
                        cluster.name,
                        (
                            workload.key,
                            f", queued longer than {starvation_after:g}s (starvation guard)",
                        ),
                    )
    return CycleResult(tuple(admits), tuple(waits), tuple(preemptions), head_key)


CYCLE_CASES = [
    (seed, mode, preempt, clusters)
    for seed in range(4)
    for mode in QueueMode
    for preempt in (False, True)
    for clusters in (1, 3)
]


def _random_case(
    seed: int, mode: QueueMode, preempt: bool, clusters: int
) -> tuple[list[Workload], list[ClusterSnapshot], dict[str, Any]]:
    rng = random.Random(1000 + seed)
    names = [f"c{i}" for i in range(clusters)]
    snapshots = [random_cluster(rng, name, nodes=40, reservations=10) for name in names]
    pending = random_pending(rng, 400, names)
    kwargs = {
        "mode": mode,
        "now": 1000.0,
        "starvation_after": 3000.0,
        "preemption": LowestPriorityFirst() if preempt else None,
    }
    return pending, snapshots, kwargs


@pytest.mark.parametrize(("seed", "mode", "preempt", "clusters"), CYCLE_CASES)
def test_cycle_decides_as_without_shortcuts(
    seed: int, mode: QueueMode, preempt: bool, clusters: int
) -> None:
    pending, snapshots, kwargs = _random_case(seed, mode, preempt, clusters)
    got = schedule(pending, snapshots, **kwargs)
    want = plain_schedule(pending, snapshots, **kwargs)  # type: ignore[arg-type]
    assert got.admits == want.admits
    assert got.waits == want.waits
    assert got.preemptions == want.preemptions
    assert got.head_key == want.head_key


def test_the_random_cycles_cover_the_cases() -> None:
    """The cases above admitted, failed per node, preempted and held (counted here, not
    summed across tests: those may run in other processes)."""
    seen: Counter[str] = Counter()
    for case in CYCLE_CASES:
        pending, snapshots, kwargs = _random_case(*case)
        got = schedule(pending, snapshots, **kwargs)
        seen["admits"] += len(got.admits)
        seen["per-node"] += sum("but no node can hold" in w.message for w in got.waits)
        seen["preemptions"] += len(got.preemptions)
        seen["held"] += sum("held for" in w.message for w in got.waits)
    assert all(seen[what] > 10 for what in ("admits", "per-node", "preemptions", "held")), seen


def test_same_reason_is_one_string() -> None:
    rng = random.Random(7)
    snapshots = [random_cluster(rng, f"c{i}", nodes=30, reservations=10) for i in range(3)]
    result = schedule(
        random_pending(rng, 300, ["c0", "c1", "c2"]),
        snapshots,
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=1000.0,
        starvation_after=1e9,
        preemption=None,
    )
    by_text: dict[str, str] = {}
    for wait in result.waits:
        if "Job/" not in wait.message:  # reasons that do not name the workload's pod
            assert by_text.setdefault(wait.message, wait.message) is wait.message


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    clusters=st.integers(1, 4),
    nodes=st.integers(0, 12),
    mode=st.sampled_from(list(QueueMode)),
    preempt=st.booleans(),
)
def test_cycle_decides_as_without_shortcuts_on_drawn_worlds(
    seed: int, clusters: int, nodes: int, mode: QueueMode, preempt: bool
) -> None:
    """The differential test of the cycle's shortcuts on small worlds hypothesis draws:
    few nodes make per-node failures, holds and ties common."""
    rng = random.Random(seed)
    names = [f"c{i}" for i in range(clusters)]
    snapshots = [random_cluster(rng, name, nodes=nodes, reservations=3) for name in names]
    pending = random_pending(rng, 60, names)
    kwargs = {
        "mode": mode,
        "now": 1000.0,
        "starvation_after": 3000.0,
        "preemption": LowestPriorityFirst() if preempt else None,
    }
    got = schedule(pending, snapshots, **kwargs)  # type: ignore[arg-type]
    want = plain_schedule(pending, snapshots, **kwargs)  # type: ignore[arg-type]
    assert (got.admits, got.preemptions, got.head_key) == (
        want.admits,
        want.preemptions,
        want.head_key,
    )
    assert [_verdict(w) for w in got.waits] == [_verdict(w) for w in want.waits]


# A reason found per node: which pod found no room, with the free room seen then.
_PER_NODE = re.compile(
    r"resources free in total but no node can hold [^;]*"
    r"|(?:needs [^;:]*; )*needs [^;:]* on the \d+ nodes its pods may use"
)


def _verdict(wait: Wait) -> tuple[str, str]:
    """The wait with per-node reasons reduced to their kind.

    A cluster remembers a per-node failure by gang shape for the rest of the cycle (room
    only shrinks, so it stands), with the numbers seen when it was found. The cycle does
    not try every cluster for every workload, so it may first find that failure at another
    moment than the plain cycle, with other numbers in the same verdict.
    """
    return wait.key, _PER_NODE.sub("<no room per node>", wait.message)


# -- evictions against the plain best fit ------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_evictions_give_back_what_victims_hold(seed: int) -> None:
    """After evictions, every node's free room and the aggregate are the plain model's with
    the victims' charges handed back; placements then go where the plain best fit puts
    them; undoing the evictions, in any order, restores the state exactly."""
    rng = random.Random(2000 + seed)
    snapshot = random_cluster(rng, "c", nodes=30, reservations=60)
    workloads = random_pending(rng, 6, ["c"])
    for _ in range(6):
        state = ClusterRoom(snapshot)
        plain = PlainState(snapshot)
        before = free_room(state)
        victims = rng.sample(list(snapshot.admitted), rng.randint(0, len(snapshot.admitted)))
        undos = []
        for victim in victims:
            undos.append(evict(state, victim))
            plain.evict(victim)
        assert free_room(state) == (
            Resources(plain.total),
            [Resources(free) for free in plain.free],
        )
        for workload in workloads:
            want = plain.place(workload.pod_sets)
            got = try_place(state, workload.pod_sets)
            assert got.ok == (want is not None)
            if want is not None:
                assert got.assignments == tuple(NodeAssignment(p, n, c) for p, n, c in want)
                got.undo()
                plain = PlainState(snapshot)
                for victim in victims:
                    plain.evict(victim)
        rng.shuffle(undos)
        for undo in undos:
            undo()
        assert free_room(state) == before


@pytest.mark.parametrize("seed", range(4))
def test_remembered_refusals_are_never_wrong(seed: int) -> None:
    """`refusal` answers from remembered failures; after placements, failures, undos and
    evictions, whenever it refuses a gang, placing the gang for real fails too."""
    rng = random.Random(5000 + seed)
    snapshot = random_cluster(rng, "c", nodes=30, reservations=20)
    state = ClusterRoom(snapshot)
    gangs = [Gang.of(w.pod_sets) for w in random_pending(rng, 60, ["c"])]
    placed = []
    for gang in gangs * 2:
        for other in gangs:
            if state.refusal(other) is not None:
                assert isinstance(state.place(other, explain=False), Refusal)
        result = state.place(gang)
        if not isinstance(result, Refusal):
            placed.append(result)
        if placed and rng.random() < 0.3:
            placed.pop(rng.randrange(len(placed))).undo()
        if rng.random() < 0.1:
            evict(state, rng.choice(snapshot.admitted))


def test_cycle_reuses_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workloads of a shape refused since the last admission or hold get the same answer
    without being placed again, and the cycle decides as without that shortcut."""
    from dispatcher.core.scheduling import cycle

    rng = random.Random(11)
    names = ["c0", "c1", "c2"]
    snapshots = [random_cluster(rng, name, nodes=40, reservations=10) for name in names]
    pending = random_pending(rng, 400, names)
    kwargs = {
        "mode": QueueMode.BEST_EFFORT_FIFO,
        "now": 1000.0,
        "starvation_after": 3000.0,
        "preemption": None,
    }
    tried = Counter[str]()
    best_fit = cycle.best_fit

    def counted(*args: object) -> object:
        tried["placed"] += 1
        return best_fit(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cycle, "best_fit", counted)
    got = schedule(pending, snapshots, **kwargs)  # type: ignore[arg-type]
    assert tried["placed"] < len(pending) - 10, tried
    want = plain_schedule(pending, snapshots, **kwargs)  # type: ignore[arg-type]
    assert (got.admits, got.waits, got.head_key) == (want.admits, want.waits, want.head_key)
