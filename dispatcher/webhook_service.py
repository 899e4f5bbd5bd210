"""The admission webhook as every replica runs it: certificates made, rotated and reloaded
(dispatcher.kube.certs), the HTTPS endpoint (dispatcher.kube.webhook), and the answers
(dispatcher.controller.admission).

Side effects: listens on the webhook port; reads and writes the webhook's Secret and the
caBundle of its webhook configurations in the hub.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from aiohttp import web

from dispatcher.config import Config
from dispatcher.controller.manager import Manager
from dispatcher.kube import webhook
from dispatcher.kube.certs import WebhookCerts


class WebhookService:
    """Start with `start()`, stop with `stop()`; `port` is the port it listens on."""

    def __init__(self, config: Config, dispatcher: Manager) -> None:
        self._config = config
        self._dispatcher = dispatcher
        self.certs = WebhookCerts(dispatcher.hub, config.webhook)
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._rotation: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.certs.start()
        # The same keys sign records (this replica's webhook) and check them (the leader's
        # scheduler and reconciler): every replica reads them from the one Secret, at each
        # check, and every use asks for the set loaded last.
        certs = self.certs
        self._dispatcher.signing_keys = lambda: certs.signing_keys
        admission = self._dispatcher.admission
        self._runner, self.port = await webhook.serve(
            host=self._config.webhook.host,
            port=self._config.webhook.port,
            ssl_context=self.certs.ssl_context,
            mutate=admission.mutate,
            validate=admission.validate,
        )
        self._rotation = asyncio.create_task(self.certs.run(), name="webhook-certs")
        self._rotation.add_done_callback(_report_stop)

    async def stop(self) -> None:
        if self._rotation is not None:
            self._rotation.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._rotation
        if self._runner is not None:
            await self._runner.cleanup()


def _report_stop(task: asyncio.Task[None]) -> None:
    # Rotation ending on its own is a bug: the certificate would expire unnoticed.
    if not task.cancelled() and task.exception() is not None:
        structlog.get_logger("webhook").error(
            "certificate_rotation_stopped", error=repr(task.exception())
        )
