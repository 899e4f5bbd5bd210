"""The AppWrapper pydantic models (dispatcher/api/models.py): MCAD YAML, defaults, bad values."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from dispatcher.api.models import (
    API_VERSION,
    KIND,
    AppWrapper,
    AppWrapperState,
    AppWrapperStatus,
    Condition,
    ConditionType,
    CustomPodResource,
    GenericItem,
    Reason,
    format_micro_time,
    parse_time,
    status_to_kube,
)
from dispatcher.api.quantity import QuantityError
from dispatcher.api.resources import Resources

MCAD_LEGACY = """
apiVersion: workload.codeflare.dev/v1beta1
kind: AppWrapper
metadata:
  name: legacy
  namespace: team-a
spec:
  priority: 5
  priorityslope: 0.0
  service:
    spec: {}
  schedulingSpec:
    minAvailable: 1
    nodeSelector:
      zone: a
    requeuing:
      initialTimeInSeconds: 60
      timeInSeconds: 60
      pauseTimeInSeconds: 90
      maxTimeInSeconds: 600
      growthType: linear
      numRequeuings: 0
      maxNumRequeuings: 4
    dispatchDuration:
      expected: 100
      limit: 3600
      overrun: false
  resources:
    Items: []
    GenericItems:
      - replicas: 1
        minavailable: 1
        allocated: 0
        priority: 0
        priorityslope: 0.0
        metadata:
          name: legacy-item
        completionstatus: Complete, Failed
        custompodresources:
          - replicas: 1
            requests:
              cpu: 500m
              memory: 1Gi
              nvidia.com/gpu: 1
            limits:
              cpu: 500m
              memory: 1Gi
              nvidia.com/gpu: 1
        generictemplate:
          apiVersion: v1
          kind: Pod
          metadata:
            name: legacy-pod
          spec:
            containers:
              - name: c
                image: busybox
"""


def minimal(**spec: Any) -> dict[str, Any]:
    """Builder: the smallest valid AppWrapper object, with `spec` merged in."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": "aw", "namespace": "ns"},
        "spec": spec,
    }


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}


def item(**fields: Any) -> dict[str, Any]:
    return {"generictemplate": copy.deepcopy(POD), **fields}


# -- MCAD YAML ---------------------------------------------------------------------------------


def test_mcad_legacy_yaml_parses() -> None:
    aw = AppWrapper.from_kube(yaml.safe_load(MCAD_LEGACY))
    assert aw.key == "team-a/legacy"
    assert aw.spec.priority == 5
    sched = aw.spec.schedulingSpec
    assert sched.minAvailable == 1
    assert sched.requeuing.timeInSeconds == 60
    assert sched.requeuing.growthType == "linear"
    assert sched.requeuing.maxNumRequeuings == 4
    assert sched.dispatchDuration.limit == 3600
    assert aw.spec.resources.legacy_items == []
    (generic,) = aw.spec.items
    assert generic.generictemplate["kind"] == "Pod"
    assert generic.completion_conditions() == ("Complete", "Failed")
    assert generic.custompodresources is not None
    (pods,) = generic.custompodresources
    assert pods.replicas == 1
    assert pods.effective_requests() == Resources.parse(
        {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1}
    )


def test_generictemplate_is_kept_as_is() -> None:
    template = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "glue", "labels": {"a": "b"}},
        "spec": {"rayVersion": "2.9.0", "anything": [1, {"deep": None}]},
    }
    aw = AppWrapper.from_kube(minimal(resources={"GenericItems": [{"generictemplate": template}]}))
    assert aw.spec.items[0].generictemplate == template
    assert aw.to_kube()["spec"]["resources"]["GenericItems"][0]["generictemplate"] == template


def test_unknown_fields_on_generic_items_are_kept() -> None:
    aw = AppWrapper.from_kube(minimal(resources={"GenericItems": [item(oddField={"x": 1})]}))
    assert aw.spec.items[0].model_extra == {"oddField": {"x": 1}}


def test_python_names_and_wire_names_both_accepted() -> None:
    by_alias = AppWrapper.from_kube(minimal(resources={"GenericItems": [item()]}))
    by_name = AppWrapper.from_kube(minimal(resources={"generic_items": [item()]}))
    assert by_alias == by_name
    assert "GenericItems" in by_name.to_kube()["spec"]["resources"]


