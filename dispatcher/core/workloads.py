"""From an AppWrapper (the API model) to what the core schedules. Pure, no I/O.

`workload_of` validates the wrapped items, works out the pods they will make (from
`custompodresources` where given, else inferred from the object), and returns either a
`Workload` or an `InvalidSpec` whose message tells the user exactly what to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from dispatcher.api.constants import KUEUE_LABEL_QUEUE, LABEL_QUEUE
from dispatcher.api.models import (
    AppWrapper,
    GenericItem,
    LabelSelectorRequirement,
    parse_time,
)
from dispatcher.api.quantity import QuantityError
from dispatcher.core.declared import declared_pod_sets, with_pod_set_infos
from dispatcher.core.faulttolerance import problems as fault_tolerance_problems
from dispatcher.core.model import (
    LABEL_OPERATORS,
    LabelRequirement,
    Placement,
    PodSet,
    Workload,
    pod_count,
    total_requests,
)
from dispatcher.core.podsets import (
    MAX_PODS,
    cannot_infer,
    infer_pod_sets,
    pod_sets_from_custom,
)
from dispatcher.core.validation import (
    DEFAULT_CLUSTER_SCOPED,
    bounded_message,
    validate_appwrapper,
)


@dataclass(frozen=True, slots=True)
class InvalidSpec:
    message: str


def item_pod_sets(item: GenericItem, *, as_written: bool = True) -> tuple[PodSet, ...]:
    """The pods an item will make.

    `custompodresources` (MCAD's declaration) is used as written, as MCAD uses it. With
    `as_written` False, the pods' own requests win when the object is of a kind whose pods we
    can read and they ask for more of some resource in total (`pods`, their number, included):
    they are what kube-scheduler will see, and reserving less can start a gang whose pods
    cannot all be placed. An object whose pods cannot be read must declare them (an empty
    list declares none): raises QuantityError, never counts it as no pods.
    """
    written, at_least = item_readings(item)
    return written if as_written else at_least


WHERE = "item"
"""How item_readings' errors name the item's fields; its caller says which item."""


def item_readings(item: GenericItem) -> tuple[tuple[PodSet, ...], tuple[PodSet, ...]]:
    """The item's pods read both ways (`item_pod_sets`): (as written, at least the
    templates); the same tuple twice when the readings agree."""
    template = with_pod_set_infos(item, where=WHERE)
    if item.podSets is not None and item.custompodresources is None:
        declared = declared_pod_sets(template, item.podSets, where=WHERE)
        return declared, declared
    inferred = infer_pod_sets(template)
    if item.custompodresources is None:
        unreadable = cannot_infer(item.generictemplate)
        if unreadable is not None:
            raise QuantityError(unreadable)
        return inferred, inferred
    if not item.custompodresources:
        return inferred, inferred
    declared = pod_sets_from_custom(
        [c.model_dump(mode="json", exclude_none=True) for c in item.custompodresources]
    )
    smaller = inferred and not total_requests(inferred).fits_in(total_requests(declared))
    return (declared, inferred) if smaller else (declared, declared)


def label_requirement(where: str, expression: LabelSelectorRequirement) -> LabelRequirement:
    """One matchExpressions entry, checked as the API server checks a label selector's
    (errors start with `where`)."""
    operator, values = expression.operator, expression.values
    if operator not in LABEL_OPERATORS:
        raise ValueError(
            f"{where}: operator {operator!r} is not one of {', '.join(LABEL_OPERATORS)}"
        )
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"{where}: operator {operator} needs at least one value")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"{where}: operator {operator} takes no values")
    return LabelRequirement(key=expression.key, operator=operator, values=frozenset(values))


def placement_of(aw: AppWrapper) -> Placement | InvalidSpec:
    """Where the AppWrapper may go; InvalidSpec for a cluster selector that cannot be read."""
    scheduling = aw.spec.schedulingSpec.clusterScheduling
    if scheduling is None:
        return Placement()
    clusters = frozenset(c.name for c in scheduling.clusters) or None
    labels: tuple[tuple[str, str], ...] = ()
    expressions: list[LabelRequirement] = []
    selector = scheduling.clusterSelector
    if selector is not None:
        labels = tuple(sorted(selector.matchLabels.items()))
        errors = []
        for index, expression in enumerate(selector.matchExpressions):
            try:
                where = (
                    f"schedulingSpec.clusterScheduling.clusterSelector.matchExpressions[{index}]"
                )
                expressions.append(label_requirement(where, expression))
            except ValueError as exc:
                errors.append(str(exc))
        if errors:
            return InvalidSpec("; ".join(errors))
    # Sorted, so that the same selector written in another order is the same placement.
    ordered = tuple(sorted(expressions, key=lambda r: (r.key, r.operator, sorted(r.values))))
    return Placement(clusters=clusters, match_labels=labels, match_expressions=ordered)


def _timestamp(text: str | None, default: datetime) -> float:
    if not text:
        return default.timestamp()
    try:
        return parse_time(text).timestamp()
    except ValueError:
        return default.timestamp()


def workload_of(
    aw: AppWrapper,
    *,
    priority: int,
    allowed_kinds: frozenset[str] | None,
    now: datetime,
    declared_as_written: bool = True,
) -> Workload | InvalidSpec:
    namespace = aw.metadata.namespace
    missing = [
        f"item {index}: no generictemplate (the object to create)"
        for index, item in enumerate(aw.spec.items)
        if "generictemplate" not in item.model_fields_set
    ]
    if missing:
        return InvalidSpec(bounded_message(missing))
    templates = [item.generictemplate for item in aw.spec.items]
    errors = validate_appwrapper(
        templates,
        namespace=namespace,
        allowed_kinds=allowed_kinds,
        cluster_scoped_kinds=DEFAULT_CLUSTER_SCOPED,
    )
    errors.extend(fault_tolerance_problems(aw.metadata.annotations))
    placement = placement_of(aw)
    if isinstance(placement, InvalidSpec):
        errors.append(placement.message)
        placement = Placement()
    if errors:
        # Items past the limits are not read further: their pod sets could be costly.
        return InvalidSpec(bounded_message(list(dict.fromkeys(errors))))
    pod_sets: list[PodSet] = []
    # Quotas charge at least what the templates ask whatever placement reserves (a queue
    # may opt out): kept only where the two differ.
    charge_sets: list[PodSet] = []
    for index, item in enumerate(aw.spec.items):
        try:
            written, at_least = item_readings(item)
        except QuantityError as exc:
            errors.append(f"item {index}: {exc}")
            continue
        pod_sets.extend(written if declared_as_written else at_least)
        charge_sets.extend(at_least)
    if errors:
        return InvalidSpec(bounded_message(list(dict.fromkeys(errors))))
    sets = tuple(pod_sets)
    charged = tuple(charge_sets)
    if pod_count(sets) > MAX_PODS:
        # Refused here, before the scheduler adds it up or tries to place it.
        return InvalidSpec(
            f"the items make {pod_count(sets)} pods; an AppWrapper may make at most {MAX_PODS}"
        )
    min_available = aw.spec.schedulingSpec.minAvailable
    if min_available is not None and min_available > pod_count(sets):
        return InvalidSpec(
            f"schedulingSpec.minAvailable is {min_available} but the items declare only "
            f"{pod_count(sets)} pods"
        )
    created, queued_since = _queue_times(aw, now)
    return Workload(
        key=aw.key,
        priority=priority,
        created_at=created,
        pod_sets=sets,
        placement=placement,
        queued_since=queued_since,
        preemptible=aw.spec.preemptible,
        queue_name=queue_name_of(aw.metadata.labels, aw.metadata.annotations),
        charge_pod_sets=None if charged == sets else charged,
        kind=str(aw.spec.items[0].generictemplate.get("kind") or "") if aw.spec.items else "",
        duration_limit=_duration_limit(aw.spec.schedulingSpec.dispatchDuration.limit),
    )


def _duration_limit(limit: object) -> float | None:
    if isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0:
        return None
    return float(limit)


def _queue_times(aw: AppWrapper, now: datetime) -> tuple[float, float]:
    """When it was created (to the microsecond, for ordering) and since when it queues."""
    created = _timestamp(aw.metadata.creationTimestamp, now)
    status = aw.status
    # creationTimestamp has whole seconds only; when the dispatcher first saw it (queuedAt,
    # to the microsecond; `now` for one not yet queued) orders AppWrappers created within the
    # same second. Without the second case a new AppWrapper would sort before an older one
    # of the same second that already has its queuedAt.
    seen = (
        _timestamp(status.queuedAt, now)
        if status is not None and status.queuedAt
        else (now.timestamp())
    )
    created = max(created, min(seen, created + 0.999999))
    queued_since = created
    if status is not None:
        requeued = status.condition("Queueing")
        if requeued is not None and requeued.lastTransitionMicroTime:
            queued_since = max(created, _timestamp(requeued.lastTransitionMicroTime, now))
    return created, queued_since


def queue_name_of(
    labels: Mapping[str, str] | None, annotations: Mapping[str, str] | None = None
) -> str:
    """The AppQueue an AppWrapper names: this project's label, else Kueue's, else either as
    an annotation (Kueue reads its queue name from both; "" = none)."""
    for found in (labels or {}, annotations or {}):
        name = found.get(LABEL_QUEUE) or found.get(KUEUE_LABEL_QUEUE)
        if name:
            return name
    return ""
