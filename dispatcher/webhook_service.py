"""The admission webhook as every replica runs it, apart from the controller: in a thread of
its own with its own event loop and its own API clients (rate limiter, connection pool), so
that no flood of admission requests delays the leader's Lease renewals or its dispatching.

What runs there: certificates made, rotated and reloaded (dispatcher.kube.certs); the HTTPS
endpoint (dispatcher.kube.webhook), with the API server's client certificate checked when
`webhook.client_ca_file` is set; whether its MutatingWebhookConfiguration calls this replica
(dispatcher.kube.registration: no record is signed otherwise); and the answers
(dispatcher.controller.access.gatekeeper, an `Gatekeeper` of its own with bounded discovery).

What crosses between the threads: the settings (read only), the signing keys (handed to the
controller's loop with `call_soon_threadsafe`, so that loop's state changes only on that
loop), and start and stop.

Side effects: a thread; listens on the webhook port; reads and writes the webhook's Secret
and the caBundle of its webhook configurations in the hub; watches the mutating one; reads
the client CA file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any

import structlog

from dispatcher.clock import Clock, SystemClock
from dispatcher.config import Config
from dispatcher.controller.access.gatekeeper import DiscoveryBounds, Gatekeeper
from dispatcher.kube import webhook
from dispatcher.kube.certs import WebhookCerts
from dispatcher.kube.client import KubeClient
from dispatcher.kube.registration import Registration

Connect = Callable[[], Awaitable[tuple[KubeClient, Sequence[KubeClient]]]]
"""Opens the webhook's own clients, in its thread: the hub's and each member's."""
CLIENT_CA_CHECK_SECONDS = 2.0
"""How often the client CA file is looked at for a change."""


