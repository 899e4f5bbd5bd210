"""The scheduler cache: a passive index of what the scheduler knows about each AppWrapper.

No I/O, and no decision. Fed by the AppWrapper watch and by the status writer's own writes
(`update`), it keeps one entry per AppWrapper: its phase, its standing at its current
version (what it is to the scheduler: queued with its workload, or holding room in a member,
derived once per version on first need), an eviction its status records, and a dispatch
decided but not yet written (assumed). Which keys changed since the scheduler last looked
is kept (`take_changed`); what the scheduler builds from them — the pending queues, the
quota in use, the members' snapshots — is the scheduler's own (`scheduling/state.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispatcher.cluster.member import Member
from dispatcher.controller.reading import AppWrapperReader, resource_version
from dispatcher.controller.scheduling.standing import (
    UNSET,
    Eviction,
    Standing,
    derive,
    eviction_of,
)
from dispatcher.core.model import Workload
from dispatcher.core.phase import Phase, phase_of_raw
from dispatcher.core.protection import Defaults
from dispatcher.core.quota.model import Charge, QuotaSetup
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
class Entry:
    version: int
    phase: Phase
    generation: int | None
    eviction: Eviction | None
    uid: str = ""  # its pods are those with this uid (not an earlier one's of its name)
    queue: str = ""  # the queue it names (a label: editing it changes no generation)
    standing: Standing | None = None  # derived at `version` on first need
    assumed: Assumed | None = None
    busy: bool = False  # an admission or eviction write for it is in flight


@dataclass(frozen=True, slots=True)
class Update:
    decision: bool = False
    """A scheduling decision may change: a new phase, a new spec, or it went."""
    finished: bool = False
    """It just finished (Completed or Failed), having been seen alive."""


class SchedulerCache:
    def __init__(
        self,
        *,
        models: AppWrapperReader,
        current: Callable[[str], Obj | None],
        members: Mapping[str, Member],
        setup: Callable[[], QuotaSetup] = QuotaSetup,
        protection: Defaults = UNSET,
    ) -> None:
        self._models = models
        self._protection = protection
        """Where no queue says: how long dispatched work is protected from preemption."""
        self._current = current
        self._members = members
        self._setup = setup
        """The quota objects: the flavors an admission names, what each queue charges."""
        self._entries: dict[str, Entry] = {}
        self._queued: set[str] = set()
        """Keys in phase queued: with none, there is no cycle to run."""
        self._changed: set[str] = set()
        """Keys whose facts changed since the scheduler last took them (`take_changed`)."""
        self._all_changed = False
        """Priorities or queues changed: every standing is derived again."""
        self._evicted: set[str] = set()
        """Keys whose status records an eviction (their preemptor's claim)."""
        self._by_uid: dict[str, str] = {}  # uid -> key (for `preemptedBy`: the claims)

    # -- fed by the watch and by our own writes -----------------------------------------

    def update(self, key: str, obj: Obj | None) -> Update:
        """Record the newest object of `key` (None: deleted) and say what that changed."""
        if obj is None:
            self._queued.discard(key)
            self._evicted.discard(key)
            left = self._entries.pop(key, None)
            self._by_uid.pop(left.uid if left is not None else "", None)
            self._changed.add(key)
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
        self._changed.add(key)
        if entry is None:
            self._entries[key] = Entry(version, phase, generation, eviction, uid, queue)
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
        self._changed.update(self._entries)
        self._all_changed = True

    def take_changed(self) -> tuple[set[str], bool]:
        """The keys changed since the last call, and whether every standing was forgotten
        (the scheduler's `refresh` carries them into what it keeps)."""
        changed, everything = self._changed, self._all_changed
        self._changed, self._all_changed = set(), False
        return changed, everything

    # -- the scheduler's writes in flight -----------------------------------------------

    def assume(self, key: str, assumed: Assumed) -> None:
        """A dispatch is decided: its room counts from now, until its write returns."""
        entry = self._entries[key]
        entry.assumed = assumed
        entry.busy = True

    def start(self, key: str) -> None:
        """A write about `key` (an eviction) is in flight: decide nothing else for it."""
        self._entries[key].busy = True
        self._changed.add(key)

    def finish(self, key: str) -> None:
        """The write returned (the overlay shows its result) or failed: drop the guess."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.assumed = None
            entry.busy = False
            self._changed.add(key)

    # -- reads --------------------------------------------------------------------------

    def busy(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.busy

    def anything_queued(self) -> bool:
        return bool(self._queued)

    def entry(self, key: str) -> Entry | None:
        return self._entries.get(key)

    def standing(self, key: str, now: datetime) -> Standing | None:
        """What `key` is to the scheduler at its current version (derived on first need)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.standing is None:
            entry.standing = derive(
                self._current(key),
                key,
                self._models,
                now=now,
                setup=self._setup,
                only_member=self.only_member,
                defaults=self._protection,
            )
        return entry.standing

    def finished(self, key: str) -> bool:
        return self.phase(key) is Phase.FINISHED

    def alive(self, key: str) -> bool:
        """Known and not finished (its life is still counted)."""
        return self.phase(key) not in (None, Phase.FINISHED)

    def phase(self, key: str) -> Phase | None:
        entry = self._entries.get(key)
        return entry.phase if entry is not None else None

    def keys(self, phases: frozenset[Phase]) -> Iterator[str]:
        return (k for k, e in self._entries.items() if e.phase in phases)

    def evicted(self) -> Iterator[tuple[str, Entry, Eviction]]:
        """Every AppWrapper whose status records an eviction, in key order."""
        for key in sorted(self._evicted):
            entry = self._entries[key]
            if entry.eviction is not None:
                yield key, entry, entry.eviction

    def key_of_uid(self, uid: str) -> str | None:
        return self._by_uid.get(uid)

    def assumed_cluster(self, key: str) -> str | None:
        entry = self._entries.get(key)
        return entry.assumed.cluster if entry is not None and entry.assumed else None

    def charge_of(self, key: str) -> Charge | None:
        """What a dispatched AppWrapper uses of its queue's quota, as last derived."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.assumed is not None:
            return entry.assumed.charge
        return entry.standing.charge if entry.standing is not None else None

    def checkpointed_at(self, key: str) -> float:
        """The last checkpoint a dispatched AppWrapper declared, as last derived (0.0: none)."""
        entry = self._entries.get(key)
        standing = entry.standing if entry is not None else None
        return standing.checkpointed_at if standing is not None else 0.0

    def only_member(self) -> str:
        # Dispatched before the cluster was recorded (by MCAD, which had no clusterName):
        # in single-cluster mode there is only one place it can be.
        return next(iter(self._members)) if len(self._members) == 1 else ""

    def __len__(self) -> int:
        return len(self._entries)
