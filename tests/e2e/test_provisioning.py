"""Queued gangs grow the cluster: admission checks that create ProvisioningRequests, on the
real control plane, answered by the test kit's provisioner (testenv/provisioner.py),
which adds KWOK nodes for a whole request or refuses, expires or revokes it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from testenv.manifests import app_flavor, app_queue, cluster_queue
from testenv.provisioner import TestProvisioner
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    deployment,
    get_aw,
    pods_of,
    wait_condition,
    wait_established,
)

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("provisioning_crd")]

CRD = Path(__file__).resolve().parents[2] / "crds" / "provisioning" / "provisioningrequest.yaml"
GPU = "nvidia.com/gpu"
CHECK = "AdmissionCheck.prov"


@pytest.fixture(scope="session")
def provisioning_crd(cluster: Any) -> None:
    cluster.kubectl("apply", "-f", str(CRD))
    wait_established(cluster, "provisioningrequests.autoscaling.x-k8s.io")


def settings(**check: Any) -> dict[str, Any]:
    """Checks on for work without a queue; backoffs short enough for a test."""
    prov = {"backoff_base_seconds": 0.2, "backoff_max_seconds": 0.5, "retry_limit": 1, **check}
    return {
        "provisioning": {
            "enabled": True,
            "checks": {"prov": prov},
            "capacity_only_checks": ["prov"],
            "poll_seconds": 0.2,
        }
    }


def ray_like(name: str, workers: int = 8, **kwargs: Any) -> dict[str, Any]:
    """A head and `workers` GPU workers (Deployments: their pods run until removed)."""
    head = deployment(f"{name}-head", 1, {"cpu": "1"})
    gang = deployment(f"{name}-workers", workers, {"cpu": "1", GPU: "1"})
    return appwrapper(name, head, gang, **kwargs)


async def requests_of(cluster: Any, namespace: str) -> list[dict[str, Any]]:
    out = await cluster.akubectl("get", "provisioningrequests", "-n", namespace, "-o", "json")
    return list(json.loads(out.stdout)["items"])


async def condition(cluster: Any, namespace: str, name: str, kind: str) -> dict[str, Any]:
    aw = await get_aw(cluster, namespace, name)
    found = [c for c in (aw.get("status") or {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


async def test_a_gang_that_fits_nowhere_gets_its_nodes_and_runs(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("cpu", cpu="4", memory="16Gi")  # room for the head, no GPU anywhere
    async with TestProvisioner(
        cluster.kubeconfig, namespace, labels=fake_nodes.pool, delay=1.0
    ) as provisioner:
        await run_dispatcher(**settings())
        started = time.monotonic()
        await apply(cluster, namespace, ray_like("gang"))
        await wait_condition(cluster, namespace, "gang", "QuotaReserved", timeout=30)
        await wait_condition(cluster, namespace, "gang", "Running", timeout=60)
        took = time.monotonic() - started
        (request,) = await requests_of(cluster, namespace)
        aw = await get_aw(cluster, namespace, "gang")
        # One request, owned by the AppWrapper, a pod set per pod shape, all nine pods.
        assert request["metadata"]["ownerReferences"][0]["uid"] == aw["metadata"]["uid"]
        assert sorted(p["count"] for p in request["spec"]["podSets"]) == [1, 8]
        assert request["spec"]["provisioningClassName"] == (
            "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
        )
        ready = await condition(cluster, namespace, "gang", CHECK)
        assert ready["status"] == "True"
        reserved = await condition(cluster, namespace, "gang", "QuotaHeld")
        assert reserved["reason"] == "AdmissionChecksReady"
        # Every worker runs on a node the provisioner made for this request.
        made = set(provisioner.nodes[request["metadata"]["name"]])
        workers = [
            p
            for p in await pods_of(cluster, namespace, "gang")
            if p["metadata"]["name"].startswith("gang-workers")
        ]
        assert len(workers) == 8
        assert {p["spec"]["nodeName"] for p in workers} <= made
        provisioner_time = provisioner.provisioned_in[request["metadata"]["name"]]
        print(
            f"\n1 head + 8 GPU workers: Running {took:.2f}s after apply;"
            f" provisioner {provisioner_time:.2f}s; dispatcher {took - provisioner_time:.2f}s"
        )
        assert took - provisioner_time < 5.0


async def test_a_refused_request_is_retried_then_the_appwrapper_fails(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("cpu", cpu="4", memory="16Gi")
    async with TestProvisioner(
        cluster.kubeconfig, namespace, labels=fake_nodes.pool, mode="refuse"
    ):
        await run_dispatcher(**settings(retry_limit=1))
        await apply(cluster, namespace, ray_like("refused", workers=2))
        await wait_condition(cluster, namespace, "refused", "Failed", timeout=30)
        failed = await condition(cluster, namespace, "refused", "Failed")
        assert failed["reason"] == "ProvisioningFailed"
        assert "provisioning failed 2 times: test provisioner: refused" in failed["message"]
        # Two attempts, each with its own name; nothing of the AppWrapper's was created.
        names = sorted(r["metadata"]["name"] for r in await requests_of(cluster, namespace))
        assert [n.rsplit("-", 1)[1] for n in names] == ["1", "2"]
        assert await pods_of(cluster, namespace, "refused") == []
        aw = await get_aw(cluster, namespace, "refused")
        assert not aw["status"].get("dispatchedObjects")


async def test_a_booking_that_expires_before_dispatch_is_asked_for_again(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("cpu", cpu="4", memory="16Gi")
    async with TestProvisioner(
        cluster.kubeconfig, namespace, labels=fake_nodes.pool, mode="expire", then="provision"
    ) as provisioner:
        await run_dispatcher(**settings())
        await apply(cluster, namespace, ray_like("expiring", workers=2))
        await wait_condition(cluster, namespace, "expiring", "Running", timeout=60)
        answers = sorted(provisioner.answered.values())
        assert answers == ["BookingExpired", "Provisioned"]
        assert len(await requests_of(cluster, namespace)) == 2


async def test_a_provisioned_gang_whose_nodes_were_taken_asks_again_and_runs(
    cluster, namespace, fake_nodes, run_dispatcher
):
    """Liveness: other work's pod lands on one of the new nodes before the gang is placed,
    so it no longer fits them; after the fit timeout it gives its booking up and asks
    again, and runs on the second request's nodes. It is never failed for it."""
    fake_nodes.add("cpu", cpu="4", memory="16Gi")
    async with TestProvisioner(
        cluster.kubeconfig, namespace, labels=fake_nodes.pool, mode="squat", then="provision"
    ) as provisioner:
        config = settings()
        config["provisioning"]["fit_timeout_seconds"] = 1.0
        await run_dispatcher(**config)
        await apply(cluster, namespace, ray_like("taken", workers=2))
        await wait_condition(cluster, namespace, "taken", "Running", timeout=60)
        # The check said why (its condition then went on to the second attempt; its Event
        # stays).
        selector = "involvedObject.kind=AppWrapper,involvedObject.name=taken"
        listed = await cluster.akubectl(
            "get", "events", "-n", namespace, "--field-selector", selector, "-o", "json"
        )
        said = [e for e in json.loads(listed.stdout)["items"] if "nodes were taken" in e["message"]]
        assert [e["reason"] for e in said] == ["Retry"]
        assert "provisioned (attempt 1)" in said[0]["message"]
        assert "not placed within 1s" in said[0]["message"]
        requests = {
            r["metadata"]["labels"]["workload.codeflare.dev/attempt"]: r
            for r in await requests_of(cluster, namespace)
        }
        assert sorted(requests) == ["1", "2"]
        assert sorted(provisioner.answered.values()) == ["Provisioned", "Provisioned"]
        workers = [
            p
            for p in await pods_of(cluster, namespace, "taken")
            if p["metadata"]["name"].startswith("taken-workers")
        ]
        # On the nodes made for it (either request: a free one of the first serves too),
        # never on the one taken.
        made = {n for names in provisioner.nodes.values() for n in names}
        (first,) = provisioner.squatters
        taken = provisioner.nodes[first][-1]
        placed = {p["spec"]["nodeName"] for p in workers}
        assert len(workers) == 2
        assert placed <= made
        assert taken not in placed
        aw = await get_aw(cluster, namespace, "taken")
        assert not any(
            c["type"] == "Failed" and c["status"] == "True" for c in aw["status"]["conditions"]
        )


