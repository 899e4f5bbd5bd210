"""Leader election over a coordination.k8s.io/v1 Lease, so replicas never dispatch twice.

Side effects: reads and writes one Lease on the hub.

Only the holder runs the dispatcher. The holder renews every `renew_every` seconds; a
replica takes over once `renewTime + leaseDurationSeconds` has passed. A holder that cannot
renew within the lease duration gives up (raises LostLease) and the process exits, because
another replica may already be dispatching (crash-only, as controller-runtime does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import AlreadyExists, Conflict, KubeError, NotFound

LEASES = ResourceInfo("coordination.k8s.io/v1", "Lease", "leases", namespaced=True)


class LostLease(Exception):
    """This replica could not renew its lease in time and must stop dispatching."""


def _micro(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str | None) -> float:
    if not text:
        return 0.0
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class LeaderElector:
    def __init__(
        self,
        client: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        renew_every: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_every = renew_every
        self.clock = clock
        self.log = structlog.get_logger("leader").bind(
            lease=f"{namespace}/{name}", identity=identity
        )

    def _spec(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        now = _micro(self.clock())
        spec = dict(previous or {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if previous else 0
            )
        spec.update(
            holderIdentity=self.identity, leaseDurationSeconds=self.lease_seconds, renewTime=now
        )
        return spec

    async def try_acquire(self) -> bool:
        """One attempt to take or renew the lease; True when we hold it afterwards."""
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
                await self.client.create(LEASES, self.namespace, body)
                return True
            except AlreadyExists:
                return False
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        expires = _parse(spec.get("renewTime")) + float(spec.get("leaseDurationSeconds") or 0)
        if holder and holder != self.identity and expires > self.clock():
            return False
        lease["spec"] = self._spec(spec)
        try:
            await self.client.replace(LEASES, self.namespace, self.name, lease)
        except Conflict:
            return False
        return True

    async def acquire(self) -> None:
        """Wait until this replica holds the lease."""
        while True:
            try:
                if await self.try_acquire():
                    self.log.info("leader_elected")
                    return
            except KubeError as exc:
                self.log.warning("lease_unavailable", error=str(exc)[:200])
            await asyncio.sleep(self.renew_every)

    async def hold(self) -> None:
        """Renew until cancelled; raise LostLease when a renewal has not succeeded in time."""
        last_renewed = self.clock()
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                if await self.try_acquire():
                    last_renewed = self.clock()
                    continue
                raise LostLease(f"lease {self.namespace}/{self.name} taken by another replica")
            except KubeError as exc:
                self.log.warning("lease_renewal_failed", error=str(exc)[:200])
            if self.clock() - last_renewed > self.lease_seconds:
                raise LostLease(f"could not renew lease for {self.lease_seconds}s")

    async def release(self) -> None:
        """Give the lease up at shutdown so another replica takes over at once."""
        try:
            lease = await self.client.get(LEASES, self.namespace, self.name)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"]["holderIdentity"] = ""
            lease["spec"]["renewTime"] = _micro(0)
            await self.client.replace(LEASES, self.namespace, self.name, lease)
        except KubeError as exc:
            self.log.warning("lease_release_failed", error=str(exc)[:200])
