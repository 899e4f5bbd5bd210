"""The quota scenario of the core benchmark, small: it holds what it says, and a cycle
over it admits by flavor, borrows and reports quota waits."""

from __future__ import annotations

import pytest

from benchmarks.core_bench import GPU_FLAVOR, ON_DEMAND, SPOT, build_scenario, run_cycle
from benchmarks.quota_bench import (
    QuotaScenario,
    build_quota_scenario,
    quota_cycles,
    quota_summary,
)
from dispatcher.core.model import QueueMode
from dispatcher.core.quota.model import Selector
from dispatcher.core.quota.resolve import Queued
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView


@pytest.fixture(scope="module")
def scenario() -> QuotaScenario:
    return build_quota_scenario(600, 60, 3)


def test_the_scenario_has_the_queues_cohorts_and_levels_it_claims(
    scenario: QuotaScenario,
) -> None:
    summary = quota_summary(scenario)
    assert summary["queues"] == 100
    assert summary["cohorts"] == 14  # 10 leaf cohorts, 3 middle ones, 1 root
    assert summary["cohort_levels"] == 3
    assert summary["inactive_queues"] == 0
    assert summary["borrowing_queues"] > 0
    assert summary["cohorts_with_quotas"] > 0
    assert summary["queue_quotas_with_borrowing_limit"] > 0
    assert summary["queue_quotas_with_lending_limit"] > 0
    assert 0 < summary["queues_with_two_flavors"] < 100
    assert summary["charges"] == len(scenario.charges) > 0


def test_the_clusters_are_those_of_the_scenario_without_quotas(scenario: QuotaScenario) -> None:
    assert scenario.clusters == build_scenario(0, 60, 3).clusters


def test_every_flavor_selects_nodes_in_every_cluster(scenario: QuotaScenario) -> None:
    assert set(scenario.setup.flavors) == {ON_DEMAND, SPOT, GPU_FLAVOR}
    for flavor in scenario.setup.flavors.values():
        for cluster in scenario.clusters:
            assert any(Selector(flavor.node_labels).matches(n.labels) for n in cluster.nodes)


def test_every_pending_workload_resolves_to_a_queue(scenario: QuotaScenario) -> None:
    view = QuotaView(QuotaTree(scenario.setup), scenario.charges)
    resolved = [view.resolve(w) for w in scenario.pending]
    assert all(isinstance(r, Queued) for r in resolved)
    assert len({r.queue for r in resolved if isinstance(r, Queued)}) > 50
    assert any(not w.queue_name for w in scenario.pending)  # the namespace's default


@pytest.mark.parametrize("fair", [False, True])
def test_a_cycle_admits_in_both_flavors_and_quota_keeps_some_out(
    scenario: QuotaScenario, fair: bool
) -> None:
    mode = QueueMode.BEST_EFFORT_FIFO
    tree = QuotaTree(scenario.setup_for(mode, fair=fair))
    assert tree.setup.fair_sharing is fair
    result = run_cycle(scenario, mode, "none", tree, scenario.charges)
    assert len(result.admits) + len(result.waits) == len(scenario.pending)
    flavors = {a.assignment.flavors[0][0] for a in result.admits if a.assignment}
    assert {ON_DEMAND, SPOT} <= flavors
    assert any(w.message.startswith("queue ") for w in result.waits)


def test_setup_for_sets_every_queue_s_strategy(scenario: QuotaScenario) -> None:
    setup = scenario.setup_for(QueueMode.STRICT_FIFO, fair=True)
    assert setup.fair_sharing
    assert {q.strategy for q in setup.queues.values()} == {QueueMode.STRICT_FIFO}
    assert scenario.setup.queues.keys() == setup.queues.keys()


def test_quota_cycles_measure_each_mode_with_and_without_quotas(
    scenario: QuotaScenario, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = quota_cycles(scenario, preemptions=("none",), runs=1)
    assert [(f.cycle.mode, f.quotas) for f in figures] == [
        (mode, quotas)
        for mode in ("StrictFIFO", "BestEffortFIFO")
        for quotas in ("none", "quotas", "fair sharing")
    ]
    assert all(f.view_ms > 0 for f in figures if f.quotas != "none")
    assert all(f.as_json()["max_ms"] >= f.as_json()["median_ms"] for f in figures)
    assert len(capsys.readouterr().out.splitlines()) == len(figures)
