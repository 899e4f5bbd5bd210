"""The peers this dispatcher is measured against: MCAD, Kueue, and Kueue with the AppWrapper
v1beta2 controller (MCAD's successor), built and run locally.

    python -m benchmarks.peers build [--only mcad|kueue|appwrapper] [--cache DIR]

Building: each peer's Go module comes from the Go module proxy; a writable copy of it is built
with its own go.mod as the main module, into the cache directory (never into the repository).
What is already built is skipped. MCAD's build is benchmarks.conformance's (it also builds MCAD's
e2e suite there, which `make conformance` uses).

Running: against a LocalCluster, with the peer's own CRDs installed, and without webhooks (the
local control plane has no Service network to reach them): MCAD has none that matter here;
Kueue runs with its webhook server bound to loopback but unregistered, so nothing suspends Jobs
or labels them for it - the benchmark creates Jobs already suspended, with the queue-name label.
The AppWrapper controller runs beside that Kueue (Kueue's `workload.codeflare.dev/appwrapper`
integration admits the AppWrappers, the controller creates what they wrap) with its webhooks
off, so AppWrappers too are created suspended and labelled with their queue.

Side effects: `go` downloads and builds into the cache; `install_*` install CRDs in the cluster
given, `start_*` start processes; Kueue's start writes a self-signed certificate pair to
/etc/kueue/metrics/certs when none is there (Kueue v0.15.0 reads it even with metrics off).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks import conformance
from testenv.localcluster import DEFAULT_CACHE, LocalCluster, free_port

MCAD_VERSION = conformance.VERSION
KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_VERSION = "v0.15.0"
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
"""Where Kueue v0.15.0 looks for its metrics certificate, whatever its configuration says."""
APPWRAPPER_CRD = "crd/appwrappers.workload.codeflare.dev"
APPWRAPPER_MODULE = "github.com/project-codeflare/appwrapper"
APPWRAPPER_VERSION = "v1.1.2"
"""The version Kueue v0.15.0's own go.mod requires (its AppWrapper integration's API)."""
APPWRAPPER_NAMESPACE = "appwrapper-system"
APPWRAPPER_CONFIG = "appwrapper-operator-config"


@dataclass(frozen=True)
class Peer:
    """One built peer: its module source (CRDs and all), its controller binary, its CRDs."""

    name: str
    version: str
    source: Path
    binary: Path
    crds: Path


def kueue_dir(cache: Path) -> Path:
    return cache / "kueue"


def mcad(cache: Path = DEFAULT_CACHE, *, build: bool = True) -> Peer:
    """MCAD: kar-controllers and its CRDs (config/crd/bases)."""
    home = conformance.mcad_dir(cache)
    source = home / f"src-{MCAD_VERSION}"
    binary = home / f"kar-controllers-{MCAD_VERSION}"
    if build and not (source.exists() and binary.exists()):
        source, _, binary = conformance.build(cache, controller_too=True)
    return Peer("mcad", MCAD_VERSION, source, binary, source / "config" / "crd" / "bases")


def go_binary(module: str, version: str, package: str, source: Path, binary: Path) -> None:
    """`go build` of `package` in a writable copy of `module@version` (its own go.mod the
    main module) into `binary`, unless built already."""
    if binary.exists():
        return
    binary.parent.mkdir(parents=True, exist_ok=True)
    conformance.module_source(module, version, source)
    partial = binary.with_name(binary.name + ".partial")
    subprocess.run(["go", "build", "-o", str(partial), package], check=True, cwd=source)
    partial.rename(binary)


def kueue(cache: Path = DEFAULT_CACHE, *, build: bool = True) -> Peer:
    """Kueue: cmd/kueue and its CRDs (config/components/crd/bases); without `build`, its
    source alone (the CRDs), downloaded when missing."""
    home = kueue_dir(cache)
    source = home / f"src-{KUEUE_VERSION}"
    binary = home / f"kueue-{KUEUE_VERSION}"
    if build:
        go_binary(KUEUE_MODULE, KUEUE_VERSION, "./cmd/kueue", source, binary)
    else:
        home.mkdir(parents=True, exist_ok=True)
        conformance.module_source(KUEUE_MODULE, KUEUE_VERSION, source)
    crds = source / "config" / "components" / "crd" / "bases"
    return Peer("kueue", KUEUE_VERSION, source, binary, crds)


def appwrapper(cache: Path = DEFAULT_CACHE, *, build: bool = True) -> Peer:
    """The AppWrapper v1beta2 controller: ./cmd (built in its own module: it does not import
    Kueue) and its CRD (config/crd/bases)."""
    home = cache / "appwrapper"
    source = home / f"src-{APPWRAPPER_VERSION}"
    binary = home / f"appwrapper-manager-{APPWRAPPER_VERSION}"
    if build:
        go_binary(APPWRAPPER_MODULE, APPWRAPPER_VERSION, "./cmd", source, binary)
    return Peer("appwrapper", APPWRAPPER_VERSION, source, binary, source / "config/crd/bases")


BUILDERS = {"mcad": mcad, "kueue": kueue, "appwrapper": appwrapper}


def build_all(cache: Path, only: list[str]) -> dict[str, float]:
    """Build each peer named in `only` that is missing; seconds each took (0 when skipped)."""
    seconds = {}
    for name in only:
        started = time.monotonic()
        peer = BUILDERS[name](cache, build=False)
        if peer.binary.exists() and peer.source.exists():
            print(f"{name} {peer.version}: already built ({peer.binary})", flush=True)
            seconds[name] = 0.0
            continue
        peer = BUILDERS[name](cache)
        seconds[name] = round(time.monotonic() - started, 1)
        print(f"{name} {peer.version}: built in {seconds[name]:.1f}s ({peer.binary})", flush=True)
    return seconds


# -- running ------------------------------------------------------------------------------


def crd_documents(peer: Peer, storage: str | None = None) -> list[dict[str, Any]]:
    """The peer's CRDs; with `storage`, that version made the storage version wherever a CRD
    serves it.

    Kueue v0.15.0's CRDs store v1beta1 while its controllers read and write only v1beta2, and
    the conversion between them is a webhook; without it (strategy None) what Kueue writes
    would be stored under the v1beta1 schema and its v1beta2-only fields pruned. Storing
    v1beta2 needs no conversion at all, as long as every client uses v1beta2."""
    documents = []
    for path in sorted(peer.crds.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            versions = doc["spec"].get("versions", [])
            if storage and any(v["name"] == storage for v in versions):
                for version in versions:
                    version["storage"] = version["name"] == storage
            documents.append(doc)
    if not documents:  # a CRD directory missing or moved: nothing would be installed
        raise FileNotFoundError(f"no CustomResourceDefinition in {peer.crds}/*.yaml")
    return documents


def install_crds(cluster: LocalCluster, peer: Peer, storage: str | None = None) -> None:
    """The peer's CRDs (see `crd_documents`), server-side (some are too large for a
    client-side apply's annotation), and until each is Established."""
    documents = crd_documents(peer, storage)
    for doc in documents:
        cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc), timeout=120)
    for doc in documents:
        name = doc["metadata"]["name"]
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", timeout=90)


