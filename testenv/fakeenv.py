"""A controller on the in-memory API server, for tests that run in milliseconds. No I/O.

`FakeEnv` holds a `FakeKube`, a manual clock and a `Manager` wired to both (the hub is its
only member). Tests play the parts no controller plays on the fake: they add nodes, and make,
run, finish and remove the pods of wrapped objects (`pods`, `finish_pods`, `remove_pods`).
With `loops=False` the manager only watches; the test drives `reconcile` and `cycle` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.clock import ManualClock
from dispatcher.cluster.member import NODES, PODS, Member
from dispatcher.cluster.objects import ensure_namespace
from dispatcher.config import Config, MemberConfig
from dispatcher.controller.manager import Manager
from dispatcher.controller.status import APPWRAPPERS
from testenv.fakekube import FakeKube

Obj = dict[str, Any]
NAMESPACE = "team"


def node(name: str, allocatable: dict[str, str], *, labels: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


APPWRAPPER = ("workload.codeflare.dev/v1beta1", "AppWrapper")


def _versions(objects: Iterable[Obj]) -> set[tuple[str, str]]:
    return {
        (
            f"{o['metadata'].get('namespace')}/{o['metadata']['name']}",
            o["metadata"]["resourceVersion"],
        )
        for o in objects
    }


class FakeEnv:
    def __init__(self, *, loops: bool, **settings: Any) -> None:
        self.clock = ManualClock()
        self.fake = FakeKube(name="hub", clock=self.clock.time)
        self.loops = loops
        # No admission webhook here: AppWrappers carry no signed creator record.
        self.settings = {
            "requeue_pause_seconds": 0.0,
            "health_port": 0,
            "unattributed": "allow",
            **settings,
        }
        self.manager = self._new_manager()
        self._task: asyncio.Task[None] | None = None

    def _new_manager(self) -> Manager:
        config = Config(members=[MemberConfig(name="local")], **self.settings)
        member = Member.build(config.members[0], self.fake, is_hub=True, clock=self.clock)
        return Manager(config=config, hub=self.fake, members=[member], clock=self.clock)

    async def start(self) -> Manager:
        self._task = asyncio.get_running_loop().create_task(self.manager.run(loops=self.loops))
        ready = asyncio.get_running_loop().create_task(self.manager.ready.wait())
        await asyncio.wait({self._task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            self._task.result()
        return self.manager

    async def stop(self) -> None:
        """Stop the manager the way a crash does: in-flight work is cut off."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def restart(self) -> Manager:
        """A new leader: a fresh manager (empty memory) on the same API server."""
        await self.stop()
        self.manager = self._new_manager()
        return await self.start()

    # -- the cluster ------------------------------------------------------------------

    async def add_node(self, name: str, **allocatable: str) -> None:
        body = node(name, dict(allocatable))
        created = await self.fake.create(NODES, None, body)
        created["status"] = body["status"]  # a kubelet (KWOK here) reports it after create
        await self.fake.replace(NODES, None, name, created, sub="status")

    async def apply(self, obj: Obj) -> Obj:
        return await self.fake.create(APPWRAPPERS, NAMESPACE, obj)

    async def get(self, name: str) -> Obj:
        return await self.fake.get(APPWRAPPERS, NAMESPACE, name)

    async def conditions(self, name: str) -> dict[str, str]:
        status = (await self.get(name)).get("status") or {}
        return {c["type"]: c["status"] for c in status.get("conditions") or []}

    async def delete(self, name: str) -> None:
        await self.fake.delete(APPWRAPPERS, NAMESPACE, name)

    def objects(self, api_version: str, kind: str) -> list[Obj]:
        return self.fake.objects(api_version, kind)

    async def pods(
        self,
        owner: str,
        count: int,
        *,
        cpu: str = "1",
        node_name: str = "n1",
        phase: str = "Running",
    ) -> list[str]:
        """Play the workload controller and kubelet: `count` pods of AppWrapper `owner`."""
        uid = (await self.get(owner))["metadata"]["uid"]
        names = []
        for index in range(count):
            name = f"{owner}-{index}"
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": {LABEL_NAME: owner, LABEL_NAMESPACE: NAMESPACE, LABEL_UID: uid},
                },
                "spec": {
                    "nodeName": node_name,
                    "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
                },
            }
            await self.fake.create(PODS, NAMESPACE, pod)
            names.append(name)
        await self.set_pod_phase(names, phase)
        return names

    async def set_pod_phase(self, names: list[str], phase: str) -> None:
        """What the kubelet reports (through the status subresource, as it does)."""
        for name in names:
            patch = {"status": {"phase": phase}}
            await self.fake.merge_patch(PODS, NAMESPACE, name, patch, sub="status")

    async def remove_pods(self, names: list[str]) -> None:
        for name in names:
            await self.fake.delete(PODS, NAMESPACE, name)

    # -- waiting without sleeping -------------------------------------------------------

    async def until(self, check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
        """Let the event loop run (the watches deliver, the loops work) until `check()`
        holds; polls, first without waiting (the fake answers at once), then every ms."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        spins = 0
        while not check():
            if loop.time() > deadline:
                raise AssertionError(f"never happened within {timeout}s: {what}")
            spins += 1
            await asyncio.sleep(0 if spins < 1000 else 0.001)

    async def caught_up(self) -> None:
        """Until the AppWrapper, node and pod watches have delivered every change so far."""
        member = self.manager.members["local"]
        wanted = [
            (self.manager.appwrappers, _versions(self.objects(*APPWRAPPER))),
            (member.nodes, _versions(self.objects("v1", "Node"))),
            (member.pods, _versions(self.objects("v1", "Pod"))),
        ]

        def seen() -> bool:
            return all(
                _versions(informer.store.values()) == versions for informer, versions in wanted
            )

        await self.until(seen, "the watches deliver every change")

    async def reconcile(self, name: str) -> float | None:
        """One reconcile of AppWrapper `name` (after the watches caught up)."""
        await self.caught_up()
        result = await self.manager.reconciler.reconcile(f"{NAMESPACE}/{name}")
        await self.caught_up()
        return result.requeue_after

    async def cycle(self) -> None:
        """One scheduling cycle and the writes it starts."""
        await self.caught_up()
        self.manager.scheduler.cycle()
        await self.manager.scheduler.drain(timeout=5)
        await self.caught_up()


@contextlib.asynccontextmanager
async def fake_env(*, loops: bool = False, **settings: Any) -> AsyncIterator[FakeEnv]:
    env = FakeEnv(loops=loops, **settings)
    await ensure_namespace(env.fake, NAMESPACE)
    await env.start()
    try:
        yield env
    finally:
        await env.stop()
