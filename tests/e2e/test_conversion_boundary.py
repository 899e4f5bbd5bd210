"""The conversion boundary against the real API server, tried as a tenant would: the
AppWrapper CRD serves v1beta2 (its preferred version) through the dispatcher's /convert
(testenv/converter.py for the session), so every `kubectl get aw` converts.

- a status forged in the reserved annotation never becomes the AppWrapper's status, even with
  no webhook and no dispatcher to write one first; with the webhook, it is refused at apply;
- one hostile object (an annotation nested 5,000 deep, a template nested 3,000 deep) never
  fails `kubectl get aw -A`, a describe or a delete;
- what the API server presents to a conversion webhook: no client certificate, where it
  presents one to admission webhooks (the local control plane is configured to), which is
  why /convert cannot ask for one (docs/security.md).
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from dispatcher.core import jsontext
from dispatcher.core.convert import V1BETA2_FIELDS
from dispatcher.kube import webhook
from testenv.converter import loopback_server_context
from testenv.kubectl import KubectlError
from testenv.localcluster import free_port
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import QUIET_SECONDS, appwrapper, wait_condition
from tests.e2e.test_security import Secure, pod, secure  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.cluster]

V1 = "appwrappers.v1beta1.workload.codeflare.dev"
FORGED = {
    "state": "Running",
    "priority": 2_000_000_000,
    "conditions": [
        {"type": "Dispatched", "status": "True", "reason": "Chosen", "message": "by the tenant"},
        {"type": "Running", "status": "True", "reason": "Chosen", "message": "by the tenant"},
    ],
}


def v1beta1(name: str, annotations: dict[str, str], *items: dict[str, Any]) -> dict[str, Any]:
    obj = appwrapper(name, *items)
    obj["metadata"]["annotations"] = annotations
    return obj


async def create(cluster: Any, namespace: str, obj: dict[str, Any], *who: str) -> None:
    """kubectl create, the object written at any depth."""
    await cluster.akubectl("create", "-n", namespace, "-f", "-", *who, input=jsontext.dumps(obj))


async def stored(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """The AppWrapper as stored (v1beta1: no conversion)."""
    out = await cluster.akubectl("get", V1, name, "-n", namespace, "-o", "json")
    return dict(jsontext.loads(out.stdout))


async def test_a_status_forged_in_the_reserved_annotation_never_becomes_the_status(
    cluster: Any, namespace: str, appwrapper_crd: None
) -> None:
    """No webhook and no dispatcher: nothing writes a status first. Touched once through
    v1beta2 (a label), the AppWrapper is stored with no status at all; it used to be stored
    Running, priority 2e9, with the tenant's reason."""
    forged = v1beta1("forged", {V1BETA2_FIELDS: json.dumps({"status": FORGED})})
    await create(cluster, namespace, forged)
    await cluster.akubectl("label", "aw", "forged", "-n", namespace, "touched=yes")
    after = await stored(cluster, namespace, "forged")
    assert after["metadata"]["labels"] == {"touched": "yes"}
    assert "status" not in after
    assert V1BETA2_FIELDS not in (after["metadata"].get("annotations") or {})
    listed = await cluster.akubectl(
        "get", "aw", "forged", "-n", namespace, "-o", "jsonpath={.status.state}/{.status.priority}"
    )
    assert listed.stdout == "/"


