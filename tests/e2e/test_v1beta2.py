"""AppWrapper v1beta2 beside v1beta1 on the real API server: conversion through the API
server (its webhook is testenv/converter.py, the dispatcher's /convert alone,
for the session), an upgrade from a v1beta1-only CRD, and v1beta2 AppWrappers run by the
dispatcher, read back as v1beta1."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.api.names import generated_name
from dispatcher.core.convert import V1BETA1_FIELDS
from dispatcher.core.gatekeeping import SIGNATURE, USER
from testenv.converter import crd_calling, v1beta1_only
from testenv.kubectl import KubectlError
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    CRD,
    QUIET_SECONDS,
    apply,
    apply_crd,
    appwrapper,
    deployment,
    job,
    pods_of,
    service,
)
from tests.e2e.test_security import Secure, pod, secure  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.cluster]

V1 = "appwrappers.v1beta1.workload.codeflare.dev"
V2 = "appwrappers.v1beta2.workload.codeflare.dev"
VOLATILE = ("resourceVersion", "managedFields", "generation", "creationTimestamp", "uid")


async def read(cluster: Any, resource: str, namespace: str, name: str) -> dict[str, Any]:
    out = await cluster.akubectl("get", resource, name, "-n", namespace, "-o", "json")
    return dict(json.loads(out.stdout))


def stable(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` without the fields the API server changes on every write."""
    metadata = {k: v for k, v in obj["metadata"].items() if k not in VOLATILE}
    return {**obj, "metadata": metadata}


def v1beta2_app(name: str, *, suspend: bool | None = None, cpu: str = "100m") -> dict[str, Any]:
    """A v1beta2 AppWrapper of a Deployment (its pods keep running, unlike a Job's)."""
    spec: dict[str, Any] = {"components": [{"template": deployment(name, 1, {"cpu": cpu})}]}
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name},
        "spec": spec,
    }


async def test_conversion_round_trips_through_the_api_server(
    cluster: Any, namespace: str, appwrapper_crd: None
) -> None:
    # Written in v1beta1 with MCAD's fields and a status; read as v1beta2 and back.
    old = appwrapper("mcad", job("mcad", 1, {"cpu": "1"}), priority=7, completion="Complete")
    old["spec"]["schedulingSpec"] = {"minAvailable": 1}
    await apply(cluster, namespace, old)
    await cluster.akubectl(
        "patch", V1, "mcad", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"state": "Pending", "requeueCount": 2}}),
    )  # fmt: skip
    before = await read(cluster, V1, namespace, "mcad")
    as_v2 = await read(cluster, V2, namespace, "mcad")
    assert as_v2["spec"]["components"] == [
        {"template": old["spec"]["resources"]["GenericItems"][0]["generictemplate"]}
    ]
    kept = json.loads(as_v2["metadata"]["annotations"][V1BETA1_FIELDS])
    assert kept["priority"] == 7
    assert kept["schedulingSpec"] == {"minAvailable": 1}
    assert (as_v2["status"]["phase"], as_v2["status"]["state"]) == ("Suspended", "Pending")
    assert as_v2["status"]["resettingCount"] == 2

    # A change made through v1beta2 (a label) keeps every v1beta1 field and the status.
    await cluster.akubectl("label", V2, "mcad", "-n", namespace, "edited=yes")
    after = await read(cluster, V1, namespace, "mcad")
    assert after["metadata"]["labels"]["edited"] == "yes"
    after["metadata"]["labels"].pop("edited")
    if not after["metadata"]["labels"]:
        after["metadata"].pop("labels")
    assert stable(after) == stable(before)

    # Written in v1beta2 with fields v1beta1 names otherwise; read as v1beta1 and back.
    new = v1beta2_app("fresh", suspend=True)
    new["spec"]["managedBy"] = "example.com/other"
    new["spec"]["components"][0]["podSetInfos"] = [{"labels": {"team": "a"}}]
    await apply(cluster, namespace, new)
    as_v1 = await read(cluster, V1, namespace, "fresh")
    item = as_v1["spec"]["resources"]["GenericItems"][0]
    assert item["podSetInfos"] == [{"labels": {"team": "a"}}]
    assert as_v1["spec"]["suspend"] is True
    assert (
        "example.com/other"
        in as_v1["metadata"]["annotations"]["workload.codeflare.dev/v1beta2-fields"]
    )
    again = await read(cluster, V2, namespace, "fresh")
    assert again["spec"] == new["spec"]


