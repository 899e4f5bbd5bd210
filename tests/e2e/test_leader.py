"""Leader election: of two dispatcher processes only one dispatches; the other takes over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from dispatcher.testing.waits import wait_until

pytestmark = [pytest.mark.cluster]


def _holder(cluster, namespace: str) -> str:
    out = cluster.kubectl(
        "get", "lease", "appwrapper-dispatcher", "-n", namespace, "-o", "json", check=False
    )
    if out.returncode != 0:
        return ""
    return str(json.loads(out.stdout)["spec"].get("holderIdentity") or "")


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
