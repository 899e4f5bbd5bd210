"""Per-user limits in a cluster queue (`userLimits`): read from the object, and held to in a
cycle, the user being the signed creator record's (core/quota/view.py `user_refusal`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.queues import ClusterAppQueue
from dispatcher.core.model import QueueMode, Workload
from dispatcher.core.quota.model import Charge, QuotaSetup, UserLimit
from dispatcher.core.quota.read import queue_of
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import CycleResult, schedule
from tests.unit.builders import cluster, node, pods, workload
from tests.unit.quota_builders import charge, queue, setup

NOW = 1000.0


def job(key: str, cpu: float, user: str, at: float = 0.0) -> Workload:
    made = workload(key, pods(1, cpu=cpu, name=f"Job/{key}"), queue="team", created_at=at)
    return replace(made, user=user)


def held(key: str, cpu: str, user: str) -> Charge:
    return replace(charge(key, "team", {"cpu": cpu}), user=user)


def team(limit: UserLimit, strategy: QueueMode = QueueMode.BEST_EFFORT_FIFO) -> QuotaSetup:
    return setup(queue("team", {"cpu": "16"}, user_limit=limit, strategy=strategy))


def run(
    pending: Sequence[Workload], quotas: QuotaSetup, charges: Sequence[Charge] = ()
) -> CycleResult:
    return schedule(
        pending,
        [cluster("c", node("n1", cpu=64))],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=NOW,
        starvation_after=1e9,
        preemption=None,
        quotas=QuotaView(QuotaTree(quotas), charges),
    )


def admitted(result: CycleResult) -> list[str]:
    return [a.key for a in result.admits]


def waits(result: CycleResult) -> dict[str, str]:
    return {w.key: w.message for w in result.waits}


FLOOD = [job(f"ns/a{i}", 1, "alice", at=i) for i in range(5)] + [job("ns/b0", 1, "bob", at=10)]


def test_a_user_at_the_running_limit_waits_and_another_user_is_admitted() -> None:
    result = run(FLOOD, team(UserLimit(max_running=2)), [held("ns/a-old", "1", "alice")])
    assert admitted(result) == ["ns/a0", "ns/b0"]
    assert waits(result)["ns/a1"] == (
        "queue team: user alice has 2 admitted, its per-user limit (userLimits.maxRunning 2)"
    )


def test_a_user_over_the_resource_limit_waits() -> None:
    result = run(FLOOD, team(UserLimit(max_resources={"cpu": 3000})))
    assert admitted(result) == ["ns/a0", "ns/a1", "ns/a2", "ns/b0"]
    assert waits(result)["ns/a3"] == (
        "queue team: user alice would hold cpu 4, over its per-user limit"
        " (userLimits.maxResources 3)"
    )


def test_in_a_strict_fifo_queue_a_user_at_the_limit_does_not_hold_up_others() -> None:
    quotas = team(UserLimit(max_running=1), QueueMode.STRICT_FIFO)
    assert admitted(run(FLOOD, quotas)) == ["ns/a0", "ns/b0"]


def test_work_with_no_signed_record_counts_as_one_user() -> None:
    anonymous = [job(f"ns/x{i}", 1, "", at=i) for i in range(3)]
    result = run(anonymous, team(UserLimit(max_running=2)))
    assert admitted(result) == ["ns/x0", "ns/x1"]
    assert "work with no signed creator record has 2 admitted" in waits(result)["ns/x2"]


def test_without_a_limit_nothing_changes() -> None:
    assert len(admitted(run(FLOOD, setup(queue("team", {"cpu": "16"}))))) == 6


@pytest.mark.parametrize(
    ("spec", "want", "problem"),
    [
        ({"userLimits": {"maxRunning": 3}}, UserLimit(3, {}), ""),
        (
            {"userLimits": {"maxResources": {"cpu": "500m", "nvidia.com/gpu": 4}}},
            UserLimit(None, {"cpu": 500, "nvidia.com/gpu": 4000}),
            "",
        ),
        ({"userLimits": {"maxResources": {"cpu": "lots"}}}, UserLimit(None, {}), "lots"),
        ({}, None, ""),
    ],
)
def test_the_limit_is_read_from_the_queue(
    spec: dict[str, object], want: UserLimit | None, problem: str
) -> None:
    model = ClusterAppQueue.model_validate(
        {"metadata": {"name": "team"}, "spec": {"namespaceSelector": {}, **spec}}
    )
    read = queue_of(model)
    assert read.user_limit == want
    assert any(problem in p for p in read.problems) if problem else not read.problems


users = st.sampled_from(["alice", "bob", "", "carol"])
jobs = st.lists(st.tuples(users, st.integers(1, 4)), max_size=25)
helds = st.lists(st.tuples(users, st.integers(1, 4)), max_size=6)


@given(jobs, helds, st.integers(1, 4), st.integers(1, 12), st.booleans())
def test_no_user_ever_holds_more_than_its_limit(
    pending: list[tuple[str, int]],
    before: list[tuple[str, int]],
    most: int,
    most_cpu: int,
    strict: bool,
) -> None:
    limit = UserLimit(max_running=most, max_resources={"cpu": most_cpu * 1000})
    strategy = QueueMode.STRICT_FIFO if strict else QueueMode.BEST_EFFORT_FIFO
    quotas = setup(queue("team", {"cpu": "64"}, user_limit=limit, strategy=strategy))
    charges = [held(f"ns/h{i}", str(cpu), user) for i, (user, cpu) in enumerate(before)]
    work = [job(f"ns/w{i}", cpu, user, at=i) for i, (user, cpu) in enumerate(pending)]
    result = run(work, quotas, charges)
    by_key = {w.key: w for w in work}
    for user in {u for u, _ in pending}:
        count = sum(1 for u, _ in before if u == user)
        cpu = sum(c for u, c in before if u == user)
        new = [by_key[a.key] for a in result.admits if by_key[a.key].user == user]
        if new:  # admitted only while within the limit, counting what it held
            assert count + len(new) <= most
            assert cpu + sum(w.pod_sets[0].requests["cpu"] / 1000 for w in new) <= most_cpu


def test_a_group_at_its_limit_holds_its_users_and_not_others() -> None:
    ml = UserLimit(max_running=2)
    quotas = setup(queue("team", {"cpu": "16"}, group_limits={"ml": ml}))
    work = [
        replace(job("ns/a0", 1, "alice", at=0), groups=("ml",)),
        replace(job("ns/b0", 1, "bob", at=1), groups=("ml", "other")),
        replace(job("ns/a1", 1, "alice", at=2), groups=("ml",)),
        replace(job("ns/c0", 1, "carol", at=3), groups=("other",)),
    ]
    result = run(work, quotas)
    assert admitted(result) == ["ns/a0", "ns/b0", "ns/c0"]
    assert waits(result)["ns/a1"] == (
        "queue team: group ml has 2 admitted, its limit (groupLimits[ml].maxRunning 2)"
    )


def test_group_limits_are_read_and_a_group_named_twice_is_a_problem() -> None:
    spec = {
        "groupLimits": [
            {"group": "ml", "maxRunning": 2, "maxResources": {"nvidia.com/gpu": 8}},
            {"group": "ml", "maxRunning": 9},
        ]
    }
    model = ClusterAppQueue.model_validate(
        {"metadata": {"name": "team"}, "spec": {"namespaceSelector": {}, **spec}}
    )
    read = queue_of(model)
    assert read.group_limits == {"ml": UserLimit(2, {"nvidia.com/gpu": 8000})}
    assert read.problems == ("groupLimits: group ml is named twice",)
