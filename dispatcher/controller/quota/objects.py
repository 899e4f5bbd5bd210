"""The quota objects: their caches, the quota tree the scheduler reads, and their status.

Side effects: watches on the hub (ClusterAppQueues, AppQueues, AppCohorts, AppFlavors,
Namespaces); status writes and Events on the quota objects.

The tree is rebuilt from the caches only after one of them changed. Status is written by
one loop, at most once a second and only where it changed: counts, usage per flavor and
resource, and the `Active` condition (False with the reason for a misconfigured or stopped
queue), with an Event when a queue turns active or inactive. A quota kind that is not
installed is an empty cache: without the CRDs the dispatcher runs as without quotas.

With the `kueue_quotas` setting, Kueue's own quota objects (`kueue.KueueSource`) are read
beside or instead of ours (`core.quota.kueue`); their status is never written here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from pydantic import ValidationError

from dispatcher.api.constants import API_VERSION, FINALIZER
from dispatcher.api.models import AppWrapperStatus
from dispatcher.api.queues import QUEUE_KINDS, parse
from dispatcher.clock import Clock
from dispatcher.config import Config
from dispatcher.controller.quota.kueue import KueueSource
from dispatcher.controller.quota.usage import Budgets, UsageHistories
from dispatcher.controller.scheduling.view import EMPTY, SchedulerView
from dispatcher.core.quota.budget import Spent
from dispatcher.core.quota.history import UsageHistory
from dispatcher.core.quota.kueue import KueueQuotas, with_kueue
from dispatcher.core.quota.model import (
    CohortSpec,
    FairSharingMode,
    Flavor,
    QuotaSetup,
    StopPolicy,
)
from dispatcher.core.quota.read import setup_of
from dispatcher.core.quota.resolve import Queued, resolve
from dispatcher.core.quota.summary import QueueSummary, summarize
from dispatcher.core.quota.tree import QuotaTree, TreeNode
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError, NotFound
from dispatcher.kube.events import EventRecorder
from dispatcher.kube.informer import Informer
from dispatcher.metrics.view import TOP_USERS, QueueFigures

Obj = dict[str, Any]
INFOS = {
    kind: ResourceInfo(API_VERSION, kind, plural, namespaced=kind == "AppQueue")
    for kind, plural in QUEUE_KINDS.items()
}
NAMESPACES = ResourceInfo("v1", "Namespace", "namespaces", namespaced=False)
STATUS_EVERY_SECONDS = 1.0

PublishedView = Callable[[], SchedulerView]
"""What the last scheduling cycle left: the charges held, the pending workloads, each
admitted one's AppQueue, the requeued ones still charged while their pods go."""


class QuotaLookup(Protocol):
    """What the reconciler asks about a dispatched AppWrapper's admission."""

    def flavors_of(self, status: AppWrapperStatus) -> list[tuple[Flavor, tuple[str, ...]]]:
        """Its admission's flavors, to put into its pod templates."""
        ...

    def draining(self, status: AppWrapperStatus) -> str:
        """Why its queue evicts it (stopPolicy HoldAndDrain), or ""."""
        ...


class _NoQuotas:
    def flavors_of(self, status: AppWrapperStatus) -> list[tuple[Flavor, tuple[str, ...]]]:
        return []

    def draining(self, status: AppWrapperStatus) -> str:
        return ""


NO_QUOTAS: QuotaLookup = _NoQuotas()


def _labels_only(obj: Obj) -> Obj:
    meta = obj.get("metadata", {})
    return {
        "metadata": {
            "name": meta.get("name"),
            "labels": meta.get("labels") or {},
            "resourceVersion": meta.get("resourceVersion"),
        }
    }


