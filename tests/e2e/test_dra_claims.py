"""DRA resource claims are refused, never ignored (core/resourceclaims.py), on the real API server:
at `kubectl apply` by the admission webhook, in either AppWrapper version; and, stored past
the webhook, Failed with InvalidSpec before anything of the AppWrapper is created."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.resourceclaims import NOT_CHARGED
from testenv.kubectl import KubectlError
from testenv.waits import async_holds_for
from tests.e2e.conftest import QUIET_SECONDS, appwrapper, deployment, get_aw, wait_condition
from tests.e2e.test_security import Secure, secure

__all__ = ["secure"]  # the fixture, imported to be used here

pytestmark = [pytest.mark.cluster]

CLAIM = [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]


def claiming_deployment(name: str) -> dict[str, Any]:
    """A Deployment whose pods ask for GPUs only through a DRA claim (no extended resource
    the dispatcher would count)."""
    made = deployment(name, 2, {"cpu": "100m"}, resourceClaims=CLAIM)
    made["spec"]["template"]["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    return made


def claim_template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": []}}},
    }


async def refused(secure: Secure, obj: dict[str, Any]) -> str:
    """What `kubectl apply` of `obj` by the cluster admin (every right) is refused with."""
    with pytest.raises(KubectlError) as caught:
        await secure.apply(obj)
    assert "denied the request" in caught.value.stderr
    return str(caught.value.stderr)


async def test_claims_are_refused_at_apply_and_fail_past_the_webhook(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1", cpu="8")
    await run_dispatcher(**secure.settings())
    fields = "spec.template.spec.resourceClaims, spec.template.spec.containers[0].resources.claims"
    message = await refused(secure, appwrapper("gpu", claiming_deployment("gpu")))
    assert f"item 0 (Deployment/gpu): {fields}: {NOT_CHARGED}" in message
    # The same in v1beta2 (the API server converts it to v1beta1 for the webhook).
    as_v2 = {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": "gpu2"},
        "spec": {"components": [{"template": claiming_deployment("gpu2")}]},
    }
    message = await refused(secure, as_v2)
    assert f"item 0 (Deployment/gpu2): {fields}: {NOT_CHARGED}" in message
    # A claim kind itself.
    message = await refused(secure, appwrapper("claim", claim_template("eight-gpus")))
    assert (
        f"item 0 (ResourceClaimTemplate/eight-gpus): kind ResourceClaimTemplate: {NOT_CHARGED}"
        in message
    )
    listed = await cluster.akubectl("get", "aw", "-n", namespace, "-o", "name")
    assert listed.stdout.strip() == ""  # nothing of it was stored

    # Past the webhook (its configuration gone): stored, then Failed as an invalid spec,
    # and its Deployment never made.
    secure.remove_webhook_configurations()
    await secure.apply(appwrapper("stored", claiming_deployment("stored")))
    await wait_condition(cluster, namespace, "stored", "Failed")
    status = (await get_aw(cluster, namespace, "stored"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"] == f"item 0 (Deployment/stored): {fields}: {NOT_CHARGED}"

    async def never_made() -> bool:
        made = await cluster.akubectl("get", "deployment", "stored", "-n", namespace, check=False)
        assert made.returncode != 0, made.stdout
        assert "NotFound" in made.stderr, made.stderr
        return True

    await async_holds_for(never_made, seconds=QUIET_SECONDS, what="no Deployment stored")
