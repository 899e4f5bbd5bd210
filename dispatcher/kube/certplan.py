"""The webhook's certificates as values: making a CA and a serving certificate, and deciding
what the shared Secret needs next. No I/O and no clock reads: time comes in as `now` (epoch
seconds); only key generation draws randomness.

`certs.py` is the shell that reads and writes the Secret and loads what is planned here.

CA rotation is two steps so that no admission call ever fails: step 1 makes the next CA and
adds it to the trusted bundle (`ca.crt`) while certificates are still issued by the old one;
step 2, at least one check period later (every replica has republished the bundle by then),
makes the next CA the signer and reissues the serving certificate from it. A CA leaves the
bundle only when it has expired, and so has everything it issued.

The record-signing key (`signing.key`) signs; when it changes (the Secret recreated, or the
key removed by an operator to rotate it) every replica that held another one adds it to the
retired keys (`signing-keys-previous`), which verify for a bounded time and number
(`plan_signing_keys`): records signed before the change verify on every replica and after
restarts.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import math
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dispatcher.config import WebhookConfig

# Keys of the Secret's data.
CA_BUNDLE = "ca.crt"
SIGNER_CERT = "ca-signer.crt"
SIGNER_KEY = "ca-signer.key"
NEXT_CERT = "ca-next.crt"
NEXT_KEY = "ca-next.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
SIGNING_KEY = "signing.key"
SIGNING_KEY_BYTES = 32
PREVIOUS_SIGNING_KEYS = "signing-keys-previous"
"""Retired signing keys, JSON [{"key": base64, "retired": RFC 3339}], newest first: they
verify records signed before the key changed, never sign."""
ROTATION_STARTED = "workload.codeflare.dev/webhook-ca-rotation-started"
"""Annotation on the Secret: when step 1 of a CA rotation was written (RFC 3339)."""

MAX_BACKDATE = 300.0
"""Seconds a certificate's notBefore is set in the past, so that an API server whose clock is
a little behind ours does not see a fresh certificate as not yet valid."""
CA_NAME = "appwrapper-dispatcher-webhook-ca"


class Action(StrEnum):
    NOTHING = "nothing"
    CREATE = "create"
    """Everything anew (no Secret, unreadable or expired CA); a valid signing key is kept."""
    ADD_SIGNING_KEY = "add_signing_key"
    RENEW_SERVING = "renew_serving"
    START_CA_ROTATION = "start_ca_rotation"
    FINISH_CA_ROTATION = "finish_ca_rotation"
    DROP_EXPIRED_CAS = "drop_expired_cas"
    """Make the bundle exactly the CAs still valid, the signer and the next CA among them."""


@dataclass(frozen=True, slots=True)
class CertPolicy:
    names: tuple[str, ...]
    """Subject alternative names of the serving certificate."""
    cert_validity: float
    ca_validity: float
    rotate_when_left: float
    check_seconds: float

    @classmethod
    def from_config(cls, config: WebhookConfig, *, check_seconds: float) -> CertPolicy:
        return cls(
            names=serving_names(config.service_name, config.namespace, config.extra_names),
            cert_validity=config.cert_validity_seconds,
            ca_validity=config.ca_validity_seconds,
            rotate_when_left=config.rotate_when_left,
            check_seconds=check_seconds,
        )


@dataclass(frozen=True, slots=True)
class CertState:
    """What the Secret holds: its data (decoded) and when a CA rotation's step 1 was written."""

    data: Mapping[str, bytes] = field(default_factory=dict)
    rotation_started_at: float | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    action: Action
    reason: str = ""
    due_at: float = math.inf
    """With NOTHING: when something next comes due if nothing else changes."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def key(self) -> ec.EllipticCurvePrivateKey:
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("not an EC private key")
        return key


def serving_names(service: str, namespace: str, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """Every name the API server may use for the webhook's Service, then `extra`."""
    names = [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]
    names += [name for name in extra if name not in names]
    return tuple(names)


def _epoch(moment: datetime) -> float:
    return moment.timestamp()


