"""Cluster selector expressions: read as Kubernetes reads a label selector, or refused.

A tenant must not be placed where its selector says it may not go, nor get a selector the
dispatcher would silently ignore.
"""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.model import (
    ClusterSnapshot,
    LabelRequirement,
    Placement,
    QueueMode,
    Workload,
)
from dispatcher.core.scheduling import Admit, schedule
from tests.unit.builders import (
    GPU,
    cluster,
    container,
    node,
    pod,
    pod_spec,
)
from tests.unit.test_inference import counted, refused, workload_or_error


def member(name: str, **labels: str) -> ClusterSnapshot:
    return cluster(name, node(f"{name}-1", gpu=8), labels=labels)


SELECTOR_CASES: list[Any] = [
    pytest.param(
        {"matchExpressions": [{"key": "region", "operator": "In", "values": ["eu", "ap"]}]},
        {"eu"},
        id="in",
    ),
    pytest.param(
        {"matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["eu"]}]},
        {"us", "bare"},
        id="not-in-includes-unlabelled",
    ),
    pytest.param(
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"eu", "us"}, id="exists"
    ),
    pytest.param(
        {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]},
        {"bare"},
        id="does-not-exist",
    ),
    pytest.param(
        {
            "matchLabels": {"gpu": "a100"},
            "matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["us"]}],
        },
        {"eu"},
        id="labels-and-expressions-all-hold",
    ),
    pytest.param(
        {
            "matchExpressions": [
                {"key": "region", "operator": "In", "values": ["us"]},
                {"key": "region", "operator": "In", "values": ["eu"]},
            ]
        },
        set(),
        id="contradiction-matches-none",
    ),
]

MEMBERS = (
    member("eu", region="eu", gpu="a100"),
    member("us", region="us", gpu="h100"),
    member("bare"),
)


@pytest.mark.parametrize(("selector", "want"), SELECTOR_CASES)
def test_cluster_selector_expressions(selector: dict[str, Any], want: set[str]) -> None:
    aw = counted(pod("p"))
    placed = workload_or_error(
        pod("p"), scheduling={"clusterScheduling": {"clusterSelector": selector}}
    )
    assert isinstance(placed, Workload), placed
    assert {c.name for c in MEMBERS if placed.placement.allows(c)} == want
    assert aw.placement.anywhere
    assert not placed.placement.anywhere


def test_a_selector_expression_steers_the_cycle() -> None:
    selector = {"matchExpressions": [{"key": "region", "operator": "NotIn", "values": ["eu"]}]}
    aw = workload_or_error(
        pod("p", pod_spec(container(requests={"cpu": "1"}, limits={GPU: 2}))),
        scheduling={"clusterScheduling": {"clusterSelector": selector}},
    )
    assert isinstance(aw, Workload)
    # "eu" would be the best fit (it is listed first and both are empty).
    result = schedule(
        [aw],
        MEMBERS[:2],
        mode=QueueMode.STRICT_FIFO,
        now=0.0,
        starvation_after=1e9,
        preemption=None,
    )
    assert result.admits == (Admit("ns/aw", "us"),)


INVALID_SELECTORS: list[Any] = [
    pytest.param(
        {"key": "region", "operator": "Equals", "values": ["eu"]},
        "matchExpressions[0]: operator 'Equals' is not one of In, NotIn, Exists, DoesNotExist",
        id="unknown-operator",
    ),
    pytest.param(
        {"key": "region", "operator": "in", "values": ["eu"]},
        "operator 'in' is not one of",
        id="operators-are-case-sensitive",
    ),
    pytest.param(
        {"key": "region", "operator": "In", "values": []},
        "matchExpressions[0]: operator In needs at least one value",
        id="in-without-values",
    ),
    pytest.param(
        {"key": "gpu", "operator": "Exists", "values": ["a100"]},
        "matchExpressions[0]: operator Exists takes no values",
        id="exists-with-values",
    ),
]


@pytest.mark.parametrize(("expression", "want"), INVALID_SELECTORS)
def test_invalid_selector_expressions_are_invalid_specs(
    expression: dict[str, Any], want: str
) -> None:
    selector = {"matchExpressions": [expression]}
    message = refused(pod("p"), scheduling={"clusterScheduling": {"clusterSelector": selector}})
    assert message.startswith("schedulingSpec.clusterScheduling.clusterSelector.")
    assert want in message


def test_label_requirement_of_an_unknown_operator_matches_nothing() -> None:
    assert not LabelRequirement("a", "Gt", frozenset({"1"})).matches({"a": "2"})


def test_placements_differing_only_in_expressions_are_distinct() -> None:
    """The cycle remembers refusals per placement: two selectors must not share one."""
    a = Placement(match_expressions=(LabelRequirement("r", "In", frozenset({"eu"})),))
    b = Placement(match_expressions=(LabelRequirement("r", "NotIn", frozenset({"eu"})),))
    assert a != b
    assert hash(a) != hash(b)
    assert Placement(clusters=None).anywhere
