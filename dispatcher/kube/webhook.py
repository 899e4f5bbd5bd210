"""The webhook server's HTTPS endpoints: AdmissionReview v1 in, AdmissionReview out; and
the CRD's conversion webhook, ConversionReview v1 in and out (`CONVERT_PATH`).

Side effects: listens on a TCP port with TLS; with `ClientAuth`, reads the client CA file.
What to answer is decided by the handlers it is given (controller/access/gatekeeper.py); this
module only speaks the protocol, checks who calls (`ClientAuth`: the API server's client
certificate) and bounds how many requests are handled at once. Conversions are answered
by dispatcher.core.convert, pure functions of the objects sent, to any caller: the API
server presents no client certificate to conversion webhooks (its conversion client is made
with no kubeconfig: only admission webhooks get one, from the AdmissionConfiguration;
tests/e2e/test_conversion_boundary.py shows it), and a conversion reads nothing, signs
nothing and never takes a status from what it is sent. Every replica serves it, leader or
not: the API server may call any of them.

Admission and conversion each have turns of their own (`Limits`), so a flood of one never
refuses the other; and a body is read, within `Limits.read_seconds` and MAX_BODY_BYTES,
before any turn is taken, so a slow sender holds no turn.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from dispatcher.core import crdcheck
from dispatcher.core.convert import ConversionError, convert
from dispatcher.kube.errors import Undecodable
from dispatcher.kube.jsoncodec import decode, encode

MUTATE_PATH = "/mutate-appwrapper"
VALIDATE_PATH = "/validate-appwrapper"
CONVERT_PATH = crdcheck.CONVERT_PATH
MAX_BODY_BYTES = 8 * 2**20
"""An AppWrapper is at most what etcd stores (~1.5 MB), sent twice on UPDATE (object and
oldObject) plus JSON overhead."""

Handler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Limits:
    """What one replica's webhook takes on at once (webhook settings of the same names)."""

    max_in_flight: int = 32
    """Admission reviews handled at once."""
    conversion_max_in_flight: int = 16
    """Conversion reviews handled at once, apart from the admission reviews' turns."""
    queue_seconds: float = 2.0
    """How long a review waits for a turn (or to be read) before it is refused (429)."""
    read_seconds: float = 5.0
    """How long reading one body may take; a slower sender gets 408."""


def certificate_names(cert: x509.Certificate) -> set[str]:
    """The common names and DNS names a certificate is issued to."""
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    names = {str(attribute.value) for attribute in common}
    try:
        alternative = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return names
    return names | set(alternative.value.get_values_for_type(x509.DNSName))


class ClientAuth:
    """Only a caller with a client certificate from the CAs in `ca_file`, issued to one of
    `names`, is answered: the API server, configured to present one to webhooks.

    The TLS layer asks every caller for a certificate and refuses, in the handshake, one
    that no CA it has loaded signed (`ssl.CERT_OPTIONAL`: without one the handshake
    succeeds, so that probes of /healthz need none, and the request is refused with 403).
    OpenSSL can add CAs to a live context but not take one away, so `problem` checks the
    certificate again against the file as it is now: a CA removed from the file is refused
    from the next request on. The file must hold the CA that issued the certificate itself
    (an intermediate, if one is used).
    """

    def __init__(self, ca_file: str, names: Collection[str], context: ssl.SSLContext) -> None:
        self.ca_file = ca_file
        self.names = frozenset(names)
        self._context = context
        self._cas: list[x509.Certificate] = []
        self._seen: tuple[int, ...] = ()
        self.log = structlog.get_logger("webhook").bind(client_ca_file=ca_file)
        context.verify_mode = ssl.CERT_OPTIONAL
        self.reload()

    def reload(self) -> bool:
        """Read the file again if it changed; True when it did and was loaded. A file that
        cannot be read or holds no certificate leaves the CAs as they were (after the first
        load), and says so."""
        try:
            stat = os.stat(self.ca_file)  # follows the symlinks a mounted Secret is made of
            seen = (stat.st_mtime_ns, stat.st_ino, stat.st_size)
            if seen == self._seen:
                return False
            with open(self.ca_file, "rb") as file:
                pem = file.read()
            cas = x509.load_pem_x509_certificates(pem)
            if not cas:
                raise ValueError("no certificate")
            for ca in cas:
                self._context.load_verify_locations(
                    cadata=ca.public_bytes(serialization.Encoding.PEM).decode()
                )
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            if not self._cas:
                raise ValueError(
                    f"webhook.client_ca_file {self.ca_file}: no certificate in it ({exc})"
                ) from exc
            self.log.warning("webhook_client_ca_unusable", error=str(exc))
            return False
        self._cas = cas
        self._seen = seen
        self.log.info("webhook_client_ca_loaded", cas=len(cas))
        return True

    def problem(self, der: bytes | None) -> str:
        """Why the caller whose certificate is `der` (None: it sent none) is not answered;
        "" when it is."""
        if not der:
            return "no client certificate: only the API server may call this webhook"
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:  # one OpenSSL accepted but cryptography cannot read
            return "the client certificate cannot be read"
        if not any(issued_by(cert, ca) for ca in self._cas):
            return "the client certificate is not issued by a CA of webhook.client_ca_file"
        names = certificate_names(cert)
        if not names & self.names:
            return f"the client certificate names {sorted(names)}, none of webhook.client_names"
        return ""


def issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """Whether `ca` signed `cert` directly (its issuer named and its signature checked)."""
    if cert.issuer != ca.subject:
        return False
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def review_answer(request: Mapping[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": str(request.get("apiVersion") or "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


class _Turns:
    """At most `size` holders at once; one that waited `seconds` for its turn is refused."""

    def __init__(self, size: int, seconds: float) -> None:
        self.size = size
        self._seconds = seconds
        self._free = asyncio.Semaphore(size)

    async def take(self) -> bool:
        try:
            # Not wait_for: on Python 3.11 it can lose a cancellation or a turn taken as
            # the time runs out.
            async with asyncio.timeout(self._seconds):
                await self._free.acquire()
        except TimeoutError:
            return False
        return True

    def give_back(self) -> None:
        self._free.release()


class _Endpoint:
    """One kind of review (admission or conversion): its bodies read at most `2 * size` at
    once, each within `read_seconds`, before one of its `size` turns to be answered is taken."""

    def __init__(self, name: str, size: int, limits: Limits, busy: str) -> None:
        self.name = name
        self._reading = _Turns(2 * size, limits.queue_seconds)
        self._answering = _Turns(size, limits.queue_seconds)
        self._read_seconds = limits.read_seconds
        self._busy = busy
        self._log = structlog.get_logger("webhook")

    async def answer(
        self, request: web.Request, respond: Callable[[bytes], Awaitable[web.Response]]
    ) -> web.Response:
        if not await self._reading.take():
            return await _unread(request, self._refused(request.path, self._reading.size))
        try:
            body = await self._read(request)
        finally:
            self._reading.give_back()
        if isinstance(body, web.Response):
            return await _unread(request, body)
        if not await self._answering.take():
            return self._refused(request.path, self._answering.size)
        try:
            return await respond(body)
        finally:
            self._answering.give_back()

    async def _read(self, request: web.Request) -> bytes | web.Response:
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return _too_large()
        try:
            async with asyncio.timeout(self._read_seconds):
                return await request.read()
        except TimeoutError:
            self._log.warning("webhook_slow_body", path=request.path, seconds=self._read_seconds)
            return status_response(
                408, "Timeout", f"the request body took longer than {self._read_seconds} s"
            )
        except web.HTTPRequestEntityTooLarge:
            return _too_large()

    def _refused(self, path: str, in_flight: int) -> web.Response:
        self._log.warning("webhook_busy", path=path, endpoint=self.name, in_flight=in_flight)
        return status_response(429, "TooManyRequests", self._busy)


async def _unread(request: web.Request, response: web.Response) -> web.Response:
    """`response` sent, then the connection closed: a body left unread (too slow, too large,
    no turn to read it) is not waited for, as aiohttp would for up to 10 s to keep the
    connection."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


def _too_large() -> web.Response:
    return status_response(
        413, "RequestEntityTooLarge", f"the body is larger than {MAX_BODY_BYTES} bytes"
    )


class _Reviews:
    """The endpoints' answers: the caller checked (with `client_auth`, admission only: the API
    server presents no certificate for conversions), each endpoint within its own `Limits`,
    and an answer whatever happens."""

    def __init__(self, *, client_auth: ClientAuth | None, limits: Limits) -> None:
        self._client_auth = client_auth
        self._admission = _Endpoint(
            "admission",
            limits.max_in_flight,
            limits,
            f"the dispatcher is answering {limits.max_in_flight} admission requests at once "
            "(webhook.max_in_flight); try again",
        )
        self._conversion = _Endpoint(
            "conversion",
            limits.conversion_max_in_flight,
            limits,
            f"the dispatcher is answering {limits.conversion_max_in_flight} conversion "
            "requests at once (webhook.conversion_max_in_flight); try again",
        )
        self._log = structlog.get_logger("webhook")

    def admission(
        self, handler: Handler, path: str
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def answer(request: web.Request) -> web.Response:
            if self._client_auth is not None:
                refused = self._client_auth.problem(peer_certificate(request))
                if refused:
                    self._log.warning("webhook_caller_refused", path=path, reason=refused)
                    return status_response(403, "Forbidden", refused)
            return await self._admission.answer(
                request, lambda body: self._review(body, handler, path)
            )

        return answer

    async def _review(self, body: bytes, handler: Handler, path: str) -> web.Response:
        try:
            review, inner = _read_review(body)
        except (ValueError, KeyError, TypeError, Undecodable) as exc:
            return web.Response(status=400, text=f"not an AdmissionReview: {exc}\n")
        try:
            response = await handler(inner)
        except Exception as exc:  # answer, whatever happened: fail closed with the cause
            self._log.exception("webhook_error", path=path, namespace=inner.get("namespace"))
            response = {
                "uid": inner["uid"],
                "allowed": False,
                "status": {
                    "code": 500,
                    "message": f"the dispatcher could not check this request: {exc}",
                },
            }
        return web.json_response(review_answer(review, response))

    async def conversion(self, request: web.Request) -> web.Response:
        # No client certificate: the API server presents none to conversion webhooks.
        return await self._conversion.answer(request, self._convert)

    async def _convert(self, body: bytes) -> web.Response:
        # Reading, converting and writing are CPU alone, and a large or deep body takes a
        # while (the iterative reader): in a thread, so that admission is answered meanwhile.
        status, answer = await asyncio.to_thread(conversion_answer, body)
        if status != 200:
            return web.Response(status=status, text=answer.decode())
        return web.Response(body=answer, content_type="application/json")


def conversion_answer(body: bytes) -> tuple[int, bytes]:
    """The HTTP status and body answering a ConversionReview `body`: 200 and the review
    answered, or 400 and why it is not one."""
    try:
        review, inner = _read_review(body)
    except (ValueError, KeyError, TypeError, Undecodable) as exc:
        return 400, f"not a ConversionReview: {exc}\n".encode()
    answer = {
        "apiVersion": str(review.get("apiVersion") or "apiextensions.k8s.io/v1"),
        "kind": "ConversionReview",
        "response": conversion_response(inner),
    }
    # encode, not json.dumps: an object may be nested past the json module's reach.
    return 200, encode(answer)


def _read_review(body: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """A review and its `request` (which must carry a uid); ValueError, KeyError,
    TypeError or Undecodable when the body is not one."""
    review = decode(body)
    inner = review["request"]
    if not isinstance(inner, dict) or "uid" not in inner:
        raise ValueError("no request.uid")
    return review, inner


async def serve(
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    mutate: Handler,
    validate: Handler,
    client_auth: ClientAuth | None = None,
    limits: Limits = Limits(),
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call `cleanup()` to stop) and the port bound
    (`port` 0 picks a free one). With `client_auth`, only callers it accepts get an
    admission answer. What is handled at once, and how long a body may take: `limits`."""
    reviews = _Reviews(client_auth=client_auth, limits=limits)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(CONVERT_PATH, reviews.conversion)
    app.router.add_post(MUTATE_PATH, reviews.admission(mutate, MUTATE_PATH))
    app.router.add_post(VALIDATE_PATH, reviews.admission(validate, VALIDATE_PATH))
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    # The port really bound (when 0 was asked for, a free one).
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    structlog.get_logger("webhook").info(
        "webhook_serving", host=host, port=bound, client_auth=client_auth is not None
    )
    return runner, bound


def conversion_response(request: Mapping[str, Any]) -> dict[str, Any]:
    """The answer to one ConversionReview request: every object converted, or a Failure
    naming the object and field that could not be (the API server then fails the request
    that needed it, with that message: nothing is converted with a part left out)."""
    desired = str(request.get("desiredAPIVersion") or "")
    objects = request.get("objects") or []
    converted: list[dict[str, Any]] = []
    for obj in objects if isinstance(objects, list) else []:
        try:
            if not isinstance(obj, dict):
                raise ConversionError("not an object")
            converted.append(convert(obj, desired))
        except Exception as exc:  # a Failure naming the object, whatever it was: never a 500
            metadata = obj.get("metadata") if isinstance(obj, dict) else None
            metadata = metadata if isinstance(metadata, dict) else {}
            name = f"{metadata.get('namespace')}/{metadata.get('name')}"
            why = str(exc) if isinstance(exc, ConversionError) else f"cannot be converted ({exc!r})"
            structlog.get_logger("webhook").warning(
                "conversion_refused", appwrapper=name, desired=desired, error=why[:500]
            )
            return {
                "uid": request.get("uid", ""),
                "result": {"status": "Failure", "message": f"AppWrapper {name}: {why[:2000]}"},
            }
    return {
        "uid": request.get("uid", ""),
        "convertedObjects": converted,
        "result": {"status": "Success"},
    }


def peer_certificate(request: web.Request) -> bytes | None:
    transport = request.transport
    tls = transport.get_extra_info("ssl_object") if transport is not None else None
    if not isinstance(tls, ssl.SSLObject | ssl.SSLSocket):
        return None
    return tls.getpeercert(binary_form=True)


def status_response(code: int, reason: str, message: str) -> web.Response:
    """A refusal the API server shows as it is: a Status object (any other answer than 200
    makes the call fail, and with failurePolicy Fail the request is refused)."""
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.json_response(body, status=code)
