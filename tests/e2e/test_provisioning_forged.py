"""A tenant's forged ProvisioningRequests, on the real control plane: a request counts for an
AppWrapper only if the dispatcher made it for it (its namespace, its name, a controller
reference to its uid), never because it carries the AppWrapper's uid label. The setup is
tests/e2e/test_provisioning.py's (its CRD, settings and the test kit's provisioner)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.core import admissionchecks as checks
from testenv.provisioner import TestProvisioner
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import QUIET_SECONDS, apply, get_aw
from tests.e2e.test_provisioning import provisioning_crd, ray_like, requests_of, settings
from tests.e2e.test_security import grant

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("provisioning_crd")]
__all__ = ["provisioning_crd"]  # the fixture, shared

TENANT = "mallory"


@pytest.fixture
def elsewhere(cluster: Any, namespace: str) -> Iterator[str]:
    """A second namespace, the tenant's own."""
    name = f"{namespace[:50]}-m"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def may_write_requests(cluster: Any, namespace: str) -> None:
    """The tenant may create and read ProvisioningRequests in `namespace`."""
    verbs = ["create", "get", "list"]
    grant(cluster, namespace, TENANT, "request-writer",
          {"autoscaling.x-k8s.io/provisioningrequests": verbs})  # fmt: skip


def forged(namespace: str, uid: str, attempt: int) -> dict[str, Any]:
    """A request named and labelled as the dispatcher's attempt `attempt` for `uid`, with
    no owner reference (the tenant may not make the victim its owner)."""
    labels = {checks.UID_LABEL: uid, checks.CHECK_LABEL: "prov", checks.ATTEMPT_LABEL: str(attempt)}
    return {
        "apiVersion": checks.PROVISIONING_API,
        "kind": "ProvisioningRequest",
        "metadata": {
            "name": checks.request_name(uid, "prov", attempt),
            "namespace": namespace,
            "labels": labels,
        },
        "spec": {
            "provisioningClassName": checks.BEST_EFFORT_ATOMIC,
            "podSets": [{"podTemplateRef": {"name": "anything"}, "count": 1}],
        },
    }


def owned_names(requests: list[dict[str, Any]], uid: str) -> list[str]:
    return sorted(
        r["metadata"]["name"]
        for r in requests
        if any(o.get("uid") == uid for o in r["metadata"].get("ownerReferences") or [])
    )


async def test_forged_requests_neither_replace_nor_abandon_the_victims_request(
    cluster, namespace, elsewhere, fake_nodes, run_dispatcher
):
    fake_nodes.add("cpu", cpu="4", memory="16Gi")
    async with TestProvisioner(cluster.kubeconfig, namespace, labels=fake_nodes.pool, delay=600):
        await run_dispatcher(**settings())
        await apply(cluster, namespace, ray_like("victim", workers=2))

        async def asked() -> list[dict[str, Any]] | None:
            found = await requests_of(cluster, namespace)
            return found if len(found) == 1 else None

        (request,) = await async_wait_until(asked, timeout=30, what="the victim's request")
        uid = (await get_aw(cluster, namespace, "victim"))["metadata"]["uid"]
        first = checks.request_name(uid, "prov", 1)
        assert request["metadata"]["name"] == first
        # The tenant's requests: in her own namespace, and in the victim's without owner;
        # each the name and labels of a later attempt of the victim's check.
        for where, attempt in ((elsewhere, 2), (namespace, 9)):
            may_write_requests(cluster, where)
            await cluster.akubectl(
                "create", "-f", "-", f"--as={TENANT}", input=json.dumps(forged(where, uid, attempt))
            )

        async def keeps_its_request() -> bool:
            requests = await requests_of(cluster, namespace)
            aw = (await get_aw(cluster, namespace, "victim")).get("status") or {}
            held = {c["type"]: c for c in aw.get("conditions") or []}
            check = held.get("AdmissionCheck.prov") or {}
            return (
                owned_names(requests, uid) == [first]
                and held.get("QuotaHeld", {}).get("status") == "True"
                and check.get("status") == "False"
            )

        await async_holds_for(
            keeps_its_request, seconds=QUIET_SECONDS, what="the victim keeps attempt 1"
        )
        # Both forged requests are still there: they were ignored, not removed.
        theirs = await cluster.akubectl(
            "get", "provisioningrequests", "-n", elsewhere, "-o", "name"
        )
        assert theirs.stdout.split() == [
            f"provisioningrequest.autoscaling.x-k8s.io/{checks.request_name(uid, 'prov', 2)}"
        ]
