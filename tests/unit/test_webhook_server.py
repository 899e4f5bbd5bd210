"""The webhook endpoint (dispatcher.kube.webhook) over real TLS on 127.0.0.1: the protocol,
bad requests, and a handler that fails."""

from __future__ import annotations

import ssl
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from dispatcher.kube import webhook
from dispatcher.kube.certplan import issue_serving, make_ca


def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    now = time.time()
    ca = make_ca(now, 3600)
    served = issue_serving(ca, ["127.0.0.1"], now, 3600)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert.write_bytes(served.cert_pem)
        key.write_bytes(served.key_pem)
        server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    return server, client


async def mutate(request: Mapping[str, Any]) -> dict[str, Any]:
    return {"uid": request["uid"], "allowed": True}


async def validate(request: Mapping[str, Any]) -> dict[str, Any]:
    if request.get("namespace") == "boom":
        raise RuntimeError("the API server did not answer")
    return {"uid": request["uid"], "allowed": False, "status": {"message": "no"}}


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    server, client = contexts()
    runner, port = await webhook.serve(
        host="127.0.0.1", port=0, ssl_context=server, mutate=mutate, validate=validate
    )
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client))
    try:
        yield f"https://127.0.0.1:{port}", session
    finally:
        await session.close()
        await runner.cleanup()


def review(uid: str = "u-1", namespace: str = "team-a") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "namespace": namespace, "operation": "CREATE"},
    }


async def test_answers_each_path_with_the_request_uid(
    served: tuple[str, aiohttp.ClientSession],
) -> None:
    base, session = served
    async with session.post(base + webhook.MUTATE_PATH, json=review("a")) as response:
        body = await response.json()
    assert body == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "a", "allowed": True},
    }
    async with session.post(base + webhook.VALIDATE_PATH, json=review("b")) as response:
        body = await response.json()
    assert body["response"] == {"uid": "b", "allowed": False, "status": {"message": "no"}}


@pytest.mark.parametrize("payload", [b"not json", b"{}", b'{"request": []}', b'{"request": {}}'])
async def test_a_body_that_is_not_a_review_is_a_bad_request(
    served: tuple[str, aiohttp.ClientSession], payload: bytes
) -> None:
    base, session = served
    async with session.post(base + webhook.VALIDATE_PATH, data=payload) as response:
        assert response.status == 400
        assert "not an AdmissionReview" in await response.text()


async def test_a_failing_handler_refuses_with_the_cause(
    served: tuple[str, aiohttp.ClientSession],
) -> None:
    base, session = served
    async with session.post(base + webhook.VALIDATE_PATH, json=review("c", "boom")) as response:
        body = await response.json()
    assert body["response"]["uid"] == "c"
    assert body["response"]["allowed"] is False
    assert "the API server did not answer" in body["response"]["status"]["message"]
