"""How close the start estimates come: predicted against actual start over a contention run
on the local control plane.

Run from the repository root:

    python -m benchmarks.eta_bench [--count 16] [--slots 2] [--out benchmarks/results/eta.json]

A node with room for `--slots` AppWrappers at a time; `--count` AppWrappers (one Job pod of
1 cpu each) submitted at once, in a seeded order. Each pod runs for a time drawn from
{10, 15, 20, 25} s (KWOK's fast pod-complete stage, delayed by the pod's annotation as in
the peer benchmark), and
half of them declare a `dispatchDuration.limit` 20 s above their run time (users set limits
above the usual run). The dispatcher runs in this process; every second the benchmark reads
its pending view (the same values the visibility API serves). For each AppWrapper, the
error is |predicted start - actual start| (actual: its `Dispatched` condition), for the
first estimate it had with a known time, and for the last one before it started. The
median and p90 of both are reported, with how many never had a known estimate. Side
effects: starts and stops a control plane in a temporary directory; writes the JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.peer_systems import HOLD_ANNOTATION, kwok_stages
from dispatcher.app import running
from dispatcher.config import Config, MemberConfig
from testenv.localcluster import REPO_ROOT, LocalCluster, ensure_binaries
from testenv.manifests import appwrapper, job

NAMESPACE = "eta"


def percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 1)


def summary(errors: list[float]) -> dict[str, Any]:
    return {
        "count": len(errors),
        "median_s": round(statistics.median(errors), 1) if errors else None,
        "p90_s": percentile(errors, 0.9),
    }


async def contention(cluster: LocalCluster, count: int, slots: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    cluster.add_node("eta-0", cpu=str(slots), memory="64Gi", labels={"bench/pool": "eta"})
    cluster.wait_nodes_ready(["eta-0"], timeout=120)
    config = Config(
        kubeconfig=str(cluster.kubeconfig),
        members=[MemberConfig(name="local", node_selector={"bench/pool": "eta"})],
        health_port=0,
        unattributed="allow",
        log_level="warning",
    )
    runs: dict[str, dict[str, Any]] = {}
    async with running(config) as dispatcher:
        for index in range(count):
            name = f"job-{index:02d}"
            seconds = rng.choice([10, 15, 20, 25])
            body = job(name, 1, {"cpu": "1"})
            body["spec"]["template"]["metadata"] = {"annotations": {HOLD_ANNOTATION: f"{seconds}s"}}
            scheduling = {}
            limited = index % 2 == 0
            if limited:
                scheduling["dispatchDuration"] = {"limit": seconds + 20}
            aw = appwrapper(name, body, scheduling=scheduling or None, completion="Complete")
            await cluster.akubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(aw))
            runs[f"{NAMESPACE}/{name}"] = {"runs_s": seconds, "limit": limited, "estimates": []}
        deadline = time.monotonic() + count * 30 / slots + 120
        started: dict[str, float] = {}
        while len(started) < count and time.monotonic() < deadline:
            await asyncio.sleep(1)
            view = dispatcher.visibility.view()
            now = time.time()
            for key, item in view.by_key.items():
                if key in runs and item.eta.at is not None:
                    runs[key]["estimates"].append((now, item.eta.at))
            out = await cluster.akubectl("get", "appwrappers", "-n", NAMESPACE, "-o", "json")
            for aw in json.loads(out.stdout)["items"]:
                key = f"{NAMESPACE}/{aw['metadata']['name']}"
                for condition in (aw.get("status") or {}).get("conditions") or []:
                    dispatched = condition["type"] == "Dispatched" and condition["status"] == "True"
                    if dispatched and key not in started:
                        started[key] = _epoch(condition["lastTransitionMicroTime"])
    first: list[float] = []
    last: list[float] = []
    unknown = 0
    for key, run in runs.items():
        actual = started.get(key)
        estimates = [(at, eta) for at, eta in run["estimates"] if actual is None or at < actual]
        if actual is None:
            continue
        if not estimates:
            unknown += 1
            continue
        first.append(abs(estimates[0][1] - actual))
        last.append(abs(estimates[-1][1] - actual))
    return {
        "count": count,
        "slots": slots,
        "started": len(started),
        "never_known": unknown,
        "first_estimate_error": summary(first),
        "last_estimate_error": summary(last),
    }


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.eta_bench", description=__doc__)
    parser.add_argument("--count", type=int, default=16)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default="benchmarks/results/eta.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aw-eta-") as workdir:
        binaries = ensure_binaries()
        cluster = LocalCluster.start(
            "eta",
            Path(workdir),
            binaries=binaries,
            kwok_stages=kwok_stages(binaries, Path(workdir)),
        )
        try:
            cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "appwrapper.yaml"))
            cluster.kubectl("create", "namespace", NAMESPACE)
            time.sleep(2)  # the CRD's discovery settles
            result = asyncio.run(contention(cluster, args.count, args.slots, args.seed))
        finally:
            cluster.stop()
    result["machine"] = {"cpu_count": os.cpu_count(), "load_average": list(os.getloadavg())}
    print(json.dumps(result, indent=2))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
