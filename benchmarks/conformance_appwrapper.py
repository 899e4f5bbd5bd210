"""`make conformance SUITE=appwrapper`: the AppWrapper project's own e2e suite, run against this
dispatcher (or against the AppWrapper controller with Kueue, the reference).

The suite (`test/e2e` of github.com/project-codeflare/appwrapper v1.1.2, from the Go module
proxy) is compiled once with `go test -c` into the cache directory beside the controller that
`make peers` built. Its specs are listed by a Ginkgo dry run (full names and labels); those its
CI runs (labels Kueue, Webhook or Metrics) each run alone, with a time cap and a clean-up
between them, on a local control plane whose KWOK nodes are sized as its CI's kind cluster.

Both systems see the same cluster: Kueue's CRDs installed (the suite creates a ResourceFlavor,
a ClusterQueue of 2 CPUs and a LocalQueue), KubeRay's operator, the PyTorchJob and JobSet CRDs
(their operators are not here). SYSTEM=appwrapper: Kueue v0.15.0 and the controller v1.1.2
(`make peers`), the controller's webhooks on and registered by URL. SYSTEM=ours: no Kueue
controller; the dispatcher with its admission webhook and conversion endpoint on.

Side effects: `go` builds into the cache; a local control plane and the system under test run
for the duration (the controller's webhook listens on port 9443, fixed in its code); results
under benchmarks/results/conformance-appwrapper-$SYSTEM.{json,md}.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from benchmarks import conformance, peers, report
from benchmarks.conformance import Outcome
from dispatcher.kube.registration import webhook_configurations
from dispatcher.kube.webhook import CONVERT_PATH
from dispatcher.testing.converter import install_appwrapper_crd
from dispatcher.testing.localcluster import DEFAULT_CACHE, LocalCluster, ensure_binaries, free_port

VERSION = peers.APPWRAPPER_VERSION
SUITE = f"{peers.APPWRAPPER_MODULE}@{VERSION} test/e2e"
RESULTS = conformance.RESULTS
LABEL_FILTER = "Kueue || Webhook || Metrics"
"""What its CI runs (hack/run-tests-on-cluster.sh: LABEL_FILTER=Kueue,Webhook,Metrics)."""
NAMESPACE = "e2e-test"
SYSTEM_NAMESPACE = peers.APPWRAPPER_NAMESPACE

# Its CI cluster: kind (one control plane, two workers) on a GitHub ubuntu-latest runner (4
# CPUs, 16 GiB, each node sees all of it), 8 virtual GPUs patched onto every node; the control
# plane carries kind's NoSchedule taint.
_NODE = {"cpu": "4", "memory": "16Gi", "gpu": 8, "pods": 110}
_CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
NODES: dict[str, dict[str, Any]] = {
    "test-control-plane": {**_NODE, "taints": [_CONTROL_PLANE_TAINT]},
    "test-worker": _NODE,
    "test-worker2": _NODE,
}

DEFAULT_CAP = 300.0
CAPS = {
    # Its one check waits up to 3600 s for `kubectl exec` into a curl pod reaching a Service:
    # no kubelet and no Service network here, so it can only end at the cap.
    "Metrics should ensure the metrics endpoint is serving metrics": 60.0,
}

# Operators the suite's CI installs whose CRDs are all that is here (the objects can be
# created; nothing makes their pods): CI's versions, from the Go module proxy.
CRD_MODULES = {
    "github.com/kubeflow/training-operator@v1.8.1": (
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    ),
    "sigs.k8s.io/jobset@v0.7.3": "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
}
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


@dataclass(frozen=True)
class Spec:
    """One spec of the suite: its full name (containers and leaf), and its labels."""

    name: str
    labels: tuple[str, ...]


# -- the suite: build, list ------------------------------------------------------------------


def build(cache: Path) -> tuple[Path, Path]:
    """(source, e2e test binary): the module copy `make peers` made (downloaded here when
    missing), and the suite compiled in it, unless already there."""
    home = cache / "appwrapper"
    source = peers.appwrapper(cache, build=False).source
    binary = home / f"appwrapper-e2e-{VERSION}.test"
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conformance.module_source(peers.APPWRAPPER_MODULE, VERSION, source)
        if not binary.exists():
            partial = binary.with_name(binary.name + ".partial")
            subprocess.run(
                ["go", "test", "-c", "-o", str(partial), "./test/e2e"], check=True, cwd=source
            )
            partial.rename(binary)
    return source, binary


def parse_report(report_json: str) -> list[Spec]:
    """The `It` specs of a Ginkgo JSON report (a dry run lists them all), in run order."""
    specs = []
    for suite in json.loads(report_json):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            texts = [*(spec.get("ContainerHierarchyTexts") or []), spec["LeafNodeText"]]
            labels: list[str] = []
            for group in [
                *(spec.get("ContainerHierarchyLabels") or []),
                spec.get("LeafNodeLabels"),
            ]:
                labels += [label for label in group or [] if label not in labels]
            specs.append(Spec(" ".join(texts), tuple(labels)))
    return specs


def list_specs(binary: Path, source: Path, work: Path) -> list[Spec]:
    """Every spec CI's label filter selects, by a dry run (nothing runs, no cluster needed)."""
    out = work / "dry-run.json"
    subprocess.run(
        [
            str(binary),
            "-ginkgo.dry-run",
            f"-ginkgo.label-filter={LABEL_FILTER}",
            f"-ginkgo.json-report={out}",
        ],
        check=True,
        capture_output=True,
        cwd=source / "test" / "e2e",
    )
    return parse_report(out.read_text())