def _window(now: float, validity: float, until: float | None, left: float) -> tuple[float, float]:
    """(notBefore, notAfter) in whole seconds (what X.509 keeps). The backdate stays a small
    part of the renewal margin, so a fresh certificate is never already due for renewal."""
    end = math.ceil(now + validity)
    if until is not None:
        end = min(end, math.floor(until))  # a certificate never outlives its issuer
    backdate = min(MAX_BACKDATE, (1 - left) * max(end - now, 0.0) / 10)
    return math.floor(now - backdate), end


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _signed(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    signer: ec.EllipticCurvePrivateKey,
    window: tuple[float, float],
    extensions: list[x509.ExtensionType],
) -> KeyPair:
    """A certificate for `key`, signed by `signer`; the extensions RFC 5280 wants critical
    (basic constraints, key usage) are marked so."""
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(datetime.fromtimestamp(window[0], UTC))
        .not_valid_after(datetime.fromtimestamp(window[1], UTC))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )
    for extension in extensions:
        critical = isinstance(extension, x509.BasicConstraints | x509.KeyUsage)
        builder = builder.add_extension(extension, critical=critical)
    cert = builder.sign(signer, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def make_ca(now: float, validity: float, *, left: float = 1 / 3, name: str = CA_NAME) -> KeyPair:
    """A self-signed ECDSA P-256 CA valid for `validity` seconds from `now`."""
    key = _new_key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, name),
            # Two CAs made in the same second must still have distinct subjects, or a
            # verifier could pick the wrong one out of the bundle.
            x509.NameAttribute(NameOID.SERIAL_NUMBER, f"{x509.random_serial_number():x}"),
        ]
    )
    extensions: list[x509.ExtensionType] = [
        x509.BasicConstraints(ca=True, path_length=0),
        _key_usage(ca=True),
    ]
    return _signed(subject, subject, key, key, _window(now, validity, None, left), extensions)


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue_serving(
    ca: KeyPair, names: Iterable[str], now: float, validity: float, *, left: float = 1 / 3
) -> KeyPair:
    """A serving certificate for `names` (IP addresses as IP SANs), signed by `ca`, valid for
    `validity` seconds from `now` or until the CA expires, whichever comes first."""
    names = list(names)
    if not names:
        raise ValueError("a serving certificate needs at least one name")
    ca_cert, ca_key = ca.cert, ca.key
    extensions: list[x509.ExtensionType] = [
        x509.BasicConstraints(ca=False, path_length=None),
        _key_usage(ca=False),
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
        x509.SubjectAlternativeName([_san(n) for n in names]),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
    ]
    return _signed(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0][:64])]),
        ca_cert.subject,
        _new_key(),
        ca_key,
        _window(now, validity, _epoch(ca_cert.not_valid_after_utc), left),
        extensions,
    )


def issue_client(
    ca: KeyPair, name: str, now: float, validity: float, *, dns_names: Iterable[str] = ()
) -> KeyPair:
    """A client certificate (extended key usage clientAuth) for common name `name` and
    `dns_names`, signed by `ca` (what an API server presents to webhooks)."""
    ca_cert, ca_key = ca.cert, ca.key
    extensions: list[x509.ExtensionType] = [
        x509.BasicConstraints(ca=False, path_length=None),
        _key_usage(ca=False),
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
    ]
    names = list(dns_names)
    if names:
        extensions.append(x509.SubjectAlternativeName([_san(n) for n in names]))
    return _signed(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]),
        ca_cert.subject,
        _new_key(),
        ca_key,
        _window(now, validity, _epoch(ca_cert.not_valid_after_utc), 1 / 3),
        extensions,
    )