class WebhookService:
    """Start with `start()`, stop with `stop()` (both from the controller's loop); `port` is
    the port it listens on. `publish_keys` is called on the controller's loop with the keys
    that sign and verify creator records, at start and whenever they change."""

    def __init__(
        self,
        config: Config,
        *,
        connect: Connect,
        publish_keys: Callable[[list[bytes]], None],
        clock: Clock | None = None,
    ) -> None:
        self._config = config
        # Read and slept on in the webhook's own thread and loop: a ManualClock there must
        # be advanced from that thread.
        self._clock = clock or SystemClock()
        self._connect = connect
        self._publish_keys = publish_keys
        self.port = 0
        self.certs: WebhookCerts | None = None
        self.registration: Registration | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._home: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._stop_asked = threading.Event()
        self.log = structlog.get_logger("webhook")

    async def start(self) -> None:
        """Serving once this returns; raises what kept it from starting."""
        self._home = asyncio.get_running_loop()
        started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(started),), name="webhook", daemon=True
        )
        self._thread.start()
        try:
            await asyncio.wrap_future(started)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop serving and wait for the thread to end (its clients closed)."""
        # The flag first: a thread that has not made its loop yet sees it once started.
        self._stop_asked.set()
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    # -- the webhook's thread ------------------------------------------------------------

    async def _serve(self, started: concurrent.futures.Future[None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        clients: list[KubeClient] = []
        tasks: list[asyncio.Task[Any]] = []
        runner = None
        try:
            hub, members = await self._connect()
            clients = list({id(c): c for c in (hub, *members)}.values())
            runner, tasks = await self._start_all(hub, members)
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            await _close(runner, tasks, clients)
            if isinstance(exc, Exception):
                return  # handed to start()
            raise
        started.set_result(None)
        try:
            if not self._stop_asked.is_set():
                await self._stopping.wait()
        finally:
            await _close(runner, tasks, clients)

    async def _start_all(
        self, hub: KubeClient, members: Sequence[KubeClient]
    ) -> tuple[Any, list[asyncio.Task[Any]]]:
        settings = self._config.webhook
        certs = self.certs = WebhookCerts(hub, settings, clock=self._clock, on_keys=self._hand_over)
        await certs.start()
        client_auth = None
        if settings.client_ca_file:
            client_auth = webhook.ClientAuth(
                settings.client_ca_file, settings.client_names, certs.ssl_context
            )
        else:
            self.log.warning(
                "webhook_client_auth_off",
                risk="any client that reaches the webhook port gets answers: access questions "
                "about any user, and creator records signed while the webhook is registered",
                fix="give the API server a client certificate for webhooks "
                "(AdmissionConfiguration kubeConfigFile) and set webhook.client_ca_file; "
                "where that cannot be done, let only the API server reach the port "
                "(manifests/network-policy/)",
            )
        admission = Gatekeeper(
            config=self._config,
            hub=hub,
            discovery=members,
            signing_keys=lambda: certs.signing_keys,
            bounds=DiscoveryBounds(
                max_api_versions=settings.max_api_versions,
                kind_groups=settings.kind_groups,
                unserved_seconds=settings.unserved_cache_seconds,
            ),
        )
        registration = self.registration = Registration(
            hub, settings, path=webhook.MUTATE_PATH, clock=self._clock
        )
        runner, self.port = await webhook.serve(
            host=settings.host,
            port=settings.port,
            ssl_context=certs.ssl_context,
            mutate=registered_only(registration, admission.mutate),
            validate=admission.validate,
            client_auth=client_auth,
            limits=webhook.Limits(
                max_in_flight=settings.max_in_flight,
                conversion_max_in_flight=settings.conversion_max_in_flight,
                queue_seconds=settings.queue_seconds,
                read_seconds=settings.read_seconds,
            ),
        )
        tasks = [self._task(certs.run(), "webhook-certs")]
        try:
            await registration.start(self.port)
            tasks.append(self._task(registration.run(), "webhook-registration"))
            if client_auth is not None:
                tasks.append(
                    self._task(_reload_forever(client_auth, self._clock), "webhook-client-ca")
                )
        except BaseException:
            await _close(runner, tasks, [])
            raise
        return runner, tasks

    def _task(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(work, name=name)
        task.add_done_callback(_report_stop)
        return task

    def _hand_over(self, keys: Sequence[bytes]) -> None:
        """Give the controller's loop the signing keys (called as they change)."""
        if self._home is not None:
            self._home.call_soon_threadsafe(self._publish_keys, list(keys))


async def _reload_forever(client_auth: webhook.ClientAuth, clock: Clock) -> None:
    """Take up the client CA file as it changes."""
    while True:
        await clock.sleep(CLIENT_CA_CHECK_SECONDS)
        client_auth.reload()


def registered_only(registration: Registration, mutate: webhook.Handler) -> webhook.Handler:
    """`mutate`, while this replica's MutatingWebhookConfiguration calls it; otherwise a
    refusal. Nobody but the API server should call it then, and a record signed for such a
    caller could be stored on an AppWrapper while the webhook is away."""

    async def answer(request: Mapping[str, Any]) -> dict[str, Any]:
        if registration.registered:
            return await mutate(request)
        return {
            "uid": request.get("uid", ""),
            "allowed": False,
            "status": {
                "code": 403,
                "reason": "Forbidden",
                "message": "the dispatcher's admission webhook is not installed "
                f"({registration.problem}): it signs no creator record now",
            },
        }

    return answer


async def _close(
    runner: Any, tasks: Sequence[asyncio.Task[Any]], clients: Sequence[KubeClient]
) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    if runner is not None:
        await runner.cleanup()
    for client in clients:
        with contextlib.suppress(Exception):
            await client.close()


def _report_stop(task: asyncio.Task[Any]) -> None:
    # A background task ending on its own is a bug: certificates would expire unnoticed,
    # or the registration go stale.
    if not task.cancelled() and task.exception() is not None:
        structlog.get_logger("webhook").error(
            "webhook_task_stopped", task=task.get_name(), error=repr(task.exception())
        )