SUITE_DESCRIPTION = "AppWrapper Test Suite"
"""Its RunSpecs description, which Ginkgo puts before every spec's name when it focuses."""


def focus(name: str) -> str:
    """A Go (RE2) regular expression matching exactly this full spec name."""
    return "^" + conformance.focus_on(f"{SUITE_DESCRIPTION} {name}")


# -- the cluster -----------------------------------------------------------------------------

# The suite's containers are `sh -c "sleep N[; exit C]"`: KWOK's stages stand for them. Pods of
# Jobs complete only where the command says when (10 s, then 0 or 1); the rest keep running.
# A pod with init containers (the suite's one is stuck for good) never becomes Ready.
_DONE_AFTER = {"sleep 10; exit 0": ("Succeeded", 0), "sleep 10; exit 1": ("Failed", 1)}


def _command_is(command: str) -> str:
    return f"""    - key: '.spec.containers.[].command.[]'
      operator: 'In'
      values:
      - '{command}'
"""


def kwok_stages(work: Path) -> list[Path]:
    stages = []
    for path in ensure_binaries().kwok_stages:
        is_pod = path.parent.parent.name == "pod"
        if not is_pod or path.name not in ("pod-complete.yaml", "pod-ready.yaml"):
            stages.append(path)
            continue
        text = path.read_text()
        if path.name == "pod-ready.yaml":
            variants = {"": conformance._with(text, conformance._NO_INIT)}
        else:
            variants = {}
            for command, (phase, code) in _DONE_AFTER.items():
                done = conformance._with(text, _command_is(command))
                done = done.replace(
                    "  next:\n", "  delay:\n    durationMilliseconds: 10000\n  next:\n", 1
                )
                done = done.replace("exitCode: 0", f"exitCode: {code}").replace(
                    "phase: Succeeded", f"phase: {phase}"
                )
                if code:
                    done = done.replace("reason: Completed", "reason: Error")
                variants[f"-exit-{code}"] = done.replace(
                    "name: pod-complete\n", f"name: pod-complete-exit-{code}\n"
                )
        for suffix, content in variants.items():
            stage = work / f"stage-{path.stem}{suffix}.yaml"
            stage.write_text(content)
            stages.append(stage)
    return stages


