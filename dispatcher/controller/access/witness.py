"""The record witness: whether the dispatcher's MutatingWebhookConfiguration was in place
when each AppWrapper's spec was stored, so that a creator record obtained from the webhook
port by someone else than the API server is not honoured (the rule:
dispatcher.core.recordtime).

Side effects: reads one MutatingWebhookConfiguration by name in the hub: in the background
soon after AppWrappers arrive (at most one read per `min_interval` of its clock), and before
a dispatch that no read after its AppWrapper's arrival covers yet.

What it knows lives in memory: which version of each AppWrapper arrived when (in the order
of its own counter, no clock), and the latest read of each configuration it saw. A leader
that starts while the configuration is absent can prove no record until it is back, and
then only records signed after it was made again.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import structlog

from dispatcher.clock import Clock
from dispatcher.core.gatekeeping import SIGNATURE
from dispatcher.core.recordtime import Read, record_time_problem, timestamp
from dispatcher.kube.api import KubeApi
from dispatcher.kube.certs import MUTATING
from dispatcher.kube.errors import KubeError, NotFound

RECEIVED_LIMIT = 65536
"""AppWrapper versions remembered; one forgotten is taken as arriving anew (a later read is
then needed: never a proof it did not earn)."""
READS_LIMIT = 8
"""Configurations (by uid) whose latest read is kept."""


class RecordWitness:
    """Start `run()` as a task; ask `problem(obj, signed_at)` before a dispatch."""

    def __init__(
        self,
        hub: KubeApi,
        name: str,
        *,
        clock: Clock,
        min_interval: float = 1.0,
    ) -> None:
        self._hub = hub
        self.name = name
        self._min_interval = min_interval
        self._clock = clock
        self._tick = 0
        """The counter's last value: arrivals and reads are ordered by it."""
        self._in_flight: tuple[int, asyncio.Future[Read]] | None = None
        """The read under way and the tick it was issued at (shared by its waiters)."""
        self._received: OrderedDict[str, tuple[Any, Any, int]] = OrderedDict()
        """AppWrapper uid -> (generation, signature, tick when that version arrived)."""
        self._reads: OrderedDict[str, Read] = OrderedDict()
        """Configuration uid ("" when absent) -> its latest read."""
        self._wanted = asyncio.Event()
        self._log = structlog.get_logger("record_witness").bind(name=name)

    def receive(self, obj: Mapping[str, Any]) -> int:
        """Note that this version of `obj` has arrived (once per generation and signature);
        the tick it arrived at."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        version = (meta.get("generation"), (meta.get("annotations") or {}).get(SIGNATURE))
        known = self._received.get(uid)
        if known is not None and known[:2] == version:
            self._received.move_to_end(uid)
            return known[2]
        tick = self._next()
        self._received[uid] = (*version, tick)
        while len(self._received) > RECEIVED_LIMIT:
            self._received.popitem(last=False)
        self._wanted.set()
        return tick

    async def problem(self, obj: Mapping[str, Any], signed_at: int | None) -> str:
        """Why the verified record on `obj` may not be honoured ("" when it may). Reads the
        configuration when no read since `obj` arrived says."""
        received = self.receive(obj)
        meta = obj.get("metadata") or {}

        def verdict() -> str | None:
            return record_time_problem(
                meta=meta,
                signed_at=signed_at,
                received=received,
                reads=self._reads.values(),
                name=self.name,
            )

        found = verdict()
        if found is None:
            await self.read_after(received)
            found = verdict()
        return found or ""

    def _next(self) -> int:
        self._tick += 1
        return self._tick

    async def read(self) -> Read:
        """A read of the configuration issued after everything received so far."""
        return await self.read_after(self._tick)

    async def read_after(self, received: int) -> Read:
        """A read of the configuration issued after tick `received`: the one under way if it
        was, else a new one, so that dispatches that ask at once cost one GET (KubeError,
        to every waiter, when the API server does not answer)."""
        flight = self._in_flight
        if flight is None or flight[0] <= received or flight[1].done():
            issued = self._next()
            reading = asyncio.ensure_future(self._get(issued))
            # Its error is each waiter's; taken here too, for when every waiter was cancelled.
            reading.add_done_callback(lambda done: done.cancelled() or done.exception())
            flight = self._in_flight = (issued, reading)
        # Shielded: a waiter cancelled does not cancel the others' read.
        return await asyncio.shield(flight[1])

    async def _get(self, issued: int) -> Read:
        try:
            found = await self._hub.get(MUTATING, None, self.name)
        except NotFound:
            read = Read(issued)
        else:
            meta = found.get("metadata") or {}
            read = Read(
                issued,
                uid=str(meta.get("uid") or ""),
                created=timestamp(meta.get("creationTimestamp")),
                configuration=found,
            )
        self._reads.pop(read.uid, None)
        self._reads[read.uid] = read
        while len(self._reads) > READS_LIMIT:
            self._reads.popitem(last=False)
        return read

    async def run(self) -> None:
        """Read after AppWrappers arrive, so that those that wait in the queue are proved
        while the configuration is in place (an outage later does not undo the proof)."""
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.read()
            except (KubeError, OSError) as exc:
                self._wanted.set()  # try again
                self._log.warning("record_witness_read_failed", error=str(exc)[:200])
            await self._clock.sleep(self._min_interval)
