"""/healthz, /readyz, /metrics and, when asked for, /debug/memory, over plain HTTP or,
given a TLS context (`metrics.cert_file`), HTTPS.

/metrics is open to whoever reaches the port unless `access` is given
(`metrics.auth: kubernetes`): then only a caller whose bearer token and right to get
/metrics the API server confirms is served (controller/access/metrics.py). /healthz and
/readyz stay open either way: the kubelet's probes carry no token.

Side effects: listens on a TCP port.
"""

from __future__ import annotations

import ssl
import tracemalloc
from collections.abc import Callable

from aiohttp import web

from dispatcher.controller.access.metrics import MetricsAccess


async def serve(
    *,
    port: int,
    ready: Callable[[], bool],
    metrics: Callable[[], str],
    host: str = "0.0.0.0",
    debug_memory: bool = False,
    access: MetricsAccess | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> web.AppRunner:
    """Start the endpoints; the caller keeps the runner and calls `cleanup()` at shutdown.

    /debug/memory only with `debug_memory`: it names the source files and sizes of live
    memory to anyone who reaches the port unless `access` is given (then it asks for `get`
    on /debug/memory, as /metrics asks for `get` on /metrics)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="syncing")

    async def metrics_handler(request: web.Request) -> web.Response:
        return await _guarded(request, access) or web.Response(
            text=metrics(), content_type="text/plain"
        )

    async def memory(request: web.Request) -> web.Response:
        return await _guarded(request, access) or web.Response(
            text=memory_report(), content_type="text/plain"
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    if debug_memory:
        app.router.add_get("/debug/memory", memory)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    return runner


async def _guarded(request: web.Request, access: MetricsAccess | None) -> web.Response | None:
    """The refusal to answer instead of `request`'s page; None when it may be served."""
    if access is None:
        return None
    refused = await access.refusal(request.headers.get("Authorization"), path=request.path)
    if refused is None:
        return None
    headers = {}
    if refused.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="dispatcher"'
    if refused.retry_after:
        headers["Retry-After"] = str(max(1, round(refused.retry_after)))
    return web.Response(status=refused.status, text=refused.message, headers=headers)


def memory_report(top: int = 40) -> str:
    """Where the live Python memory was allocated, biggest first; tracing must have been on
    from the start (PYTHONTRACEMALLOC=1), as it slows the process down."""
    if not tracemalloc.is_tracing():
        return "memory tracing is off: start the dispatcher with PYTHONTRACEMALLOC=1\n"
    stats = tracemalloc.take_snapshot().statistics("lineno")
    total = sum(s.size for s in stats)
    lines = [f"traced {total / 2**20:.1f} MiB in {sum(s.count for s in stats)} blocks"]
    lines += [f"{s.size / 2**20:8.2f} MiB {s.count:9d} {s.traceback[0]}" for s in stats[:top]]
    return "\n".join(lines) + "\n"
