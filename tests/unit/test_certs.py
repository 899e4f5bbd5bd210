"""The webhook's certificates: the planner as a table over a timeline, the certificates it
makes (checked with a verifier, and with a real TLS handshake), and the shell against the
in-memory API server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from dispatcher.config import WebhookConfig
from dispatcher.kube import certplan
from dispatcher.kube.certplan import (
    CA_BUNDLE,
    SIGNER_CERT,
    SIGNING_KEY,
    TLS_CERT,
    Action,
    CertPolicy,
    CertState,
    plan,
    settle,
)
from dispatcher.kube.certs import CRDS, MUTATING, SECRETS, VALIDATING, WebhookCerts
from dispatcher.kube.errors import Conflict
from testenv.fakekube import FakeKube
from testenv.waits import async_wait_until

T0 = 1_700_000_000.0
CONFIG = WebhookConfig(
    namespace="system",
    service_name="webhook",
    extra_names=["127.0.0.1", "webhook.example.com"],
    cert_validity_seconds=3000,
    ca_validity_seconds=30000,
)
POLICY = CertPolicy.from_config(CONFIG, check_seconds=30)
# On this policy's timeline: the first CA (made at T0) is due at T0+19900 and expires at
# T0+30000; each serving certificate is due about two thirds into its 3000 s.
CA_DUE, CA_END = T0 + 19_900, T0 + 30_000


def timeline(*times: float) -> list[CertState]:
    """The Secret's content after each check at `times` (settled, as a replica would)."""
    state: CertState | None = None
    states = []
    for moment in times:
        state, _, _ = settle(state, moment, POLICY)
        assert state is not None
        states.append(state)
    return states


def history(*times: float) -> CertState | None:
    """The Secret's content after a check at each of `times`."""
    return timeline(*times)[-1] if times else None


def verify(leaf_pem: bytes, bundle_pem: bytes, at: float, name: str) -> None:
    """Raise unless the bundle verifies the leaf for `name` at `at` (a TLS client's check)."""
    subject: x509.DNSName | x509.IPAddress
    try:
        subject = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        subject = x509.DNSName(name)
    verifier = (
        PolicyBuilder()
        .store(Store(certplan.read_bundle(bundle_pem)))
        .time(datetime.fromtimestamp(at, UTC))
        .build_server_verifier(subject)
    )
    verifier.verify(x509.load_pem_x509_certificate(leaf_pem), [])


# -- the planner ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    checks: tuple[float, ...]
    """Checks that already happened (each settled)."""
    at: float
    want_action: Action
    want_due_at: float | None = None


