"""Leader election: of two dispatcher processes only one dispatches; the other takes over."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime

import pytest
import yaml

from dispatcher.testing.faultproxy import FaultProxy
from dispatcher.testing.manifests import appwrapper, job
from dispatcher.testing.waits import wait_until

pytestmark = [pytest.mark.cluster]


def _holder(cluster, namespace: str) -> str:
    out = cluster.kubectl(
        "get", "lease", "appwrapper-dispatcher", "-n", namespace, "-o", "json", check=False
    )
    if out.returncode != 0:
        return ""
    return str(json.loads(out.stdout)["spec"].get("holderIdentity") or "")


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


READS = {"get", "list", "watch"}


def test_one_leader_and_failover(cluster, namespace, appwrapper_crd, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kubeconfig": str(cluster.kubeconfig),
                "health_port": 0,
                "leader_election": True,
                "lease_namespace": namespace,
                # Only this test's (absent) nodes: the processes must not dispatch anyone's work.
                "members": [
                    {"name": "local", "node_selector": {"appwrapper.test/pool": namespace}}
                ],
            }
        )
    )
    log = (tmp_path / "dispatchers.log").open("ab")

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "dispatcher", "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    first = start()
    second = None
    try:
        holder = wait_until(lambda: _holder(cluster, namespace), timeout=30, what="a leader")
        assert holder.endswith(f"-{first.pid}")
        second = start()
        # The second replica stays a follower while the first renews.
        with pytest.raises(TimeoutError):
            wait_until(
                lambda: _holder(cluster, namespace).endswith(f"-{second.pid}"),
                timeout=8,
                what="no takeover while the leader lives",
            )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        wait_until(
            lambda: _holder(cluster, namespace).endswith(f"-{second.pid}"),
            timeout=40,
            what="the follower takes over after the lease expires",
        )
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
        log.close()


def _has_status(cluster, namespace: str, name: str) -> bool:
    out = cluster.kubectl("get", "appwrapper", name, "-n", namespace, "-o", "json", check=False)
    return out.returncode == 0 and bool(json.loads(out.stdout).get("status"))


@pytest.mark.parametrize("fault", ["paused-api-server", "429-storm"])
def test_a_fault_longer_than_the_lease_never_leaves_two_leaders(
    cluster, namespace, appwrapper_crd, tmp_path, fault
):
    """The leader cannot reach the API server for longer than the lease while a second
    replica runs: the API server stops answering anyone (SIGSTOP), or answers only the leader
    with 429s (a proxy in front of it). The leader fences itself and exits at its renew
    deadline, before the follower can count the lease as expired; only then does the follower
    lead and write, as the API server's audit log shows."""
    if not hasattr(cluster, "pause_api"):
        pytest.skip("needs the local control plane (its API server is paused, its audit read)")
    proxy = FaultProxy(cluster.server)
    proxy.start()
    settings = {
        "health_port": 0,
        "leader_election": True,
        "lease_namespace": namespace,
        "log_format": "json",
        "members": [{"name": "local", "node_selector": {"appwrapper.test/pool": namespace}}],
    }
    configs = {}
    for name, kubeconfig in (
        ("first", proxy.kubeconfig(tmp_path / "proxied.kubeconfig", cluster.token)),
        ("second", cluster.kubeconfig),
    ):
        configs[name] = tmp_path / f"{name}.yaml"
        configs[name].write_text(yaml.safe_dump({**settings, "kubeconfig": str(kubeconfig)}))
    logs = {name: tmp_path / f"{name}.log" for name in ("first", "second")}

    def start(name: str) -> subprocess.Popen[bytes]:
        with logs[name].open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "dispatcher", "run", "--config", str(configs[name])],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def events(name: str) -> list[dict[str, object]]:
        found = []
        for line in logs[name].read_text().splitlines():
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
        return found

    def fault_on() -> None:
        if fault == "paused-api-server":
            cluster.pause_api()
        else:
            proxy.storm(True)

    def fault_off() -> None:
        if fault == "paused-api-server":
            cluster.resume_api()
        else:
            proxy.storm(False)

    first = start("first")
    second = None
    try:
        wait_until(
            lambda: _holder(cluster, namespace).endswith(f"-{first.pid}"),
            timeout=30,
            what="the first replica leads",
        )
        second = start("second")
        wait_until(
            lambda: "standing_by" in [e.get("event") for e in events("second")],
            timeout=30,
            what="the follower has read the lease",
        )
        applied = appwrapper("before", job("before", 1, {"cpu": "1"}))
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(applied))
        wait_until(
            lambda: _has_status(cluster, namespace, "before"),
            timeout=30,
            what="the leader writes status",
        )
        fault_on()
        began = time.monotonic()
        try:
            # Renew deadline 10 s: the leader stops (exit 1) before the 15 s lease is over.
            assert first.wait(timeout=25) == 1
            stopped_after = time.monotonic() - began
            time.sleep(max(0.0, 20 - (time.monotonic() - began)))  # longer than the lease
        finally:
            fault_off()
        assert stopped_after < 15, stopped_after
        if fault == "429-storm":
            assert proxy.refused > 0
        wait_until(
            lambda: _holder(cluster, namespace).endswith(f"-{second.pid}"),
            timeout=40,
            what="the follower takes over",
        )
        applied = appwrapper("after", job("after", 1, {"cpu": "1"}))
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(applied))
        wait_until(
            lambda: _has_status(cluster, namespace, "after"),
            timeout=30,
            what="the new leader writes status",
        )
        assert second.poll() is None
        # The old leader's last words: the lease lost (the fence), nothing after it.
        told = [e.get("event") for e in events("first")]
        assert "leader_lost" in told, told[-10:]
        after_loss = told[told.index("leader_lost") + 1 :]
        assert not {"dispatched", "preempted", "requeued"} & set(after_loss), after_loss
        # And from the API server's side (its audit log; each replica's identity is in its
        # User-Agent): every write it accepted from the old leader ended before the first
        # one it accepted from the new leader began.
        old, new = (_accepted_writes(cluster, p.pid) for p in (first, second))
        assert old, "no write of the first replica was audited"
        assert new, "no write of the second replica was audited"
        assert max(end for _, end in old) < min(start for start, _ in new), (old[-3:], new[:3])
    finally:
        # While a replica still leads: it removes the finalizers.
        cluster.kubectl(
            "delete",
            "appwrappers",
            "--all",
            "-n",
            namespace,
            "--timeout=60s",
            check=False,
            timeout=90,
        )
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
        proxy.stop()
