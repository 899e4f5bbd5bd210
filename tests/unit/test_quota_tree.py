"""The quota core: the cohort tree, lending and borrowing, queue resolution, flavors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dispatcher.api.quantity import parse_milli
from dispatcher.core.model import LabelRequirement, PodSet, Taint, Toleration
from dispatcher.core.quota.flavors import Mode, QuotaRefusal, candidates, flavored
from dispatcher.core.quota.model import (
    LocalQueue,
    QuotaSetup,
    Selector,
    StopPolicy,
    WhenCanBorrow,
)
from dispatcher.core.quota.resolve import Queued, QueueProblem, resolve
from dispatcher.core.quota.tree import QuotaLedger, QuotaTree, TreeNode
from tests.unit.builders import GPU, pods, res
from tests.unit.quota_builders import DEFAULT, cohort, flavor, group, queue, setup

CPU = (DEFAULT, "cpu")


def m(text: str) -> int:
    return parse_milli(text)


def ledger(*queues, **kwargs) -> QuotaLedger:  # type: ignore[no-untyped-def]
    return QuotaLedger(QuotaTree(setup(*queues, **kwargs)))


def test_a_queue_alone_has_its_nominal_quota() -> None:
    book = ledger(queue("a", {"cpu": "4"}))
    assert book.available("a", CPU) == m("4")
    book.add("a", {CPU: m("3")})
    assert book.available("a", CPU) == m("1")
    assert not book.borrowing("a")


def test_members_of_a_cohort_borrow_what_the_others_do_not_use() -> None:
    book = ledger(queue("a", {"cpu": "4"}, cohort="c"), queue("b", {"cpu": "6"}, cohort="c"))
    assert book.available("a", CPU) == m("10")
    book.add("b", {CPU: m("8")})  # b borrows 2 of a's
    assert book.borrowing("b")
    assert book.borrowed("b", CPU) == m("2")
    assert book.available("a", CPU) == m("2")
    book.add("b", {CPU: m("8")}, -1)
    assert book.available("a", CPU) == m("10")


@pytest.mark.parametrize(
    ("a_quota", "b_use", "a_may_take"),
    [
        (("4", "1", None), "0", "5"),  # borrowing limit 1: at most 4 + 1
        (("4", None, None), "0", "10"),
        (("4", "0", None), "0", "4"),
        (("4", None, None), "6", "4"),  # b uses all its own: a has its own left
    ],
)
def test_borrowing_limit(
    a_quota: tuple[str, str | None, None], b_use: str, a_may_take: str
) -> None:
    book = ledger(queue("a", {"cpu": a_quota}, cohort="c"), queue("b", {"cpu": "6"}, cohort="c"))
    book.add("b", {CPU: m(b_use)})
    assert book.available("a", CPU) == m(a_may_take)


def test_lending_limit_keeps_part_of_a_queues_quota_for_itself() -> None:
    # a lends at most 1 of its 4: b may use 6 + 1, and a keeps 3 whatever b does.
    book = ledger(
        queue("a", {"cpu": ("4", None, "1")}, cohort="c"), queue("b", {"cpu": "6"}, cohort="c")
    )
    assert book.available("b", CPU) == m("7")
    book.add("b", {CPU: m("7")})
    assert book.available("a", CPU) == m("3")
    assert book.available("b", CPU) == 0


def test_three_level_tree_lends_along_the_tree() -> None:
    # root (4 of its own) -> {left (a: 2, b: 2), right (c: 2)}
    book = ledger(
        queue("a", {"cpu": "2"}, cohort="left"),
        queue("b", {"cpu": "2"}, cohort="left"),
        queue("c", {"cpu": "2"}, cohort="right"),
        cohorts=[
            cohort("left", "root"),
            cohort("right", "root"),
            cohort("root", None, {"cpu": "4"}),
        ],
    )
    assert book.available("a", CPU) == m("10")
    book.add("c", {CPU: m("6")})  # c uses its 2 and borrows 4 from the root
    assert book.available("a", CPU) == m("4")
    assert book.usage[TreeNode("cohort", "root")][CPU] == m("6")


def test_a_cohort_cycle_is_reported_and_never_looped() -> None:
    tree = QuotaTree(
        setup(
            queue("a", {"cpu": "2"}, cohort="x"),
            queue("b", {"cpu": "2"}, cohort="free"),
            cohorts=[cohort("x", "y"), cohort("y", "x")],
        )
    )
    assert any("cohort cycle" in p for p in tree.problems["a"])
    assert tree.problems["b"] == []
    book = QuotaLedger(tree)
    book.add("a", {CPU: m("1")})  # terminates
    assert book.available("a", CPU) >= 0


def test_a_queue_naming_a_missing_flavor_is_inactive() -> None:
    tree = QuotaTree(setup(queue("a", flavors={"gone": {"cpu": "2"}})))
    assert tree.problems["a"] == ["flavor gone does not exist"]


# -- resolution --------------------------------------------------------------------------


def _resolve(namespace: str, name: str, **changes: object) -> Queued | QueueProblem | None:
    team = queue("team", {"cpu": "2"})
    if "selector" in changes:
        team = replace(team, namespaces=changes["selector"])  # type: ignore[arg-type]
    if "stop" in changes:
        team = replace(team, stop=changes["stop"])  # type: ignore[arg-type]
    built = replace(
        setup(team, namespaces={"ns": {"team": "a"}}),
        queue_required=bool(changes.get("queue_required")),
    )
    if "points_at" in changes:
        at = str(changes["points_at"])
        built = replace(built, local_queues={("ns", "team"): LocalQueue("ns", "team", at)})
    return resolve(namespace, name, built, QuotaTree(built))


@pytest.mark.parametrize(
    ("namespace", "name", "changes", "expected"),
    [
        ("ns", "team", {}, Queued("ns/team", "team")),
        ("ns", "", {}, None),
        ("ns", "", {"queue_required": True}, "no queue: label the AppWrapper"),
        ("ns", "nope", {}, "AppQueue ns/nope does not exist"),
        ("other", "team", {}, "AppQueue other/team does not exist"),
        ("ns", "team", {"points_at": "gone"}, "points at cluster queue gone, which does not exist"),
        ("ns", "team", {"selector": None}, "admits no namespace"),
        (
            "ns",
            "team",
            {"selector": Selector((("team", "b"),))},
            "does not admit namespace ns",
        ),
        (
            "ns",
            "team",
            {"selector": Selector((), (LabelRequirement("team", "In", frozenset({"a"})),))},
            Queued("ns/team", "team"),
        ),
        ("ns", "team", {"stop": StopPolicy.HOLD}, "is stopped (stopPolicy Hold)"),
    ],
)
def test_resolution(
    namespace: str, name: str, changes: dict[str, object], expected: object
) -> None:
    found = _resolve(namespace, name, **changes)
    if isinstance(expected, str):
        assert isinstance(found, QueueProblem)
        assert expected in found.message
    else:
        assert found == expected


# -- flavors -----------------------------------------------------------------------------


def _two_flavors(
    when_can_borrow: WhenCanBorrow = WhenCanBorrow.BORROW,
) -> tuple[QuotaLedger, QuotaSetup]:
    q = queue(
        "q",
        flavors={"on-demand": {"cpu": ("4", None, None)}, "spot": {"cpu": "8"}},
        cohort="c",
        when_can_borrow=when_can_borrow,
    )
    lender = queue("lender", {"cpu": "0"}, flavors={"on-demand": {"cpu": "4"}}, cohort="c")
    built = setup(
        q,
        lender,
        flavors=[flavor("on-demand", {"tier": "on-demand"}), flavor("spot", {"tier": "spot"})],
    )
    return QuotaLedger(QuotaTree(built)), built


def test_fungibility_borrow_takes_the_first_flavor_even_if_it_borrows() -> None:
    book, built = _two_flavors()
    book.add("q", {("on-demand", "cpu"): m("4")})
    found = candidates(built.queues["q"], (pods(2, cpu=1),), book, built.flavors)
    assert not isinstance(found, QuotaRefusal)
    assert found[0].flavors[0][0] == "on-demand"
    assert found[0].borrows
    assert found[0].mode is Mode.BORROW


def test_fungibility_try_next_flavor_prefers_a_flavor_without_borrowing() -> None:
    book, built = _two_flavors(when_can_borrow=WhenCanBorrow.TRY_NEXT_FLAVOR)
    book.add("q", {("on-demand", "cpu"): m("4")})
    found = candidates(built.queues["q"], (pods(2, cpu=1),), book, built.flavors)
    assert not isinstance(found, QuotaRefusal)
    assert [a.flavors[0][0] for a in found] == ["spot", "on-demand"]
    assert found[0].mode is Mode.FIT


def test_a_flavor_adds_its_node_labels_and_tolerations_to_the_pods_it_applies_to() -> None:
    spot = flavor(
        "spot",
        {"tier": "spot"},
        taints=[Taint("spot", "true")],
        tolerations=[Toleration("spot", "Equal", "true", "NoSchedule")],
    )
    q = replace(queue("q"), groups=(group({DEFAULT: {"cpu": "8"}}), group({"spot": {GPU: "8"}})))
    built = setup(q, flavors=[spot, flavor(DEFAULT)])
    book = QuotaLedger(QuotaTree(built))
    gpu_pods, cpu_pods = pods(2, cpu=1, gpu=1, name="workers"), pods(1, cpu=1, name="head")
    found = candidates(q, (gpu_pods, cpu_pods), book, built.flavors)
    assert not isinstance(found, QuotaRefusal)
    assert [f for f, _ in found[0].flavors] == [DEFAULT, "spot"]
    made = flavored((gpu_pods, cpu_pods), found[0].flavors, built.flavors)
    assert made[0].node_selector == (("tier", "spot"),)
    assert made[0].tolerations[-1].key == "spot"
    assert made[1] == cpu_pods  # asks for no gpu: the gpu group's flavor does not apply


def test_untolerated_flavor_taint_is_skipped_with_a_reason() -> None:
    q = queue("q", flavors={"tainted": {"cpu": "8"}})
    built = setup(q, flavors=[flavor("tainted", taints=[Taint("dedicated", "x")])])
    found = candidates(q, (pods(1, cpu=1),), QuotaLedger(QuotaTree(built)), built.flavors)
    assert isinstance(found, QuotaRefusal)
    assert "do not tolerate flavor tainted's taint dedicated" in found.message


@pytest.mark.parametrize(
    ("request_pods", "used", "expected", "never"),
    [
        (
            pods(1, cpu=1, gpu=4),
            "6",
            "queue q: needs nvidia.com/gpu 4; nominal 8, in use 6, cohort can lend 0",
            False,
        ),
        (
            pods(1, cpu=1, gpu=16),
            "0",
            "queue q: needs nvidia.com/gpu 16, the most it can ever have is 8",
            True,
        ),
        (
            PodSet(1, res(cpu=1, gpu=1, ephemeral_storage="1Gi")),
            "0",
            "queue q does not cover ephemeral-storage",
            True,
        ),
    ],
)
def test_quota_refusals_name_the_limiting_figure(
    request_pods: object, used: str, expected: str, never: bool
) -> None:
    q = queue("q", {"cpu": "100", GPU: "8"})
    built = setup(q)
    book = QuotaLedger(QuotaTree(built))
    book.add("q", {(DEFAULT, GPU): m(used)})
    found = candidates(q, (request_pods,), book, built.flavors)  # type: ignore[arg-type]
    if isinstance(found, QuotaRefusal):
        message, is_never = found.message, found.never
    else:  # fits only by preemption: the assignment carries the figure
        message, is_never = found[0].limit, False
    assert expected in message
    assert is_never is never
