"""The two systems `make conformance SUITE=appwrapper` runs the AppWrapper suite against
(benchmarks/conformance_appwrapper.py): the AppWrapper controller v1.1.2 with Kueue v0.15.0
(both built by `make peers`), its webhooks registered by URL with a certificate made here; and
this dispatcher, with its admission webhook and conversion endpoint, and optionally the
suite's Kueue objects written as its own quota kinds.

Side effects: each `start_*` installs CRDs and objects into the cluster given and starts the
system's processes; the controller's webhook listens on port 9443 (fixed in its code).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from benchmarks import conformance, peers
from dispatcher.kube.registration import webhook_configurations
from dispatcher.kube.webhook import CONVERT_PATH
from testenv.converter import install_appwrapper_crd
from testenv.localcluster import LocalCluster, free_port

NAMESPACE = "e2e-test"
SYSTEM_NAMESPACE = peers.APPWRAPPER_NAMESPACE
KUEUE_FRAMEWORKS = (
    "batch/job",
    "ray.io/raycluster",
    "ray.io/rayjob",
    "kubeflow.org/pytorchjob",
    "jobset.x-k8s.io/jobset",
    "workload.codeflare.dev/appwrapper",
)
"""Kueue's integrations as in its default configuration (what the suite's CI deploys), for
the kinds installed here."""


# -- the AppWrapper controller's webhooks, out of cluster ------------------------------------

SERVICE_NAME = "appwrapper-webhook-service"
SECRET_NAME = "appwrapper-webhook-server-cert"
CA_NAME = "appwrapper-ca"
WEBHOOK_PORT = 9443
"""Fixed in the controller's code."""


def _certificate(
    subject: str, issuer: tuple[str, rsa.RSAPrivateKey] | None, names: Sequence[str]
) -> tuple[bytes, rsa.RSAPrivateKey]:
    """A certificate (PEM) and its key, for `names`: self-signed CA when `issuer` is None,
    else a serving certificate signed by it. RSA: the rotator reads the CA's key as PKCS#1;
    ten years: it renews what expires within its look-ahead (90 days)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, issuer_key = issuer or (subject, key)
    sans: list[x509.GeneralName] = []
    for name in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is not None:
        usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
        builder = builder.add_extension(usage, critical=False)
    cert = builder.sign(issuer_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), key


def _pkcs1(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def controller_webhooks(cluster: LocalCluster, source: Path, cert_dir: Path) -> None:
    """The controller's webhook configurations, calling 127.0.0.1:9443 by URL, and the Secret
    its certificate rotator reads, made here so that the serving certificate names
    127.0.0.1 too: the rotator keeps a valid one (its CA must be RSA, PKCS#1, and name
    itself), writes nothing new, and injects the CA into the configurations. The files are
    written where its server reads them (no Secret volume out of cluster)."""
    ca_pem, ca_key = _certificate(CA_NAME, None, [CA_NAME])
    service = f"{SERVICE_NAME}.{SYSTEM_NAMESPACE}.svc"
    tls_pem, tls_key = _certificate(service, (CA_NAME, ca_key), [service, "127.0.0.1"])
    data = {
        "ca.crt": ca_pem,
        "ca.key": _pkcs1(ca_key),
        "tls.crt": tls_pem,
        "tls.key": _pkcs1(tls_key),
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET_NAME, "namespace": SYSTEM_NAMESPACE},
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
    cluster.apply(secret)
    cert_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        (cert_dir / name).write_bytes(data[name])
    manifests = source / "config" / "webhook" / "manifests.yaml"
    names = {
        "MutatingWebhookConfiguration": "appwrapper-mutating-webhook-configuration",
        "ValidatingWebhookConfiguration": "appwrapper-validating-webhook-configuration",
    }
    for doc in yaml.safe_load_all(manifests.read_text()):
        if not doc:
            continue
        doc["metadata"]["name"] = names[doc["kind"]]
        for webhook in doc["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{WEBHOOK_PORT}{path}",
                "caBundle": base64.b64encode(ca_pem).decode(),
            }
        cluster.apply(doc)


def controller_configuration(cert_dir: Path) -> dict[str, Any]:
    """The controller's settings as its CI deploys it (webhooks on, its defaults), but no
    metrics listener nor leader election, and certificates out of cluster."""
    return {
        "webhooksEnabled": True,
        "certManagement": {"certificateDir": str(cert_dir)},
        "controllerManager": {
            "health": {"bindAddress": f"127.0.0.1:{free_port()}"},
            "metrics": {"bindAddress": "0"},
            "leaderElection": False,
        },
    }


def start_reference(cluster: LocalCluster, cache: Path, work: Path) -> subprocess.Popen[bytes]:
    """Kueue and the AppWrapper controller (`make peers`), as peers.start_appwrapper runs
    them, with this suite's settings."""
    controller, kueue = peers.appwrapper(cache, build=False), peers.kueue(cache, build=False)
    peers.install_crds(cluster, controller)
    # Its webhook server reads the files from $TMPDIR/k8s-webhook-server/serving-certs
    # whatever the settings say: a TMPDIR of this run's own, and the rotator told the same.
    cert_dir = work / "k8s-webhook-server" / "serving-certs"
    controller_webhooks(cluster, controller.source, cert_dir)
    settings = yaml.safe_dump(controller_configuration(cert_dir))
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": peers.APPWRAPPER_CONFIG, "namespace": SYSTEM_NAMESPACE},
            "data": {"config.yaml": settings},
        }
    )
    env = {**os.environ, "TMPDIR": str(work)}
    return peers.start_appwrapper(
        cluster, controller, kueue, work, frameworks=KUEUE_FRAMEWORKS, env=env
    )


