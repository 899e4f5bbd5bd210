"""What an AppWrapper's own messages say of other AppWrappers (core.mentions): a name of its
own namespace, never one of another (a tenant reads her AppWrapper's conditions and Events
with `kubectl describe`).

Tables over each message builder (the helpers, the cycle's wait messages, the victim's and
the preemptor's eviction messages), and a property over whole cycles: no message made for an
AppWrapper of one namespace contains the name of an AppWrapper of another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.models import Reason
from dispatcher.core.mentions import KEY, OTHER, for_reader, mention, mention_all
from dispatcher.core.model import ClusterSnapshot, QueueMode, Workload
from dispatcher.core.quota.model import Charge, LocalQueue
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import LowestPriorityFirst, schedule
from dispatcher.core.scheduling.preemption import evicting, why_evicted
from dispatcher.core.waiting import own_terms
from tests.unit.builders import cluster, node, pods, res, running, with_running, workload
from tests.unit.quota_builders import queue, setup

NOW = 10_000.0
STRICT, BEST = QueueMode.STRICT_FIFO, QueueMode.BEST_EFFORT_FIFO


def test_one_phrase_for_what_a_user_may_not_see() -> None:
    assert OTHER == OTHER == "another namespace's AppWrapper"


@pytest.mark.parametrize(
    ("key", "to", "uid", "want"),
    [
        pytest.param("team-a/x", "team-a/y", "", "team-a/x", id="same-namespace-named"),
        pytest.param("team-a/x", "team-a", "", "team-a/x", id="to-a-namespace"),
        pytest.param("team-b/x", "team-a/y", "", OTHER, id="other-namespace-hidden"),
        pytest.param("team-b/x", "team-a/y", "u-1", f"{OTHER} (UID: u-1)", id="uid-given"),
        pytest.param("team-a/x", "team-a/y", "u-1", "team-a/x", id="no-uid-when-named"),
        pytest.param("team/x", "team-a/y", "", OTHER, id="a-prefix-is-no-namespace"),
    ],
)
def test_mention(key: str, to: str, uid: str, want: str) -> None:
    assert mention(key, to=to, uid=uid) == want


@pytest.mark.parametrize(
    ("keys", "want"),
    [
        pytest.param(("a/x",), "a/x", id="one-own"),
        pytest.param(("a/x", "a/y"), "a/x, a/y", id="own-listed"),
        pytest.param(("b/x",), OTHER, id="one-other"),
        pytest.param(("b/x", "c/y"), "2 AppWrappers of other namespaces", id="others-counted"),
        pytest.param(("b/x", "a/x"), f"a/x and {OTHER}", id="own-then-other"),
        pytest.param(
            ("a/x", "b/x", "a/y", "b/y", "c/z"),
            "a/x, a/y and 3 AppWrappers of other namespaces",
            id="mixed",
        ),
    ],
)
def test_mention_all(keys: tuple[str, ...], want: str) -> None:
    assert mention_all(keys, to="a/me") == want


def test_a_shared_text_hides_only_the_appwrappers_it_names() -> None:
    text = "needs acme/widget 1; c1: held for b/x, which is preempting; c2: held for a/y"
    assert for_reader(text, to="a/me", named={"b/x", "a/y"}) == (
        f"needs acme/widget 1; c1: held for {OTHER}, which is preempting; c2: held for a/y"
    )


def charged(queue: str, priority: int) -> Charge:
    """A victim's charge to `queue` at `priority` (what the eviction message reads of it)."""
    return Charge("victim", queue, {}, priority)


@dataclass(frozen=True)
class Evicted:
    id: str
    victim: str
    charged: Charge | None
    queue: str
    want_reason: Reason
    want: str


EVICTED = [
    Evicted(
        "priority-same-namespace",
        "team-a/low",
        None,
        "",
        Reason.PREEMPTED_BY_HIGHER_PRIORITY,
        "preempted by team-a/prod, priority 1000",
    ),
    Evicted(
        "priority-other-namespace",
        "team-b/low",
        None,
        "",
        Reason.PREEMPTED_BY_HIGHER_PRIORITY,
        f"preempted by {OTHER} (UID: u-prod), priority 1000",
    ),
    Evicted(
        "within-queue-other-namespace",
        "team-b/low",
        charged("shared", 1000),
        "shared",
        Reason.PREEMPTED_WITHIN_QUEUE,
        f"preempted by {OTHER} (UID: u-prod), priority 1000, within cluster queue shared"
        " (admitted later at the same priority)",
    ),
    Evicted(
        "reclaim-other-namespace",
        "team-b/borrower",
        charged("b", 0),
        "a",
        Reason.RECLAIMED_WITHIN_COHORT,
        f"reclaimed by {OTHER} (UID: u-prod) for cluster queue a: cluster queue b was"
        " borrowing from the cohort",
    ),
    Evicted(
        "reclaim-same-namespace",
        "team-a/borrower",
        charged("b", 0),
        "a",
        Reason.RECLAIMED_WITHIN_COHORT,
        "reclaimed by team-a/prod for cluster queue a: cluster queue b was borrowing from the"
        " cohort",
    ),
]