# -- defaults ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "want"),
    [
        pytest.param("spec.priority", 0, id="priority"),
        pytest.param("spec.priorityClassName", None, id="priority-class"),
        pytest.param("spec.preemptible", True, id="preemptible"),
        pytest.param("spec.items", [], id="no-items"),
        pytest.param("spec.schedulingSpec.minAvailable", None, id="min-available"),
        pytest.param("spec.schedulingSpec.requeuing.timeInSeconds", 300, id="requeue-time"),
        pytest.param("spec.schedulingSpec.requeuing.maxTimeInSeconds", 0, id="requeue-max-time"),
        pytest.param("spec.schedulingSpec.requeuing.growthType", "exponential", id="growth"),
        pytest.param("spec.schedulingSpec.requeuing.maxNumRequeuings", 0, id="max-requeues"),
        pytest.param("spec.schedulingSpec.dispatchDuration.limit", None, id="duration-limit"),
        pytest.param("spec.schedulingSpec.clusterScheduling", None, id="cluster-scheduling"),
        pytest.param("status", None, id="no-status"),
        pytest.param("metadata.labels", {}, id="labels"),
    ],
)
def test_defaults_when_spec_is_empty(path: str, want: Any) -> None:
    value: Any = AppWrapper.from_kube(minimal())
    for part in path.split("."):
        value = getattr(value, part)
    assert value == want


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(minimal(), id="empty-spec"),
        pytest.param(minimal(resources={}), id="empty-resources"),
        pytest.param(minimal(resources={"GenericItems": []}), id="empty-items"),
        pytest.param({k: v for k, v in minimal().items() if k != "spec"}, id="no-spec"),
    ],
)
def test_appwrapper_without_items_is_valid(obj: dict[str, Any]) -> None:
    assert AppWrapper.from_kube(obj).spec.items == []


def test_empty_status_defaults() -> None:
    status = AppWrapper.from_kube({**minimal(), "status": {}}).status
    assert status == AppWrapperStatus()
    assert (status.pending, status.running, status.succeeded, status.failed) == (0, 0, 0, 0)
    assert status.requeueCount == 0
    assert status.conditions == []


# -- bad values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "want_loc"),
    [
        pytest.param(minimal(priority="high"), "spec.priority", id="priority-string"),
        pytest.param(minimal(priority=1.5), "spec.priority", id="priority-float"),
        pytest.param(minimal(priority=True), "spec.priority", id="priority-bool"),
        pytest.param(minimal(preemptible="yes"), "spec.preemptible", id="preemptible-string"),
        pytest.param(
            minimal(schedulingSpec={"minAvailable": -1}),
            "spec.schedulingSpec.minAvailable",
            id="min-available-negative",
        ),
        pytest.param(
            minimal(schedulingSpec={"requeuing": {"growthType": "quadratic"}}),
            "spec.schedulingSpec.requeuing.growthType",
            id="growth-type",
        ),
        pytest.param(
            minimal(schedulingSpec={"requeuing": {"timeInSeconds": -5}}),
            "spec.schedulingSpec.requeuing.timeInSeconds",
            id="requeue-time-negative",
        ),
        pytest.param(
            minimal(schedulingSpec={"dispatchDuration": {"limit": "1h"}}),
            "spec.schedulingSpec.dispatchDuration.limit",
            id="duration-not-int",
        ),
        pytest.param(
            minimal(schedulingSpec={"clusterScheduling": {"clusters": [{}]}}),
            "spec.schedulingSpec.clusterScheduling.clusters.0.name",
            id="cluster-without-name",
        ),
        pytest.param(
            minimal(resources={"GenericItems": [{"generictemplate": "kind: Pod"}]}),
            "spec.resources.GenericItems.0.generictemplate",
            id="template-not-object",
        ),
        pytest.param(
            minimal(resources={"GenericItems": [item(custompodresources=[{"replicas": -1}])]}),
            "spec.resources.GenericItems.0.custompodresources.0.replicas",
            id="replicas-negative",
        ),
        pytest.param(
            minimal(resources={"GenericItems": [item(custompodresources=[{"requests": {}}])]}),
            "spec.resources.GenericItems.0.custompodresources.0.replicas",
            id="replicas-missing",
        ),
        pytest.param(
            minimal(
                resources={
                    "GenericItems": [
                        item(custompodresources=[{"replicas": 1, "requests": {"cpu": [1]}}])
                    ]
                }
            ),
            "spec.resources.GenericItems.0.custompodresources.0.requests.cpu",
            id="request-not-scalar",
        ),
        pytest.param({**minimal(), "kind": "Job"}, "kind", id="wrong-kind"),
        pytest.param(
            {**minimal(), "apiVersion": "mcad.ibm.com/v1beta1"}, "apiVersion", id="wrong-group"
        ),
        pytest.param(
            {**minimal(), "status": {"conditions": [{"type": "Running", "status": "Yes"}]}},
            "status.conditions.0.status",
            id="condition-status",
        ),
        pytest.param(
            {**minimal(), "status": {"running": -1}}, "status.running", id="negative-count"
        ),
    ],
)
def test_bad_values_are_rejected(obj: dict[str, Any], want_loc: str) -> None:
    with pytest.raises(ValidationError) as excinfo:
        AppWrapper.from_kube(obj)
    locs = {".".join(str(p) for p in error["loc"]) for error in excinfo.value.errors()}
    assert any(loc.startswith(want_loc) for loc in locs), locs


