"""The scheduling cycle with quotas: quota fit and capacity fit together, flavors,
queueing strategies per queue, preemption within a queue and reclaim within a cohort."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dispatcher.core.model import ClusterSnapshot, QueueMode, Workload
from dispatcher.core.quota.model import Charge, QuotaSetup, Reclaim, WithinQueue
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import CycleResult, LowestPriorityFirst, schedule
from tests.unit.builders import cluster, node, pods, res, running, with_running, workload
from tests.unit.quota_builders import charge, flavor, queue, setup

NOW = 10_000.0


def job(key: str, cpu: float, queue_name: str, **kwargs: object) -> Workload:
    return workload(key, pods(1, cpu=cpu, name=f"Job/{key}"), queue=queue_name, **kwargs)  # type: ignore[arg-type]


def run(
    pending: Sequence[Workload],
    clusters: Sequence[ClusterSnapshot],
    quotas: QuotaSetup,
    charges: Sequence[Charge] = (),
    *,
    preempt: bool = False,
    mode: QueueMode = QueueMode.BEST_EFFORT_FIFO,
) -> CycleResult:
    return schedule(
        pending,
        clusters,
        mode=mode,
        now=NOW,
        starvation_after=1e9,
        preemption=LowestPriorityFirst() if preempt else None,
        quotas=QuotaView(QuotaTree(quotas), charges),
    )


def big() -> ClusterSnapshot:
    return cluster("c", node("n1", cpu=64))


def waits(result: CycleResult) -> dict[str, str]:
    return {w.key: w.message for w in result.waits}


def test_quota_caps_admissions_although_the_cluster_has_room() -> None:
    result = run(
        [job(f"ns/j{i}", 1, "team", created_at=i) for i in range(3)],
        [big()],
        setup(queue("team", {"cpu": "2"})),
    )
    assert [a.key for a in result.admits] == ["ns/j0", "ns/j1"]
    assert all(a.queue == "team" and a.local == "ns/team" for a in result.admits)
    assert waits(result) == {
        "ns/j2": "queue team: needs cpu 1; nominal 2, in use 2, cohort can lend 0"
    }
    assert result.heads == {"ns/j2"}


def test_with_no_queues_the_cycle_decides_as_without_quotas() -> None:
    pending = [job(f"ns/j{i}", 20, "", created_at=i) for i in range(5)]
    without = schedule(
        pending,
        [big()],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=NOW,
        starvation_after=1e9,
        preemption=None,
    )
    assert run(pending, [big()], QuotaSetup()).admits == without.admits
    assert len(without.admits) == 3


def test_an_appwrapper_without_a_queue_is_admitted_on_capacity_alone_unless_required() -> None:
    pending = [job("ns/free", 10, "")]
    assert [a.key for a in run(pending, [big()], setup(queue("other", {"cpu": "1"}))).admits] == [
        "ns/free"
    ]
    required = setup(queue("other", {"cpu": "1"}), queue_required=True)
    assert "no queue" in waits(run(pending, [big()], required))["ns/free"]


def test_strict_fifo_blocks_only_its_own_queue() -> None:
    quotas = setup(
        queue("a", {"cpu": "100"}, strategy=QueueMode.STRICT_FIFO), queue("b", {"cpu": "100"})
    )
    pending = [
        job("ns/a-big", 40, "a", created_at=1),  # fits the queue, not the 8-cpu cluster now
        job("ns/a-small", 1, "a", created_at=2),
        job("ns/b-small", 1, "b", created_at=3),
    ]
    small = cluster("c", node("n1", cpu=8), node("n2", cpu=48, used=res(cpu=40)))
    result = run(pending, [small], quotas)
    assert [a.key for a in result.admits] == ["ns/b-small"]
    assert waits(result)["ns/a-small"] == "waiting behind ns/a-big (head of queue a)"


def test_flavors_fill_on_demand_then_spot_and_the_pods_select_the_flavors_nodes() -> None:
    quotas = setup(
        queue("team", flavors={"on-demand": {"cpu": "4"}, "spot": {"cpu": "8"}}),
        flavors=[flavor("on-demand", {"tier": "on-demand"}), flavor("spot", {"tier": "spot"})],
    )
    nodes = cluster(
        "c",
        node("od", cpu=4, labels={"tier": "on-demand"}),
        node("sp", cpu=8, labels={"tier": "spot"}),
    )
    result = run([job(f"ns/j{i}", 1, "team", created_at=i) for i in range(6)], [nodes], quotas)
    chosen = {a.key: a.assignment.flavors[0][0] for a in result.admits if a.assignment}
    assert chosen == {f"ns/j{i}": "on-demand" if i < 4 else "spot" for i in range(6)}


def test_a_flavor_whose_nodes_are_full_gives_way_to_the_next() -> None:
    quotas = setup(
        queue("team", flavors={"on-demand": {"cpu": "4"}, "spot": {"cpu": "8"}}),
        flavors=[flavor("on-demand", {"tier": "on-demand"}), flavor("spot", {"tier": "spot"})],
    )
    nodes = cluster(
        "c",
        node("od", cpu=4, used=res(cpu=4), labels={"tier": "on-demand"}),  # someone else's pods
        node("sp", cpu=8, labels={"tier": "spot"}),
    )
    result = run([job("ns/j", 1, "team")], [nodes], quotas)
    assert [a.assignment.flavors[0][0] for a in result.admits if a.assignment] == ["spot"]


def _running(key: str, cpu: float, priority: int, at: float) -> object:
    return running(key, priority=priority, dispatched_at=at, usage={"n1": res(cpu=cpu)})


def test_prod_preempts_dev_within_its_queue() -> None:
    quotas = setup(queue("team", {"cpu": "2"}, within=WithinQueue.LOWER_PRIORITY))
    dev = _running("ns/dev", 2, 100, 1)
    snapshot = with_running(big(), dev)  # type: ignore[arg-type]
    result = run(
        [job("ns/prod", 2, "team", priority=1000)],
        [snapshot],
        quotas,
        [charge("ns/dev", "team", {"cpu": "2"}, priority=100)],
        preempt=True,
    )
    assert not result.admits
    assert [p.victims for p in result.preemptions] == [("ns/dev",)]
    assert waits(result)["ns/prod"].startswith("queue team: needs cpu 2")


def test_within_never_preempts_nothing_for_quota() -> None:
    quotas = setup(queue("team", {"cpu": "2"}))  # withinClusterQueue: Never
    dev = _running("ns/dev", 2, 100, 1)
    result = run(
        [job("ns/prod", 2, "team", priority=1000)],
        [with_running(big(), dev)],  # type: ignore[arg-type]
        quotas,
        [charge("ns/dev", "team", {"cpu": "2"}, priority=100)],
        preempt=True,
    )
    assert not result.preemptions
    assert "nominal 2, in use 2" in waits(result)["ns/prod"]


def _teams(reclaim: Reclaim) -> QuotaSetup:
    return setup(
        queue("a", {"cpu": "4"}, cohort="c", reclaim=reclaim),
        queue("b", {"cpu": "4"}, cohort="c"),
    )


def test_reclaim_takes_back_only_what_the_borrower_borrowed() -> None:
    b_work = [_running(f"ns/b{i}", 2, 0, float(i)) for i in range(3)]  # b uses 6: borrows 2
    charges = [charge(f"ns/b{i}", "b", {"cpu": "2"}, admitted_at=float(i)) for i in range(3)]
    snapshot = with_running(cluster("c", node("n1", cpu=8)), *b_work)  # type: ignore[arg-type]
    result = run(
        [job("ns/a", 4, "a", priority=0)], [snapshot], _teams(Reclaim.ANY), charges, preempt=True
    )
    # b at 4 after one eviction is within its nominal quota: never a second victim.
    assert [p.victims for p in result.preemptions] == [("ns/b2",)]


def test_reclaim_never_leaves_the_borrowers_work_alone() -> None:
    b_work = [_running(f"ns/b{i}", 2, 0, float(i)) for i in range(3)]
    charges = [charge(f"ns/b{i}", "b", {"cpu": "2"}, admitted_at=float(i)) for i in range(3)]
    snapshot = with_running(cluster("c", node("n1", cpu=8)), *b_work)  # type: ignore[arg-type]
    result = run(
        [job("ns/a", 4, "a", priority=0)], [snapshot], _teams(Reclaim.NEVER), charges, preempt=True
    )
    assert not result.preemptions


def test_a_borrower_never_preempts_a_queue_within_its_nominal_quota() -> None:
    # a borrows already (uses 6 of its 4); b uses its 4 within nominal. a wants 2 more.
    work = [_running("ns/a0", 6, 0, 1.0), _running("ns/b0", 4, 0, 2.0)]
    charges = [charge("ns/a0", "a", {"cpu": "6"}), charge("ns/b0", "b", {"cpu": "4"})]
    quotas = setup(
        queue("a", {"cpu": ("4", None, None)}, cohort="c", reclaim=Reclaim.ANY),
        queue("b", {"cpu": "8"}, cohort="c"),
    )
    snapshot = with_running(cluster("c", node("n1", cpu=10)), *work)  # type: ignore[arg-type]
    result = run([job("ns/a1", 2, "a", priority=1000)], [snapshot], quotas, charges, preempt=True)
    assert not result.preemptions


def test_fair_sharing_admits_the_queue_with_the_lower_weighted_share_first() -> None:
    # Nothing of their own: all either takes is borrowed from the cohort's 6 cpu.
    quotas = setup(
        queue("light", {"cpu": "0"}, cohort="c", weight=1.0),
        queue("heavy", {"cpu": "0"}, cohort="c", weight=2.0),
        queue("lender", {"cpu": "6"}, cohort="c"),
        fair_sharing=True,
    )
    pending = [job(f"ns/l{i}", 1, "light", created_at=i) for i in range(6)] + [
        job(f"ns/h{i}", 1, "heavy", created_at=10 + i) for i in range(6)
    ]
    result = run(pending, [big()], quotas)
    admitted = [a.key for a in result.admits]
    # weight 2 is entitled to twice the share: 4 of the 6 to heavy, 2 to light.
    assert sum(k.startswith("ns/h") for k in admitted) == 4
    assert sum(k.startswith("ns/l") for k in admitted) == 2


def test_fair_sharing_reclaims_from_the_queue_above_its_share_whatever_the_priorities() -> None:
    # Two queues with nothing of their own share a lender's 4 cpu; heavy holds all 4 at a
    # high priority. Fair sharing gives light its share back (2 each at equal weights).
    quotas = setup(
        queue("light", {"cpu": "0"}, cohort="c", reclaim=Reclaim.LOWER_PRIORITY),
        queue("heavy", {"cpu": "0"}, cohort="c"),
        queue("lender", {"cpu": "4"}, cohort="c"),
        fair_sharing=True,
    )
    held = [_running(f"ns/h{i}", 1, 1000, float(i)) for i in range(4)]
    charges = [charge(f"ns/h{i}", "heavy", {"cpu": "1"}, priority=1000) for i in range(4)]
    snapshot = with_running(big(), *held)  # type: ignore[arg-type]
    result = run([job("ns/l0", 2, "light")], [snapshot], quotas, charges, preempt=True)
    # heavy keeps 2 (a share equal to light's once admitted), never fewer.
    assert [len(p.victims) for p in result.preemptions] == [2]
    without_fairness = replace(quotas, fair_sharing=False)
    result = run([job("ns/l0", 2, "light")], [snapshot], without_fairness, charges, preempt=True)
    assert not result.preemptions  # by priority, 0 may not evict 1000


def test_a_flavor_that_matches_no_node_is_named_in_the_wait() -> None:
    quotas = setup(
        queue("team", flavors={"a100": {"cpu": "4"}}), flavors=[flavor("a100", {"gpu": "a100"})]
    )
    result = run([job("ns/j", 1, "team")], [big()], quotas)
    assert not result.admits
    assert waits(result)["ns/j"] == (
        "no schedulable node matches pod Job/ns/j (nodeSelector/taints) (in flavor a100)"
    )
