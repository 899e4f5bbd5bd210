"""Small certificate authorities for tests and the local control plane (made by
`kube.certplan`): a CA, and client certificates it signs (the one the API server presents
to webhooks, or an impostor's).

Side effects: none but `write`, which writes PEM files.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from dispatcher.kube import certplan
from dispatcher.kube.certplan import KeyPair

__all__ = [
    "KeyPair",
    "front_proxy_files",
    "issue_client",
    "make_ca",
    "webhook_client_files",
    "write",
]

VALIDITY = 365 * 86400.0


def make_ca(common_name: str) -> KeyPair:
    return certplan.make_ca(time.time(), VALIDITY, name=common_name)


def issue_client(ca: KeyPair, common_name: str, *, dns_names: tuple[str, ...] = ()) -> KeyPair:
    """A client certificate (extended key usage clientAuth) for `common_name`."""
    return certplan.issue_client(ca, common_name, time.time(), VALIDITY, dns_names=dns_names)


def write(issued: KeyPair, directory: Path, stem: str) -> tuple[Path, Path]:
    """`stem`.crt and `stem`.key (owner-only) in `directory`."""
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert.write_bytes(issued.cert_pem)
    key.touch(mode=0o600)
    key.write_bytes(issued.key_pem)
    return cert, key


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
    ca, ca_key = write(authority, directory, "ca")
    cert, key = write(issue_client(authority, client_name), directory, "client")
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


@dataclass(frozen=True)
class FrontProxyFiles:
    """kube-apiserver's front proxy (the aggregation layer): the CA an aggregated API server
    trusts (--requestheader-client-ca-file) and the client certificate the API server
    proxies with (--proxy-client-cert-file/--proxy-client-key-file)."""

    ca: Path
    cert: Path
    key: Path


def front_proxy_files(directory: Path, ca_name: str, client_name: str) -> FrontProxyFiles:
    directory.mkdir(parents=True, exist_ok=True)
    authority = make_ca(ca_name)
    ca, _ = write(authority, directory, "ca")
    cert, key = write(issue_client(authority, client_name), directory, "client")
    return FrontProxyFiles(ca, cert, key)
