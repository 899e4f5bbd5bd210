"""The admission webhook's TLS material and the record-signing key, kept in one Secret that
every replica shares.

Side effects: reads, watches and writes that Secret (and creates it); reads and replaces the
`caBundle` of the dispatcher's Mutating- and ValidatingWebhookConfiguration, and that of the
AppWrapper CRD's conversion webhook (`webhook.conversion_crd`); writes each new
serving key pair to a private temporary directory just long enough for `ssl` to load it;
with `cert_dir`, reads the certificate files someone else (cert-manager) keeps there.

What to do with the Secret is decided in `certplan.py` (pure); this module reads, writes and
loads. Any replica may carry out a step: writes carry the Secret's resourceVersion, so when
two try at once one gets Conflict, reads the other's result, and plans again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import urlsplit

import structlog
from cryptography import x509

from dispatcher.clock import Clock, SystemClock
from dispatcher.config import WebhookConfig
from dispatcher.kube import certplan
from dispatcher.kube.api import KubeApi
from dispatcher.kube.certplan import CA_BUNDLE, SIGNING_KEY, TLS_CERT, TLS_KEY, CertState
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import Conflict, Gone, KubeError, NotFound

SECRETS = ResourceInfo("v1", "Secret", "secrets", namespaced=True)
MUTATING = ResourceInfo(
    "admissionregistration.k8s.io/v1",
    "MutatingWebhookConfiguration",
    "mutatingwebhookconfigurations",
    namespaced=False,
)
VALIDATING = ResourceInfo(
    "admissionregistration.k8s.io/v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)
CRDS = ResourceInfo(
    "apiextensions.k8s.io/v1",
    "CustomResourceDefinition",
    "customresourcedefinitions",
    namespaced=False,
)
LABELS = {"app.kubernetes.io/name": "appwrapper-dispatcher"}
MAX_ATTEMPTS = 10
"""Conflicts in a row one check accepts; each means another replica wrote, so the state is
moving towards what we want anyway, and the next check goes on from there."""
MIN_WAIT = 0.1
WATCHED = ("ADDED", "MODIFIED", "DELETED")


def _decode(secret: dict[str, Any]) -> CertState:
    data: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            data[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            continue  # unreadable: as if missing, so the plan replaces it
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    started: float | None = None
    stamp = annotations.get(certplan.ROTATION_STARTED)
    if stamp:
        try:
            started = datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            started = None
    return CertState(data, started)


def _encode(data: Mapping[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode() for key, value in sorted(data.items())}


def _stamp(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="microseconds")


class WebhookCerts:
    """The serving certificate (`ssl_context`) and `signing_key` of every replica's webhook."""

    def __init__(
        self,
        client: KubeApi,
        config: WebhookConfig,
        *,
        now: Callable[[], float] = time.time,
        clock: Clock | None = None,
        check_seconds: float = 30.0,
        on_keys: Callable[[tuple[bytes, ...]], None] = lambda keys: None,
    ) -> None:
        self.client = client
        self._on_keys = on_keys
        """Told the new `signing_keys` the moment they change (the controller verifies with
        them: a record signed with a new key must not meet an old set there)."""
        self.config = config
        self.now = now
        self._clock = clock or SystemClock()
        """What the checks are paced with (`now` is what certificates are dated by)."""
        self.check_seconds = check_seconds
        self.policy = certplan.CertPolicy.from_config(config, check_seconds=check_seconds)
        self.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ssl_context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.key_policy = certplan.KeyPolicy.from_config(config)
        self.signing_key = b""
        """The key this replica signs records with (the Secret's current one)."""
        self.signing_keys: tuple[bytes, ...] = ()
        """The keys records verify with: `signing_key`, then the retired ones still valid.
        Replaced whole at each check, never changed in place: a reader holding the old
        tuple sees one consistent set."""
        self.serving_cert = b""
        """The PEM of the certificate `ssl_context` serves."""
        self.ca_bundle = b""
        """The CAs the webhook configurations are told to trust (PEM); empty with cert_dir."""
        self._due_at = math.inf
        self._missing: set[str] = set()
        self._files: tuple[int, ...] = ()
        self.log = structlog.get_logger("webhook_certs").bind(
            secret=f"{config.namespace}/{config.secret_name}"
        )

    async def start(self) -> None:
        """Make sure the Secret holds what is needed, serve its certificate, publish its CAs."""
        await self.check()

    async def run(self) -> NoReturn:
        """After `start`: check every `check_seconds`, when something comes due, and as soon
        as the Secret changes (a watch: a recreated Secret's new signing key is taken up, and
        the old one retired, at once), until cancelled. A failed check is logged and tried
        again at the next."""
        changed = asyncio.Event()
        watcher = asyncio.create_task(self._watch(changed), name="webhook-secret-watch")
        try:
            while True:
                wait = min(self.check_seconds, self._due_at - self.now())
                await self._changed_or_after(changed, max(wait, MIN_WAIT))
                changed.clear()
                try:
                    await self.check()
                except (KubeError, OSError) as exc:
                    # The next check tries again; what is loaded stays served meanwhile.
                    self.log.warning("webhook_certs_check_failed", error=str(exc))
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _changed_or_after(self, changed: asyncio.Event, seconds: float) -> None:
        """Until `changed` is set or `seconds` of the clock have passed. Not wait_for:
        Python 3.11's wait_for loses a cancellation that comes as the event is set, and the
        loop would run on after shutdown; `asyncio.wait` raises it, and both waits end."""
        waits = {
            asyncio.ensure_future(changed.wait()),
            asyncio.ensure_future(self._clock.sleep(seconds)),
        }
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _watch(self, changed: asyncio.Event) -> NoReturn:
        """Set `changed` at each change of the Secret. Only a hint: a watch that cannot be
        made (an older Role without list and watch) leaves the periodic check."""
        namespace = self.config.namespace
        query = {"fieldSelector": f"metadata.name={self.config.secret_name}"}
        while True:
            try:
                # List, check, then watch from the list: nothing changed in between is missed.
                listed = await self.client.list(SECRETS, namespace, query=query)
                version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                changed.set()
                async for event in self.client.watch(
                    SECRETS, resource_version=version, query=query, namespace=namespace
                ):
                    if event.get("type") in WATCHED:
                        changed.set()
                continue  # the server ended it (timeout): watch again
            except Gone:
                continue  # too old a version: list again
            except (KubeError, OSError) as exc:
                self.log.debug("webhook_secret_watch_failed", error=str(exc))
            await self._clock.sleep(self.check_seconds)

    async def check(self) -> None:
        """One round of what `run` does: converge the Secret, reload, republish."""
        current = await self._read()
        if self.config.cert_dir is not None:
            secret = await self._converge(self._signing_key_only, current)
            self._load_keys(_decode(secret).data)
            self._reload_files(self.config.cert_dir)
            return
        # The bundle as the Secret holds it is published before planning: step 2 of a CA
        # rotation is then only taken by a replica that has published step 1's bundle.
        if current is not None:
            await self._publish(current)
        secret = await self._converge(self._settle, current)
        data = _decode(secret).data
        self._load_keys(data)
        self.ca_bundle = data[CA_BUNDLE]
        # Loaded before publishing, so a configuration that cannot be updated now does not
        # keep this replica on an old certificate. Nothing is lost by the order: a serving
        # certificate from a new CA is only issued a check after that CA was published
        # (step 2), or when the Secret is made anew and no older bundle could trust it.
        if data[TLS_CERT] != self.serving_cert:
            self._load(data[TLS_CERT], data[TLS_KEY])
        if secret is not current:
            await self._publish(secret)

    # -- the Secret --------------------------------------------------------------------

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await self.client.get(SECRETS, self.config.namespace, self.config.secret_name)
        except NotFound:
            return None

    def _settle(self, state: CertState | None) -> CertState | None:
        """The state to write, or None when the Secret is fine as it is."""
        now = self.now()
        final, steps, last = certplan.settle(state, now, self.policy)
        if steps:
            self.log.info(
                "webhook_certs_planned",
                steps=[step.action.value for step in steps],
                reasons=[step.reason for step in steps],
            )
        keys = self._signing_key_only(final)
        wanted = keys if keys is not None else final
        self._due_at = min(
            last.due_at,
            certplan.next_key_expiry(wanted.data, now, self.key_policy) if wanted else math.inf,
        )
        if keys is not None:
            return keys
        return final if steps else None

    def _signing_key_only(self, state: CertState | None) -> CertState | None:
        """The state with the signing keys as `plan_signing_keys` wants them (this replica's
        key among the retired ones if the Secret's changed), or None if they are so."""
        data = certplan.plan_signing_keys(
            state.data if state is not None else None,
            held=self.signing_key,
            now=self.now(),
            policy=self.key_policy,
        )
        if data is None:
            return None
        if self.signing_key and data.get(SIGNING_KEY) != self.signing_key:
            self.log.info("signing_key_retired", previous=len(certplan.read_previous(data)))
        return CertState(data, state.rotation_started_at if state is not None else None)

    def _load_keys(self, data: Mapping[str, bytes]) -> None:
        keys = tuple(certplan.verification_keys(data, self.now(), self.key_policy))
        if keys and keys[0] != self.signing_key:
            self.log.info("signing_key_loaded", keys=len(keys), first=not self.signing_key)
        changed = keys != self.signing_keys
        self.signing_keys = keys
        self.signing_key = keys[0] if keys else b""
        if changed:
            self._on_keys(keys)

    async def _converge(
        self,
        decide: Callable[[CertState | None], CertState | None],
        secret: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """Write what `decide` wants of the Secret (`secret`, as just read; None: there is
        none) and return the Secret as written or found. On Conflict: read again, decide
        again."""
        for _attempt in range(MAX_ATTEMPTS):
            state = _decode(secret) if secret is not None else None
            wanted = decide(state)
            if wanted is None:
                if secret is None:  # the deciders always want something where nothing is
                    raise RuntimeError("nothing to write, and no Secret")
                return secret
            try:
                secret = await self._write(secret, wanted)
            except (Conflict, NotFound):
                # AlreadyExists is a Conflict too: another replica wrote first (or deleted
                # the Secret): start over from what is there now.
                self.log.debug("webhook_secret_conflict")
                secret = await self._read()
                continue
            self.log.info("webhook_secret_written", keys=sorted(wanted.data))
            return secret
        raise Conflict(f"the Secret kept changing over {MAX_ATTEMPTS} attempts")

    async def _write(self, secret: dict[str, Any] | None, state: CertState) -> dict[str, Any]:
        namespace, name = self.config.namespace, self.config.secret_name
        if secret is None:
            metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": LABELS}
            body: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque"}
            body["metadata"] = metadata
        else:
            body = dict(secret)
            metadata = dict(body.get("metadata") or {})  # keeps resourceVersion: Conflict guard
            body["metadata"] = metadata
            metadata["labels"] = {**(metadata.get("labels") or {}), **LABELS}
        annotations = dict(metadata.get("annotations") or {})
        if state.rotation_started_at is None:
            annotations.pop(certplan.ROTATION_STARTED, None)
        else:
            annotations[certplan.ROTATION_STARTED] = _stamp(state.rotation_started_at)
        metadata["annotations"] = annotations
        body["data"] = _encode(state.data)
        if secret is None:
            return await self.client.create(SECRETS, namespace, body)
        return await self.client.replace(SECRETS, namespace, name, body)

    # -- loading the serving certificate -----------------------------------------------

    def _load(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Serve this pair from now on. It is loaded into a scratch context first: a pair that
        does not load must not leave the live context half changed (a certificate without its
        key would fail every handshake)."""
        with tempfile.TemporaryDirectory(prefix="webhook-tls-") as directory:
            cert_path = os.path.join(directory, "tls.crt")
            key_path = os.path.join(directory, "tls.key")
            with open(cert_path, "wb") as out:
                out.write(cert_pem)
            with open(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                out.write(key_pem)
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
            # In place: the running server makes each new connection from this context.
            self.ssl_context.load_cert_chain(cert_path, key_path)
        self.serving_cert = cert_pem
        cert = x509.load_pem_x509_certificate(cert_pem)
        self.log.info(
            "webhook_serving_cert_loaded",
            serial=f"{cert.serial_number:x}",
            issuer=cert.issuer.rfc4514_string(),
            not_after=cert.not_valid_after_utc.isoformat(),
        )

    def _reload_files(self, directory: str) -> None:
        cert_path = os.path.join(directory, "tls.crt")
        key_path = os.path.join(directory, "tls.key")
        # os.stat follows the symlinks a mounted Secret is made of, so an update shows.
        stats = [os.stat(cert_path), os.stat(key_path)]
        seen = tuple(n for s in stats for n in (s.st_mtime_ns, s.st_ino, s.st_size))
        if seen == self._files:
            return
        with open(cert_path, "rb") as cert_file, open(key_path, "rb") as key_file:
            cert_pem, key_pem = cert_file.read(), key_file.read()
        try:
            self._load(cert_pem, key_pem)
        except (ssl.SSLError, ValueError) as exc:
            # Caught mid-update (one file new, the other old): keep serving the old pair,
            # and try again at the next check.
            if not self.serving_cert:
                raise
            self.log.warning("webhook_cert_files_unusable", directory=directory, error=str(exc))
            return
        self._files = seen

    # -- the webhook configurations ------------------------------------------------------

    async def _publish(self, secret: dict[str, Any]) -> None:
        """Put the `secret`'s bundle into every webhook of both configurations that exist."""
        bundle = _decode(secret).data.get(CA_BUNDLE, b"")
        if not bundle:
            return
        version = str((secret.get("metadata") or {}).get("resourceVersion") or "")
        for info, name in (
            (MUTATING, self.config.mutating_configuration),
            (VALIDATING, self.config.validating_configuration),
        ):
            await self._publish_one(info, name, bundle, version)
        if self.config.conversion_crd:
            try:
                await self._publish_one(CRDS, self.config.conversion_crd, bundle, version)
            except (Conflict, NotFound):
                raise
            except KubeError as exc:
                # Without the right to update the CRD (RBAC of an older install) the
                # admission webhooks still work; v1beta2 requests fail until it is granted.
                self.log.warning(
                    "conversion_ca_bundle_not_written",
                    crd=self.config.conversion_crd,
                    error=str(exc),
                    fix="grant update on customresourcedefinitions "
                    f"{self.config.conversion_crd} (manifests/rbac.yaml)",
                )

    async def _publish_one(
        self, info: ResourceInfo, name: str, bundle: bytes, version: str
    ) -> None:
        wanted = base64.b64encode(bundle).decode()
        for _attempt in range(MAX_ATTEMPTS):
            try:
                found = await self.client.get(info, None, name)
            except NotFound:
                if info.kind not in self._missing:
                    self._missing.add(info.kind)
                    self.log.info("webhook_configuration_missing", kind=info.kind, name=name)
                return
            self._missing.discard(info.kind)
            webhooks = _client_configs(found, info, self.config)
            stale = [w for w in webhooks if w["clientConfig"].get("caBundle") != wanted]
            if not stale:
                return
            # Ours may be the stale side: a replica that read the Secret just before another
            # started a CA rotation must not take the new CA back out of the configuration.
            # Only the Secret's current version is published; a newer one waits for the next
            # check.
            latest = await self._read()
            if latest is None or (latest.get("metadata") or {}).get("resourceVersion") != version:
                return
            for webhook in stale:
                webhook["clientConfig"]["caBundle"] = wanted
            try:
                # The object as read carries its resourceVersion: a concurrent write (another
                # replica's, or an upgrade applying the configuration) is never overwritten.
                await self.client.replace(info, None, name, found)
            except Conflict:
                continue
            self.log.info(
                "webhook_ca_bundle_published",
                kind=info.kind,
                name=name,
                webhooks=len(webhooks),
                cas=len(certplan.read_bundle(bundle)),
            )
            return
        raise Conflict(f"{info.kind} {name} kept changing over {MAX_ATTEMPTS} attempts")


def _client_configs(
    found: dict[str, Any], info: ResourceInfo, config: WebhookConfig
) -> list[dict[str, Any]]:
    """The parts of `found` that hold a `clientConfig` to keep: each webhook of a webhook
    configuration; a CRD's conversion webhook where it calls this server (its Service, or
    a URL naming one of its extra names and its port). None else: a CRD that converts
    nothing is not given a webhook, and one converted by another server keeps its CA."""
    if info is CRDS:
        conversion = (found.get("spec") or {}).get("conversion") or {}
        webhook = conversion.get("webhook")
        if conversion.get("strategy") != "Webhook" or not isinstance(webhook, dict):
            return []
        client = webhook.setdefault("clientConfig", {})
        return [webhook] if _calls_this_server(client, config) else []
    webhooks = [w for w in found.get("webhooks") or [] if isinstance(w, dict)]
    for webhook in webhooks:
        webhook.setdefault("clientConfig", {})
    return webhooks


def _calls_this_server(client: Mapping[str, Any], config: WebhookConfig) -> bool:
    service = client.get("service")
    if isinstance(service, Mapping):
        return (service.get("namespace"), service.get("name")) == (
            config.namespace,
            config.service_name,
        )
    try:
        parts = urlsplit(str(client.get("url") or ""))
        port = parts.port or 443
    except ValueError:
        return False
    return parts.hostname in config.extra_names and port == config.port
