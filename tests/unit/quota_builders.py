"""Builders for quota setups in unit tests: queues, cohorts, flavors in people units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dispatcher.api.quantity import parse_milli
from dispatcher.core.model import Taint, Toleration
from dispatcher.core.quota.model import (
    Charge,
    CohortSpec,
    Flavor,
    FlavorQuotas,
    LocalQueue,
    QueueSpec,
    Quota,
    QuotaSetup,
    ResourceGroup,
    Selector,
)

DEFAULT = "default-flavor"
ALL = Selector()

QuotaText = str | tuple[str, str | None, str | None]
"""nominal, or (nominal, borrowing limit, lending limit)."""


def quota(resource: str, text: QuotaText) -> Quota:
    if isinstance(text, str):
        return Quota(parse_milli(text))
    nominal, borrow, lend = text
    return Quota(
        parse_milli(nominal),
        None if borrow is None else parse_milli(borrow),
        None if lend is None else parse_milli(lend),
    )


def group(flavors: Mapping[str, Mapping[str, QuotaText]]) -> ResourceGroup:
    """One resource group: flavor -> resource -> quota, in preference order."""
    covered: list[str] = []
    for quotas in flavors.values():
        for resource in quotas:
            if resource not in covered:
                covered.append(resource)
    return ResourceGroup(
        covered=tuple(covered),
        flavors=tuple(
            FlavorQuotas(f, {r: quota(r, t) for r, t in quotas.items()})
            for f, quotas in flavors.items()
        ),
    )


def queue(
    name: str,
    quotas: Mapping[str, QuotaText] | None = None,
    *,
    flavors: Mapping[str, Mapping[str, QuotaText]] | None = None,
    cohort: str | None = None,
    **settings: object,
) -> QueueSpec:
    """A cluster queue admitting every namespace; `quotas` are in the default flavor."""
    groups = (group(flavors if flavors is not None else {DEFAULT: quotas or {}}),)
    settings.setdefault("namespaces", ALL)
    return QueueSpec(name=name, groups=groups, cohort=cohort, **settings)  # type: ignore[arg-type]


def cohort(
    name: str, parent: str | None = None, quotas: Mapping[str, QuotaText] | None = None
) -> CohortSpec:
    groups = (group({DEFAULT: quotas}),) if quotas else ()
    return CohortSpec(name=name, parent=parent, groups=groups)


def flavor(
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    taints: Sequence[Taint] = (),
    tolerations: Sequence[Toleration] = (),
) -> Flavor:
    return Flavor(name, tuple(sorted((labels or {}).items())), tuple(taints), tuple(tolerations))


def setup(
    *queues: QueueSpec,
    cohorts: Sequence[CohortSpec] = (),
    flavors: Sequence[Flavor] = (),
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    **settings: bool,
) -> QuotaSetup:
    """Queues, each with an AppQueue named after it in namespace `ns` (and `default`
    pointing at the first); the default flavor exists unless flavors are given."""
    local = {("ns", q.name): LocalQueue("ns", q.name, q.name) for q in queues}
    return QuotaSetup(
        queues={q.name: q for q in queues},
        cohorts={c.name: c for c in cohorts},
        flavors={f.name: f for f in (flavors or [flavor(DEFAULT)])},
        local_queues=local,
        namespace_labels=dict(namespaces or {}),
        **settings,
    )


def charge(
    key: str,
    queue_name: str,
    amounts: Mapping[str, str],
    *,
    flavor_name: str = DEFAULT,
    priority: int = 0,
    admitted_at: float = 0.0,
) -> Charge:
    return Charge(
        key=key,
        queue=queue_name,
        amounts={(flavor_name, r): parse_milli(v) for r, v in amounts.items()},
        priority=priority,
        admitted_at=admitted_at,
    )
