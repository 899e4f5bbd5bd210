"""The webhook's certificates against the real API server: one Secret shared by replicas
started together, caBundle kept in both webhook configurations, the serving certificate
renewed and picked up by every replica, and a CA rotation during which the bundle the
configurations hold always verifies the certificate being served.

The webhook configurations made here call https://127.0.0.1:1/x, fail open (Ignore), and
match only a resource nobody serves: they never touch another test's requests.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import structlog
from cryptography import x509

from dispatcher.config import WebhookConfig
from dispatcher.kube import certplan
from dispatcher.kube.certs import MUTATING, SECRETS, VALIDATING, WebhookCerts
from dispatcher.kube.client import KubeClient
from testenv.waits import async_wait_until

pytestmark = [pytest.mark.cluster]

KINDS = (MUTATING, VALIDATING)


def webhook_configuration(kind: str, name: str) -> dict[str, Any]:
    def hook(prefix: str) -> dict[str, Any]:
        return {
            "name": f"{prefix}.webhook-certs.appwrapper.test",
            "clientConfig": {"url": "https://127.0.0.1:1/x"},
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 1,
            "rules": [
                {
                    "apiGroups": ["nobody.appwrapper.test"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["nothings"],
                }
            ],
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [hook("a"), hook("b")],
    }


@pytest.fixture
def configurations(cluster: Any, namespace: str) -> Iterator[str]:
    """Both webhook configurations, named after the test's namespace; removed after it."""
    for info in KINDS:
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps(webhook_configuration(info.kind, namespace))
        )
    yield namespace
    for info in KINDS:
        cluster.kubectl("delete", info.plural, namespace, "--ignore-not-found", check=False)


@pytest_asyncio.fixture
async def clients(cluster: Any) -> AsyncIterator[list[KubeClient]]:
    """Two connections: one per replica, as two processes would have."""
    made = [await KubeClient.connect(kubeconfig=str(cluster.kubeconfig)) for _ in range(2)]
    try:
        yield made
    finally:
        for client in made:
            await client.close()


def settings(namespace: str, configurations: str, **overrides: Any) -> WebhookConfig:
    return WebhookConfig(
        namespace=namespace,
        mutating_configuration=configurations,
        validating_configuration=configurations,
        extra_names=["127.0.0.1"],
        **overrides,
    )


async def ca_bundles(client: KubeClient, name: str) -> list[bytes]:
    """The caBundle of every webhook of both configurations."""
    found = []
    for info in KINDS:
        obj = await client.get(info, None, name)
        for webhook in obj["webhooks"]:
            found.append(base64.b64decode(webhook["clientConfig"].get("caBundle", "")))
    return found


async def secret_data(client: KubeClient, namespace: str, name: str) -> dict[str, bytes]:
    secret = await client.get(SECRETS, namespace, name)
    return {k: base64.b64decode(v) for k, v in secret["data"].items()}


def serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


@contextlib.asynccontextmanager
async def serving(certs: WebhookCerts) -> AsyncIterator[int]:
    """A TLS server on 127.0.0.1 with the replica's context; yields its port."""
    server = await asyncio.start_server(
        lambda r, w: w.close(), "127.0.0.1", 0, ssl=certs.ssl_context
    )
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def handshake(port: int, bundle: bytes) -> int:
    """The serial of what 127.0.0.1:`port` serves; fails unless `bundle` verifies it (as the
    API server checks a webhook)."""
    context = ssl.create_default_context(cadata=bundle.decode())
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def running(*replicas: WebhookCerts) -> AsyncIterator[None]:
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(r.run()) for r in replicas]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()


async def test_replicas_started_together_share_one_secret_and_publish_its_bundle(
    clients: list[KubeClient], namespace: str, configurations: str
) -> None:
    config = settings(namespace, configurations)
    replicas = [WebhookCerts(client, config) for client in clients]
    with structlog.testing.capture_logs() as logs:
        await asyncio.gather(*(r.start() for r in replicas))
    writes = [e for e in logs if e["event"] == "webhook_secret_written"]
    assert len(writes) == 1, writes  # the other replica got AlreadyExists and read it
    assert replicas[0].serving_cert == replicas[1].serving_cert
    assert replicas[0].signing_key == replicas[1].signing_key
    assert len(replicas[0].signing_key) == 32

    secret = await clients[0].get(SECRETS, namespace, config.secret_name)
    assert secret["type"] == "Opaque"
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/name": "appwrapper-dispatcher"}
    data = await secret_data(clients[0], namespace, config.secret_name)
    assert data[certplan.TLS_CERT] == replicas[0].serving_cert
    assert data[certplan.SIGNING_KEY] == replicas[0].signing_key
    assert await ca_bundles(clients[0], configurations) == [data[certplan.CA_BUNDLE]] * 4

    async with serving(replicas[1]) as port:
        assert await handshake(port, data[certplan.CA_BUNDLE]) == serial(data[certplan.TLS_CERT])


