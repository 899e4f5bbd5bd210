"""DRA resource claims in wrapped objects are refused until they are charged
(core/resourceclaims.py): wherever a pod spec asks for devices through claims, in either
AppWrapper generation and in MCAD's form, and the claim kinds themselves."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest

from dispatcher.api.models import AppWrapper
from dispatcher.core.convert import to_v1beta1
from dispatcher.core.resourceclaims import NOT_CHARGED, claim_problems
from dispatcher.core.validation import (
    DEFAULT_ALLOWED_KINDS,
    DEFAULT_CLUSTER_SCOPED,
    validate_appwrapper,
    validate_item,
)
from dispatcher.core.workloads import InvalidSpec, workload_of
from tests.unit.builders import (
    container,
    deployment,
    job,
    obj,
    pod,
    pod_spec,
    pod_template,
    pytorch_job,
    ray_cluster,
    ray_job,
    worker_group,
)

CLAIM = [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]
GPU = {"nvidia.com/gpu": "8"}


def claiming(*, pod_claims: Any = CLAIM, container_claims: Any = None) -> dict[str, Any]:
    """A pod spec asking for devices through claims (spec and/or container)."""
    main = container("main", requests={"cpu": "1"})
    if container_claims is not None:
        main["resources"]["claims"] = container_claims
    spec = pod_spec(main)
    if pod_claims is not None:
        spec["resourceClaims"] = pod_claims
    return spec


def cron_job(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": pod_template(spec)}}}
    return obj("CronJob", name, api_version="batch/v1", spec=body)


def job_set(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A kind the dispatcher cannot read pods from (declared by custompodresources)."""
    replicated = {"name": "w", "template": {"spec": {"template": pod_template(spec)}}}
    return obj(
        "JobSet",
        name,
        api_version="jobset.x-k8s.io/v1alpha2",
        spec={"replicatedJobs": [replicated]},
    )


def ray_service(name: str, worker: dict[str, Any]) -> dict[str, Any]:
    cluster = ray_cluster(name, None, worker_group("gpu", worker))["spec"]
    return obj("RayService", name, api_version="ray.io/v1", spec={"rayClusterConfig": cluster})


