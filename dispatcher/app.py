"""Assembly: connect the hub and members, build the controller manager, run it. A member
kubeconfig read from a Secret that runs credential plugins is refused here, at start.

Five sets of connections, each with its own rate limiter and connection pool, so that none
can starve another: the controller's (`Config.qps`), the admission webhook's, opened in its
own thread (`webhook.qps`, see webhook_service.py), the visibility API's access checks
(`visibility.review_qps`), the /metrics scrapers' reviews (`metrics.review_qps`, with
`metrics.auth: kubernetes`) and the leader-election Lease's.

Before anything is served, the hub's AppWrapper CRD is checked (`kube/preflight.py`): one
this dispatcher cannot serve (another controller's) stops the start with StartRefused.

Side effects: network connections; `running` starts background tasks, and the webhook's
thread.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog
import yaml

from dispatcher import health, metrics
from dispatcher.cluster.member import Member, mapping_problems
from dispatcher.config import Config, MemberConfig
from dispatcher.controller.access.metrics import MetricsAccess
from dispatcher.controller.manager import Manager
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import KubeClient, ResourceInfo, replica_identity
from dispatcher.kube.leader import LeaderElector
from dispatcher.kube.preflight import check_appwrapper_crd
from dispatcher.visibility_service import VisibilityService
from dispatcher.webhook_service import WebhookService

LOCAL_MEMBER = "local"
SECRETS = ResourceInfo("v1", "Secret", "secrets", namespaced=True)


async def connect_hub(config: Config, *, name: str, qps: float, burst: int) -> KubeClient:
    """A new connection to the hub, with a rate limiter of its own."""
    return await KubeClient.connect(
        kubeconfig=config.kubeconfig or os.environ.get("KUBECONFIG") or None,
        context=config.context,
        name=name,
        qps=qps,
        burst=burst,
    )


async def member_kubeconfigs(config: Config, hub: KubeApi) -> dict[str, dict[str, Any]]:
    """Member name -> its kubeconfig, for the members whose kubeconfig is in a Secret."""
    return {
        member.name: await _kubeconfig_from_secret(
            hub, member.kubeconfig_secret, allow_exec=config.allow_exec_kubeconfigs
        )
        for member in config.members
        if member.kubeconfig_secret
    }


async def connect_members(
    config: Config,
    hub: KubeClient,
    secrets: dict[str, dict[str, Any]],
    *,
    qps: float,
    burst: int,
) -> list[tuple[MemberConfig, KubeClient]]:
    """Each member with its connection (`hub` itself for the hub); `secrets` holds the
    kubeconfigs read from Secrets (`member_kubeconfigs`). A failure closes what it opened."""
    connected: list[tuple[MemberConfig, KubeClient]] = []
    try:
        for member in config.members or [MemberConfig(name=LOCAL_MEMBER)]:
            if member.kubeconfig_secret or member.kubeconfig:
                client = await KubeClient.connect(
                    kubeconfig_dict=secrets.get(member.name),
                    kubeconfig=None if member.kubeconfig_secret else member.kubeconfig,
                    context=member.context,
                    name=member.name,
                    qps=qps,
                    burst=burst,
                )
            else:
                client = hub
            connected.append((member, client))
    except BaseException:
        for _, client in connected:
            if client is not hub:
                await client.close()
        raise
    return connected


async def build(config: Config) -> Manager:
    hub = await connect_hub(config, name="hub", qps=config.qps, burst=config.burst)
    secrets = await member_kubeconfigs(config, hub)
    members = []
    for member, client in await connect_members(
        config, hub, secrets, qps=config.qps, burst=config.burst
    ):
        problems = (
            []
            if client is hub
            else mapping_problems(
                member.namespaces, member.wildcard_allowed, member.wildcard_reserved
            )
        )
        if problems:
            raise ValueError(f"members[{member.name}].namespaces: {'; '.join(problems)}")
        members.append(Member.build(member, client, is_hub=client is hub))
    return Manager(config=config, hub=hub, members=members)


async def build_checked(config: Config) -> Manager:
    """`build`, then the checks at start (`kube/preflight.py`): StartRefused, with every
    connection closed, when the hub's AppWrapper CRD is not one this dispatcher serves."""
    dispatcher = await build(config)
    try:
        await check_appwrapper_crd(dispatcher.hub)
    except BaseException:
        await close(dispatcher)
        raise
    return dispatcher


async def _kubeconfig_from_secret(hub: KubeApi, ref: str, *, allow_exec: bool) -> dict[str, Any]:
    namespace, name = ref.split("/", 1)
    secret = await hub.get(SECRETS, namespace, name)
    data = (secret.get("data") or {}).get("kubeconfig")
    if not data:
        raise ValueError(f"Secret {ref} has no 'kubeconfig' key")
    loaded = yaml.safe_load(base64.b64decode(data))
    if not isinstance(loaded, dict):
        raise ValueError(f"Secret {ref}: 'kubeconfig' is not a kubeconfig document")
    if not allow_exec:
        refuse_plugins(loaded, where=f"Secret {ref}")
    return loaded


