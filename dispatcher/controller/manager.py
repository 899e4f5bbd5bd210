"""The manager: builds the controller's parts, wires the watches to them, runs them.

Side effects: all of them, through its parts — watches on the hub and members, the
reconcile workers, the scheduler, the waiting writers, upkeep, Events.

Who does what (each step of an AppWrapper's life has one owner):
- `SchedulerCache` (cache.py) knows what the scheduler needs and hands out snapshots;
- `Scheduler` (scheduler.py) decides and writes admissions and evictions as status;
- `WaitingWriter` (waiting.py) writes "why it waits";
- `Reconciler` (reconciler.py) creates and deletes wrapped objects and writes every later
  step (Running, Completed, Failed, requeues, backoff);
- `StatusWriter` (status.py) is the one way status is written;
- `Upkeep` (upkeep.py) hands stranded work to the reconciler and collects orphans.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from dispatcher.clock import Clock, SystemClock
from dispatcher.cluster.capacity import pod_owner
from dispatcher.cluster.member import Member
from dispatcher.config import Config, DeclaredPodResources
from dispatcher.controller.admission import Admission
from dispatcher.controller.cache import SchedulerCache
from dispatcher.controller.creating import Creator
from dispatcher.controller.models import Models, key_of, slimmer
from dispatcher.controller.quotas import Quotas
from dispatcher.controller.reconciler import Reconciler
from dispatcher.controller.scheduler import Scheduler
from dispatcher.controller.status import APPWRAPPERS, StatusWriter
from dispatcher.controller.upkeep import Upkeep
from dispatcher.controller.waiting import WaitingWriter
from dispatcher.controller.workqueue import WorkQueue
from dispatcher.core.phase import Phase, phase_of_raw
from dispatcher.core.quota.model import Charge, Flavor
from dispatcher.core.quota.resolve import Queued, resolve
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import Conflict, KubeError, NotFound
from dispatcher.kube.events import EventRecorder
from dispatcher.kube.informer import Informer

Obj = dict[str, Any]
PRIORITY_CLASSES = ResourceInfo(
    "scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False
)
CONFLICT_BACKOFF_SECONDS = 0.01
"""First delay between reconciles of one AppWrapper that keep meeting Conflict (doubling)."""


@dataclass(frozen=True, slots=True)
class Hops:
    """What one AppWrapper's life cost the controller, counted until it finished."""

    reconciles: int
    cycles: int
    writes: int


