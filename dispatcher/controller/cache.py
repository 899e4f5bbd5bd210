"""The scheduler cache: the one owner of what the scheduler knows about AppWrappers.

No I/O. Fed by the AppWrapper watch and by the status writer's own writes (`update`), it
keeps one entry per AppWrapper: its phase, what it is to the scheduler at its current
version (queued with its workload, or holding room in a member), what it holds there until
its pods change, and a dispatch decided but not yet written (assumed). `snapshot` hands the
scheduler the pending workloads and per-member snapshots; nothing else reads these facts.

Preemption claims are not remembered here but derived from the API server's objects: a
victim's status names its preemptor (`preemptedBy`) until it is dispatched again, so a
restarted or new leader sees which evictions were made and never evicts twice for one
need.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from dispatcher.api.constants import FINALIZER
from dispatcher.api.models import ConditionType, parse_time
from dispatcher.cluster.capacity import Owner
from dispatcher.cluster.member import Member
from dispatcher.controller.reading import AppWrapperReader, resource_version
from dispatcher.core import conditions as cond
from dispatcher.core.model import (
    AdmittedWorkload,
    ClusterSnapshot,
    PodSet,
    Reservation,
    Workload,
)
from dispatcher.core.phase import SCHEDULED, Phase, phase_of_raw
from dispatcher.core.quota.flavors import charge_of, with_flavors
from dispatcher.core.quota.model import Charge, Flavor, QueueSpec
from dispatcher.core.reservations import Holding, holding
from dispatcher.core.scheduling import Claim
from dispatcher.core.workloads import queue_name_of

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Standing:
    """What one AppWrapper, at one resourceVersion, is to the scheduler: queued (wants
    room), dispatched (holds room in `cluster` since `dispatched_at`), or neither."""

    pending: Workload | None = None
    held: Workload | None = None
    cluster: str = ""
    dispatched_at: float = 0.0
    candidate: bool = True
    """May be chosen as a preemption victim (not while it is being evicted already)."""
    charge: Charge | None = None
    """With quotas: what it uses of its cluster queue's quota (while it holds room)."""
    local: str = ""
    """With quotas: the AppQueue ("namespace/name") it was admitted through."""
    lingering: Charge | None = None
    """Queued again after a dispatch (requeued, evicted): its last admission's charge, which
    it still holds while pods of that dispatch hold capacity somewhere."""

    def admitted_through(self, queues: set[str], locals_: set[str]) -> bool:
        charge = self.charge
        return charge is not None and (charge.queue in queues or self.local in locals_)


NOT_SCHEDULED = Standing()


@dataclass(frozen=True, slots=True)
class Assumed:
    """A dispatch decided by the scheduler whose status write has not returned yet: its
    room counts from the decision, so the next cycle cannot give it to someone else."""

    workload: Workload
    cluster: str
    at: float
    charge: Charge | None = None
    local: str = ""


@dataclass(frozen=True, slots=True)
class Eviction:
    """A victim's own record of an eviction: who its room is for, where, since when."""

    preemptor: str
    cluster: str  # "" once requeued (its pods may still be terminating somewhere)
    at: float


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
    pending: list[Workload]
    clusters: list[ClusterSnapshot]
    claims: dict[str, Claim] = field(default_factory=dict)
    charges: list[Charge] = field(default_factory=list)
    """Quota used by every dispatched AppWrapper (in any member)."""


HOLDING = SCHEDULED | {Phase.DELETING, Phase.BACKOFF}
"""Phases the snapshot walks: the ones that want room, and the ones that may hold it (a
dispatched AppWrapper being deleted holds it until its objects are gone; one pausing after
a requeue may still hold quota while its pods go)."""
CLAIM_TIMEOUT = 120.0
"""Seconds a preemptor's claim on the room its victims free lasts (victims stuck
terminating must not hold a cluster for ever)."""


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