def ray_job_submitter(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    made = ray_job(name)
    made["spec"]["submitterPodTemplate"] = pod_template(spec)
    return made


def resource_object(kind: str) -> dict[str, Any]:
    return obj(kind, "c", api_version="resource.k8s.io/v1", spec={"devices": {"requests": []}})


ITEM_CASES: list[Any] = [
    pytest.param(pod("p", claiming()), ["spec.resourceClaims"], id="pod-spec-claims"),
    pytest.param(
        pod("p", claiming(pod_claims=None, container_claims=[{"name": "gpus"}])),
        ["spec.containers[0].resources.claims"],
        id="pod-container-claims",
    ),
    pytest.param(
        pod(
            "p",
            pod_spec(container(), init=({"name": "i", "resources": {"claims": [{"name": "g"}]}},)),
        ),
        ["spec.initContainers[0].resources.claims"],
        id="init-container-claims",
    ),
    pytest.param(
        pod("p", claiming(container_claims=[{"name": "gpus"}])),
        ["spec.resourceClaims, spec.containers[0].resources.claims"],
        id="both-named",
    ),
    pytest.param(
        deployment("web", claiming()), ["spec.template.spec.resourceClaims"], id="deployment"
    ),
    pytest.param(job("train", claiming()), ["spec.template.spec.resourceClaims"], id="job"),
    pytest.param(
        ray_cluster("rc", None, worker_group("cpu"), worker_group("gpu", claiming())),
        ["spec.workerGroupSpecs[1].template.spec.resourceClaims"],
        id="raycluster-worker-group",
    ),
    pytest.param(
        ray_cluster("rc", claiming()),
        ["spec.headGroupSpec.template.spec.resourceClaims"],
        id="raycluster-head",
    ),
    pytest.param(
        ray_job("rj", None, worker_group("gpu", claiming())),
        ["spec.rayClusterSpec.workerGroupSpecs[0].template.spec.resourceClaims"],
        id="rayjob-cluster",
    ),
    pytest.param(
        ray_job_submitter("rj", claiming()),
        ["spec.submitterPodTemplate.spec.resourceClaims"],
        id="rayjob-submitter",
    ),
    pytest.param(
        ray_service("rs", claiming()),
        ["spec.rayClusterConfig.workerGroupSpecs[0].template.spec.resourceClaims"],
        id="rayservice",
    ),
    pytest.param(
        pytorch_job("pt", None, claiming()),
        ["spec.pytorchReplicaSpecs.Worker.template.spec.resourceClaims"],
        id="pytorchjob-worker",
    ),
    pytest.param(
        cron_job("nightly", claiming()),
        ["spec.jobTemplate.spec.template.spec.resourceClaims"],
        id="cronjob",
    ),
    pytest.param(
        job_set("js", claiming()),
        ["spec.replicatedJobs[0].template.spec.template.spec.resourceClaims"],
        id="any-kind-any-depth",
    ),
    pytest.param(
        pod("p", {**pod_spec(*(container(f"c{i}") for i in range(5)))}),
        [],
        id="no-claims",
    ),
    pytest.param(pod("p", claiming(pod_claims=[])), [], id="empty-list-asks-nothing"),
    pytest.param(pod("p", claiming(pod_claims=None, container_claims=[])), [], id="empty-claims"),
    pytest.param(
        pod("p", pod_spec(container("main", requests=GPU))), [], id="extended-resource-gpu"
    ),
]


def with_many_claims() -> dict[str, Any]:
    spec = pod_spec(*(container(f"c{i}") for i in range(5)))
    for c in spec["containers"]:
        c["resources"]["claims"] = [{"name": "g"}]
    return pod("p", spec)


ITEM_CASES.append(
    pytest.param(
        with_many_claims(),
        [
            "spec.containers[0].resources.claims, spec.containers[1].resources.claims, "
            "spec.containers[2].resources.claims and 2 more"
        ],
        id="many-fields-counted",
    )
)


@pytest.mark.parametrize(("template", "want_fields"), ITEM_CASES)
def test_claims_in_pod_specs(template: dict[str, Any], want_fields: list[str]) -> None:
    want = [f"{fields}: {NOT_CHARGED}" for fields in want_fields]
    # Whatever the allow-list: no list, and the default one (where the kind is allowed).
    assert claim_problems(template) == want
    for allowed in (None, DEFAULT_ALLOWED_KINDS | {"CronJob", "JobSet"}):
        errors = validate_item(
            template,
            namespace="team-a",
            allowed_kinds=allowed,
            cluster_scoped_kinds=DEFAULT_CLUSTER_SCOPED,
        )
        assert errors == want


@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
@pytest.mark.parametrize(
    "allowed",
    [
        pytest.param(None, id="every-kind-allowed"),
        pytest.param(DEFAULT_ALLOWED_KINDS, id="default-list"),
        pytest.param(
            DEFAULT_ALLOWED_KINDS | {"ResourceClaim", "ResourceClaimTemplate"}, id="listed"
        ),
    ],
)
def test_claim_kinds_are_refused_whatever_the_allow_list(
    kind: str, allowed: frozenset[str] | None
) -> None:
    assert {"ResourceClaim", "ResourceClaimTemplate"}.isdisjoint(DEFAULT_ALLOWED_KINDS)
    errors = validate_item(
        resource_object(kind),
        namespace="team-a",
        allowed_kinds=allowed,
        cluster_scoped_kinds=DEFAULT_CLUSTER_SCOPED,
    )
    assert errors == [f"kind {kind}: {NOT_CHARGED}"]


def test_the_message_names_the_item_and_field() -> None:
    items = [
        obj("Service", "head"),
        ray_cluster("rc", None, worker_group("gpu", claiming())),
        resource_object("ResourceClaimTemplate"),
    ]
    assert validate_appwrapper(items, namespace="team-a") == [
        "item 1 (RayCluster/rc): spec.workerGroupSpecs[0].template.spec.resourceClaims: "
        + NOT_CHARGED,
        f"item 2 (ResourceClaimTemplate/c): kind ResourceClaimTemplate: {NOT_CHARGED}",
    ]


def v1beta1(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "team-a", "uid": "u"},
        "spec": {"resources": {"GenericItems": items}},
    }


def v1beta2(components: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "team-a", "uid": "u"},
        "spec": {"components": components},
    }


GPU_WORKERS = ray_cluster("rc", None, worker_group("gpu", claiming(), replicas=2))
FIELD = "spec.workerGroupSpecs[0].template.spec.resourceClaims"

APPWRAPPER_CASES: list[Any] = [
    pytest.param(v1beta1([{"generictemplate": GPU_WORKERS}]), id="v1beta1-inferred"),
    pytest.param(
        v1beta1(
            [
                {
                    "generictemplate": GPU_WORKERS,
                    "custompodresources": [{"replicas": 2, "requests": {"cpu": "1"}}],
                }
            ]
        ),
        id="mcad-custompodresources",
    ),
    pytest.param(
        v1beta1([{"generictemplate": GPU_WORKERS, "custompodresources": []}]),
        id="mcad-declares-no-pods",
    ),
    pytest.param(to_v1beta1(v1beta2([{"template": GPU_WORKERS}])), id="v1beta2-inferred"),
    pytest.param(
        to_v1beta1(
            v1beta2(
                [
                    {
                        "template": GPU_WORKERS,
                        "podSets": [
                            {"path": "template.spec.workerGroupSpecs[0].template", "replicas": 2}
                        ],
                    }
                ]
            )
        ),
        id="v1beta2-declared-pod-sets",
    ),
]


@pytest.mark.parametrize("raw", APPWRAPPER_CASES)
def test_appwrapper_with_claims_is_invalid_in_every_form(raw: dict[str, Any]) -> None:
    """What the webhook answers at apply and the reconciler fails a stored one with
    (InvalidSpec): both read the AppWrapper through `workload_of`."""
    result = workload_of(
        AppWrapper.from_kube(copy.deepcopy(raw)),
        priority=0,
        allowed_kinds=DEFAULT_ALLOWED_KINDS,
        now=datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert isinstance(result, InvalidSpec)
    assert result.message == f"item 0 (RayCluster/rc): {FIELD}: {NOT_CHARGED}"
