"""The admission webhook's HTTPS endpoint: AdmissionReview v1 in, AdmissionReview out.

Side effects: listens on a TCP port with TLS. What to answer is decided by the handlers it is
given (dispatcher.controller.admission); this module only speaks the protocol. Every replica
serves it, leader or not: the API server may call any of them.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from aiohttp import web

MUTATE_PATH = "/mutate-appwrapper"
VALIDATE_PATH = "/validate-appwrapper"
MAX_BODY_BYTES = 8 * 2**20
"""An AppWrapper is at most what etcd stores (~1.5 MB), sent twice on UPDATE (object and
oldObject) plus JSON overhead."""

Handler = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


def review_answer(request: Mapping[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": str(request.get("apiVersion") or "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


async def serve(
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext,
    mutate: Handler,
    validate: Handler,
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call `cleanup()` to stop) and the port bound
    (`port` 0 picks a free one)."""
    log = structlog.get_logger("webhook")

    def endpoint(handler: Handler, what: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def answer(request: web.Request) -> web.Response:
            try:
                review = json.loads(await request.read())
                inner = review["request"]
                if not isinstance(inner, dict) or "uid" not in inner:
                    raise ValueError("no request.uid")
            except (ValueError, KeyError, TypeError) as exc:
                return web.Response(status=400, text=f"not an AdmissionReview: {exc}\n")
            try:
                response = await handler(inner)
            except Exception as exc:  # answer, whatever happened: fail closed with the cause
                log.exception("webhook_error", path=what, namespace=inner.get("namespace"))
                response = {
                    "uid": inner["uid"],
                    "allowed": False,
                    "status": {
                        "code": 500,
                        "message": f"the dispatcher could not check this request: {exc}",
                    },
                }
            return web.json_response(review_answer(review, response))

        return answer

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(MUTATE_PATH, endpoint(mutate, MUTATE_PATH))
    app.router.add_post(VALIDATE_PATH, endpoint(validate, VALIDATE_PATH))
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    # The port really bound (when 0 was asked for, a free one).
    bound = int(runner.addresses[0][1]) if runner.addresses else port
    log.info("webhook_serving", host=host, port=bound)
    return runner, bound
