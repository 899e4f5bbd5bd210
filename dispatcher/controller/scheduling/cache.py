"""The scheduler cache: the one owner of what the scheduler knows about AppWrappers.

No I/O. Fed by the AppWrapper watch and by the status writer's own writes (`update`), it
keeps one entry per AppWrapper: its phase, what it is to the scheduler at its current
version (queued with its workload, or holding room in a member), what it holds there until
its pods change, and a dispatch decided but not yet written (assumed).

What changed is carried, once per cycle (`refresh`), into two kept structures: the pending
workloads in a `core.queues.QueueManager` (`queues`; each in its line, the cluster queue it
resolves to, "" for capacity only) and the quota in use in a `core.quota.usage.Usage`
(charged on assume and on a dispatch seen, released on finish, requeue, deletion, or when a
requeued one's last pods go). Only the AppWrappers whose facts changed are derived again; a
cycle costs what changed and what holds room, not the whole backlog. `snapshot` hands the
scheduler per-member snapshots (capacity minus what the dispatched hold) and the claims.

Preemption claims are not remembered here but derived from the API server's objects: a
victim's status names its preemptor (`preemptedBy`) until it is dispatched again, so a
restarted or new leader sees which evictions were made and never evicts twice for one
need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatcher.cluster.capacity import Owner
from dispatcher.cluster.member import Member
from dispatcher.controller.reading import AppWrapperReader, resource_version
from dispatcher.controller.scheduling.standing import (
    Eviction,
    Standing,
    derive,
    eviction_of,
)
from dispatcher.core.model import (
    AdmittedWorkload,
    ClusterSnapshot,
    PodSet,
    Reservation,
    Workload,
)
from dispatcher.core.phase import SCHEDULED, Phase, phase_of_raw
from dispatcher.core.queues import QueueManager
from dispatcher.core.quota.model import Charge, Flavor, QueueSpec
from dispatcher.core.quota.resolve import resolve
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.quota.usage import Usage
from dispatcher.core.reservations import Holding, holding
from dispatcher.core.scheduling import Claim
from dispatcher.core.workloads import queue_name_of

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Assumed:
    """A dispatch decided by the scheduler whose status write has not returned yet: its
    room counts from the decision, so the next cycle cannot give it to someone else."""

    workload: Workload
    cluster: str
    at: float
    charge: Charge | None = None
    local: str = ""


@dataclass
class _Entry:
    version: int
    phase: Phase
    generation: int | None
    eviction: Eviction | None
    uid: str = ""  # its pods are those with this uid (not an earlier one's of its name)
    queue: str = ""  # the queue it names (a label: editing it changes no generation)
    standing: Standing | None = None  # derived at `version` on first need
    held: tuple[int, Workload, float, Holding] | None = None  # (pod revision, ..., holding)
    assumed: Assumed | None = None
    busy: bool = False  # an admission or eviction write for it is in flight


@dataclass(frozen=True, slots=True)
class Update:
    decision: bool = False
    """A scheduling decision may change: a new phase, a new spec, or it went."""
    finished: bool = False
    """It just finished (Completed or Failed), having been seen alive."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    clusters: list[ClusterSnapshot]
    claims: dict[str, Claim] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QuotaUsage:
    """What the queues' status shows: the charges held (by key; those still charged while
    a requeued one's pods go are `releasing`), the AppQueue each was admitted through, and
    the pending workloads."""

    charges: Mapping[str, Charge]
    local_of: Mapping[str, str]
    releasing: frozenset[str]
    pending: list[Workload]


HOLDING = SCHEDULED | {Phase.DELETING, Phase.BACKOFF}
"""Phases whose standing is kept (`refresh`): the ones that want room, and the ones that
may hold it (a dispatched AppWrapper being deleted holds it until its objects are gone;
one pausing after a requeue may still hold quota while its pods go)."""
CLAIM_TIMEOUT = 120.0
"""Seconds a preemptor's claim on the room its victims free lasts (victims stuck
terminating must not hold a cluster for ever)."""