def start_mcad(
    cluster: LocalCluster, peer: Peer, workdir: Path, extra: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """kar-controllers against `cluster`, whose CRDs must be installed (`install_crds`).
    Single-cluster ("agent") mode: it logs "Invalid agent configuration" and carries on. Its
    client QPS/burst are fixed at 100/200 in its code."""
    log = (workdir / "mcad.log").open("ab")
    command = [
        str(peer.binary),
        "--kubeconfig",
        str(cluster.kubeconfig),
        f"--healthProbeListenAddr=127.0.0.1:{free_port()}",
        *(extra or []),
    ]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def self_signed(directory: Path) -> None:
    """tls.crt and tls.key (a self-signed pair for 127.0.0.1) in `directory`, unless there."""
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "tls.crt").exists() and (directory / "tls.key").exists():
        return
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(directory / "tls.key"),
            "-out",
            str(directory / "tls.crt"),
        ],
        check=True,
        capture_output=True,
    )


def kueue_configuration(
    webhook_port: int,
    cert_dir: Path,
    health_port: int,
    *,
    qps: float,
    burst: int,
    frameworks: list[str],
) -> dict[str, Any]:
    """Kueue's Configuration for a run without cert-manager, leader election or webhooks."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "clientConnection": {"qps": qps, "burst": burst},
        "integrations": {"frameworks": frameworks},
    }


KUEUE_STORAGE = "v1beta2"


def install_kueue(cluster: LocalCluster, peer: Peer) -> None:
    """Kueue's CRDs (storing v1beta2, see `crd_documents`) and its namespace."""
    install_crds(cluster, peer, storage=KUEUE_STORAGE)
    cluster.kubectl("create", "namespace", "kueue-system", check=False)


