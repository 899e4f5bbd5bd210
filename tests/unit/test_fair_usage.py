"""Fair sharing by use over time (`Usage` mode): queues of a cohort, and users within a
BestEffortFIFO queue, served by their decayed use plus what they hold (core/quota/history.py,
core/quota/fairshare.py, core/quota/view.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from dispatcher.core.model import QueueMode, Workload
from dispatcher.core.quota.history import Decayed, UsageHistory
from dispatcher.core.quota.model import Charge, FairSharingMode, QuotaSetup
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import CycleResult, schedule
from tests.unit.builders import cluster, node, pods, workload
from tests.unit.quota_builders import charge, queue, setup

NOW = 10_000_000.0
WEEK = 7 * 86400.0
USAGE = FairSharingMode.USAGE


def job(key: str, cpu: float, queue_name: str, user: str = "", at: float = 0.0) -> Workload:
    made = workload(key, pods(1, cpu=cpu, name=f"Job/{key}"), queue=queue_name, created_at=at)
    return replace(made, user=user)


def used(rate_milli: float, users: Mapping[str, float] | None = None) -> UsageHistory:
    """A history of `rate_milli` held for ever (and each user's), sampled at NOW."""

    def held(rate: float) -> Decayed:
        return Decayed(0.0).advance(NOW, {"cpu": rate}, WEEK)

    return UsageHistory(held(rate_milli), {u: held(r) for u, r in (users or {}).items()})


def run(
    pending: Sequence[Workload],
    quotas: QuotaSetup,
    history: Mapping[str, UsageHistory] | None = None,
    charges: Sequence[Charge] = (),
    cpu: int = 64,
) -> CycleResult:
    return schedule(
        pending,
        [cluster("c", node("n1", cpu=cpu))],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=NOW,
        starvation_after=1e9,
        preemption=None,
        quotas=QuotaView(QuotaTree(quotas), charges, history=history),
    )


def two_teams(**settings: object) -> QuotaSetup:
    """Two teams with nothing of their own borrow a lender's 4 cpu."""
    return setup(
        queue("steady", {"cpu": "0"}, cohort="c"),
        queue("bursty", {"cpu": "0"}, cohort="c"),
        queue("lender", {"cpu": "4"}, cohort="c"),
        fair_sharing=True,
        **settings,  # type: ignore[arg-type]
    )


def admitted(result: CycleResult) -> list[str]:
    return [a.key for a in result.admits]


PENDING = [job(f"ns/s{i}", 1, "steady", at=i) for i in range(4)] + [
    job(f"ns/b{i}", 1, "bursty", at=10 + i) for i in range(4)
]


def test_instant_mode_splits_the_room_whatever_each_used_before() -> None:
    result = run(PENDING, two_teams(), {"steady": used(3000.0)})
    assert sorted(admitted(result)) == ["ns/b0", "ns/b1", "ns/s0", "ns/s1"]


def test_usage_mode_gives_the_room_to_the_team_that_used_less() -> None:
    # steady has held 3.5 of the 4 cpu on average, bursty nothing: bursty's share (what it
    # holds, of 4) stays below steady's (3.5 of 4) until it holds all 4.
    result = run(PENDING, two_teams(fair_mode=USAGE), {"steady": used(3500.0)})
    assert sorted(admitted(result)) == ["ns/b0", "ns/b1", "ns/b2", "ns/b3"]


def test_usage_mode_counts_what_is_held_now_so_one_cycle_interleaves() -> None:
    # Equal histories: the holding decides, and it moves with each admission.
    result = run(PENDING, two_teams(fair_mode=USAGE), {})
    assert sorted(admitted(result)) == ["ns/b0", "ns/b1", "ns/s0", "ns/s1"]


def test_a_heavier_weight_is_entitled_to_more() -> None:
    quotas = setup(
        queue("steady", {"cpu": "0"}, cohort="c", weight=3.0),
        queue("bursty", {"cpu": "0"}, cohort="c"),
        queue("lender", {"cpu": "4"}, cohort="c"),
        fair_sharing=True,
        fair_mode=USAGE,
    )
    result = run(PENDING, quotas, {})
    assert sorted(admitted(result)) == ["ns/b0", "ns/s0", "ns/s1", "ns/s2"]


def users_queue(strategy: QueueMode = QueueMode.BEST_EFFORT_FIFO) -> QuotaSetup:
    return setup(queue("team", {"cpu": "2"}, strategy=strategy), fair_sharing=True, fair_mode=USAGE)


USERS = [job(f"ns/a{i}", 1, "team", user="alice", at=i) for i in range(2)] + [
    job(f"ns/b{i}", 1, "team", user="bob", at=10 + i) for i in range(2)
]


def test_within_a_queue_the_user_who_used_less_goes_first() -> None:
    history = {"team": used(2000.0, {"alice": 2000.0})}
    assert admitted(run(USERS, users_queue(), history)) == ["ns/b0", "ns/b1"]


def test_within_a_queue_what_a_user_holds_counts() -> None:
    holding = [charge("ns/a-old", "team", {"cpu": "1"})]
    holding = [replace(holding[0], user="alice")]
    result = run(
        USERS, replace(users_queue(), queues={"team": queue("team", {"cpu": "3"})}), {}, holding
    )
    # alice holds 1 of 3: bob goes first, then they are even and age decides.
    assert admitted(result)[0] == "ns/b0"


def test_a_strict_fifo_queue_keeps_its_order_whatever_its_users_used() -> None:
    history = {"team": used(2000.0, {"alice": 2000.0})}
    result = run(USERS, users_queue(QueueMode.STRICT_FIFO), history)
    assert admitted(result) == ["ns/a0", "ns/a1"]


def test_instant_mode_ignores_users() -> None:
    history = {"team": used(2000.0, {"alice": 2000.0})}
    quotas = replace(users_queue(), fair_mode=FairSharingMode.INSTANT)
    assert admitted(run(USERS, quotas, history)) == ["ns/a0", "ns/a1"]
