"""The local control plane is real: scheduler, controller-manager, KWOK and KubeRay all act."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from testenv.localcluster import LocalCluster, ensure_binaries
from testenv.manifests import deployment as build_deployment
from testenv.waits import wait_until

pytestmark = pytest.mark.cluster


def pods(cluster: Any, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", "pods", "-n", namespace, "-o", "json"]
    if selector:
        args += ["-l", selector]
    return list(json.loads(cluster.kubectl(*args).stdout)["items"])


def phases(cluster: Any, namespace: str, selector: str = "") -> list[str]:
    return sorted(p.get("status", {}).get("phase", "") for p in pods(cluster, namespace, selector))


def deployment(name: str, replicas: int, cpu: str = "100m") -> dict[str, Any]:
    return build_deployment(name, replicas, {"cpu": cpu})


def test_deployment_pods_reach_running_on_fake_nodes(cluster, namespace, fake_nodes) -> None:
    node = fake_nodes.add("n1", cpu="4", memory="8Gi")
    manifest = deployment("web", 3)
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))

    wait_until(
        lambda: phases(cluster, namespace, "app=web") == ["Running"] * 3,
        timeout=60,
        what="3 web pods Running",
    )
    assert {p["spec"]["nodeName"] for p in pods(cluster, namespace, "app=web")} == {node}


def test_scheduler_leaves_pods_pending_when_they_do_not_fit(cluster, namespace, fake_nodes) -> None:
    node = fake_nodes.add("small", cpu="1", memory="1Gi")
    manifest = deployment("big", 2, cpu="800m")
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))

    wait_until(
        lambda: phases(cluster, namespace, "app=big") == ["Pending", "Running"],
        timeout=60,
        what="one pod Running, one Pending (only 1 CPU)",
    )


def test_job_completes(cluster, namespace, fake_nodes) -> None:
    fake_nodes.add("n1")
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "once"},
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}],
                }
            },
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(job))
    cluster.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=condition=Complete",
        "job/once",
        "--timeout=90s",
        timeout=100,
    )


@pytest.mark.kuberay
def test_raycluster_makes_head_and_worker_pods(cluster, namespace, fake_nodes) -> None:
    fake_nodes.add("n1", cpu="16", memory="64Gi", gpu=4)

    def group(replicas: int | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "rayStartParams": {},
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "ray",
                            "image": "rayproject/ray:2.9.0",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                        }
                    ]
                }
            },
        }
        if replicas is not None:
            spec |= {
                "groupName": "workers",
                "replicas": replicas,
                "minReplicas": replicas,
                "maxReplicas": replicas,
            }
        return spec

    ray = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "demo"},
        "spec": {"headGroupSpec": group(), "workerGroupSpecs": [group(2)]},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(ray))

    def running_by_type() -> dict[str, int] | None:
        counts: dict[str, int] = {}
        for pod in pods(cluster, namespace, "ray.io/cluster=demo"):
            if pod.get("status", {}).get("phase") == "Running":
                kind = pod["metadata"]["labels"].get("ray.io/node-type", "?")
                counts[kind] = counts.get(kind, 0) + 1
        return counts if counts == {"head": 1, "worker": 2} else None

    wait_until(running_by_type, timeout=120, what="Ray head and 2 workers Running")


def test_deleting_owner_collects_dependents(cluster, namespace, fake_nodes) -> None:
    fake_nodes.add("n1")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(deployment("gc", 2)))
    wait_until(lambda: len(pods(cluster, namespace, "app=gc")) == 2, timeout=60, what="2 pods")

    cluster.kubectl("delete", "-n", namespace, "deployment/gc", "--wait=false")

    wait_until(
        lambda: (
            not pods(cluster, namespace, "app=gc")
            and "replicaset"
            not in cluster.kubectl("get", "rs", "-n", namespace, "-o", "name").stdout
        ),
        timeout=60,
        what="ReplicaSet and pods garbage-collected",
    )


def test_kubectl_get_apply_describe(cluster, namespace) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm"},
        "data": {"k": "v"},
    }
    applied = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(config_map))
    assert "configmap/cm created" in applied.stdout
    got = json.loads(
        cluster.kubectl("get", "-n", namespace, "configmap", "cm", "-o", "json").stdout
    )
    assert got["data"] == {"k": "v"}
    described = cluster.kubectl("describe", "-n", namespace, "configmap", "cm").stdout
    assert "Name:" in described
    assert "cm" in described
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["major"] == "1"
    assert version["serverVersion"]["gitVersion"].startswith("v1.")


START_ROUNDS = int(os.environ.get("APPWRAPPER_START_ROUNDS", "1"))
"""Rounds of three control planes started at once; raise it to hunt port races."""


def test_clusters_started_at_once_get_their_own_ports_and_state(cluster_workdir: Path) -> None:
    """Three control planes start at the same moment, round after round: none loses a port
    to another (testing.ports), and each keeps its own state."""
    binaries = ensure_binaries()
    names = ("east", "west", "north")
    for round_ in range(START_ROUNDS):
        with ThreadPoolExecutor(len(names)) as pool:
            futures = [
                pool.submit(
                    LocalCluster.start, name, cluster_workdir / f"round-{round_}", binaries=binaries
                )
                for name in names
            ]
        started = [f.result() for f in futures if f.exception() is None]
        try:
            assert [repr(f.exception()) for f in futures if f.exception() is not None] == []
            east, west, north = started
            east.kubectl("create", "namespace", "only-east")
            assert east.kubectl("get", "namespace", "only-east", check=False).returncode == 0
            assert west.kubectl("get", "namespace", "only-east", check=False).returncode != 0
            assert north.kubectl("get", "namespace", "only-east", check=False).returncode != 0
            assert len({c.server for c in started}) == 3
        finally:
            for cluster in started:
                cluster.stop()
        processes = [p for c in started for p in c.processes.values()]
        assert all(p.poll() is not None for p in processes)