def refuse_plugins(kubeconfig: dict[str, Any], *, where: str) -> None:
    """Raise ValueError when a user entry of `kubeconfig` runs a program (`exec`) or an
    auth-provider plugin. Whoever may write the Secret would otherwise choose a command the
    dispatcher runs, with its own credentials and network reach; a kubeconfig file is
    written by the operator and is not checked."""
    users = kubeconfig.get("users")
    for index, entry in enumerate(users if isinstance(users, list) else []):
        if not isinstance(entry, dict) or not isinstance(entry.get("user"), dict):
            continue
        plugins = [key for key in ("exec", "auth-provider") if key in entry["user"]]
        if plugins:
            name = entry.get("name")
            user = repr(name) if isinstance(name, str) else f"#{index}"
            raise ValueError(
                f"{where}: kubeconfig user {user} uses {' and '.join(plugins)} "
                "(users[].user): a kubeconfig read from a Secret may not run credential "
                "plugins; use a token or a client certificate, or set "
                "allow_exec_kubeconfigs: true"
            )


async def close(dispatcher: Manager) -> None:
    """Close the connections `build` opened (the hub's and each member's)."""
    clients = [dispatcher.hub, *(m.client for m in dispatcher.members.values())]
    for client in {id(c): c for c in clients}.values():
        if isinstance(client, KubeClient):
            await client.close()


