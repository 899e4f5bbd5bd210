"""A tenant's own namespaced queue naming another team's cluster queue, on the real control
plane with Kueue's CRDs (`kueue_quotas: beside`): the tenant may create Kueue LocalQueues
and AppWrappers in her namespace, and makes a LocalQueue naming the ClusterAppQueue of
samples/queues/setup.yaml. The queue's `namespaceSelector` keeps her AppWrapper waiting,
saying so, until an administrator labels her namespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import QUIET_SECONDS, appwrapper, deployment, get_aw, wait_condition
from tests.e2e.test_kueue_quotas import kueue_crds
from tests.e2e.test_security import grant

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("kueue_crds", "quotas")]
__all__ = ["kueue_crds"]  # the fixture, shared

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "queues" / "setup.yaml"
TENANT = "mallory"


def sample_queue() -> list[dict[str, Any]]:
    """The sample's cluster-scoped quota objects (its ClusterAppQueue and AppFlavor)."""
    found = [d for d in yaml.safe_load_all(SAMPLE.read_text()) if d]
    return [d for d in found if d["kind"] in ("ClusterAppQueue", "AppFlavor")]


def tenant_role(cluster: Any, namespace: str) -> None:
    """The tenant may make Kueue LocalQueues and AppWrappers in her namespace."""
    verbs = ["create", "get", "list"]
    resources = {"kueue.x-k8s.io/localqueues": verbs, "workload.codeflare.dev/appwrappers": verbs}
    grant(cluster, namespace, TENANT, "queue-maker", resources)


async def as_tenant(cluster: Any, namespace: str, obj: dict[str, Any]) -> None:
    await cluster.akubectl(
        "create", "-n", namespace, "-f", "-", f"--as={TENANT}", input=json.dumps(obj)
    )


async def test_a_tenants_local_queue_cannot_reach_a_queue_that_does_not_admit_her(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("n1", cpu="4", memory="16Gi")
    for obj in sample_queue():
        await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))
    tenant_role(cluster, namespace)
    await run_dispatcher(kueue_quotas="beside")
    local = {
        "apiVersion": "kueue.x-k8s.io/v1beta1",
        "kind": "LocalQueue",
        "metadata": {"name": "sneak", "namespace": namespace},
        "spec": {"clusterQueue": "cluster-queue"},
    }
    await as_tenant(cluster, namespace, local)
    work = appwrapper("sneaky", deployment("sneaky", 1, {"cpu": "1"}))
    work["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "sneak"}
    await as_tenant(cluster, namespace, work)
    said = f"cluster queue cluster-queue does not admit namespace {namespace}"

    async def waits_saying_so() -> bool:
        status = (await get_aw(cluster, namespace, "sneaky")).get("status") or {}
        dispatched = any(
            c["type"] == "Dispatched" and c["status"] == "True"
            for c in status.get("conditions") or []
        )
        return not dispatched and said in str(status.get("message") or "")

    await async_wait_until(waits_saying_so, timeout=30, what="it waits, naming the selector")
    await async_holds_for(waits_saying_so, seconds=QUIET_SECONDS, what="never dispatched")
    # What held it back is the selector: once an administrator labels the namespace as
    # the sample says, it is admitted.
    await cluster.akubectl("label", "namespace", namespace, "team=ml")
    await wait_condition(cluster, namespace, "sneaky", "Dispatched", timeout=30)
    aw = await get_aw(cluster, namespace, "sneaky")
    assert aw["status"]["admission"]["clusterQueue"] == "cluster-queue"