async def test_the_reserved_annotations_are_refused_at_apply(
    cluster: Any,
    namespace: str,
    fake_nodes: Any,
    run_dispatcher: Any,
    secure: Secure,  # noqa: F811 (the fixture imported above)
) -> None:
    """With the webhook: set at create, or changed later, in v1beta1, by a tenant or anyone;
    a label added through v1beta2 (whose reserved annotations the conversion writes) passes.
    An item field the conversion reserves (`$ref`) is refused too."""
    fake_nodes.add("n1", cpu="1")
    await run_dispatcher(**secure.settings())
    forged = v1beta1("forged", {V1BETA2_FIELDS: json.dumps({"status": FORGED})}, pod("p"))
    message = await secure.refused(forged, user="alice")
    assert (
        f"metadata.annotations[{V1BETA2_FIELDS}] is written by the dispatcher's conversion "
        "between v1beta1 and v1beta2; it cannot be set, changed or removed"
    ) in message
    reserved_field = appwrapper("ref", pod("p"))
    reserved_field["spec"]["resources"]["GenericItems"][0]["$ref"] = "Pod/other"
    message = await secure.refused(reserved_field, user="bob")
    assert "spec.resources.GenericItems[0].$ref: a field name the conversion" in message
    await secure.apply(appwrapper("plain", pod("p")), user="bob")
    await wait_condition(cluster, namespace, "plain", "Running")
    patch = {"metadata": {"annotations": {V1BETA2_FIELDS: json.dumps({"status": FORGED})}}}
    with pytest.raises(KubectlError) as caught:
        await cluster.akubectl(
            "patch", V1, "plain", "-n", namespace, "--as=bob", "--type=merge",
            "-p", json.dumps(patch),
        )  # fmt: skip
    assert "it cannot be set, changed or removed" in caught.value.stderr
    await cluster.akubectl("label", "aw", "plain", "-n", namespace, "--as=bob", "team=a")
    after = await stored(cluster, namespace, "plain")
    assert after["metadata"]["labels"] == {"team": "a"}
    assert after["status"]["state"] == "Running"


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": "x"}
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_one_hostile_object_never_breaks_a_list(
    cluster: Any, namespace: str, appwrapper_crd: None
) -> None:
    """An annotation nested 5,000 deep made the conversion answer 500, and every
    `kubectl get aw -A` in the cluster failed. Now both objects list, read and delete."""
    deep_annotation = v1beta1("deep-annotation", {V1BETA2_FIELDS: "[" * 5000})
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    deep_template = v1beta1("deep-template", {}, {**config_map, "data": {}, **nested(3000)})
    for obj in (deep_annotation, deep_template):
        await create(cluster, namespace, obj)
    listed = await cluster.akubectl("get", "aw", "-A", "-o", "name")
    names = set(listed.stdout.split())
    assert {
        "appwrapper.workload.codeflare.dev/deep-annotation",
        "appwrapper.workload.codeflare.dev/deep-template",
    } <= names
    described = await cluster.akubectl("describe", "aw", "-n", namespace, "deep-annotation")
    assert "deep-annotation" in described.stdout
    read = await cluster.akubectl("get", "aw", "deep-template", "-n", namespace, "-o", "json")
    template = jsontext.loads(read.stdout)["spec"]["components"][0]["template"]
    expected = {**config_map, "data": {}, **nested(3000)}
    assert jsontext.dumps(template, sort_keys=True) == jsontext.dumps(expected, sort_keys=True)
    await cluster.akubectl("delete", "aw", "deep-annotation", "deep-template", "-n", namespace)


# -- what the API server presents to a conversion webhook ----------------------------------

PROBE_GROUP = "probes.appwrapper.test"


class Recorder:
    """An HTTPS server that asks every caller for a client certificate (of the CA the local
    control plane's webhook client certificate is issued by) and records, per path, whether
    one came; it answers conversions (apiVersion set) and admissions (allowed)."""

    def __init__(self, client_ca: Path) -> None:
        self.client_ca = client_ca
        self.seen: dict[str, list[bool]] = {"/convert": [], "/validate": []}
        self.ca_bundle = b""

    def context(self) -> ssl.SSLContext:
        context, self.ca_bundle = loopback_server_context()
        context.load_verify_locations(str(self.client_ca))
        context.verify_mode = ssl.CERT_OPTIONAL
        return context

    async def convert(self, request: web.Request) -> web.Response:
        self.seen["/convert"].append(webhook.peer_certificate(request) is not None)
        inner = (await request.json())["request"]
        objects = [{**o, "apiVersion": inner["desiredAPIVersion"]} for o in inner["objects"]]
        response = {
            "uid": inner["uid"],
            "convertedObjects": objects,
            "result": {"status": "Success"},
        }
        return web.json_response({**await request.json(), "response": response})

    async def validate(self, request: web.Request) -> web.Response:
        self.seen["/validate"].append(webhook.peer_certificate(request) is not None)
        inner = (await request.json())["request"]
        answer = {"uid": inner["uid"], "allowed": True}
        return web.json_response({**await request.json(), "response": answer})


