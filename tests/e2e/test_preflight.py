"""The check at start on the AppWrapper CRD (kube/preflight.py), against the real API server.

The shared test CRD is not touched: a throw-away CRD of another group stands for the
AppWrapper v1beta2 controller's, first as that controller installs it (v1beta2 served and
stored), then with our v1beta1 applied over it. The API server's own answers are part of
the story: it refuses a CRD that drops a version objects were stored in, and keeps that
version in `status.storedVersions` when it is only no longer served.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from dispatcher.kube.client import KubeClient
from dispatcher.kube.preflight import StartRefused, check_appwrapper_crd
from tests.e2e.conftest import wait_established

pytestmark = pytest.mark.cluster

# Not "appwrappers"/"AppWrapper": kubectl resolves a plural or kind name across every group,
# and the other tests of this process say `kubectl get aw` and `appwrappers`.
KIND, PLURAL = "PreflightWrapper", "preflightwrappers"
SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}


def theirs_crd(group: str, versions: list[tuple[str, bool, bool]]) -> dict[str, Any]:
    """A CRD of `group` with (name, served, storage) versions."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": KIND, "plural": PLURAL, "singular": PLURAL[:-1]},
            "scope": "Namespaced",
            "versions": [
                {"name": name, "served": served, "storage": storage, "schema": SCHEMA}
                for name, served, storage in versions
            ],
        },
    }


@pytest_asyncio.fixture
async def client(cluster: Any) -> AsyncIterator[KubeClient]:
    connected = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), name="preflight")
    try:
        yield connected
    finally:
        await connected.close()


async def test_a_crd_that_stores_v1beta2_stops_the_start(
    cluster: Any, appwrapper_crd: None, client: KubeClient
) -> None:
    # The shipped CRD, as the shared test cluster holds it, passes.
    await check_appwrapper_crd(client)

    group = f"preflight-{uuid.uuid4().hex[:6]}.example.com"
    name = f"{PLURAL}.{group}"
    try:
        # As the AppWrapper v1beta2 controller installs it, with one object stored.
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps(theirs_crd(group, [("v1beta2", True, True)]))
        )
        wait_established(cluster, name)
        theirs = {"apiVersion": f"{group}/v1beta2", "kind": KIND, "metadata": {"name": "x"}}
        cluster.kubectl("apply", "-n", "default", "-f", "-", input=json.dumps(theirs))
        with pytest.raises(StartRefused) as refused:
            await check_appwrapper_crd(client, name=name)
        assert f"CustomResourceDefinition {name} has stored objects as v1beta2" in str(
            refused.value
        )
        assert "status.storedVersions: v1beta2)" in str(refused.value)
        assert "Do not apply crds/appwrapper.yaml over it" in str(refused.value)

        # Ours (v1beta1 only) applied over it: the API server refuses to drop a stored version.
        ours = theirs_crd(group, [("v1beta1", True, True)])
        dropped = cluster.kubectl("apply", "-f", "-", input=json.dumps(ours), check=False)
        assert dropped.returncode != 0
        assert "storedVersions" in dropped.stderr, dropped.stderr

        # Ours with theirs kept but no longer served is accepted, and v1beta2 stays stored:
        # the objects stored as v1beta2 would reach this dispatcher labelled v1beta1.
        over = theirs_crd(group, [("v1beta1", True, True), ("v1beta2", False, False)])
        cluster.kubectl("apply", "-f", "-", input=json.dumps(over))
        stored = cluster.kubectl(
            "get", "crd", name, "-o", "jsonpath={.status.storedVersions}"
        ).stdout
        assert json.loads(stored) == ["v1beta2", "v1beta1"]
        with pytest.raises(StartRefused) as refused:
            await check_appwrapper_crd(client, name=name)
        assert "has stored objects as v1beta2 (status.storedVersions: v1beta2, v1beta1)" in str(
            refused.value
        )
    finally:
        cluster.kubectl("delete", "crd", name, "--ignore-not-found", "--wait=false", check=False)
