"""A creator record obtained from the webhook port is worth nothing once the webhook is away
(issue 36, point 8), against the real API server, where the API server presents no client
certificate to the webhook (managed clusters, the default chart).

The attack: while the webhook is registered, a caller who reaches its port posts an
AdmissionReview of its own (userInfo: a cluster admin) and takes the signed patch; the
webhook configurations are removed (an outage); alice, who may only manage AppWrappers,
stores an AppWrapper carrying that record. The record verifies, but it was not written by
the API server's call that stored the spec: the AppWrapper ends Failed (Forbidden) and
nothing of it is created. Work stored through the webhook before the outage still runs.

The webhook setup is tests/e2e/test_security.py's `secure` fixture.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from dispatcher.core.gatekeeping import SIGNATURE, USER
from dispatcher.kube.webhook import MUTATE_PATH
from testenv.waits import async_wait_until
from tests.e2e.conftest import appwrapper, get_aw, wait_condition
from tests.e2e.test_security import Secure, pod, secure
from tests.e2e.test_webhook_caller import call_webhook, forged_review

pytestmark = [pytest.mark.cluster]
__all__ = ["secure"]  # the fixture, imported to be used here


def big_pod(name: str) -> dict[str, Any]:
    obj = pod(name)
    obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "6"
    return obj


async def stolen_record(secure: Secure, obj: dict[str, Any]) -> dict[str, str]:
    """The annotations the webhook signs for a cluster admin, obtained by posting an
    AdmissionReview to its port directly: `obj` as the API server would store it (a
    server-side dry run fills in the schema's defaults, which the signature covers)."""
    out = await secure.cluster.akubectl(
        "create",
        "-n",
        secure.namespace,
        "--dry-run=server",
        "--as=bob",
        "-o",
        "json",
        "-f",
        "-",
        input=json.dumps(obj),
    )
    stored = json.loads(out.stdout)
    stored["metadata"].pop("annotations", None)
    review = forged_review(secure.namespace)
    review["request"]["object"] = stored
    status, body = await call_webhook(secure.port, MUTATE_PATH, review)
    assert status == 200
    assert body["response"]["allowed"] is True
    patch = json.loads(base64.b64decode(body["response"]["patch"]))
    annotations: dict[str, str] = {}
    for change in patch:
        if change["path"] == "/metadata/annotations":
            annotations.update(change["value"])
        elif change["path"].startswith("/metadata/annotations/"):
            key = change["path"].rpartition("/")[2].replace("~1", "/").replace("~0", "~")
            annotations[key] = change["value"]
    assert json.loads(annotations[USER])["username"] == "admin"
    assert annotations[SIGNATURE].startswith("v2:")
    return annotations


async def test_a_record_taken_from_the_port_is_not_honoured_after_the_webhook_goes(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1", cpu="8")
    await run_dispatcher(**secure.settings(client_ca_file=None))
    # bob's work, through the webhook: one running that fills the node, one queued behind it.
    await secure.apply(appwrapper("blocker", big_pod("blocker")), user="bob")
    await wait_condition(cluster, namespace, "blocker", "Dispatched")
    await secure.apply(appwrapper("queued", big_pod("queued")), user="bob")
    await wait_condition(cluster, namespace, "queued", "Queueing")

    # The attacker's record, for a Pod alice may not create.
    wanted = appwrapper("stolen", pod("stolen"))
    annotations = await stolen_record(secure, copy.deepcopy(wanted))

    # The outage: the configurations removed, and the replica has seen it.
    secure.remove_webhook_configurations()

    async def unregistered() -> bool:
        _, body = await call_webhook(secure.port, MUTATE_PATH, forged_review(namespace))
        return body["response"]["allowed"] is False

    await async_wait_until(unregistered, timeout=10, what="the replica saw the deletion")

    # alice stores the AppWrapper with the admin's record, signed for this very spec.
    wanted["metadata"]["annotations"] = annotations
    await secure.apply(wanted, user="alice")
    stored = await get_aw(cluster, namespace, "stolen")
    assert stored["metadata"]["annotations"][USER] == annotations[USER]
    await wait_condition(cluster, namespace, "stolen", "Failed")
    status = (await get_aw(cluster, namespace, "stolen"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Forbidden"
    assert "not known to have been written by it when this spec was stored" in failed["message"]
    pods = await cluster.akubectl("get", "pod", "stolen", "-n", namespace, check=False)
    assert pods.returncode != 0  # never created

    # bob's queued AppWrapper, stored through the webhook before the outage, still runs.
    await cluster.akubectl("delete", "appwrapper", "blocker", "-n", namespace, "--wait=false")
    await wait_condition(cluster, namespace, "queued", "Dispatched")