def _freed(before: ClusterSnapshot, after: ClusterSnapshot) -> bool:
    """Whether `after` may admit something `before` could not: a node new, changed or
    with fewer requests, a reservation gone or smaller, the member reachable again or
    its namespaces changed. Room only taken (a dispatch, pods
    bound where they were reserved) frees nothing: the parked work stays parked."""
    if after.reachable and not before.reachable:
        return True
    if (after.labels, after.namespaces, after.wildcard) != (
        before.labels,
        before.namespaces,
        before.wildcard,
    ):
        return True
    nodes = {n.name: n for n in before.nodes}
    for node in after.nodes:
        old = nodes.get(node.name)
        if old is node:
            continue
        if old is None or (node.allocatable, node.labels, node.taints, node.schedulable) != (
            old.allocatable,
            old.labels,
            old.taints,
            old.schedulable,
        ):
            return True
        if any(node.requested[name] < amount for name, amount in old.requested.items()):
            return True
    reservations = {r.key: r for r in after.reservations}
    for reservation in before.reservations:
        now = reservations.get(reservation.key)
        if now is None or now.pod_sets != reservation.pod_sets:
            return True
    # New preemption candidates come only with a dispatch, which wakes every question
    # already when preemption is on (`QueueManager.admitted`).
    return False


def _strays(member: Member, held: set[Owner]) -> list[Reservation]:
    """Pods of AppWrappers that hold nothing any more (requeued, evicted, deleted, or an
    earlier AppWrapper of the same name) that are not on a node yet but may still be put on
    one (their objects are being removed): reserved until they are gone, or a dispatch could
    be given their room."""
    strays = []
    for owner in member.capacity.owners():
        if owner in held:
            continue  # a dispatched one reserves its whole gang already
        pods = [p for p in member.capacity.owned_pods(*owner) if p.may_be_bound]
        if pods:
            pod_sets = tuple(
                PodSet(count=1, requests=p.requests, name=f"pod {p.key}") for p in pods
            )
            # Keyed with the uid: an earlier AppWrapper of a dispatched one's name must not
            # share (or be evicted with) its reservation.
            key = f"{owner[0]}#{owner[1]}"
            strays.append(Reservation(key=key, pod_sets=pod_sets, preemptible=False))
    return strays


