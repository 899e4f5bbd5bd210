"""Start-up time and memory of the local control plane.

    python -m benchmarks.controlplane_bench [--out benchmarks/results/controlplane.json]

Measures a warm start (binaries built) of one cluster and of three side by side, the time for
a fake node to become Ready, and the resident memory of each component.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from testenv.localcluster import LocalCluster, ensure_binaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/controlplane.json"))
    args = parser.parse_args()
    started = time.monotonic()
    binaries = ensure_binaries()
    result: dict[str, object] = {"ensure_binaries_seconds": time.monotonic() - started}
    with tempfile.TemporaryDirectory(prefix="aw-cp-") as tmp:
        started = time.monotonic()
        one = LocalCluster.start("one", Path(tmp), binaries=binaries)
        result["one_cluster_start_seconds"] = time.monotonic() - started
        started = time.monotonic()
        one.add_node("n1", cpu="8", memory="32Gi", gpu=4)
        one.wait_nodes_ready(["n1"])
        result["node_ready_seconds"] = time.monotonic() - started
        memory = one.rss_bytes()
        result["one_cluster_rss_mb"] = {k: round(v / 2**20) for k, v in memory.items()}
        result["one_cluster_rss_mb_total"] = round(sum(memory.values()) / 2**20)
        one.stop()
        started = time.monotonic()
        three = [LocalCluster.start(f"c{i}", Path(tmp), binaries=binaries) for i in range(3)]
        result["three_clusters_start_seconds"] = time.monotonic() - started
        for cluster in three:
            cluster.stop()
        started = time.monotonic()
        with_ray = LocalCluster.start("ray", Path(tmp), binaries=binaries, kuberay=True)
        result["one_cluster_with_kuberay_start_seconds"] = time.monotonic() - started
        with_ray.stop()
    for key, value in result.items():
        print(f"{key}: {value if not isinstance(value, float) else round(value, 2)}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
