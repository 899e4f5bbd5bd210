"""One scheduling cycle per case: order, queue modes, starvation, clusters, preemption."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.core.model import ClusterSnapshot, Placement, QueueMode, Workload
from dispatcher.core.scheduling import (
    Admit,
    LowestPriorityFirst,
    Preempt,
    PreemptionPolicy,
    queue_order_key,
    schedule,
)
from dispatcher.core.scheduling.placement import NodeAssignment
from dispatcher.core.scheduling.preemption import VictimRules
from tests.unit.builders import (
    admitted_placements,
    cluster,
    node,
    pods,
    res,
    running,
    with_running,
    workload,
)

STRICT = QueueMode.STRICT_FIFO
BEST = QueueMode.BEST_EFFORT_FIFO
NOW = 10_000.0


def gpu_job(key: str, gpu: int, **kwargs: object) -> Workload:
    return workload(key, pods(1, gpu=gpu, name=f"Job/{key.split('/')[1]}"), **kwargs)  # type: ignore[arg-type]


def gpu_cluster(name: str, gpu: int = 4, used: int = 0, **kwargs: object) -> ClusterSnapshot:
    return cluster(name, node(f"{name}-n1", gpu=gpu, used=res(gpu=used)), **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    id: str
    pending: tuple[Workload, ...]
    clusters: tuple[ClusterSnapshot, ...]
    want_admits: dict[str, str] = field(default_factory=dict)  # key -> cluster
    want_waits: dict[str, str] = field(default_factory=dict)  # key -> message
    want_preemptions: tuple[Preempt, ...] = ()
    want_head: str | None = None
    mode: QueueMode = BEST
    starvation_after: float = 1e9  # the starvation cases set their own
    preemption: PreemptionPolicy | None = None


CASES = [
    Case(
        id="priority-then-age-then-name",
        pending=(
            gpu_job("ns/old-low", 4, priority=0, created_at=1),
            gpu_job("ns/young-high", 4, priority=1, created_at=5),
            gpu_job("ns/old-high", 4, priority=1, created_at=3),
        ),
        clusters=(gpu_cluster("c"),),
        want_admits={"ns/old-high": "c"},
        want_waits={
            "ns/young-high": "needs nvidia.com/gpu 4, free 0 of 4",
            "ns/old-low": "needs nvidia.com/gpu 4, free 0 of 4",
        },
        want_head="ns/young-high",
    ),
    Case(
        id="name-breaks-ties",
        pending=(gpu_job("ns/b", 4), gpu_job("ns/a", 4)),
        clusters=(gpu_cluster("c"),),
        want_admits={"ns/a": "c"},
        want_waits={"ns/b": "needs nvidia.com/gpu 4, free 0 of 4"},
        want_head="ns/b",
    ),
    Case(
        id="strict-fifo-head-blocks",
        mode=STRICT,
        pending=(gpu_job("ns/big", 4, created_at=1), gpu_job("ns/small", 1, created_at=2)),
        clusters=(gpu_cluster("c", used=2),),
        want_waits={
            "ns/big": "needs nvidia.com/gpu 4, free 2 of 4",
            "ns/small": "waiting behind ns/big (head of line)",
        },
        want_head="ns/big",
    ),
    Case(
        id="strict-fifo-impossible-head-does-not-block",
        mode=STRICT,
        pending=(gpu_job("ns/huge", 16, created_at=1), gpu_job("ns/small", 1, created_at=2)),
        clusters=(gpu_cluster("c", used=2),),
        want_admits={"ns/small": "c"},
        want_waits={"ns/huge": "needs nvidia.com/gpu 16, free 2 of 4"},
        want_head="ns/huge",
    ),
    Case(
        id="best-effort-smaller-passes",
        pending=(gpu_job("ns/big", 4, created_at=1), gpu_job("ns/small", 1, created_at=2)),
        clusters=(gpu_cluster("c", used=2),),
        want_admits={"ns/small": "c"},
        want_waits={"ns/big": "needs nvidia.com/gpu 4, free 2 of 4"},
        want_head="ns/big",
    ),
    Case(
        id="starving-head-holds-the-cluster",
        pending=(
            gpu_job("ns/big", 4, created_at=1, queued_since=NOW - 7200),
            gpu_job("ns/small", 1, created_at=2),
        ),
        clusters=(gpu_cluster("c", used=2),),
        starvation_after=3600,
        want_waits={
            "ns/big": "needs nvidia.com/gpu 4, free 2 of 4",
            "ns/small": "held for ns/big, queued longer than 3600s (starvation guard)",
        },
        want_head="ns/big",
    ),
    Case(
        # Held only where it would fit otherwise: "mid" does not fit the free room in total,
        # so it says so (its status is not rewritten when the guard starts holding).
        id="held-only-where-it-would-fit-otherwise",
        pending=(
            gpu_job("ns/big", 4, created_at=1, queued_since=NOW - 7200),
            gpu_job("ns/mid", 3, created_at=2),
            gpu_job("ns/small", 1, created_at=3),
        ),
        clusters=(gpu_cluster("c", used=2),),
        starvation_after=3600,
        want_waits={
            "ns/big": "needs nvidia.com/gpu 4, free 2 of 4",
            "ns/mid": "needs nvidia.com/gpu 3, free 2 of 4",
            "ns/small": "held for ns/big, queued longer than 3600s (starvation guard)",
        },
        want_head="ns/big",
    ),
    Case(
        id="starving-head-that-can-never-fit-holds-nothing",
        pending=(
            gpu_job("ns/huge", 16, created_at=1, queued_since=0),
            gpu_job("ns/small", 1, created_at=2),
        ),
        clusters=(gpu_cluster("c", used=2),),
        starvation_after=3600,
        want_admits={"ns/small": "c"},
        want_waits={"ns/huge": "needs nvidia.com/gpu 16, free 2 of 4"},
        want_head="ns/huge",
    ),
    Case(
        id="starving-head-holds-only-clusters-it-could-use",
        pending=(
            gpu_job(
                "ns/big",
                4,
                created_at=1,
                queued_since=0,
                placement=Placement(clusters=frozenset({"east"})),
            ),
            gpu_job("ns/small", 1, created_at=2),
        ),
        clusters=(gpu_cluster("east", used=2), gpu_cluster("west", used=2)),
        starvation_after=3600,
        want_admits={"ns/small": "west"},
        want_waits={"ns/big": "no cluster fits: east: needs nvidia.com/gpu 4, free 2 of 4"},
        want_head="ns/big",
    ),
    Case(
        id="later-workloads-see-earlier-admissions",
        pending=(gpu_job("ns/a", 3, created_at=1), gpu_job("ns/b", 3, created_at=2)),
        clusters=(gpu_cluster("c"),),
        want_admits={"ns/a": "c"},
        want_waits={"ns/b": "needs nvidia.com/gpu 3, free 1 of 4"},
        want_head="ns/b",
    ),
    Case(
        id="best-fit-picks-the-tightest-cluster",
        pending=(gpu_job("ns/a", 2),),
        clusters=(gpu_cluster("west", gpu=8), gpu_cluster("east", gpu=8, used=5)),
        want_admits={"ns/a": "east"},
    ),
    Case(
        id="best-fit-ties-by-cluster-name",
        pending=(gpu_job("ns/a", 2),),
        clusters=(gpu_cluster("west", gpu=8), gpu_cluster("east", gpu=8)),
        want_admits={"ns/a": "east"},
    ),
    Case(
        id="best-fit-by-scarcest-resource",
        pending=(workload("ns/a", pods(1, cpu=1, gpu=2)),),
        clusters=(
            cluster("east", node("e1", cpu=4, gpu=8, used=res(cpu=3))),
            cluster("west", node("w1", cpu=64, gpu=8, used=res(gpu=4))),
        ),
        want_admits={"ns/a": "west"},
    ),
    Case(
        id="placement-cluster-names",
        pending=(gpu_job("ns/a", 2, placement=Placement(clusters=frozenset({"west"}))),),
        clusters=(gpu_cluster("west", gpu=8), gpu_cluster("east", gpu=8, used=5)),
        want_admits={"ns/a": "west"},
    ),
    Case(
        id="placement-cluster-labels",
        pending=(gpu_job("ns/a", 2, placement=Placement(match_labels=(("region", "eu"),))),),
        clusters=(
            gpu_cluster("west", gpu=8, labels={"region": "eu"}),
            gpu_cluster("east", gpu=8, used=5, labels={"region": "us"}),
        ),
        want_admits={"ns/a": "west"},
    ),
    Case(
        id="placement-matches-no-cluster",
        pending=(gpu_job("ns/a", 2, placement=Placement(clusters=frozenset({"mars"}))),),
        clusters=(gpu_cluster("west"), gpu_cluster("east")),
        want_waits={"ns/a": "no member cluster matches the placement (clusterScheduling)"},
        want_head="ns/a",
    ),
    Case(
        id="unreachable-cluster-skipped",
        pending=(gpu_job("ns/a", 2),),
        clusters=(gpu_cluster("east", gpu=8, reachable=False), gpu_cluster("west", gpu=8)),
        want_admits={"ns/a": "west"},
    ),
    Case(
        id="message-covers-every-cluster",
        pending=(gpu_job("ns/a", 4),),
        clusters=(gpu_cluster("east", used=2), gpu_cluster("west", reachable=False)),
        want_waits={
            "ns/a": "no cluster fits: east: needs nvidia.com/gpu 4, free 2 of 4; west: unreachable"
        },
        want_head="ns/a",
    ),
    Case(
        id="unreachable-where-it-would-not-fit-says-its-shortfall",
        pending=(gpu_job("ns/a", 4),),
        clusters=(gpu_cluster("east", used=2), gpu_cluster("west", used=3, reachable=False)),
        want_waits={
            "ns/a": "no cluster fits: east: needs nvidia.com/gpu 4, free 2 of 4; "
            "west: needs nvidia.com/gpu 4, free 1 of 4"
        },
        want_head="ns/a",
    ),
    Case(
        id="unreachable-never-seen-says-unreachable",
        pending=(gpu_job("ns/a", 4),),
        clusters=(gpu_cluster("east", used=2), cluster("west", reachable=False)),
        want_waits={
            "ns/a": "no cluster fits: east: needs nvidia.com/gpu 4, free 2 of 4; west: unreachable"
        },
        want_head="ns/a",
    ),
    Case(
        id="single-unreachable-cluster",
        pending=(gpu_job("ns/a", 4),),
        clusters=(gpu_cluster("c", reachable=False),),
        want_waits={"ns/a": "unreachable"},
        want_head="ns/a",
    ),
    Case(
        id="no-pods-admitted-anywhere",
        pending=(workload("ns/config-only"),),
        clusters=(gpu_cluster("c", used=4),),
        want_admits={"ns/config-only": "c"},
    ),
    Case(
        id="preemption-holds-the-claim",
        preemption=LowestPriorityFirst(),
        pending=(
            gpu_job("ns/urgent", 4, priority=5),
            gpu_job("ns/small", 1, priority=1),
        ),
        clusters=(
            with_running(
                gpu_cluster("c"), running("ns/low", priority=0, usage={"c-n1": res(gpu=3)})
            ),
        ),
        want_waits={
            "ns/urgent": "needs nvidia.com/gpu 4, free 1 of 4; preempting ns/low",
            "ns/small": "held for ns/urgent, which is preempting",
        },
        want_preemptions=(Preempt("ns/urgent", "c", ("ns/low",)),),
        want_head="ns/urgent",
    ),
    Case(
        id="preemption-sees-this-cycles-admissions",
        preemption=LowestPriorityFirst(),
        pending=(
            gpu_job("ns/first", 2, priority=9),
            gpu_job("ns/urgent", 4, priority=5),
        ),
        clusters=(
            with_running(
                gpu_cluster("c", gpu=8),
                running("ns/low-a", priority=0, dispatched_at=1, usage={"c-n1": res(gpu=3)}),
                running("ns/low-b", priority=0, dispatched_at=2, usage={"c-n1": res(gpu=3)}),
            ),
        ),
        want_admits={"ns/first": "c"},
        want_waits={
            "ns/urgent": "needs nvidia.com/gpu 4, free 0 of 8; preempting ns/low-b, ns/low-a"
        },
        want_preemptions=(Preempt("ns/urgent", "c", ("ns/low-b", "ns/low-a")),),
        want_head="ns/urgent",
    ),
    Case(
        id="preemption-picks-cluster-with-fewest-victims",
        preemption=LowestPriorityFirst(),
        pending=(gpu_job("ns/urgent", 4, priority=5),),
        clusters=(
            with_running(
                gpu_cluster("east"),
                running("ns/e1", usage={"east-n1": res(gpu=2)}),
                running("ns/e2", usage={"east-n1": res(gpu=2)}),
            ),
            with_running(gpu_cluster("west"), running("ns/w1", usage={"west-n1": res(gpu=4)})),
        ),
        want_waits={
            "ns/urgent": "no cluster fits: east: needs nvidia.com/gpu 4, free 0 of 4; "
            "west: needs nvidia.com/gpu 4, free 0 of 4; preempting ns/w1 in west"
        },
        want_preemptions=(Preempt("ns/urgent", "west", ("ns/w1",)),),
        want_head="ns/urgent",
    ),
    Case(
        id="preemption-off",
        pending=(gpu_job("ns/urgent", 4, priority=5),),
        clusters=(with_running(gpu_cluster("c"), running("ns/low", usage={"c-n1": res(gpu=4)})),),
        want_waits={"ns/urgent": "needs nvidia.com/gpu 4, free 0 of 4"},
        want_head="ns/urgent",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_schedule(case: Case) -> None:
    result = schedule(
        case.pending,
        case.clusters,
        mode=case.mode,
        now=NOW,
        starvation_after=case.starvation_after,
        preemption=case.preemption,
    )
    assert {a.key: a.cluster for a in result.admits} == case.want_admits
    assert {w.key: w.message for w in result.waits} == case.want_waits
    assert result.preemptions == case.want_preemptions
    assert result.head_key == case.want_head
    assert len(result.admits) + len(result.waits) == len(case.pending)


def test_queue_order_key() -> None:
    pending = [
        gpu_job("ns/c", 1, priority=0, created_at=1),
        gpu_job("ns/b", 1, priority=0, created_at=1),
        gpu_job("ns/a", 1, priority=0, created_at=2),
        gpu_job("ns/z", 1, priority=3, created_at=9),
    ]
    assert [w.key for w in sorted(pending, key=queue_order_key)] == [
        "ns/z",
        "ns/b",
        "ns/c",
        "ns/a",
    ]


def test_admit_has_a_placement() -> None:
    """The admission fits per node: best fit puts a pod on the tighter node first."""
    pending = [workload("ns/a", pods(2, gpu=2, name="Job/a"))]
    clusters = [cluster("c", node("n1", gpu=4), node("n2", gpu=2))]
    result = schedule(
        pending,
        clusters,
        mode=BEST,
        now=NOW,
        starvation_after=60,
        preemption=None,
    )
    placement = (
        NodeAssignment(pod_set=0, node="n2", count=1),
        NodeAssignment(pod_set=0, node="n1", count=1),
    )
    assert result.admits == (Admit("ns/a", "c"),)
    assert admitted_placements(result, pending, clusters) == {"ns/a": placement}


class CannedPolicy:
    """A preemption oracle with a fixed answer, to test the cycle's side of the seam."""

    def __init__(self, answer: tuple[str, ...] | None) -> None:
        self.answer = answer
        self.asked: list[tuple[str, str]] = []

    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot, rules: VictimRules | None = None
    ) -> tuple[str, ...] | None:
        self.asked.append((workload.key, cluster.name))
        return self.answer