@pytest.mark.parametrize("case", EVICTED, ids=lambda c: c.id)
def test_the_victim_is_told_who_preempted_it_only_within_its_namespace(case: Evicted) -> None:
    reason, message = why_evicted(
        case.victim,
        case.charged,
        preemptor="team-a/prod",
        preemptor_uid="u-prod",
        priority=1000,
        queue=case.queue,
    )
    assert (reason, message) == (case.want_reason, case.want)


def test_the_preemptor_is_told_how_many_victims_of_other_namespaces() -> None:
    victims = ("team-b/v1", "team-a/v2", "team-c/v3")
    assert evicting("team-a/prod", victims, "east") == (
        "evicting team-a/v2 and 2 AppWrappers of other namespaces in cluster east"
    )
    assert evicting("team-b/prod", ("team-b/v1",), "east") == "evicting team-b/v1 in cluster east"


# -- the cycle's wait messages ------------------------------------------------------------


def gpu(key: str, count: int, *, priority: int = 0, created_at: float = 0.0) -> Workload:
    return workload(key, pods(1, gpu=count, name=f"Job/{key}"), priority=priority,
                    created_at=created_at)  # fmt: skip


def full(*owners: tuple[str, int]) -> ClusterSnapshot:
    """One 8-GPU node taken by `owners` (key, priority), 8 / len(owners) GPUs each."""
    share = 8 // len(owners)
    return with_running(
        cluster("c", node("n1", gpu=8)),
        *(
            running(key, priority=p, dispatched_at=i, usage={"n1": res(gpu=share)})
            for i, (key, p) in enumerate(owners)
        ),
    )


def half(key: str, priority: int) -> ClusterSnapshot:
    """One 8-GPU node, 4 of them taken by `key`: room for small ones, not for 8."""
    return with_running(
        cluster("c", node("n1", gpu=8)),
        running(key, priority=priority, usage={"n1": res(gpu=4)}),
    )


@dataclass(frozen=True)
class CycleCase:
    id: str
    pending: list[Workload]
    clusters: list[ClusterSnapshot]
    mode: QueueMode
    want: dict[str, str]
    starvation_after: float = 1e9
    preempt: bool = True


CYCLES = [
    CycleCase(
        "victim-of-another-namespace",
        [gpu("team-a/prod", 8, priority=10)],
        [full(("team-b/v1", 0))],
        BEST,
        {"team-a/prod": f"; preempting {OTHER}"},
    ),
    CycleCase(
        "victims-counted-own-named",
        [gpu("team-a/prod", 8, priority=10)],
        [full(("team-b/v1", 0), ("team-a/v2", 0), ("team-c/v3", 0), ("team-c/v4", 0))],
        BEST,
        {"team-a/prod": "; preempting team-a/v2 and 3 AppWrappers of other namespaces"},
    ),
    CycleCase(
        "held-for-a-preemptor-of-another-namespace",
        [gpu("team-b/prod", 8, priority=10, created_at=1), gpu("team-a/small", 1, created_at=2)],
        [half("team-c/v1", 0)],
        BEST,
        {"team-a/small": f"held for {OTHER}, which is preempting"},
    ),
    CycleCase(
        "held-for-a-preemptor-of-the-same-namespace",
        [gpu("team-a/prod", 8, priority=10, created_at=1), gpu("team-a/small", 1, created_at=2)],
        [half("team-c/v1", 0)],
        BEST,
        {"team-a/small": "held for team-a/prod, which is preempting"},
    ),
    CycleCase(
        "starving-head-of-another-namespace",
        [gpu("team-b/big", 8, created_at=1), gpu("team-a/small", 1, created_at=2)],
        [half("team-c/v1", 5)],
        BEST,
        {"team-a/small": f"held for {OTHER}, queued longer than 60s (starvation guard)"},
        starvation_after=60,
        preempt=False,
    ),
    CycleCase(
        "strict-head-of-another-namespace",
        [gpu("team-b/big", 8, created_at=1), gpu("team-a/small", 1, created_at=2)],
        [full(("team-c/v1", 5), ("team-c/v2", 5))],
        STRICT,
        {"team-a/small": f"waiting behind {OTHER} (head of line)"},
        preempt=False,
    ),
    CycleCase(
        "strict-head-of-the-same-namespace",
        [gpu("team-a/big", 8, created_at=1), gpu("team-a/small", 1, created_at=2)],
        [full(("team-c/v1", 5), ("team-c/v2", 5))],
        STRICT,
        {"team-a/small": "waiting behind team-a/big (head of line)"},
        preempt=False,
    ),
]


