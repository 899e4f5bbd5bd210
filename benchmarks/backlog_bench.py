"""A large backlog on the local control plane: memory, start, writes at rest and per change.

    python -m benchmarks.backlog_bench [--count 30000] [--window 30] [--workers N]
        [--out FILE.json]

`--count` AppWrappers, each a Deployment of one 2-CPU pod, are created while no dispatcher
runs, on one 4-CPU KWOK node: two fit, the rest wait. Then the dispatcher starts as its own
process, and the benchmark records:

1. how long until it is ready (caches synced) and its RSS then;
2. how long until every AppWrapper has been decided once (`Queueing` True), the rate, its
   RSS and CPU then, and its requests so far by verb, resource and HTTP code;
3. the requests it makes over `--window` seconds at rest (nothing changes);
4. the requests one change costs: an AppWrapper running now deleted (not one requeued
   since), so the next in line is dispatched, counted until the counts stop moving.

`--until ready` stops after step 1 (the memory a backlog of `--count` costs once read).

Requests come from the dispatcher's `/metrics` (`appwrapper_dispatcher_api_requests`), the
member liveness probe left out. Figures print and go to JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.e2e_bench import (
    APPWRAPPERS,
    Watcher,
    _without_probes,
    create_all,
    proc_stats,
    scrape,
    settled_counts,
    start_dispatcher,
    wait_ready,
)
from benchmarks.report import save
from dispatcher.kube.client import KubeClient
from testenv.localcluster import REPO_ROOT, LocalCluster, ensure_binaries, free_port
from testenv.manifests import appwrapper, deployment

NAMESPACE = "backlog"


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    after, before = _without_probes(after), _without_probes(before)
    return {
        key: after.get(key, 0) - before.get(key, 0)
        for key in sorted(set(after) | set(before))
        if after.get(key, 0) != before.get(key, 0)
    }


def _names(count: int) -> list[str]:
    return [f"bl-{index:06d}" for index in range(count)]


async def _create_backlog(client: KubeClient, count: int) -> float:
    jobs = [
        (
            APPWRAPPERS,
            NAMESPACE,
            appwrapper(name, deployment(name, 1, {"cpu": "2", "memory": "64Mi"})),
        )
        for name in _names(count)
    ]
    started = time.monotonic()
    await create_all(client, jobs, concurrency=64)
    return time.monotonic() - started


async def _measure(
    client: KubeClient, cluster: LocalCluster, workdir: Path, args: Any
) -> dict[str, Any]:
    result: dict[str, Any] = {"count": args.count}
    result["seconds_creating"] = await _create_backlog(client, args.count)
    print(f"created {args.count} AppWrappers in {result['seconds_creating']:.0f}s", flush=True)
    port = free_port()
    started = time.monotonic()
    settings: dict[str, Any] = {"workers": args.workers} if args.workers else {}
    if args.starvation_after is not None:
        settings["starvation_after_seconds"] = args.starvation_after
    if args.log_level:
        settings["log_level"] = args.log_level  # into --workdir's dispatcher.log
    result["settings"] = settings
    process = start_dispatcher(cluster, workdir, {}, port, settings=settings)
    try:
        wait_ready(port, timeout=1800)
        result["seconds_to_ready"] = time.monotonic() - started
        result["rss_mb_at_ready"] = proc_stats(process.pid)["rss_mb"]
        print(
            f"ready after {result['seconds_to_ready']:.1f}s, "
            f"RSS {result['rss_mb_at_ready']:.0f} MB",
            flush=True,
        )
        if args.until == "ready":
            return result
        watcher = Watcher(client)
        holding: set[str] = set()  # running now (a requeued one holds nothing to free)

        def follow(kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
            if new is None:
                return
            conditions = (new.get("status") or {}).get("conditions") or []
            now = {c.get("type") for c in conditions if c.get("status") == "True"}
            name = new["metadata"]["name"]
            if {"Dispatched", "Running"} <= now:
                holding.add(name)
            else:
                holding.discard(name)

        watcher.informer.add_handler(follow)
        watch = asyncio.create_task(watcher.informer.run())
        names = set(_names(args.count))
        await watcher.wait("Queueing", names, timeout=args.timeout)
        stats = proc_stats(process.pid)
        result["seconds_to_all_decided"] = time.monotonic() - started
        result["decided_per_second"] = args.count / result["seconds_to_all_decided"]
        result["rss_mb_after_init"] = stats["rss_mb"]
        result["peak_rss_mb"] = stats["peak_rss_mb"]
        result["cpu_seconds_to_all_decided"] = stats["cpu_seconds"]
        # What deciding them all cost, by HTTP code too: refused or unanswered writes retried.
        result["requests_to_all_decided"] = scrape(port, codes=True)
        print(
            f"all decided after {result['seconds_to_all_decided']:.0f}s "
            f"({result['decided_per_second']:.0f}/s), RSS {stats['rss_mb']:.0f} MB "
            f"(peak {stats['peak_rss_mb']:.0f}), CPU {stats['cpu_seconds']:.0f}s",
            flush=True,
        )
        settled = await settled_counts(port, quiet=5.0, timeout=1800)
        result["seconds_to_settled"] = time.monotonic() - started
        cpu_at_rest = proc_stats(process.pid)["cpu_seconds"]
        await asyncio.sleep(args.window)  # a deliberate window: nothing is expected to happen
        result["at_rest"] = {
            "window_seconds": args.window,
            "requests": _delta(scrape(port), settled),
            "cpu_seconds": proc_stats(process.pid)["cpu_seconds"] - cpu_at_rest,
        }
        print(f"at rest over {args.window}s: {result['at_rest']}", flush=True)
        running = sorted(holding) or sorted(
            n for n in names if "Dispatched" in watcher.first.get(n, {})
        )
        before = scrape(port)
        await client.delete(APPWRAPPERS, NAMESPACE, running[0])
        after = await settled_counts(port, quiet=5.0, timeout=300)
        result["one_change"] = {"deleted": running[0], "requests": _delta(after, before)}
        print(f"one running AppWrapper deleted: {result['one_change']}", flush=True)
        result["rss_mb_end"] = proc_stats(process.pid)["rss_mb"]
        watch.cancel()
    finally:
        process.terminate()
        process.wait(60)
    return result


async def run(args: Any, workdir: Path) -> dict[str, Any]:
    cluster = LocalCluster.start("backlog", workdir, binaries=ensure_binaries())
    try:
        cluster.add_node("bl-node", cpu="4", memory="64Gi", pods=110)
        cluster.wait_nodes_ready(["bl-node"], timeout=120)
        cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "appwrapper.yaml"))
        cluster.kubectl("create", "namespace", NAMESPACE)
        client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), pool_size=64)
        try:
            await asyncio.sleep(2)  # let the CRD's discovery settle before timing anything
            return await _measure(client, cluster, workdir, args)
        finally:
            await client.close()
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=30000)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=7200.0)
    parser.add_argument("--workers", type=int, help="the dispatcher's reconcile workers")
    parser.add_argument("--until", choices=["ready", "all"], default="all")
    parser.add_argument(
        "--starvation-after",
        type=float,
        help="the dispatcher's starvation limit (seconds): a backlog older than it, sooner",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/backlog.json"))
    parser.add_argument("--workdir", type=Path, help="keep the cluster's and dispatcher's logs")
    parser.add_argument("--log-level", choices=["debug", "info"], help="the dispatcher's log")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        workdir = report.workdir(stack, args.workdir, "aw-backlog-")
        result = asyncio.run(run(args, workdir))
    save(result, args.out)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