def test_policy_is_asked_only_for_workloads_that_fit_nowhere() -> None:
    policy = CannedPolicy(("ns/victim",))
    result = schedule(
        [gpu_job("ns/fits", 1, created_at=1), gpu_job("ns/big", 4, created_at=2)],
        [gpu_cluster("east", used=2), gpu_cluster("west", used=3, reachable=False)],
        mode=BEST,
        now=NOW,
        starvation_after=60,
        preemption=policy,
    )
    assert policy.asked == [("ns/big", "east")]
    assert result.preemptions == (Preempt("ns/big", "east", ("ns/victim",)),)


def test_policy_with_no_answer_means_wait() -> None:
    result = schedule(
        [gpu_job("ns/big", 4)],
        [gpu_cluster("c", used=2)],
        mode=STRICT,
        now=NOW,
        starvation_after=60,
        preemption=CannedPolicy(None),
    )
    assert result.preemptions == ()
    assert result.waits[0].message == "needs nvidia.com/gpu 4, free 2 of 4"


def test_policy_is_not_asked_further_once_one_victim_is_enough() -> None:
    # One victim is the fewest there can be, and a tie goes to the first cluster by name.
    policy = CannedPolicy(("ns/victim",))
    result = schedule(
        [gpu_job("ns/big", 4)],
        [gpu_cluster("west", used=3), gpu_cluster("east", used=2)],
        mode=BEST,
        now=NOW,
        starvation_after=60,
        preemption=policy,
    )
    assert policy.asked == [("ns/big", "east")]
    assert result.preemptions == (Preempt("ns/big", "east", ("ns/victim",)),)