class Quotas:
    def __init__(
        self, *, hub: KubeApi, config: Config, events: EventRecorder, clock: Clock
    ) -> None:
        self._hub = hub
        self._config = config
        self._events = events
        self._clock = clock
        self.informers = {kind: Informer(hub, info, absent_ok=True) for kind, info in INFOS.items()}
        # Namespaces' labels, for the queues' namespace selectors (listing them may be
        # forbidden: then every selector sees no labels).
        self.namespaces = Informer(hub, NAMESPACES, transform=_labels_only, absent_ok=True)
        self.kueue = KueueSource(
            hub=hub, mode=config.kueue_quotas, namespace=config.kueue_namespace, clock=clock
        )
        self._noted: set[str] = set()
        """The notes on Kueue's objects as they now stand (each logged once while it holds)."""
        self._tree: QuotaTree | None = None
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._usage: PublishedView = lambda: EMPTY
        self.summaries: dict[str, QueueSummary] = {}
        """Each cluster queue as its status was last computed (the web view reads it)."""
        self.local_summaries: dict[str, QueueSummary] = {}
        """Each AppQueue ("namespace/name") as its status was last computed."""
        self._publish: Callable[[QueueFigures], None] = lambda figures: None
        self.usage_histories = (
            UsageHistories(config.fair_sharing_half_life_seconds)
            if config.fair_sharing_mode is FairSharingMode.USAGE
            else None
        )
        """`Usage` fair sharing: each cluster queue's use over time (sampled at each status
        computation, written with the status)."""
        self.budgets = Budgets()
        """What each cluster queue with a budget spent of it (sampled the same way)."""
        self._stop: Callable[[str, str], None] = lambda key, message: None
        self._log = structlog.get_logger("quotas")
        for informer in [*self.informers.values(), self.namespaces]:
            informer.add_handler(self._on_change)
        self.kueue.on_change(lambda: self._on_change("", None, None))

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` when any quota object (or a namespace's labels) changes."""
        self._listeners.append(listener)

    def publish_to(self, publish: Callable[[QueueFigures], None]) -> None:
        """Where the queues are published for /metrics each time their status is computed."""
        self._publish = publish

    def usage_from(self, usage: PublishedView) -> None:
        """Where the queues' usage is read (the scheduler's published view)."""
        self._usage = usage

    def _queued_usage(self) -> tuple[SchedulerView, list[Queued]]:
        """The usage, each queued workload resolved to the queue it waits in."""
        usage = self._usage()
        tree = self.tree()
        queued = []
        for workload in usage.pending:
            namespace = workload.key.partition("/")[0]
            found = resolve(namespace, workload.queue_name, tree.setup, tree)
            if isinstance(found, Queued):
                queued.append(found)
            elif found is not None and found.local:
                # Held back by its queue (stopped, inactive...): still pending there.
                queued.append(Queued(found.local, found.queue))
        return usage, queued

    def touch(self) -> None:
        """Something a queue's status shows may have changed."""
        self._changed.set()

    def _on_change(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        self._tree = None
        self._changed.set()
        for listener in self._listeners:
            listener()

    def flavors_of(self, status: AppWrapperStatus) -> list[tuple[Flavor, tuple[str, ...]]]:
        admission = status.admission
        if admission is None:
            return []
        known = self.tree().setup.flavors
        return [(known[f.name], tuple(f.resources)) for f in admission.flavors if f.name in known]

    def draining(self, status: AppWrapperStatus) -> str:
        admission = status.admission
        if admission is None:
            return ""
        setup = self.tree().setup
        queue = setup.queues.get(admission.clusterQueue)
        if queue is not None and queue.stop is StopPolicy.HOLD_AND_DRAIN:
            return f"cluster queue {queue.name} is draining (stopPolicy HoldAndDrain)"
        namespace, _, name = admission.queue.partition("/")
        local = setup.local_queues.get((namespace, name))
        if local is not None and local.stop is StopPolicy.HOLD_AND_DRAIN:
            return f"AppQueue {admission.queue} is draining (stopPolicy HoldAndDrain)"
        return ""

    def draining_queues(self) -> tuple[set[str], set[str]]:
        """(cluster queues, AppQueues "namespace/name") with stopPolicy HoldAndDrain."""
        setup = self.tree().setup
        queues = {n for n, q in setup.queues.items() if q.stop is StopPolicy.HOLD_AND_DRAIN}
        locals_ = {
            f"{ns}/{n}"
            for (ns, n), q in setup.local_queues.items()
            if q.stop is StopPolicy.HOLD_AND_DRAIN
        }
        return queues, locals_

    async def synced(self) -> None:
        for informer in [*self.informers.values(), self.namespaces]:
            await informer.synced.wait()
        await self.kueue.synced.wait()

    def setup(self) -> QuotaSetup:
        """The quota objects as read now."""
        return self.tree().setup

    def tree(self) -> QuotaTree:
        if self._tree is None:
            self._tree = QuotaTree(self._read())
        return self._tree

    def _models(self, kind: str) -> Iterable[Any]:
        for obj in self.informers[kind].store.values():
            try:
                yield parse(kind, obj)
            except ValidationError as exc:
                self._log.warning("unreadable", kind=kind, error=str(exc)[:300])

    def _read(self) -> QuotaSetup:
        labels = {
            str(obj["metadata"]["name"]): obj["metadata"].get("labels") or {}
            for obj in self.namespaces.store.values()
        }
        mode = self._config.kueue_quotas
        ours = mode is not KueueQuotas.INSTEAD
        setup = setup_of(
            self._models("ClusterAppQueue") if ours else (),
            self._models("AppCohort") if ours else (),
            self._models("AppFlavor") if ours else (),
            self._models("AppQueue") if ours else (),
            labels,
            fair_sharing=self._config.fair_sharing,
            fair_preemption=self._config.fair_sharing_preemption,
            queue_required=self._config.queue_required,
        )
        setup = replace(
            setup,
            fair_mode=self._config.fair_sharing_mode,
            half_life=self._config.fair_sharing_half_life_seconds,
        )
        setup, notes = with_kueue(setup, self.kueue.objects(), mode)
        for note in notes:
            if note not in self._noted:  # each once: the tree is rebuilt on every change
                self._log.warning("kueue_quota_note", note=note)
        # Only what the objects say now is kept: a note goes with its object, so that queues
        # made and deleted under new names do not grow this without bound.
        self._noted = set(notes)
        return setup

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for kind, informer in self.informers.items():
                group.create_task(informer.run(), name=f"watch-{kind}")
            group.create_task(self.namespaces.run(), name="watch-namespaces")
            group.create_task(self.kueue.run(), name="kueue-quotas")
            group.create_task(self._status_loop(), name="queue-status")
            group.create_task(self._sample_loop(), name="queue-usage-samples")

    async def _status_loop(self) -> None:
        await self.synced()
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self.write_status()
            except Exception as exc:  # status is a courtesy: never stop the loop
                self._log.warning("queue_status_failed", error=str(exc)[:300])
            await self._clock.sleep(STATUS_EVERY_SECONDS)

    async def _sample_loop(self) -> None:
        """A status write (and so a sample of use over time and budgets) at least this
        often: a queue's use grows while nothing changes."""
        while True:
            await self._clock.sleep(self._config.usage_sample_seconds)
            self._changed.set()

    def stop_with(self, stop: Callable[[str, str], None]) -> None:
        """Who evicts the work a spent budget stops (the scheduler: it owns evictions)."""
        self._stop = stop

    def spent(self) -> Mapping[str, Spent]:
        """What each cluster queue with a budget spent of it, as last sampled."""
        return self.budgets.spent()

    def _budget_figures(self) -> dict[str, tuple[str, float, float]]:
        figures = {}
        for name, spec in self.tree().setup.queues.items():
            status = self.budgets.status_of(name, spec)
            if status is not None and spec.budget is not None:
                spent, left = status["spentHours"], status["remainingHours"]
                figures[name] = (spec.budget.resource, spent, left)
        return figures

    def _user_figures(self) -> dict[str, tuple[tuple[str, str, float], ...]]:
        figures: dict[str, tuple[tuple[str, str, float], ...]] = {}
        half_life = self._config.fair_sharing_half_life_seconds
        for name, history in self.histories().items():
            top = sorted(history.users.items(), key=lambda item: -item[1].total())[:TOP_USERS]
            figures[name] = tuple(
                (user, resource, decayed.rate(resource, half_life) / 1000)
                for user, decayed in top
                for resource in sorted(decayed.values)
            )
        return figures

    def _sample(self, usage: SchedulerView) -> None:
        """Bring each queue's use over time and budget up to now with what its admitted
        AppWrappers hold, and have the scheduler evict what a spent `Stop` budget stops."""
        store = self.informers["ClusterAppQueue"].store
        queues = self.tree().setup.queues
        charges = usage.charges.values()
        now = self._clock.time()
        if self.usage_histories is not None:
            self.usage_histories.sample(now, queues, charges, store.get)
        self.budgets.sample(now, queues, charges, store.get)
        for key, message in self.budgets.to_stop(now, queues, charges):
            self._stop(key, message)

    def histories(self) -> Mapping[str, UsageHistory]:
        """Each cluster queue's use over time as last sampled (empty in `Instant` mode)."""
        return self.usage_histories.histories() if self.usage_histories is not None else {}

    def summarize(self) -> tuple[dict[str, QueueSummary], dict[str, QueueSummary]]:
        """Each cluster queue and each AppQueue as the last scheduling cycle left them (the
        status written last may be up to STATUS_EVERY_SECONDS older); what they hold is
        sampled for their use over time and budgets first (`_sample`)."""
        usage, pending = self._queued_usage()
        self._sample(usage)
        return summarize(
            self.tree(), usage.charges.values(), pending, usage.local_of, usage.releasing
        )

    async def write_status(self) -> None:
        tree = self.tree()
        if not (tree.setup.enabled or tree.setup.cohorts or tree.setup.flavors):
            self._publish(QueueFigures(tree.setup.queues, self.summaries, self.local_summaries))
            return
        queues, locals_ = self.summarize()
        self.summaries, self.local_summaries = queues, locals_
        self._publish(
            QueueFigures(
                tree.setup.queues, queues, locals_, self._budget_figures(), self._user_figures()
            )
        )
        now = datetime.fromtimestamp(self._clock.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for name, summary in queues.items():
            await self._write("ClusterAppQueue", None, name, summary, now)
            await self._guard(name, summary)
        for key, summary in locals_.items():
            namespace, _, name = key.partition("/")
            await self._write("AppQueue", namespace, name, summary, now, borrowed=False)
        for name, spec in tree.setup.cohorts.items():
            await self._write_cohort(name, spec, tree, now)
        for name in tree.setup.flavors:
            users = sorted(
                q.name
                for q in tree.setup.queues.values()
                if any(fq.flavor == name for g in q.groups for fq in g.flavors)
            )
            condition = {
                "type": "Active",
                "status": "True",
                "reason": "InUse" if users else "Unused",
                "message": f"cluster queues {', '.join(users)}" if users else "no cluster queue",
            }
            await self._patch("AppFlavor", None, name, {}, condition, now)

    async def _write(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        summary: QueueSummary,
        now: str,
        *,
        borrowed: bool = True,
    ) -> None:
        status: Obj = {
            "pendingWorkloads": summary.pending,
            "reservingWorkloads": summary.reserving,
            "admittedWorkloads": summary.admitted,
            "flavorsUsage": summary.flavors_usage(borrowed=borrowed),
        }
        histories = self.usage_histories
        if histories is not None and kind == "ClusterAppQueue":
            history = histories.status_of(name)
            if history is not None:
                status["usageHistory"] = history
        spec = self.tree().setup.queues.get(name) if kind == "ClusterAppQueue" else None
        spent = self.budgets.status_of(name, spec) if spec is not None else None
        if spent is not None:
            status["budget"] = spent
        condition = {
            "type": "Active",
            "status": "True" if summary.active else "False",
            "reason": summary.reason,
            "message": summary.message,
        }
        await self._patch(kind, namespace, name, status, condition, now)

    async def _guard(self, name: str, summary: QueueSummary) -> None:
        """Keep a cluster queue from going while AppWrappers are admitted in it: the
        finalizer is added to every queue and removed once a deleted one has none."""
        obj = self.informers["ClusterAppQueue"].store.get(name)
        if obj is None:
            return
        meta = obj["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        deleting = bool(meta.get("deletionTimestamp"))
        if not deleting and FINALIZER not in finalizers:
            finalizers.append(FINALIZER)
        elif deleting and FINALIZER in finalizers and summary.admitted == 0:
            finalizers.remove(FINALIZER)
        else:
            return
        # Guarded by resourceVersion: a merge patch replaces the whole list.
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        try:
            await self._hub.merge_patch(INFOS["ClusterAppQueue"], None, name, patch)
        except KubeError as exc:  # Conflict or gone: the next change brings it back here
            self._log.debug("queue_finalizer_not_written", name=name, error=str(exc)[:200])

    async def _write_cohort(self, name: str, spec: CohortSpec, tree: QuotaTree, now: str) -> None:
        problems = list(spec.problems)
        under = tree.queues_under(TreeNode("cohort", name))
        cycle = next(
            (p for q in under for p in tree.problems.get(q, []) if p.startswith("cohort cycle")),
            "",
        )
        if cycle:
            problems.append(cycle)
        condition = {
            "type": "Active",
            "status": "False" if problems else "True",
            "reason": "Inactive" if problems else "Ready",
            "message": "; ".join(problems) or "lends and borrows",
        }
        await self._patch("AppCohort", None, name, {}, condition, now)

    async def _patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        status: Obj,
        condition: Obj,
        now: str,
    ) -> None:
        key = f"{namespace}/{name}" if namespace else name
        obj = self.informers[kind].store.get(key)
        if obj is None:
            return
        current = obj.get("status") or {}
        before = next(
            (c for c in current.get("conditions") or [] if c.get("type") == "Active"), None
        )
        same_condition = before is not None and all(
            before.get(k) == v for k, v in condition.items()
        )
        if same_condition and all(current.get(k) == v for k, v in status.items()):
            return
        stamp = (
            before.get("lastTransitionTime")
            if before and (before.get("status") == condition["status"])
            else now
        )
        condition = {
            **condition,
            "lastTransitionTime": stamp or now,
            "observedGeneration": obj["metadata"].get("generation"),
        }
        patch = {"status": {**status, "conditions": [condition]}}
        try:
            written = await self._hub.merge_patch(INFOS[kind], namespace, name, patch, "status")
        except NotFound:
            return
        except KubeError as exc:
            self._log.warning(
                "queue_status_write_failed", kind=kind, name=key, error=str(exc)[:200]
            )
            return
        if before is None or before.get("status") != condition["status"]:
            active = condition["status"] == "True"
            self._events.record(
                written,
                reason="Active" if active else str(condition["reason"]),
                message=str(condition["message"]),
                warning=not active,
            )
