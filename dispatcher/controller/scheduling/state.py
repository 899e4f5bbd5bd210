"""What the scheduler keeps from cycle to cycle, and changes only inside its cycle.

No I/O. The scheduler owns one `SchedulerState`: the pending workloads in a
`core.queues.QueueManager` (`queues`; each in its line, the cluster queue it resolves to, ""
for capacity only), the quota in use in a `core.quota.usage.Usage` (charged on assume and on
a dispatch seen, released on finish, requeue, deletion, or when a requeued one's last pods
go), which AppWrappers hold room in a member, and the members' last snapshots. Nothing else
writes any of it: the watch and the status writer feed the passive `SchedulerCache`, and
`refresh`, called by the cycle alone, carries what changed there into what is kept here.
Only the AppWrappers whose facts changed are derived again; a cycle costs what changed and
what holds room, not the whole backlog.

Because every change happens inside the (synchronous) cycle, anything read from here
between two cycles is the state as the last cycle left it: the scheduler publishes it as a
frozen `SchedulerView` (view.py) built on the first read after each cycle.

Preemption claims are not remembered but derived from the API server's objects: a victim's
status names its preemptor (`preemptedBy`) until it is dispatched again, so a restarted or
new leader sees which evictions were made and never evicts twice for one need.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dispatcher.cluster.capacity import Owner
from dispatcher.cluster.member import Member
from dispatcher.controller.scheduling.cache import Assumed, SchedulerCache
from dispatcher.controller.scheduling.view import SchedulerView
from dispatcher.core.model import ClusterSnapshot, DispatchedWorkload, PodSet, Reservation, Workload
from dispatcher.core.phase import SCHEDULED, Phase
from dispatcher.core.queues import QueueManager
from dispatcher.core.quota.charges import Charges
from dispatcher.core.quota.model import Charge
from dispatcher.core.quota.resolve import resolve
from dispatcher.core.quota.tree import QuotaTree
from dispatcher.core.reservations import Occupancy, occupancy
from dispatcher.core.scheduling import PreemptorClaim, Wait

MAY_OCCUPY = SCHEDULED | {Phase.DELETING, Phase.BACKOFF}
"""Phases whose standing is kept (`refresh`): the ones that want room, and the ones that
may hold it (a dispatched AppWrapper being deleted holds it until its objects are gone;
one pausing after a requeue may still hold quota while its pods go)."""
CLAIM_TIMEOUT = 120.0
"""Seconds a preemptor's claim on the room its victims free lasts once their objects are
removed (at the end of the notice they were given; victims stuck terminating must not hold a
cluster for ever)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    clusters: list[ClusterSnapshot]
    claims: dict[str, PreemptorClaim] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Occupied:
    """One holder's room as last computed, kept until its pods change."""

    revision: int
    workload: Workload
    dispatched_at: float
    occupancy: Occupancy


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


def _strays(member: Member, occupants: set[Owner]) -> list[Reservation]:
    """Pods of AppWrappers that hold nothing any more (requeued, evicted, deleted, or an
    earlier AppWrapper of the same name) that are not on a node yet but may still be put on
    one (their objects are being removed): reserved until they are gone, or a dispatch could
    be given their room."""
    strays = []
    for owner in member.capacity.owners():
        if owner in occupants:
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


