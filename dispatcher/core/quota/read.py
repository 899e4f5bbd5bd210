"""Quota objects (the API models) as the core's specs. Pure, no I/O.

What the CRD cannot check is checked here: quantities (a bad or negative one), a resource
covered by two groups, a flavor in two groups, a flavor listing a resource its group does
not cover, a bad namespace selector. Each such mistake is kept as a problem of its queue
(or cohort), which makes the queue inactive with that message; nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dispatcher.api.quantity import QuantityError, parse_milli
from dispatcher.api.queues import (
    AppCohort,
    AppFlavor,
    AppQueue,
    BudgetSpec,
    ClusterAppQueue,
    FairSharing,
    GroupLimits,
    UserLimits,
)
from dispatcher.api.queues import ResourceGroup as GroupModel
from dispatcher.core.model import Backfill, QueueMode, Taint, Toleration
from dispatcher.core.quota.budget import HOUR, Budget, BudgetPeriod, WhenExhausted
from dispatcher.core.quota.model import (
    BorrowPreemption,
    CohortSpec,
    Flavor,
    FlavorQuotas,
    LocalQueue,
    QueueSpec,
    Quota,
    QuotaCharge,
    QuotaSetup,
    Reclaim,
    ResourceGroup,
    Selector,
    StopPolicy,
    UserLimit,
    WhenCanBorrow,
    WhenCanPreempt,
    WithinQueue,
)
from dispatcher.core.workloads import label_requirement

__all__ = ["setup_of"]


def _amount(where: str, value: str | int | float | None, problems: list[str]) -> int | None:
    if value is None:
        return None
    try:
        milli = parse_milli(value)
    except QuantityError as exc:
        problems.append(f"{where}: {exc}")
        return None
    if milli < 0:
        problems.append(f"{where}: {value} is negative")
        return None
    return milli


def _groups(models: Iterable[GroupModel], problems: list[str]) -> tuple[ResourceGroup, ...]:
    groups: list[ResourceGroup] = []
    seen_resources: dict[str, int] = {}
    seen_flavors: dict[str, int] = {}
    for g, model in enumerate(models):
        where = f"resourceGroups[{g}]"
        for covered in model.coveredResources:
            if covered in seen_resources:
                other = seen_resources[covered]
                problems.append(f"{where}: {covered} is covered by resourceGroups[{other}] too")
            seen_resources.setdefault(covered, g)
        flavors: list[FlavorQuotas] = []
        for f, flavor in enumerate(model.flavors):
            at = f"{where}.flavors[{f}]"
            if flavor.name in seen_flavors:
                other = seen_flavors[flavor.name]
                problems.append(f"{at}: flavor {flavor.name} is in resourceGroups[{other}] too")
            seen_flavors.setdefault(flavor.name, g)
            quotas: dict[str, Quota] = {}
            for r, resource in enumerate(flavor.resources):
                spot = f"{at}.resources[{r}]"
                if resource.name not in model.coveredResources:
                    problems.append(
                        f"{spot}: {resource.name} is not in the group's coveredResources"
                    )
                    continue
                nominal = _amount(f"{spot}.nominalQuota", resource.nominalQuota, problems)
                quotas[resource.name] = Quota(
                    nominal or 0,
                    _amount(f"{spot}.borrowingLimit", resource.borrowingLimit, problems),
                    _amount(f"{spot}.lendingLimit", resource.lendingLimit, problems),
                )
            flavors.append(FlavorQuotas(flavor.name, quotas))
        groups.append(ResourceGroup(tuple(model.coveredResources), tuple(flavors)))
    return tuple(groups)


def _user_limit(
    limits: UserLimits | None, problems: list[str], where: str = "userLimits"
) -> UserLimit | None:
    if limits is None:
        return None
    resources: dict[str, int] = {}
    for resource, value in sorted(limits.maxResources.items()):
        milli = _amount(f"{where}.maxResources[{resource}]", value, problems)
        if milli is not None:
            resources[resource] = milli
    return UserLimit(limits.maxRunning, resources)


def _group_limits(limits: list[GroupLimits], problems: list[str]) -> dict[str, UserLimit]:
    found: dict[str, UserLimit] = {}
    for limit in limits:
        if limit.group in found:
            problems.append(f"groupLimits: group {limit.group} is named twice")
            continue
        read = _user_limit(limit, problems, f"groupLimits[{limit.group}]")
        if read is not None:
            found[limit.group] = read
    return found


def _budget(spec: BudgetSpec | None, problems: list[str]) -> Budget | None:
    if spec is None:
        return None
    amount = _amount("budget.amountHours", spec.amountHours, problems)
    if amount is None:
        return None
    return Budget(
        resource=spec.resource,
        amount=amount * HOUR,  # milli-units x seconds
        period=BudgetPeriod(spec.period),
        window=spec.windowHours * HOUR,
        when_exhausted=WhenExhausted(spec.whenExhausted),
    )


def _weight(fair: FairSharing | None, problems: list[str]) -> float:
    if fair is None or fair.weight is None:
        return 1.0
    milli = _amount("fairSharing.weight", fair.weight, problems)
    if milli is None:
        return 1.0
    if milli == 0:
        problems.append("fairSharing.weight: must be above 0")
        return 1.0
    return milli / 1000


def queue_of(model: ClusterAppQueue) -> QueueSpec:
    spec = model.spec
    problems: list[str] = []
    if model.metadata.deletionTimestamp:
        problems.append(
            "being deleted: admits nothing new; it goes once its admitted AppWrappers have"
            " finished or been drained (stopPolicy HoldAndDrain)"
        )
    groups = _groups(spec.resourceGroups, problems)
    namespaces: Selector | None = None
    if spec.namespaceSelector is not None:
        selector = spec.namespaceSelector
        expressions = []
        for index, expression in enumerate(selector.matchExpressions):
            try:
                expressions.append(
                    label_requirement(f"namespaceSelector.matchExpressions[{index}]", expression)
                )
            except ValueError as exc:
                problems.append(str(exc))
        namespaces = Selector(tuple(sorted(selector.matchLabels.items())), tuple(expressions))
    preemption = spec.preemption
    return QueueSpec(
        name=model.metadata.name,
        groups=groups,
        cohort=spec.cohort or None,
        namespaces=namespaces,
        strategy=QueueMode(spec.queueingStrategy),
        within=WithinQueue(preemption.withinClusterQueue),
        reclaim=Reclaim(preemption.reclaimWithinCohort),
        borrow_preemption=BorrowPreemption(preemption.borrowWithinCohort.policy),
        borrow_threshold=preemption.borrowWithinCohort.maxPriorityThreshold,
        when_can_borrow=WhenCanBorrow(spec.flavorFungibility.whenCanBorrow),
        when_can_preempt=WhenCanPreempt(spec.flavorFungibility.whenCanPreempt),
        weight=_weight(spec.fairSharing, problems),
        stop=StopPolicy(spec.stopPolicy),
        charge=QuotaCharge(spec.quotaCharge),
        checks=tuple(dict.fromkeys(spec.admissionChecks)),
        backfill=Backfill(spec.backfill),
        minimum_runtime=float(preemption.minimumRuntimeSeconds),
        notice_seconds=float(preemption.noticeSeconds),
        user_limit=_user_limit(spec.userLimits, problems),
        group_limits=_group_limits(spec.groupLimits, problems),
        budget=_budget(spec.budget, problems),
        problems=tuple(problems),
    )


def cohort_of(model: AppCohort) -> CohortSpec:
    problems: list[str] = []
    groups = _groups(model.spec.resourceGroups, problems)
    return CohortSpec(
        name=model.metadata.name,
        parent=model.spec.parent or None,
        groups=groups,
        problems=tuple(problems),
    )


def flavor_of(model: AppFlavor) -> Flavor:
    spec = model.spec
    return Flavor(
        name=model.metadata.name,
        node_labels=tuple(sorted(spec.nodeLabels.items())),
        node_taints=tuple(Taint(t.key, t.value, t.effect) for t in spec.nodeTaints),
        tolerations=tuple(
            Toleration(t.key, t.operator, t.value, t.effect, t.tolerationSeconds)
            for t in spec.tolerations
        ),
    )


def local_of(model: AppQueue) -> LocalQueue:
    return LocalQueue(
        namespace=model.metadata.namespace or "",
        name=model.metadata.name,
        cluster_queue=model.spec.clusterQueue,
        stop=StopPolicy(model.spec.stopPolicy),
    )


def setup_of(
    queues: Iterable[ClusterAppQueue],
    cohorts: Iterable[AppCohort],
    flavors: Iterable[AppFlavor],
    locals_: Iterable[AppQueue],
    namespace_labels: Mapping[str, Mapping[str, str]],
    *,
    fair_sharing: bool = False,
    fair_preemption: bool = True,
    queue_required: bool = False,
) -> QuotaSetup:
    local = [local_of(m) for m in locals_]
    return QuotaSetup(
        queues={q.name: q for q in map(queue_of, queues)},
        cohorts={c.name: c for c in map(cohort_of, cohorts)},
        flavors={f.name: f for f in map(flavor_of, flavors)},
        local_queues={(lq.namespace, lq.name): lq for lq in local},
        namespace_labels=namespace_labels,
        fair_sharing=fair_sharing,
        fair_preemption=fair_preemption,
        queue_required=queue_required,
    )
