"""End-to-end dispatch benchmark on the local control plane (KWOK nodes, no kubelet).

    python -m benchmarks.e2e_bench [--count 1000] [--churn 0] [--queued 0] [--out FILE.json]

1. Raw limit: a plain client creates N Deployments (1 small pod) + N Services directly, with
   the dispatcher's dispatch concurrency.
2. Burst: N AppWrappers, each that Deployment plus a Service, capacity for all, against the
   dispatcher running as its own process. Measures time to all Dispatched / Running,
   create->Dispatched latency percentiles, requests per dispatch (from its /metrics),
   dispatcher CPU and peak RSS.
3. Churn (--churn M): M AppWrappers wrapping one-pod Jobs (KWOK completes them) against
   capacity for about a tenth of them at a time; the queue drains as Jobs complete. Checks
   from the API server that no pod of ours was ever unschedulable (the dispatcher never
   dispatched more than fits).

4. Through a queue (--queued PAIRS): the burst again, on capacity alone and with every
   AppWrapper through an AppQueue (a ClusterAppQueue with quota for all), alternated
   A B A B, each from a fresh namespace on the same node pool; ratios min/median/max.

The phases run in one cluster, one after the other, on separate node pools, so their
figures are comparable (same machine state, same API server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from benchmarks import report
from benchmarks.report import save
from dispatcher.api.constants import API_VERSION, KIND, PLURAL
from dispatcher.api.models import parse_time
from dispatcher.config import Config
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import NotFound
from dispatcher.kube.informer import Informer
from testenv.converter import install_appwrapper_crd
from testenv.localcluster import REPO_ROOT, LocalCluster, ensure_binaries, free_port
from testenv.manifests import (
    app_flavor,
    app_queue,
    appwrapper,
    cluster_queue,
    deployment,
    job,
    service,
)

DEPLOYMENTS = ResourceInfo("apps/v1", "Deployment", "deployments", True)
SERVICES = ResourceInfo("v1", "Service", "services", True)
APPWRAPPERS = ResourceInfo(API_VERSION, KIND, PLURAL, True)
PODS = ResourceInfo("v1", "Pod", "pods", True)
NAMESPACES = ResourceInfo("v1", "Namespace", "namespaces", False)
CONCURRENCY = 32  # requests in flight for the benchmark's own creates of AppWrappers


def bench_deployment(name: str, pool: str) -> dict[str, Any]:
    return deployment(name, 1, {"cpu": "100m", "memory": "64Mi"}, nodeSelector={"bench/pool": pool})


def bench_job(name: str) -> dict[str, Any]:
    return job(name, 1, {"cpu": "1", "memory": "64Mi"}, nodeSelector={"bench/pool": "churn"})


async def create_all(
    client: KubeClient,
    jobs: list[tuple[ResourceInfo, str, dict[str, Any]]],
    concurrency: int = CONCURRENCY,
) -> dict[str, float]:
    """Create everything with `concurrency` requests in flight; name -> completion time."""
    done: dict[str, float] = {}
    queue: asyncio.Queue[tuple[ResourceInfo, str, dict[str, Any]]] = asyncio.Queue()
    for item in jobs:
        queue.put_nowait(item)

    async def worker() -> None:
        while not queue.empty():
            info, namespace, body = queue.get_nowait()
            await client.create(info, namespace, body)
            done[f"{info.plural}/{body['metadata']['name']}"] = time.time()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


async def wait_pods_running(
    client: KubeClient, namespace: str, count: int, timeout: float = 600
) -> float:
    """Poll (every second) until `count` pods in `namespace` are Running; when that was."""
    deadline = time.monotonic() + timeout
    while True:
        pods = await client.list(PODS, namespace)
        running = sum(1 for p in pods["items"] if (p.get("status") or {}).get("phase") == "Running")
        if running >= count:
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{running}/{count} pods Running in {namespace}")
        await asyncio.sleep(1)


async def delete_namespace(client: KubeClient, namespace: str, timeout: float = 600) -> float:
    """Delete `namespace` and poll (every second) until it is gone; how long that took."""
    started = time.monotonic()
    await client.delete(NAMESPACES, None, namespace)
    while True:
        try:
            await client.get(NAMESPACES, None, namespace)
        except NotFound:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"namespace {namespace} still there after {timeout:.0f}s")
        await asyncio.sleep(1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "rss_mb": int(fields["VmRSS"].split()[0]) / 1024,
        "peak_rss_mb": int(fields["VmHWM"].split()[0]) / 1024,
        "cpu_seconds": (int(stat[11]) + int(stat[12])) / ticks,
    }


def cluster_cpu(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds used so far by each control-plane process (API server, etcd, ...)."""
    return {
        name: proc_stats(proc.pid)["cpu_seconds"]
        for name, proc in cluster.processes.items()
        if proc.poll() is None
    }


