"""The webhook endpoint (dispatcher.kube.webhook) over real TLS on 127.0.0.1: the protocol,
bad requests, a handler that fails, the caller's client certificate (ClientAuth) and the cap
on requests handled at once."""

from __future__ import annotations

import asyncio
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
from testenv import pki

SERVER_CA = make_ca(time.time(), 3600)


def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    now = time.time()
    ca = SERVER_CA
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


# -- the caller's client certificate (webhook.client_ca_file) -----------------------------

API_SERVER = "kube-apiserver-webhook-client"


def client_session(tmp: Path, identity: pki.KeyPair | None) -> aiohttp.ClientSession:
    """A session that trusts the webhook's CA and presents `identity` (None: nothing)."""
    context = ssl.create_default_context(cadata=SERVER_CA.cert_pem.decode())
    if identity is not None:
        cert, key = pki.write(identity, tmp, f"caller-{identity.cert.serial_number:x}")
        context.load_cert_chain(cert, key)
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))


class Guarded:
    """A webhook served with ClientAuth over `ca_file`, recording the reviews it handled."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ca = pki.make_ca("api-server-clients")
        self.ca_file = tmp / "client-ca.crt"
        self.ca_file.write_bytes(self.ca.cert_pem)
        self.handled: list[str] = []
        self.base = ""
        self.auth: webhook.ClientAuth | None = None

    async def handler(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.handled.append(str(request["uid"]))
        return {"uid": request["uid"], "allowed": True, "patch": "c2lnbmVk"}

    async def post(self, identity: pki.KeyPair | None, uid: str) -> tuple[int, dict[str, Any]]:
        async with (
            client_session(self.tmp, identity) as session,
            session.post(self.base + webhook.MUTATE_PATH, json=review(uid)) as response,
        ):
            return response.status, await response.json()


@pytest_asyncio.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Guarded]:
    state = Guarded(tmp_path)
    server, _ = contexts()
    state.auth = webhook.ClientAuth(str(state.ca_file), [API_SERVER], server)
    runner, port = await webhook.serve(
        host="127.0.0.1",
        port=0,
        ssl_context=server,
        mutate=state.handler,
        validate=state.handler,
        client_auth=state.auth,
    )
    state.base = f"https://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


async def test_the_api_servers_certificate_is_answered(guarded: Guarded) -> None:
    status, body = await guarded.post(pki.issue_client(guarded.ca, API_SERVER), "ok")
    assert status == 200
    assert body["response"]["patch"] == "c2lnbmVk"
    assert guarded.handled == ["ok"]


async def test_a_dns_name_of_the_certificate_counts_too(guarded: Guarded) -> None:
    identity = pki.issue_client(guarded.ca, "apiserver-1", dns_names=(API_SERVER,))
    status, _ = await guarded.post(identity, "by-san")
    assert status == 200
    assert guarded.handled == ["by-san"]


@pytest.mark.parametrize(
    ("who", "expected"),
    [
        ("nobody", "no client certificate: only the API server may call this webhook"),
        ("wrong-name", "the client certificate names ['tenant'], none of webhook.client_names"),
    ],
)
async def test_a_caller_without_the_api_servers_certificate_gets_403(
    guarded: Guarded, who: str, expected: str
) -> None:
    identity = None if who == "nobody" else pki.issue_client(guarded.ca, "tenant")
    status, body = await guarded.post(identity, who)
    assert status == 403
    assert body["kind"] == "Status"
    assert body["message"] == expected
    assert "response" not in body
    assert guarded.handled == []  # the review was never read


async def test_a_certificate_from_another_ca_fails_the_handshake(guarded: Guarded) -> None:
    impostor = pki.issue_client(pki.make_ca("api-server-clients"), API_SERVER)
    # With TLS 1.3 the client learns it only when it reads: the connection is cut.
    with pytest.raises(aiohttp.ClientError):
        await guarded.post(impostor, "impostor")
    assert guarded.handled == []


async def test_a_ca_taken_out_of_the_file_is_refused_from_the_next_request(
    guarded: Guarded,
) -> None:
    old = pki.issue_client(guarded.ca, API_SERVER)
    new_ca = pki.make_ca("api-server-clients-2")
    new = pki.issue_client(new_ca, API_SERVER)
    guarded.ca_file.write_bytes(new_ca.cert_pem)
    assert guarded.auth is not None
    assert guarded.auth.reload()
    assert guarded.auth.reload() is False  # unchanged since: not read again
    status, body = await guarded.post(old, "old")
    assert (status, body["message"]) == (
        403,
        "the client certificate is not issued by a CA of webhook.client_ca_file",
    )
    status, _ = await guarded.post(new, "new")
    assert status == 200
    assert guarded.handled == ["new"]


async def test_an_unreadable_ca_file_keeps_the_cas_loaded(guarded: Guarded) -> None:
    guarded.ca_file.write_text("not a certificate")
    assert guarded.auth is not None
    assert guarded.auth.reload() is False
    status, _ = await guarded.post(pki.issue_client(guarded.ca, API_SERVER), "kept")
    assert status == 200


def test_a_ca_file_without_a_certificate_is_refused_at_start(tmp_path: Path) -> None:
    empty = tmp_path / "empty.crt"
    empty.write_text("")
    with pytest.raises(ValueError, match="no certificate"):
        webhook.ClientAuth(str(empty), [API_SERVER], ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))


# -- requests handled at once ---------------------------------------------------------------


async def test_requests_beyond_the_cap_wait_then_are_refused() -> None:
    server, client = contexts()
    release, busy = asyncio.Event(), asyncio.Event()
    entered: list[str] = []

    async def slow(request: Mapping[str, Any]) -> dict[str, Any]:
        entered.append(str(request["uid"]))
        busy.set()
        await release.wait()
        return {"uid": request["uid"], "allowed": True}

    runner, port = await webhook.serve(
        host="127.0.0.1",
        port=0,
        ssl_context=server,
        mutate=slow,
        validate=slow,
        limits=webhook.Limits(max_in_flight=1, queue_seconds=0.2),
    )
    base = f"https://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client)) as session:
            first = asyncio.create_task(session.post(base + webhook.MUTATE_PATH, json=review("1")))
            await asyncio.wait_for(busy.wait(), 10)
            async with session.post(base + webhook.MUTATE_PATH, json=review("2")) as response:
                assert response.status == 429
                body = await response.json()
            assert "answering 1 admission requests at once" in body["message"]
            assert entered == ["1"]  # the second was never handled
            release.set()
            async with await first as response:
                assert response.status == 200
            # Its turn given back: the next is handled.
            async with session.post(base + webhook.MUTATE_PATH, json=review("3")) as response:
                assert response.status == 200
            assert entered == ["1", "3"]
    finally:
        await runner.cleanup()
