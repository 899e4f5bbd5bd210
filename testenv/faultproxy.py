"""A proxy in front of a real API server that can turn hostile on demand (tests).

Faults that the API server itself will not produce at will — a storm of 429 answers to one
client while it answers others — are injected here, between one dispatcher replica and the
real API server: the replica talks plain HTTP to the proxy, which forwards every request
(watches streamed as they come) over TLS with the replica's own credentials. It runs its own
event loop in a thread, so sync tests that drive subprocesses can use it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import aiohttp
from aiohttp import web

# Hop-by-hop, or describing a body the proxy re-frames: never copied across.
_DROPPED = {"connection", "content-length", "transfer-encoding", "keep-alive", "host"}


class FaultProxy:
    """`start()` → URL; `storm(True)` answers every new request 429 until `storm(False)`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.refused = 0
        """Requests answered 429 so far."""
        self._storm = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.url = ""

    def start(self) -> str:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(30)
        return self.url

    def storm(self, on: bool) -> None:
        self._storm = on

    def kubeconfig(self, path: Path, token: str) -> Path:
        """A kubeconfig that reaches the API server through this proxy."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "proxied", "cluster": {"server": self.url}}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "proxied", "context": {"cluster": "proxied", "user": "admin"}}],
            "current-context": "proxied",
        }
        path.write_text(json.dumps(config))
        return path

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self) -> str:
        # The local control plane's certificate is self-signed: not verified (loopback only).
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=False),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,  # bodies pass through as the API server encoded them
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # Watches stay open for ever: stopping must not wait for them.
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if self._storm:
            self.refused += 1
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "TooManyRequests",
                "message": "storm injected by the test proxy",
                "code": 429,
            }
            return web.json_response(body, status=429, headers={"Retry-After": "1"})
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROPPED}
        async with self._session.request(
            request.method,
            self.upstream + request.path_qs,
            headers=headers,
            data=await request.read(),
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in _DROPPED},
            )
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionError, aiohttp.ClientError):
                pass  # the client went away (a replica that exited): nothing to answer
            return response