def test_malformed_quantity_fails_when_parsed_with_a_clear_message() -> None:
    pods = CustomPodResource(replicas=1, requests={"cpu": "4 GB"})
    with pytest.raises(QuantityError, match=r"cpu: malformed quantity '4 GB'"):
        pods.effective_requests()


@pytest.mark.parametrize(
    ("requests", "limits", "want"),
    [
        pytest.param({"cpu": 1}, None, {"cpu": 1000}, id="requests-only"),
        pytest.param({}, {"cpu": 2}, {"cpu": 2000}, id="limit-defaults-request"),
        pytest.param({"cpu": 1}, {"cpu": 2}, {"cpu": 1000}, id="request-wins"),
        pytest.param({}, None, {}, id="nothing"),
    ],
)
def test_effective_requests(
    requests: dict[str, Any], limits: dict[str, Any] | None, want: dict[str, int]
) -> None:
    pods = CustomPodResource(replicas=1, requests=requests, limits=limits)
    assert pods.effective_requests() == want


@pytest.mark.parametrize(
    ("completionstatus", "want"),
    [
        pytest.param(None, (), id="unset"),
        pytest.param("", (), id="empty"),
        pytest.param("Complete", ("Complete",), id="one"),
        pytest.param(" Complete ,Failed,", ("Complete", "Failed"), id="spaces-and-trailing-comma"),
    ],
)
def test_completion_conditions(completionstatus: str | None, want: tuple[str, ...]) -> None:
    generic = GenericItem(generictemplate=POD, completionstatus=completionstatus)
    assert generic.completion_conditions() == want


# -- status ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        pytest.param("Running", AppWrapperState.RUNNING, id="known"),
        pytest.param("Completed", AppWrapperState.COMPLETED, id="completed"),
        pytest.param(
            "RunningHoldCompletion",
            AppWrapperState.RUNNING_HOLD_COMPLETION,
            id="mcad-hold-completion",
        ),
        pytest.param("", None, id="empty"),
        pytest.param("SomethingElse", None, id="unknown-reads-as-unset"),
    ],
)
def test_status_state(raw: str, want: AppWrapperState | None) -> None:
    assert AppWrapperStatus.model_validate({"state": raw}).state == want


