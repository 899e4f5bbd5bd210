"""Hops of one AppWrapper's life: reconciles, scheduler cycles and status writes it costs.

    python -m benchmarks.hops_bench [--runs 3] [--out benchmarks/results/hops.json]

Two samples, each alone on a fresh dispatcher (run in this process) per run, on one local
control plane with KubeRay and KWOK nodes (the demo's nodes):

- `job`: samples/job-completion.yaml, apply -> Completed;
- `ray`: samples/ray-glue-1.yaml (the demo's), apply -> Running, then `kubectl delete` ->
  gone.

Counted per AppWrapper, by wrapping the dispatcher in this process:
- reconciles: calls of `Reconciler.reconcile` for its key; "idle" ones made no mutating
  request (no create, update, patch or delete: no status write, no finalizer, no object);
- cycles: scheduler cycles whose pending list held it (calls of `core.scheduling.schedule`);
- empty cycles: cycles that found nothing pending (any key; one sample runs at a time);
- writes: successful `PUT .../appwrappers/NAME/status` (conflicts counted apart).

"hops" = reconciles + cycles + empty cycles, the way the issue counted them. Each figure
is given up to the end of the life (the Completed status write; the AppWrapper gone) and
for what trails it (counted until nothing moves for a few seconds). The manager's own
counters (`Manager.finished` for the Job, the per-key counters just before the delete for
the RayCluster) are recorded beside them as a check.

The measuring part (`measure`) takes the function that instruments a dispatcher, so the
same procedure can measure another version of the controller.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import functools
import re
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import report
from benchmarks.report import save
from dispatcher.api.constants import API_VERSION, KIND, PLURAL
from dispatcher.app import running
from dispatcher.config import Config
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import Conflict, NotFound
from testenv.converter import install_appwrapper_crd
from testenv.localcluster import REPO_ROOT, LocalCluster, ensure_binaries

if TYPE_CHECKING:
    from dispatcher.controller.manager import Manager

APPWRAPPERS = ResourceInfo(API_VERSION, KIND, PLURAL, True)
PODS = ResourceInfo("v1", "Pod", "pods", True)
NAMESPACE = "hops"
SETTLE_SECONDS = 5.0
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
STATUS_PATH = re.compile(rf"/namespaces/([^/]+)/{PLURAL}/([^/]+)/status$")
KINDS = ("reconciles", "idle_reconciles", "cycles", "empty_cycles", "writes", "conflicts")


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    file: str
    appwrapper: str
    ends: str
    """"Completed": its life ends with that condition; "deleted": apply, Running, delete."""


SAMPLES = (
    Sample("job", "job-completion.yaml", "job-completion", "Completed"),
    Sample("ray", "ray-glue-1.yaml", "glue-1", "deleted"),
)


class _Acting:
    """What one reconcile did: set when it sends a mutating request."""

    __slots__ = ("mutated",)

    def __init__(self) -> None:
        self.mutated = False


# The reconcile running in this task (and in tasks it starts: they copy the context).
_acting: contextvars.ContextVar[_Acting | None] = contextvars.ContextVar("acting", default=None)


@dataclass
class Probe:
    """Timestamped hops, by key ("" for empty cycles)."""

    events: list[tuple[float, str, str]] = field(default_factory=list)
    completed_at: dict[str, float] = field(default_factory=dict)
    """Key -> when its status was first written with Completed=True."""

    def note(self, key: str, kind: str, at: float | None = None) -> None:
        self.events.append((time.monotonic() if at is None else at, key, kind))

    def count(self, key: str, since: float, until: float) -> dict[str, int]:
        counts: Counter[str] = Counter(
            kind for t, k, kind in self.events if since <= t <= until and k in (key, "")
        )
        figures = {kind: counts[kind] for kind in KINDS}
        figures["hops"] = counts["reconciles"] + counts["cycles"] + counts["empty_cycles"]
        return figures

    def last_event(self) -> float:
        return max((t for t, _, _ in self.events), default=0.0)

    # -- wrappers ---------------------------------------------------------------------------

    def reconcile(
        self, reconcile: Callable[[str], Awaitable[Any]]
    ) -> Callable[[str], Awaitable[Any]]:
        """Wrap a reconcile function of one key: count it (when it starts, as the manager
        does), and whether it did anything."""

        async def counted(key: str) -> Any:
            acting = _Acting()
            token = _acting.set(acting)
            started = time.monotonic()
            self.note(key, "reconciles", started)
            try:
                return await reconcile(key)
            finally:
                _acting.reset(token)
                if not acting.mutated:
                    self.note(key, "idle_reconciles", started)

        return counted

    def schedule(self, schedule: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap `core.scheduling.schedule`: one cycle for every key pending in it."""

        def counted(pending: list[Any], *args: Any, **kwargs: Any) -> Any:
            for workload in pending:
                self.note(workload.key, "cycles")
            if not pending:
                self.note("", "empty_cycles")  # a cycle ran, all its work parked
            return schedule(pending, *args, **kwargs)

        return counted

    @contextlib.contextmanager
    def requests(self) -> Any:
        """Patch `KubeClient.request` (the one door to the API server) for the duration."""
        original = KubeClient.request
        probe = self

        async def request(client: KubeClient, method: str, path: str, **kwargs: Any) -> Any:
            acting = _acting.get()
            if acting is not None and method in MUTATING:
                acting.mutated = True
            status_write = STATUS_PATH.search(path) if method == "PUT" else None
            try:
                result = await original(client, method, path, **kwargs)
            except Exception as exc:
                if status_write and isinstance(exc, Conflict):
                    probe.note(f"{status_write[1]}/{status_write[2]}", "conflicts")
                raise
            if status_write:
                key = f"{status_write[1]}/{status_write[2]}"
                probe.note(key, "writes")
                conditions = ((kwargs.get("body") or {}).get("status") or {}).get("conditions")
                if key not in probe.completed_at and any(
                    c.get("type") == "Completed" and c.get("status") == "True"
                    for c in conditions or []
                ):
                    probe.completed_at[key] = time.monotonic()
            return result

        KubeClient.request = request  # type: ignore[method-assign, assignment]
        try:
            yield self
        finally:
            KubeClient.request = original  # type: ignore[method-assign]


