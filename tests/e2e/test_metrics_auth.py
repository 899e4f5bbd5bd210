"""/metrics behind the API server's own authentication and authorization on the real control
plane (`metrics.auth: kubernetes`, over HTTPS with `metrics.cert_file`), started as
`app.serve_forever` starts it: a ServiceAccount token whose account is bound to the
shipped metrics-reader ClusterRole scrapes; another ServiceAccount's token is refused 403,
a scrape without a token 401, a made-up token 401; the kubelet's probes need none."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dispatcher.app import start_health
from dispatcher.kube import certplan
from testenv import pki
from testenv.ports import free_port
from tests.e2e.conftest import dispatcher_config

pytestmark = [pytest.mark.cluster]

READER_ROLE = Path(__file__).parents[2] / "manifests" / "metrics-reader.yaml"
READER = "prometheus"
NOT_READER = "someone"


@pytest.fixture
def reader_binding(cluster: Any, namespace: str) -> Iterator[None]:
    """The shipped ClusterRole, bound to ServiceAccount `prometheus` of this namespace."""
    cluster.kubectl("apply", "-f", str(READER_ROLE))
    for account in (READER, NOT_READER):
        cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    name = f"{namespace}-metrics-reader"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "appwrapper-dispatcher-metrics-reader",
        },
        "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": namespace}],
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(binding))
    yield
    cluster.kubectl("delete", "clusterrolebinding", name, "--ignore-not-found", check=False)


async def token_of(cluster: Any, namespace: str, account: str) -> str:
    result = await cluster.akubectl("create", "token", account, "-n", namespace)
    return str(result.stdout).strip()


@pytest.mark.usefixtures("reader_binding")
async def test_only_a_token_with_the_right_scrapes(
    cluster, namespace, fake_nodes, run_dispatcher, tmp_path
):
    authority = pki.make_ca("metrics-test-ca")
    serving = certplan.issue_serving(authority, ["127.0.0.1"], time.time(), 3600)
    cert, key = pki.write(serving, tmp_path, "tls")
    port = free_port()
    config = dispatcher_config(
        cluster,
        fake_nodes,
        health_port=port,
        metrics={"auth": "kubernetes", "cert_file": str(cert), "key_file": str(key)},
    )
    dispatcher = await run_dispatcher()
    stop = await start_health(config, dispatcher)
    trust = ssl.create_default_context(cadata=authority.cert_pem.decode())
    reader = await token_of(cluster, namespace, READER)
    not_reader = await token_of(cluster, namespace, NOT_READER)

    async def get(path: str, token: str | None) -> tuple[int, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = f"https://127.0.0.1:{port}{path}"
        async with session.get(url, headers=headers, ssl=trust) as response:
            return response.status, await response.text()

    try:
        async with aiohttp.ClientSession() as session:
            status, text = await get("/metrics", reader)
            assert status == 200
            assert "appwrapper_dispatcher_build_info" in text
            status, text = await get("/metrics", not_reader)
            assert status == 403
            assert text == (
                f"Forbidden: system:serviceaccount:{namespace}:{NOT_READER} may not get /metrics"
            )
            assert (await get("/metrics", None))[0] == 401
            assert (await get("/metrics", "made-up-token"))[0] == 401
            assert await get("/healthz", None) == (200, "ok")
            assert (await get("/readyz", None))[0] == 200
            # Plain HTTP is not served beside HTTPS.
            with pytest.raises(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    await response.read()
    finally:
        await stop()