def cpu_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: round(after[k] - before.get(k, 0.0), 2) for k in after}


def fetch(port: int, path: str, timeout: float = 5) -> str:
    """GET one of the dispatcher's plain-HTTP endpoints (`/metrics`, `/debug/memory`)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as answer:
        text: str = answer.read().decode()
    return text


def scrape(port: int, *, codes: bool = False) -> dict[str, float]:
    """The dispatcher's API requests by verb and resource (and HTTP code with `codes`)."""
    text = fetch(port, "/metrics")
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("appwrapper_dispatcher_api_requests_total{"):
            labels, value = line.split("{", 1)[1].split("} ")
            parts = dict(p.split("=") for p in labels.split(","))
            # Summed over the `code` label unless asked: one count per verb and resource.
            key = f"{parts['verb'].strip(chr(34))} {parts['resource'].strip(chr(34))}"
            if codes:
                key += f" {parts['code'].strip(chr(34))}"
            counts[key] = counts.get(key, 0) + float(value)
    return counts


async def settled_counts(port: int, quiet: float = 3.0, timeout: float = 120) -> dict[str, float]:
    """Request counts once they stop moving: Events are posted in the background and trail
    the dispatches, and they count too."""
    deadline = time.monotonic() + timeout
    last = scrape(port)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet)
        now = scrape(port)
        # The member liveness probe (GET /version every 2 s) never stops; everything else does.
        if _without_probes(now) == _without_probes(last):
            break
        last = now
    return last


def _without_probes(counts: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in counts.items() if k != "GET version"}


class Watcher:
    """Records, per AppWrapper, when Dispatched / Running / Completed first turned True."""

    def __init__(self, client: KubeClient) -> None:
        self.informer = Informer(client, APPWRAPPERS)
        self.first: dict[str, dict[str, float]] = {}
        self.changed = asyncio.Event()
        self.informer.add_handler(self._on)

    def _on(self, kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        if new is None:
            return
        name = new["metadata"]["name"]
        seen = self.first.setdefault(name, {})
        for condition in (new.get("status") or {}).get("conditions", []):
            if condition["status"] == "True" and condition["type"] not in seen:
                stamp = condition.get("lastTransitionMicroTime")
                # The dispatcher stamps the decision time; same machine, same clock.
                seen[condition["type"]] = parse_time(stamp).timestamp() if stamp else time.time()
        self.changed.set()

    def count(self, condition: str, names: set[str]) -> int:
        return sum(1 for n in names if condition in self.first.get(n, {}))

    async def wait(self, condition: str, names: set[str], timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while self.count(condition, names) < len(names):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.count(condition, names)}/{len(names)} {condition}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0)
        return time.time()