class Manager:
    """Create with the hub client and members; `run()` until cancelled."""

    def __init__(
        self,
        *,
        config: Config,
        hub: KubeApi,
        members: list[Member],
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.hub = hub
        self.members = {m.name: m for m in members}
        self.clock = clock or SystemClock()
        self.queue = WorkQueue()
        self.events = EventRecorder(hub)
        # One larger than the limit is kept as a stub (models.py): its spec is never held.
        slim = slimmer(config.max_appwrapper_bytes)
        self.appwrappers = Informer(
            hub,
            APPWRAPPERS,
            transform=slim,
            # A page is decoded whole, and AppWrappers may weigh up to etcd's 1.5 MiB each
            # (those above the limit are stubs only once decoded): pages of about 8 MB.
            page_bytes=8 * 1024 * 1024,
            # A finished one is read again only when it is deleted: kept as text.
            cold=lambda obj: phase_of_raw(obj) is Phase.FINISHED,
        )
        self.priority_classes = Informer(hub, PRIORITY_CLASSES)
        self.signing_keys: list[bytes] = []
        """Keys of the admission webhook's creator records (set before `run`)."""
        self.admission = Admission(
            config=config,
            hub=hub,
            discovery=[m.client for m in members],
            signing_keys=lambda: self.signing_keys,
        )
        self.models = Models(
            allowed_kinds=frozenset(config.allowed_kinds),
            declared_as_written=config.declared_pod_resources is DeclaredPodResources.AS_WRITTEN,
            # Through the informer each time: a relist replaces its store.
            priority_class=lambda name: self.priority_classes.store.get(name),
            attribution=self.admission.attribution_problem,
            priority_policy=config.priority_policy,
        )
        self.status = StatusWriter(
            hub,
            self.events,
            watched=lambda key: self.appwrappers.store.get(key),
            on_written=self._on_written,
            slim=slim,
        )
        self.quotas = Quotas(hub=hub, config=config, events=self.events, clock=self.clock)
        self.cache = SchedulerCache(
            models=self.models,
            current=self.status.current,
            members=self.members,
            flavors=self._flavors,
            queues=lambda: self.quotas.tree().setup.queues,
        )
        self.waiting = WaitingWriter(
            models=self.models, status=self.status, clock=self.clock, on_conflict=self._kick
        )
        self.scheduler = Scheduler(
            config=config,
            cache=self.cache,
            models=self.models,
            status=self.status,
            waiting=self.waiting,
            members=self.members,
            clock=self.clock,
            wrote=self.queue.add,
            quota_tree=self.quotas.tree,
        )
        self.reconciler = Reconciler(
            config=config,
            models=self.models,
            status=self.status,
            members=self.members,
            clock=self.clock,
            schedule_soon=self._kick,
            start_task=self._start,
            wake_owner=self._wake_owner,
            creator=Creator(admission=self.admission, quotas=self.quotas, clock=self.clock),
            quotas=self.quotas,
        )
        self.upkeep = Upkeep(
            members=self.members,
            clock=self.clock,
            timeout=config.member_timeout_seconds,
            stranded_on=self._stranded_on,
            reconcile=self.queue.add,
            placements=self._placements,
        )
        self.states: Counter[str] = Counter()
        """AppWrappers in the cache by status.state, kept by the watch handler (metrics)."""
        self.reconciles: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()
        """Sums of hops over the AppWrappers that finished: reconciles, cycles, writes, count."""
        self.ready = asyncio.Event()
        self.fenced = False
        self._group: asyncio.TaskGroup | None = None
        self._children: set[asyncio.Task[None]] = set()
        self._running: asyncio.Task[Any] | None = None
        self._log = structlog.get_logger("manager")
        self.appwrappers.add_handler(self._on_appwrapper)
        self.priority_classes.add_handler(self._on_priority_class)
        self.quotas.on_change(self._on_quota_object)
        self.quotas.usage_from(self._quota_usage)
        for member in members:
            member.capacity.on_change = self._on_capacity
            member.pods.add_handler(self._on_pod)

    @property
    def cycles(self) -> int:
        return self.scheduler.cycles

    @property
    def preemptions(self) -> int:
        return self.scheduler.preemptions

    async def run(self, *, loops: bool = True) -> None:
        """Watch, then (once every cache has synced) reconcile and schedule until cancelled.

        With `loops=False` only the watches and Event posting run: tests then call
        `reconciler.reconcile` and `scheduler.cycle` themselves, one step at a time.
        """
        if self.fenced:
            raise RuntimeError("a fenced manager does not run again")
        self._running = asyncio.current_task()
        async with asyncio.TaskGroup() as group:
            self._group = group
            self._child(self.appwrappers.run(), "appwrappers")
            self._child(self.priority_classes.run(), "priorityclasses")
            self._child(self.quotas.run(), "quotas")
            self._child(self.events.run(), "events")
            for member in self.members.values():
                self._child(member.run(), f"member-{member.name}")
            # Workers start only once the hub's caches have synced: decisions on a partial
            # view could overcommit or double-create (dispatches not yet seen).
            await self.appwrappers.synced.wait()
            await self.priority_classes.synced.wait()
            await self.quotas.synced()
            late = await self._members_synced()
            self._log.info(
                "caches_synced",
                appwrappers=len(self.appwrappers.store),
                members=[name for name in self.members if name not in late],
                not_synced=late,
            )
            if not loops:
                self.ready.set()
                return
            for key in list(self.appwrappers.store):
                self.queue.add(key)
            for index in range(self.config.workers):
                self._child(self._worker(), f"worker-{index}")
            self._child(self.scheduler.run(), "scheduler")
            self._child(self.waiting.run(), "waiting-writers")
            self._child(self.upkeep.run(), "upkeep")
            for name in late:
                self._child(self._join(self.members[name]), f"join-{name}")
            self.ready.set()
            self._kick()

    async def _members_synced(self) -> list[str]:
        """Wait, at most `member_sync_timeout_seconds`, for every member's node and pod
        caches; the names of those still not synced. One member that does not answer (or
        forbids the list) must not hold back dispatching to the others: it counts as
        unreachable until its caches sync (`Member.reachable`), so nothing is decided on a
        partial view of it."""
        waits = {
            asyncio.ensure_future(member.wait_synced()): name
            for name, member in self.members.items()
        }
        try:
            if waits:
                await asyncio.wait(waits, timeout=self.config.member_sync_timeout_seconds)
        finally:
            for wait in waits:
                wait.cancel()
        return [name for name, member in self.members.items() if not member.synced]

    async def _join(self, member: Member) -> None:
        """A member that was not synced at start: once it is, it takes part."""
        await member.wait_synced()
        self._log.info("member_synced", cluster=member.name)
        for key in self._stranded_on(member.name):
            self.queue.add(key)  # their pods can be judged now
        self._kick()

    def _child(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """A task of the manager's group, known by name so `fence` can cancel it at once."""
        if self._group is None or self.fenced:
            coro.close()
            return
        task = self._group.create_task(coro, name=name)
        self._children.add(task)
        task.add_done_callback(self._children.discard)

    def fence(self) -> None:
        """The Lease is lost: from this instant nothing more is written, by anyone here.

        Synchronous on purpose, so no other task runs between the decision and the fence:
        the status writer and the Event recorder refuse, and every task that writes
        (admissions, evictions, waiting messages, reconciles, collections) is cancelled
        where it stands; each is suspended at an await, so none sends another request.
        Watches are cancelled with the rest. The process is expected to exit next."""
        if self.fenced:
            return
        self.fenced = True
        self.ready.clear()
        self.status.fence()
        self.events.fence()
        self.scheduler.fence()
        self.upkeep.fence()
        self.queue.shutdown()
        for task in list(self._children):
            task.cancel()
        if self._running is not None:
            self._running.cancel()

    def _kick(self) -> None:
        self.scheduler.kick()

    def _start(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        self._child(coro, name)

    # -- handlers (they only record and enqueue) ------------------------------------------

    def _on_appwrapper(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if old is not None:
            self.states[_state_of(old)] -= 1
        if new is not None:
            self.states[_state_of(new)] += 1
        obj = new or old
        if obj is None:
            return
        key = key_of(obj)
        echo = self.status.observe(key, new)
        if new is None:
            self.cache.update(key, None)
            self._forget(key)
            self._kick()
            self.quotas.touch()
            return
        self._record(key, new)
        if not echo:
            # Our own writes' echoes are skipped: whoever wrote already knows what follows.
            self.queue.add(key)

    def _on_written(self, key: str, obj: Obj) -> None:
        self._record(key, obj)

    def _record(self, key: str, obj: Obj) -> None:
        update = self.cache.update(key, obj)
        if update.decision:
            self._kick()
            self.quotas.touch()
        if update.finished:
            self._retire(key)

    def _on_priority_class(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        # A queued AppWrapper's priority comes from its class: derive every standing again.
        self.cache.forget_standings()
        self._kick()

    def _on_quota_object(self) -> None:
        queues, locals_ = self.quotas.draining_queues()
        if queues or locals_:
            for key in self.cache.admitted_in(queues, locals_):
                self.queue.add(key)  # the reconciler requeues them
        # A flavor's labels shape what dispatched ones hold, a queue's quotaCharge what
        # they are charged: derive every standing again.
        self.cache.forget_standings()
        self._kick()

    def _flavors(self) -> Mapping[str, Flavor]:
        return self.quotas.tree().setup.flavors

    def _quota_usage(self) -> tuple[list[Charge], list[Queued], dict[str, str], set[str]]:
        charges, pending, local_of, releasing = self.cache.quota_usage(self.clock.time())
        tree = self.quotas.tree()
        queued = []
        for workload in pending:
            namespace = workload.key.partition("/")[0]
            found = resolve(namespace, workload.queue_name, tree.setup, tree)
            if isinstance(found, Queued):
                queued.append(found)
            elif found is not None and found.local:
                # Held back by its queue (stopped, inactive...): still pending there.
                queued.append(Queued(found.local, found.queue))
        return charges, queued, local_of, releasing

    def _on_capacity(self, reason: str) -> None:
        if reason != "pod-changed":
            self._kick()

    def _on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """A pod came, went or changed phase: its AppWrapper's counts and verdict may move.
        Other changes (bound to a node, conditions) move neither: no reconcile for them."""
        if old is not None and new is not None and _pod_phase(old) == _pod_phase(new):
            return
        self._wake_owner(kind, old, new)

    def _wake_owner(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """A pod or wrapped object labelled with its AppWrapper changed: reconcile that one."""
        # Only its own (same namespace, with a uid): look-alikes elsewhere wake nobody.
        owner = pod_owner((new or old or {}).get("metadata", {}))
        if owner is not None:
            self.queue.add(owner[0])

    def _retire(self, key: str) -> None:
        """It finished: count its hops; drop what only a live AppWrapper needs."""
        hops = Hops(
            reconciles=self.reconciles.pop(key, 0),
            cycles=self.scheduler.considered.pop(key, 0),
            writes=self.status.writes.pop(key, 0),
        )
        self.finished.update(
            reconciles=hops.reconciles, cycles=hops.cycles, writes=hops.writes, count=1
        )
        self._log.info(
            "lifecycle_hops",
            appwrapper=key,
            reconciles=hops.reconciles,
            cycles=hops.cycles,
            writes=hops.writes,
        )
        self.models.forget(key)
        self.reconciler.forget(key)
        self.waiting.forget(key)

    def _forget(self, key: str) -> None:
        self.models.forget(key)
        self.reconciler.forget_all(key)
        self.waiting.forget(key)
        self.status.forget(key)
        self.reconciles.pop(key, None)
        self.scheduler.considered.pop(key, None)

    # -- upkeep's questions -----------------------------------------------------------------

    def _stranded_on(self, member: str) -> list[str]:
        stranded = []
        for key in self.cache.keys(frozenset({Phase.DISPATCHED, Phase.EVICTING})):
            obj = self.status.current(key)
            if obj is not None and (obj.get("status") or {}).get("clusterName") == member:
                stranded.append(key)
        return stranded

    def _placements(self) -> tuple[dict[str, tuple[str, str]], set[tuple[str, str]]]:
        keep: dict[str, tuple[str, str]] = {}
        kinds: set[tuple[str, str]] = set()
        for key in list(self.appwrappers.store):
            obj = self.status.current(key)
            if obj is None:
                continue
            meta = obj["metadata"]
            for item in ((obj.get("spec") or {}).get("resources") or {}).get("GenericItems") or []:
                template = item.get("generictemplate") or {}
                if template.get("apiVersion") and template.get("kind"):
                    kinds.add((str(template["apiVersion"]), str(template["kind"])))
            cluster = self.cache.assumed_cluster(key) or (obj.get("status") or {}).get(
                "clusterName"
            )
            if cluster and not meta.get("deletionTimestamp"):
                keep[key] = (meta.get("uid", ""), cluster)
        return keep, kinds

    # -- reconcile workers ------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            if self.cache.phase(key) not in (None, Phase.FINISHED):  # gone, or counted
                self.reconciles[key] += 1
            try:
                result = await self.reconciler.reconcile(key)
                self.queue.forget(key)
                if result.requeue_after is not None:
                    self.queue.add_after(key, result.requeue_after)
            except Conflict:
                # Someone (often our own earlier write) changed it: re-read at once. Again
                # and again means a writer we keep losing to, or a cache that lags: back
                # off (per key, reset by a success) rather than spin.
                self.queue.retry(key, base=CONFLICT_BACKOFF_SECONDS, first_at_once=True)
            except NotFound:
                self.queue.forget(key)  # it went meanwhile; the watch says the rest
            except KubeError as exc:
                delay = self.queue.retry(key)
                self._log.warning(
                    "reconcile_failed", appwrapper=key, error=str(exc)[:300], retry_in=delay
                )
            except Exception:
                delay = self.queue.retry(key)
                self._log.exception("reconcile_crashed", appwrapper=key, retry_in=delay)
            finally:
                self.queue.done(key)

    async def drain(self, timeout: float = 10) -> None:
        """Let in-flight writes finish (bounded) before shutdown."""
        await self.scheduler.drain(timeout)
        await self.events.flush(timeout=timeout)


def _pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _state_of(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("state") or "New")