async def test_a_bundle_taken_out_of_a_configuration_is_put_back(
    clients: list[KubeClient], namespace: str, configurations: str, cluster: Any
) -> None:
    certs = WebhookCerts(clients[0], settings(namespace, configurations), check_seconds=0.2)
    await certs.start()
    # An upgrade re-applies the configuration as shipped: without a caBundle.
    cluster.kubectl(
        "replace",
        "-f",
        "-",
        input=json.dumps(webhook_configuration(VALIDATING.kind, configurations)),
    )

    async def restored() -> bool:
        return await ca_bundles(clients[1], configurations) == [certs.ca_bundle] * 4

    async with running(certs):
        await async_wait_until(restored, timeout=20, what="caBundle published again")


async def test_the_serving_cert_is_renewed_and_every_replica_serves_the_new_one(
    clients: list[KubeClient], namespace: str, configurations: str
) -> None:
    config = settings(namespace, configurations, cert_validity_seconds=6)
    first, second = (WebhookCerts(c, config, check_seconds=0.3) for c in clients)
    await first.start()
    await second.start()
    original = serial(first.serving_cert)
    async with serving(second) as port, running(first, second):

        async def renewed() -> int | None:
            data = await secret_data(clients[0], namespace, config.secret_name)
            now_serial = serial(data[certplan.TLS_CERT])
            if now_serial == original:
                return None
            if second.serving_cert != data[certplan.TLS_CERT]:
                return None  # not picked up yet
            return now_serial

        new = await async_wait_until(renewed, timeout=30, what="a renewed certificate served")
        bundles = await ca_bundles(clients[0], configurations)
        assert bundles == [first.ca_bundle] * 4  # renewal under the same CA: bundle unchanged
        served = await handshake(port, bundles[0])
        # Another renewal may have come by now; whatever is served, the bundle verifies it.
        assert served in (new, serial(second.serving_cert))


async def test_a_ca_rotation_never_serves_what_the_configurations_do_not_trust(
    clients: list[KubeClient], namespace: str, configurations: str
) -> None:
    # The CA is due after about 16 s, the switch comes a check later, the old CA leaves the
    # bundle when it expires at 24 s.
    config = settings(namespace, configurations, ca_validity_seconds=24)
    first, second = (WebhookCerts(c, config, check_seconds=1.0) for c in clients)
    await first.start()
    await second.start()
    original_ca = x509.load_pem_x509_certificate(first.ca_bundle)
    seen_both = False
    samples = 0

    async def sample() -> bool:
        """One look: what the configurations hold verifies what each replica serves. True
        once the rotation is over (a single new CA left in the bundle)."""
        nonlocal seen_both, samples
        # The two configurations are updated one after the other: each must verify.
        bundles = await ca_bundles(clients[0], configurations)
        assert bundles[0] == bundles[1], "the mutating configuration's webhooks disagree"
        assert bundles[2] == bundles[3], "the validating configuration's webhooks disagree"
        for bundle in {bundles[0], bundles[2]}:
            for port in ports:
                await handshake(port, bundle)  # raises if the bundle does not verify it
        samples += 1
        cas = [certplan.read_bundle(bundles[i]) for i in (0, 2)]
        if any(len(c) == 2 for c in cas):
            seen_both = True
        return seen_both and all(len(c) == 1 and c != [original_ca] for c in cas)

    async with serving(first) as one, serving(second) as two, running(first, second):
        ports = (one, two)
        await async_wait_until(sample, timeout=60, interval=0.1, what="a finished CA rotation")
    assert samples > 50
    data = await secret_data(clients[0], namespace, config.secret_name)
    issuer = x509.load_pem_x509_certificate(data[certplan.SIGNER_CERT])
    assert x509.load_pem_x509_certificate(data[certplan.TLS_CERT]).issuer == issuer.subject
    assert issuer != original_ca