_saved: dict[str, Any] = {}


def instrument_manager(_manager: Manager | None, probe: Probe) -> None:
    """The controller with the queue manager: wrap `Reconciler.reconcile` (on the class:
    the workers hold the bound method from their start) and the `schedule` that
    `core.queues.take` calls (the scheduler skips the cycle when nothing is queued; one
    whose work is all parked calls it with none: an empty cycle)."""
    from dispatcher.controller.lifecycle.reconciler import Reconciler
    from dispatcher.core.queues import taking

    reconcile = _saved.setdefault("reconcile", Reconciler.reconcile)

    async def counted(self: Reconciler, key: str) -> Any:
        return await probe.reconcile(functools.partial(reconcile, self))(key)

    Reconciler.reconcile = counted  # type: ignore[method-assign]
    # The name `take` calls, as imported into its module.
    original = _saved.setdefault("schedule", taking.__dict__["schedule"])
    taking.__dict__["schedule"] = probe.schedule(original)


def uninstrument_manager() -> None:
    from dispatcher.controller.lifecycle.reconciler import Reconciler
    from dispatcher.core.queues import taking

    if "reconcile" in _saved:
        Reconciler.reconcile = _saved.pop("reconcile")  # type: ignore[method-assign]
    if "schedule" in _saved:
        taking.__dict__["schedule"] = _saved.pop("schedule")


def manager_counters(manager: Manager, key: str) -> dict[str, int]:
    """The manager's own per-key counters (while the AppWrapper is alive)."""
    return {
        "reconciles": manager.reconciles[key],
        "cycles": manager.scheduler.considered[key],
        "writes": manager.status.writes[key],
    }


def manager_finished(manager: Manager) -> dict[str, int]:
    return dict(manager.finished)