class SchedulerState:
    def __init__(self, cache: SchedulerCache, members: Mapping[str, Member]) -> None:
        self._cache = cache
        self._members = members
        self.queues = QueueManager()
        """The pending workloads, each in its line, in order (the cycle's `take`)."""
        self._tree: QuotaTree | None = None
        self._usage: Charges | None = None
        self._charged: dict[str, tuple[Charge, str]] = {}
        """key -> (the charge held, the AppQueue admitted through): what `_usage` holds."""
        self._lingering: dict[str, Charge] = {}
        """Requeued ones with their last admission's charge, kept while their pods go."""
        self._occupants: dict[str, None] = {}
        """Keys that hold room in a member (dispatched, or a dispatch assumed), in order."""
        self._occupied: dict[str, _Occupied] = {}
        """Each holder's room as last computed (`_occupancies`)."""
        self.charges_changed = 0
        """Counts the changes of what is charged (the queues' status shows it)."""
        self._seen: tuple[dict[str, ClusterSnapshot], dict[str, PreemptorClaim]] = ({}, {})
        """The last cycle's member snapshots and claims: capacity-parked work is woken
        when room may have been freed since (`_freed`)."""

    # -- carried in from the cache (the cycle's first step) ------------------------------

    def refresh(self, now: float, tree: QuotaTree | None) -> None:
        """Carry what changed in the cache since the last call into `queues` and the usage:
        the keys whose facts changed are derived again; the lingering charges whose pods
        are gone are released. A new quota tree re-resolves every pending one's line."""
        changed, everything = self._cache.take_changed()
        if everything:
            self.queues.line_changed()
        if tree is not self._tree:
            self._tree = tree
            self._usage = Charges(tree) if tree is not None else None
            if self._usage is not None:
                for charge, _ in self._charged.values():
                    self._usage.charge(charge)
            changed.update(self.queues.workloads())
            self.queues.line_changed()
        moment = datetime.fromtimestamp(now, UTC)
        for key in changed:
            self._sync(key, moment)
        for key, charge in list(self._lingering.items()):
            entry = self._cache.entry(key)
            if entry is None or not self._where_pods_occupy(key, entry.uid):
                del self._lingering[key]
                if key in self._charged and self._charged[key][0] is charge:
                    self._set_charge(key, None, "")

    def _sync(self, key: str, moment: datetime) -> None:
        entry = self._cache.entry(key)
        if entry is None or entry.phase not in MAY_OCCUPY:
            self.queues.remove(key)
            self._leave(key)
            self._lingering.pop(key, None)
            self._set_charge(key, None, "")
            return
        if entry.assumed is not None:
            self.queues.remove(key)
            self._occupants[key] = None
            self._lingering.pop(key, None)
            self._set_charge(key, entry.assumed.charge, entry.assumed.local)
            return
        standing = self._cache.standing(key, moment)
        assert standing is not None
        if standing.occupying is not None:
            self._occupants[key] = None
        else:
            self._leave(key)
        charge = standing.charge
        self._lingering.pop(key, None)
        lingering = standing.lingering
        if charge is None and lingering is not None and self._where_pods_occupy(key, entry.uid):
            charge = self._lingering[key] = lingering
        self._set_charge(key, charge, standing.local)
        pending = standing.queued
        if pending is None or entry.busy:
            self.queues.remove(key)
            return
        line = self._line(pending)
        if self.queues.line_of(key) != line or self.queues.workload(key) != pending:
            self.queues.upsert(pending, line)

    def _leave(self, key: str) -> None:
        self._occupants.pop(key, None)
        self._occupied.pop(key, None)  # a finished one's room is most of its memory

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
        if old is None and charge is None:
            return
        if old is not None and old[0] is charge:
            self._charged[key] = (charge, local)
            return
        if charge is None:
            self._charged.pop(key, None)
        else:
            self._charged[key] = (charge, local)
        self.charges_changed += 1
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

    # -- the cycle's decisions, kept at once ---------------------------------------------

    def assume(self, key: str, assumed: Assumed) -> None:
        """An admission is decided: the next cycle sees its room and quota in use."""
        self._cache.assume(key, assumed)
        self.queues.remove(key)
        self._occupants[key] = None
        self._lingering.pop(key, None)
        self._set_charge(key, assumed.charge, assumed.local)

    def start(self, key: str) -> None:
        """An eviction of `key` is decided: nothing else is decided for it meanwhile."""
        self._cache.start(key)
        self.queues.remove(key)

    # -- what the cycle fits against -----------------------------------------------------

    def usage(self) -> Charges | None:
        """The quota in use, kept (a copy of its ledger starts each cycle's `QuotaView`)."""
        return self._usage

    def snapshot(self, now: float) -> Snapshot:
        """Per member, capacity minus what dispatched ones hold (after `refresh`), and the
        preemptors' claims. Capacity-parked work is woken when these changed."""
        occupants: dict[str, list[tuple[str, str, Workload, float, bool]]] = {
            name: [] for name in self._members
        }
        for key in self._occupants:
            entry = self._cache.entry(key)
            if entry is None:
                continue
            guess = entry.assumed
            if guess is not None:
                if guess.cluster in occupants:
                    item = (key, entry.uid, guess.workload, guess.at, True)
                    occupants[guess.cluster].append(item)
                continue
            standing = entry.standing
            if standing is None or standing.occupying is None:
                continue
            if standing.cluster in occupants:
                item = (
                    key,
                    entry.uid,
                    standing.occupying,
                    standing.dispatched_at,
                    standing.candidate,
                )
                occupants[standing.cluster].append(item)
        clusters = []
        for name, member in self._members.items():
            reservations, admitted = self._occupancies(member, occupants[name])
            reservations += _strays(member, {(item[0], item[1]) for item in occupants[name]})
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

    def _occupancies(
        self, member: Member, occupants: list[tuple[str, str, Workload, float, bool]]
    ) -> tuple[list[Reservation], list[DispatchedWorkload]]:
        """Reservations for dispatched pods not yet on a node, and what each one uses; kept
        per AppWrapper until its pods change."""
        reservations: list[Reservation] = []
        admitted: list[DispatchedWorkload] = []
        capacity = member.capacity
        for key, uid, workload, dispatched_at, candidate in occupants:
            revision = capacity.owner_revision(key, uid)
            known = self._occupied.get(key)
            checkpointed_at = self._cache.checkpointed_at(key)
            if (
                known is None
                or known.revision != revision
                or known.workload is not workload
                or known.dispatched_at != dispatched_at
                or known.occupancy.admitted.checkpointed_at != checkpointed_at
            ):
                pods = capacity.owned_pods(key, uid)
                found = occupancy(
                    workload, pods, dispatched_at=dispatched_at, checkpointed_at=checkpointed_at
                )
                known = self._occupied[key] = _Occupied(revision, workload, dispatched_at, found)
            if known.occupancy.reservation is not None:
                reservations.append(known.occupancy.reservation)
            if candidate:
                admitted.append(known.occupancy.admitted)
        return reservations, admitted

    def _claims(self, now: float) -> dict[str, PreemptorClaim]:
        """preemptor -> the member where its victims' room is being freed for it.

        A claim lasts until its victims are dispatched again (which clears their record) or
        CLAIM_TIMEOUT passes, not only while their pods go: room freed for a preemptor that
        an older AppWrapper of its priority took first must not cost another eviction at
        once. While its victims are gone but it does not fit, the preemptor waits.
        """
        claims: dict[str, PreemptorClaim] = {}
        for key, entry, eviction in self._cache.evicted():
            if now - eviction.removes_at > CLAIM_TIMEOUT:  # counted from the notice's end
                continue
            # Requeued before this process saw it evicting: its member is where its pods
            # still are, or the only one; else the claim is not known (multi-cluster only).
            where = eviction.cluster or self._where_pods_occupy(key, entry.uid)
            where = where or self._cache.only_member()
            if not where:
                continue
            # One of another namespace is recorded by uid (`core.mentions.recorded_preemptor`).
            preemptor = self._cache.key_of_uid(eviction.preemptor) or eviction.preemptor
            claim = claims.get(preemptor)
            if claim is None:
                claims[preemptor] = PreemptorClaim(where, (key,), eviction.at)
            elif claim.cluster == where:
                claims[preemptor] = PreemptorClaim(
                    where, (*claim.victims, key), min(claim.at, eviction.at)
                )
        return claims

    def _where_pods_occupy(self, key: str, uid: str) -> str:
        """The member where a requeued victim's pods still hold room ("" if none)."""
        for name, member in self._members.items():
            if any(p.occupies_node for p in member.capacity.owned_pods(key, uid)):
                return name
        return ""

    # -- read between cycles (the state the last cycle left) -----------------------------

    def running(self) -> Iterator[tuple[str, float, str]]:
        """(key, dispatched at, cluster queue or "") of each AppWrapper that holds room as
        of its last derived standing or assumed dispatch (read by the cycle: the cache's
        entries move between cycles)."""
        for key in self._occupants:
            entry = self._cache.entry(key)
            if entry is None or entry.phase not in MAY_OCCUPY:
                continue
            assumed, standing = entry.assumed, entry.standing
            if assumed is not None:
                yield key, assumed.at, assumed.charge.queue if assumed.charge else ""
            elif standing is not None and standing.occupying is not None:
                queue = standing.charge.queue if standing.charge else ""
                yield key, standing.dispatched_at, queue

    def view(
        self, waits: Mapping[str, Wait], cycle: int, running: tuple[tuple[str, float, str], ...]
    ) -> SchedulerView:
        """A frozen copy of what the last cycle left, for the readers of `SchedulerView`
        (`running` as the cycle saw it: the cache's entries move between cycles)."""
        return SchedulerView(
            cycle=cycle,
            charges={k: c for k, (c, _) in self._charged.items()},
            local_of={k: local for k, (_, local) in self._charged.items()},
            releasing=frozenset(self._lingering),
            pending=tuple(self.queues.workloads().values()),
            waits={k: w for k, w in waits.items() if k in self.queues},
            running=running,
        )
