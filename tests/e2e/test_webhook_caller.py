"""Who may call the admission webhook, and what its callers cost the leader, against the
real API server (issue 23, points 1 and 3).

- Only the API server obtains a record: the local API server presents a client certificate
  to webhooks (LocalCluster.webhook_client_ca); a direct call without it, with one from
  another CA, or with another name gets no AdmissionReview at all.
- Where that cannot be configured, the registration check: with the webhook configurations
  deleted, the dispatcher signs nothing, and an AppWrapper stored meanwhile is never
  dispatched.
- A flood of dry-run creates naming unknown API groups, while a dispatcher process holds its
  Lease: renewed throughout, and the controller's own client makes no discovery request.

The webhook setup (users alice and bob, configurations scoped to the test's namespace) is
tests/e2e/test_security.py's `secure` fixture.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from dispatcher.core.gatekeeping import SIGNATURE, USER
from dispatcher.core.validation import DEFAULT_ALLOWED_KINDS
from dispatcher.kube.client import KubeClient
from dispatcher.kube.errors import KubeError
from dispatcher.kube.leader import LEASES
from dispatcher.kube.webhook import MUTATE_PATH, VALIDATE_PATH
from testenv import pki
from testenv.localcluster import WEBHOOK_CLIENT_NAME, free_port
from testenv.waits import async_wait_until
from tests.e2e.conftest import appwrapper, get_aw, service, wait_condition
from tests.e2e.test_security import Secure, pod, secure

pytestmark = [pytest.mark.cluster]
__all__ = ["secure"]  # the fixture, imported to be used here


# -- only the API server obtains a record (issue 23, point 1) --------------------------------


def forged_review(namespace: str, uid: str = "forged-1") -> dict[str, Any]:
    """What an attacker who reaches the webhook port sends: a cluster admin's userInfo."""
    obj = appwrapper("forged", pod("forged"))
    obj["metadata"]["namespace"] = namespace
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "workload.codeflare.dev", "version": "v1beta1", "kind": "AppWrapper"},
            "operation": "CREATE",
            "namespace": namespace,
            "object": obj,
            "userInfo": {"username": "admin", "groups": ["system:masters"]},
        },
    }