@dataclass
class Hooks:
    """How to instrument, and read, one version of the controller."""

    instrument: Callable[[Any, Probe], None]
    """Called before the dispatcher starts (its first argument None): it patches classes and
    modules, not the running instance."""
    uninstrument: Callable[[], None]
    counters: Callable[[Any, str], dict[str, int]] | None = None
    finished: Callable[[Any], dict[str, int]] | None = None


NEW_CODE = Hooks(instrument_manager, uninstrument_manager, manager_counters, manager_finished)


async def _condition(client: KubeClient, name: str, type_: str) -> bool | None:
    """The condition's truth; None once the AppWrapper is gone."""
    try:
        obj = await client.get(APPWRAPPERS, NAMESPACE, name)
    except NotFound:
        return None
    return any(
        c.get("type") == type_ and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.1)


async def _settle(probe: Probe, quiet: float = SETTLE_SECONDS, timeout: float = 60) -> float:
    """Wait until no hop was counted for `quiet` seconds; when the last one was."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if time.monotonic() - probe.last_event() >= quiet:
            break
        await asyncio.sleep(0.2)
    return time.monotonic()


async def _gone(cluster: LocalCluster, client: KubeClient, sample: Sample) -> None:
    """Delete the AppWrapper if there, and wait until it, its objects and pods are gone."""
    await cluster.akubectl(
        "delete", "aw", sample.appwrapper, "-n", NAMESPACE, "--ignore-not-found", "--wait=false"
    )

    async def clean() -> bool:
        if await _condition(client, sample.appwrapper, "Completed") is not None:
            return False
        pods = await client.list(PODS, NAMESPACE)
        return not pods.get("items")

    await _until(clean, f"{sample.appwrapper} and its pods gone", 180)


async def one_life(
    cluster: LocalCluster, client: KubeClient, sample: Sample, hooks: Hooks
) -> dict[str, Any]:
    """Apply the sample on a fresh dispatcher and count its hops until the life's end."""
    key = f"{NAMESPACE}/{sample.appwrapper}"
    probe = Probe()
    result: dict[str, Any] = {}
    config = Config(
        kubeconfig=str(cluster.kubeconfig),
        health_port=0,
        log_level="warning",
        unattributed="allow",
    )
    with probe.requests():
        # Before the start: the workers hold the reconcile function from then on.
        hooks.instrument(None, probe)
        async with running(config) as dispatcher:
            try:
                await asyncio.sleep(1)
                await _settle(probe, quiet=1.0)  # the start-up cycle is not the sample's
                started = time.monotonic()
                await cluster.akubectl(
                    "apply", "-n", NAMESPACE, "-f", str(REPO_ROOT / "samples" / sample.file)
                )
                if sample.ends == "Completed":

                    async def completed() -> bool:
                        return bool(await _condition(client, sample.appwrapper, "Completed"))

                    await _until(completed, f"{key} Completed", 300)
                    ended = probe.completed_at.get(key, time.monotonic())
                    if hooks.finished is not None:
                        finished = hooks.finished

                        async def counted() -> bool:
                            return finished(dispatcher).get("count", 0) >= 1

                        await _until(counted, "its hops counted", 30)
                        result["manager"] = finished(dispatcher)
                else:

                    async def running_() -> bool:
                        return bool(await _condition(client, sample.appwrapper, "Running"))

                    await _until(running_, f"{key} Running", 300)
                    result["seconds_to_running"] = round(time.monotonic() - started, 2)
                    # Let the Running write's answer reach the dispatcher before reading.
                    await _settle(probe, quiet=1.0)
                    if hooks.counters is not None:
                        result["manager"] = hooks.counters(dispatcher, key)
                    result["at_delete"] = probe.count(key, started, time.monotonic())
                    await cluster.akubectl(
                        "delete", "aw", sample.appwrapper, "-n", NAMESPACE, "--wait=false"
                    )

                    async def gone() -> bool:
                        return await _condition(client, sample.appwrapper, "Running") is None

                    await _until(gone, f"{key} gone", 300)
                    ended = time.monotonic()
                settled = await _settle(probe)
                result["seconds"] = round(ended - started, 2)
                result["life"] = probe.count(key, started, ended)
                result["trailing"] = probe.count(key, ended + 1e-9, settled)
                result["timeline"] = [
                    (round(t - started, 3), kind)
                    for t, k, kind in probe.events
                    if t >= started and k in (key, "")
                ]
                await _gone(cluster, client, sample)
            finally:
                hooks.uninstrument()
    return result