CASES = [
    Case("fresh", (), T0, Action.CREATE),
    Case("valid", (T0,), T0 + 1000, Action.NOTHING, want_due_at=T0 + 3000 - 3200 / 3),
    Case("serving due", (T0,), T0 + 2000, Action.RENEW_SERVING),
    Case("CA due", (T0, CA_DUE - 900), CA_DUE, Action.START_CA_ROTATION),
    Case(
        "step 2 waits a period",
        (T0, CA_DUE - 900, CA_DUE),
        CA_DUE + 29,
        Action.NOTHING,
        want_due_at=CA_DUE + 30,
    ),
    Case(
        "step 2 after a period", (T0, CA_DUE - 900, CA_DUE), CA_DUE + 30, Action.FINISH_CA_ROTATION
    ),
    Case(
        "old CA still trusted until it expires",
        (T0, CA_DUE - 900, CA_DUE, CA_DUE + 30, CA_END - 1500),
        CA_END - 1,
        Action.NOTHING,
        want_due_at=CA_END,
    ),
    Case(
        "expired CA dropped",
        (T0, CA_DUE - 900, CA_DUE, CA_DUE + 30, CA_END - 1500),
        CA_END,
        Action.DROP_EXPIRED_CAS,
    ),
    Case("issuing CA expired", (T0,), CA_END, Action.CREATE),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_plan(case: Case) -> None:
    got = plan(history(*case.checks), case.at, POLICY)
    assert got.action is case.want_action, got.reason
    if case.want_due_at is not None:
        assert got.due_at == pytest.approx(case.want_due_at, abs=1)


def test_broken_or_incomplete_content() -> None:
    good = history(T0)
    assert good is not None

    def without(*keys: str, **replaced: bytes) -> CertState:
        data = {k: v for k, v in good.data.items() if k not in keys}
        return CertState({**data, **{k.replace("_", "."): v for k, v in replaced.items()}})

    assert plan(without(SIGNER_CERT), T0, POLICY).action is Action.CREATE
    assert plan(without(ca_crt=b"garbage -----BEGIN CERTIFICATE-----"), T0, POLICY).action is (
        Action.CREATE
    )
    assert plan(without(SIGNING_KEY), T0, POLICY).action is Action.ADD_SIGNING_KEY
    assert plan(without(TLS_CERT), T0, POLICY).action is Action.RENEW_SERVING
    other = history(T0 + 1)
    assert other is not None
    foreign = without(tls_crt=other.data[TLS_CERT], tls_key=other.data["tls.key"])
    assert plan(foreign, T0, POLICY).action is Action.RENEW_SERVING
    renamed = CertPolicy.from_config(
        CONFIG.model_copy(update={"extra_names": ["10.0.0.1"]}), check_seconds=30
    )
    assert plan(good, T0, renamed).action is Action.RENEW_SERVING


def test_renewing_the_serving_cert_keeps_the_bundle_and_the_signing_key() -> None:
    before, after = timeline(T0, T0 + 2000)
    assert after.data[TLS_CERT] != before.data[TLS_CERT]
    for key in (CA_BUNDLE, SIGNER_CERT, SIGNING_KEY):
        assert after.data[key] == before.data[key]


def test_a_ca_rotation_never_serves_a_cert_the_published_bundle_does_not_trust() -> None:
    checks = [T0, CA_DUE - 900, CA_DUE, CA_DUE + 30, CA_END - 1500, CA_END, CA_END + 500]
    states = timeline(*checks)
    bundles = [len(certplan.read_bundle(s.data[CA_BUNDLE])) for s in states]
    assert bundles == [1, 1, 2, 2, 2, 1, 1]
    for i, state in enumerate(states):
        # Served from this check on, verified by the bundle published at the one before
        # (what the API server may still hold) and by this one.
        for published in states[max(i - 1, 0)], state:
            verify(state.data[TLS_CERT], published.data[CA_BUNDLE], checks[i], "webhook.system.svc")
    before, step1, step2 = states[1:4]
    assert step1.rotation_started_at == CA_DUE
    assert step1.data[TLS_CERT] == before.data[TLS_CERT]
    assert step1.data[SIGNER_CERT] == before.data[SIGNER_CERT]
    assert step2.data[SIGNER_CERT] == step1.data["ca-next.crt"]
    assert "ca-next.crt" not in step2.data
    assert step2.rotation_started_at is None
    # A bundle with both CAs verifies certificates of each.
    verify(step1.data[TLS_CERT], step2.data[CA_BUNDLE], CA_DUE + 30, "webhook")
    verify(step2.data[TLS_CERT], step2.data[CA_BUNDLE], CA_DUE + 30, "webhook")


def test_a_new_ca_keeps_the_signing_key() -> None:
    old, new = timeline(T0, CA_END + 1)
    assert new.data[SIGNER_CERT] != old.data[SIGNER_CERT]
    assert new.data[SIGNING_KEY] == old.data[SIGNING_KEY]
    assert len(new.data[SIGNING_KEY]) == 32


# -- the certificates ----------------------------------------------------------------------


def test_the_serving_cert_names_the_service_and_the_extra_names() -> None:
    state = history(T0)
    assert state is not None
    leaf = x509.load_pem_x509_certificate(state.data[TLS_CERT])
    assert certplan.names_of(leaf) == {
        "webhook",
        "webhook.system",
        "webhook.system.svc",
        "webhook.system.svc.cluster.local",
        "127.0.0.1",
        "webhook.example.com",
    }
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    for name in certplan.names_of(leaf):
        verify(state.data[TLS_CERT], state.data[CA_BUNDLE], T0 + 10, name)
    with pytest.raises(VerificationError):
        verify(state.data[TLS_CERT], state.data[CA_BUNDLE], T0 + 10, "other.example.com")


def test_a_serving_cert_never_outlives_its_ca() -> None:
    ca = certplan.make_ca(T0, 100)
    leaf = certplan.issue_serving(ca, ["a"], T0 + 50, 1000)
    assert leaf.cert.not_valid_after_utc == ca.cert.not_valid_after_utc
    assert certplan.renew_at(leaf.cert, 1 / 3) > T0 + 50


# -- the shell, on the in-memory API server ------------------------------------------------


class Clock:
    def __init__(self, at: float) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def webhook_configuration(kind: str, name: str) -> dict[str, object]:
    hook = {
        "name": "a.example.com",
        "clientConfig": {"url": "https://127.0.0.1:1/x"},
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [hook, {**hook, "name": "b.example.com"}],
    }


def fake_with_configurations() -> FakeKube:
    fake = FakeKube(namespaces_must_exist=False)
    fake.add_kind(MUTATING.group_version, MUTATING.kind, MUTATING.plural, False, custom=False)
    fake.add_kind(VALIDATING.group_version, VALIDATING.kind, VALIDATING.plural, False, custom=False)
    fake.add_kind(CRDS.group_version, CRDS.kind, CRDS.plural, False, custom=False)
    return fake


async def peer_serial(port: int, bundle: bytes) -> int:
    """A TLS handshake with the server on 127.0.0.1:`port`, trusting only `bundle`."""
    client = ssl.create_default_context(cadata=bundle.decode())
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client, server_hostname="127.0.0.1"
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_renewed_cert_is_served_from_the_same_context() -> None:
    fake = fake_with_configurations()
    # Started 2500 s ago by its clock: the first certificate is due now, and both it and
    # its successor are valid for the real clock the handshakes are checked against.
    real_now = datetime.now(UTC).timestamp()
    clock = Clock(real_now - 2500)
    certs = WebhookCerts(fake, CONFIG, now=clock, check_seconds=30)
    await certs.start()
    context = certs.ssl_context
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        first = await peer_serial(port, certs.ca_bundle)
        assert first == x509.load_pem_x509_certificate(certs.serving_cert).serial_number
        clock.at = real_now
        await certs.check()
        assert certs.ssl_context is context
        second = await peer_serial(port, certs.ca_bundle)
        assert second != first
        assert second == x509.load_pem_x509_certificate(certs.serving_cert).serial_number
    finally:
        server.close()
        await server.wait_closed()


async def test_replicas_share_one_secret_and_publish_its_bundle() -> None:
    fake = fake_with_configurations()
    await fake.create(
        MUTATING, None, webhook_configuration(MUTATING.kind, CONFIG.mutating_configuration)
    )
    replicas = [WebhookCerts(fake, CONFIG, check_seconds=30) for _ in range(3)]
    with structlog.testing.capture_logs() as logs:
        await asyncio.gather(*(r.start() for r in replicas))
        await replicas[0].check()
    assert len(fake.objects("v1", "Secret")) == 1
    assert len({r.serving_cert for r in replicas}) == 1
    assert len({r.signing_key for r in replicas}) == 1
    (mutating,) = fake.objects(MUTATING.group_version, MUTATING.kind)
    wanted = base64.b64encode(replicas[0].ca_bundle).decode()
    assert [w["clientConfig"]["caBundle"] for w in mutating["webhooks"]] == [wanted, wanted]
    missing = [e for e in logs if e["event"] == "webhook_configuration_missing"]
    assert len(missing) == 6  # once per replica and kind, not once per check
    assert {e["kind"] for e in missing} == {VALIDATING.kind, CRDS.kind}


def appwrapper_crd(conversion: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "appwrappers.workload.codeflare.dev"},
        "spec": {"group": "workload.codeflare.dev", "conversion": conversion},
    }


