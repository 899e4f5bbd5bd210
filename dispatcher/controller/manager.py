"""The manager: builds the controller's parts, connects them, runs them. It decides
nothing itself: every handler below only routes what happened to the part that owns it.

Side effects: all of them, through its parts — watches on the hub and members, the
reconcile workers, the scheduler, the waiting writers, upkeep, Events.

Who does what (each step of an AppWrapper's life has one owner):
- `SchedulerCache` (scheduling/cache.py) indexes what the scheduler needs to know of each
  AppWrapper, passively;
- `Scheduler` (scheduling/scheduler.py) owns its state (the queues, the quota in use, who
  holds room: scheduling/state.py), decides, writes admissions and evictions as status,
  and publishes what a cycle left (`SchedulerView`) for those who only read it;
- `WaitingWriter` (waiting.py) writes "why it waits";
- `Reconciler` (reconciler.py) creates (through its `Maker`, making.py) and deletes
  wrapped objects and writes every later step (Running, Completed, Failed, requeues,
  backoff);
- `StatusWriter` (status.py) is the one way status is written; what a write changed for
  others goes through the `Outbox` (outbox.py), delivered after the write returned;
- `Lives` (ledger.py) counts lives and their hops, and has each part forget a finished one;
- `Quotas` (quotas.py) reads the queue objects and writes their status;
- `Upkeep` (upkeep.py) hands stranded work to the reconciler and collects orphans;
- the workers (`serve`, workqueue.py) run reconciles with the error policy.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import structlog

from dispatcher.clock import Clock, SystemClock
from dispatcher.cluster.capacity import pod_owner
from dispatcher.cluster.member import Member
from dispatcher.config import Config, DeclaredPodResources
from dispatcher.controller.access.gatekeeper import Gatekeeper
from dispatcher.controller.access.witness import RecordWitness
from dispatcher.controller.lifecycle.lives import Lives
from dispatcher.controller.lifecycle.making import Maker
from dispatcher.controller.lifecycle.provisioning import Provisioning
from dispatcher.controller.lifecycle.reconciler import Reconciler
from dispatcher.controller.lifecycle.upkeep import Upkeep
from dispatcher.controller.outbox import Notice, Outbox
from dispatcher.controller.quota.objects import Quotas
from dispatcher.controller.reading import AppWrapperReader, key_of, slimmer
from dispatcher.controller.scheduling.cache import SchedulerCache
from dispatcher.controller.scheduling.scheduler import Scheduler
from dispatcher.controller.scheduling.waiting import WaitingWriter
from dispatcher.controller.status import APPWRAPPERS, StatusWriter
from dispatcher.controller.visibility.pending import Visibility
from dispatcher.controller.workqueue import WorkQueue, serve
from dispatcher.core.phase import Phase, phase_of_raw
from dispatcher.core.quota.kueue import KueueQuotas
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import RequestStats, ResourceInfo
from dispatcher.kube.events import EventRecorder
from dispatcher.kube.informer import Informer
from dispatcher.metrics import (
    Figures,
    ManagerCollector,
    MetricsFigures,
    PendingFigures,
    Recorder,
    count_pending,
)

Obj = dict[str, Any]
PRIORITY_CLASSES = ResourceInfo(
    "scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False
)
STRANDED = frozenset({Phase.DISPATCHED, Phase.EVICTING})


Runnable = tuple[str, Callable[[], Coroutine[Any, Any, None]]]
"""A task the manager runs, by name (`fence` cancels them all)."""
COLD_PHASES = frozenset({Phase.FINISHED, Phase.QUEUED, Phase.SUSPENDED})
"""AppWrappers the watch cache keeps packed (kube/store.py)."""


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
        self.queue = WorkQueue(clock=self.clock)
        self.events = EventRecorder(hub)
        self.signing_keys: list[bytes] = []
        """Keys of the admission webhook's creator records (set before `run`)."""
        self.recorder = Recorder()
        self._build_reading()
        self._build_deciding()
        self._build_acting()
        self.ready = asyncio.Event()
        self.fenced = False
        self._group: asyncio.TaskGroup | None = None
        self._children: set[asyncio.Task[None]] = set()
        self._running: asyncio.Task[Any] | None = None
        self._log = structlog.get_logger("manager")
        self._connect()

    def _build_reading(self) -> None:
        """The watches, and the parts that read AppWrappers and write their status."""
        config = self.config
        # One larger than the limit is kept as a stub (reading.py): its spec is never held.
        slim = slimmer(config.max_appwrapper_bytes)
        self.appwrappers = Informer(
            self.hub,
            APPWRAPPERS,
            transform=slim,
            # A page is decoded whole, and AppWrappers may weigh up to etcd's 1.5 MiB each
            # (those above the limit are stubs only once decoded): pages of about 8 MB.
            page_bytes=8 * 1024 * 1024,
            # Kept as text (about a quarter of the memory), decoded on each read: a finished
            # one, read again only when it is deleted, and a queued or suspended one, read
            # when its own situation changes (the scheduler and the pending list work from
            # its workload, derived once per version). A dispatched one is read on every
            # change of its pods.
            cold=lambda obj: phase_of_raw(obj) in COLD_PHASES,
        )
        self.priority_classes = Informer(self.hub, PRIORITY_CLASSES)
        self.quotas = Quotas(hub=self.hub, config=config, events=self.events, clock=self.clock)
        self.gatekeeper = Gatekeeper(
            config=config,
            hub=self.hub,
            discovery=[m.client for m in self.members.values()],
            signing_keys=lambda: self.signing_keys,
            # Where this dispatcher signs records and anyone may call its webhook (no client
            # CA: a managed cluster), one is honoured only if the webhook was in place when
            # the record's spec was stored (docs/security.md). With the API server's client
            # certificate checked, no other caller obtains a record: nothing to prove.
            witness=(
                RecordWitness(self.hub, config.webhook.mutating_configuration, clock=self.clock)
                if config.webhook.enabled
                and config.unattributed == "refuse"
                and not config.webhook.client_ca_file
                else None
            ),
        )
        self.reader = AppWrapperReader(
            allowed_kinds=frozenset(config.allowed_kinds),
            declared_as_written=config.declared_pod_resources is DeclaredPodResources.AS_WRITTEN,
            priority_class=self.priority_classes.get,
            attribution=self.gatekeeper.attribution_problem,
            creator=self.gatekeeper.creator_of,
            priority_policy=config.priority_policy,
            workload_priority_class=(
                None if config.kueue_quotas is KueueQuotas.OFF else self.quotas.kueue.priority_class
            ),
        )
        self.outbox = Outbox(self._deliver)
        self.status = StatusWriter(
            self.hub,
            self.events,
            watched=self.appwrappers.get,
            on_written=self._on_written,
            slim=slim,
        )

    def _build_deciding(self) -> None:
        """The scheduler cache, the scheduler and the waiting writers."""
        self.cache = SchedulerCache(
            models=self.reader,
            current=self.status.current,
            members=self.members,
            setup=self.quotas.setup,
            protection=self.config.protection,
        )
        self.waiting = WaitingWriter(
            models=self.reader, status=self.status, clock=self.clock, on_conflict=self._kick
        )
        self.scheduler = Scheduler(
            config=self.config,
            cache=self.cache,
            models=self.reader,
            status=self.status,
            waiting=self.waiting,
            members=self.members,
            clock=self.clock,
            wrote=self.queue.add,
            quota_tree=self.quotas.tree,
            quota_history=self.quotas.histories,
            quota_spent=self.quotas.spent,
            recorder=self.recorder,
        )
        self.visibility = Visibility(
            running=self.scheduler.running,
            current=self.status.current,
            finished=self.cache.finished,
            changes=self.scheduler.pending_changes,
        )
        self.scheduler.observe_with(self.visibility.observe, self.visibility.durations.limit_use)
        self.quotas.stop_with(self.scheduler.stop)

    def _build_acting(self) -> None:
        """The reconciler, upkeep and the ledger of lives."""
        self.provisioning = Provisioning(
            config=self.config.provisioning,
            hub=self.hub,
            status=self.status,
            reader=self.reader,
            clock=self.clock,
            wake=self.queue.add,
            quotas=self.quotas,
        )
        self.reconciler = Reconciler(
            config=self.config,
            reader=self.reader,
            status=self.status,
            members=self.members,
            clock=self.clock,
            schedule_soon=self._kick,
            start_task=self._child,
            wake_owner=self._wake_owner,
            maker=Maker(
                gatekeeper=self.gatekeeper,
                quotas=self.quotas,
                clock=self.clock,
                node_health=self.config.node_health.rules(),
            ),
            quotas=self.quotas,
            recorder=self.recorder,
            provisioning=self.provisioning,
        )
        self.upkeep = Upkeep(
            members=self.members,
            clock=self.clock,
            timeout=self.config.member_timeout_seconds,
            reconcile=self.queue.add,
            current=self.status.current,
            appwrappers=lambda: self.appwrappers.store,  # a relist replaces the store
            dispatched=partial(self.cache.keys, STRANDED),
            assumed_cluster=self.cache.assumed_cluster,
        )
        self.ledger = Lives(
            cycles=self.scheduler.considered,
            writes=self.status.writes,
            live=self.cache.alive,
            on_finished=[self.reader.forget, self.reconciler.forget, self.waiting.forget],
            on_deleted=[
                self.reader.forget,
                self.reconciler.forget_all,
                self.waiting.forget,
                self.status.forget,
            ],
        )

    def _connect(self) -> None:
        """The watches and the quota objects to the handlers below."""
        self.appwrappers.add_handler(self._on_appwrapper)
        self.priority_classes.add_handler(self._on_priority_class)
        self.quotas.on_change(self._on_quota_object)
        self.quotas.usage_from(self.scheduler.view)
        self.scheduler.on_published(self.quotas.touch)
        for member in self.members.values():
            member.capacity.on_change = self._on_capacity
            member.capacity.follow_health(self.config.node_health.rules(), wake=self.queue.add)
            member.pods.add_handler(self._on_pod)
        self.figures = Figures(
            self.pending_figures,
            every=self.config.metrics.refresh_seconds,
            sleep=self.clock.sleep,
        )
        self.quotas.publish_to(self.figures.publish_queues)
        self.recorder.registry.register(ManagerCollector(self))
        self._register()

    def _register(self) -> None:
        """What `run` starts: the watches at once, the loops once the caches synced."""
        self._watches: list[Runnable] = [
            ("appwrappers", self.appwrappers.run),
            ("priorityclasses", self.priority_classes.run),
            ("quotas", self.quotas.run),
            ("events", self.events.run),
        ]
        if self.gatekeeper.witness is not None:
            self._watches.append(("record-witness", self.gatekeeper.witness.run))
        if self.config.provisioning.enabled:
            self._watches.append(("provisioningrequests", self.provisioning.requests.run))
        self._watches += [(f"member-{m.name}", m.run) for m in self.members.values()]
        worker = partial(
            serve,
            self.queue,
            self.reconciler.reconcile,
            taken=self.ledger.reconciled,
            around=self.outbox.deferring,
        )
        self._loops: list[Runnable] = [
            *((f"worker-{index}", worker) for index in range(self.config.workers)),
            ("scheduler", self.scheduler.run),
            ("waiting-writers", self.waiting.run),
            ("upkeep", self.upkeep.run),
            ("metrics-figures", self.figures.run),
        ]

    def pending_figures(self) -> PendingFigures:
        """The pass over all pending work (run by the figures' timer, never by a scrape)."""
        view = self.scheduler.view()
        return count_pending(view.pending, view.waits, self.quotas.tree())

    # -- what /metrics reads (metrics.Counted): counters as they stand, the last view ----

    @property
    def metrics_view(self) -> MetricsFigures:
        return self.figures.latest

    @property
    def request_stats(self) -> RequestStats:
        return self.hub.stats

    @property
    def states(self) -> Counter[str]:
        """AppWrappers in the cache by status.state (metrics)."""
        return self.ledger.states

    @property
    def reconciles(self) -> Counter[str]:
        return self.ledger.reconciles

    @property
    def finished(self) -> Counter[str]:
        """Sums of hops over the AppWrappers that finished: reconciles, cycles, writes, count."""
        return self.ledger.finished

    @property
    def cycles(self) -> int:
        return self.scheduler.cycles

    @property
    def preemptions(self) -> int:
        return self.scheduler.preemptions

    @property
    def preemptions_by_queue(self) -> Counter[str]:
        return self.scheduler.preemptions_by_queue

    async def run(self, *, loops: bool = True) -> None:
        """Watch, then (once every cache has synced) reconcile and schedule until cancelled.

        With `loops=False` only the watches and Event posting run: tests then call
        `reconciler.reconcile` and `scheduler.cycle` themselves, one step at a time.
        """
        if self.fenced:
            raise RuntimeError("a fenced manager does not run again")
        self._running = asyncio.current_task()
        self.recorder.leading(True)  # only the Lease holder runs its manager
        async with asyncio.TaskGroup() as group:
            self._group = group
            for name, start in self._watches:
                self._child(start(), name)
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
            for name, start in self._loops:
                self._child(start(), name)
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
        for key in self.upkeep.stranded_on(member.name):
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
        self.recorder.leading(False)
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

    # -- handlers: each routes what happened to the part that owns it ---------------------

    def _on_appwrapper(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        self.ledger.observed(old, new)
        obj = new or old
        if obj is None:
            return
        key = key_of(obj)
        echo = self.status.observe(key, new)
        update = self.cache.update(key, new)
        # The watch is inside nobody's write: what it changed is delivered at once.
        self._deliver(Notice(key, update.decision, update.finished, deleted=new is None))
        if new is not None and not echo:
            # Our own writes' echoes are skipped: whoever wrote already knows what follows.
            self.queue.add(key)

    def _on_written(self, key: str, obj: Obj) -> None:
        """A status write returned `obj`: the cache records it now (the next cycle must see
        it); what that changes for others waits in the outbox until the write returned."""
        update = self.cache.update(key, obj)
        if update.decision or update.finished:
            self.outbox.put(Notice(key, update.decision, update.finished))

    def _deliver(self, notice: Notice) -> None:
        if notice.deleted:
            self.ledger.delete(notice.key)
        elif notice.finished:
            self.ledger.finish(notice.key)
        if notice.decision or notice.deleted:
            self._kick()  # the queues' status follows the cycle (`on_published`)

    def _on_priority_class(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        # A queued AppWrapper's priority comes from its class: derive every standing again.
        self.cache.forget_standings()
        self._kick()

    def _on_quota_object(self) -> None:
        queues, locals_ = self.quotas.draining_queues()
        if queues or locals_:
            for key in self.scheduler.view().admitted_in(queues, locals_):
                self.queue.add(key)  # the reconciler requeues them
        # A flavor's labels shape what dispatched ones hold, a queue's quotaCharge what
        # they are charged: derive every standing again.
        self.cache.forget_standings()
        self._kick()

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

    async def drain(self, timeout: float = 10) -> None:
        """Let in-flight writes finish (bounded) before shutdown."""
        await self.scheduler.drain(timeout)
        await self.events.flush(timeout=timeout)


def _pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")