def read_bundle(pem: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM concatenation, in order; [] if there are none."""
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        return []
    return x509.load_pem_x509_certificates(pem)


def write_bundle(certs: Iterable[x509.Certificate]) -> bytes:
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certs)


def names_of(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n.value) for n in san if isinstance(n, x509.DNSName | x509.IPAddress)}


def renew_at(cert: x509.Certificate, left: float) -> float:
    """When less than `left` of the certificate's validity remains."""
    start = _epoch(cert.not_valid_before_utc)
    end = _epoch(cert.not_valid_after_utc)
    return end - left * (end - start)


def _pair(data: Mapping[str, bytes], cert_key: str, key_key: str) -> KeyPair | None:
    """The pair under those keys if both are there, readable, and belong together."""
    if cert_key not in data or key_key not in data:
        return None
    pair = KeyPair(data[cert_key], data[key_key])
    try:
        if pair.cert.public_key() != pair.key.public_key():
            return None
    except ValueError:
        return None
    return pair


def _bundle(data: Mapping[str, bytes]) -> list[x509.Certificate] | None:
    try:
        return read_bundle(data.get(CA_BUNDLE, b""))
    except ValueError:
        return None


def _wanted_bundle(
    bundle: list[x509.Certificate], keep: list[x509.Certificate], now: float
) -> list[x509.Certificate]:
    """The bundle's CAs still valid, in order, then any of `keep` it lacks."""
    wanted = [c for c in bundle if _epoch(c.not_valid_after_utc) > now]
    for cert in keep:
        if cert not in wanted:
            wanted.append(cert)
    return wanted


def plan(state: CertState | None, now: float, policy: CertPolicy) -> Plan:
    """The one thing to do next to the Secret's content (`state`; None: no Secret)."""
    if state is None:
        return Plan(Action.CREATE, "no secret")
    data = state.data
    signer = _pair(data, SIGNER_CERT, SIGNER_KEY)
    bundle = _bundle(data)
    if signer is None or bundle is None:
        return Plan(Action.CREATE, "the issuing CA or the bundle is missing or unreadable")
    signer_cert = signer.cert
    if _epoch(signer_cert.not_valid_after_utc) <= now:
        return Plan(Action.CREATE, "the issuing CA has expired")
    if len(data.get(SIGNING_KEY, b"")) != SIGNING_KEY_BYTES:
        return Plan(Action.ADD_SIGNING_KEY, "no signing key")
    left = policy.rotate_when_left
    due: list[float] = []

    # 1. CA rotation, one step per check.
    following = _pair(data, NEXT_CERT, NEXT_KEY)
    if following is not None:
        if state.rotation_started_at is None:
            return Plan(Action.START_CA_ROTATION, "when the rotation started is unknown")
        finish_at = state.rotation_started_at + policy.check_seconds
        if now >= finish_at:
            return Plan(Action.FINISH_CA_ROTATION, "the next CA has been trusted for a period")
        due.append(finish_at)
    else:
        rotate_at = renew_at(signer_cert, left)
        if now >= rotate_at:
            return Plan(Action.START_CA_ROTATION, "the issuing CA is due for renewal")
        due.append(rotate_at)

    # 2. The bundle: expired CAs out, the signer and the next CA in.
    keep = [signer_cert] + ([following.cert] if following is not None else [])
    wanted = _wanted_bundle(bundle, keep, now)
    if wanted != bundle:
        return Plan(Action.DROP_EXPIRED_CAS, "expired CAs in the bundle, or ours missing")
    due += [_epoch(c.not_valid_after_utc) for c in bundle if c not in keep]

    # 3. The serving certificate.
    serving = _pair(data, TLS_CERT, TLS_KEY)
    if serving is None:
        return Plan(Action.RENEW_SERVING, "no serving certificate, or its key does not match")
    leaf = serving.cert
    try:
        leaf.verify_directly_issued_by(signer_cert)
    except (ValueError, TypeError, InvalidSignature):
        return Plan(Action.RENEW_SERVING, "the serving certificate is not from the issuing CA")
    if names_of(leaf) != set(policy.names):
        return Plan(Action.RENEW_SERVING, "the serving certificate's names changed")
    renew_serving_at = renew_at(leaf, left)
    if now >= renew_serving_at:
        return Plan(Action.RENEW_SERVING, "the serving certificate is due for renewal")
    due.append(renew_serving_at)
    return Plan(Action.NOTHING, due_at=min(due))


def apply(state: CertState | None, step: Plan, now: float, policy: CertPolicy) -> CertState:
    """The Secret's content after doing `step` (planned by `plan` for this `state`)."""
    data = dict(state.data) if state is not None else {}
    started = state.rotation_started_at if state is not None else None
    left = policy.rotate_when_left

    def serve_from(ca: KeyPair) -> None:
        leaf = issue_serving(ca, policy.names, now, policy.cert_validity, left=left)
        data[TLS_CERT], data[TLS_KEY] = leaf.cert_pem, leaf.key_pem

    match step.action:
        case Action.NOTHING:
            pass
        case Action.CREATE:
            ca = make_ca(now, policy.ca_validity, left=left)
            data[CA_BUNDLE] = data[SIGNER_CERT] = ca.cert_pem
            data[SIGNER_KEY] = ca.key_pem
            data.pop(NEXT_CERT, None)
            data.pop(NEXT_KEY, None)
            started = None
            serve_from(ca)
            if len(data.get(SIGNING_KEY, b"")) != SIGNING_KEY_BYTES:
                data[SIGNING_KEY] = secrets.token_bytes(SIGNING_KEY_BYTES)
        case Action.ADD_SIGNING_KEY:
            data[SIGNING_KEY] = secrets.token_bytes(SIGNING_KEY_BYTES)
        case Action.RENEW_SERVING:
            serve_from(KeyPair(data[SIGNER_CERT], data[SIGNER_KEY]))
        case Action.START_CA_ROTATION:
            following = _pair(data, NEXT_CERT, NEXT_KEY)
            if following is None:
                following = make_ca(now, policy.ca_validity, left=left)
                data[NEXT_CERT], data[NEXT_KEY] = following.cert_pem, following.key_pem
            bundle = read_bundle(data.get(CA_BUNDLE, b""))
            data[CA_BUNDLE] = write_bundle(_wanted_bundle(bundle, [following.cert], now))
            started = now
        case Action.FINISH_CA_ROTATION:
            data[SIGNER_CERT], data[SIGNER_KEY] = data.pop(NEXT_CERT), data.pop(NEXT_KEY)
            started = None
            serve_from(KeyPair(data[SIGNER_CERT], data[SIGNER_KEY]))
        case Action.DROP_EXPIRED_CAS:
            keep = [KeyPair(data[SIGNER_CERT], data[SIGNER_KEY]).cert]
            if NEXT_CERT in data:
                keep.append(x509.load_pem_x509_certificate(data[NEXT_CERT]))
            bundle = read_bundle(data.get(CA_BUNDLE, b""))
            data[CA_BUNDLE] = write_bundle(_wanted_bundle(bundle, keep, now))
    return CertState(data, started)


MAX_STEPS = 8
"""Steps `settle` takes at most in one check; what is left is done at the next one."""


def settle(
    state: CertState | None, now: float, policy: CertPolicy
) -> tuple[CertState | None, list[Plan], Plan]:
    """Plan and apply until nothing is left to do now: (final state, steps taken, last plan).
    The final state is `state` itself when no step was taken."""
    steps: list[Plan] = []
    for _ in range(MAX_STEPS):
        step = plan(state, now, policy)
        if step.action is Action.NOTHING:
            return state, steps, step
        state = apply(state, step, now, policy)
        steps.append(step)
    return state, steps, Plan(Action.NOTHING, "step limit", now + policy.check_seconds)


@dataclass(frozen=True, slots=True)
class RetiredKey:
    key: bytes
    retired_at: float


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    keep: int
    """Retired keys kept at most (the newest)."""
    keep_seconds: float
    """How long after it was retired a key still verifies."""

    @classmethod
    def from_config(cls, config: WebhookConfig) -> KeyPolicy:
        return cls(config.previous_signing_keys, config.previous_signing_key_seconds)


def read_previous(data: Mapping[str, bytes]) -> list[RetiredKey]:
    """The retired keys the Secret holds; what cannot be read is left out (and so dropped
    at the next write)."""
    try:
        entries = json.loads(data.get(PREVIOUS_SIGNING_KEYS, b"[]"))
    except ValueError:
        return []
    found: list[RetiredKey] = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            key = base64.b64decode(entry["key"], validate=True)
            retired = datetime.fromisoformat(entry["retired"]).timestamp()
        except (KeyError, TypeError, ValueError, binascii.Error):
            continue
        if len(key) == SIGNING_KEY_BYTES:
            found.append(RetiredKey(key, retired))
    return found


def write_previous(keys: Iterable[RetiredKey]) -> bytes:
    entries = [
        {
            "key": base64.b64encode(k.key).decode(),
            "retired": datetime.fromtimestamp(k.retired_at, UTC).isoformat(timespec="seconds"),
        }
        for k in keys
    ]
    return json.dumps(entries, separators=(",", ":")).encode()


def verification_keys(data: Mapping[str, bytes], now: float, policy: KeyPolicy) -> list[bytes]:
    """The current signing key, then the retired ones still valid, newest first."""
    current = data.get(SIGNING_KEY, b"")
    keys = [current] if len(current) == SIGNING_KEY_BYTES else []
    keys += [k.key for k in _kept(read_previous(data), current, now, policy)]
    return keys


def _kept(
    previous: list[RetiredKey], current: bytes, now: float, policy: KeyPolicy
) -> list[RetiredKey]:
    kept: list[RetiredKey] = []
    for retired in sorted(previous, key=lambda k: k.retired_at, reverse=True):
        if retired.key == current or any(k.key == retired.key for k in kept):
            continue
        if now - retired.retired_at < policy.keep_seconds:
            kept.append(retired)
    return kept[: policy.keep]


def plan_signing_keys(
    data: Mapping[str, bytes] | None, *, held: bytes, now: float, policy: KeyPolicy
) -> dict[str, bytes] | None:
    """The Secret's data as the signing keys want it, or None if it is so already: a
    current key (made if missing); `held` (the key this replica signed with until now)
    among the retired ones when it is no longer the current one; retired keys past
    `policy`'s age or count dropped."""
    out = dict(data or {})
    if len(out.get(SIGNING_KEY, b"")) != SIGNING_KEY_BYTES:
        out[SIGNING_KEY] = secrets.token_bytes(SIGNING_KEY_BYTES)
    current = out[SIGNING_KEY]
    previous = read_previous(out)
    retire = len(held) == SIGNING_KEY_BYTES and held != current
    if retire and all(k.key != held for k in previous):
        previous.append(RetiredKey(held, now))
    kept = _kept(previous, current, now, policy)
    if kept:
        out[PREVIOUS_SIGNING_KEYS] = write_previous(kept)
    else:
        out.pop(PREVIOUS_SIGNING_KEYS, None)
    if data is not None and out == dict(data):
        return None
    return out


def next_key_expiry(data: Mapping[str, bytes], now: float, policy: KeyPolicy) -> float:
    """When the next retired key stops verifying (and should leave the Secret)."""
    current = data.get(SIGNING_KEY, b"")
    kept = _kept(read_previous(data), current, now, policy)
    return min((k.retired_at + policy.keep_seconds for k in kept), default=math.inf)