async def test_upgrade_from_a_v1beta1_only_crd_keeps_every_object(
    cluster: Any, namespace: str, appwrapper_crd: None, converter: Any
) -> None:
    full = crd_calling(CRD, converter.url, converter.ca_bundle)
    try:
        apply_crd(cluster, v1beta1_only(CRD))
        names = [f"old-{i}" for i in range(3)]
        for name in names:
            await apply(
                cluster, namespace, appwrapper(name, job(name, 1, {"cpu": "1"}), priority=1)
            )
        stored = {n: stable(await read(cluster, V1, namespace, n)) for n in names}
    finally:
        apply_crd(cluster, full)
    for name in names:
        assert stable(await read(cluster, V1, namespace, name)) == stored[name]
        as_v2 = await read(cluster, V2, namespace, name)
        assert as_v2["spec"]["components"][0]["template"]["metadata"]["name"] == name
    listed = json.loads((await cluster.akubectl("get", V2, "-n", namespace, "-o", "json")).stdout)
    assert sorted(i["metadata"]["name"] for i in listed["items"]) == names


async def wait_phase(
    cluster: Any, namespace: str, name: str, phase: str, timeout: int = 60
) -> None:
    """As a v1beta2 user waits: on the preferred version, by jsonpath."""
    await cluster.akubectl(
        "wait", "-n", namespace, f"--for=jsonpath={{.status.phase}}={phase}",
        f"appwrapper/{name}", f"--timeout={timeout}s", timeout=timeout + 15,
    )  # fmt: skip


async def test_a_v1beta2_job_runs_and_reads_back_as_v1beta1(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any
) -> None:
    fake_nodes.add("n", cpu="4", memory="8Gi")
    await run_dispatcher()
    await apply(cluster, namespace, v1beta2_app("v2job"))
    await wait_phase(cluster, namespace, "v2job", "Running")
    as_v1 = await read(cluster, V1, namespace, "v2job")
    assert as_v1["status"]["state"] == "Running"
    assert {c["type"] for c in as_v1["status"]["conditions"] if c["status"] == "True"} >= {
        "Dispatched",
        "Running",
    }
    as_v2 = await read(cluster, V2, namespace, "v2job")
    ready = {c["type"]: c["status"] for c in as_v2["status"]["conditions"]}
    assert ready["QuotaReserved"] == ready["ResourcesDeployed"] == ready["PodsReady"] == "True"
    pods = await pods_of(cluster, namespace, "v2job")
    assert pods
    assert all(
        p["metadata"]["labels"]["workload.codeflare.dev/appwrapper"] == "v2job" for p in pods
    )


