"""Leader election on the in-memory API server, in manual time: each replica has its own
`ManualClock` (wall clocks may be skewed, monotonic ones run at the same rate), and requests
on the way to the server can be made slow or answered 429 in that time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest

from dispatcher.clock import ManualClock
from dispatcher.kube.client import RequestStats, ResourceInfo
from dispatcher.kube.errors import TooManyRequests
from dispatcher.kube.leader import LEASES, LeaderElector, LostLease
from testenv.fakekube import FakeKube

WRITES = ("create", "replace", "merge_patch", "delete")


class Path:
    """One replica's way to the API server: delays and 429s in its own manual time, and a
    log of the writes that reached the server (when, by its clock)."""

    def __init__(self, fake: FakeKube, clock: ManualClock) -> None:
        self.fake = fake
        self.clock = clock
        self.name = fake.name
        self.stats = RequestStats({})
        self.delay = 0.0
        self.storm_until = 0.0
        self.retry_after = 1.0
        self.landed: list[float] = []

    async def _gate(self) -> None:
        await self.clock.sleep(self.delay)
        # What KubeClient does with 429: up to 5 attempts, each after the Retry-After.
        for attempt in range(5):
            if self.clock.monotonic() >= self.storm_until:
                return
            if attempt == 4:
                raise TooManyRequests("too many requests", retry_after=self.retry_after)
            await self.clock.sleep(self.retry_after)

    async def get(self, info: ResourceInfo, namespace: str | None, name: str) -> dict[str, Any]:
        await self._gate()
        return await self.fake.get(info, namespace, name)

    async def create(self, info: ResourceInfo, namespace: str | None, body: Any) -> dict[str, Any]:
        await self._gate()
        created = await self.fake.create(info, namespace, body)
        self.landed.append(self.clock.monotonic())
        return created

    async def replace(
        self, info: ResourceInfo, namespace: str | None, name: str, body: Any, sub: str = ""
    ) -> dict[str, Any]:
        await self._gate()
        written = await self.fake.replace(info, namespace, name, body, sub)
        self.landed.append(self.clock.monotonic())
        return written

    # The rest of KubeApi, unused by the elector.
    async def ping(self, timeout: float = 5.0) -> None:
        await self.fake.ping(timeout)

    async def resource_info(self, api_version: str, kind: str) -> ResourceInfo:
        return await self.fake.resource_info(api_version, kind)

    def forget_discovery(self, api_version: str) -> None:
        self.fake.forget_discovery(api_version)

    async def merge_patch(
        self, info: ResourceInfo, namespace: str | None, name: str, patch: Any, sub: str = ""
    ) -> dict[str, Any]:
        raise AssertionError("not used")

    async def delete(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        uid: str | None = None,
    ) -> bool:
        raise AssertionError("not used")

    async def list(
        self,
        info: ResourceInfo,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        return await self.fake.list(info, namespace, query=query)

    def watch(
        self,
        info: ResourceInfo,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        query: Mapping[str, str] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        return self.fake.watch(
            info, resource_version=resource_version, timeout_seconds=timeout_seconds, query=query
        )


class Replica:
    def __init__(self, fake: FakeKube, identity: str, *, skew: float = 0.0) -> None:
        self.clock = ManualClock(start=1_700_000_000.0 + skew)
        self.path = Path(fake, self.clock)
        self.elector = LeaderElector(
            self.path,
            namespace="default",
            name="lease",
            identity=identity,
            clock=self.clock,
        )
        self.leading_at: float | None = None
        self.fenced_at: float | None = None
        self.writes_when_fenced: int | None = None
        self.task: asyncio.Task[None] | None = None

    def fence(self) -> None:
        self.fenced_at = self.clock.monotonic()
        self.writes_when_fenced = len(self.path.landed)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        await self.elector.acquire()
        self.leading_at = self.clock.monotonic()
        await self.elector.keep_lease(on_lost=self.fence)

    async def kill(self) -> None:
        """The process dies: no release, no more requests."""
        assert self.task is not None
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    def writes_after_fence(self) -> list[float]:
        assert self.writes_when_fenced is not None
        return self.path.landed[self.writes_when_fenced :]


async def elapse(replicas: list[Replica], seconds: float, step: float = 0.25) -> None:
    """Move every replica's clock on together, letting the event loop run between steps."""
    for _ in range(round(seconds / step)):
        for replica in replicas:
            replica.clock.advance(step)
        for _ in range(60):
            await asyncio.sleep(0)


def holder(fake: FakeKube) -> str:
    [lease] = fake.objects("coordination.k8s.io/v1", "Lease")
    return str(lease["spec"].get("holderIdentity") or "")


async def test_timings_must_leave_the_deadline_inside_the_lease() -> None:
    fake = FakeKube()
    for duration, deadline, retry in ((15, 15, 2), (15, 10, 10), (10, 15, 2)):
        with pytest.raises(ValueError, match="retry period < renew deadline < lease"):
            LeaderElector(
                fake,
                namespace="default",
                name="lease",
                identity="a",
                lease_duration=duration,
                renew_deadline=deadline,
                retry_period=retry,
            )


