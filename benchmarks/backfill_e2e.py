"""Hero gangs among small jobs on the local control plane: StrictFIFO, BestEffortFIFO and
reservation with backfill side by side, the dispatcher acting on real objects.

Run from the repository root:

    python -m benchmarks.backfill_e2e [--seed 40] [--out benchmarks/results/backfill-e2e.json]

The shorter companion of benchmarks/backfill_bench.py (pure core, simulated time): 4 KWOK
nodes x 8 GPUs, a seeded stream over about two minutes. Four 8-GPU jobs fill the nodes at
the start (runs of 30-60 s); then a gang of 4 pods x 8 GPUs (the whole cluster) arrives at
5 s and another at 80 s, among small one-pod jobs of 2, 4 or 8 GPUs arriving every 4 s on
average (runs of 8-25 s; three in four declare a `dispatchDuration.limit` of their run
plus 20-50%, the others none). Each pod runs for its time (KWOK's pod-complete stage, delayed
by the pod's annotation) and each AppWrapper completes with its Job. The same stream runs
once per mode, each in its own namespace with its own dispatcher (in this process) on one
control plane: StrictFIFO, BestEffortFIFO and BestEffortFIFO with backfill `Declared`, the
starvation guard at 30 s in all three (the stream is a tenth of the pure benchmark's time
scale). Figures per mode, from the AppWrappers' conditions: each gang's wait
(Dispatched - applied), the small jobs' wait (mean, p90), GPU utilisation (GPU-seconds
between Dispatched and Completed over those available from the first apply to the last
completion), and each gang's start estimate as the pending list gave it first (read every
second) against its dispatch. Side effects: starts and stops a control plane in a temporary
directory; writes the JSON file.
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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.backfill_bench import MODES, Mode
from benchmarks.peer_systems import HOLD_ANNOTATION, kwok_stages
from dispatcher.app import running
from dispatcher.config import Config, MemberConfig
from testenv.localcluster import REPO_ROOT, LocalCluster, ensure_binaries
from testenv.manifests import appwrapper, job

NODES, GPUS = 4, 8
POOL = {"bench/pool": "backfill"}
GUARD_SECONDS = 30.0
STREAM_SECONDS = 120.0
GANG_ARRIVALS = (5.0, 80.0)
GANG_RUN, GANG_LIMIT = 30, 45


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    arrival: float  # seconds after the stream starts
    pods: int
    gpus: int  # per pod
    runs: int  # seconds each pod runs
    limit: int | None

    @property
    def gang(self) -> bool:
        return self.pods > 1


def stream(seed: int) -> list[Job]:
    """The seeded stream of the module docstring, in arrival order."""
    rng = random.Random(seed)
    jobs = [Job(f"fill-{i}", 0.0, 1, GPUS, 30 + 10 * i, 40 + 10 * i) for i in range(NODES)]
    jobs += [
        Job(f"gang-{i}", at, NODES, GPUS, GANG_RUN, GANG_LIMIT)
        for i, at in enumerate(GANG_ARRIVALS)
    ]
    at, index = 2.0, 0
    while at < STREAM_SECONDS:
        runs = rng.randint(8, 25)
        limit = None if rng.random() < 0.25 else round(runs * rng.uniform(1.2, 1.5)) + 1
        jobs.append(Job(f"small-{index:02d}", round(at, 1), 1, rng.choice((2, 4, 8)), runs, limit))
        at += rng.expovariate(1 / 4.0)
        index += 1
    return sorted(jobs, key=lambda j: (j.arrival, j.name))


def manifest(item: Job) -> dict[str, Any]:
    body = job(item.name, item.pods, {"cpu": "1", "nvidia.com/gpu": str(item.gpus)})
    body["spec"]["template"]["metadata"] = {"annotations": {HOLD_ANNOTATION: f"{item.runs}s"}}
    scheduling = {"dispatchDuration": {"limit": item.limit}} if item.limit is not None else None
    return appwrapper(item.name, body, scheduling=scheduling, completion="Complete")


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _times(aw: dict[str, Any]) -> dict[str, float]:
    """When each condition type turned True (its last transition)."""
    found: dict[str, float] = {}
    for condition in (aw.get("status") or {}).get("conditions") or []:
        if condition["status"] == "True" and condition.get("lastTransitionMicroTime"):
            found[condition["type"]] = _epoch(condition["lastTransitionMicroTime"])
    return found


async def run_mode(cluster: LocalCluster, mode: Mode, jobs: Sequence[Job]) -> dict[str, Any]:
    """The stream through one dispatcher in `mode`, in a namespace of its own."""
    namespace = f"backfill-{MODES.index(mode)}"
    await cluster.akubectl("create", "namespace", namespace)
    config = Config(
        kubeconfig=str(cluster.kubeconfig),
        members=[MemberConfig(name="local", node_selector=POOL)],
        health_port=0,
        unattributed="allow",
        log_level="warning",
        queue_mode=mode.queueing,
        backfill=mode.backfill,
        starvation_after_seconds=GUARD_SECONDS,
    )
    applied: dict[str, float] = {}
    first_eta: dict[str, float] = {}
    done: dict[str, dict[str, float]] = {}
    async with running(config) as dispatcher:
        began = time.time()
        pending = list(jobs)
        deadline = began + STREAM_SECONDS + 600
        while len(done) < len(jobs) and time.time() < deadline:
            now = time.time()
            while pending and began + pending[0].arrival <= now:
                item = pending.pop(0)
                body = json.dumps(manifest(item))
                await cluster.akubectl("apply", "-n", namespace, "-f", "-", input=body)
                applied[item.name] = time.time()
            for key, listed in dispatcher.visibility.view().by_key.items():
                name = key.partition("/")[2]
                if key.startswith(f"{namespace}/") and listed.eta.at is not None:
                    first_eta.setdefault(name, listed.eta.at)
            out = await cluster.akubectl("get", "appwrappers", "-n", namespace, "-o", "json")
            for aw in json.loads(out.stdout)["items"]:
                times = _times(aw)
                if "Completed" in times or "Failed" in times:
                    done[aw["metadata"]["name"]] = times
            await asyncio.sleep(1.0)
    return figures(jobs, applied, done, first_eta)


def figures(
    jobs: Sequence[Job],
    applied: dict[str, float],
    done: dict[str, dict[str, float]],
    first_eta: dict[str, float],
) -> dict[str, Any]:
    waits: dict[str, float] = {}
    used = 0.0
    failed = []
    for item in jobs:
        times = done.get(item.name)
        if times is None or "Dispatched" not in times:
            continue
        waits[item.name] = times["Dispatched"] - applied[item.name]
        end = times.get("Completed", times.get("Failed", times["Dispatched"]))
        used += (end - times["Dispatched"]) * item.pods * item.gpus
        if "Failed" in times:
            failed.append(item.name)
    start = min(applied.values())
    last = max(t.get("Completed", t.get("Failed", 0.0)) for t in done.values())
    small = [w for n, w in waits.items() if not n.startswith("gang-")]
    gangs = {n: round(w, 1) for n, w in waits.items() if n.startswith("gang-")}
    errors = {
        name: round(first_eta[name] - (applied[name] + waits[name]), 1)
        for name in gangs
        if name in first_eta
    }
    ordered = sorted(small)
    return {
        "gang_wait_s": gangs,
        "gang_first_estimate_error_s": errors,
        "small_wait_mean_s": round(statistics.fmean(small), 1) if small else None,
        "small_wait_p90_s": round(ordered[int(0.9 * (len(ordered) - 1))], 1) if small else None,
        "utilisation": round(used / ((last - start) * NODES * GPUS), 4),
        "finished": len(done),
        "of": len(jobs),
        "failed": failed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backfill_e2e", description=__doc__)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--out", default="benchmarks/results/backfill-e2e.json")
    args = parser.parse_args(argv)
    jobs = stream(args.seed)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="aw-backfill-") as workdir:
        binaries = ensure_binaries()
        cluster = LocalCluster.start(
            "backfill",
            Path(workdir),
            binaries=binaries,
            kwok_stages=kwok_stages(binaries, Path(workdir)),
        )
        try:
            cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "appwrapper.yaml"))
            names = [f"backfill-{i}" for i in range(NODES)]
            for name in names:
                cluster.add_node(name, cpu="16", memory="64Gi", gpu=GPUS, labels=POOL)
            cluster.wait_nodes_ready(names, timeout=120)
            time.sleep(2)  # the CRD's discovery settles
            for mode in MODES:
                results[mode.name] = asyncio.run(run_mode(cluster, mode, jobs))
                print(f"{mode.name}: {json.dumps(results[mode.name])}", flush=True)
        finally:
            cluster.stop()
    report = {
        "stream": {
            "jobs": len(jobs),
            "gangs": sum(j.gang for j in jobs),
            "without_limit": sum(j.limit is None for j in jobs),
            "seed": args.seed,
        },
        "modes": results,
        "machine": {"cpu_count": os.cpu_count(), "load_average": list(os.getloadavg())},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
