"""What one AppWrapper, at one resourceVersion, is to the scheduler. No I/O.

`derive` reads the AppWrapper's current object (its status as last written) into a
`Standing`: queued (its workload), dispatched (what it holds, in which member, its quota
charge, its protection from preemption) or neither; `eviction_of` reads the record an
eviction leaves on its victim. The scheduler cache derives a standing once per
resourceVersion (`controller/scheduling/cache.py`). Its one side effect is a log line for a
protection annotation stored with a value the webhook refuses (read as no ask).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import structlog
from pydantic import ValidationError

from dispatcher.api.constants import FINALIZER
from dispatcher.api.models import AppWrapper, ConditionType, parse_time
from dispatcher.controller.reading import AppWrapperReader
from dispatcher.core import checkstatus, protection
from dispatcher.core.model import Workload
from dispatcher.core.phase import dispatched, initialised, queueing
from dispatcher.core.quota.flavors import charge_of, with_flavors
from dispatcher.core.quota.model import Charge, QuotaSetup

Obj = dict[str, Any]
UNSET = protection.Unset()
_log = structlog.get_logger("scheduler")


@dataclass(frozen=True, slots=True)
class Standing:
    """What one AppWrapper, at one resourceVersion, is to the scheduler: queued (wants
    room), dispatched (holds room in `cluster` since `dispatched_at`), or neither."""

    queued: Workload | None = None
    occupying: Workload | None = None
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
    checkpointed_at: float = 0.0
    """Dispatched: the last checkpoint it declared, held to this attempt (0.0: none)."""


NOT_SCHEDULED = Standing()


@dataclass(frozen=True, slots=True)
class Eviction:
    """A victim's own record of an eviction: who its room is for, where, since when."""

    preemptor: str
    cluster: str  # "" once requeued (its pods may still be terminating somewhere)
    at: float
    removes_at: float
    """When its objects are removed: `at` plus the notice it was given (`at` for none)."""


def eviction_of(obj: Obj) -> Eviction | None:
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
    removes_at = protection.removal_time(str(condition.get("message") or ""), at)
    return Eviction(str(preemptor), str(status.get("clusterName") or ""), at, removes_at)


def derive(
    obj: Obj | None,
    key: str,
    models: AppWrapperReader,
    *,
    now: datetime,
    setup: Callable[[], QuotaSetup],
    only_member: Callable[[], str],
    defaults: protection.Defaults = UNSET,
) -> Standing:
    """`key`'s standing from its current object (None: gone). `only_member`: the member
    a dispatch that recorded none went to (single-cluster mode), else "". `defaults`: the
    protection where no queue says (settings `protection`)."""
    if obj is None:
        return NOT_SCHEDULED
    try:
        aw = models.parse(obj)
    except ValidationError:
        return NOT_SCHEDULED
    status = aw.status
    deleting = bool(aw.metadata.deletionTimestamp)
    if deleting and not dispatched(status):
        return NOT_SCHEDULED
    if not initialised(status) and FINALIZER not in aw.metadata.finalizers:
        return NOT_SCHEDULED  # the reconciler has not taken it in yet
    if dispatched(status):
        return _dispatched(
            key, aw, models, now=now, setup=setup, only_member=only_member, defaults=defaults
        )
    queued = queueing(status) or not initialised(status)
    if queued or (status is not None and status.admission is not None):
        priority, error = models.priority(aw)
        if error or models.refusal(aw, obj):
            return NOT_SCHEDULED
        workload = models.workload(aw, priority=priority, now=now)
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
                    spec=setup().queues.get(admission.clusterQueue),
                )
                local = admission.queue
            if (
                status is not None
                and status.is_true(ConditionType.QUOTA_HELD)
                and not checkstatus.checks_ready(status)
            ):
                # Held for its admission checks: charged, not pending, holding no room.
                return Standing(charge=lingering, local=local)
            if checkstatus.checks_ready(status):
                workload = replace(workload, checked=True)
            # Pausing after a requeue (backoff): not pending, maybe still charged.
            pending = workload if queued else None
            return Standing(queued=pending, lingering=lingering, local=local)
    return NOT_SCHEDULED


def _dispatched(
    key: str,
    aw: AppWrapper,
    models: AppWrapperReader,
    *,
    now: datetime,
    setup: Callable[[], QuotaSetup],
    only_member: Callable[[], str],
    defaults: protection.Defaults,
) -> Standing:
    """A dispatched one: what it holds, where, since when, what it is charged, and how
    long it is protected from preemption (its queue's, or the settings' where it has none)."""
    status = aw.status
    deleting = bool(aw.metadata.deletionTimestamp)
    assert status is not None
    workload = models.workload(aw, priority=status.priority or 0, now=now)
    if not isinstance(workload, Workload):
        return NOT_SCHEDULED
    dispatched = now.timestamp()
    if status.lastDispatchedAt:
        with contextlib.suppress(ValueError):
            dispatched = parse_time(status.lastDispatchedAt).timestamp()
    charge, local, queue = None, "", None
    admission = status.admission
    if admission is not None:
        chosen = tuple((f.name, tuple(f.resources)) for f in admission.flavors)
        workload = with_flavors(workload, chosen, setup().flavors)
        queue = setup().queues.get(admission.clusterQueue)
        charge = charge_of(
            key,
            admission.clusterQueue,
            workload,
            chosen,
            admitted_at=dispatched,
            spec=queue,
        )
        local = admission.queue
    asked = protection.asked(aw.metadata.annotations)
    if asked.problems:
        # The webhook refuses these; stored anyway, they ask nothing (never a failure).
        _log.warning("protection_annotation_ignored", appwrapper=key, problem=asked.problems[0])
    minimum = protection.effective_minimum_runtime(asked.minimum_runtime, queue, defaults)
    if minimum != workload.minimum_runtime:
        workload = replace(workload, minimum_runtime=minimum)
    return Standing(
        occupying=workload,
        charge=charge,
        local=local,
        cluster=status.clusterName or only_member(),
        dispatched_at=dispatched,
        # Being evicted or deleted already: it holds its room until its objects
        # are gone (they may still make pods), but is nobody's victim again.
        candidate=not (deleting or status.is_true(ConditionType.PREEMPTED)),
        checkpointed_at=protection.checkpoint_within(
            asked.checkpointed_at, dispatched_at=dispatched, now=now.timestamp()
        ),
    )
