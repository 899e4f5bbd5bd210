"""The priority policy: a namespace's rule narrows the default, never widens it, and its
class list holds for every way a priority is named (PriorityClass, Kueue's
WorkloadPriorityClass label)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.models import AppWrapper
from dispatcher.controller.reading import AppWrapperReader
from dispatcher.core.gatekeeping import PriorityPolicy, PriorityRule, narrowed, priority_problems

CAP = 1_000_000_000
POLICY = PriorityPolicy(
    namespaces={
        "classes-only": PriorityRule(classes=["dev", "prod"]),
        "wider": PriorityRule(max_priority=2_000_000_000, min_priority=-5),
        "narrow": PriorityRule(max_priority=50, min_priority=0),
    }
)


@pytest.mark.parametrize(
    ("namespace", "spec", "class_value", "workload_class", "workload_value", "want"),
    [
        # A rule listing only classes keeps the default's cap on a raw priority.
        pytest.param(
            "classes-only",
            {"priority": 2147483647},
            None,
            "",
            None,
            f"above the highest this namespace may use ({CAP})",
            id="classes-only-cap",
        ),
        pytest.param(
            "classes-only", {"priority": CAP}, None, "", None, "", id="classes-only-at-cap"
        ),
        # A wider range is cut back to the default's.
        pytest.param(
            "wider",
            {"priority": 1_500_000_000},
            None,
            "",
            None,
            f"above the highest this namespace may use ({CAP})",
            id="wider-cut",
        ),
        pytest.param("wider", {"priority": -5}, None, "", None, "", id="wider-floor-kept"),
        pytest.param("narrow", {"priority": 51}, None, "", None, "above the highest", id="narrow"),
        # The class list holds for the Kueue label as for priorityClassName.
        pytest.param(
            "classes-only",
            {},
            None,
            "high",
            10,
            "WorkloadPriorityClass 'high' is not one namespace classes-only may use",
            id="kueue-label-unlisted",
        ),
        pytest.param(
            "classes-only", {}, None, "dev", 2_000_000_000, "", id="kueue-label-listed-any-value"
        ),
        pytest.param(
            "classes-only",
            {"priorityClassName": "high"},
            10,
            "",
            None,
            "PriorityClass 'high' is not one",
            id="class-unlisted",
        ),
        pytest.param(
            "classes-only",
            {"priorityClassName": "prod"},
            2_000_000_000,
            "",
            None,
            "",
            id="class-listed-beyond-cap",
        ),
        # Both named: both judged.
        pytest.param(
            "classes-only",
            {"priorityClassName": "dev"},
            1,
            "high",
            1,
            "WorkloadPriorityClass 'high'",
            id="both-named-one-refused",
        ),
        # No list: the Kueue class's value is held to the range, its name to the prefixes.
        pytest.param(
            "narrow",
            {},
            None,
            "big",
            51,
            "WorkloadPriorityClass 'big' has value 51",
            id="kueue-value-range",
        ),
        pytest.param(
            "other", {}, None, "system-x", 1, "reserved for the system", id="kueue-system-prefix"
        ),
        pytest.param("other", {}, None, "unread", None, "", id="kueue-value-unknown"),
        pytest.param(
            "other", {"priority": 2147483647}, None, "ok", 5, "", id="raw-unused-when-named"
        ),
    ],
)
def test_priority_rule(
    namespace: str,
    spec: dict[str, Any],
    class_value: int | None,
    workload_class: str,
    workload_value: int | None,
    want: str,
) -> None:
    problems = priority_problems(
        spec,
        namespace=namespace,
        policy=POLICY,
        class_value=class_value,
        workload_class=workload_class,
        workload_class_value=workload_value,
    )
    if want:
        assert len(problems) == 1
        assert want in problems[0]
    else:
        assert problems == []


@pytest.mark.parametrize(
    ("default", "own", "want"),
    [
        pytest.param(
            PriorityRule(max_priority=10),
            PriorityRule(classes=["a"]),
            PriorityRule(classes=["a"], max_priority=10),
            id="classes-keep-cap",
        ),
        pytest.param(
            PriorityRule(classes=["a", "b"]),
            PriorityRule(classes=["b", "c"]),
            PriorityRule(classes=["b"]),
            id="lists-intersect",
        ),
        pytest.param(
            PriorityRule(classes=["a"]),
            PriorityRule(max_priority=3),
            PriorityRule(classes=["a"], max_priority=3),
            id="default-list-kept",
        ),
        pytest.param(
            PriorityRule(min_priority=0, max_priority=10),
            PriorityRule(min_priority=-10, max_priority=20),
            PriorityRule(min_priority=0, max_priority=10),
            id="never-wider",
        ),
        pytest.param(
            PriorityRule(),
            PriorityRule(min_priority=1),
            PriorityRule(min_priority=1),
            id="floor-added",
        ),
    ],
)
def test_narrowed(default: PriorityRule, own: PriorityRule, want: PriorityRule) -> None:
    assert narrowed(default, own) == want


bounds = st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1)


@given(
    default_max=bounds,
    default_min=bounds,
    own_max=bounds,
    own_min=bounds,
    own_classes=st.none() | st.lists(st.sampled_from(["a", "b", "c"]), max_size=3),
    priority=st.integers(min_value=-(2**31), max_value=2**31 - 1),
)
def test_a_namespace_rule_never_admits_a_raw_priority_the_default_refuses(
    default_max: int | None,
    default_min: int | None,
    own_max: int | None,
    own_min: int | None,
    own_classes: list[str] | None,
    priority: int,
) -> None:
    default = PriorityRule(max_priority=default_max, min_priority=default_min)
    own = PriorityRule(classes=own_classes, max_priority=own_max, min_priority=own_min)
    policy = PriorityPolicy(default=default, namespaces={"n": own})
    spec = {"priority": priority}
    if priority_problems(spec, namespace="n", policy=policy, class_value=None) == []:
        assert priority_problems(spec, namespace="other", policy=policy, class_value=None) == []


def _reader_refusal(labels: dict[str, str], spec: dict[str, Any]) -> str:
    classes = {"high": {"value": 100}, "dev": {"value": 5}}
    reader = AppWrapperReader(
        allowed_kinds=frozenset({"Pod"}),
        priority_class=lambda name: classes.get(name),
        priority_policy=POLICY,
        workload_priority_class=lambda name: classes.get(name),
    )
    obj: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {
            "name": "a",
            "namespace": "classes-only",
            "labels": labels,
            "resourceVersion": "1",
        },
        "spec": {"resources": {"GenericItems": []}, **spec},
    }
    return reader.refusal(AppWrapper.from_kube(obj), obj)


@pytest.mark.parametrize(
    ("labels", "spec", "want"),
    [
        pytest.param(
            {"kueue.x-k8s.io/priority-class": "high"},
            {},
            "WorkloadPriorityClass 'high' is not one namespace classes-only may use",
            id="kueue-unlisted",
        ),
        pytest.param({"kueue.x-k8s.io/priority-class": "dev"}, {}, "", id="kueue-listed"),
        pytest.param({}, {"priority": 2147483647}, "above the highest", id="raw-capped"),
        pytest.param({}, {"priorityClassName": "high"}, "PriorityClass 'high'", id="class"),
    ],
)
def test_the_check_before_dispatch_judges_every_name(
    labels: dict[str, str], spec: dict[str, Any], want: str
) -> None:
    refusal = _reader_refusal(labels, spec)
    if want:
        assert want in refusal
    else:
        assert refusal == ""