async def call_webhook(
    port: int, path: str, body: dict[str, Any], identity: tuple[Path, Path] | None = None
) -> tuple[int, dict[str, Any]]:
    """POST `body` to the webhook as a caller outside the API server would (trusting any
    serving certificate), presenting the client certificate `identity` (cert, key) if any."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if identity is not None:
        context.load_cert_chain(*identity)
    connector = aiohttp.TCPConnector(ssl=context)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"https://127.0.0.1:{port}{path}", json=body) as response,
    ):
        return response.status, await response.json()


async def test_a_direct_call_without_the_api_servers_certificate_gets_nothing(
    cluster: Any,
    namespace: str,
    fake_nodes: Any,
    run_dispatcher: Any,
    secure: Secure,
    tmp_path: Path,
) -> None:
    if cluster.webhook_client_ca is None:
        pytest.skip("the API server's client certificate for webhooks is not known here")
    await run_dispatcher(**secure.settings())
    own_ca = pki.KeyPair(
        cluster.webhook_client_ca.read_bytes(), cluster.webhook_client_ca_key.read_bytes()
    )
    # Named as the API server's, from another CA; and from the right CA, another name.
    impostor = pki.issue_client(pki.make_ca("impostor"), WEBHOOK_CLIENT_NAME)
    tenant = pki.issue_client(own_ca, "alice")
    for path in (MUTATE_PATH, VALIDATE_PATH):
        status, body = await call_webhook(secure.port, path, forged_review(namespace))
        assert (status, body["message"]) == (
            403,
            "no client certificate: only the API server may call this webhook",
        )
        assert "response" not in body  # no AdmissionReview: no patch, no access answer
        status, body = await call_webhook(
            secure.port, path, forged_review(namespace), pki.write(tenant, tmp_path, "tenant")
        )
        assert (status, body["message"]) == (
            403,
            "the client certificate names ['alice'], none of webhook.client_names",
        )
        with pytest.raises(aiohttp.ClientError):  # the handshake is cut
            await call_webhook(
                secure.port,
                path,
                forged_review(namespace),
                pki.write(impostor, tmp_path, "impostor"),
            )
    # The API server itself is answered: bob's apply is recorded as his.
    await secure.apply(appwrapper("bobs", service("bobs")), user="bob")
    annotations = (await get_aw(cluster, namespace, "bobs"))["metadata"]["annotations"]
    assert json.loads(annotations[USER])["username"] == "bob"


async def test_outage_a_direct_call_gets_no_record_and_nothing_is_created(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    """Where the API server cannot be given a client certificate (managed clusters), the
    registration check alone: with the webhook configurations deleted, the dispatcher signs
    nothing for anyone, and what alice stores meanwhile is never dispatched."""
    fake_nodes.add("n1")
    await run_dispatcher(**secure.settings(client_ca_file=None))
    await secure.apply(appwrapper("before", service("before")), user="bob")
    annotations = (await get_aw(cluster, namespace, "before"))["metadata"]["annotations"]
    assert annotations[SIGNATURE].startswith("v2:")  # signed while registered
    secure.remove_webhook_configurations()

    async def unregistered() -> bool:
        _, body = await call_webhook(secure.port, MUTATE_PATH, forged_review(namespace))
        return body["response"]["allowed"] is False

    await async_wait_until(unregistered, timeout=10, what="the replica saw the deletion")
    _, body = await call_webhook(secure.port, MUTATE_PATH, forged_review(namespace, "again"))
    assert body["response"]["uid"] == "again"
    assert "patch" not in body["response"]
    assert body["response"]["status"]["message"] == (
        "the dispatcher's admission webhook is not installed (its MutatingWebhookConfiguration"
        " does not exist): it signs no creator record now"
    )
    # What alice can store now: a record she wrote, without a valid signature.
    stored = appwrapper("stored", pod("stored"))
    stored["metadata"]["annotations"] = {
        USER: json.dumps({"username": "admin", "uid": "", "groups": ["system:masters"]}),
        SIGNATURE: "v1:" + "0" * 64,
    }
    await secure.apply(stored, user="alice")
    await wait_condition(cluster, namespace, "stored", "Failed")
    status = (await get_aw(cluster, namespace, "stored"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Forbidden"
    pods = await cluster.akubectl("get", "pod", "stored", "-n", namespace, check=False)
    assert pods.returncode != 0  # never created


# -- a flood of admission requests and the leader's Lease (issue 23, point 3) --------------

FLOOD = 1000
GROUPS = 300
IN_FLIGHT = 32
LEASE = {
    "lease_retry_period_seconds": 1.0,
    "lease_renew_deadline_seconds": 4.0,
    "lease_duration_seconds": 6.0,
}


def flood_item(api_version: str, kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}


def flooding(index: int) -> dict[str, Any]:
    """A Pod from a made-up group (refused by name) and two Widgets (an allowed kind no
    cluster serves: looked up), three of the GROUPS groups per AppWrapper."""
    groups = [f"x{(3 * index + n) % GROUPS}.example/v1" for n in range(3)]
    return appwrapper(
        f"flood-{index}",
        flood_item(groups[0], "Pod", "p"),
        flood_item(groups[1], "Widget", "w1"),
        flood_item(groups[2], "Widget", "w2"),
        custom=[{"replicas": 1, "requests": {"cpu": "100m"}}],
    )


class Replica:
    """`python -m dispatcher run` with leader election and the webhook, as deployed."""

    def __init__(self, cluster: Any, namespace: str, secure: Secure, workdir: Path) -> None:
        self.health = free_port()
        self.log = workdir / "replica.log"
        webhook = secure.settings()["webhook"].model_dump(mode="json")
        settings = {
            "kubeconfig": str(cluster.kubeconfig),
            "health_port": self.health,
            "leader_election": True,
            "lease_namespace": namespace,
            "log_format": "json",
            "members": [{"name": "local", "node_selector": {"appwrapper.test/pool": namespace}}],
            "unattributed": "refuse",
            "allowed_kinds": sorted(DEFAULT_ALLOWED_KINDS | {"Widget"}),
            "webhook": webhook,
            **LEASE,
        }
        config = workdir / "replica.yaml"
        config.write_text(yaml.safe_dump(settings))
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dispatcher", "run", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def events(self) -> list[str]:
        told = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                told.append(str(json.loads(line).get("event")))
        return told

    def api_requests(self) -> list[str]:
        """The controller's own requests to the hub, as /metrics counts them."""
        url = f"http://127.0.0.1:{self.health}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        return [line for line in text.splitlines() if line.startswith("appwrapper_dispatcher_api")]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def test_a_flood_of_dry_run_creates_costs_the_leader_nothing(
    cluster: Any, namespace: str, appwrapper_crd: None, secure: Secure, tmp_path: Path
) -> None:
    replica = Replica(cluster, namespace, secure, tmp_path)
    observer = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), name="observer")
    flood = await KubeClient.connect(
        kubeconfig=str(cluster.kubeconfig), name="flood", pool_size=IN_FLIGHT
    )
    identity_suffix = f"-{replica.process.pid}"
    path = f"/apis/workload.codeflare.dev/v1beta1/namespaces/{namespace}/appwrappers"
    try:

        async def lease() -> tuple[str, str]:
            try:
                found = await observer.get(LEASES, namespace, "appwrapper-dispatcher")
            except KubeError:
                return "", ""
            spec = found.get("spec") or {}
            return str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or "")

        async def leads() -> bool:
            return (await lease())[0].endswith(identity_suffix)

        async def admits() -> bool:
            try:
                await flood.request(
                    "POST", path, query={"dryRun": "All"}, body=appwrapper("ok", service("ok"))
                )
            except KubeError:
                return False
            return True

        await async_wait_until(leads, timeout=60, what="the replica leads")
        await async_wait_until(admits, timeout=60, what="its webhook answers")
        samples: list[tuple[str, str]] = []

        async def sample() -> None:
            while True:
                samples.append(await lease())
                await asyncio.sleep(0.2)

        turns = asyncio.Semaphore(IN_FLIGHT)

        async def create(index: int) -> str:
            async with turns:
                try:
                    await flood.request("POST", path, query={"dryRun": "All"}, body=flooding(index))
                except KubeError as exc:
                    return str(exc)
            return "admitted"

        sampler = asyncio.create_task(sample())
        started = time.monotonic()
        answers = await asyncio.gather(*(create(i) for i in range(FLOOD)))
        elapsed = time.monotonic() - started
        ended = datetime.now(UTC)

        async def renewed_since() -> bool:
            renewed = (await lease())[1]
            return bool(renewed) and datetime.fromisoformat(renewed) > ended

        await async_wait_until(renewed_since, timeout=10, what="a renewal after the flood")
        sampler.cancel()
        samples.append(await lease())
        print(f"{FLOOD} dry-run creates in {elapsed:.1f}s")

        for index, answer in enumerate(answers):
            group = f"x{(3 * index) % GROUPS}.example"
            assert "denied the request" in answer, answer
            assert f"kind Pod of API group {group!r} is not allowed" in answer, answer
            assert "kind 'Widget' in 'x" in answer, answer
        holders = {holder for holder, _ in samples}
        assert len(holders) == 1
        assert holders.pop().endswith(identity_suffix)
        renewals = sorted({datetime.fromisoformat(renewed) for _, renewed in samples})
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(renewals)]
        assert (renewals[-1] - renewals[0]).total_seconds() >= elapsed
        assert max(gaps) < LEASE["lease_renew_deadline_seconds"], gaps
        assert replica.process.poll() is None
        assert "leader_lost" not in replica.events()
        requests = replica.api_requests()
        assert any('resource="appwrappers"' in line for line in requests), requests
        assert not [line for line in requests if ".example" in line]
    finally:
        replica.stop()
        await flood.close()
        await observer.close()
