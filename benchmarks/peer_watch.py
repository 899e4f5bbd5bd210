"""What the peer benchmark watches during a run: admissions, finished Jobs, pods, processes.

Where it sits: benchmarks.peer_scenarios starts a `Recorder` on the benchmark namespace before
the work arrives and reads its records; benchmarks.peer_measure turns them into figures. Every
time here is this machine's clock when the watch event arrived, so every system is timed the
same way.

Side effects: watches (list + watch) through the client given; `tree_stats` reads /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.peer_measure import PodSample, PodState, gang_of, pod_state
from benchmarks.peer_systems import JOBS, NAMESPACE, PODS
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.informer import Informer

Obj = dict[str, Any]


def job_finished(job: Obj) -> bool:
    """A Job with its Complete (or Failed) condition True."""
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


class Recorder:
    """Watches the benchmark namespace: when each workload was first seen admitted, when each
    Job finished, and every change of a pod's state (`samples`, for overcommits and gangs)."""

    def __init__(
        self,
        client: KubeClient,
        workloads: Sequence[ResourceInfo],
        admitted: Callable[[Obj], bool],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        selector = f"metadata.namespace={NAMESPACE}"
        self._clock = clock
        self._admitted = admitted
        self.admitted: dict[str, float] = {}
        self.finished: dict[str, float] = {}
        self.samples: list[PodSample] = []
        self.placed: dict[str, set[str]] = {}
        """gang -> its pods placed now."""
        self._last: dict[str, PodState] = {}
        self.changed = asyncio.Event()
        self._informers: list[Informer] = []
        for info in [*workloads, *([] if JOBS in workloads else [JOBS]), PODS]:
            informer = Informer(client, info, field_selector=selector)
            if info in workloads:
                informer.add_handler(self._on_workload)
            if info == JOBS:
                informer.add_handler(self._on_job)
            if info == PODS:
                informer.add_handler(self._on_pod)
            self._informers.append(informer)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Watch, and return once every cache has synced."""
        self._tasks = [asyncio.create_task(i.run()) for i in self._informers]
        await asyncio.gather(*(i.synced.wait() for i in self._informers))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _on_workload(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        name = new["metadata"]["name"]
        if name not in self.admitted and self._admitted(new):
            self.admitted[name] = self._clock()
            self.changed.set()

    def _on_job(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            return
        name = new["metadata"]["name"]
        if name not in self.finished and job_finished(new):
            self.finished[name] = self._clock()
            self.changed.set()

    def _on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        pod = new if new is not None else old
        if pod is None:
            return
        name = pod["metadata"]["name"]
        state = PodState.GONE if new is None else pod_state(new)
        if self._last.get(name) is state:
            return
        self._last[name] = state
        gang = gang_of(pod)
        self.samples.append(PodSample(self._clock(), name, gang, state))
        placed = self.placed.setdefault(gang, set())
        if state is PodState.PLACED:
            placed.add(name)
        else:
            placed.discard(name)
        self.changed.set()

    async def wait_changed(self, timeout: float) -> None:
        """Until something was recorded, or `timeout` seconds."""
        self.changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)


class AuditTail:
    """An audit log (JSON lines) read as it grows: each `read()` parses the lines completed
    since the last one; `events` holds all read so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.events: list[Obj] = []

    def read(self) -> list[Obj]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        new = []
        for line in complete.splitlines():
            with contextlib.suppress(ValueError):
                new.append(json.loads(line))
        self.events.extend(new)
        return new


def tree_stats(pid: int) -> dict[str, float]:
    """CPU seconds and RSS (MB) of a process and its live descendants (with the CPU of the
    children it reaped), and its own peak RSS."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
            stats[int(entry.name)] = fields
    family = {pid}
    grew = True
    while grew:
        grew = False
        for child, parent in parents.items():
            if parent in family and child not in family:
                family.add(child)
                grew = True
    cpu = 0.0
    rss = 0.0
    peak = 0.0
    for member in family & set(stats):
        fields = stats[member]
        cpu += (int(fields[11]) + int(fields[12])) / ticks
        if member == pid:
            cpu += (int(fields[13]) + int(fields[14])) / ticks
        with contextlib.suppress(OSError, KeyError):
            status = Path(f"/proc/{member}/status").read_text()
            values = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            rss += int(values["VmRSS"].split()[0]) / 1024
            if member == pid:
                peak = int(values["VmHWM"].split()[0]) / 1024
    return {"cpu_seconds": cpu, "rss_mb": rss, "peak_rss_mb": peak}