@pytest.mark.parametrize("case", CYCLES, ids=lambda c: c.id)
def test_wait_messages_name_no_appwrapper_of_another_namespace(case: CycleCase) -> None:
    result = schedule(
        case.pending,
        case.clusters,
        mode=case.mode,
        now=NOW,
        starvation_after=case.starvation_after,
        preemption=LowestPriorityFirst() if case.preempt else None,
    )
    said = {w.key: w.message for w in result.waits}
    for key, want in case.want.items():
        assert want in said[key]


def test_a_strict_queue_head_of_another_namespace_is_not_named() -> None:
    quotas = setup(queue("shared", {"nvidia.com/gpu": "100"}, strategy=STRICT))
    quotas = replace(
        quotas,
        local_queues={
            **quotas.local_queues,
            ("team-a", "shared"): LocalQueue("team-a", "shared", "shared"),
            ("team-b", "shared"): LocalQueue("team-b", "shared", "shared"),
        },
    )
    big = workload("team-b/big", pods(1, gpu=8), queue="shared", created_at=1)
    small = workload("team-a/small", pods(1, gpu=1), queue="shared", created_at=2)
    mine = workload("team-b/mine", pods(1, gpu=1), queue="shared", created_at=3)
    result = schedule(
        [big, small, mine],
        [full(("team-c/v1", 5), ("team-c/v2", 5))],
        mode=BEST,
        now=NOW,
        starvation_after=1e9,
        preemption=None,
        quotas=QuotaView(QuotaTree(quotas), ()),
    )
    said = {w.key: w.message for w in result.waits}
    assert said["team-a/small"] == f"waiting behind {OTHER} (head of queue shared)"
    assert said["team-b/mine"] == "waiting behind team-b/big (head of queue shared)"


@pytest.mark.parametrize(
    ("message", "want"),
    [
        (f"held for {OTHER}, which is preempting",
         "room held for an AppWrapper ahead of it that is preempting"),
        (f"held for {OTHER}, queued longer than 60s (starvation guard)",
         "room held for an AppWrapper ahead of it, queued longer than 60s (starvation guard)"),
        (f"waiting behind {OTHER} (head of line)", "waiting behind the head of line"),
        (f"waiting behind {OTHER} (head of queue q)", "waiting behind the head of queue q"),
    ],
)  # fmt: skip
def test_own_terms_reads_the_new_words_as_the_old(message: str, want: str) -> None:
    assert own_terms(message) == want


# -- the property ---------------------------------------------------------------------------

NAMESPACES = ("team-a", "team-b", "team-c")


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Workload], list[ClusterSnapshot], QueueMode, float]:
    """Pending and running AppWrappers of several namespaces on one or two small clusters."""
    snapshots = []
    for c in range(draw(st.integers(1, 2))):
        owners = [
            (f"{draw(st.sampled_from(NAMESPACES))}/run-{c}-{i}", draw(st.integers(0, 3)))
            for i in range(draw(st.sampled_from((1, 2, 4))))
        ]
        share = 8 // len(owners)
        snapshots.append(
            with_running(
                cluster(f"c{c}", node(f"n{c}", gpu=8)),
                *(
                    running(key, priority=p, dispatched_at=i, usage={f"n{c}": res(gpu=share)})
                    for i, (key, p) in enumerate(owners)
                ),
            )
        )
    pending = [
        gpu(
            f"{draw(st.sampled_from(NAMESPACES))}/w{i}",
            draw(st.sampled_from((1, 2, 4, 8))),
            priority=draw(st.integers(0, 6)),
            created_at=draw(st.integers(0, 100)),
        )
        for i in range(draw(st.integers(1, 8)))
    ]
    return pending, snapshots, draw(st.sampled_from(QueueMode)), draw(st.sampled_from((0, 1e9)))


def foreign(text: str, to: str, keys: set[str]) -> list[str]:
    """The AppWrapper keys `text` names whose namespace is not `to`'s."""
    own = to.partition("/")[0]
    return [m[0] for m in KEY.finditer(text) if m[0] in keys and m[1] != own]


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_no_message_for_one_namespace_names_an_appwrapper_of_another(
    world: tuple[list[Workload], list[ClusterSnapshot], QueueMode, float],
) -> None:
    pending, snapshots, mode, starvation_after = world
    keys = {w.key for w in pending} | {a.key for c in snapshots for a in c.admitted}
    result = schedule(
        pending,
        snapshots,
        mode=mode,
        now=NOW,
        starvation_after=starvation_after,
        preemption=LowestPriorityFirst(),
    )
    for wait in result.waits:
        assert foreign(wait.message, wait.key, keys) == []
    priorities = {w.key: w.priority for w in pending}
    for preempt in result.preemptions:
        assert (
            foreign(evicting(preempt.key, preempt.victims, preempt.cluster), preempt.key, keys)
            == []
        )
        for victim in preempt.victims:
            _, message = why_evicted(
                victim,
                None,
                preemptor=preempt.key,
                preemptor_uid="u",
                priority=priorities[preempt.key],
                queue="",
            )
            assert foreign(message, victim, keys) == []