def _median_range(values: list[int]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for part in ("life", "trailing"):
        summary[part] = {
            kind: _median_range([run[part][kind] for run in runs]) for kind in (*KINDS, "hops")
        }
    return summary


async def measure(
    workdir: Path, hooks: Hooks, runs: int, samples: tuple[Sample, ...] = SAMPLES
) -> dict[str, Any]:
    """Start a cluster (the demo's nodes), run each sample `runs` times, stop it."""
    cluster = LocalCluster.start("hops", workdir, binaries=ensure_binaries(), kuberay=True)
    result: dict[str, Any] = {}
    try:
        for index in (1, 2, 3):
            cluster.add_node(f"gpu-node-{index}", cpu="8", memory="40Gi", gpu=2)
        cluster.add_node("cpu-node", cpu="8", memory="32Gi")
        cluster.wait_nodes_ready(["gpu-node-1", "gpu-node-2", "gpu-node-3", "cpu-node"])
        install_appwrapper_crd(cluster)
        cluster.kubectl(
            "wait",
            "--for=condition=Established",
            f"crd/{PLURAL}.{API_VERSION.split('/')[0]}",
            "--timeout=60s",
        )
        cluster.kubectl("create", "namespace", NAMESPACE)
        await asyncio.sleep(2)  # let the CRD's discovery settle (as e2e_bench does)
        client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig))
        try:
            for sample in samples:
                lives = []
                for run in range(runs):
                    life = await one_life(cluster, client, sample, hooks)
                    print(f"{sample.name} run {run + 1}: {_line(life)}", flush=True)
                    lives.append(life)
                result[sample.name] = {
                    "file": sample.file,
                    "ends": sample.ends,
                    "runs": lives,
                    "summary": summarize(lives),
                }
        finally:
            await client.close()
    finally:
        cluster.stop()
    return result


def _line(life: dict[str, Any]) -> str:
    figures = life["life"]
    text = ", ".join(f"{kind}={figures[kind]}" for kind in (*KINDS, "hops"))
    trailing = {k: v for k, v in life["trailing"].items() if v}
    if trailing:
        text += f"; after its end: {trailing}"
    if "manager" in life:
        text += f"; manager: {life['manager']}"
    return text


def table(result: dict[str, Any]) -> str:
    rows = [
        f"{'sample':<8}{'figure':<17}{'median':>8}{'range':>10}{'trailing (median)':>19}",
    ]
    for name, sample in result.items():
        if not isinstance(sample, dict) or "summary" not in sample:
            continue
        for kind in ("hops", *KINDS):
            life = sample["summary"]["life"][kind]
            trailing = sample["summary"]["trailing"][kind]
            spread = f"{life['min']:g}-{life['max']:g}"
            rows.append(
                f"{name:<8}{kind:<17}{life['median']:>8g}{spread:>10}{trailing['median']:>19g}"
            )
    return "\n".join(rows)


def main(hooks: Hooks = NEW_CODE, default_out: str = "benchmarks/results/hops.json") -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sample", choices=[s.name for s in SAMPLES], action="append")
    parser.add_argument("--out", type=Path, default=Path(default_out))
    parser.add_argument(
        "--workdir", type=Path, help="keep the cluster's logs here (default: a temporary one)"
    )
    args = parser.parse_args()
    samples = tuple(s for s in SAMPLES if not args.sample or s.name in args.sample)
    with contextlib.ExitStack() as stack:
        workdir = report.workdir(stack, args.workdir, "aw-hops-")
        result = asyncio.run(measure(workdir, hooks, args.runs, samples))
    print(table(result))
    save(result, args.out)


if __name__ == "__main__":
    main()
