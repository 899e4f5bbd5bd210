"""/healthz, /readyz and /metrics over plain HTTP. Side effects: listens on a TCP port."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web


async def serve(
    *,
    port: int,
    ready: Callable[[], bool],
    metrics: Callable[[], str],
    host: str = "0.0.0.0",
) -> web.AppRunner:
    """Start the endpoints; the caller keeps the runner and calls `cleanup()` at shutdown."""

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="syncing")

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(text=metrics(), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