@pytest.mark.parametrize(
    ("conversion", "want_bundle"),
    [
        pytest.param(
            {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "service": {"namespace": "system", "name": "webhook", "path": "/convert"}
                    }
                },
            },
            True,
            id="our-service",
        ),
        pytest.param(
            {"strategy": "Webhook", "webhook": {"clientConfig": {"url": "https://h/convert"}}},
            False,
            id="another-server-left-alone",
        ),
        pytest.param({"strategy": "None"}, False, id="no-conversion-left-alone"),
    ],
)
async def test_the_crds_conversion_webhook_gets_the_bundle(
    conversion: dict[str, Any], want_bundle: bool
) -> None:
    fake = fake_with_configurations()
    await fake.create(CRDS, None, appwrapper_crd(conversion))
    certs = WebhookCerts(fake, CONFIG, check_seconds=30)
    await certs.start()
    (crd,) = fake.objects(CRDS.group_version, CRDS.kind)
    got = crd["spec"]["conversion"]
    if want_bundle:
        wanted = base64.b64encode(certs.ca_bundle).decode()
        assert got["webhook"]["clientConfig"]["caBundle"] == wanted
    else:
        assert "caBundle" not in (got.get("webhook") or {}).get("clientConfig", {})


async def test_a_conflicting_write_is_read_again_and_replanned() -> None:
    fake = fake_with_configurations()
    clock = Clock(T0)
    certs = WebhookCerts(fake, CONFIG, now=clock, check_seconds=30)
    await certs.start()
    clock.at += 2500
    fake.fail_next("replace", kind="Secret", error=Conflict("changed"), times=2)
    await certs.check()
    (secret,) = fake.objects("v1", "Secret")
    assert base64.b64decode(secret["data"][TLS_CERT]) == certs.serving_cert
    assert secret["metadata"]["labels"] == {"app.kubernetes.io/name": "appwrapper-dispatcher"}
    assert secret["type"] == "Opaque"