class SchedulerCache:
    def __init__(
        self,
        *,
        models: AppWrapperReader,
        current: Callable[[str], Obj | None],
        members: Mapping[str, Member],
        flavors: Callable[[], Mapping[str, Flavor]] = dict,
        queues: Callable[[], Mapping[str, QueueSpec]] = dict,
    ) -> None:
        self._models = models
        self._current = current
        self._members = members
        self._flavors = flavors
        self._queues = queues
        """The ClusterAppQueues: each says what it charges (`QueueSpec.charged`)."""
        self._entries: dict[str, _Entry] = {}
        self._queued: set[str] = set()
        """Keys in phase queued: with none, there is no cycle to run."""
        self.queues = QueueManager()
        """The pending workloads, each in its line, in order (the scheduler's `take`)."""
        self._tree: QuotaTree | None = None
        self._usage: Usage | None = None
        self._dirty: set[str] = set()
        """Keys whose facts changed since they were last carried into `queues`/usage."""
        self._charged: dict[str, tuple[Charge, str]] = {}
        """key -> (the charge held, the AppQueue admitted through): what `_usage` holds."""
        self._lingering: dict[str, Charge] = {}
        """Requeued ones with their last admission's charge, held while their pods go."""
        self._holders: dict[str, None] = {}
        """Keys that hold room in a member (dispatched, or a dispatch assumed), in order."""
        self._evicted: set[str] = set()
        """Keys whose status records an eviction (their preemptor's claim)."""
        self._by_uid: dict[str, str] = {}  # uid -> key (for `preemptedBy`: `_claims`)
        self._seen: tuple[dict[str, ClusterSnapshot], dict[str, Claim]] = ({}, {})
        """The last cycle's member snapshots and claims: capacity-parked work is woken
        when room may have been freed since (`_freed`)."""

    # -- fed by the watch and by our own writes -----------------------------------------

    def update(self, key: str, obj: Obj | None) -> Update:
        """Record the newest object of `key` (None: deleted) and say what that changed."""
        if obj is None:
            self._queued.discard(key)
            self._evicted.discard(key)
            left = self._entries.pop(key, None)
            self._by_uid.pop(left.uid if left is not None else "", None)
            self._dirty.add(key)
            return Update(decision=left is not None)
        version = resource_version(obj)
        entry = self._entries.get(key)
        if entry is not None and version < entry.version:
            return Update()  # an older copy than one we already saw (our own write)
        phase = phase_of_raw(obj)
        generation = obj["metadata"].get("generation")
        eviction = eviction_of(obj)
        if phase is Phase.QUEUED:
            self._queued.add(key)
        else:
            self._queued.discard(key)
        uid = str(obj["metadata"].get("uid") or "")
        if uid:
            self._by_uid[uid] = key
        queue = queue_name_of(obj["metadata"].get("labels"), obj["metadata"].get("annotations"))
        self._dirty.add(key)
        if entry is None:
            self._entries[key] = _Entry(version, phase, generation, eviction, uid, queue)
            self._note_eviction(key, eviction)
            return Update(decision=True)
        changed = (entry.phase, entry.generation, entry.queue) != (phase, generation, queue)
        entry.queue = queue
        finished = phase is Phase.FINISHED and entry.phase is not Phase.FINISHED
        entry.version, entry.phase, entry.generation = version, phase, generation
        entry.uid = uid
        known = entry.eviction
        if (
            eviction is not None
            and not eviction.cluster
            and known is not None
            and (known.preemptor, known.at) == (eviction.preemptor, eviction.at)
        ):
            # A requeue clears clusterName; the claim is still on that member.
            eviction = known
        entry.eviction = eviction
        self._note_eviction(key, eviction)
        entry.standing = None
        if phase not in SCHEDULED:
            entry.held = None  # a finished one's derived facts are most of its memory
        return Update(decision=changed, finished=finished)

    def _note_eviction(self, key: str, eviction: Eviction | None) -> None:
        if eviction is None:
            self._evicted.discard(key)
        else:
            self._evicted.add(key)

    def forget_standings(self) -> None:
        """Priorities or queues changed (a PriorityClass, a quota object did): derive every
        standing again, and let everything parked be tried again."""
        for entry in self._entries.values():
            entry.standing = None
        self._dirty.update(self._entries)
        self.queues.line_changed()

    # -- assume / forget ----------------------------------------------------------------

    def assume(
        self,
        key: str,
        workload: Workload,
        cluster: str,
        at: float,
        charge: Charge | None = None,
        local: str = "",
    ) -> None:
        entry = self._entries[key]
        entry.assumed = Assumed(workload, cluster, at, charge, local)
        entry.busy = True
        # Kept at once: the next cycle sees the room and the quota in use.
        self.queues.remove(key)
        self._holders[key] = None
        self._lingering.pop(key, None)
        self._set_charge(key, charge, local)

    def start(self, key: str) -> None:
        """A write about `key` (an eviction) is in flight: decide nothing else for it."""
        self._entries[key].busy = True
        self.queues.remove(key)
        self._dirty.add(key)

    def finish(self, key: str) -> None:
        """The write returned (the overlay shows its result) or failed: drop the guess."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.assumed = None
            entry.busy = False
            self._dirty.add(key)

    def busy(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.busy

    # -- carried into the kept structures ------------------------------------------------

    def refresh(self, now: float, tree: QuotaTree | None) -> None:
        """Carry what changed since the last call into `queues` and the usage: the keys
        whose facts changed are derived again; the lingering charges whose pods are gone
        are released. A new quota tree re-resolves every pending one's line."""
        if tree is not self._tree:
            self._tree = tree
            self._usage = Usage(tree) if tree is not None else None
            if self._usage is not None:
                for charge, _ in self._charged.values():
                    self._usage.charge(charge)
            self._dirty.update(self.queues.workloads())
            self.queues.line_changed()
        moment = datetime.fromtimestamp(now, UTC)
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            self._sync(key, moment)
        for key, charge in list(self._lingering.items()):
            entry = self._entries.get(key)
            if entry is None or not self._holding_pods(key, entry.uid):
                del self._lingering[key]
                if key in self._charged and self._charged[key][0] is charge:
                    self._set_charge(key, None, "")

    def _sync(self, key: str, moment: datetime) -> None:
        entry = self._entries.get(key)
        if entry is None or entry.phase not in HOLDING:
            self.queues.remove(key)
            self._holders.pop(key, None)
            self._lingering.pop(key, None)
            self._set_charge(key, None, "")
            return
        if entry.assumed is not None:
            self.queues.remove(key)
            self._holders[key] = None
            self._lingering.pop(key, None)
            self._set_charge(key, entry.assumed.charge, entry.assumed.local)
            return
        standing = entry.standing
        if standing is None:
            standing = entry.standing = self._derive(key, moment)
        if standing.held is not None:
            self._holders[key] = None
        else:
            self._holders.pop(key, None)
        charge = standing.charge
        self._lingering.pop(key, None)
        lingering = standing.lingering
        if charge is None and lingering is not None and self._holding_pods(key, entry.uid):
            charge = self._lingering[key] = lingering
        self._set_charge(key, charge, standing.local)
        pending = standing.pending
        if pending is None or entry.busy:
            self.queues.remove(key)
            return
        line = self._line(pending)
        if self.queues.line_of(key) != line or self.queues.workload(key) != pending:
            self.queues.upsert(pending, line)

    def _line(self, workload: Workload) -> str:
        """The cluster queue it waits in ("" for capacity only, or none resolved)."""
        tree = self._tree
        if tree is None:
            return ""
        namespace = workload.key.partition("/")[0]
        found = resolve(namespace, workload.queue_name, tree.setup, tree)
        return found.queue if found is not None else ""

    def _set_charge(self, key: str, charge: Charge | None, local: str) -> None:
        """Keep `key`'s charge in the usage; quota given back wakes its cohort tree."""
        old = self._charged.get(key)
        if old is not None and old[0] is charge:
            self._charged[key] = (charge, local)
            return
        if charge is None:
            self._charged.pop(key, None)
        else:
            self._charged[key] = (charge, local)
        usage = self._usage
        if usage is None:
            return
        root = usage.release(key) if old is not None else ""
        if charge is not None:
            usage.charge(charge)
            if old is not None and (old[0].queue, old[0].amounts) == (charge.queue, charge.amounts):
                return  # the same quota, written down (an assumed dispatch seen)
        if root:
            self.queues.quota_released(root)

    # -- reads --------------------------------------------------------------------------

    def anything_queued(self) -> bool:
        return bool(self._queued)

    def phase(self, key: str) -> Phase | None:
        entry = self._entries.get(key)
        return entry.phase if entry is not None else None

    def keys(self, phases: frozenset[Phase]) -> Iterator[str]:
        return (k for k, e in self._entries.items() if e.phase in phases)

    def assumed_cluster(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return entry.assumed.cluster if entry is not None and entry.assumed else None

    def pending(self, key: str) -> Workload | None:
        """The pending workload of `key` as last carried into `queues` (not translated)."""
        return self.queues.workload(key)

    def usage(self) -> Usage | None:
        """The quota in use, kept (a copy of its ledger starts each cycle's `QuotaView`)."""
        return self._usage

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot(self, now: float) -> Snapshot:
        """Per member, capacity minus what dispatched ones hold (after `refresh`), and the
        preemptors' claims. Capacity-parked work is woken when these changed."""
        held: dict[str, list[tuple[str, _Entry, Workload, float, bool]]] = {
            name: [] for name in self._members
        }
        for key in self._holders:
            entry = self._entries[key]
            guess = entry.assumed
            if guess is not None:
                if guess.cluster in held:
                    held[guess.cluster].append((key, entry, guess.workload, guess.at, True))
                continue
            standing = entry.standing
            if standing is not None and standing.held is not None and standing.cluster in held:
                item = (key, entry, standing.held, standing.dispatched_at, standing.candidate)
                held[standing.cluster].append(item)
        clusters = []
        for name, member in self._members.items():
            reservations, admitted = self._holdings(member, held[name])
            reservations += _strays(member, {(item[0], item[1].uid) for item in held[name]})
            snapshot = member.capacity.snapshot(tuple(reservations), reachable=member.reachable())
            clusters.append(
                ClusterSnapshot(
                    name=snapshot.name,
                    nodes=snapshot.nodes,
                    reservations=snapshot.reservations,
                    labels=snapshot.labels,
                    reachable=snapshot.reachable,
                    admitted=tuple(admitted),
                    namespaces=member.hub_namespaces,
                    wildcard=member.snapshot_wildcard,
                )
            )
        claims = self._claims(now)
        before, claimed = self._seen
        if claims != claimed or any(
            c.name not in before or _freed(before[c.name], c) for c in clusters
        ):
            self.queues.capacity_freed()
        self._seen = ({c.name: c for c in clusters}, claims)
        return Snapshot(clusters, claims)

    def running(self) -> Iterator[tuple[str, float, str]]:
        """(key, dispatched at, cluster queue or "") of each AppWrapper that holds room as
        of its last derived standing or assumed dispatch (read-only; for "see the queue")."""
        for key in self._holders:
            entry = self._entries.get(key)
            if entry is None or entry.phase not in HOLDING:
                continue
            assumed, standing = entry.assumed, entry.standing
            if assumed is not None:
                yield key, assumed.at, assumed.charge.queue if assumed.charge else ""
            elif standing is not None and standing.held is not None:
                queue = standing.charge.queue if standing.charge else ""
                yield key, standing.dispatched_at, queue

    def charge_of(self, key: str) -> Charge | None:
        """What a dispatched AppWrapper uses of its queue's quota, as last derived."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.assumed is not None:
            return entry.assumed.charge
        return entry.standing.charge if entry.standing is not None else None

    def admitted_in(self, queues: set[str], locals_: set[str]) -> list[str]:
        """Dispatched AppWrappers charged to one of `queues` or admitted through one of
        `locals_` (as derived so far; one not derived yet is not charged to anything)."""
        found = []
        for key in self._holders:
            entry = self._entries.get(key)
            standing = entry.standing if entry is not None else None
            if (
                standing is not None
                and standing.charge is not None
                and (standing.charge.queue in queues or standing.local in locals_)
            ):
                found.append(key)
        return found

    def quota_usage(self, now: float) -> QuotaUsage:
        """The kept usage and the pending workloads, for the queues' status."""
        self.refresh(now, self._tree)
        return QuotaUsage(
            charges={k: c for k, (c, _) in self._charged.items()},
            local_of={k: local for k, (_, local) in self._charged.items()},
            releasing=frozenset(self._lingering),
            pending=list(self.queues.workloads().values()),
        )

    def _derive(self, key: str, now: datetime) -> Standing:
        return derive(
            self._current(key),
            key,
            self._models,
            now=now,
            flavors=self._flavors,
            queues=self._queues,
            only_member=self._only_member,
        )

    def _only_member(self) -> str:
        # Dispatched before the cluster was recorded (by MCAD, which had no clusterName):
        # in single-cluster mode there is only one place it can be.
        return next(iter(self._members)) if len(self._members) == 1 else ""

    def _holdings(
        self, member: Member, held: list[tuple[str, _Entry, Workload, float, bool]]
    ) -> tuple[list[Reservation], list[AdmittedWorkload]]:
        """Reservations for dispatched pods not yet on a node, and what each one uses; kept
        per AppWrapper until its pods change."""
        reservations: list[Reservation] = []
        admitted: list[AdmittedWorkload] = []
        capacity = member.capacity
        for key, entry, workload, dispatched_at, candidate in held:
            revision = capacity.owner_revision(key, entry.uid)
            known = entry.held
            if (
                known is None
                or known[0] != revision
                or known[1] is not workload
                or known[2] != dispatched_at
            ):
                pods = capacity.owned_pods(key, entry.uid)
                found = holding(workload, pods, dispatched_at=dispatched_at)
                known = entry.held = (revision, workload, dispatched_at, found)
            if known[3].reservation is not None:
                reservations.append(known[3].reservation)
            if candidate:
                admitted.append(known[3].admitted)
        return reservations, admitted

    def _claims(self, now: float) -> dict[str, Claim]:
        """preemptor -> the member where its victims' room is being freed for it.

        A claim lasts until its victims are dispatched again (which clears their record) or
        CLAIM_TIMEOUT passes, not only while their pods go: room freed for a preemptor that
        an older AppWrapper of its priority took first must not cost another eviction at
        once. While its victims are gone but it does not fit, the preemptor waits.
        """
        claims: dict[str, Claim] = {}
        for key in sorted(self._evicted):
            entry = self._entries[key]
            eviction = entry.eviction
            if eviction is None or now - eviction.at > CLAIM_TIMEOUT:
                continue
            # Requeued before this process saw it evicting: its member is where its pods
            # still are, or the only one; else the claim is not known (multi-cluster only).
            where = eviction.cluster or self._holding_pods(key, entry.uid) or self._only_member()
            if not where:
                continue
            # One of another namespace is recorded by uid (`core.mentions.recorded_preemptor`).
            preemptor = self._by_uid.get(eviction.preemptor, eviction.preemptor)
            claim = claims.get(preemptor)
            if claim is None:
                claims[preemptor] = Claim(where, (key,), eviction.at)
            elif claim.cluster == where:
                claims[preemptor] = Claim(where, (*claim.victims, key), min(claim.at, eviction.at))
        return claims

    def _holding_pods(self, key: str, uid: str) -> str:
        """The member where a requeued victim's pods still hold room ("" if none)."""
        for name, member in self._members.items():
            if any(p.holds_capacity for p in member.capacity.owned_pods(key, uid)):
                return name
        return ""