@contextlib.asynccontextmanager
async def running(config: Config, *, ready_timeout: float = 60) -> AsyncIterator[Manager]:
    """Run a dispatcher in this event loop for the duration of the block (tests, demo)."""
    dispatcher = await build_checked(config)
    service = await _start_webhook(config, dispatcher)
    visibility = await _start_visibility(config, dispatcher, service)
    task = asyncio.create_task(dispatcher.run(), name="dispatcher")
    try:
        ready = asyncio.create_task(dispatcher.ready.wait())
        done, _ = await asyncio.wait(
            {task, ready}, timeout=ready_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if task in done:
            ready.cancel()
            task.result()  # raises what stopped it
        if ready not in done:
            ready.cancel()
            raise TimeoutError(f"dispatcher not ready after {ready_timeout}s")
        yield dispatcher
        if task.done():
            task.result()  # it stopped on its own: that is a crash, and the caller must know
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        if visibility is not None:
            await visibility.stop()
        if service is not None:
            await service.stop()
        await close(dispatcher)


async def _start_visibility(
    config: Config, dispatcher: Manager, webhook: WebhookService | None
) -> VisibilityService | None:
    """Every replica serves the visibility API (docs/operations.md#see-the-queue); a standby
    answers 503 naming the leader."""
    if not config.visibility.enabled:
        return None
    settings = config.visibility

    async def connect() -> KubeClient:
        # Its SubjectAccessReviews on a connection and rate limiter of their own.
        return await connect_hub(
            config, name="visibility", qps=settings.review_qps, burst=settings.review_burst
        )

    service = VisibilityService(config, dispatcher, connect=connect)
    try:
        await service.start()
    except BaseException:
        await service.stop()
        if webhook is not None:
            await webhook.stop()
        await close(dispatcher)
        raise
    return service


async def start_health(config: Config, dispatcher: Manager) -> Callable[[], Awaitable[None]]:
    """Serve /healthz, /readyz and /metrics on `health_port` (HTTPS given
    `metrics.cert_file`); returns what stops it. With `metrics.auth: kubernetes`, the
    scrapers' tokens and rights are reviewed on a connection of the port's own."""
    settings = config.metrics
    context: ssl.SSLContext | None = None
    if settings.cert_file is not None and settings.key_file is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(settings.cert_file, settings.key_file)
    client: KubeClient | None = None
    access: MetricsAccess | None = None
    if settings.auth == "kubernetes":
        qps, burst = settings.review_qps, settings.review_burst
        client = await connect_hub(config, name="metrics", qps=qps, burst=burst)
        keep = config.access_review_cache_seconds
        access = MetricsAccess(client, qps=qps, burst=burst, keep_seconds=keep)
    try:
        runner = await health.serve(
            port=config.health_port,
            ready=dispatcher.ready.is_set,
            metrics=lambda: metrics.render(dispatcher),
            debug_memory=config.debug_memory,
            access=access,
            ssl_context=context,
        )
    except BaseException:
        if client is not None:
            await client.close()
        raise

    async def stop() -> None:
        await runner.cleanup()
        if client is not None:
            await client.close()

    return stop


async def _start_webhook(config: Config, dispatcher: Manager) -> WebhookService | None:
    """Every replica serves the admission webhook, leader or not (the API server may call
    any of them), from before it waits for the Lease; in its own thread, on its own
    connections (the member kubeconfigs in Secrets are read here, once more)."""
    if not config.webhook.enabled:
        return None
    qps, burst = config.webhook.qps, config.webhook.burst
    try:
        secrets = await member_kubeconfigs(config, dispatcher.hub)
    except BaseException:
        await close(dispatcher)
        raise

    async def connect() -> tuple[KubeClient, list[KubeClient]]:
        hub = await connect_hub(config, name="webhook-hub", qps=qps, burst=burst)
        try:
            members = await connect_members(config, hub, secrets, qps=qps, burst=burst)
        except BaseException:
            await hub.close()
            raise
        return hub, [client for _, client in members]

    def publish(keys: list[bytes]) -> None:
        # On the controller's loop: the same keys sign records (this replica's webhook)
        # and check them (the leader's scheduler and reconciler).
        dispatcher.signing_keys[:] = keys

    service = WebhookService(config, connect=connect, publish_keys=publish)
    try:
        await service.start()
    except BaseException:
        await service.stop()
        await close(dispatcher)
        raise
    return service


async def _acquire_lease(
    config: Config, stop: asyncio.Event
) -> tuple[LeaderElector, KubeClient] | None:
    """The Lease taken, on a connection of its own (neither the controller's bursts nor
    anything else waits in front of a renewal: a handful of requests every retry period, no
    rate limit); None, the connection closed, when `stop` is set first."""
    lease_client = await connect_hub(config, name="lease", qps=0, burst=0)
    elector = LeaderElector(
        lease_client,
        namespace=config.lease_namespace,
        name=config.lease_name,
        identity=replica_identity(),
        lease_duration=config.lease_duration_seconds,
        renew_deadline=config.lease_renew_deadline_seconds,
        retry_period=config.lease_retry_period_seconds,
    )
    acquiring = asyncio.create_task(elector.acquire())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({acquiring, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        acquiring.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await acquiring
        await lease_client.close()
        return None
    stopper.cancel()
    return elector, lease_client


async def serve_forever(config: Config) -> None:
    """The `run` command: until SIGTERM/SIGINT, then drain in-flight dispatches.

    With leader election, only the Lease holder dispatches. Losing the lease fences the
    manager at that instant (no further write leaves this process, see `Manager.fence`),
    then ends the process (LostLease: exit code 1) so that its supervisor restarts it as a
    follower.
    """
    dispatcher = await build_checked(config)
    stops: list[Callable[[], Awaitable[None]]] = []  # what serves beside it, in start order
    service = await _start_webhook(config, dispatcher)
    if service is not None:
        stops.append(service.stop)
    visibility = await _start_visibility(config, dispatcher, service)
    if visibility is not None:
        stops.append(visibility.stop)
    if config.health_port:
        stops.append(await start_health(config, dispatcher))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lease_client: KubeClient | None = None
    try:
        elector: LeaderElector | None = None
        if config.leader_election:
            elected = await _acquire_lease(config, stop)
            if elected is None:  # stopped before it led
                return
            elector, lease_client = elected
        await _run(config, dispatcher, elector, stop)
    finally:
        for stop_serving in reversed(stops):
            await stop_serving()
        if lease_client is not None:
            await lease_client.close()
        await close(dispatcher)


async def _run(
    config: Config, dispatcher: Manager, elector: LeaderElector | None, stop: asyncio.Event
) -> None:
    """Run the manager (holding the lease, with an elector) until `stop`, a crash or the
    lease lost; then drain, fence if the lease went, and release it if still held."""
    log = structlog.get_logger("main")
    tasks = {
        asyncio.create_task(dispatcher.run(), name="dispatcher"),
        asyncio.create_task(stop.wait(), name="stop"),
    }
    lease = None
    if elector is not None:
        # The fence is called by the elector itself, in the same step as it decides.
        lease = asyncio.create_task(elector.keep_lease(on_lost=dispatcher.fence), name="lease")
        tasks.add(lease)
    log.info("started", members=list(dispatcher.members), queue_mode=config.queue_mode.value)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if lease is not None and lease.done():
            dispatcher.fence()  # idempotent; also covers a crash of the renewal loop
            lease.result()  # LostLease ends the process with exit code 1
        for task in done:
            if task.get_name() != "stop":
                task.result()  # a crash ends the process with its error
        log.info("stopping")
        # Renewal goes on while in-flight writes finish: a lease lost meanwhile still
        # fences them.
        await dispatcher.drain(timeout=10)
    finally:
        if lease is not None and not lease.done():
            lease.cancel()
        if elector is not None and elector.lost:
            dispatcher.fence()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if elector is not None:
            await elector.release()  # only if still held: never after losing it
