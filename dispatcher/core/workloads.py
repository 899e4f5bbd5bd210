"""From an AppWrapper (the API model) to what the core schedules. Pure, no I/O.

`workload_of` validates the wrapped items, works out the pods they will make (from
`custompodresources` where given, else inferred from the object), and returns either a
`Workload` or an `InvalidSpec` whose message tells the user exactly what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dispatcher.api.models import AppWrapper, GenericItem, parse_time
from dispatcher.api.quantity import QuantityError
from dispatcher.core.model import Placement, PodSet, Workload, pod_count, total_requests
from dispatcher.core.podsets import infer_pod_sets, pod_sets_from_custom
from dispatcher.core.validation import (
    DEFAULT_CLUSTER_SCOPED,
    bounded_message,
    validate_appwrapper,
)


@dataclass(frozen=True, slots=True)
class InvalidSpec:
    message: str


def item_pod_sets(item: GenericItem) -> tuple[PodSet, ...]:
    """The pods an item will make.

    `custompodresources` (MCAD's declaration) is used as given unless the object is of a kind
    whose pods we can read and they ask for more of some resource in total: then the pods'
    own requests are what the scheduler will see, and reserving less would let the dispatcher
    start a gang whose pods cannot all be placed.
    """
    inferred = infer_pod_sets(item.generictemplate)
    if not item.custompodresources:
        return inferred
    declared = pod_sets_from_custom(
        [c.model_dump(mode="json", exclude_none=True) for c in item.custompodresources]
    )
    if inferred and not total_requests(inferred).fits_in(total_requests(declared)):
        return inferred
    return declared


def placement_of(aw: AppWrapper) -> Placement:
    scheduling = aw.spec.schedulingSpec.clusterScheduling
    if scheduling is None:
        return Placement()
    clusters = frozenset(c.name for c in scheduling.clusters) or None
    labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    if scheduling.clusterSelector is not None:
        labels = tuple(sorted(scheduling.clusterSelector.matchLabels.items()))
        expressions = tuple(
            (e.key, e.operator, tuple(e.values))
            for e in scheduling.clusterSelector.matchExpressions
        )
    return Placement(clusters=clusters, match_labels=labels, match_expressions=expressions)


SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def selector_errors(aw: AppWrapper) -> list[str]:
    """What is wrong with the clusterSelector's matchExpressions, as Kubernetes checks them."""
    scheduling = aw.spec.schedulingSpec.clusterScheduling
    if scheduling is None or scheduling.clusterSelector is None:
        return []
    errors = []
    where = "schedulingSpec.clusterScheduling.clusterSelector.matchExpressions"
    for index, expression in enumerate(scheduling.clusterSelector.matchExpressions):
        if expression.operator not in SELECTOR_OPERATORS:
            errors.append(
                f"{where}[{index}]: operator {expression.operator!r} is not one of "
                + ", ".join(SELECTOR_OPERATORS)
            )
        elif expression.operator in ("In", "NotIn") and not expression.values:
            errors.append(f"{where}[{index}]: operator {expression.operator} needs values")
        elif expression.operator in ("Exists", "DoesNotExist") and expression.values:
            errors.append(f"{where}[{index}]: operator {expression.operator} takes no values")
    return errors


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
) -> Workload | InvalidSpec:
    namespace = aw.metadata.namespace
    templates = [item.generictemplate for item in aw.spec.items]
    errors = validate_appwrapper(
        templates,
        namespace=namespace,
        allowed_kinds=allowed_kinds,
        cluster_scoped_kinds=DEFAULT_CLUSTER_SCOPED,
    )
    errors += selector_errors(aw)
    if errors:
        # Items past the limits are not read further: their pod sets could be costly.
        return InvalidSpec(bounded_message(list(dict.fromkeys(errors))))
    pod_sets: list[PodSet] = []
    for index, item in enumerate(aw.spec.items):
        try:
            pod_sets.extend(item_pod_sets(item))
        except QuantityError as exc:
            errors.append(f"item {index}: {exc}")
    if errors:
        return InvalidSpec(bounded_message(list(dict.fromkeys(errors))))
    sets = tuple(pod_sets)
    min_available = aw.spec.schedulingSpec.minAvailable
    if min_available is not None and min_available > pod_count(sets):
        return InvalidSpec(
            f"schedulingSpec.minAvailable is {min_available} but the items declare only "
            f"{pod_count(sets)} pods"
        )
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
    return Workload(
        key=aw.key,
        priority=priority,
        created_at=created,
        pod_sets=sets,
        placement=placement_of(aw),
        queued_since=queued_since,
        preemptible=aw.spec.preemptible,
    )
