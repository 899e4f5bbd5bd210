"""Leader election: of two dispatcher processes only one dispatches; the other takes over.

"Never two leaders writing" is checked from the API server's side: its audit log records
every write it accepted, and each replica's identity (host-pid, as in the Lease) is in its
User-Agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from testenv.faultproxy import FaultProxy
from testenv.localcluster import free_port
from testenv.manifests import appwrapper, job, webhook_configurations
from testenv.waits import holds_for, wait_until

pytestmark = [pytest.mark.cluster]

READS = {"get", "list", "watch"}

# A replica whose wall clock is off by SKEW seconds (time.time() shifted in that process
# only): what it writes into the Lease's renewTime is an hour wrong.
SKEWED = (
    "import runpy, sys, time; real = time.time; skew = float(sys.argv.pop(1)); "
    "time.time = lambda: real() + skew; sys.argv[0] = 'dispatcher'; "
    "runpy.run_module('dispatcher', run_name='__main__', alter_sys=True)"
)


def _holder(cluster, namespace: str) -> str:
    out = cluster.kubectl(
        "get", "lease", "appwrapper-dispatcher", "-n", namespace, "-o", "json", check=False
    )
    if out.returncode != 0:
        return ""
    return str(json.loads(out.stdout)["spec"].get("holderIdentity") or "")


def _has_status(cluster, namespace: str, name: str) -> bool:
    out = cluster.kubectl("get", "appwrapper", name, "-n", namespace, "-o", "json", check=False)
    return out.returncode == 0 and bool(json.loads(out.stdout).get("status"))


def _accepted_writes(cluster, pid: int) -> list[tuple[datetime, datetime]]:
    """(received, answered) of each write the API server accepted from the replica `pid`."""
    agent = f"({socket.gethostname()}-{pid})"
    found = []
    for event in cluster.audit_events():
        if agent not in event.get("userAgent", "") or event.get("verb") in READS:
            continue
        if event.get("responseStatus", {}).get("code", 500) >= 400:
            continue  # refused: nothing was written
        found.append(
            (
                datetime.fromisoformat(event["requestReceivedTimestamp"]),
                datetime.fromisoformat(event["stageTimestamp"]),
            )
        )
    return sorted(found)


class Replicas:
    """Dispatcher processes with leader election on, each with its own config and log."""

    def __init__(self, cluster, namespace: str, workdir: Path) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self, name: str, *, kubeconfig: Path | None = None, skew: float = 0, **extra: object
    ) -> subprocess.Popen[bytes]:
        config = self.workdir / f"{name}.yaml"
        settings = {
            "kubeconfig": str(kubeconfig or self.cluster.kubeconfig),
            "health_port": 0,
            "leader_election": True,
            "lease_namespace": self.namespace,
            "log_format": "json",
            # Only this test's (absent) nodes: the processes must not dispatch anyone's work.
            "members": [
                {"name": "local", "node_selector": {"appwrapper.test/pool": self.namespace}}
            ],
            # No admission webhook unless a test asks for one (extra settings).
            "unattributed": "allow",
            **extra,
        }
        config.write_text(yaml.safe_dump(settings))
        command = [sys.executable, "-m", "dispatcher"]
        if skew:
            command = [sys.executable, "-c", SKEWED, str(skew)]
        with (self.workdir / f"{name}.log").open("ab") as out:
            process = subprocess.Popen(
                [*command, "run", "--config", str(config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.processes[name] = process
        return process

    def events(self, name: str) -> list[str]:
        told = []
        for line in (self.workdir / f"{name}.log").read_text().splitlines():
            with contextlib.suppress(ValueError):
                told.append(str(json.loads(line).get("event")))
        return told

    def leads(self, name: str) -> bool:
        return _holder(self.cluster, self.namespace).endswith(f"-{self.processes[name].pid}")

    def wait_leads(self, name: str, timeout: float = 40) -> None:
        wait_until(lambda: self.leads(name), timeout=timeout, what=f"replica {name} leads")

    def wait_standing_by(self, name: str) -> None:
        wait_until(
            lambda: "standing_by" in self.events(name),
            timeout=30,
            what=f"replica {name} has read the lease",
        )

    def apply_and_see_status(self, name: str) -> None:
        applied = appwrapper(name, job(name, 1, {"cpu": "1"}))
        self.cluster.kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(applied))
        wait_until(
            lambda: _has_status(self.cluster, self.namespace, name),
            timeout=30,
            what=f"the leader writes the status of {name}",
        )

    def assert_one_writer_at_a_time(self, old: str, new: str) -> None:
        """Every write the API server accepted from `old` ended before the first one it
        accepted from `new` began."""
        before, after = (_accepted_writes(self.cluster, self.processes[n].pid) for n in (old, new))
        assert before, f"no write of replica {old} was audited"
        assert after, f"no write of replica {new} was audited"
        assert max(end for _, end in before) < min(start for start, _ in after), (
            before[-3:],
            after[:3],
        )

    def stop(self) -> None:
        # While a replica still leads: it removes the finalizers.
        self.cluster.kubectl(
            "delete",
            "appwrappers",
            "--all",
            "-n",
            self.namespace,
            "--timeout=60s",
            check=False,
            timeout=90,
        )
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()


@pytest.fixture
def replicas(cluster, namespace, appwrapper_crd, tmp_path) -> Iterator[Replicas]:
    if not hasattr(cluster, "audit_events"):
        pytest.skip("needs the local control plane (its audit log is read)")
    started = Replicas(cluster, namespace, tmp_path)
    try:
        yield started
    finally:
        started.stop()


def test_one_leader_and_failover(replicas):
    replicas.start("first")
    replicas.wait_leads("first", timeout=30)
    replicas.start("second")
    replicas.wait_standing_by("second")
    # The second replica stays a follower while the first renews.
    holds_for(lambda: replicas.leads("first"), seconds=8, what="no takeover while it lives")
    replicas.apply_and_see_status("before")
    replicas.processes["first"].send_signal(signal.SIGKILL)
    replicas.processes["first"].wait(10)
    replicas.wait_leads("second")
    replicas.apply_and_see_status("after")
    replicas.assert_one_writer_at_a_time("first", "second")


def test_replicas_with_clocks_an_hour_off_neither_take_a_live_lease_nor_wait_on_a_dead_one(
    replicas,
):
    """The leader's clock an hour slow (its renewTime looks an hour stale), the follower's an
    hour fast: a follower comparing renewTime with its clock would take over at once."""
    replicas.start("first", skew=-3600)
    replicas.wait_leads("first", timeout=30)
    replicas.start("second", skew=3600)
    replicas.wait_standing_by("second")
    holds_for(lambda: replicas.leads("first"), seconds=20, what="no takeover of a live lease")
    replicas.apply_and_see_status("before")
    replicas.processes["first"].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    replicas.processes["first"].wait(10)
    replicas.wait_leads("second")
    # It counted the lease on its own clock: one lease duration (15 s), plus a retry period.
    assert time.monotonic() - killed < 15 + 2 + 5
    replicas.apply_and_see_status("after")
    replicas.assert_one_writer_at_a_time("first", "second")


@pytest.mark.parametrize("fault", ["paused-api-server", "429-storm"])
def test_a_fault_longer_than_the_lease_never_leaves_two_leaders(cluster, replicas, fault):
    """The leader cannot reach the API server for longer than the lease while a second
    replica runs: the API server stops answering anyone (SIGSTOP), or answers only the leader
    with 429s (a proxy in front of it). The leader fences itself and exits at its renew
    deadline, before the follower can count the lease as expired; only then does the follower
    lead and write."""
    proxy = FaultProxy(cluster.server)
    proxy.start()
    try:
        first = replicas.start(
            "first", kubeconfig=proxy.kubeconfig(replicas.workdir / "proxied", cluster.token)
        )
        replicas.wait_leads("first", timeout=30)
        replicas.start("second")
        replicas.wait_standing_by("second")
        replicas.apply_and_see_status("before")
        if fault == "paused-api-server":
            cluster.pause_api()
        else:
            proxy.storm(True)
        began = time.monotonic()
        try:
            # Renew deadline 10 s: the leader stops (exit 1) before the 15 s lease is over.
            assert first.wait(timeout=25) == 1
            stopped_after = time.monotonic() - began
            time.sleep(max(0.0, 20 - (time.monotonic() - began)))  # the fault outlasts the lease
        finally:
            cluster.resume_api()
            proxy.storm(False)
        assert stopped_after < 15, stopped_after
        if fault == "429-storm":
            assert proxy.refused > 0
        replicas.wait_leads("second")
        replicas.apply_and_see_status("after")
        assert replicas.processes["second"].poll() is None
        # The old leader's last words: the lease lost (the fence), nothing after it.
        told = replicas.events("first")
        assert "leader_lost" in told, told[-10:]
        after_loss = told[told.index("leader_lost") + 1 :]
        assert not {"dispatched", "preempted", "requeued"} & set(after_loss), after_loss
        replicas.assert_one_writer_at_a_time("first", "second")
    finally:
        proxy.stop()


def test_the_standby_serves_the_admission_webhook(cluster, namespace, replicas):
    """The API server may call any replica: one waiting for the Lease answers too."""
    ports = {"leader": free_port(), "standby": free_port()}
    name = f"aw-standby-{namespace}"[:63]

    def webhook(port: int) -> dict[str, object]:
        return {
            "enabled": True,
            "host": "127.0.0.1",
            "port": port,
            "namespace": namespace,
            "extra_names": ["127.0.0.1"],
            "mutating_configuration": name,
            "validating_configuration": name,
        }

    mutating, validating = webhook_configurations(name, ports["standby"], namespace=namespace)
    cluster.apply(mutating)  # the standby's: only it answers
    try:
        for replica in ("leader", "standby"):
            replicas.start(replica, webhook=webhook(ports[replica]), unattributed="refuse")
            if replica == "leader":
                replicas.wait_leads("leader", timeout=30)
        replicas.wait_standing_by("standby")
        wait_until(
            lambda: (
                "caBundle"
                in cluster.kubectl("get", "mutatingwebhookconfiguration", name, "-o", "json").stdout
            ),
            timeout=30,
            what="the caBundle is published",
        )
        replicas.apply_and_see_status("through-the-standby")
        annotations = json.loads(
            cluster.kubectl(
                "get", "aw", "through-the-standby", "-n", namespace, "-o", "json"
            ).stdout
        )["metadata"]["annotations"]
        assert json.loads(annotations["workload.codeflare.dev/user"])["username"]
        assert not replicas.leads("standby")
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, check=False)
        del validating