def kueue_command(
    cluster: LocalCluster,
    peer: Peer,
    workdir: Path,
    *,
    qps: float = 50,
    burst: int = 100,
    frameworks: tuple[str, ...] = ("batch/job",),
) -> list[str]:
    """Kueue's command line against `cluster` (its configuration and certificates written to
    `workdir`). qps/burst default to Kueue's own defaults. Its webhook server listens on
    loopback, but no webhook configuration points at it: what it admits must be created
    suspended and labelled with its queue."""
    certs = workdir / "kueue-certs"
    self_signed(certs)
    if not (KUEUE_METRICS_CERTS / "tls.crt").exists():
        KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            shutil.copy(certs / name, KUEUE_METRICS_CERTS / name)
    config = workdir / "kueue-config.yaml"
    config.write_text(
        yaml.safe_dump(
            kueue_configuration(
                free_port(), certs, free_port(), qps=qps, burst=burst, frameworks=list(frameworks)
            )
        )
    )
    return [
        str(peer.binary),
        "--config",
        str(config),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--feature-gates=VisibilityOnDemand=false",
    ]


def start_kueue(
    cluster: LocalCluster,
    peer: Peer,
    workdir: Path,
    *,
    qps: float = 50,
    burst: int = 100,
    frameworks: tuple[str, ...] = ("batch/job",),
) -> subprocess.Popen[bytes]:
    """Kueue against `cluster`, set up first by `install_kueue` (see `kueue_command`)."""
    command = kueue_command(cluster, peer, workdir, qps=qps, burst=burst, frameworks=frameworks)
    log = (workdir / "kueue.log").open("ab")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def appwrapper_configuration(health_port: int) -> dict[str, Any]:
    """The AppWrapper controller's settings (decoded over its defaults): no webhooks (nothing
    reaches them here), no metrics, no leader election. Its fault-tolerance timers stay at
    their defaults; durations would be integer nanoseconds."""
    return {
        "webhooksEnabled": False,
        "controllerManager": {
            "health": {"bindAddress": f"127.0.0.1:{health_port}"},
            "metrics": {"bindAddress": "0"},
            "leaderElection": False,
        },
        "appwrapper": {
            "userRBACAdmissionCheck": False,
            "autopilot": {"injectAntiAffinities": False, "monitorNodes": False},
        },
    }


def install_appwrapper(cluster: LocalCluster, peer: Peer, kueue_peer: Peer) -> None:
    """Kueue's CRDs and namespace, the AppWrapper v1beta2 CRD (before Kueue starts: its
    integration waits for the kind), the controller's namespace and its ConfigMap (the
    controller would create one with webhooks on when there is none)."""
    install_kueue(cluster, kueue_peer)
    install_crds(cluster, peer)
    cluster.kubectl("create", "namespace", APPWRAPPER_NAMESPACE, check=False)
    settings = yaml.safe_dump(appwrapper_configuration(free_port()))
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": APPWRAPPER_CONFIG, "namespace": APPWRAPPER_NAMESPACE},
        "data": {"config.yaml": settings},
    }
    cluster.apply(config_map)


def start_appwrapper(
    cluster: LocalCluster,
    peer: Peer,
    kueue_peer: Peer,
    workdir: Path,
    *,
    qps: float = 50,
    burst: int = 100,
    frameworks: tuple[str, ...] = ("workload.codeflare.dev/appwrapper",),
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Kueue (with its AppWrapper integration, and any other `frameworks`) and the AppWrapper
    controller, as the children of one shell, so that the system's CPU and memory are those
    of its process tree and stopping the shell (SIGTERM) stops both. Set up first by
    `install_appwrapper`. The controller's client is its own fixed 20 QPS / 30 burst (no
    setting changes it). `env`: their environment, if not this process's."""
    kueue = shlex.join(
        kueue_command(
            cluster,
            kueue_peer,
            workdir,
            qps=qps,
            burst=burst,
            frameworks=frameworks,
        )
    )
    controller = shlex.join(
        [str(peer.binary), "--kubeconfig", str(cluster.kubeconfig), "--config", APPWRAPPER_CONFIG]
    )
    script = (
        f"{kueue} >>{shlex.quote(str(workdir / 'kueue.log'))} 2>&1 & k=$!; "
        f"NAMESPACE={APPWRAPPER_NAMESPACE} {controller} "
        f">>{shlex.quote(str(workdir / 'appwrapper.log'))} 2>&1 & a=$!; "
        'trap \'kill -TERM "$k" "$a" 2>/dev/null; wait\' TERM INT; wait'
    )
    return subprocess.Popen(["bash", "-c", script], start_new_session=True, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the peers that are missing")
    build.add_argument("--only", choices=sorted(BUILDERS), action="append")
    build.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    if args.command == "build":
        seconds = build_all(args.cache, args.only or sorted(BUILDERS))
        print(json.dumps(seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