def install_common(cluster: LocalCluster, cache: Path) -> None:
    """What both systems see: Kueue's CRDs (no controller), the PyTorchJob and JobSet CRDs,
    the namespaces."""
    peers.install_kueue(cluster, peers.kueue(cache, build=False))
    for module, path in CRD_MODULES.items():
        found = subprocess.run(
            ["go", "mod", "download", "-json", module],
            check=True,
            capture_output=True,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        crd = Path(json.loads(found.stdout)["Dir"]) / path
        cluster.kubectl("apply", "--server-side", "-f", str(crd), timeout=120)
    for namespace in (NAMESPACE, SYSTEM_NAMESPACE):
        cluster.kubectl("create", "namespace", namespace, check=False)


# -- the AppWrapper controller's webhooks, out of cluster ------------------------------------

SERVICE_NAME = "appwrapper-webhook-service"
SECRET_NAME = "appwrapper-webhook-server-cert"
CA_NAME = "appwrapper-ca"
WEBHOOK_PORT = 9443
"""Fixed in the controller's code."""


def _certificate(
    subject: str, issuer: tuple[str, rsa.RSAPrivateKey] | None, names: Sequence[str]
) -> tuple[bytes, rsa.RSAPrivateKey]:
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


# -- running ---------------------------------------------------------------------------------


def run_one(binary: Path, source: Path, home: Path, name: str, cap: float, log: Path) -> Outcome:
    return conformance.run_one(
        binary,
        source,
        home,
        name,
        cap,
        log,
        focus=focus(name),
        extra=[f"-ginkgo.label-filter={LABEL_FILTER}"],
    )


_LEFT_BEHIND = (
    "appwrappers",
    "deployments",
    "statefulsets",
    "jobs",
    "services",
    "pytorchjobs",
    "jobsets",
    "rayjobs",
    "rayclusters",
    "pods",
)


def clean(cluster: LocalCluster) -> None:
    """Between tests: nothing of the last one left in the suite's namespace (it cleans up
    after itself, but not after a test stopped at the cap)."""
    for kind in _LEFT_BEHIND:
        cluster.kubectl(
            "delete",
            kind,
            "--all",
            "-n",
            NAMESPACE,
            "--grace-period=0",
            "--timeout=90s",
            check=False,
            timeout=120,
        )


def table(system: str, outcomes: Sequence[Outcome]) -> str:
    passed = sum(o.result == "pass" for o in outcomes)
    lines = [
        f"AppWrapper {VERSION} e2e suite against {system}: {passed} of {len(outcomes)} pass",
        "",
        "| Test | Result | Seconds | Cap | Detail |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {o.test} | {o.result} | {o.seconds} | {o.cap:.0f} | {_cell(o.detail)} |"
        for o in outcomes
    ]
    return "\n".join(lines) + "\n"


def comparison(
    reference: Sequence[Outcome], ours: Sequence[Outcome], causes: Mapping[str, str]
) -> str:
    """Both runs side by side, in the reference's order, with the cause of each difference
    (tests in one run only show '-' for the other)."""
    theirs = {o.test: o.result for o in reference}
    mine = {o.test: o.result for o in ours}
    names = [o.test for o in reference] + [o.test for o in ours if o.test not in theirs]
    lines = [
        "| Test | AppWrapper controller + Kueue | This dispatcher | Cause of the difference |",
        "|---|---|---|---|",
    ]
    for name in names:
        left, right = theirs.get(name, "-"), mine.get(name, "-")
        cause = causes.get(name, "") if left != right else ""
        lines.append(f"| {name} | {left} | {right} | {_cell(cause)} |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


def _start(
    system: str, cluster: LocalCluster, cache: Path, work: Path, kueue_quotas: str | None
) -> tuple[subprocess.Popen[bytes], int]:
    """The system, and the port its admission webhook listens on."""
    if system == "appwrapper":
        return start_reference(cluster, cache, work), WEBHOOK_PORT
    return start_ours(cluster, work, kueue_quotas)


def wait_listening(process: subprocess.Popen[bytes], port: int, timeout: float = 120) -> None:
    """Until the webhook answers (the suite's first create needs it), or the system exits."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the system exited ({process.returncode}): see its log")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {port} after {timeout:.0f} s: see the log")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["ours", "appwrapper"], default="ours")
    parser.add_argument("--only", default="", help="run only tests whose name matches this")
    parser.add_argument("--cap", type=float, default=None, help="seconds per test, for every test")
    parser.add_argument(
        "--kueue-quotas",
        default=None,
        help="ours: the dispatcher's Kueue quota setting (beside|instead); unset: not passed",
    )
    parser.add_argument(
        "--our-queues",
        action="store_true",
        help="ours: the suite's Kueue objects also written as this dispatcher's quota kinds "
        "(results as SYSTEM-our-queues)",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    if args.our_queues and args.system != "ours":
        parser.error("--our-queues is for --system ours")
    run = f"{args.system}-our-queues" if args.our_queues else args.system
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    source, binary = build(args.cache)
    with tempfile.TemporaryDirectory(prefix="aw-conformance-") as tmp:
        work = Path(tmp)
        specs = [s for s in list_specs(binary, source, work) if re.search(args.only, s.name)]
        cluster = LocalCluster.start(
            "conformance-aw", work, kwok_stages=kwok_stages(work), kuberay=True
        )
        system = None
        outcomes = []
        logs = args.cache / "appwrapper" / "logs" / run
        logs.mkdir(parents=True, exist_ok=True)
        try:
            for node, size in NODES.items():
                cluster.add_node(node, **size)
            cluster.wait_nodes_ready(list(NODES))
            install_common(cluster, args.cache)
            home = work / "home"
            (home / ".kube").mkdir(parents=True)
            shutil.copy(cluster.kubeconfig, home / ".kube" / "config")
            if args.our_queues:
                install_our_queues(cluster)
            system, port = _start(args.system, cluster, args.cache, work, args.kueue_quotas)
            wait_listening(system, port)
            cluster.kubectl("wait", "--for=condition=Established", peers.APPWRAPPER_CRD)
            for number, spec in enumerate(specs):
                cap = args.cap or CAPS.get(spec.name, DEFAULT_CAP)
                outcome = run_one(binary, source, home, spec.name, cap, logs / f"{number:02d}.log")
                print(f"{outcome.result:8} {outcome.seconds:7.1f}s  {spec.name}", flush=True)
                outcomes.append(outcome)
                clean(cluster)
        finally:
            if system is not None:
                system.terminate()
                system.wait(30)
            for name in ("ours.log", "kueue.log", "appwrapper.log"):
                if (work / name).exists():
                    shutil.copy(work / name, logs / name)
            cluster.stop()
    write_results(run, args.only, args.cap, outcomes)
    return 0


def write_results(system: str, only: str, cap: float | None, outcomes: list[Outcome]) -> None:
    out = RESULTS / f"conformance-appwrapper-{system}.json"
    if only and out.exists():
        # A re-run of some tests replaces their rows in the last full table, in suite order.
        again = {o.test: o for o in outcomes}
        earlier = [Outcome(**row) for row in json.loads(out.read_text())["tests"]]
        outcomes = [again.pop(o.test, o) for o in earlier] + list(again.values())
    result = {
        "suite": SUITE,
        "label_filter": LABEL_FILTER,
        "system": system,
        "nodes": NODES,
        "cap_seconds": cap or {"default": DEFAULT_CAP, **CAPS},
        "passed": sum(o.result == "pass" for o in outcomes),
        "tests": [asdict(o) for o in outcomes],
    }
    report.save(result, out)
    (RESULTS / f"conformance-appwrapper-{system}.md").write_text(table(system, outcomes))
    print(table(system, outcomes))


if __name__ == "__main__":
    sys.exit(main())
