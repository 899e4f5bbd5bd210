"""Quotas charge at least what the pod templates ask: a `custompodresources` that asks less
(read as written for placement, as MCAD) cannot shrink an AppWrapper's charge, unless its
ClusterAppQueue charges as declared (`quotaCharge: AsDeclared`). Pure: the reading of an
AppWrapper, the charge, and one cycle per case."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from dispatcher.api.models import AppWrapper
from dispatcher.api.queues import ClusterAppQueue
from dispatcher.core.model import PodSet, QueueMode, Workload
from dispatcher.core.quota.flavors import charge_of
from dispatcher.core.quota.model import QuotaCharge
from dispatcher.core.quota.read import queue_of
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import schedule
from dispatcher.core.workloads import InvalidSpec, workload_of
from tests.unit.builders import GPU, cluster, node, pods, workload
from tests.unit.quota_builders import DEFAULT, queue, setup

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def pod(cpu: str, gpu: int = 0) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": cpu}
    if gpu:
        requests[GPU] = gpu
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": requests}}]},
    }


def appwrapper(template: dict[str, Any], declared: list[dict[str, Any]] | None) -> AppWrapper:
    item: dict[str, Any] = {"generictemplate": template}
    if declared is not None:
        item["custompodresources"] = declared
    return AppWrapper.from_kube(
        {
            "apiVersion": "workload.codeflare.dev/v1beta1",
            "kind": "AppWrapper",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u"},
            "spec": {"resources": {"GenericItems": [item]}},
        }
    )


def totals(pod_sets: tuple[PodSet, ...] | None) -> dict[str, int]:
    if pod_sets is None:
        return {}
    summed: dict[str, int] = {}
    for pod_set in pod_sets:
        for resource, amount in pod_set.requests.items():
            if amount:
                summed[resource] = summed.get(resource, 0) + amount * pod_set.count
    return summed


TINY = [{"replicas": 1, "requests": {"cpu": "1m"}}]
MORE = [{"replicas": 1, "requests": {"cpu": "4", GPU: 8}}]
CRD = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}


@dataclass(frozen=True)
class ReadingCase:
    id: str
    template: dict[str, Any]
    declared: list[dict[str, Any]] | None
    as_written: bool
    want_placement: dict[str, int]
    want_charge: dict[str, int] = field(default_factory=dict)
    """Totals of `charge_pod_sets`; empty: None (the charge is the placement's)."""


READING_CASES = [
    ReadingCase(
        "under-declared-charged-by-the-templates",
        pod("2", gpu=8),
        TINY,
        True,
        want_placement={"cpu": 1, "pods": 1000},
        want_charge={"cpu": 2000, GPU: 8000, "pods": 1000},
    ),
    ReadingCase(
        "a-declaration-may-raise-the-charge",
        pod("1", gpu=2),
        MORE,
        True,
        want_placement={"cpu": 4000, GPU: 8000, "pods": 1000},
    ),
    ReadingCase(
        "no-declaration", pod("2", gpu=8), None, True, {"cpu": 2000, GPU: 8000, "pods": 1000}
    ),
    ReadingCase(
        "placement-at-least-the-templates-already",
        pod("2", gpu=8),
        TINY,
        False,
        want_placement={"cpu": 2000, GPU: 8000, "pods": 1000},
    ),
    ReadingCase(
        "a-kind-whose-pods-are-not-read-keeps-its-declaration",
        CRD,
        TINY,
        True,
        want_placement={"cpu": 1, "pods": 1000},
    ),
]


@pytest.mark.parametrize("case", READING_CASES, ids=[c.id for c in READING_CASES])
def test_the_workload_carries_the_templates_charge_only_where_it_differs(
    case: ReadingCase,
) -> None:
    found = workload_of(
        appwrapper(case.template, case.declared),
        priority=0,
        allowed_kinds=None,
        now=NOW,
        declared_as_written=case.as_written,
    )
    assert not isinstance(found, InvalidSpec), found
    assert totals(found.pod_sets) == case.want_placement
    assert totals(found.charge_pod_sets) == case.want_charge


def under_declared(key: str, queue_name: str = "team", created_at: float = 0) -> Workload:
    """Reserves 1m CPU for placement; its template asks 8 GPUs."""
    declared = workload(key, pods(1, cpu="1m"), queue=queue_name, created_at=created_at)
    return replace(declared, charge_pod_sets=(pods(1, cpu=2, gpu=8),))


def test_the_charge_follows_the_queue() -> None:
    item = under_declared("ns/a")
    chosen = [(DEFAULT, ("cpu", GPU, "pods"))]
    templates = charge_of("ns/a", "team", item, chosen, admitted_at=0, spec=queue("team"))
    declared_spec = queue("team", charge=QuotaCharge.AS_DECLARED)
    declared = charge_of("ns/a", "team", item, chosen, admitted_at=0, spec=declared_spec)
    gone = charge_of("ns/a", "team", item, chosen, admitted_at=0)
    assert templates.amounts == {
        (DEFAULT, "cpu"): 2000,
        (DEFAULT, GPU): 8000,
        (DEFAULT, "pods"): 1000,
    }
    assert declared.amounts == {(DEFAULT, "cpu"): 1, (DEFAULT, "pods"): 1000}
    # The queue gone from the setup: the default, at least the templates.
    assert gone.amounts == templates.amounts


def test_the_queue_field_is_read_and_defaults_to_at_least_the_templates() -> None:
    base = {"metadata": {"name": "team"}, "spec": {}}
    assert queue_of(ClusterAppQueue.model_validate(base)).charge is QuotaCharge.AT_LEAST_TEMPLATES
    opted = {"metadata": {"name": "team"}, "spec": {"quotaCharge": "AsDeclared"}}
    assert queue_of(ClusterAppQueue.model_validate(opted)).charge is QuotaCharge.AS_DECLARED


@dataclass(frozen=True)
class CycleCase:
    id: str
    charge: QuotaCharge
    want_admits: list[str]
    want_waits: dict[str, str]


CYCLE_CASES = [
    CycleCase(
        "templates-fill-the-quota-the-second-waits",
        QuotaCharge.AT_LEAST_TEMPLATES,
        ["ns/a"],
        {"ns/b": "queue team: needs nvidia.com/gpu 8; nominal 8, in use 8, cohort can lend 0"},
    ),
    CycleCase("as-declared-both-go", QuotaCharge.AS_DECLARED, ["ns/a", "ns/b"], {}),
]


@pytest.mark.parametrize("case", CYCLE_CASES, ids=[c.id for c in CYCLE_CASES])
def test_under_declared_appwrappers_in_one_cycle(case: CycleCase) -> None:
    quotas = setup(queue("team", {"cpu": "64", GPU: "8", "pods": "100"}, charge=case.charge))
    result = schedule(
        [under_declared("ns/a", created_at=1), under_declared("ns/b", created_at=2)],
        [cluster("c", node("n1", cpu=64, gpu=16))],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=10_000.0,
        starvation_after=1e9,
        preemption=None,
        quotas=QuotaView(QuotaTree(quotas)),
    )
    assert [a.key for a in result.admits] == case.want_admits
    assert {w.key: w.message for w in result.waits} == case.want_waits
    if case.charge is QuotaCharge.AT_LEAST_TEMPLATES:
        assignment = result.admits[0].assignment
        assert assignment is not None
        assert assignment.amounts[(DEFAULT, GPU)] == 8000