# -- this dispatcher -------------------------------------------------------------------------

OUR_WEBHOOK = "appwrapper-dispatcher"


def our_settings(cluster: LocalCluster, port: int, kueue_quotas: str | None) -> dict[str, Any]:
    """The dispatcher's settings for this suite, and the one place the Kueue quota setting
    (`--kueue-quotas`: reading Kueue's own quota kinds) is passed: unset, the key is left out
    (a dispatcher without that setting would refuse it)."""
    settings: dict[str, Any] = {
        "kubeconfig": str(cluster.kubeconfig),
        "health_port": 0,
        "webhook": {
            "enabled": True,
            "host": "127.0.0.1",
            "port": port,
            "namespace": SYSTEM_NAMESPACE,
            "extra_names": ["127.0.0.1"],
            "mutating_configuration": OUR_WEBHOOK,
            "validating_configuration": OUR_WEBHOOK,
            "client_ca_file": str(cluster.webhook_client_ca) if cluster.webhook_client_ca else None,
        },
    }
    if kueue_quotas is not None:
        settings["kueue_quotas"] = kueue_quotas
    return settings


QUEUE = "e2e-test-queue"
FLAVOR = "e2e-test-flavor"


def translated_queues() -> list[dict[str, Any]]:
    """The suite's Kueue objects (util_test.go: a ResourceFlavor, a ClusterQueue of 2 CPUs
    and 2 GPUs for every namespace, its LocalQueue in the suite's namespace) written as this
    dispatcher's own quota kinds, field for field: with `--our-queues`, what the run would
    show once Kueue's kinds are read as written."""
    api = "workload.codeflare.dev/v1beta1"
    quota = [
        {"name": "cpu", "nominalQuota": "2000m"},
        {"name": "nvidia.com/gpu", "nominalQuota": 2},
    ]
    return [
        {"apiVersion": api, "kind": "AppFlavor", "metadata": {"name": FLAVOR}, "spec": {}},
        {
            "apiVersion": api,
            "kind": "ClusterAppQueue",
            "metadata": {"name": QUEUE},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "nvidia.com/gpu"],
                        "flavors": [{"name": FLAVOR, "resources": quota}],
                    }
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "AppQueue",
            "metadata": {"name": QUEUE, "namespace": NAMESPACE},
            "spec": {"clusterQueue": QUEUE},
        },
    ]


def install_our_queues(cluster: LocalCluster) -> None:
    """This dispatcher's quota kinds, served before it starts, and `translated_queues`."""
    crds = conformance.REPO / "crds" / "queues.yaml"
    cluster.kubectl("apply", "--server-side", "-f", str(crds))
    cluster.kubectl("wait", "--for=condition=Established", "-f", str(crds))
    objects = {"apiVersion": "v1", "kind": "List", "items": translated_queues()}
    cluster.apply(objects, server_side=True)


def start_ours(
    cluster: LocalCluster, work: Path, kueue_quotas: str | None
) -> tuple[subprocess.Popen[bytes], int]:
    """The dispatcher from this checkout, with its admission webhook and the CRD's conversion
    served by it (registered by URL, as `make demo` does)."""
    install_appwrapper_crd(cluster, server_side=True)
    port = free_port()
    for configuration in webhook_configurations(OUR_WEBHOOK, port):
        cluster.apply(configuration)
    client_config = {"service": None, "url": f"https://127.0.0.1:{port}{CONVERT_PATH}"}
    patch = {"spec": {"conversion": {"webhook": {"clientConfig": client_config}}}}
    cluster.kubectl(
        "patch", "crd", peers.APPWRAPPER_CRD.split("/")[1], "--type=merge", "-p", json.dumps(patch)
    )
    config = work / "dispatcher.yaml"
    config.write_text(json.dumps(our_settings(cluster, port, kueue_quotas)))
    log = (work / "ours.log").open("ab")
    command = [sys.executable, "-m", "dispatcher", "run", "--config", str(config)]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), port