def probe_crd(url: str, ca_bundle: bytes) -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"conversionprobes.{PROBE_GROUP}"},
        "spec": {
            "group": PROBE_GROUP,
            "scope": "Namespaced",
            "names": {"plural": "conversionprobes", "kind": "ConversionProbe"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": schema},
                {"name": "v2", "served": True, "storage": False, "schema": schema},
            ],
            "conversion": {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {
                        "url": url + "/convert",
                        "caBundle": base64.b64encode(ca_bundle).decode(),
                    },
                },
            },
        },
    }


@pytest_asyncio.fixture
async def recorder(cluster: Any, namespace: str) -> AsyncIterator[Recorder]:
    if cluster.webhook_client_ca is None:
        pytest.skip("this cluster's API server presents no client certificate to webhooks")
    recording = Recorder(cluster.webhook_client_ca)
    app = web.Application()
    app.router.add_post("/convert", recording.convert)
    app.router.add_post("/validate", recording.validate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=recording.context()).start()
    url = f"https://127.0.0.1:{port}"
    name = f"probe-{namespace}"[:63]
    cluster.apply(probe_crd(url, recording.ca_bundle))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/conversionprobes.{PROBE_GROUP}")
    cluster.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": f"validate.{PROBE_GROUP}",
                    "clientConfig": {
                        "url": url + "/validate",
                        "caBundle": base64.b64encode(recording.ca_bundle).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [PROBE_GROUP],
                            "apiVersions": ["*"],
                            "resources": ["conversionprobes"],
                            "operations": ["CREATE"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "failurePolicy": "Fail",
                }
            ],
        }
    )
    try:
        yield recording
    finally:
        cluster.kubectl("delete", f"validatingwebhookconfiguration/{name}", check=False)
        cluster.kubectl("delete", f"crd/conversionprobes.{PROBE_GROUP}", check=False)
        await runner.cleanup()


async def test_the_api_server_presents_a_client_certificate_to_admission_not_conversion(
    cluster: Any, namespace: str, recorder: Recorder
) -> None:
    probe = {
        "apiVersion": f"{PROBE_GROUP}/v1",
        "kind": "ConversionProbe",
        "metadata": {"name": "p"},
        "data": "x",
    }
    await cluster.akubectl("create", "-n", namespace, "-f", "-", input=json.dumps(probe))
    await cluster.akubectl("get", f"conversionprobes.v2.{PROBE_GROUP}", "p", "-n", namespace)
    assert recorder.seen["/validate"] == [True]
    assert recorder.seen["/convert"]  # called, at least once
    assert not any(recorder.seen["/convert"])


async def test_the_forged_status_is_not_taken_up_by_a_running_dispatcher(
    cluster: Any, namespace: str, run_dispatcher: Any, appwrapper_crd: None
) -> None:
    """The attack's last step: a dispatcher (no webhook: `unattributed: allow`, as a cluster
    without one runs it; no node: nothing may be dispatched) meets the AppWrapper touched
    through v1beta2 and queues it from scratch: its status is the dispatcher's, never the
    forged one."""
    forged = v1beta1("forged", {V1BETA2_FIELDS: json.dumps({"status": FORGED})}, pod("p"))
    await create(cluster, namespace, forged)
    await cluster.akubectl("label", "aw", "forged", "-n", namespace, "touched=yes")
    await run_dispatcher(unattributed="allow")

    async def status() -> dict[str, Any]:
        return dict((await stored(cluster, namespace, "forged")).get("status") or {})

    await async_wait_until(
        lambda: _queued(status), timeout=30, what="the dispatcher's first status write"
    )

    async def not_forged() -> bool:
        now = await status()
        return now.get("state") != "Running" and now.get("priority") != 2_000_000_000

    await async_holds_for(not_forged, seconds=QUIET_SECONDS, what="the forged status stays out")


async def _queued(status: Any) -> bool:
    conditions = {c["type"]: c["status"] for c in (await status()).get("conditions") or []}
    return conditions.get("Queueing") == "True"
