"""The side-by-side benchmark, small: both paths decide the first cycle alike (checked
inside `compare`), and the kept path's steady cycles decide only what events woke."""

from __future__ import annotations

from benchmarks.queues_bench import compare
from benchmarks.quota_bench import build_quota_scenario
from dispatcher.controller.scheduling.scheduler import DECISIONS_PER_CYCLE
from dispatcher.core.model import QueueMode


def test_a_row_measures_both_paths_and_the_kept_one_decides_less() -> None:
    scenario = build_quota_scenario(400, 30, 3)
    row = compare(scenario, QueueMode.BEST_EFFORT_FIFO, "quotas", "none", 1)
    assert row["pending"] == 400
    assert row["first_admits"] > 0
    kept, heads = row["kept"], row["kept_heads"]
    assert len(kept["steady_active"]) == len(heads["steady_active"]) == 5
    assert max(kept["steady_active"]) < 400 - row["first_admits"]
    assert max(heads["steady_active"]) <= 100  # one per queue at most
    assert max(row["kept_limited"]["steady_active"]) <= DECISIONS_PER_CYCLE
    assert kept["fill_ms"] >= 0
    assert row["full_steady_cpu_ms"] > 0
