"""Leader election over a coordination.k8s.io/v1 Lease, so replicas never dispatch twice.

Side effects: reads and writes one Lease on the hub.

The rules are client-go's:
- the holder renews every `retry_period`; each attempt is cut off at the renew deadline
  (`renew_deadline` after the start of the last attempt that succeeded), however long the
  API server takes to answer or keeps answering 429. Missing the deadline loses the lease:
  `on_lost` is called at that instant (the caller fences every write) and LostLease raised;
- a follower never compares the holder's `renewTime` with its own clock (another machine's
  clock may be off by any amount). It notes when it saw the record change on its own
  monotonic clock, and takes over only once the record has stayed the same for
  `leaseDurationSeconds` of that clock;
- the renew deadline is shorter than the lease, so the old holder has stopped writing before
  any follower can count the lease as expired: the deadline runs from when the renewal was
  sent, and a follower's count from when it saw the renewal, necessarily later.

Times are read from a `Clock` (monotonic) and waits go through its `sleep`, so tests drive
both with `ManualClock`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import structlog

from dispatcher.clock import Clock, SystemClock
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import AlreadyExists, Conflict, KubeError, NotFound

LEASES = ResourceInfo("coordination.k8s.io/v1", "Lease", "leases", namespaced=True)
T = TypeVar("T")


class LostLease(Exception):
    """This replica could not renew its lease in time and must stop dispatching."""


def _micro(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(lease: dict[str, Any]) -> tuple[str, ...]:
    """What identifies one version of the lease record: any change is a sign of life."""
    spec = lease.get("spec") or {}
    return (
        str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        str(spec.get("holderIdentity") or ""),
        str(spec.get("renewTime") or ""),
        str(spec.get("acquireTime") or ""),
        str(spec.get("leaseTransitions") or ""),
    )


class LeaderElector:
    def __init__(
        self,
        client: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Clock | None = None,
    ) -> None:
        if not 0 < retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock or SystemClock()
        self._observed: tuple[str, ...] | None = None
        self._observed_at = 0.0
        """Monotonic time this process saw the record as `_observed` for the first time."""
        self._holder_seen = ""
        self._renewed_at: float | None = None
        """Monotonic time the last attempt that left us holding the lease was started."""
        self.lost = False
        self.log = structlog.get_logger("leader").bind(
            lease=f"{namespace}/{name}", identity=identity
        )

    # -- one attempt ------------------------------------------------------------------------

    def _observe(self, lease: dict[str, Any]) -> None:
        record = _record(lease)
        holder = str((lease.get("spec") or {}).get("holderIdentity") or "")
        if holder != self._holder_seen and holder and holder != self.identity:
            # Once per holder: which replica a standby waits on (operators, and tests that
            # need the standby to have read the Lease, look for it).
            self.log.info("standing_by", holder=holder)
        self._holder_seen = holder
        if record != self._observed:
            self._observed = record
            self._observed_at = self.clock.monotonic()

    def _duration_of(self, spec: dict[str, Any]) -> float:
        """The holder's own lease duration; ours when it wrote none we can read."""
        try:
            seconds = float(spec.get("leaseDurationSeconds") or 0)
        except (TypeError, ValueError):
            seconds = 0.0
        return seconds if seconds > 0 else self.lease_duration

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        # renewTime and acquireTime are for people reading the Lease; no replica's decision
        # depends on them (clocks differ between machines).
        now = _micro(self.clock.time())
        spec = dict(previous or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if previous else 0
            )
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.lease_duration)),
            renewTime=now,
        )
        return spec

    async def try_acquire(self, *, renewing: bool = False) -> bool:
        """One attempt to take or renew the lease; True when we hold it afterwards.

        False when another replica holds it: as a follower, one seen alive within its lease
        duration; while `renewing`, any other holder (it has taken the lease from us).
        Conflict and other API errors are raised: the attempt told nothing."""
        try:
            lease = await self.client.get(LEASES, self.namespace, self.name)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(None),
            }
            try:
                created = await self.client.create(LEASES, self.namespace, body)
            except AlreadyExists:
                return False
            self._observe(created)
            return True
        self._observe(lease)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        if holder and holder != self.identity:
            if renewing:
                return False
            alive_until = self._observed_at + self._duration_of(spec)
            if self.clock.monotonic() < alive_until:
                return False
        lease["spec"] = self._spec(spec)
        # Guarded by the resourceVersion just read: of two replicas taking over at once, one
        # gets Conflict.
        written = await self.client.replace(LEASES, self.namespace, self.name, lease)
        self._observe(written)
        return True

    async def _within(self, seconds: float, attempt: Coroutine[Any, Any, T]) -> T:
        """`attempt`, cancelled after `seconds` (TimeoutError) of the clock."""
        task = asyncio.ensure_future(attempt)
        timer = asyncio.ensure_future(self.clock.sleep(max(seconds, 0.0)))
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # we were cancelled: so is the attempt
            task.cancel()
            raise
        finally:
            timer.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise TimeoutError(f"no answer within {seconds:.1f}s")

    # -- the loops --------------------------------------------------------------------------

    async def acquire(self) -> None:
        """Wait until this replica holds the lease."""
        while True:
            started = self.clock.monotonic()
            try:
                # Bounded like a renewal: the hold that follows counts from this start.
                if await self._within(self.renew_deadline, self.try_acquire()):
                    self._renewed_at = started
                    self.lost = False
                    self.log.info("leader_elected")
                    return
            except Conflict:
                pass  # another replica wrote it first; look again
            except (KubeError, TimeoutError) as exc:
                self.log.warning("lease_unavailable", error=str(exc)[:200])
            await self.clock.sleep(self.retry_period)

    async def keep_lease(self, on_lost: Callable[[], None] = lambda: None) -> None:
        """Renew until cancelled. When the lease is lost (taken, or not renewed by the renew
        deadline), call `on_lost` at once, before any other task can run, then raise
        LostLease."""
        if self._renewed_at is None:
            raise RuntimeError("hold() before acquire()")
        renewed_at = self._renewed_at
        while True:
            deadline = renewed_at + self.renew_deadline
            await self.clock.sleep(
                min(self.retry_period, max(0.0, deadline - self.clock.monotonic()))
            )
            started = self.clock.monotonic()
            try:
                if started >= deadline:
                    raise TimeoutError("renew deadline passed")
                held = await self._within(deadline - started, self.try_acquire(renewing=True))
            except TimeoutError:
                self._lose(on_lost, f"lease not renewed within {self.renew_deadline:g}s")
            except KubeError as exc:
                # Including Conflict: the next attempt reads the lease again and tells
                # whether someone else took it.
                self.log.warning("lease_renewal_failed", error=str(exc)[:200])
                continue
            if not held:
                self._lose(on_lost, "lease taken by another replica")
            self._renewed_at = renewed_at = started

    def _lose(self, on_lost: Callable[[], None], why: str) -> NoReturn:
        self.lost = True
        on_lost()
        self.log.error("leader_lost", reason=why)
        raise LostLease(f"lease {self.namespace}/{self.name}: {why}")

    async def release(self) -> None:
        """Give the lease up at a clean shutdown so another replica takes over at once. Not
        after losing it: then this replica writes nothing more."""
        if self.lost or self._renewed_at is None:
            return
        try:
            await self._within(self.renew_deadline, self._release())
        except (KubeError, TimeoutError) as exc:
            self.log.warning("lease_release_failed", error=str(exc)[:200])

    async def _release(self) -> None:
        lease = await self.client.get(LEASES, self.namespace, self.name)
        if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        lease["spec"]["holderIdentity"] = ""
        lease["spec"]["renewTime"] = _micro(0)
        await self.client.replace(LEASES, self.namespace, self.name, lease)
