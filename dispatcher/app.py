"""Assembly: connect the hub and members, build the Dispatcher, run it.

Side effects: network connections; `running` starts background tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import structlog

from dispatcher.config import Config, MemberConfig
from dispatcher.controller.dispatcher import Dispatcher
from dispatcher.controller.members import Member
from dispatcher.kube.client import KubeClient

LOCAL_MEMBER = "local"


async def build(config: Config) -> Dispatcher:
    kubeconfig = config.kubeconfig or os.environ.get("KUBECONFIG") or None
    hub = await KubeClient.connect(
        kubeconfig=kubeconfig,
        context=config.context,
        name="hub",
        qps=config.qps,
        burst=config.burst,
    )
    member_configs = config.members or [MemberConfig(name=LOCAL_MEMBER)]
    members = []
    for member in member_configs:
        if member.kubeconfig is None:
            client = hub
        else:
            client = await KubeClient.connect(
                kubeconfig=member.kubeconfig,
                context=member.context,
                name=member.name,
                qps=config.qps,
                burst=config.burst,
            )
        members.append(Member.build(member, client, is_hub=member.kubeconfig is None))
    return Dispatcher(config=config, hub=hub, members=members)


async def close(dispatcher: Dispatcher) -> None:
    clients = {id(dispatcher.hub): dispatcher.hub}
    for member in dispatcher.members.values():
        clients[id(member.client)] = member.client
    for client in clients.values():
        await client.close()


@contextlib.asynccontextmanager
async def running(config: Config, *, ready_timeout: float = 60) -> AsyncIterator[Dispatcher]:
    """Run a dispatcher in this event loop for the duration of the block (tests, demo)."""
    dispatcher = await build(config)
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
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await close(dispatcher)


async def serve_forever(config: Config) -> None:
    """The `run` command: until SIGTERM/SIGINT, then drain in-flight dispatches."""
    from dispatcher import health, metrics

    log = structlog.get_logger("main")
    dispatcher = await build(config)
    runner = None
    if config.health_port:
        runner = await health.serve(
            port=config.health_port,
            ready=dispatcher.ready.is_set,
            metrics=lambda: metrics.render(dispatcher),
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    task = asyncio.create_task(dispatcher.run(), name="dispatcher")
    stopper = asyncio.create_task(stop.wait())
    log.info("started", members=list(dispatcher.members), queue_mode=config.queue_mode.value)
    try:
        done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        log.info("stopping")
        await dispatcher.drain(timeout=10)
    finally:
        stopper.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if runner is not None:
            await runner.cleanup()
        await close(dispatcher)
