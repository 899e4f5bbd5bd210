"""`Charges` kept on charge and release equals the usage recomputed from all charges, after
any sequence of charges, re-charges and releases, in trees with nested cohorts, lending
and borrowing limits."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.core.quota.charges import Charges
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from tests.unit.quota_builders import DEFAULT, charge, cohort, queue, setup

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUEUES = 4

limits = st.one_of(st.none(), st.integers(0, 6))
trees = st.tuples(
    st.lists(st.tuples(st.integers(0, 8), limits, limits), min_size=QUEUES, max_size=QUEUES),
    st.lists(st.integers(0, 2), min_size=QUEUES, max_size=QUEUES),  # each queue's cohort
    limits,  # cohort c1's lending limit (c1 and c2 sit under root r)
)
events = st.lists(
    st.tuples(
        st.sampled_from(["charge", "release"]),
        st.integers(0, 9),  # AppWrapper
        st.integers(0, QUEUES),  # its queue (QUEUES: one not in the tree)
        st.integers(0, 5),  # cpus
        st.integers(0, 3),  # gpus
    ),
    max_size=40,
)


def _tree(
    spec: tuple[list[tuple[int, int | None, int | None]], list[int], int | None],
) -> QuotaTree:
    quotas, cohorts, lend = spec
    queues = []
    for index, (nominal, borrow, lending) in enumerate(quotas):
        text = (str(nominal), None if borrow is None else str(borrow), None)
        text = (text[0], text[1], None if lending is None else str(lending))
        queues.append(
            queue(f"q{index}", {"cpu": text, "nvidia.com/gpu": "2"}, cohort=f"c{cohorts[index]}")
        )
    c1_quota = {"cpu": ("3", None, None if lend is None else str(lend))}
    tree_cohorts = [cohort("c0"), cohort("c1", "r", c1_quota), cohort("c2", "r"), cohort("r")]
    return QuotaTree(setup(*queues, cohorts=tree_cohorts))


def _plain(usage: dict[object, dict[object, int]]) -> dict[object, dict[object, int]]:
    return {node: {fr: v for fr, v in amounts.items() if v} for node, amounts in usage.items()}


@SETTINGS
@given(trees, events)
def test_kept_usage_equals_a_recompute(
    spec: tuple[list[tuple[int, int | None, int | None]], list[int], int | None],
    steps: list[tuple[str, int, int, int, int]],
) -> None:
    tree = _tree(spec)
    usage = Charges(tree)
    for kind, index, queue_index, cpus, gpus in steps:
        key = f"ns/aw-{index}"
        if kind == "release":
            usage.release(key)
            continue
        amounts = {"cpu": str(cpus), "nvidia.com/gpu": str(gpus)}
        usage.charge(charge(key, f"q{queue_index}", amounts))
        recomputed = QuotaView(tree, list(usage.charges.values())).ledger
        assert _plain(usage.ledger.usage) == _plain(recomputed.usage)  # type: ignore[arg-type]
        kept = QuotaView(tree, usage=usage).ledger
        for name in tree.setup.queues:
            for resource in ("cpu", "nvidia.com/gpu"):
                fr = (DEFAULT, resource)
                assert kept.available(name, fr) == recomputed.available(name, fr)
                assert kept.share(name) == recomputed.share(name)
    recomputed = QuotaView(tree, list(usage.charges.values())).ledger
    assert _plain(usage.ledger.usage) == _plain(recomputed.usage)  # type: ignore[arg-type]


def test_release_names_the_tree_that_got_quota_back() -> None:
    tree = _tree(([(4, None, None)] * QUEUES, [1, 0, 2, 1], None))
    usage = Charges(tree)
    assert usage.charge(charge("ns/a", "q0", {"cpu": "2"})) == "r"
    assert usage.charge(charge("ns/b", "q1", {"cpu": "2"})) == "c0"
    assert usage.charge(charge("ns/c", "nowhere", {"cpu": "2"})) == ""
    assert len(usage) == 3
    assert usage.release("ns/a") == "r"
    assert usage.release("ns/a") == ""
    assert usage.ledger.used("q0", (DEFAULT, "cpu")) == 0
    assert usage.ledger.used("q1", (DEFAULT, "cpu")) == 2000