def test_status_round_trips_through_kube() -> None:
    now = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    status = AppWrapperStatus(
        state=AppWrapperState.RUNNING,
        stage=ConditionType.RUNNING,
        conditions=[
            Condition(
                type=ConditionType.DISPATCHED,
                status="True",
                reason=Reason.DISPATCHED,
                message="dispatched to cluster hub",
                lastTransitionMicroTime=format_micro_time(now),
                lastUpdateMicroTime=format_micro_time(now),
            ),
        ],
        clusterName="hub",
        running=3,
        requeueCount=1,
        queuedAt=format_micro_time(now),
        priority=10,
    )
    raw = status_to_kube(status)
    assert raw == {
        "state": "Running",
        "stage": "Running",
        "conditions": [
            {
                "type": "Dispatched",
                "status": "True",
                "reason": "AppWrapperRunnable",
                "message": "dispatched to cluster hub",
                "lastTransitionMicroTime": "2024-05-01T12:00:00.123456Z",
                "lastUpdateMicroTime": "2024-05-01T12:00:00.123456Z",
            }
        ],
        "clusterName": "hub",
        "pending": 0,
        "running": 3,
        "succeeded": 0,
        "failed": 0,
        "requeueCount": 1,
        "queuedAt": "2024-05-01T12:00:00.123456Z",
        "priority": 10,
        # MCAD's names for the same facts, derived at the write; dropped when read.
        "canrun": True,
        "isdispatched": True,
        "queuejobstate": "Running",
        "controllerfirsttimestamp": "2024-05-01T12:00:00.123456Z",
        "numberOfRequeueings": 1,
        "systempriority": 10.0,
    }
    assert AppWrapperStatus.model_validate(raw) == status


def test_condition_lookup() -> None:
    status = AppWrapperStatus(
        conditions=[
            Condition(type="Init", status="True", reason="Created"),
            Condition(type="Running", status="False", reason="PodsNotReady"),
            Condition(type="PreemptCandidate", status="True"),  # written by MCAD: still parses
        ]
    )
    assert status.is_true(ConditionType.INIT)
    assert not status.is_true(ConditionType.RUNNING)
    assert not status.is_true(ConditionType.COMPLETED)
    found = status.condition(ConditionType.RUNNING)
    assert found is not None
    assert found.reason == Reason.PODS_NOT_READY


@pytest.mark.parametrize(
    ("moment", "want"),
    [
        pytest.param(
            datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), "2024-01-02T03:04:05.000000Z", id="utc"
        ),
        pytest.param(
            datetime(2024, 1, 2, 3, 4, 5, 6), "2024-01-02T03:04:05.000006Z", id="naive-is-utc"
        ),
        pytest.param(
            datetime(2024, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2))),
            "2024-01-02T03:04:05.000000Z",
            id="offset-converted",
        ),
    ],
)
def test_format_micro_time(moment: datetime, want: str) -> None:
    assert format_micro_time(moment) == want
    assert parse_time(want) == moment.replace(tzinfo=moment.tzinfo or UTC)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("2024-01-02T03:04:05Z", id="seconds"),
        pytest.param("2024-01-02T03:04:05.000000Z", id="micro"),
        pytest.param("2024-01-02T03:04:05+00:00", id="offset"),
    ],
)
def test_parse_time(text: str) -> None:
    assert parse_time(text) == datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("enum", "want"),
    [
        pytest.param(
            AppWrapperState,
            ["Pending", "Running", "RunningHoldCompletion", "Completed", "Failed", "Deleted"],
            id="states",
        ),
        pytest.param(
            ConditionType,
            [
                "Init",
                "Queueing",
                "HeadOfLine",
                "Backoff",
                "Dispatched",
                "Running",
                "Completed",
                "Failed",
                "Preempted",
                "Requeued",
                "QuotaHeld",
            ],
            id="condition-types",
        ),
    ],
)
def test_enum_values(enum: Any, want: list[str]) -> None:
    assert [member.value for member in enum] == want
    assert all(isinstance(member, str) for member in enum)


def test_to_kube_leaves_out_unset_fields() -> None:
    raw = AppWrapper.from_kube(minimal()).to_kube()
    assert "status" not in raw
    assert "priorityClassName" not in raw["spec"]
    assert raw["apiVersion"] == API_VERSION
    assert raw["kind"] == KIND


def test_editable_copy_leaves_the_original_alone() -> None:
    original = AppWrapperStatus.model_validate(
        {
            "state": "Pending",
            "conditions": [{"type": "Init", "status": "True", "reason": "Created"}],
            "futureField": {"kept": True},
        }
    )
    edited = original.editable_copy()
    edited.conditions[0].status = "False"
    edited.conditions.append(edited.conditions[0].model_copy(update={"type": "Queueing"}))
    edited.pending = 3
    assert original.conditions[0].status == "True"
    assert len(original.conditions) == 1
    assert original.pending == 0
    assert edited == edited.editable_copy()
