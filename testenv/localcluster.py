"""Local Kubernetes control planes on loopback, for tests, demos and benchmarks.

Side effects: starts and kills processes, writes files under a work directory.

Each `LocalCluster` is a real control plane built from Kubernetes' own Go modules
(see testenv/): etcd, kube-apiserver (token auth, RBAC; it presents a client certificate to
admission webhooks, configured as docs/operations.md tells operators: an
AdmissionConfiguration naming a kubeconfig, its CA in `webhook_client_ca`), kube-controller-manager,
kube-scheduler, KWOK (fake nodes whose pods reach Running without a kubelet) and,
optionally, the KubeRay operator. Several clusters can run side by side; each has
its own ports, data and kubeconfig. `ExistingCluster` (testing/kubectl.py) wraps a
kubeconfig for a cluster made elsewhere (kind, a real one) behind the same interface.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testenv import pki
from testenv.binaries import (
    DEFAULT_CACHE,
    REPO_ROOT,
    Binaries,
    ClusterStartError,
    ensure_binaries,
)
from testenv.kubectl import (
    FAKE_NODE_ANNOTATION,
    ExistingCluster,
    KubectlError,
    KubectlMixin,
    node_manifest,
)
from testenv.ports import free_port

BIND_ATTEMPTS = 4
"""Starts of one component, each on fresh ports, when another program took its port."""
FRONT_PROXY_CLIENT_NAME = "front-proxy-client"
"""The common name of the local API server's front-proxy client certificate (kubeadm's)."""
WEBHOOK_CLIENT_NAME = "kube-apiserver-webhook-client"
"""The common name of the client certificate the local API server presents to webhooks
(the default of `webhook.client_names`)."""

# Re-exported: tests, the demo and benchmarks import them from here.
__all__ = [
    "DEFAULT_CACHE",
    "REPO_ROOT",
    "Binaries",
    "ClusterStartError",
    "ExistingCluster",
    "KubectlError",
    "ensure_binaries",
    "free_port",
    "node_manifest",
]


AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Metadata"},
    ],
}
"""Writes only: reads are most of the traffic and no test asks who read what."""

AUDIT_POLICY_WITH_READS: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["watch"]},
        {  # with what was written: which step each status write and Event records
            "level": "Request",
            "verbs": ["create", "update", "patch"],
            "resources": [
                {"group": "workload.codeflare.dev", "resources": ["appwrappers/status"]},
                {"group": "", "resources": ["events"]},
            ],
        },
        {"level": "Metadata"},
    ],
}
"""Every request but watches (benchmarks that count a controller's GETs and LISTs too), and
the bodies of AppWrapper status writes and of Events."""


@dataclass
class LocalCluster(KubectlMixin):
    """One control plane on loopback. Create with `LocalCluster.start(...)`; `stop()` kills it."""

    name: str
    workdir: Path
    binaries: Binaries
    server: str
    token: str
    kubeconfig: Path
    kubectl_path: Path | str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    webhook_client_ca: Path | None = None
    """The CA (PEM) of the client certificate the API server presents to every webhook
    (CN `WEBHOOK_CLIENT_NAME`): a dispatcher's `webhook.client_ca_file`."""
    webhook_client_ca_key: Path | None = None
    """Its key: tests sign certificates of their own with it (a wrong name)."""
    audit_reads: bool = False

    @classmethod
    def start(
        cls,
        name: str,
        workdir: Path,
        *,
        binaries: Binaries | None = None,
        kuberay: bool = False,
        audit: bool = False,
        audit_reads: bool = False,
        kwok_stages: Sequence[Path] | None = None,
        timeout: float = 120,
    ) -> LocalCluster:
        """`audit`: log every write to logs/audit.log (`audit_reads`: reads too, but not
        watches). Off by default: an audit log costs the API server on every request."""
        binaries = binaries or ensure_binaries()
        workdir = workdir / name
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "logs").mkdir(exist_ok=True)
        token = secrets.token_hex(16)
        api_port = free_port()
        cluster = cls(
            name=name,
            workdir=workdir,
            binaries=binaries,
            server=f"https://127.0.0.1:{api_port}",
            token=token,
            kubeconfig=workdir / "kubeconfig",
            kubectl_path=binaries.kubectl,
        )
        cluster.audit_reads = audit_reads
        try:
            cluster._start_all(
                api_port=api_port,
                kuberay=kuberay,
                audit=audit,
                stages=list(kwok_stages or binaries.kwok_stages),
                timeout=timeout,
            )
        except BaseException:
            cluster.stop()
            raise
        return cluster

    # -- start-up -------------------------------------------------------------------------

    def _start_all(
        self,
        *,
        api_port: int,
        kuberay: bool,
        audit: bool,
        stages: list[Path],
        timeout: float,
    ) -> None:
        deadline = time.monotonic() + timeout
        work = self.workdir
        (work / "tokens.csv").write_text(f'{self.token},admin,admin,"system:masters"\n')
        sa_key = work / "sa.key"
        if not sa_key.exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True
            )
        self._write_kubeconfig()

        def start_etcd(ports: list[int]) -> None:
            client_port, peer_port = ports
            self._spawn(
                "etcd",
                [
                    str(self.binaries.k8s),
                    "etcd",
                    f"--data-dir={work / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{client_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                ],
            )
            self._wait_http(f"http://127.0.0.1:{client_port}/health", "etcd", deadline)

        etcd_port = self._start_on_ports("etcd", 2, start_etcd, first=None)[0]

        def start_apiserver(ports: list[int]) -> None:
            self.server = f"https://127.0.0.1:{ports[0]}"
            self._write_kubeconfig()
            self._spawn(
                "kube-apiserver", self._apiserver_argv(ports[0], etcd_port, sa_key, audit=audit)
            )
            self._wait_http(f"{self.server}/readyz", "kube-apiserver", deadline, token=self.token)

        self._start_on_ports("kube-apiserver", 1, start_apiserver, first=[api_port])

        self._start_controllers(sa_key=sa_key, kuberay=kuberay, stages=stages)
        self._wait_default_namespace(deadline)

    def _apiserver_argv(self, port: int, etcd_port: int, sa_key: Path, *, audit: bool) -> list[str]:
        work = self.workdir
        return [
            str(self.binaries.k8s),
            "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={work / 'certs'}",
            f"--token-auth-file={work / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            "--anonymous-auth=false",
            f"--service-account-key-file={sa_key}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            # Pods are created in fresh namespaces before the controller-manager has made
            # their default ServiceAccount; nothing here runs a kubelet that would mount it.
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
            "--max-requests-inflight=800",
            "--max-mutating-requests-inflight=400",
            f"--admission-control-config-file={self._webhook_client_identity()}",
            *self._front_proxy_flags(),
            *(self._audit_flags() if audit else []),
        ]

    def _start_controllers(self, *, sa_key: Path, kuberay: bool, stages: list[Path]) -> None:
        """kube-controller-manager, kube-scheduler, KWOK for the fake nodes, and KubeRay."""
        work = self.workdir
        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false"]
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.k8s),
                "kube-controller-manager",
                *common,
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                f"--service-account-private-key-file={sa_key}",
                "--use-service-account-credentials=false",
                "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-gc-syncs=10",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.k8s),
                "kube-scheduler",
                *common,
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
            ],
        )
        kwok_home = work / "kwok-home"
        kwok_home.mkdir(exist_ok=True)
        self._spawn(
            "kwok",
            [
                str(self.binaries.kwok),
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.243.0.1",
                "--server-address=127.0.0.1:0",
                *(f"--config={p}" for p in stages),
            ],
            env={"HOME": str(kwok_home)},
        )
        if kuberay:
            self.kubectl("apply", "--server-side", "-f", str(self.binaries.kuberay_crds))
            self._spawn(
                "kuberay-operator",
                [
                    str(self.binaries.kuberay),
                    f"--kubeconfig={self.kubeconfig}",
                    "--enable-leader-election=false",
                    f"--metrics-addr=127.0.0.1:{free_port()}",
                    f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                ],
            )

    def _write_kubeconfig(self) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.name,
                    "cluster": {"server": self.server, "insecure-skip-tls-verify": True},
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": "admin"}}],
            "current-context": self.name,
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))

    def _start_on_ports(
        self,
        component: str,
        count: int,
        start: Callable[[list[int]], None],
        *,
        first: list[int] | None,
    ) -> list[int]:
        """Start `component` on `count` ports (`first`, else fresh ones): `start(ports)`
        spawns it and waits until it serves. A start that failed because another program
        bound one of its ports first is tried again on fresh ports (see testing.ports)."""
        log = self.workdir / "logs" / f"{component}.log"
        ports = first or [free_port() for _ in range(count)]
        for attempt in range(1, BIND_ATTEMPTS + 1):
            offset = log.stat().st_size if log.exists() else 0
            try:
                start(ports)
                return ports
            except ClusterStartError:
                if attempt == BIND_ATTEMPTS or not _lost_port(log, offset):
                    raise
                self._reap(component)
                ports = [free_port() for _ in range(count)]
        raise AssertionError("unreachable")

    def _reap(self, component: str) -> None:
        proc = self.processes.pop(component, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait(timeout=10)

    def _spawn(self, component: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        log = open(self.workdir / "logs" / f"{component}.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            self.processes[component] = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                # Own process group: a Ctrl-C in the terminal must not kill the cluster
                # before `stop()` tears it down in order.
                start_new_session=True,
            )
        finally:
            log.close()
        (self.workdir / f"{component}.pid").write_text(str(self.processes[component].pid))

    def _check_alive(self, component: str) -> None:
        proc = self.processes.get(component)
        if proc is not None and proc.poll() is not None:
            log = self.workdir / "logs" / f"{component}.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise ClusterStartError(f"{component} exited with {proc.returncode}; {log}:\n{tail}")

    def _wait_http(self, url: str, component: str, deadline: float, token: str = "") -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        while True:
            self._check_alive(component)
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(request, timeout=2, context=context) as response,
            ):
                if response.status == 200:
                    return
            if time.monotonic() > deadline:
                raise ClusterStartError(
                    f"{component} not healthy at {url}; see {self.workdir / 'logs'}"
                )
            time.sleep(0.1)

    def _wait_default_namespace(self, deadline: float) -> None:
        while self.kubectl("get", "namespace", "default", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise ClusterStartError(f"namespace default never appeared in {self.name}")
            time.sleep(0.2)

    def _webhook_client_identity(self) -> Path:
        """The AdmissionConfiguration that makes the API server present a client certificate
        to admission webhooks, signed by a CA of this cluster's own; returns its path."""
        files = pki.webhook_client_files(
            self.workdir / "webhook-client", f"{self.name}-webhook-client-ca", WEBHOOK_CLIENT_NAME
        )
        self.webhook_client_ca, self.webhook_client_ca_key = files.ca, files.ca_key
        return files.admission_config

    def _front_proxy_flags(self) -> list[str]:
        """The aggregation layer, as kubeadm sets it up: aggregated APIs (the dispatcher's
        visibility API) trust this CA's client certificate and the user it names in
        X-Remote-* headers (published in kube-system/extension-apiserver-authentication)."""
        files = pki.front_proxy_files(
            self.workdir / "front-proxy", f"{self.name}-front-proxy-ca", FRONT_PROXY_CLIENT_NAME
        )
        return [
            f"--requestheader-client-ca-file={files.ca}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT_NAME}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={files.cert}",
            f"--proxy-client-key-file={files.key}",
        ]

    def _audit_flags(self) -> list[str]:
        """Every write, at Metadata level (who, what, when, answer), to logs/audit.log."""
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(json.dumps(AUDIT_POLICY_WITH_READS if self.audit_reads else AUDIT_POLICY))
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.workdir / 'logs' / 'audit.log'}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log so far (empty unless started with `audit=True`)."""
        path = self.workdir / "logs" / "audit.log"
        if not path.exists():
            return []
        events = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        return events

    # -- life ---------------------------------------------------------------------------

    def pause_api(self) -> None:
        """Stop the API server (SIGSTOP) to simulate a member that stops answering."""
        self.processes["kube-apiserver"].send_signal(signal.SIGSTOP)

    def resume_api(self) -> None:
        self.processes["kube-apiserver"].send_signal(signal.SIGCONT)

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each component, read from /proc."""
        sizes: dict[str, int] = {}
        for component, proc in self.processes.items():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        sizes[component] = int(line.split()[1]) * 1024
        return sizes

    def stop(self) -> None:
        """Kill every component, newest first, and wait for each to go."""
        for component in reversed(list(self.processes)):
            proc = self.processes[component]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.terminate()
        for component in reversed(list(self.processes)):
            proc = self.processes[component]
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _lost_port(log: Path, offset: int) -> bool:
    """Whether the component's log, from `offset` on, says a port it was given was taken."""
    if not log.exists():
        return False
    with log.open("rb") as handle:
        handle.seek(offset)
        return b"address already in use" in handle.read()