async def test_cert_dir_mode_reads_files_and_keeps_only_the_signing_key(tmp_path: Path) -> None:
    pair = certplan.issue_serving(certplan.make_ca(T0, 10**9), ["127.0.0.1"], T0, 10**8)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    fake = fake_with_configurations()
    certs = WebhookCerts(fake, CONFIG.model_copy(update={"cert_dir": str(tmp_path)}))
    await certs.start()
    assert certs.serving_cert == pair.cert_pem
    assert len(certs.signing_key) == 32
    (secret,) = fake.objects("v1", "Secret")
    assert set(secret["data"]) == {SIGNING_KEY}
    again = certplan.issue_serving(certplan.make_ca(T0, 10**9), ["127.0.0.1"], T0, 10**8)
    (tmp_path / "tls.key").write_bytes(again.key_pem)  # half updated: keep the old pair
    await certs.check()
    assert certs.serving_cert == pair.cert_pem
    (tmp_path / "tls.crt").write_bytes(again.cert_pem)
    await certs.check()
    assert certs.serving_cert == again.cert_pem


async def test_a_replica_with_a_stale_secret_never_takes_a_new_ca_out() -> None:
    fake = fake_with_configurations()
    name = CONFIG.validating_configuration
    await fake.create(VALIDATING, None, webhook_configuration(VALIDATING.kind, name))
    clock = Clock(T0)
    certs = WebhookCerts(fake, CONFIG, now=clock, check_seconds=30)
    await certs.start()
    (before,) = fake.objects("v1", "Secret")
    clock.at = CA_DUE + 10
    await certs.check()  # step 1: the next CA is trusted beside the old one
    (validating,) = fake.objects(VALIDATING.group_version, VALIDATING.kind)
    two = validating["webhooks"][0]["clientConfig"]["caBundle"]
    assert len(certplan.read_bundle(base64.b64decode(two))) == 2
    # A replica whose check read the Secret just before step 1 was written.
    late = WebhookCerts(fake, CONFIG, now=clock, check_seconds=30)
    await late._publish(before)
    (validating,) = fake.objects(VALIDATING.group_version, VALIDATING.kind)
    assert [w["clientConfig"]["caBundle"] for w in validating["webhooks"]] == [two, two]


# -- record-signing keys ------------------------------------------------------------------

KEYS = certplan.KeyPolicy(keep=2, keep_seconds=1000)
K1, K2, K3, K4 = (bytes([n]) * 32 for n in range(1, 5))


def key_data(current: bytes | None, *previous: tuple[bytes, float]) -> dict[str, bytes]:
    data = {} if current is None else {SIGNING_KEY: current}
    if previous:
        data[certplan.PREVIOUS_SIGNING_KEYS] = certplan.write_previous(
            certplan.RetiredKey(k, t) for k, t in previous
        )
    return data