async def test_slow_api_server_loses_the_lease_at_the_renew_deadline_and_fences_first() -> None:
    fake = FakeKube()
    leader, follower = Replica(fake, "a"), Replica(fake, "b")
    leader.start()
    await elapse([leader, follower], 0.5)
    assert leader.leading_at is not None
    follower.start()
    await elapse([leader, follower], 4)
    assert holder(fake) == "a"
    assert follower.leading_at is None
    # Every request of the leader now takes 5 s to be served: a renewal (GET, then PUT)
    # cannot finish within the 10 s deadline.
    leader.path.delay = 5.0
    last_renewal = leader.path.landed[-1]
    await elapse([leader, follower], 30)
    assert leader.task is not None
    assert leader.task.done()
    with pytest.raises(LostLease, match="not renewed within 10s"):
        leader.task.result()
    assert leader.fenced_at is not None
    # Cut off at the deadline, not when the slow request would have answered.
    assert leader.fenced_at <= last_renewal + 10 + 0.5
    assert leader.writes_after_fence() == []
    # The follower took over only after the lease had run out, and after the fence.
    assert follower.leading_at is not None
    assert follower.leading_at >= last_renewal + 15
    assert follower.leading_at > leader.fenced_at
    assert holder(fake) == "b"
    await follower.kill()


@pytest.mark.parametrize("skew", [3600.0, -3600.0])
async def test_skewed_follower_neither_takes_a_live_lease_nor_waits_on_a_dead_one(
    skew: float,
) -> None:
    fake = FakeKube()
    leader, follower = Replica(fake, "a"), Replica(fake, "b", skew=skew)
    leader.start()
    await elapse([leader, follower], 0.5)
    follower.start()
    await elapse([leader, follower], 60)
    assert holder(fake) == "a"
    assert follower.leading_at is None
    await leader.kill()
    died = leader.clock.monotonic()
    last_renewal = leader.path.landed[-1]
    await elapse([leader, follower], 20)
    assert holder(fake) == "b"
    assert follower.leading_at is not None
    assert last_renewal + 15 <= follower.leading_at <= died + 15 + 2 + 0.5
    await follower.kill()


async def test_a_short_429_storm_keeps_the_lease() -> None:
    fake = FakeKube()
    leader, follower = Replica(fake, "a"), Replica(fake, "b")
    leader.start()
    await elapse([leader, follower], 0.5)
    follower.start()
    await elapse([leader, follower], 3)
    # Six seconds of 429 (Retry-After 1) for the leader: renewals fail or come late, but
    # one succeeds before the deadline.
    leader.path.storm_until = leader.clock.monotonic() + 6
    await elapse([leader, follower], 30)
    assert leader.fenced_at is None
    assert leader.task is not None
    assert not leader.task.done()
    assert holder(fake) == "a"
    assert follower.leading_at is None
    await leader.kill()
    await follower.kill()


async def test_a_long_429_storm_fences_at_the_deadline_and_the_follower_waits_it_out() -> None:
    fake = FakeKube()
    leader, follower = Replica(fake, "a"), Replica(fake, "b")
    leader.start()
    await elapse([leader, follower], 0.5)
    follower.start()
    await elapse([leader, follower], 3)
    last_renewal = leader.path.landed[-1]
    # Both get 429 with Retry-After 10 for 40 s: a request would take 50 s at the client.
    for replica in (leader, follower):
        replica.path.retry_after = 10.0
        replica.path.storm_until = replica.clock.monotonic() + 40
    await elapse([leader, follower], 15)
    assert leader.fenced_at is not None
    assert leader.fenced_at <= last_renewal + 10 + 0.5
    assert leader.task is not None
    with pytest.raises(LostLease, match="not renewed within 10s"):
        leader.task.result()
    assert holder(fake) == "a"  # nobody could write it; nobody took it
    await elapse([leader, follower], 60)
    assert leader.writes_after_fence() == []
    assert holder(fake) == "b"
    assert follower.leading_at is not None
    assert follower.leading_at >= last_renewal + 40
    await follower.kill()


async def test_released_lease_is_taken_at_once_and_a_lost_one_is_not_released() -> None:
    fake = FakeKube()
    leader, follower = Replica(fake, "a"), Replica(fake, "b")
    leader.start()
    await elapse([leader, follower], 0.5)
    follower.start()
    await elapse([leader, follower], 3)
    await leader.kill()
    await leader.elector.release()
    assert holder(fake) == ""
    await elapse([leader, follower], 2.5)
    assert holder(fake) == "b"
    # `a` never held it again: it is not its to release.
    await leader.elector.release()
    assert holder(fake) == "b"
    follower.elector.lost = True
    await follower.elector.release()
    assert holder(fake) == "b"
    await follower.kill()


async def test_lease_of_another_holder_found_while_renewing_is_lost_at_once() -> None:
    fake = FakeKube()
    leader = Replica(fake, "a")
    leader.start()
    await elapse([leader], 0.5)
    [lease] = fake.objects("coordination.k8s.io/v1", "Lease")
    lease["spec"]["holderIdentity"] = "intruder"
    await fake.replace(LEASES, "default", "lease", lease)
    await elapse([leader], 2.5)
    assert leader.task is not None
    assert leader.task.done()
    with pytest.raises(LostLease, match="taken by another replica"):
        leader.task.result()
    assert leader.writes_after_fence() == []
    assert holder(fake) == "intruder"


def test_config_keeps_the_renew_deadline_inside_the_lease() -> None:
    from dispatcher.config import Config

    defaults = Config()
    assert (
        defaults.lease_duration_seconds,
        defaults.lease_renew_deadline_seconds,
        defaults.lease_retry_period_seconds,
    ) == (15.0, 10.0, 2.0)
    with pytest.raises(ValueError, match="lease timings"):
        Config(lease_duration_seconds=10, lease_renew_deadline_seconds=10)
