"""The queue manager: order kept under events, parking and waking, and cycles over its
active work deciding as a full cycle over every pending workload does."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.api.models import Reason
from dispatcher.core.model import ClusterSnapshot, QueueMode, Reservation, Workload
from dispatcher.core.queues import QueueManager, Wake, take
from dispatcher.core.quota.charges import Charges
from dispatcher.core.quota.model import Charge
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import CycleResult, LowestPriorityFirst, queue_order_key, schedule
from tests.unit.builders import cluster, node, pods, res, workload
from tests.unit.quota_builders import cohort, queue, setup

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LINES = ("", "q0", "q1")

# -- order --------------------------------------------------------------------------------

order_events = st.lists(
    st.tuples(
        st.sampled_from(["upsert", "upsert", "remove", "park", "wake", "block", "admitted"]),
        st.integers(0, 15),  # AppWrapper
        st.integers(0, 3),  # priority
        st.integers(0, 5),  # created_at
        st.integers(0, 2),  # line
    ),
    max_size=60,
)


@SETTINGS
@given(order_events)
def test_lines_and_active_work_keep_the_full_sorts_order(
    steps: list[tuple[str, int, int, int, int]],
) -> None:
    manager = QueueManager()
    pending: dict[str, tuple[Workload, str]] = {}
    for kind, index, priority, created, line_index in steps:
        key = f"ns/aw-{index:02d}"
        if kind == "upsert":
            size = 1 + index % 3
            item = workload(key, pods(size, cpu=1), priority=priority, created_at=created)
            manager.upsert(item, LINES[line_index])
            pending[key] = (item, LINES[line_index])
        elif kind in ("remove", "admitted") and key in pending:
            del pending[key]
            manager.remove(key) if kind == "remove" else manager.admitted(key)
        elif kind == "park":
            manager.park(key, Wake.CAPACITY if priority % 2 else Wake.QUOTA, root="r")
        elif kind == "block":
            manager.blocked(key)
        elif kind == "wake":
            manager.capacity_freed() if priority % 2 else manager.quota_released("r")
    assert len(manager) == len(pending)
    for line in LINES:
        want = sorted((w for w, at in pending.values() if at == line), key=queue_order_key)
        assert list(manager.in_line(line)) == want
        assert list(manager.in_line(line, 2)) == want[:2]
    active = manager.active()
    assert active == sorted(active, key=queue_order_key)
    assert {w.key for w in active} == {k for k in pending if not manager.is_parked(k)}


def test_a_wake_takes_the_first_of_each_question_only() -> None:
    manager = QueueManager()
    small = [workload(f"ns/s{i}", pods(1, cpu=1), created_at=i) for i in range(3)]
    large = [workload(f"ns/l{i}", pods(4, cpu=1), created_at=i) for i in range(3)]
    for item in small + large:
        manager.upsert(item, "")
        manager.park(item.key, Wake.CAPACITY)
    assert manager.active() == []
    manager.capacity_freed()
    assert [w.key for w in manager.active()] == ["ns/l0", "ns/s0"]
    manager.admitted("ns/s0")  # room for one: the next of its question is worth a try
    assert [w.key for w in manager.active()] == ["ns/l0", "ns/s1"]
    manager.quota_released("")  # nothing of that tree is parked for quota; capacity is
    assert [w.key for w in manager.active()] == ["ns/l0", "ns/l1", "ns/s1", "ns/s2"]


def test_a_blocked_head_parks_its_line_until_it_goes() -> None:
    manager = QueueManager()
    for i in range(4):
        manager.upsert(workload(f"ns/w{i}", pods(1, cpu=1), created_at=i), "q0")
    manager.upsert(workload("ns/other", pods(1, cpu=1), created_at=9), "q1")
    manager.blocked("ns/w1")
    assert [w.key for w in manager.active()] == ["ns/w0", "ns/w1", "ns/other"]
    manager.upsert(workload("ns/late", pods(1, cpu=1), created_at=7), "q0")
    manager.upsert(workload("ns/urgent", pods(1, cpu=1), priority=5), "q0")
    assert [w.key for w in manager.active()] == ["ns/urgent", "ns/w0", "ns/w1", "ns/other"]
    manager.admitted("ns/w1")
    assert [w.key for w in manager.active()] == [
        "ns/urgent", "ns/w0", "ns/w2", "ns/w3", "ns/late", "ns/other"
    ]  # fmt: skip


def test_starving_work_is_woken_to_hold_its_clusters() -> None:
    manager = QueueManager()
    manager.upsert(workload("ns/old", pods(1, cpu=1), queued_since=10.0), "")
    manager.upsert(workload("ns/new", pods(2, cpu=1), queued_since=500.0), "")
    manager.park("ns/old", Wake.CAPACITY)
    manager.park("ns/new", Wake.CAPACITY)
    manager.wake_starving(100.0)
    assert [w.key for w in manager.active()] == ["ns/old"]


# -- cycles over active work decide as full cycles do ------------------------------------

NODES = (node("n1", cpu=4), node("n2", cpu=4), node("n3", cpu=8))
cycle_events = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "arrive", "arrive", "finish", "cycle", "cycle"]),
        st.integers(1, 6),  # pods (one cpu each), or which to finish
        st.integers(0, 2),  # priority
        st.integers(0, 2),  # line: no queue, q0, q1
    ),
    max_size=40,
)


def _quotas() -> QuotaTree:
    return QuotaTree(
        setup(
            queue("q0", {"cpu": ("6", "4", None)}, cohort="c", strategy=QueueMode.BEST_EFFORT_FIFO),
            queue("q1", {"cpu": ("4", None, None)}, cohort="c", strategy=QueueMode.STRICT_FIFO),
            cohorts=[cohort("c")],
        )
    )


@dataclass
class _Side:
    """One way of running cycles, with its own pending and admitted work."""

    pending: dict[str, Workload] = field(default_factory=dict)
    admitted: list[tuple[Workload, str]] = field(default_factory=list)
    usage: Charges | None = None
    order: list[str] = field(default_factory=list)  # keys in the order they were admitted

    def admit(self, result: CycleResult) -> None:
        for admit in result.admits:
            item = self.pending.pop(admit.key)
            self.admitted.append((item, admit.queue))
            self.order.append(admit.key)
            if self.usage is not None and admit.assignment is not None:
                amounts = dict(admit.assignment.amounts)
                charge = Charge(item.key, admit.queue, amounts, priority=item.priority)
                self.usage.charge(charge)

    def finish(self, which: int) -> str:
        """The `which`th admitted one finishes: the root that got quota back, if any."""
        if not self.admitted:
            return "-"
        done, _ = self.admitted.pop(which % len(self.admitted))
        return self.usage.release(done.key) if self.usage is not None else ""


@SETTINGS
@given(
    cycle_events,
    st.sampled_from(list(QueueMode)),
    st.booleans(),
    st.booleans(),
    st.sampled_from([1e9, 3.0]),
    st.sampled_from([None, 2]),
)
def test_parked_work_is_never_left_behind(
    steps: list[tuple[str, int, int, int]],
    mode: QueueMode,
    preempt: bool,
    quotas: bool,
    starvation_after: float,
    limit: int | None,
) -> None:
    """After each event, `take` runs until it admits nothing more; then a full cycle over
    every pending workload (today's `schedule`) admits nothing either: no workload that
    could be admitted stays parked, the starvation guard's holds included (`starvation_after`
    3: work queued three steps ago holds clusters), and with a `limit` of decisions per
    cycle (the rest in the next, `again`). Within each cycle a StrictFIFO line admits in
    its order.
    (Which of two questions goes first after an event may differ from a full cycle: an event
    wakes the first of each question, and its next one only once it is admitted.)"""
    tree = _quotas() if quotas else None
    kept = _Side(usage=Charges(tree) if tree is not None else None)
    manager = QueueManager()
    policy = LowestPriorityFirst() if preempt else None
    held: frozenset[str] = frozenset()
    for step, (kind, size, priority, line_index) in enumerate(steps):
        if kind == "arrive":
            line = LINES[line_index] if quotas else ""
            item = workload(f"ns/aw-{step:02d}", pods(size, cpu=1), priority=priority)
            item = replace(item, queue_name=line, created_at=float(step))
            kept.pending[item.key] = item
            manager.upsert(item, line)
            continue
        if kind == "finish":
            root = kept.finish(size)
            if root != "-":
                manager.capacity_freed()
            if root not in ("", "-"):
                manager.quota_released(root)
            continue

        def view() -> QuotaView | None:
            return QuotaView(tree, usage=kept.usage) if kept.usage is not None else None

        for _ in range(4 * len(steps) + 1):
            result = take(
                manager,
                [_cluster(kept.admitted)],
                mode=mode,
                now=float(step),
                starvation_after=starvation_after,
                preemption=policy,
                quotas=view(),
                held_before=held,
                limit=limit,
            )
            held = result.held
            # A head is its line's first pending workload, however little the cycle took.
            assert result.heads == {
                w.key
                for w in result.waits
                if manager.is_first(w.key) and w.reason is not Reason.QUEUE_NOT_READY
            }
            for line in LINES:
                strict = [a.key for a in result.admits if a.queue == line]
                if _strict_line(line, mode, quotas):
                    ranks = [queue_order_key(kept.pending[key]) for key in strict]
                    assert ranks == sorted(ranks)
            kept.admit(result)
            if not result.admits and not result.again:
                break
        full = schedule(
            list(kept.pending.values()),
            [_cluster(kept.admitted)],
            mode=mode,
            now=float(step),
            starvation_after=starvation_after,
            preemption=policy,
            quotas=view(),
        )
        assert full.admits == ()
    assert set(kept.pending) == {w.key for w in _all(manager)}


@dataclass(frozen=True)
class HeadCase:
    """Workloads `(size, priority, line)` arrive as `ns/aw-00`, `ns/aw-01`, ...; cycles of
    `limit` decisions run until one admits nothing and says no `again`."""

    id: str
    arrivals: tuple[tuple[int, int, str], ...]
    limit: int | None
    want_admits: tuple[str, ...]
    want_heads: frozenset[str]


HEAD_CASES = [
    # The falsifying example of `test_parked_work_is_never_left_behind`: q0's first
    # (aw-03) would borrow, so `nominal_first` tries aw-00 (within nominal) before it; both
    # are refused by quota (aw-02 borrowed q0's unused nominal), and the head is aw-03,
    # the first of the line, not aw-00.
    HeadCase(
        id="falsifying-example-limit-2",
        arrivals=((1, 0, "q0"), (5, 1, "q0"), (5, 1, "q1"), (2, 1, "q0")),
        limit=2,
        want_admits=("ns/aw-01", "ns/aw-02"),
        want_heads=frozenset({"ns/aw-03"}),
    ),
]


@pytest.mark.parametrize("case", HEAD_CASES, ids=[c.id for c in HEAD_CASES])
def test_a_line_whose_first_would_borrow_still_names_it_head(case: HeadCase) -> None:
    tree = _quotas()
    kept = _Side(usage=Charges(tree))
    manager = QueueManager()
    for index, (size, priority, line) in enumerate(case.arrivals):
        item = workload(f"ns/aw-{index:02d}", pods(size, cpu=1), priority=priority)
        item = replace(item, queue_name=line, created_at=float(index))
        kept.pending[item.key] = item
        manager.upsert(item, line)
    heads: set[str] = set()
    for _ in range(len(case.arrivals) + 1):
        result = take(
            manager,
            [_cluster(kept.admitted)],
            mode=QueueMode.STRICT_FIFO,
            now=float(len(case.arrivals)),
            starvation_after=1e9,
            preemption=None,
            quotas=QuotaView(tree, usage=kept.usage),
            limit=case.limit,
        )
        heads |= result.heads
        kept.admit(result)
        if not result.admits and not result.again:
            break
    assert tuple(kept.order) == case.want_admits
    assert heads == case.want_heads
    assert all(manager.is_first(key) for key in heads)
    # A full cycle over every pending workload names the same head.
    full = schedule(
        list(kept.pending.values()),
        [_cluster(kept.admitted)],
        mode=QueueMode.STRICT_FIFO,
        now=float(len(case.arrivals)),
        starvation_after=1e9,
        preemption=None,
        quotas=QuotaView(tree, usage=kept.usage),
    )
    assert full.heads == case.want_heads


def _strict_line(queue: str, mode: QueueMode, quotas: bool) -> bool:
    if quotas and queue:
        return queue == "q1"  # q0 is BestEffortFIFO, q1 StrictFIFO (`_quotas`)
    return mode is QueueMode.STRICT_FIFO


def _cluster(admitted: list[tuple[Workload, str]]) -> ClusterSnapshot:
    reservations = tuple(
        Reservation(key=w.key, pod_sets=w.pod_sets, priority=w.priority) for w, _ in admitted
    )
    return cluster("c1", *NODES, reservations=reservations)


def _all(manager: QueueManager) -> list[Workload]:
    return [w for line in manager.lines() for w in manager.in_line(line)]


def test_heads_per_line_take_each_lines_first_in_order() -> None:
    manager = QueueManager()
    for i, line in enumerate(["q0", "q1", "q0", "", "q1", ""]):
        manager.upsert(workload(f"ns/w{i}", pods(1, cpu=1), created_at=i), line)
    manager.park("ns/w0", Wake.CAPACITY)
    assert [w.key for w in manager.active(1)] == ["ns/w1", "ns/w2", "ns/w3"]
    assert [w.key for w in manager.active(2)] == ["ns/w1", "ns/w2", "ns/w3", "ns/w4", "ns/w5"]


def test_a_cycle_decides_at_most_its_limit_and_says_there_is_more() -> None:
    manager = QueueManager()
    for index in range(5):
        manager.upsert(workload(f"ns/w{index}", pods(1, cpu=1), created_at=float(index)), "")
    cluster = ClusterSnapshot(name="c", nodes=(node("n1", cpu=2),))
    decided: list[list[str]] = []
    again = True
    while again:
        result = take(
            manager,
            [cluster],
            mode=QueueMode.BEST_EFFORT_FIFO,
            now=10.0,
            starvation_after=1e9,
            preemption=None,
            limit=2,
        )
        decided.append([a.key for a in result.admits] + [w.key for w in result.waits])
        again = result.again
    # In order, two a cycle, the last one alone; then nothing is active.
    assert decided == [["ns/w0", "ns/w1"], ["ns/w2", "ns/w3"], ["ns/w4"]]
    assert manager.active() == []


def test_the_head_is_the_first_of_its_line_not_the_first_a_cycle_took() -> None:
    """A cycle over newly arrived work behind a parked head reports no head: the parked one
    still is (and a new one ahead of it, by priority, is)."""
    manager = QueueManager()
    full = ClusterSnapshot(name="c", nodes=(node("n1", cpu=2, used=res(cpu=2)),))

    def cycle() -> CycleResult:
        return take(
            manager,
            [full],
            mode=QueueMode.BEST_EFFORT_FIFO,
            now=10.0,
            starvation_after=1e9,
            preemption=None,
        )

    manager.upsert(workload("ns/old", pods(1, cpu=1), created_at=1.0), "")
    first = cycle()
    assert (first.heads, first.head_key) == ({"ns/old"}, "ns/old")
    assert manager.is_parked("ns/old")
    manager.upsert(workload("ns/new", pods(1, cpu=1), created_at=2.0), "")
    second = cycle()
    assert [w.key for w in second.waits] == ["ns/new"]
    assert (second.heads, second.head_key) == (frozenset(), None)
    manager.upsert(workload("ns/urgent", pods(1, cpu=1), priority=5, created_at=3.0), "")
    third = cycle()
    assert (third.heads, third.head_key) == ({"ns/urgent"}, "ns/urgent")


def test_the_next_of_a_line_is_woken_when_its_head_goes() -> None:
    """Whatever its question: it is the head now, and a cycle must say so."""
    manager = QueueManager()
    manager.upsert(workload("ns/head", pods(1, cpu=1), created_at=1.0), "q0")
    manager.upsert(workload("ns/large", pods(4, cpu=1), created_at=2.0), "q0")
    manager.upsert(workload("ns/larger", pods(6, cpu=1), created_at=3.0), "q0")
    for key in ("ns/head", "ns/large", "ns/larger"):
        manager.park(key, Wake.CAPACITY)
    manager.capacity_freed()
    assert [w.key for w in manager.active()] == ["ns/head", "ns/large", "ns/larger"]
    for key in ("ns/large", "ns/larger"):
        manager.park(key, Wake.CAPACITY)
    manager.admitted("ns/head")
    assert [w.key for w in manager.active()] == ["ns/large"]
    manager.park("ns/large", Wake.CAPACITY)
    manager.upsert(workload("ns/large", pods(4, cpu=1), created_at=2.0), "q0")  # changed
    assert [w.key for w in manager.active()] == ["ns/large"]  # itself, not the next
    manager.park("ns/large", Wake.CAPACITY)
    manager.remove("ns/large")  # deleted: the next is the head now
    assert [w.key for w in manager.active()] == ["ns/larger"]