async def test_suspended_waits_and_unsuspended_runs_and_suspending_removes(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any
) -> None:
    fake_nodes.add("n", cpu="4", memory="8Gi")
    await run_dispatcher()
    await apply(cluster, namespace, v1beta2_app("held", suspend=True))

    async def held_and_says_so() -> bool:
        aw = await read(cluster, V1, namespace, "held")
        dispatched = {c["type"]: c for c in (aw.get("status") or {}).get("conditions", [])}.get(
            "Dispatched"
        )
        return dispatched is not None and dispatched["reason"] == "Suspended"

    await async_wait_until(held_and_says_so, timeout=30, what="Dispatched False, Suspended")

    async def still_held() -> bool:
        aw = await read(cluster, V2, namespace, "held")
        no_job = await cluster.akubectl("get", "deployment", "held", "-n", namespace, check=False)
        return aw["status"]["phase"] == "Suspended" and no_job.returncode != 0

    await async_holds_for(still_held, seconds=QUIET_SECONDS, what="suspended: nothing made")

    patch = '{"spec":{"suspend":false}}'
    await cluster.akubectl("patch", V2, "held", "-n", namespace, "--type=merge", "-p", patch)
    await wait_phase(cluster, namespace, "held", "Running")

    patch = '{"spec":{"suspend":true}}'
    await cluster.akubectl("patch", V2, "held", "-n", namespace, "--type=merge", "-p", patch)
    await wait_phase(cluster, namespace, "held", "Suspended")

    async def job_gone() -> bool:
        found = await cluster.akubectl("get", "deployment", "held", "-n", namespace, check=False)
        return found.returncode != 0

    await async_wait_until(job_gone, timeout=30, what="the Deployment removed on suspend")


def component(template: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"template": template, **fields}


def bad_input() -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (v1beta2 spec or annotations, what the Failed message must name)."""
    elsewhere = deployment("x", 1, {"cpu": "100m"})
    elsewhere["metadata"]["namespace"] = "elsewhere"
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole"}
    return {
        "other-namespace": ({"components": [component(elsewhere)]}, "namespace"),
        "cluster-scoped": (
            {"components": [component({**role, "metadata": {"name": "r"}})]},
            "cluster-scoped",
        ),
        "path-to-nowhere": (
            {
                "components": [
                    component(
                        deployment("p", 1, {"cpu": "100m"}),
                        podSets=[{"path": "template.spec.nowhere"}],
                    )
                ]
            },
            "podSets[0].path 'template.spec.nowhere'",
        ),
        "too-many-replicas": (
            {
                "components": [
                    component(
                        deployment("r", 1, {"cpu": "100m"}),
                        podSets=[{"path": "template.spec.template", "replicas": 100_001}],
                    )
                ]
            },
            "podSets[0].replicas 100001",
        ),
        "malformed-duration": (
            {"components": [component(deployment("d", 1, {"cpu": "100m"}))]},
            "workload.codeflare.dev.appwrapper/failureGracePeriodDuration",
        ),
    }


async def test_bad_v1beta2_input_fails_naming_the_field(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any
) -> None:
    fake_nodes.add("n", cpu="4", memory="8Gi")
    await run_dispatcher()
    cases = bad_input()
    for name, (spec, _) in cases.items():
        obj = {**v1beta2_app(name), "spec": spec}
        if name == "malformed-duration":
            obj["metadata"]["annotations"] = {
                "workload.codeflare.dev.appwrapper/failureGracePeriodDuration": "a while"
            }
        await apply(cluster, namespace, obj)
    await apply(cluster, namespace, v1beta2_app("good"))
    for name, (_, named) in cases.items():
        await wait_phase(cluster, namespace, name, "Failed", timeout=30)
        aw = await read(cluster, V2, namespace, name)
        assert named in aw["status"]["message"], (name, aw["status"]["message"])
    await wait_phase(cluster, namespace, "good", "Running")


async def test_v1beta2_goes_through_the_admission_webhook_and_stays_signed(
    cluster: Any,
    namespace: str,
    fake_nodes: Any,
    run_dispatcher: Any,
    secure: Secure,  # noqa: F811 (the fixture imported above)
) -> None:
    """The webhook configurations name v1beta1 with matchPolicy Equivalent: a v1beta2 create
    reaches them converted, is refused or signed there, and the signature still covers the
    spec once stored (the conversion round trips exactly)."""
    fake_nodes.add("n", cpu="4", memory="8Gi")
    await run_dispatcher(**secure.settings())
    wraps_a_pod = {**v1beta2_app("signed"), "spec": {"components": [{"template": pod("p")}]}}
    message = await secure.refused(wraps_a_pod, user="alice")
    assert "alice may not create pods" in message
    await secure.apply(wraps_a_pod, user="bob")
    await wait_phase(cluster, namespace, "signed", "Running")
    as_v1 = await read(cluster, V1, namespace, "signed")
    assert json.loads(as_v1["metadata"]["annotations"][USER])["username"] == "bob"
    assert as_v1["metadata"]["annotations"][SIGNATURE].startswith("v2:")


def unnamed(template: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`template` named by `metadata.generateName` instead of a name."""
    del template["metadata"]["name"]
    template["metadata"]["generateName"] = prefix
    return template