@pytest.mark.parametrize(
    ("data", "held", "want_current", "want_previous"),
    [
        # A replica starting fresh adds nothing of its own.
        pytest.param(key_data(K1), b"", K1, [], id="fresh-nothing-to-do"),
        pytest.param(key_data(K1), K1, K1, [], id="same-key"),
        # The Secret recreated (or its key replaced): the held key is retired, not lost.
        pytest.param(key_data(K2), K1, K2, [K1], id="changed-retires-held"),
        pytest.param(key_data(K2, (K1, T0 - 5)), K1, K2, [K1], id="already-retired"),
        pytest.param(key_data(None), K1, None, [K1], id="key-removed-new-one"),
        # Bounded: by age, then by number (the newest kept).
        pytest.param(key_data(K2, (K1, T0 - 1000)), b"", K2, [], id="too-old-dropped"),
        pytest.param(
            key_data(K4, (K3, T0 - 10), (K2, T0 - 20)), K1, K4, [K1, K3], id="too-many-dropped"
        ),
        # A key never verifies twice, nor as retired while current.
        pytest.param(key_data(K1, (K1, T0 - 1)), b"", K1, [], id="current-not-retired"),
    ],
)
def test_plan_signing_keys(
    data: dict[str, bytes], held: bytes, want_current: bytes | None, want_previous: list[bytes]
) -> None:
    out = certplan.plan_signing_keys(data, held=held, now=T0, policy=KEYS)
    result = data if out is None else out
    if want_current is None:
        assert len(result[SIGNING_KEY]) == 32
        assert result[SIGNING_KEY] not in (K1, K2, K3, K4)
    else:
        assert result[SIGNING_KEY] == want_current
    assert [k.key for k in certplan.read_previous(result)] == want_previous
    keys = certplan.verification_keys(result, T0, KEYS)
    assert keys == [result[SIGNING_KEY], *want_previous]
    # Planned again, nothing is left to do.
    assert certplan.plan_signing_keys(result, held=result[SIGNING_KEY], now=T0, policy=KEYS) is None


def test_unreadable_retired_keys_are_dropped() -> None:
    data = {SIGNING_KEY: K1, certplan.PREVIOUS_SIGNING_KEYS: b'[{"key": "!!"}, 3, "x"]'}
    out = certplan.plan_signing_keys(data, held=K1, now=T0, policy=KEYS)
    assert out == {SIGNING_KEY: K1}
    assert certplan.read_previous({certplan.PREVIOUS_SIGNING_KEYS: b"not json"}) == []


def test_a_retired_key_expires_when_due() -> None:
    data = key_data(K2, (K1, T0))
    assert certplan.next_key_expiry(data, T0, KEYS) == T0 + 1000
    assert certplan.verification_keys(data, T0 + 999, KEYS) == [K2, K1]
    assert certplan.verification_keys(data, T0 + 1000, KEYS) == [K2]


async def test_a_recreated_secret_keeps_the_old_key_verifying_on_every_replica() -> None:
    fake = fake_with_configurations()
    replicas = [WebhookCerts(fake, CONFIG, check_seconds=30) for _ in range(2)]
    for replica in replicas:
        await replica.start()
    first = replicas[0].signing_key
    assert replicas[1].signing_keys == (first,)
    (secret,) = fake.objects("v1", "Secret")
    await fake.delete(SECRETS, secret["metadata"]["namespace"], secret["metadata"]["name"])
    await replicas[1].check()  # makes the Secret anew, with a new key, and retires its own
    await replicas[0].check()
    second = replicas[0].signing_key
    assert second != first
    for replica in replicas:
        assert replica.signing_key == second  # signing: the current key only
        assert replica.signing_keys == (second, first)
    # A replica started after that (a restart) reads both from the Secret.
    later = WebhookCerts(fake, CONFIG, check_seconds=30)
    await later.start()
    assert later.signing_keys == (second, first)


async def test_a_deleted_secret_is_made_anew_at_once_through_the_watch() -> None:
    fake = fake_with_configurations()
    certs = WebhookCerts(fake, CONFIG, check_seconds=3600)  # no periodic check in the test
    await certs.start()
    first = certs.signing_key
    running = asyncio.create_task(certs.run())
    try:
        (secret,) = fake.objects("v1", "Secret")
        await fake.delete(SECRETS, secret["metadata"]["namespace"], secret["metadata"]["name"])

        async def retired() -> bool:
            return len(certs.signing_keys) == 2

        await async_wait_until(retired, timeout=10, what="the Secret made anew")
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    assert certs.signing_keys == (certs.signing_key, first)
    (secret,) = fake.objects("v1", "Secret")
    assert base64.b64decode(secret["data"][SIGNING_KEY]) == certs.signing_key