def _eviction_of(obj: Obj) -> Eviction | None:
    status = obj.get("status") or {}
    preemptor = status.get("preemptedBy")
    if not preemptor:
        return None
    condition = next(
        (c for c in status.get("conditions") or [] if c.get("type") == ConditionType.PREEMPTED),
        None,
    )
    if condition is None or condition.get("status") != "True":
        return None
    try:
        at = parse_time(condition.get("lastTransitionMicroTime") or "").timestamp()
    except ValueError:
        at = 0.0
    return Eviction(str(preemptor), str(status.get("clusterName") or ""), at)


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

    # -- fed by the watch and by our own writes -----------------------------------------

    def update(self, key: str, obj: Obj | None) -> Update:
        """Record the newest object of `key` (None: deleted) and say what that changed."""
        if obj is None:
            self._queued.discard(key)
            return Update(decision=self._entries.pop(key, None) is not None)
        version = resource_version(obj)
        entry = self._entries.get(key)
        if entry is not None and version < entry.version:
            return Update()  # an older copy than one we already saw (our own write)
        phase = phase_of_raw(obj)
        generation = obj["metadata"].get("generation")
        eviction = _eviction_of(obj)
        if phase is Phase.QUEUED:
            self._queued.add(key)
        else:
            self._queued.discard(key)
        uid = str(obj["metadata"].get("uid") or "")
        queue = queue_name_of(obj["metadata"].get("labels"))
        if entry is None:
            self._entries[key] = _Entry(version, phase, generation, eviction, uid, queue)
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
        entry.standing = None
        if phase not in SCHEDULED:
            entry.held = None  # a finished one's derived facts are most of its memory
        return Update(decision=changed, finished=finished)

    def forget_standings(self) -> None:
        """Priorities changed (a PriorityClass did): derive every standing again."""
        for entry in self._entries.values():
            entry.standing = None

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

    def start(self, key: str) -> None:
        """A write about `key` (an eviction) is in flight: decide nothing else for it."""
        self._entries[key].busy = True

    def finish(self, key: str) -> None:
        """The write returned (the overlay shows its result) or failed: drop the guess."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.assumed = None
            entry.busy = False

    def busy(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.busy

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

    def workload(self, key: str) -> Workload | None:
        entry = self._entries.get(key)
        standing = entry.standing if entry is not None else None
        if standing is None:
            return None
        return standing.pending or standing.held

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot(self, now: float) -> Snapshot:
        """Queued workloads and, per member, capacity minus what dispatched ones hold, and
        the hub namespaces it takes."""
        moment = datetime.fromtimestamp(now, UTC)
        pending: list[Workload] = []
        charges: list[Charge] = []
        held: dict[str, list[tuple[str, _Entry, Workload, float, bool]]] = {
            name: [] for name in self._members
        }
        for key, entry, guess, standing in self._holding(moment):
            if guess is not None:
                if guess.charge is not None:
                    charges.append(guess.charge)
                if guess.cluster in held:
                    held[guess.cluster].append((key, entry, guess.workload, guess.at, True))
                continue
            if standing.charge is not None:
                charges.append(standing.charge)
            if standing.held is not None:
                if standing.cluster in held:
                    item = (key, entry, standing.held, standing.dispatched_at, standing.candidate)
                    held[standing.cluster].append(item)
            else:
                if standing.lingering is not None and self._holding_pods(key, entry.uid):
                    charges.append(standing.lingering)
                if standing.pending is not None and not entry.busy:
                    pending.append(standing.pending)
        if not pending:
            # Nothing to decide: what the dispatched ones hold is not worth deriving.
            return Snapshot(pending, [])
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
        return Snapshot(pending, clusters, self._claims(now), charges)

    def running(self) -> Iterator[tuple[str, float, str]]:
        """(key, dispatched at, cluster queue or "") of each AppWrapper that holds room as
        of its last derived standing or assumed dispatch (read-only; for "see the queue")."""
        for key, entry in self._entries.items():
            if entry.phase not in HOLDING:
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
        for key, entry in self._entries.items():
            standing = entry.standing
            if (
                standing is not None
                and standing.charge is not None
                and (standing.charge.queue in queues or standing.local in locals_)
            ):
                found.append(key)
        return found

    def quota_usage(
        self, now: float
    ) -> tuple[list[Charge], list[Workload], dict[str, str], set[str]]:
        """(charges of the dispatched, the queued workloads, dispatched key -> AppQueue,
        the queued ones still charged while their last dispatch's pods go), for the
        queues' status."""
        moment = datetime.fromtimestamp(now, UTC)
        charges: list[Charge] = []
        pending: list[Workload] = []
        local_of: dict[str, str] = {}
        releasing: set[str] = set()
        for key, entry, guess, standing in self._holding(moment):
            if guess is not None:
                if guess.charge is not None:
                    charges.append(guess.charge)
                    local_of[key] = guess.local
                continue
            if standing.charge is not None:
                charges.append(standing.charge)
                local_of[key] = standing.local
            else:
                if standing.pending is not None:
                    pending.append(standing.pending)
                if standing.lingering is not None and self._holding_pods(key, entry.uid):
                    charges.append(standing.lingering)
                    local_of[key] = standing.local
                    releasing.add(key)
        return charges, pending, local_of, releasing

    def _holding(self, moment: datetime) -> Iterator[tuple[str, _Entry, Assumed | None, Standing]]:
        """Each AppWrapper in a phase that wants or holds room: its assumed dispatch, if
        one is in flight, else its standing (derived on first need)."""
        for key, entry in self._entries.items():
            if entry.phase not in HOLDING:
                continue
            if entry.assumed is not None:
                yield key, entry, entry.assumed, NOT_SCHEDULED
                continue
            standing = entry.standing
            if standing is None:
                standing = entry.standing = self._derive(key, moment)
            yield key, entry, None, standing

    def _derive(self, key: str, now: datetime) -> Standing:
        obj = self._current(key)
        if obj is None:
            return NOT_SCHEDULED
        try:
            aw = self._models.parse(obj)
        except ValidationError:
            return NOT_SCHEDULED
        status = aw.status
        deleting = bool(aw.metadata.deletionTimestamp)
        if deleting and not cond.is_dispatched(status):
            return NOT_SCHEDULED
        if cond.is_new(status) and FINALIZER not in aw.metadata.finalizers:
            return NOT_SCHEDULED  # the reconciler has not taken it in yet
        if cond.is_dispatched(status):
            assert status is not None
            workload = self._models.workload(aw, priority=status.priority or 0, now=now)
            if not isinstance(workload, Workload):
                return NOT_SCHEDULED
            dispatched = now.timestamp()
            if status.lastDispatchedAt:
                with contextlib.suppress(ValueError):
                    dispatched = parse_time(status.lastDispatchedAt).timestamp()
            charge, local = None, ""
            admission = status.admission
            if admission is not None:
                chosen = tuple((f.name, tuple(f.resources)) for f in admission.flavors)
                workload = with_flavors(workload, chosen, self._flavors())
                charge = charge_of(
                    key,
                    admission.clusterQueue,
                    workload,
                    chosen,
                    admitted_at=dispatched,
                    spec=self._queues().get(admission.clusterQueue),
                )
                local = admission.queue
            return Standing(
                held=workload,
                charge=charge,
                local=local,
                cluster=status.clusterName or self._only_member(),
                dispatched_at=dispatched,
                # Being evicted or deleted already: it holds its room until its objects
                # are gone (they may still make pods), but is nobody's victim again.
                candidate=not (deleting or status.is_true(ConditionType.PREEMPTED)),
            )
        queued = cond.is_queued(status) or cond.is_new(status)
        if queued or (status is not None and status.admission is not None):
            priority, error = self._models.priority(aw)
            if error or self._models.refusal(aw, obj):
                return NOT_SCHEDULED
            workload = self._models.workload(aw, priority=priority, now=now)
            if isinstance(workload, Workload):
                lingering, local = None, ""
                admission = status.admission if status is not None else None
                if admission is not None:
                    chosen = tuple((f.name, tuple(f.resources)) for f in admission.flavors)
                    lingering = charge_of(
                        key,
                        admission.clusterQueue,
                        workload,
                        chosen,
                        admitted_at=0.0,
                        spec=self._queues().get(admission.clusterQueue),
                    )
                    local = admission.queue
                # Pausing after a requeue (backoff): not pending, maybe still charged.
                pending = workload if queued else None
                return Standing(pending=pending, lingering=lingering, local=local)
        return NOT_SCHEDULED

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
        for key, entry in self._entries.items():
            eviction = entry.eviction
            if eviction is None or now - eviction.at > CLAIM_TIMEOUT:
                continue
            # Requeued before this process saw it evicting: its member is where its pods
            # still are, or the only one; else the claim is not known (multi-cluster only).
            where = eviction.cluster or self._holding_pods(key, entry.uid) or self._only_member()
            if not where:
                continue
            claim = claims.get(eviction.preemptor)
            if claim is None:
                claims[eviction.preemptor] = Claim(where, (key,), eviction.at)
            elif claim.cluster == where:
                claims[eviction.preemptor] = Claim(
                    where, (*claim.victims, key), min(claim.at, eviction.at)
                )
        return claims

    def _holding_pods(self, key: str, uid: str) -> str:
        """The member where a requeued victim's pods still hold room ("" if none)."""
        for name, member in self._members.items():
            if any(p.holds_capacity for p in member.capacity.owned_pods(key, uid)):
                return name
        return ""
