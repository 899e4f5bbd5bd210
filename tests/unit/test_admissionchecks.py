"""Admission checks, pure parts: the cycle reserves quota for work that fits no node, the
conditions and phase that follow, and what a ProvisioningRequest's conditions mean."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from dispatcher.api.models import Admission, AppWrapperStatus, ConditionType, Reason
from dispatcher.core import admissionchecks as checks
from dispatcher.core import checkstatus
from dispatcher.core import conditions as cond
from dispatcher.core.admissionchecks import Retry, Step
from dispatcher.core.model import QueueMode, Toleration
from dispatcher.core.phase import Phase, phase_of_raw, queueing
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.view import QuotaView
from dispatcher.core.scheduling import schedule
from dispatcher.core.scheduling.cycle import checked_first
from tests.unit.builders import cluster, node, pods, workload
from tests.unit.quota_builders import queue, setup

NOW = 10_000.0
MOMENT = datetime(2026, 1, 1, tzinfo=UTC)


def gang(key: str, gpu: int, queue_name: str = "", **kwargs: Any) -> Any:
    return workload(key, pods(1, cpu=1), pods(8, gpu=gpu), queue=queue_name, **kwargs)


SMALL = cluster("c", node("n1", cpu=8, gpu=1))


# -- the cycle ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CycleCase:
    id: str
    checks: tuple[str, ...]  # the queue's admissionChecks
    gpu: int  # per worker
    checked: bool = False
    quota_gpu: str = "64"
    want_cluster: str | None = None  # None: it waits
    want_checks: tuple[str, ...] = ()


CYCLE_CASES = [
    CycleCase("no checks: waits", (), gpu=1, want_cluster=None),
    CycleCase(
        "checks, fits nowhere: quota reserved",
        ("prov",),
        gpu=1,
        want_cluster="",
        want_checks=("prov",),
    ),
    CycleCase("checks, fits: dispatched at once", ("prov",), gpu=0, want_cluster="c"),
    CycleCase("checks passed: fitted as any other", ("prov",), gpu=1, checked=True),
    CycleCase("checks, quota short: waits for quota", ("prov",), gpu=1, quota_gpu="4"),
]


@pytest.mark.parametrize("case", CYCLE_CASES, ids=lambda c: c.id)
def test_a_queue_with_checks_reserves_quota_for_a_gang_that_fits_no_node(case: CycleCase) -> None:
    pending = replace(gang("ns/g", case.gpu, "team"), checked=case.checked)
    quotas = setup(
        queue("team", {"cpu": "64", "nvidia.com/gpu": case.quota_gpu}, checks=case.checks)
    )
    view = QuotaView(QuotaTree(quotas))
    result = schedule(
        [pending],
        [SMALL],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=NOW,
        starvation_after=1e9,
        preemption=None,
        quotas=view,
    )
    admits = {a.key: a for a in result.admits}
    if case.want_cluster is None:
        assert admits == {}
        assert [w.key for w in result.waits] == ["ns/g"]
        return
    assert admits["ns/g"].cluster == case.want_cluster
    assert admits["ns/g"].checks == case.want_checks
    assert admits["ns/g"].queue == "team"


def test_capacity_only_work_is_reserved_only_with_capacity_checks() -> None:
    def run(capacity_checks: tuple[str, ...]) -> Any:
        return schedule(
            [gang("ns/g", 1)],
            [SMALL],
            mode=QueueMode.BEST_EFFORT_FIFO,
            now=NOW,
            starvation_after=1e9,
            preemption=None,
            capacity_checks=capacity_checks,
        )

    assert [(a.key, a.cluster, a.checks) for a in run(("prov",)).admits] == [
        ("ns/g", "", ("prov",))
    ]
    assert run(()).admits == ()


def test_a_reservation_takes_the_quota_from_those_behind_it() -> None:
    quotas = setup(queue("team", {"cpu": "64", "nvidia.com/gpu": "8"}, checks=("prov",)))
    result = schedule(
        [gang("ns/a", 1, "team", created_at=1), gang("ns/b", 1, "team", created_at=2)],
        [SMALL],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=NOW,
        starvation_after=1e9,
        preemption=None,
        quotas=QuotaView(QuotaTree(quotas)),
    )
    assert [(a.key, a.cluster) for a in result.admits] == [("ns/a", "")]
    assert [w.key for w in result.waits] == ["ns/b"]
    assert "nvidia.com/gpu" in result.waits[0].message


@dataclass(frozen=True)
class OrderCase:
    id: str
    queued: bool  # both in queue "team" (with quotas), else capacity-only
    fair_sharing: bool = False
    strict: bool = False


ORDER_CASES = [
    OrderCase("capacity only", queued=False),
    OrderCase("in a queue", queued=True),
    OrderCase("in a queue with fair sharing", queued=True, fair_sharing=True),
    OrderCase("in a StrictFIFO queue", queued=True, strict=True),
]


@pytest.mark.parametrize("case", ORDER_CASES, ids=lambda c: c.id)
def test_a_gang_whose_checks_passed_is_fitted_before_the_heads(case: OrderCase) -> None:
    """Room for one gang (the nodes made for `ns/provisioned`): the older, higher-priority
    head `ns/head` comes first in queue order, but the provisioned gang is fitted first and
    takes them; the head waits."""
    room = cluster("c", *[node(f"n{i}", cpu=1, gpu=1) for i in range(9)])
    name = "team" if case.queued else ""
    head = gang("ns/head", 1, name, created_at=1, priority=5)
    provisioned = replace(gang("ns/provisioned", 1, name, created_at=2), checked=True)
    quotas = None
    if case.queued:
        mode = QueueMode.STRICT_FIFO if case.strict else QueueMode.BEST_EFFORT_FIFO
        spec = queue("team", {"cpu": "64", "nvidia.com/gpu": "64"}, strategy=mode)
        quotas = QuotaView(QuotaTree(setup(spec, fair_sharing=case.fair_sharing)))
    result = schedule(
        [head, provisioned],
        [room],
        mode=QueueMode.BEST_EFFORT_FIFO,
        now=NOW,
        starvation_after=1e9,
        preemption=None,
        quotas=quotas,
        presorted=True,
    )
    assert [(a.key, a.cluster) for a in result.admits] == [("ns/provisioned", "c")]
    assert [w.key for w in result.waits] == ["ns/head"]
    assert result.order == ("ns/provisioned", "ns/head")


def test_checked_first_keeps_the_order_within_each_part() -> None:
    a, b, c, d = (replace(gang(f"ns/{k}", 1), checked=k in "bd") for k in ("a", "b", "c", "d"))
    assert checked_first([a, b, c, d]) == ([b, d], [a, c])
    assert checked_first([a, c]) == ([], [a, c])


# -- conditions and phase -------------------------------------------------------------------


def reserved() -> AppWrapperStatus:
    status = AppWrapperStatus()
    cond.initialize(status, priority=0, now=MOMENT)
    admission = Admission(queue="ns/team", clusterQueue="team")
    checkstatus.mark_reserved(status, checks=("prov", "other"), admission=admission, now=MOMENT)
    return status


def raw_phase(status: AppWrapperStatus) -> Phase:
    return phase_of_raw({"metadata": {}, "status": status.model_dump()})


def test_reserved_holds_until_every_check_is_ready_then_goes_back_to_the_fit() -> None:
    status = reserved()
    assert raw_phase(status) is Phase.RESERVED
    assert status.admission is not None
    assert status.admission.clusterQueue == "team"
    assert status.condition("AdmissionCheck.prov").reason == Reason.CHECK_PENDING  # type: ignore[union-attr]
    assert (
        checkstatus.mark_check(status, "prov", Reason.CHECK_READY, "provisioned", now=MOMENT)
        is None
    )
    assert raw_phase(status) is Phase.RESERVED
    assert not checkstatus.checks_ready(status)
    done = checkstatus.mark_check(status, "other", Reason.CHECK_READY, "provisioned", now=MOMENT)
    assert done is not None
    assert done.reason == Reason.CHECKS_READY
    assert raw_phase(status) is Phase.QUEUED
    assert checkstatus.checks_ready(status)
    assert queueing(status)


def test_the_same_check_state_twice_writes_nothing() -> None:
    status = reserved()
    first = checkstatus.mark_check(
        status, "prov", Reason.CHECK_PENDING, "attempt 1 created", now=MOMENT
    )
    again = checkstatus.mark_check(
        status, "prov", Reason.CHECK_PENDING, "attempt 1 created", now=MOMENT
    )
    assert first is not None
    assert again is None


@pytest.mark.parametrize("how", ["retry", "requeue"])
def test_a_retry_or_a_requeue_gives_the_quota_back_and_clears_the_checks(how: str) -> None:
    status = reserved()
    checkstatus.mark_check(status, "prov", Reason.CHECK_READY, "provisioned", now=MOMENT)
    checkstatus.mark_check(status, "other", Reason.CHECK_READY, "provisioned", now=MOMENT)
    if how == "retry":
        checkstatus.retry_checks(status, "booking expired", now=MOMENT)
    else:
        cond.mark_dispatched(status, cluster="c", now=MOMENT)
        cond.mark_requeued(status, Reason.CLUSTER_UNREACHABLE, "gone", now=MOMENT, backoff=False)
    assert raw_phase(status) is Phase.QUEUED
    assert not checkstatus.checks_ready(status)
    assert not status.is_true("AdmissionCheck.prov")
    assert not status.is_true(ConditionType.QUOTA_HELD)


# -- ProvisioningRequest conditions ---------------------------------------------------------


def request(*true: str, message: str = "") -> dict[str, Any]:
    return {
        "metadata": {"name": "r"},
        "status": {
            "conditions": [
                {"type": t, "status": "True", "message": message, "lastTransitionTime": "x"}
                for t in true
            ]
        },
    }


RETRY = Retry(limit=2, base_seconds=10, max_seconds=25)


@dataclass(frozen=True)
class VerdictCase:
    id: str
    request: dict[str, Any]
    want: Step
    attempt: int = 1
    dispatched: bool = False
    failed_at: float | None = None
    refused: int | None = None
    fitting_since: float | None = None
    fit_timeout: float | None = None
    want_after: float = 0.0
    want_in_message: str = ""


VERDICT_CASES = [
    VerdictCase("new", request(), Step.WAIT, want_in_message="waiting for the provisioner"),
    VerdictCase("accepted", request("Accepted"), Step.WAIT, want_in_message="accepted"),
    VerdictCase("provisioned", request("Accepted", "Provisioned"), Step.READY),
    VerdictCase(
        "failed, first: back off 10 s",
        request("Failed", message="no quota"),
        Step.RETRY,
        failed_at=NOW - 4,
        want_after=6.0,
        want_in_message="no quota",
    ),
    VerdictCase(
        "failed, second: 20 s",
        request("Failed"),
        Step.RETRY,
        attempt=2,
        failed_at=NOW,
        want_after=20.0,
    ),
    VerdictCase(
        "failed, backoff over: now",
        request("Failed"),
        Step.RETRY,
        attempt=2,
        failed_at=NOW - 100,
        want_after=0.0,
    ),
    VerdictCase(
        "failed past the limit",
        request("Failed", message="stockout"),
        Step.FAIL,
        attempt=3,
        want_in_message="failed 3 times: stockout",
    ),
    VerdictCase(
        "failed after two asked again for taken nodes: the first refusal",
        request("Failed"),
        Step.RETRY,
        attempt=3,
        refused=1,
        failed_at=NOW,
        want_after=10.0,
        want_in_message="refusal 1 of at most 3",
    ),
    VerdictCase(
        "the third refusal, fifth attempt: fails",
        request("Failed", message="stockout"),
        Step.FAIL,
        attempt=5,
        refused=3,
        want_in_message="failed 3 times: stockout",
    ),
    VerdictCase(
        "provisioned, fitting for 10 s of 30: ready, 20 s left",
        request("Provisioned"),
        Step.READY,
        fitting_since=NOW - 10,
        fit_timeout=30,
        want_after=20.0,
    ),
    VerdictCase(
        "provisioned, not yet fitting: ready",
        request("Provisioned"),
        Step.READY,
        fit_timeout=30,
    ),
    VerdictCase(
        "provisioned, not placed within the fit timeout: asks again",
        request("Provisioned"),
        Step.RESERVE_AGAIN,
        attempt=2,
        fitting_since=NOW - 31,
        fit_timeout=30,
        want_in_message="provisioned (attempt 2), but the nodes were taken before it was placed",
    ),
    VerdictCase(
        "provisioned, fitting but no timeout set: ready",
        request("Provisioned"),
        Step.READY,
        fitting_since=NOW - 1e6,
    ),
    VerdictCase(
        "expired, then fitting past the timeout: expired (no double count)",
        request("Provisioned", "BookingExpired"),
        Step.RESERVE_AGAIN,
        fitting_since=NOW - 31,
        fit_timeout=30,
        want_in_message="expired before dispatch",
    ),
    VerdictCase(
        "expired before dispatch",
        request("Provisioned", "BookingExpired"),
        Step.RESERVE_AGAIN,
        want_in_message="expired before dispatch",
    ),
    VerdictCase(
        "expired after dispatch: nothing to do",
        request("Provisioned", "BookingExpired"),
        Step.WAIT,
        dispatched=True,
    ),
    VerdictCase(
        "revoked before dispatch", request("Provisioned", "CapacityRevoked"), Step.RESERVE_AGAIN
    ),
    VerdictCase(
        "revoked after dispatch",
        request("Provisioned", "CapacityRevoked"),
        Step.REVOKED,
        dispatched=True,
    ),
]


@pytest.mark.parametrize("case", VERDICT_CASES, ids=lambda c: c.id)
def test_verdict(case: VerdictCase) -> None:
    got = checks.verdict(
        case.request,
        attempt=case.attempt,
        retry=RETRY,
        now=NOW,
        failed_at=case.failed_at,
        dispatched=case.dispatched,
        refused=case.refused,
        fitting_since=case.fitting_since,
        fit_timeout=case.fit_timeout,
    )
    assert got.step is case.want
    assert got.after == case.want_after
    assert case.want_in_message in got.message


def test_backoff_doubles_and_is_capped() -> None:
    assert [RETRY.backoff(a) for a in (1, 2, 3, 4)] == [10.0, 20.0, 25.0, 25.0]


def test_only_refused_requests_of_the_check_count_towards_the_limit() -> None:
    def labelled(check: str, attempt: int, *true: str) -> dict[str, Any]:
        made = request(*true)
        made["metadata"]["labels"] = {checks.CHECK_LABEL: check, checks.ATTEMPT_LABEL: attempt}
        return made

    requests = [
        labelled("prov", 1, "Failed"),
        labelled("prov", 2, "Provisioned"),  # asked again: its nodes were taken
        labelled("prov", 3, "Provisioned", "BookingExpired"),
        labelled("prov", 4, "Failed"),
        labelled("other", 1, "Failed"),
    ]
    assert checks.refusals(requests, "prov") == 2
    assert checks.refusals(requests, "other") == 1
    assert checks.refusals([], "prov") == 0


def test_names_are_fixed_by_uid_check_and_attempt() -> None:
    assert checks.request_name("u-1", "prov", 2) == "aw-u-1-prov-2"
    assert checks.template_name("u-1", "prov", 2, 0) == "aw-u-1-prov-2-ps0"
    labelled = [
        {"metadata": {"labels": {checks.CHECK_LABEL: "prov", checks.ATTEMPT_LABEL: n}}}
        for n in ("1", "3", "2")
    ]
    other = {"metadata": {"labels": {checks.CHECK_LABEL: "x", checks.ATTEMPT_LABEL: "9"}}}
    assert checks.latest_round([*labelled, other], "prov") == 3
    assert checks.latest_round([], "prov") == 0


def test_request_objects_are_owned_and_name_their_templates() -> None:
    worker = pods(
        8, gpu=1, selector={"pool": "gpu"}, tolerations=(Toleration(key="gpu", operator="Exists"),)
    )
    templates, request_ = checks.request_objects(
        namespace="ns",
        owner={
            "apiVersion": "workload.codeflare.dev/v1beta1",
            "kind": "AppWrapper",
            "name": "g",
            "uid": "u-1",
        },
        check="prov",
        attempt=1,
        provisioning_class=checks.BEST_EFFORT_ATOMIC,
        parameters={"ValidUntilSeconds": "60"},
        pod_sets=[checks.template_of(pods(1, cpu=1)), checks.template_of(worker)],
    )
    assert [t["metadata"]["name"] for t in templates] == ["aw-u-1-prov-1-ps0", "aw-u-1-prov-1-ps1"]
    assert request_["spec"]["podSets"] == [
        {"podTemplateRef": {"name": "aw-u-1-prov-1-ps0"}, "count": 1},
        {"podTemplateRef": {"name": "aw-u-1-prov-1-ps1"}, "count": 8},
    ]
    assert request_["spec"]["provisioningClassName"] == checks.BEST_EFFORT_ATOMIC
    assert request_["spec"]["parameters"] == {"ValidUntilSeconds": "60"}
    for made in (*templates, request_):
        assert made["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert made["metadata"]["labels"][checks.UID_LABEL] == "u-1"
    spec = templates[1]["template"]["spec"]
    assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    head = templates[0]["template"]["spec"]["containers"][0]["resources"]
    assert head == {"requests": {"cpu": "1"}}
    assert spec["nodeSelector"] == {"pool": "gpu"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