def made(app: str, *templates: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A v1beta2 AppWrapper of `templates`, each a component with `fields`."""
    return {**v1beta2_app(app), "spec": {"components": [component(t, **fields) for t in templates]}}


async def deployments_of(cluster: Any, namespace: str, app: str) -> list[str]:
    out = await cluster.akubectl(
        "get", "deployments", "-n", namespace, "-o", "json",
        "-l", f"workload.codeflare.dev/appwrapper={app}",
    )  # fmt: skip
    return sorted(d["metadata"]["name"] for d in json.loads(out.stdout)["items"])


async def test_generate_name_is_made_once_adopted_and_removed_and_running_means_made(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any
) -> None:
    """A component with generateName gets one name fixed by the AppWrapper's uid: made
    once, found again after a restart (no second copy), removed with the AppWrapper. And
    phase Running means the objects are made (the AppWrapper controller's meaning): a
    Deployment whose pods are held by a scheduling gate is Running, PodsReady False."""
    fake_nodes.add("n", cpu="4", memory="8Gi")
    await run_dispatcher()
    await apply(
        cluster, namespace, made("gen", unnamed(deployment("x", 1, {"cpu": "100m"}), "gen-"))
    )
    gate = {"schedulingGates": [{"name": "example.com/hold"}]}
    await apply(
        cluster,
        namespace,
        made("gated", deployment("gated", 1, {"cpu": "100m"}), podSetInfos=[gate]),
    )
    await wait_phase(cluster, namespace, "gen", "Running")
    uid = (await read(cluster, V1, namespace, "gen"))["metadata"]["uid"]
    want = [generated_name("gen-", uid, 0)]
    assert await deployments_of(cluster, namespace, "gen") == want
    await wait_phase(cluster, namespace, "gated", "Running")

    async def made_not_ready() -> bool:
        aw = await read(cluster, V2, namespace, "gated")
        ready = {c["type"]: c["status"] for c in aw["status"]["conditions"]}
        pods = await pods_of(cluster, namespace, "gated")
        return (
            aw["status"]["phase"] == "Running"
            and (ready["ResourcesDeployed"], ready["PodsReady"]) == ("True", "False")
            and len(pods) == 1
            and pods[0]["status"].get("phase") == "Pending"
        )

    await async_wait_until(made_not_ready, timeout=30, what="the gated pod made, not running")
    await run_dispatcher(restart=True)

    async def one_copy_and_still_running() -> bool:
        return await deployments_of(cluster, namespace, "gen") == want and await made_not_ready()

    await async_holds_for(one_copy_and_still_running, seconds=QUIET_SECONDS, what="adopted")
    await cluster.akubectl("delete", V2, "gen", "-n", namespace, "--wait=false")

    async def removed() -> bool:
        return await deployments_of(cluster, namespace, "gen") == []

    await async_wait_until(removed, timeout=30, what="the generated Deployment removed")


async def test_component_status_names_the_objects_and_deleting_one_fails_it(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any
) -> None:
    """As the AppWrapper project's suite walks it: `status.componentStatus` names each object
    made (a generated name too), and deleting one while it runs fails the AppWrapper
    (`MissingComponent`), with no reset, even under a retry rule."""
    fake_nodes.add("n", cpu="4", memory="8Gi")
    await run_dispatcher()
    app = made(
        "parts",
        unnamed(deployment("x", 1, {"cpu": "100m"}), "parts-"),
        service("parts-svc"),
    )
    app["metadata"]["annotations"] = {
        "workload.codeflare.dev.appwrapper/retryLimit": "3",
        "workload.codeflare.dev.appwrapper/failureGracePeriodDuration": "0s",
    }
    await apply(cluster, namespace, app)
    await wait_phase(cluster, namespace, "parts", "Running")
    aw = await read(cluster, V2, namespace, "parts")
    uid = aw["metadata"]["uid"]
    named = [(c["kind"], c["apiVersion"], c["name"]) for c in aw["status"]["componentStatus"]]
    assert named == [
        ("Deployment", "apps/v1", generated_name("parts-", uid, 0)),
        ("Service", "v1", "parts-svc"),
    ]
    deployed = [c["conditions"][0] for c in aw["status"]["componentStatus"]]
    assert [(c["type"], c["status"]) for c in deployed] == [("ResourcesDeployed", "True")] * 2
    await cluster.akubectl("delete", "deployment", named[0][2], "-n", namespace)
    await wait_phase(cluster, namespace, "parts", "Failed", timeout=30)
    failed = next(
        c
        for c in (await read(cluster, V1, namespace, "parts"))["status"]["conditions"]
        if c["type"] == "Failed"
    )
    assert failed["reason"] == "MissingComponent"
    assert named[0][2] in failed["message"]
    assert (await read(cluster, V2, namespace, "parts"))["status"].get("resettingCount", 0) == 0


async def test_the_webhook_holds_v1beta2_to_the_controllers_invariants(
    cluster: Any,
    namespace: str,
    fake_nodes: Any,
    run_dispatcher: Any,
    secure: Secure,  # noqa: F811 (the fixture imported above)
) -> None:
    """Refused at apply in v1beta2 (and not in v1beta1): no component, no pod template, more
    than 8 pod templates, a generateName that makes no valid name; at update, a change of a
    component's template or podSets."""
    fake_nodes.add("n", cpu="4", memory="8Gi")
    await run_dispatcher(**secure.settings())

    async def refusal(*kubectl: str, obj: dict[str, Any] | None = None) -> str:
        """The API server's answer to `kubectl` (or an apply of `obj`), which must fail."""
        call = secure.apply(obj) if obj is not None else cluster.akubectl(*kubectl)
        with pytest.raises(KubectlError) as caught:
            await call
        return str(caught.value.stderr)

    refused = {
        "spec.components is empty": made("none"),
        "make no pods": made("nopods", service("s")),
        "contain 9 pod templates": made("nine", *(pod(f"p{i}") for i in range(9))),
        "metadata.generateName 'P_' does not make a valid name": made(
            "badprefix", unnamed(pod("p"), "P_")
        ),
    }
    for want, obj in refused.items():
        assert want in await refusal(obj=obj), want
    await apply(cluster, namespace, appwrapper("mcad-service", service("s")))  # v1beta1: as MCAD

    sets = [{"path": "template.spec.template", "replicas": 1}]
    await secure.apply(made("fixed", deployment("d", 1, {"cpu": "100m"}), podSets=sets))
    changes = {
        "spec.components[0].podSets: 1 pod sets cannot become 2": [
            {"op": "add", "path": "/spec/components/0/podSets/-", "value": sets[0]}
        ],
        "spec.components[0].podSets[0].replicas cannot change": [
            {"op": "replace", "path": "/spec/components/0/podSets/0/replicas", "value": 12}
        ],
        "spec.components[0].template cannot change": [
            {"op": "replace", "path": "/spec/components/0/template/spec/replicas", "value": 2}
        ],
    }
    for want, patch in changes.items():
        message = await refusal(
            "patch", V2, "fixed", "-n", namespace, "--type=json", "-p", json.dumps(patch)
        )
        assert want in message, (want, message)
    suspend = '{"spec":{"suspend":true}}'
    await cluster.akubectl("patch", V2, "fixed", "-n", namespace, "--type=merge", "-p", suspend)
    assert (await read(cluster, V2, namespace, "fixed"))["spec"]["suspend"] is True
