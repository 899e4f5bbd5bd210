"""What the controller remembers between reconciles, all of it re-derivable from the API
server (rule 5): a restart loses only speed, never correctness.

No I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dispatcher.api.models import AppWrapper
from dispatcher.core.model import AdmittedWorkload, Reservation, Workload
from dispatcher.core.scheduling import Claim
from dispatcher.core.workloads import InvalidSpec, workload_of

Obj = dict[str, Any]
PARSED_LIMIT = 512


def resource_version(obj: Obj | None) -> int:
    """etcd revisions are numbers; an unreadable one sorts first (treated as oldest)."""
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class Assumed:
    """A dispatch decided by the scheduler whose status write the watch has not shown yet.

    Its capacity counts from the moment of the decision, so the next cycle cannot give the
    same room to someone else (Kueue's "assume, then write").
    """

    workload: Workload
    cluster: str
    at: float


@dataclass(frozen=True, slots=True)
class Standing:
    """What one AppWrapper, at one resourceVersion, is to the scheduler: queued (wants
    room), dispatched (holds room in `cluster` since `dispatched_at`), or neither."""

    pending: Workload | None = None
    held: Workload | None = None
    cluster: str = ""
    dispatched_at: float = 0.0


NOT_SCHEDULED = Standing()


@dataclass(frozen=True, slots=True)
class Holding:
    """A dispatched AppWrapper's reservation and usage, derived from its pods."""

    revision: int
    workload: Workload
    dispatched_at: float
    reservation: Reservation | None
    admitted: AdmittedWorkload


@dataclass
class ControllerState:
    """Shared by the reconciler and the scheduler; only touched on the event loop."""

    written: dict[str, Obj] = field(default_factory=dict)
    """AppWrappers as our own last writes returned them, newer than the watch may show."""
    assumed: dict[str, Assumed] = field(default_factory=dict)
    dispatching: set[str] = field(default_factory=set)
    """Keys whose dispatch task (status write + creates) is running."""
    ensured: dict[str, str] = field(default_factory=dict)
    """key -> lastDispatchedAt of the dispatch whose objects are known to exist (rebuilt
    after a restart)."""
    cleaned: dict[str, tuple[str, str]] = field(default_factory=dict)
    """key -> (uid, lastDispatchedAt) of the failed dispatch whose objects were removed."""
    workloads: dict[str, tuple[tuple[str, int, int, int, str], Workload | InvalidSpec]] = field(
        default_factory=dict
    )
    claims: dict[str, Claim] = field(default_factory=dict)
    """preemptor key -> the room its victims are freeing for it."""
    evicted: dict[str, str] = field(default_factory=dict)
    """victim key -> lastDispatchedAt of the dispatch it was evicted from (never evict twice)."""
    waiting_written: dict[str, tuple[str, float]] = field(default_factory=dict)
    """key -> (message, when) of the last "waiting because" status write."""
    counts_written: dict[str, float] = field(default_factory=dict)
    """key -> when pod counts were last written (they are written at most every few s)."""

    phases: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    """key -> (phase, generation) as last seen by the watch; the scheduler's index."""
    parsed: dict[str, tuple[str, AppWrapper]] = field(default_factory=dict)
    """key -> (resourceVersion, model), least recently used first: validating a whole
    AppWrapper is costly, and a reconcile often reads the same one several times."""

    standings: dict[str, tuple[str | None, Standing]] = field(default_factory=dict)
    """key -> (resourceVersion, standing): a cycle re-derives only what changed."""
    holdings: dict[str, Holding] = field(default_factory=dict)
    """key -> reservation and usage of a dispatched one, until its pods change."""

    def parse(self, obj: Obj) -> AppWrapper:
        """The model of `obj`, validated once per resourceVersion (ValidationError if bad).

        The returned model is shared: callers copy the status before changing it.
        """
        meta = obj.get("metadata", {})
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        version = str(meta.get("resourceVersion", ""))
        cached = self.parsed.pop(key, None)
        if cached is not None and cached[0] == version and version:
            self.parsed[key] = cached  # most recently used last
            return cached[1]
        model = AppWrapper.from_kube(obj)
        self.parsed[key] = (version, model)
        if len(self.parsed) > PARSED_LIMIT:
            # A model weighs about twice its object: keep only the recently used ones.
            del self.parsed[next(iter(self.parsed))]
        return model

    def latest(self, key: str, watched: Obj | None) -> Obj | None:
        mine = self.written.get(key)
        if watched is None:
            self.written.pop(key, None)
            return None
        if mine is not None and resource_version(mine) > resource_version(watched):
            return mine
        self.written.pop(key, None)
        return watched

    def workload(
        self,
        aw: AppWrapper,
        *,
        priority: int,
        allowed_kinds: frozenset[str] | None,
        now: datetime,
    ) -> Workload | InvalidSpec:
        """Parse once per (uid, generation, priority): a cycle over 10k AppWrappers must not
        re-infer pod sets from templates every time."""
        status = aw.status
        # Age and queueing time come from status too (queuedAt, requeues): part of the key.
        stamp = (
            aw.metadata.uid or "",
            aw.metadata.generation or 0,
            priority,
            status.requeueCount if status is not None else 0,
            (status.queuedAt or "") if status is not None else "",
        )
        cached = self.workloads.get(aw.key)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        result = workload_of(aw, priority=priority, allowed_kinds=allowed_kinds, now=now)
        self.workloads[aw.key] = (stamp, result)
        return result

    def retire(self, key: str) -> None:
        """It finished: drop what only a queued or dispatched AppWrapper needs (held per
        AppWrapper, this is most of the memory of thousands of finished ones)."""
        self.parsed.pop(key, None)
        self.ensured.pop(key, None)
        self.workloads.pop(key, None)
        self.standings.pop(key, None)
        self.holdings.pop(key, None)
        self.waiting_written.pop(key, None)
        self.counts_written.pop(key, None)

    def forget(self, key: str) -> None:
        """It is gone: drop everything kept about it."""
        self.retire(key)
        self.claims.pop(key, None)
        self.cleaned.pop(key, None)
        self.evicted.pop(key, None)
        self.written.pop(key, None)
        self.assumed.pop(key, None)
