"""Kueue's own quota objects on the real API server, with Kueue's published CRDs installed
and no Kueue running (setting `kueue_quotas`): a ResourceFlavor, a ClusterQueue of 2 CPU
and a LocalQueue admit AppWrappers of both generations up to the quota, naming the queue by
annotation or label, in the order of their WorkloadPriorityClass; and with a sign that
Kueue itself runs, its queues are left to it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.core.quota.kueue import KUEUE_PRIORITY_LABEL, KUEUE_WEBHOOK
from testenv.binaries import ensure_binaries
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    deployment,
    get_aw,
    wait_condition,
    wait_established,
)

pytestmark = [pytest.mark.cluster]

KUEUE = "kueue.x-k8s.io"
QUEUE_KEY = f"{KUEUE}/queue-name"
KINDS = "clusterqueues,resourceflavors,cohorts,workloadpriorityclasses"


@pytest.fixture(scope="session")
def kueue_crds(cluster: Any) -> None:
    """Kueue v0.15.0's quota CRDs as published (v1beta1 stored, v1beta2 served; no
    conversion webhook): testenv/build.sh downloads them, Kueue is not built."""
    directory = ensure_binaries().kueue_crds
    for path in sorted(directory.glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "-f", str(path))
    for path in sorted(directory.glob("*.yaml")):
        wait_established(cluster, path.name.removeprefix(f"{KUEUE}_").replace(".yaml", f".{KUEUE}"))


@pytest.fixture
def kueue_objects(cluster: Any, kueue_crds: None) -> Iterator[None]:
    """The test's cluster-scoped Kueue objects removed after it."""
    yield
    cluster.kubectl("delete", KINDS, "--all", "--wait=false", check=False)


async def kueue_setup(cluster: Any, namespace: str, version: str = "v1beta1") -> str:
    """ResourceFlavor, ClusterQueue of 2 CPU (any namespace), LocalQueue `user-queue`."""
    api = f"{KUEUE}/{version}"
    cq = f"{namespace}-cq"
    objects: list[dict[str, Any]] = [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": f"{namespace}-rf"}},
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {
                                "name": f"{namespace}-rf",
                                "resources": [{"name": "cpu", "nominalQuota": 2}],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": "user-queue", "namespace": namespace},
            "spec": {"clusterQueue": cq},
        },
        {
            "apiVersion": api,
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": f"{namespace}-high"},
            "value": 1000,
        },
    ]
    for obj in objects:
        await cluster.akubectl("apply", "-f", "-", input=json.dumps(obj))
    return cq


def v1beta2(name: str, cpu: str) -> dict[str, Any]:
    """A v1beta2 AppWrapper naming Kueue's queue by annotation, as the AppWrapper project's
    own e2e suite does."""
    return {
        "apiVersion": "workload.codeflare.dev/v1beta2",
        "kind": "AppWrapper",
        "metadata": {"name": name, "annotations": {QUEUE_KEY: "user-queue"}},
        "spec": {"components": [{"template": deployment(name, 1, {"cpu": cpu})}]},
    }


def v1beta1(name: str, cpu: str, labels: dict[str, str]) -> dict[str, Any]:
    obj = appwrapper(name, deployment(name, 1, {"cpu": cpu}))
    obj["metadata"]["labels"] = labels
    return obj


async def message_of(cluster: Any, namespace: str, name: str) -> str:
    return str(((await get_aw(cluster, namespace, name)).get("status") or {}).get("message", ""))


async def dispatched(cluster: Any, namespace: str, *names: str) -> list[str]:
    found = []
    for name in names:
        conditions = ((await get_aw(cluster, namespace, name)).get("status") or {}).get(
            "conditions", []
        )
        if any(c["type"] == "Dispatched" and c["status"] == "True" for c in conditions):
            found.append(name)
    return found


async def wait_message(cluster: Any, namespace: str, name: str, text: str) -> None:
    async def says() -> bool:
        return text in await message_of(cluster, namespace, name)

    await async_wait_until(says, timeout=30, what=f"{name} says {text!r}")


async def test_kueue_queue_admits_to_its_quota_by_annotation_label_and_priority(
    cluster, namespace, fake_nodes, run_dispatcher, kueue_objects
):
    fake_nodes.add("n", cpu="8", memory="64Gi")
    cq = await kueue_setup(cluster, namespace)
    await run_dispatcher(kueue_quotas="instead")
    # Two of 2 CPU: one v1beta2 naming the queue by annotation, one v1beta1 by label.
    await apply(cluster, namespace, v1beta2("by-annotation", "1"))
    await apply(cluster, namespace, v1beta1("by-label", "1", {QUEUE_KEY: "user-queue"}))
    for name in ("by-annotation", "by-label"):
        await wait_condition(cluster, namespace, name, "Running", timeout=60)
    # Beyond the quota: waits in the ClusterQueue, saying so.
    await apply(cluster, namespace, v1beta2("beyond", "1"))
    await wait_message(cluster, namespace, "beyond", f"queue {cq}")
    # Newer, but of a WorkloadPriorityClass: it goes before `beyond` once room is made.
    high = {QUEUE_KEY: "user-queue", KUEUE_PRIORITY_LABEL: f"{namespace}-high"}
    await apply(cluster, namespace, v1beta1("urgent", "1", high))
    await wait_message(cluster, namespace, "urgent", f"queue {cq}")
    await async_holds_for(
        lambda: _none_dispatched(cluster, namespace, "beyond", "urgent"),
        seconds=QUIET_SECONDS / 2,
        what="nothing admitted beyond the ClusterQueue's 2 CPU",
    )
    await cluster.akubectl("delete", "aw", "by-label", "-n", namespace, "--wait=false")
    await wait_condition(cluster, namespace, "urgent", "Running", timeout=60)
    aw = await get_aw(cluster, namespace, "urgent")
    assert aw["status"]["admission"]["clusterQueue"] == cq
    assert await dispatched(cluster, namespace, "beyond") == []


async def _none_dispatched(cluster: Any, namespace: str, *names: str) -> bool:
    return await dispatched(cluster, namespace, *names) == []


async def test_kueue_running_leaves_its_queues_to_it(
    cluster, namespace, fake_nodes, run_dispatcher, kueue_objects
):
    """A validating webhook configuration with a rule on kueue.x-k8s.io is a sign that Kueue
    runs: its queues are then not read, and an AppWrapper naming one says why it waits."""
    fake_nodes.add("n", cpu="8", memory="64Gi")
    await kueue_setup(cluster, namespace, version="v1beta2")
    hook = KUEUE_WEBHOOK  # cluster-scoped: this module's tests run one at a time
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": hook},
        "webhooks": [
            {
                "name": "vclusterqueue.kb.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                # Never called: CONNECT is not an operation on these.
                "rules": [
                    {
                        "apiGroups": [KUEUE],
                        "apiVersions": ["*"],
                        "operations": ["CONNECT"],
                        "resources": ["clusterqueues"],
                    }
                ],
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},
            }
        ],
    }
    await cluster.akubectl("apply", "-f", "-", input=json.dumps(config))
    try:
        await run_dispatcher(kueue_quotas="beside")
        await apply(cluster, namespace, v1beta2("left", "1"))
        await wait_message(
            cluster, namespace, "left", f"Kueue itself runs (webhook configuration {hook}"
        )
        await async_holds_for(
            lambda: _none_dispatched(cluster, namespace, "left"),
            seconds=QUIET_SECONDS / 2,
            what="nothing admitted through Kueue's queue while Kueue runs",
        )
    finally:
        await cluster.akubectl("delete", "validatingwebhookconfiguration", hook, check=False)
