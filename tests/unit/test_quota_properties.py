"""Property tests of the quota core over random histories: arrivals, completions, quota
edits and preemptions, checked against a flat cohort's rules written out plainly.

Every generated setup is one cohort of queues (each with a nominal quota, maybe a borrowing
limit and a lending limit). After every cycle:
- no queue that was admitted to uses more than its nominal quota plus its borrowing limit;
- the cohort lends no more than its members' lending limits allow: what queues use beyond
  the part of their quota they keep (nominal less lending limit) fits in what they lend;
- every victim of a preemption in another queue came from a queue that was borrowing, and
  every victim was allowed by the preemptor's queue's policies.
Capacity never binds (one huge node), so every figure is the quota's.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dispatcher.core.model import DispatchedWorkload, QueueMode, Workload
from dispatcher.core.quota.model import Charge, QueueSpec, Reclaim, WithinQueue
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import LowestPriorityFirst, schedule
from tests.unit.builders import cluster, node, pods, res, workload
from tests.unit.quota_builders import DEFAULT, queue, setup

CPU = (DEFAULT, "cpu")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class Running:
    queue: str
    cpu: int  # whole cpus
    priority: int
    at: float


queue_specs = st.builds(
    lambda nominal, borrow, lend, within, reclaim: (nominal, borrow, lend, within, reclaim),
    st.integers(0, 6),
    st.one_of(st.none(), st.integers(0, 4)),
    st.one_of(st.none(), st.integers(0, 6)),
    st.sampled_from([WithinQueue.LOWER_PRIORITY, *WithinQueue]),
    st.sampled_from([Reclaim.ANY, Reclaim.LOWER_PRIORITY, *Reclaim]),
)

_arrive = st.tuples(st.just("arrive"), st.integers(0, 3), st.integers(1, 4), st.integers(0, 2))
steps = st.lists(
    st.one_of(
        _arrive,
        _arrive,
        _arrive,
        st.tuples(st.just("finish"), st.integers(0, 50), st.just(0), st.just(0)),
        st.tuples(st.just("edit"), st.integers(0, 3), st.integers(0, 6), st.just(0)),
    ),
    min_size=1,
    max_size=40,
)


def _queue(index: int, spec: tuple[int, int | None, int | None, WithinQueue, Reclaim]) -> QueueSpec:
    nominal, borrow, lend = (str(v) if v is not None else None for v in spec[:3])
    assert nominal is not None
    return queue(
        f"q{index}",
        {"cpu": (nominal, borrow, lend)},
        cohort="c",
        within=spec[3],
        reclaim=spec[4],
    )


def _nominal(q: QueueSpec) -> tuple[int, int | None, int | None]:
    quota = q.quota(*CPU)
    assert quota is not None
    return quota.nominal, quota.borrowing_limit, quota.lending_limit


_RECLAIMING = [
    (0, None, None, WithinQueue.LOWER_PRIORITY, Reclaim.ANY),
    (1, None, None, WithinQueue.LOWER_PRIORITY, Reclaim.ANY),
]


@SETTINGS
@given(specs=st.lists(queue_specs, min_size=2, max_size=4), history=steps)
# Found by this test: q1 takes back its nominal quota in the cycle where a borrower of q0 is
# admitted first; it then preempted q0's workload within nominal (workloads within their
# nominal quota now go first in a cycle).
@example(
    specs=_RECLAIMING,
    history=[
        ("edit", 0, 1, 0),
        *[("arrive", 0, 1, 0)] * 3,
        ("arrive", 1, 1, 0),
        ("arrive", 0, 1, 0),
    ],
)
@example(
    specs=_RECLAIMING,
    history=[
        ("arrive", 0, 1, 0),
        ("edit", 0, 1, 0),
        ("arrive", 0, 1, 0),
        ("arrive", 0, 1, 0),
        ("arrive", 1, 1, 0),
        ("arrive", 1, 2, 1),
    ],
)
# Found by this test: a quota lowered under a running workload leaves its cohort over-lent;
# admitting within another queue's unlent nominal quota is right all the same.
@example(
    specs=[
        (0, None, None, WithinQueue.LOWER_PRIORITY, Reclaim.ANY),
        (2, None, 0, WithinQueue.LOWER_PRIORITY, Reclaim.ANY),
    ],
    history=[("edit", 0, 1, 0), ("arrive", 0, 1, 0), ("edit", 0, 0, 0), ("arrive", 1, 1, 0)],
)
def test_quota_histories_keep_every_limit(
    specs: list[tuple[int, int | None, int | None, WithinQueue, Reclaim]],
    history: list[tuple[str, int, int, int]],
) -> None:
    queues = [_queue(i, s) for i, s in enumerate(specs)]
    running: dict[str, Running] = {}
    pending: list[Workload] = []
    for serial, (op, a, b, c) in enumerate(history, start=1):
        if op == "arrive":
            name = f"q{a % len(queues)}"
            pending.append(
                workload(
                    f"ns/w{serial}",
                    pods(1, cpu=b),
                    priority=c * 100,
                    created_at=float(serial),
                    queue=name,
                )
            )
        elif op == "finish" and running:
            running.pop(sorted(running)[a % len(running)])
        elif op == "edit":
            index = a % len(queues)
            _, borrow, lend = _nominal(queues[index])
            spec = (
                b,
                borrow // 1000 if borrow is not None else None,
                lend // 1000 if lend is not None else None,
                queues[index].within,
                queues[index].reclaim,
            )
            queues[index] = _queue(index, spec)
        quotas = setup(*queues)
        charges = [
            Charge(k, r.queue, {CPU: r.cpu * 1000}, r.priority, r.at) for k, r in running.items()
        ]
        admitted = tuple(
            DispatchedWorkload(k, r.priority, r.at, usage=(("n1", res(cpu=r.cpu)),))
            for k, r in running.items()
        )
        used = sum(r.cpu for r in running.values())
        snapshot = cluster("c", node("n1", cpu=1000, used=res(cpu=used)), admitted=admitted)
        result = schedule(
            pending,
            [snapshot],
            mode=QueueMode.BEST_EFFORT_FIFO,
            now=float(serial),
            starvation_after=1e9,
            preemption=LowestPriorityFirst(),
            quotas=QuotaView(QuotaTree(quotas), charges),
        )
        by_key = {w.key: w for w in pending}
        usage_before = _usage(running)
        specs_by_name = {q.name: q for q in queues}
        for preempt in result.preemptions:
            preemptor = by_key[preempt.key]
            mine = specs_by_name[preemptor.queue_name]
            for victim in preempt.victims:
                gone = running[victim]
                assert (
                    gone.priority < preemptor.priority
                    or mine.reclaim is Reclaim.ANY
                    or (
                        mine.within is WithinQueue.LOWER_OR_NEWER_EQUAL
                        and gone.priority == preemptor.priority
                    )
                )
                if gone.queue == preemptor.queue_name:
                    assert mine.within is not WithinQueue.NEVER
                else:
                    assert mine.reclaim is not Reclaim.NEVER
                    nominal = _nominal(specs_by_name[gone.queue])[0] // 1000
                    assert usage_before[gone.queue] > nominal, "victim's queue was not borrowing"
        for admit in result.admits:
            w = by_key[admit.key]
            running[admit.key] = Running(
                w.queue_name, w.pod_sets[0].requests["cpu"] // 1000, w.priority, float(serial)
            )
        admitted_to = {by_key[a.key].queue_name for a in result.admits}
        _check_limits(queues, _usage(running), admitted_to, usage_before)
        for preempt in result.preemptions:
            for victim in preempt.victims:
                running.pop(victim, None)
        done = {a.key for a in result.admits}
        pending = [w for w in pending if w.key not in done]


def _usage(running: dict[str, Running]) -> dict[str, int]:
    usage: dict[str, int] = {}
    for r in running.values():
        usage[r.queue] = usage.get(r.queue, 0) + r.cpu
    return usage


def _taken_and_lent(queues: list[QueueSpec], usage: dict[str, int]) -> tuple[int, int]:
    """What the queues use beyond what they keep, and what they put into the cohort."""
    lent_in = taken = 0
    for q in queues:
        nominal, _, lend = (v // 1000 if v is not None else None for v in _nominal(q))
        assert nominal is not None
        kept = max(0, nominal - lend) if lend is not None else 0
        lent_in += nominal - kept
        taken += max(0, usage.get(q.name, 0) - kept)
    return taken, lent_in


def _check_limits(
    queues: list[QueueSpec],
    usage: dict[str, int],
    admitted_to: set[str],
    usage_before: dict[str, int],
) -> None:
    if not admitted_to:
        return
    for q in queues:
        nominal, borrow, _ = (v // 1000 if v is not None else None for v in _nominal(q))
        used = usage.get(q.name, 0)
        if q.name in admitted_to and borrow is not None and nominal is not None:
            assert used <= nominal + borrow, f"{q.name} uses {used} > {nominal} + {borrow}"
    taken, lent_in = _taken_and_lent(queues, usage)
    # A quota lowered under running work leaves the cohort over-lent; admissions never make
    # it worse than that.
    taken_before, _ = _taken_and_lent(queues, usage_before)
    assert taken <= max(lent_in, taken_before), f"the cohort lends {taken} of {lent_in}"
