"""Kueue's quota objects read as ours (core/quota/kueue.py): each field honoured, refused or
not read; names shared with our objects; the signs that Kueue itself runs; the queue name
as a label or an annotation."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.model import QueueMode, Taint, Toleration
from dispatcher.core.quota.kueue import (
    KueueObjects,
    KueueQuotas,
    kueue_running,
    priority_value,
    with_kueue,
)
from dispatcher.core.quota.model import (
    BorrowPreemption,
    LocalQueue,
    Quota,
    QuotaSetup,
    Reclaim,
    StopPolicy,
    WhenCanBorrow,
    WhenCanPreempt,
    WithinQueue,
)
from dispatcher.core.quota.read import setup_of
from dispatcher.core.quota.resolve import Queued, QueueProblem, resolve
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.workloads import queue_name_of

Obj = dict[str, Any]


def cq(name: str = "cq", **spec: Any) -> Obj:
    base: Obj = {
        "namespaceSelector": {},
        "resourceGroups": [
            {
                "coveredResources": ["cpu"],
                "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": 2}]}],
            }
        ],
    }
    base.update(spec)
    return {"metadata": {"name": name}, "spec": base}


def flavor(name: str = "f", **spec: Any) -> Obj:
    return {"metadata": {"name": name}, "spec": spec}


def lq(name: str = "lq", queue: str = "cq", namespace: str = "ns", **spec: Any) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": queue, **spec},
    }


def read(
    *,
    queues: list[Obj] | None = None,
    flavors: list[Obj] | None = None,
    locals_: list[Obj] | None = None,
    cohorts: list[Obj] | None = None,
    ours: QuotaSetup | None = None,
    running: str = "",
) -> tuple[QuotaSetup, tuple[str, ...]]:
    objects = KueueObjects(
        cluster_queues=queues if queues is not None else [cq()],
        cohorts=cohorts or [],
        flavors=flavors if flavors is not None else [flavor()],
        local_queues=locals_ if locals_ is not None else [lq()],
        kueue_running=running,
    )
    return with_kueue(ours or QuotaSetup(), objects, KueueQuotas.BESIDE)


# -- honoured -------------------------------------------------------------------------------


def test_cluster_queue_fields_honoured() -> None:
    queue = cq(
        cohortName="team",
        queueingStrategy="StrictFIFO",
        stopPolicy="Hold",
        fairSharing={"weight": "2"},
        preemption={
            "withinClusterQueue": "LowerPriority",
            "reclaimWithinCohort": "Any",
            "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
        },
        flavorFungibility={"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "MayStopSearch"},
        resourceGroups=[
            {
                "coveredResources": ["cpu", "memory"],
                "flavors": [
                    {
                        "name": "f",
                        "resources": [
                            {
                                "name": "cpu",
                                "nominalQuota": "2",
                                "borrowingLimit": "1",
                                "lendingLimit": "500m",
                            },
                            {"name": "memory", "nominalQuota": "1Gi"},
                        ],
                    }
                ],
            }
        ],
    )
    setup, notes = read(queues=[queue])
    spec = setup.queues["cq"]
    assert notes == ()
    assert spec.problems == ()
    assert spec.cohort == "team"
    assert spec.strategy is QueueMode.STRICT_FIFO
    assert spec.stop is StopPolicy.HOLD
    assert spec.weight == 2.0
    assert (spec.within, spec.reclaim) == (WithinQueue.LOWER_PRIORITY, Reclaim.ANY)
    assert spec.borrow_preemption is BorrowPreemption.LOWER_PRIORITY
    assert spec.borrow_threshold == 100
    assert spec.when_can_borrow is WhenCanBorrow.TRY_NEXT_FLAVOR
    assert spec.when_can_preempt is WhenCanPreempt.PREEMPT
    assert spec.quota("f", "cpu") == Quota(2000, 1000, 500)
    assert spec.quota("f", "memory") == Quota(1024**3 * 1000)
    assert spec.namespaces is not None
    assert spec.namespaces.matches({"any": "thing"})


@pytest.mark.parametrize(
    ("spec", "want_cohort"),
    [
        pytest.param({"cohort": "old"}, "old", id="v1beta1-cohort"),
        pytest.param({"cohortName": "new"}, "new", id="v1beta2-cohortName"),
        pytest.param({}, None, id="none"),
    ],
)
def test_cohort_as_either_version_names_it(spec: Obj, want_cohort: str | None) -> None:
    setup, _ = read(queues=[cq(**spec)])
    assert setup.queues["cq"].cohort == want_cohort


@pytest.mark.parametrize(
    ("fungibility", "want_borrow", "want_preempt"),
    [
        pytest.param({}, WhenCanBorrow.BORROW, WhenCanPreempt.TRY_NEXT_FLAVOR, id="defaults"),
        pytest.param(
            {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"},
            WhenCanBorrow.BORROW,
            WhenCanPreempt.TRY_NEXT_FLAVOR,
            id="v1beta2",
        ),
        pytest.param(
            {"whenCanBorrow": "Borrow", "whenCanPreempt": "Preempt"},
            WhenCanBorrow.BORROW,
            WhenCanPreempt.PREEMPT,
            id="v1beta1",
        ),
    ],
)
def test_flavor_fungibility(
    fungibility: Obj, want_borrow: WhenCanBorrow, want_preempt: WhenCanPreempt
) -> None:
    setup, _ = read(queues=[cq(flavorFungibility=fungibility)])
    assert setup.queues["cq"].when_can_borrow is want_borrow
    assert setup.queues["cq"].when_can_preempt is want_preempt


def test_no_namespace_selector_admits_no_namespace_as_in_kueue() -> None:
    queue = cq()
    del queue["spec"]["namespaceSelector"]
    setup, _ = read(queues=[queue])
    assert setup.queues["cq"].namespaces is None


def test_resource_flavor_fields_honoured() -> None:
    setup, notes = read(
        flavors=[
            flavor(
                nodeLabels={"pool": "a"},
                nodeTaints=[
                    {"key": "k", "value": "v", "effect": "NoSchedule", "timeAdded": "2026-01-01"}
                ],
                tolerations=[{"key": "k", "operator": "Equal", "value": "v"}],
            )
        ]
    )
    got = setup.flavors["f"]
    assert notes == ()
    assert got.node_labels == (("pool", "a"),)
    assert got.node_taints == (Taint("k", "v", "NoSchedule"),)
    assert got.tolerations == (Toleration("k", "Equal", "v", "", None),)


def test_local_queue_and_cohort_fields_honoured() -> None:
    cohort = {
        "metadata": {"name": "team"},
        "spec": {
            "parentName": "org",
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [{"name": "f", "resources": [{"name": "cpu", "nominalQuota": 4}]}],
                }
            ],
        },
    }
    setup, notes = read(locals_=[lq(stopPolicy="HoldAndDrain")], cohorts=[cohort])
    assert notes == ()
    assert setup.local_queues[("ns", "lq")] == LocalQueue(
        "ns", "lq", "cq", StopPolicy.HOLD_AND_DRAIN
    )
    assert setup.cohorts["team"].parent == "org"
    assert setup.cohorts["team"].groups[0].flavors[0].quotas["cpu"] == Quota(4000)


def test_priority_value() -> None:
    assert priority_value({"metadata": {"name": "high"}, "value": 1000}) == 1000
    assert priority_value(None) is None
    assert priority_value({"value": "1000"}) is None


# -- refused and not read -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        pytest.param({"admissionChecks": ["prov"]}, "admission checks (prov)", id="v1beta1"),
        pytest.param(
            {"admissionChecksStrategy": {"admissionChecks": [{"name": "prov"}]}},
            "admission checks (prov)",
            id="v1beta2",
        ),
    ],
)
def test_admission_checks_make_the_queue_inactive(spec: Obj, want: str) -> None:
    setup, notes = read(queues=[cq(**spec)])
    problems = setup.queues["cq"].problems
    assert len(problems) == 1
    assert want in problems[0]
    assert any(want in n for n in notes)
    found = resolve("ns", "lq", setup, QuotaTree(setup))
    assert isinstance(found, QueueProblem)
    assert "cluster queue cq is inactive" in found.message
    assert want in found.message


def test_topology_flavor_makes_its_queues_inactive() -> None:
    setup, _ = read(flavors=[flavor(nodeLabels={"a": "b"}, topologyName="racks")])
    assert any("topologyName racks" in p for p in setup.queues["cq"].problems)


@pytest.mark.parametrize(
    ("queue", "local", "want_note"),
    [
        pytest.param(
            cq(admissionScope={"admissionMode": "UsageBasedAdmissionFairSharing"}),
            lq(),
            "spec.admissionScope",
            id="admission-scope",
        ),
        pytest.param(
            cq(
                flavorFungibility={
                    "whenCanBorrow": "TryNextFlavor",
                    "whenCanPreempt": "TryNextFlavor",
                    "preference": "BorrowingOverPreemption",
                }
            ),
            lq(),
            "spec.flavorFungibility.preference",
            id="preference",
        ),
        pytest.param(cq(), lq(fairSharing={"weight": "2"}), "spec.fairSharing", id="lq-weight"),
        pytest.param(cq(somethingNew=True), lq(), "spec.somethingNew is not read", id="unknown"),
    ],
)
def test_fields_not_read_are_noted_and_the_queue_stays_active(
    queue: Obj, local: Obj, want_note: str
) -> None:
    setup, notes = read(queues=[queue], locals_=[local])
    assert any(want_note in n for n in notes)
    assert setup.queues["cq"].problems == ()
    assert resolve("ns", "lq", setup, QuotaTree(setup)) == Queued("ns/lq", "cq")


def test_unreadable_object_is_noted_not_read() -> None:
    bad = cq(resourceGroups="lots")
    setup, notes = read(queues=[bad])
    assert "cq" not in setup.queues
    assert any("ClusterQueue cq is unreadable" in n for n in notes)


# -- names shared with ours -----------------------------------------------------------------


def ours_setup(cpu: int) -> QuotaSetup:
    from dispatcher.api.queues import AppFlavor, AppQueue, ClusterAppQueue

    queue = ClusterAppQueue.model_validate(cq(resourceGroups=cq()["spec"]["resourceGroups"]))
    queue.spec.resourceGroups[0].flavors[0].resources[0].nominalQuota = cpu
    return setup_of(
        [queue],
        [],
        [AppFlavor.model_validate(flavor())],
        [AppQueue.model_validate(lq())],
        {},
    )


def test_same_name_same_meaning_is_one_object() -> None:
    setup, notes = read(ours=ours_setup(2))
    assert notes == ()
    assert setup.queues["cq"].problems == ()
    assert resolve("ns", "lq", setup, QuotaTree(setup)) == Queued("ns/lq", "cq")


def test_same_name_different_meaning_makes_ours_inactive_naming_both() -> None:
    setup, _ = read(ours=ours_setup(8))
    (problem,) = setup.queues["cq"].problems
    assert "kueue.x-k8s.io ClusterQueue cq and ClusterAppQueue cq differ" in problem
    assert setup.queues["cq"].quota("f", "cpu") == Quota(8000)  # ours is the one kept


def test_clashing_flavor_and_local_queue() -> None:
    setup, _ = read(
        ours=ours_setup(2), flavors=[flavor(nodeLabels={"x": "y"})], locals_=[lq(queue="other")]
    )
    assert any("ResourceFlavor f and AppFlavor f differ" in p for p in setup.queues["cq"].problems)
    found = resolve("ns", "lq", setup, QuotaTree(setup))
    assert isinstance(found, QueueProblem)
    assert "LocalQueue ns/lq and AppQueue ns/lq differ" in found.message


# -- Kueue itself running -------------------------------------------------------------------


def test_kueue_running_leaves_its_queues_to_it() -> None:
    setup, notes = read(running="Lease kueue-system/x is held")
    assert setup.queues == {}
    found = resolve("ns", "lq", setup, QuotaTree(setup))
    assert isinstance(found, QueueProblem)
    assert "Kueue itself runs (Lease kueue-system/x is held)" in found.message
    assert any("not read" in n for n in notes)


def test_off_reads_nothing_of_kueue() -> None:
    objects = KueueObjects(cluster_queues=[cq()], local_queues=[lq()], flavors=[flavor()])
    setup, notes = with_kueue(QuotaSetup(), objects, KueueQuotas.OFF)
    assert (setup.queues, setup.local_queues, notes) == ({}, {}, ())


NOW = 1_800_000_000.0


def lease(renewed_ago: float, holder: str = "kueue-pod") -> Obj:
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(NOW - renewed_ago, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "metadata": {"name": "c1f6bfd2.kueue.x-k8s.io", "namespace": "kueue-system"},
        "spec": {"holderIdentity": holder, "renewTime": stamp, "leaseDurationSeconds": 15},
    }


KUEUE_WEBHOOK = {
    "metadata": {"name": "kueue-validating-webhook-configuration"},
    "webhooks": [{"rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"]}]}],
}
OTHER_WEBHOOK = {
    "metadata": {"name": "other"},
    "webhooks": [{"rules": [{"apiGroups": ["apps"], "resources": ["deployments"]}]}],
}


@pytest.mark.parametrize(
    ("lease_obj", "webhooks", "want"),
    [
        pytest.param(None, [], "", id="nothing"),
        pytest.param(None, [OTHER_WEBHOOK], "", id="other-webhook"),
        pytest.param(None, [KUEUE_WEBHOOK], "kueue-validating-webhook-configuration", id="hook"),
        pytest.param(lease(5), [], "Lease kueue-system/c1f6bfd2.kueue.x-k8s.io", id="lease"),
        pytest.param(lease(600), [], "", id="stale-lease"),
        pytest.param(lease(5, holder=""), [], "", id="released-lease"),
    ],
)
def test_kueue_running_signs(lease_obj: Obj | None, webhooks: list[Obj], want: str) -> None:
    got = kueue_running(lease_obj, webhooks, NOW)
    assert want in got
    assert bool(got) is bool(want)


# -- the queue name -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "annotations", "want"),
    [
        pytest.param({}, {"kueue.x-k8s.io/queue-name": "q"}, "q", id="kueue-annotation"),
        pytest.param({"kueue.x-k8s.io/queue-name": "q"}, {}, "q", id="kueue-label"),
        pytest.param(
            {"kueue.x-k8s.io/queue-name": "l"},
            {"kueue.x-k8s.io/queue-name": "a"},
            "l",
            id="label-first",
        ),
        pytest.param({}, {"workload.codeflare.dev/queue-name": "o"}, "o", id="ours-annotation"),
        pytest.param(None, None, "", id="none"),
    ],
)
def test_queue_name_as_label_or_annotation(
    labels: dict[str, str] | None, annotations: dict[str, str] | None, want: str
) -> None:
    assert queue_name_of(labels, annotations) == want
