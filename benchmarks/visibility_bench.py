"""How fast the pending list answers with 10,000 AppWrappers pending.

Run from the repository root:

    python -m benchmarks.visibility_bench [--pending 10000] [--out FILE.json]

Synthetic and seeded: `--pending` AppWrappers in 50 namespaces, spread over 20 cluster
queues (one in ten on capacity alone), 500 running with limits or observed durations. It
times (1) building the view (`core.visibility.pending_view`: positions and estimates), done
once per scheduling cycle on the first question; (2) whole HTTPS requests to the visibility
server as the API server's front proxy makes them (TLS with its client certificate, the
X-Remote-User headers, the access check answered from its cache), on a view already built:
the whole list (every item), one namespace, one cluster queue, one AppWrapper; and (3) the
first request after a cycle (view built, then answered), for the first page (the default
request) and for the whole list. Median and p99 of wall time over
the repetitions; the load average is recorded. Side effects: listens on 127.0.0.1, prints a
table, writes the JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from dispatcher.controller.access.gatekeeper import AccessReviews
from dispatcher.controller.visibility.api import BASE, FrontProxy, VisibilityApi
from dispatcher.core.visibility import Durations, Occupant, Waiting, pending_view
from dispatcher.kube import certplan

NOW = 1_800_000_000.0


def scenario(pending: int, seed: int = 7) -> tuple[list[Waiting], list[Occupant], Durations]:
    rng = random.Random(seed)
    queues = [f"cq-{i}" for i in range(20)]
    order = []
    for i in range(pending):
        namespace = f"team-{i % 50}"
        queue = "" if i % 10 == 0 else rng.choice(queues)
        order.append(
            Waiting(
                key=f"{namespace}/job-{i}",
                priority=rng.choice([0, 0, 10, 100]),
                queued_since=NOW - rng.uniform(0, 86400),
                cluster_queue=queue,
                local_queue=f"{namespace}/main" if queue else "",
                reason="QuotaExceeded" if queue else "InsufficientResources",
                message=f"queue {queue}: needs cpu 4; nominal 64, in use 62, cohort can lend 0",
                kind=rng.choice(["Job", "RayCluster", "PyTorchJob"]),
                limit=rng.choice([None, 3600.0]),
            )
        )
    active = [
        Occupant(
            f"team-{i % 50}/run-{i}",
            NOW - rng.uniform(0, 3600),
            rng.choice(["", *queues]),
            rng.choice(["Job", "RayCluster"]),
            rng.choice([None, 7200.0]),
        )
        for i in range(500)
    ]
    durations = Durations()
    for _ in range(200):
        durations.observe(
            rng.choice(queues), rng.choice(["Job", "RayCluster"]), rng.uniform(60, 3600)
        )
    return order, active, durations


class AllowAll:
    """The hub's SubjectAccessReview answer (allowed), for the access check's cache."""

    async def create(self, *_: Any, **__: Any) -> dict[str, Any]:
        return {"status": {"allowed": True}}


def timed(samples: list[float], cpu: float | None = None) -> dict[str, float]:
    """Median and p99 wall time; with `cpu` (the process's CPU seconds over the samples,
    client and server alike), the CPU per run: on a loaded machine, wall above it is time
    other processes took."""
    ordered = sorted(samples)
    extra = {} if cpu is None else {"cpu_ms_per_run": round(cpu / len(samples) * 1000, 2)}
    return {
        **extra,
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2),
        "runs": len(ordered),
    }


async def serve_and_measure(pending: int, repeat: int) -> dict[str, Any]:
    order, active, durations = scenario(pending)
    now = time.time()
    proxy_ca = certplan.make_ca(now, 3600, name="front-proxy-ca")
    client = certplan.issue_client(proxy_ca, "front-proxy-client", now, 3600)
    server_ca = certplan.make_ca(now, 3600, name="server-ca")
    serving = certplan.issue_serving(server_ca, ["127.0.0.1"], now, 3600)
    views: list[Any] = [pending_view(order, active, durations, NOW)]
    api = VisibilityApi(
        front_proxy=FrontProxy.from_configmap(
            {}, ca_pem=proxy_ca.cert_pem, names=["front-proxy-client"]
        ),
        reviews=AccessReviews(AllowAll(), keep_seconds=3600),
        view=lambda: views[0] if views[0] is not None else build(),
        leading=lambda: True,
        leader=_no_leader,
        appwrapper=lambda key: None,
        queues=lambda: [],
        now=lambda: NOW,
    )

    def build() -> Any:
        views[0] = pending_view(order, active, durations, NOW)
        return views[0]

    with tempfile.TemporaryDirectory() as directory:
        files = Path(directory)
        for name, pair in (("server", serving), ("client", client)):
            (files / f"{name}.crt").write_bytes(pair.cert_pem)
            (files / f"{name}.key").write_bytes(pair.key_pem)
        server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_tls.load_cert_chain(files / "server.crt", files / "server.key")
        server_tls.verify_mode = ssl.CERT_OPTIONAL
        server_tls.load_verify_locations(cadata=proxy_ca.cert_pem.decode())
        client_tls = ssl.create_default_context(cadata=server_ca.cert_pem.decode())
        client_tls.load_cert_chain(files / "client.crt", files / "client.key")
        runner = web.AppRunner(api.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls)
        await site.start()
        port = runner.addresses[0][1]
        headers = {"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
        results: dict[str, Any] = {}
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=client_tls), headers=headers
        ) as session:

            async def get(path: str) -> int:
                async with session.get(f"https://127.0.0.1:{port}{BASE}{path}") as answer:
                    body = await answer.read()
                    assert answer.status == 200, body[:300]
                    return len(body)

            paths = {
                "whole_list": f"/pendingappwrappers?limit={pending}",
                "first_page_1000": "/pendingappwrappers",
                "one_namespace": "/namespaces/team-7/pendingappwrappers",
                "one_cluster_queue": "/clusterappqueues/cq-3/pendingappwrappers",
                "one_appwrapper": f"/namespaces/team-7/pendingappwrappers/job-{pending - 43}",
            }
            for name, path in paths.items():
                await get(path)  # warm the access cache and the connection
                samples = []
                size = 0
                cpu = time.process_time()
                for _ in range(repeat):
                    started = time.perf_counter()
                    size = await get(path)
                    samples.append(time.perf_counter() - started)
                results[name] = {**timed(samples, time.process_time() - cpu), "bytes": size}
            for name in ("first_page_1000", "whole_list"):
                samples = []
                cpu = time.process_time()
                for _ in range(max(5, repeat // 4)):
                    views[0] = None
                    started = time.perf_counter()
                    await get(paths[name])
                    samples.append(time.perf_counter() - started)
                results[f"{name}_after_a_cycle"] = timed(samples, time.process_time() - cpu)
        await runner.cleanup()
    return results


async def _no_leader() -> str:
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.visibility_bench", description=__doc__
    )
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--out", default="benchmarks/results/visibility.json")
    args = parser.parse_args(argv)
    order, active, durations = scenario(args.pending)
    samples = []
    cpu = time.process_time()
    for _ in range(10):
        started = time.perf_counter()
        pending_view(order, active, durations, NOW)
        samples.append(time.perf_counter() - started)
    build = timed(samples, time.process_time() - cpu)
    served = asyncio.run(serve_and_measure(args.pending, args.repeat))
    report = {
        "benchmark": "visibility",
        "pending": args.pending,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
        "build_view": build,
        "requests": served,
    }
    print(f"{args.pending} pending, load average {report['machine']['load_average'][0]}")
    for name, figures in {"build_view": build, **served}.items():
        print(
            f"  {name:26} median {figures['median_ms']:8.2f} ms  p99 {figures['p99_ms']:8.2f} ms"
            f"  cpu/run {figures.get('cpu_ms_per_run', 0):8.2f} ms"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
