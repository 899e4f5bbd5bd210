"""From an AppWrapper to the core's Workload: age within a second, the cluster selector."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dispatcher.api.models import AppWrapper
from dispatcher.core.model import ClusterSnapshot, Workload
from dispatcher.core.scheduling import queue_order_key
from dispatcher.core.workloads import InvalidSpec, workload_of
from dispatcher.testing.manifests import appwrapper, deployment


def _aw(name: str, queued_at: str | None) -> AppWrapper:
    obj = {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": name,
            "creationTimestamp": "2026-01-01T00:00:05Z",
        },
        "spec": {},
    }
    if queued_at:
        obj["status"] = {"queuedAt": queued_at}
    return AppWrapper.from_kube(obj)


def test_new_appwrapper_sorts_after_an_older_one_of_the_same_second() -> None:
    now = datetime(2026, 1, 1, 0, 0, 5, 900000, tzinfo=UTC)
    older = workload_of(
        _aw("z-older", "2026-01-01T00:00:05.400000Z"), priority=0, allowed_kinds=None, now=now
    )
    newer = workload_of(_aw("a-newer", None), priority=0, allowed_kinds=None, now=now)
    assert isinstance(older, Workload)
    assert isinstance(newer, Workload)
    assert sorted([newer, older], key=queue_order_key) == [older, newer]


def _selected(expressions: list[dict[str, object]]) -> dict[str, object]:
    aw = appwrapper("a", deployment("a", 1, {"cpu": "1"}))
    aw["metadata"].update(namespace="ns", uid="u")
    aw["spec"]["schedulingSpec"] = {
        "clusterScheduling": {"clusterSelector": {"matchExpressions": expressions}}
    }
    return aw


@pytest.mark.parametrize(
    ("expressions", "east", "west"),
    [
        pytest.param([{"key": "zone", "operator": "In", "values": ["east"]}], True, False, id="in"),
        pytest.param(
            [{"key": "zone", "operator": "NotIn", "values": ["east"]}], False, True, id="notin"
        ),
        pytest.param([{"key": "gpu", "operator": "Exists"}], True, False, id="exists"),
        pytest.param([{"key": "gpu", "operator": "DoesNotExist"}], False, True, id="absent"),
    ],
)
def test_cluster_selector_match_expressions_are_honoured(
    expressions: list[dict[str, object]], east: bool, west: bool
) -> None:
    model = AppWrapper.from_kube(_selected(expressions))
    workload = workload_of(model, priority=0, allowed_kinds=None, now=datetime.now(UTC))
    assert isinstance(workload, Workload)
    placement = workload.placement
    assert not placement.anywhere
    assert (
        placement.allows(ClusterSnapshot("east", (), labels={"zone": "east", "gpu": "a100"}))
        == east
    )
    assert placement.allows(ClusterSnapshot("west", (), labels={"zone": "west"})) == west


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        pytest.param(
            {"key": "zone", "operator": "Near", "values": ["x"]}, "'Near' is not one of", id="op"
        ),
        pytest.param(
            {"key": "zone", "operator": "In"}, "In needs at least one value", id="in-empty"
        ),
        pytest.param(
            {"key": "zone", "operator": "Exists", "values": ["x"]},
            "takes no values",
            id="exists-values",
        ),
    ],
)
def test_a_bad_match_expression_is_an_invalid_spec(
    expression: dict[str, object], says: str
) -> None:
    model = AppWrapper.from_kube(_selected([expression]))
    result = workload_of(model, priority=0, allowed_kinds=None, now=datetime.now(UTC))
    assert isinstance(result, InvalidSpec)
    assert "clusterSelector.matchExpressions[0]" in result.message
    assert says in result.message