def test_policy_is_asked_in_every_cluster_while_a_smaller_answer_may_come() -> None:
    policy = CannedPolicy(("ns/v1", "ns/v2"))
    result = schedule(
        [gpu_job("ns/big", 4)],
        [gpu_cluster("west", used=3), gpu_cluster("east", used=2)],
        mode=BEST,
        now=NOW,
        starvation_after=60,
        preemption=policy,
    )
    assert policy.asked == [("ns/big", "east"), ("ns/big", "west")]
    assert result.preemptions == (Preempt("ns/big", "east", ("ns/v1", "ns/v2")),)


@settings(max_examples=100, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from([1.0, 2.0, 3.5, float(2**60)])),
        min_size=1,
        max_size=12,
    ),
    distinct=st.booleans(),
)
def test_workloads_are_taken_in_queue_order(jobs: list[tuple[int, float]], distinct: bool) -> None:
    """With creation times shared or all distinct, admissions follow `queue_order_key`."""
    pending = [
        gpu_job(f"ns/w{(7 * i) % 13:02d}", 1, priority=p, created_at=t + (i if distinct else 0))
        for i, (p, t) in enumerate(jobs)
    ]
    result = schedule(
        pending,
        [gpu_cluster("c", gpu=64)],
        mode=QueueMode.STRICT_FIFO,
        now=0.0,
        starvation_after=3600.0,
        preemption=None,
    )
    assert [a.key for a in result.admits] == [w.key for w in sorted(pending, key=queue_order_key)]
