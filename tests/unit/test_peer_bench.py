"""The peer benchmark's pure parts: workloads per system, queue objects, figures, table."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks import peer_bench, peers
from benchmarks.peer_bench import System


def test_parse_systems() -> None:
    assert peer_bench.parse_systems("ours, mcad,kueue,kueue:200") == [
        System("ours"),
        System("mcad"),
        System("kueue"),
        System("kueue", 200),
    ]
    assert System("kueue", 200).label == "kueue:200"
    assert System("kueue").client_qps == "50/100"
    assert System("kueue", 200).client_qps == "200/400"
    for bad in ("slurm", "ours:200"):
        with pytest.raises(ValueError, match="unknown system"):
            peer_bench.parse_systems(bad)


def test_nodes_hold_every_pod() -> None:
    assert peer_bench.node_count(10) == 2
    for count in (200, 1000, 1001):
        assert peer_bench.node_count(count) * peer_bench.NODE["pods"] > count


def test_workloads_are_native_to_each_system() -> None:
    (info, namespace, body), *_ = peer_bench.workloads(System("kueue"), 3)
    assert (info.kind, namespace) == ("Job", peer_bench.NAMESPACE)
    assert body["spec"]["suspend"] is True
    assert body["metadata"]["labels"] == {peer_bench.KUEUE_QUEUE_LABEL: peer_bench.QUEUE}
    for kind in ("ours", "mcad"):
        items = peer_bench.workloads(System(kind), 3)
        assert [b["metadata"]["name"] for _, _, b in items] == ["job-0", "job-1", "job-2"]
        wrapped = items[0][2]["spec"]["resources"]["GenericItems"][0]["generictemplate"]
        assert wrapped["kind"] == "Job"
        assert "suspend" not in wrapped["spec"]


def test_kueue_quota_covers_the_cluster() -> None:
    flavor, cluster_queue, local_queue = peer_bench.kueue_objects(3)
    assert flavor["kind"] == "ResourceFlavor"
    assert cluster_queue["spec"]["namespaceSelector"] == {}
    (group,) = cluster_queue["spec"]["resourceGroups"]
    quotas = {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}
    assert quotas == {"cpu": "96", "memory": "384Gi", "pods": "330"}
    assert group["coveredResources"] == ["cpu", "memory", "pods"]
    assert local_queue["metadata"]["namespace"] == peer_bench.NAMESPACE
    assert local_queue["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]


def test_admission_predicates() -> None:
    condition = {"type": "Dispatched", "status": "True"}
    assert peer_bench.dispatched({"status": {"conditions": [condition]}})
    assert not peer_bench.dispatched({"status": {"conditions": [{**condition, "status": "False"}]}})
    assert not peer_bench.dispatched({})
    assert peer_bench.unsuspended({"spec": {"suspend": False}})
    assert not peer_bench.unsuspended({"spec": {"suspend": True}})
    assert not peer_bench.unsuspended({"spec": {}})


def test_summarize_all_and_capped() -> None:
    created = {"a": 100.0, "b": 100.5}
    whole = peer_bench.summarize(2, created, {"a": 110.0, "b": 112.0}, 108.0, 60)
    assert whole["all_admitted"] is True
    assert whole["seconds_to_all_admitted"] == 4.0
    assert whole["seconds_to_first_admitted"] == 2.0
    assert whole["admitted_per_second"] == 0.5
    assert whole["create_to_admitted_seconds"]["max"] == 11.5
    capped = peer_bench.summarize(2, created, {"a": 110.0}, 108.0, 60)
    assert capped["seconds_to_all_admitted"] is None
    assert capped["admitted_per_second"] == round(1 / 60, 3)
    none = peer_bench.summarize(2, created, {}, 108.0, 60)
    assert none["admitted"] == 0
    assert "create_to_admitted_seconds" not in none


def test_table_shows_capped_and_failed_runs() -> None:
    run = peer_bench.summarize(2, {"a": 0.0}, {"a": 5.0}, 1.0, 60)
    run.update(
        system="mcad",
        version="v1.40.0",
        client_qps_burst="100/200",
        count=2,
        controller_cpu_seconds=1.0,
        controller_peak_rss_mb=50.0,
        apiserver_cpu_seconds=2.0,
    )
    text = peer_bench.table([run, {"system": "kueue", "error": "boom"}])
    assert "| mcad | v1.40.0 | 100/200 | 1/2 | > 60 (cap) |" in text
    assert "error: boom" in text


def test_crd_storage_version_is_switched(tmp_path: Path) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.com"},
        "spec": {
            "versions": [
                {"name": "v1beta1", "storage": True, "served": True},
                {"name": "v1beta2", "storage": False, "served": True},
            ]
        },
    }
    (tmp_path / "things.yaml").write_text(yaml.safe_dump(crd))
    peer = peers.Peer("kueue", "v0", tmp_path, tmp_path / "bin", tmp_path)
    (doc,) = peers.crd_documents(peer, storage="v1beta2")
    assert [v["storage"] for v in doc["spec"]["versions"]] == [False, True]
    (kept,) = peers.crd_documents(peer)
    assert [v["storage"] for v in kept["spec"]["versions"]] == [True, False]


def test_kueue_configuration_has_no_cluster_dependencies(tmp_path: Path) -> None:
    config = peers.kueue_configuration(9443, tmp_path, 8081, qps=50, burst=100, frameworks=["x"])
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"]["host"] == "127.0.0.1"
    assert config["metrics"] == {"bindAddress": "0"}
    assert config["clientConnection"] == {"qps": 50, "burst": 100}