async def test_capacity_revoked_after_dispatch_requeues_the_gang_and_asks_again(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("cpu", cpu="4", memory="16Gi")
    async with TestProvisioner(
        cluster.kubeconfig, namespace, labels=fake_nodes.pool, mode="revoke", expire_after=1.0
    ) as provisioner:
        await run_dispatcher(**settings())
        await apply(cluster, namespace, ray_like("spot", workers=2))
        await wait_condition(cluster, namespace, "spot", "Running", timeout=60)
        provisioner.mode = "provision"  # the next attempt keeps its nodes

        async def requeued() -> dict[str, Any] | None:
            found = await condition(cluster, namespace, "spot", "Requeued")
            return found if found.get("reason") == "CapacityRevoked" else None

        found = await async_wait_until(requeued, timeout=30, what="requeued: capacity revoked")
        assert "admission check prov" in found["message"]
        await wait_condition(cluster, namespace, "spot", "Running", timeout=60)
        assert sorted(provisioner.answered.values()) == ["CapacityRevoked", "Provisioned"]


async def test_deleting_an_appwrapper_removes_its_pending_request_and_templates(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("cpu", cpu="4", memory="16Gi")
    async with TestProvisioner(cluster.kubeconfig, namespace, labels=fake_nodes.pool, delay=600):
        await run_dispatcher(**settings())
        await apply(cluster, namespace, ray_like("gone", workers=2))

        async def made() -> bool:
            return len(await requests_of(cluster, namespace)) == 1

        await async_wait_until(made, timeout=30, what="the request is made")
        # A dispatcher started again finds the request by its name: it makes no second one.
        await run_dispatcher(restart=True, **settings())

        async def still_one() -> bool:
            return len(await requests_of(cluster, namespace)) == 1

        await async_holds_for(still_one, seconds=QUIET_SECONDS / 2, what="one request only")
        templates = await cluster.akubectl("get", "podtemplates", "-n", namespace, "-o", "name")
        assert len(templates.stdout.split()) == 2
        await cluster.akubectl("delete", "appwrapper", "gone", "-n", namespace, "--timeout=30s")

        async def all_gone() -> bool:
            left = await cluster.akubectl(
                "get", "provisioningrequests,podtemplates", "-n", namespace, "-o", "name"
            )
            return not left.stdout.split()

        await async_wait_until(all_gone, timeout=30, what="request and templates collected")


async def test_a_check_naming_an_unknown_class_says_so_and_makes_nothing(
    cluster, namespace, fake_nodes, run_dispatcher
):
    fake_nodes.add("cpu", cpu="4", memory="16Gi")
    await run_dispatcher(**settings(provisioning_class="nodes.example.com"))
    await apply(cluster, namespace, ray_like("odd", workers=2))

    async def says() -> dict[str, Any] | None:
        found = await condition(cluster, namespace, "odd", CHECK)
        return found if found.get("reason") == "CheckMisconfigured" else None

    found = await async_wait_until(says, timeout=30, what="the check says it is misconfigured")
    assert "provisioning class nodes.example.com is unknown" in found["message"]

    async def nothing_made() -> bool:
        return await requests_of(cluster, namespace) == [] and not await pods_of(
            cluster, namespace, "odd"
        )

    await async_holds_for(nothing_made, seconds=QUIET_SECONDS / 2, what="no request, no pods")


async def test_a_queue_with_checks_holds_its_quota_while_the_gang_is_provisioned(
    cluster, namespace, fake_nodes, run_dispatcher, quotas
):
    fake_nodes.add("cpu", cpu="4", memory="16Gi")
    cq = f"{namespace}-cq"
    flavor = f"{namespace}-any"
    pool = {"cloud.example/pool": "gpu"}
    await cluster.akubectl("apply", "-f", "-", input=json.dumps(app_flavor(flavor, pool)))
    queue = cluster_queue(
        cq, {flavor: {"cpu": 8, "memory": "64Gi", GPU: 2}}, admissionChecks=["prov"]
    )
    await cluster.akubectl("apply", "-f", "-", input=json.dumps(queue))
    await apply(cluster, namespace, app_queue("team", cq))
    async with TestProvisioner(cluster.kubeconfig, namespace, labels=fake_nodes.pool, delay=600):
        config = settings()
        config["provisioning"]["capacity_only_checks"] = []
        await run_dispatcher(**config)
        await apply(cluster, namespace, ray_like("first", workers=2, queue="team"))
        await wait_condition(cluster, namespace, "first", "QuotaReserved", timeout=30)
        aw = await get_aw(cluster, namespace, "first")
        assert aw["status"]["admission"]["clusterQueue"] == cq

        async def templates() -> list[dict[str, Any]] | None:
            out = await cluster.akubectl("get", "podtemplates", "-n", namespace, "-o", "json")
            found = json.loads(out.stdout)["items"]
            return found if len(found) == 2 else None

        # The nodes asked for are those of the flavor its quota came from.
        made = await async_wait_until(templates, timeout=30, what="the request's templates")
        assert [t["template"]["spec"]["nodeSelector"] for t in made] == [pool, pool]
        # The second gang needs the GPU quota the first one holds while it is provisioned.
        await apply(cluster, namespace, ray_like("second", workers=2, queue="team"))

        async def second_waits_for_quota() -> bool:
            status = (await get_aw(cluster, namespace, "second")).get("status") or {}
            return (
                GPU in str(status.get("message") or "")
                and len(await requests_of(cluster, namespace)) == 1
            )

        await async_wait_until(second_waits_for_quota, timeout=30, what="second waits for quota")