def start_dispatcher(
    cluster: LocalCluster,
    workdir: Path,
    pools: dict[str, str],
    port: int,
    profile: Path | None = None,
    settings: dict[str, Any] | None = None,
    trace_memory: bool = False,
) -> subprocess.Popen[bytes]:
    config = workdir / "dispatcher.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kubeconfig": str(cluster.kubeconfig),
                "health_port": port,
                "log_level": "warning",
                "members": [{"name": "local", "node_selector": pools}],
                # The benchmark measures dispatch; it applies with no admission webhook.
                "unattributed": "allow",
                "debug_memory": trace_memory,
                **(settings or {}),
            }
        )
    )
    log = (workdir / "dispatcher.log").open("ab")
    # cProfile writes its file when the process exits normally (SIGTERM is a clean stop).
    profiler = ["-m", "cProfile", "-o", str(profile)] if profile else []
    return subprocess.Popen(
        [sys.executable, *profiler, "-m", "dispatcher", "run", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        # /debug/memory then tells where the memory went (the process runs slower).
        env={**os.environ, "PYTHONTRACEMALLOC": "1"} if trace_memory else None,
    )


def wait_ready(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("dispatcher not ready")


def quota_objects(count: int) -> list[dict[str, Any]]:
    """A flavor and a ClusterAppQueue with quota for `count` bench Deployments."""
    amounts = {"cpu": f"{count * 100}m", "memory": f"{count * 64}Mi", "pods": count}
    return [app_flavor("default-flavor"), cluster_queue("bench", {"default-flavor": amounts})]


async def queued_pairs(
    client: KubeClient,
    watcher: Watcher,
    cluster: LocalCluster,
    process: subprocess.Popen[bytes],
    port: int,
    count: int,
    pairs: int,
) -> dict[str, Any]:
    """The burst on capacity alone (A) and through a queue (B), alternated A B A B, each
    from the same state: its namespace made afresh, on the same node pool, and deleted
    (every pod gone) before the next. The queue is a ClusterAppQueue with quota for all."""
    for obj in quota_objects(count):
        cluster.apply(obj)
    rounds = []
    for index in range(pairs):
        figures: dict[str, Any] = {}
        for label, queue in (("unqueued", None), ("queued", "bench")):
            namespace = f"pair-{label}"
            cluster.kubectl("create", "namespace", namespace)
            if queue:
                body = json.dumps(app_queue(queue, "bench"))
                cluster.kubectl("apply", "-n", namespace, "-f", "-", input=body)
                await asyncio.sleep(2)  # the dispatcher's caches see the AppQueue
            figures[label] = await burst_phase(
                client,
                watcher,
                cluster,
                process,
                port,
                count,
                namespace=namespace,
                prefix=f"{label[0]}{index}",
                pool="awq",
                queue=queue,
            )
            figures[label].pop("latencies")
            figures[label]["seconds_to_clean_up"] = await delete_namespace(client, namespace)
        figures["ratio"] = (
            figures["unqueued"]["seconds_to_all_dispatched"]
            / figures["queued"]["seconds_to_all_dispatched"]
        )
        print(f"pair {index + 1}: dispatch rate queued/unqueued {figures['ratio']:.2f}", flush=True)
        rounds.append(figures)
    ratios = sorted(r["ratio"] for r in rounds)
    summary = {"min": ratios[0], "median": statistics.median(ratios), "max": ratios[-1]}
    print(
        "through a queue, dispatch rate queued/unqueued over "
        f"{pairs} pairs: min {summary['min']:.2f}, median {summary['median']:.2f}, "
        f"max {summary['max']:.2f}",
        flush=True,
    )
    return {"pairs": rounds, "ratio_dispatch_rate": summary}


async def burst_phase(
    client: KubeClient,
    watcher: Watcher,
    cluster: LocalCluster,
    process: subprocess.Popen[bytes],
    port: int,
    count: int,
    *,
    namespace: str,
    prefix: str,
    pool: str | None = None,
    queue: str | None = None,
) -> dict[str, Any]:
    """`count` AppWrappers (a Deployment and a Service each) created at full speed in
    `namespace` (on node pool `pool`, by default the namespace's), until all are
    Dispatched and Running."""
    before = scrape(port)
    process_cpu_before = proc_stats(process.pid)["cpu_seconds"]
    plane_before = cluster_cpu(cluster)
    aws = [
        (
            APPWRAPPERS,
            namespace,
            appwrapper(
                f"{prefix}-{i}",
                bench_deployment(f"{prefix}-{i}", pool or namespace),
                service(f"{prefix}-{i}"),
                queue=queue,
            ),
        )
        for i in range(count)
    ]
    started = time.time()
    created = await create_all(client, aws)
    names_set = {f"{prefix}-{i}" for i in range(count)}
    await watcher.wait("Dispatched", names_set, timeout=600)
    all_running = await watcher.wait("Running", names_set, timeout=600)
    plane_after = cluster_cpu(cluster)
    after = await settled_counts(port)
    cpu_after = proc_stats(process.pid)
    latencies = [watcher.first[n]["Dispatched"] - created[f"appwrappers/{n}"] for n in names_set]
    dispatch_seconds = max(watcher.first[n]["Dispatched"] for n in names_set) - started
    requests = {
        k: (after.get(k, 0) - before.get(k, 0)) / count
        for k in sorted(set(after) | set(before))
        if after.get(k, 0) - before.get(k, 0)
    }
    percentiles = {
        "p50": percentile(latencies, 0.5),
        "p95": percentile(latencies, 0.95),
        "p99": percentile(latencies, 0.99),
        "max": max(latencies),
    }
    figures: dict[str, Any] = {
        "seconds_to_all_dispatched": dispatch_seconds,
        "seconds_to_all_running": all_running - started,
        "seconds_creating_appwrappers": max(created.values()) - started,
        "dispatches_per_second": count / dispatch_seconds,
        "latency_seconds": percentiles,
        "requests_per_dispatch": requests,
        "cpu_seconds": cpu_after["cpu_seconds"] - process_cpu_before,
        "control_plane_cpu_seconds": cpu_used(plane_before, plane_after),
        "peak_rss_mb": cpu_after["peak_rss_mb"],
        "latencies": sorted(latencies),
    }
    print(
        f"{namespace}: {count} AppWrappers dispatched in {dispatch_seconds:.1f}s "
        f"({count / dispatch_seconds:.1f}/s), all Running after {all_running - started:.1f}s; "
        "latency create->Dispatched p50/p95/p99: "
        + " / ".join(f"{percentiles[q]:.3f}s" for q in ("p50", "p95", "p99")),
        flush=True,
    )
    print("requests per dispatch: " + ", ".join(f"{k}={v:.2f}" for k, v in requests.items()))
    return figures


async def run(
    count: int,
    churn: int,
    workdir: Path,
    profile: Path | None = None,
    settings: dict[str, Any] | None = None,
    trace_memory: bool = False,
    queued: int = 0,
) -> dict[str, Any]:
    binaries = ensure_binaries()
    cluster = LocalCluster.start("bench", workdir, binaries=binaries)
    # The raw client gets as many requests in flight as the dispatcher has dispatches.
    concurrency = Config.model_validate(settings or {}).dispatch_concurrency
    result: dict[str, Any] = {"count": count, "concurrency": concurrency}
    try:
        nodes_per_pool = max(2, count // 100 + 1)
        names = []
        for pool in ("raw", "aw", "awq") if queued else ("raw", "aw"):
            for index in range(nodes_per_pool):
                name = f"{pool}-{index}"
                cluster.add_node(
                    name, cpu="32", memory="128Gi", pods=110, labels={"bench/pool": pool}
                )
                names.append(name)
        if churn:
            for index in range(4):
                name = f"churn-{index}"
                cluster.add_node(
                    name,
                    cpu=str(max(1, churn // 40)),
                    memory="512Gi",
                    pods=250,
                    labels={"bench/pool": "churn"},
                )
                names.append(name)
        cluster.wait_nodes_ready(names, timeout=120)
        install_appwrapper_crd(cluster)
        if queued:
            cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "queues.yaml"))
        for namespace in ("raw", "aw", "churn"):
            cluster.kubectl("create", "namespace", namespace)
        client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), pool_size=64)
        await asyncio.sleep(2)  # let the CRD's discovery settle before timing anything

        # 1. The raw limit: the same objects, created directly.
        jobs = []
        for index in range(count):
            jobs.append((DEPLOYMENTS, "raw", bench_deployment(f"raw-{index}", "raw")))
            jobs.append((SERVICES, "raw", service(f"raw-{index}")))
        cpu_before = cluster_cpu(cluster)
        started = time.time()
        await create_all(client, jobs, concurrency)
        raw_seconds = time.time() - started
        # The controller-manager, scheduler and KWOK are still turning those Deployments
        # into running pods; the dispatcher's phase must not pay for that backlog.
        raw_running = await wait_pods_running(client, "raw", count) - started
        result["raw"] = {
            "control_plane_cpu_seconds": cpu_used(cpu_before, cluster_cpu(cluster)),
            "seconds": raw_seconds,
            "seconds_to_all_running": raw_running,
            "objects_per_second": 2 * count / raw_seconds,
            "pairs_per_second": count / raw_seconds,
        }
        print(
            f"raw: {2 * count} objects in {raw_seconds:.1f}s "
            f"({count / raw_seconds:.1f} Deployment+Service pairs/s), all pods Running after "
            f"{raw_running:.1f}s",
            flush=True,
        )
        # Then leave the cluster as the raw phase found it: Service creates cost the API
        # server more with every Service that exists (its ClusterIP allocator scans them
        # all), and the controllers keep working on the raw phase's objects.
        result["raw"]["seconds_to_clean_up"] = await delete_namespace(client, "raw")

        # 2. The dispatcher: the same pairs wrapped in AppWrappers.
        port = free_port()
        # All nodes count; each workload's nodeSelector keeps it on its own pool.
        process = start_dispatcher(cluster, workdir, {}, port, profile, settings, trace_memory)
        try:
            wait_ready(port)
            watcher = Watcher(client)
            watch_task = asyncio.create_task(watcher.informer.run())
            await watcher.informer.synced.wait()
            result["dispatcher"] = await burst_phase(
                client, watcher, cluster, process, port, count, namespace="aw", prefix="aw"
            )
            dispatch_seconds = result["dispatcher"]["seconds_to_all_dispatched"]
            all_running = result["dispatcher"]["seconds_to_all_running"]
            result["ratio_dispatch_to_raw"] = (count / dispatch_seconds) / (count / raw_seconds)
            # The same comparison end to end: until every pod runs, wrapped or not.
            result["ratio_running_to_raw"] = raw_running / all_running
            print(
                f"ratio to raw {result['ratio_dispatch_to_raw']:.2f} (until all Running: "
                f"{result['ratio_running_to_raw']:.2f})",
                flush=True,
            )
            result["trickle"] = await trickle_phase(client, watcher)
            if queued:
                result["queued_pairs"] = await queued_pairs(
                    client, watcher, cluster, process, port, count, queued
                )
            if churn:
                result["churn"] = await churn_phase(client, watcher, churn, process, port)
            if trace_memory:
                # Top allocation sites; a snapshot of a traced heap takes tens of seconds.
                report = fetch(port, "/debug/memory", timeout=120)
                (workdir / "memory.txt").write_text(report)
                print(report[:3000], flush=True)
            watch_task.cancel()
        finally:
            process.terminate()
            process.wait(30)
        await client.close()
    finally:
        cluster.stop()
    return result


async def trickle_phase(
    client: KubeClient, watcher: Watcher, total: int = 50, every: float = 0.25
) -> dict[str, Any]:
    """Latency when capacity is free and no backlog: one AppWrapper every `every` seconds
    (arrivals are paced on purpose: this is the workload, not a wait for a result)."""
    created: dict[str, float] = {}
    for index in range(total):
        name = f"trickle-{index}"
        await client.create(
            APPWRAPPERS, "aw", appwrapper(name, bench_deployment(name, "aw"), service(name))
        )
        created[name] = time.time()
        await asyncio.sleep(every)
    await watcher.wait("Dispatched", set(created), timeout=120)
    latencies = [watcher.first[n]["Dispatched"] - t for n, t in created.items()]
    figures = {
        "count": total,
        "interval_seconds": every,
        "p50": percentile(latencies, 0.5),
        "p95": percentile(latencies, 0.95),
        "p99": percentile(latencies, 0.99),
        "max": max(latencies),
    }
    print(
        f"trickle: {total} AppWrappers, one every {every}s: create->Dispatched "
        f"p50 {figures['p50'] * 1000:.0f} ms, p99 {figures['p99'] * 1000:.0f} ms",
        flush=True,
    )
    return figures


async def churn_phase(
    client: KubeClient,
    watcher: Watcher,
    total: int,
    process: subprocess.Popen[bytes],
    port: int,
) -> dict[str, Any]:
    """Many Job AppWrappers against capacity for a tenth of them; drain as Jobs complete."""
    aws = [
        (
            APPWRAPPERS,
            "churn",
            appwrapper(f"churn-{i}", bench_job(f"churn-{i}"), completion="Complete"),
        )
        for i in range(total)
    ]
    names = {f"churn-{i}" for i in range(total)}
    cpu_before = proc_stats(process.pid)["cpu_seconds"]
    requests_before = scrape(port)
    started = time.time()
    await create_all(client, aws)
    created = time.time()
    peak_rss = 0.0
    done = asyncio.create_task(watcher.wait("Completed", names, timeout=3600))
    progress: list[tuple[float, int, int, float]] = []
    while not done.done():
        rss = proc_stats(process.pid)["rss_mb"]
        peak_rss = max(peak_rss, rss)
        if not progress or time.time() - progress[-1][0] - started >= 10:
            # (seconds, dispatched, completed, RSS MB): the drain curve, every 10 s.
            progress.append(
                (
                    time.time() - started,
                    watcher.count("Dispatched", names),
                    watcher.count("Completed", names),
                    round(rss, 1),
                )
            )
        await asyncio.sleep(1)
    finished = done.result()
    cpu_seconds = proc_stats(process.pid)["cpu_seconds"] - cpu_before
    requests_after = await settled_counts(port)
    requests = {
        k: round((requests_after.get(k, 0) - requests_before.get(k, 0)) / total, 3)
        for k in sorted(set(requests_after) | set(requests_before))
        if requests_after.get(k, 0) - requests_before.get(k, 0)
    }
    pods = await client.list(PODS, "churn")
    unschedulable = [
        p["metadata"]["name"]
        for p in pods.get("items", [])
        if any(
            c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in (p.get("status") or {}).get("conditions", [])
        )
    ]
    stats = proc_stats(process.pid)
    print(
        f"churn: {total} Job AppWrappers drained in {finished - started:.1f}s "
        f"({total / (finished - started):.1f}/s); unschedulable pods: {len(unschedulable)}; "
        f"dispatcher peak RSS {stats['peak_rss_mb']:.0f} MB, CPU {cpu_seconds:.0f} s",
        flush=True,
    )
    print("churn requests per AppWrapper: " + ", ".join(f"{k}={v}" for k, v in requests.items()))
    return {
        "count": total,
        "seconds": finished - started,
        "seconds_creating_appwrappers": created - started,
        "drain_per_second": total / (finished - started),
        "unschedulable_pods": len(unschedulable),
        "peak_rss_mb": stats["peak_rss_mb"],
        "cpu_seconds": cpu_seconds,
        "requests_per_appwrapper": requests,
        "progress": progress,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--churn", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/e2e.json"))
    parser.add_argument(
        "--profile", type=Path, help="run the dispatcher under cProfile, stats to this file"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dispatcher configuration setting (YAML value), e.g. dispatch_concurrency=64",
    )
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's and the dispatcher's logs here"
    )
    parser.add_argument(
        "--trace-memory",
        action="store_true",
        help="trace the dispatcher's allocations; their top sites go to WORKDIR/memory.txt",
    )
    parser.add_argument(
        "--queued",
        type=int,
        default=0,
        metavar="PAIRS",
        help="then PAIRS alternated bursts on capacity alone and through a queue",
    )
    args = parser.parse_args()
    settings = {k: yaml.safe_load(v) for k, v in (item.split("=", 1) for item in args.set)}
    with contextlib.ExitStack() as stack:
        workdir = report.workdir(stack, args.workdir, "aw-bench-")
        result = asyncio.run(
            run(
                args.count,
                args.churn,
                workdir,
                args.profile and args.profile.resolve(),
                settings,
                args.trace_memory,
                args.queued,
            )
        )
    result["settings"] = settings
    save(result, args.out)
    summary = {k: v for k, v in result.get("dispatcher", {}).items() if k != "latencies"}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
