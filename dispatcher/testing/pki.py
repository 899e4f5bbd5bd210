"""Small certificate authorities for tests and the local control plane: a CA, and client
certificates it signs (the one the API server presents to webhooks, or an impostor's).

Side effects: none but `write`, which writes PEM files.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, in PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """`stem`.crt and `stem`.key (owner-only) in `directory`."""
        cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert.write_bytes(self.cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(self.key_pem)
        return cert, key


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(common_name: str) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def issue_client(ca: Issued, common_name: str, *, dns_names: tuple[str, ...] = ()) -> Issued:
    """A client certificate (extended key usage clientAuth) for `common_name`."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    )
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


@dataclass(frozen=True)
class WebhookClientFiles:
    admission_config: Path
    """For kube-apiserver's --admission-control-config-file."""
    ca: Path
    ca_key: Path


def webhook_client_files(directory: Path, ca_name: str, client_name: str) -> WebhookClientFiles:
    """What kube-apiserver needs to present a client certificate to admission webhooks, as
    Kubernetes documents it: an AdmissionConfiguration whose webhook plugins name a
    kubeconfig; its user `*` (every webhook) holds a certificate for `client_name` from a
    new CA `ca_name`. Written into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = make_ca(ca_name)
    ca, ca_key = authority.write(directory, "ca")
    cert, key = issue_client(authority, client_name).write(directory, "client")
    kubeconfig = directory / "kubeconfig"
    user = {"client-certificate": str(cert), "client-key": str(key)}
    kubeconfig.write_text(
        json.dumps({"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]})
    )
    plugin = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    config = directory / "admission.yaml"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": name, "configuration": plugin}
                    for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
                ],
            }
        )
    )
    return WebhookClientFiles(config, ca, ca_key)
