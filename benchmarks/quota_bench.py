"""The quota scenario of the core benchmark (run by `benchmarks.core_bench`, section 4).

The same clusters and pending AppWrappers as the headline, under 100 cluster queues in
cohorts three levels deep, with flavors that select nodes by label and admitted work
charged to the queues (some borrow). Times the whole cycle, building the cycle's
`QuotaView` included, in both queue modes, with and without fair sharing, beside the same
workloads on capacity alone. Pure computation; prints and returns figures.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.core_bench import (
    GI,
    GPU,
    GPU_FLAVOR,
    ON_DEMAND,
    SPOT,
    CycleFigure,
    Scenario,
    build_scenario,
    measure,
    pending_workload,
    timed,
)
from dispatcher.api.constants import DEFAULT_QUEUE
from dispatcher.core.model import (
    ClusterSnapshot,
    DispatchedWorkload,
    QueueMode,
)
from dispatcher.core.quota.model import (
    BorrowPreemption,
    Charge,
    CohortSpec,
    Flavor,
    FlavorQuotas,
    FlavorResource,
    LocalQueue,
    QueueSpec,
    Quota,
    QuotaSetup,
    Reclaim,
    ResourceGroup,
    Selector,
    WhenCanBorrow,
    WhenCanPreempt,
    WithinQueue,
)
from dispatcher.core.quota.tree import QuotaTree, TreeNode
from dispatcher.core.quota.view import QuotaView

# -- quotas ------------------------------------------------------------------------------

QUOTA_RESOURCES = ("cpu", "memory", GPU)
QUOTA_FLAVORS = (
    Flavor(ON_DEMAND, node_labels=(("tier", ON_DEMAND),)),
    Flavor(SPOT, node_labels=(("tier", SPOT),)),
    Flavor(GPU_FLAVOR, node_labels=(("pool", "gpu"),)),
)
UNITS = {"cpu": 1000, "memory": GI, GPU: 1000}  # quotas are whole cores, Gi and GPUs
ROOT_COHORT = "org"

Layout = tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]
"""A queue's resource groups: (the resources covered, its flavors in order of preference)."""

LAYOUTS: tuple[Layout, ...] = (
    ((QUOTA_RESOURCES, (ON_DEMAND,)),),  # one flavor
    ((QUOTA_RESOURCES, (ON_DEMAND, SPOT)),),  # on-demand, then spot
    ((("cpu", "memory"), (ON_DEMAND, SPOT)), ((GPU,), (GPU_FLAVOR,))),  # GPUs in a group
)


def _layout(index: int) -> Layout:
    """40% of the queues have one flavor, 30% two, 30% two and GPUs in a group apart."""
    kind = index % 10
    return LAYOUTS[0 if kind < 4 else 1 if kind < 7 else 2]


def _round_up(resource: str, milli: float) -> int:
    unit = UNITS[resource]
    return math.ceil(milli / unit) * unit


@dataclass(frozen=True)
class QuotaScenario(Scenario):
    setup: QuotaSetup  # BestEffortFIFO queues, fair sharing off: see `setup_for`
    charges: list[Charge]

    def setup_for(self, mode: QueueMode, *, fair: bool) -> QuotaSetup:
        """The setup with every queue in `mode`, fair sharing on or off."""
        queues = {name: replace(q, strategy=mode) for name, q in self.setup.queues.items()}
        return replace(self.setup, queues=queues, fair_sharing=fair)


def _dispatched(snapshot: ClusterSnapshot) -> list[tuple[DispatchedWorkload, dict[str, int], str]]:
    """The cluster's dispatched AppWrappers, each with its requests in total (its bound
    pods' usage, or its reservation's pods) and the tier of its first node."""
    tiers = {node.name: node.labels.get("tier", ON_DEMAND) for node in snapshot.nodes}
    reserved = {r.key: r for r in snapshot.reservations}
    result = []
    for admitted in snapshot.admitted:
        if admitted.usage:
            parts = [requests for _, requests in admitted.usage]
            tier = tiers[admitted.usage[0][0]]
        else:
            reservation = reserved.get(admitted.key)
            parts = [p.total for p in reservation.pod_sets] if reservation else []
            tier = ON_DEMAND
        total = {r: sum(part[r] for part in parts) for r in QUOTA_RESOURCES}
        result.append((admitted, total, tier))
    return result


def _amounts(layout: Layout, request: Mapping[str, int], tier: str) -> dict[FlavorResource, int]:
    """What `request` charges a queue of `layout`, in the tier's flavor where it has one."""
    amounts: dict[FlavorResource, int] = {}
    for covered, flavors in layout:
        flavor = tier if tier in flavors else flavors[0]
        for resource in covered:
            if request.get(resource):
                amounts[(flavor, resource)] = request[resource]
    return amounts


def _cohort_groups(quotas: Mapping[FlavorResource, Quota]) -> tuple[ResourceGroup, ...]:
    """A cohort's own quotas as one resource group."""
    if not quotas:
        return ()
    by_flavor: dict[str, dict[str, Quota]] = {}
    for (flavor, resource), quota in quotas.items():
        by_flavor.setdefault(flavor, {})[resource] = quota
    covered = tuple(dict.fromkeys(resource for _, resource in quotas))
    return (ResourceGroup(covered, tuple(FlavorQuotas(f, q) for f, q in by_flavor.items())),)


def _nominal(specs: Sequence[QueueSpec], fr: FlavorResource, share: float) -> int:
    """`share` of the nominal quotas of `specs` in `fr`, rounded up."""
    total = 0
    for spec in specs:
        quota = spec.quota(*fr)
        total += quota.nominal if quota is not None else 0
    return _round_up(fr[1], total * share)


def build_quota_scenario(
    pending: int,
    nodes: int,
    clusters: int,
    *,
    queues: int = 100,
    leaf_cohorts: int = 10,
    middle_cohorts: int = 3,
    seed: int = 7,
) -> QuotaScenario:
    """The clusters of `build_scenario`, with quotas on top.

    - Queues `cq-NNN` in leaf cohorts `cohort-N` (consecutive queues together), under
      middle cohorts `div-N`, under one root `org`: three levels of cohorts. Each queue
      covers cpu, memory and GPUs in one flavor (on-demand), two (on-demand then spot), or
      two for cpu and memory and a GPU flavor for GPUs; the flavors select nodes by their
      `tier` and `pool` labels. A quarter of the queues cap what they borrow (cpu and
      memory), a tenth may not borrow GPUs, a fifth lend only half of their quota; queue
      policies (preemption, fungibility, weights) vary.
    - The root, the first middle cohort and every third leaf cohort have quotas of their
      own; the third middle cohort caps what it borrows from the root, and every fourth
      leaf cohort lends only half of its on-demand cpu.
    - Every dispatched AppWrapper of the clusters is charged to a random queue; each
      queue's nominal quotas are then set from its usage: a fifth of the queues use
      105-135% of theirs (they borrow), two fifths 93-100%, the rest 55-90%.
    - One AppQueue `default` per queue, in namespace `team-NNN` (which the queue's
      namespace selector admits). Pending AppWrappers of the 20 shapes and the usual
      priorities go to queues of uneven popularity; nine in ten name their AppQueue, the
      rest use their namespace's default; one in ten may use one named cluster only.
    """
    base = build_scenario(0, nodes, clusters, seed=seed)  # the same clusters
    rng = random.Random(seed + 1)
    names = [f"cq-{index:03d}" for index in range(queues)]
    teams = [f"team-{index:03d}" for index in range(queues)]
    layouts = [_layout(index) for index in range(queues)]

    def leaf_of(index: int) -> int:
        return index * leaf_cohorts // queues

    charges: list[Charge] = []
    usage: list[dict[FlavorResource, int]] = [{} for _ in names]
    for snapshot in base.clusters:
        for admitted, request, tier in _dispatched(snapshot):
            index = rng.randrange(queues)
            amounts = _amounts(layouts[index], request, tier)
            if not amounts:
                continue
            charges.append(
                Charge(
                    key=admitted.key,
                    queue=names[index],
                    amounts=amounts,
                    priority=admitted.priority,
                    admitted_at=admitted.dispatched_at,
                    preemptible=admitted.preemptible,
                )
            )
            for fr, amount in amounts.items():
                usage[index][fr] = usage[index].get(fr, 0) + amount
    typical = {
        resource: max(
            UNITS[resource],
            sum(v for used in usage for (_, r), v in used.items() if r == resource) // queues,
        )
        for resource in QUOTA_RESOURCES
    }

    specs: list[QueueSpec] = []
    for index, name in enumerate(names):
        draw = rng.random()
        if draw < 0.2:
            ratio = rng.uniform(1.05, 1.35)  # usage / nominal: borrowing
        elif draw < 0.6:
            ratio = rng.uniform(0.93, 1.0)
        else:
            ratio = rng.uniform(0.55, 0.9)
        groups = []
        for covered, flavors in layouts[index]:
            flavor_quotas = []
            for flavor in flavors:
                quotas: dict[str, Quota] = {}
                for resource in covered:
                    used = usage[index].get((flavor, resource), 0)
                    nominal = _round_up(resource, used / ratio if used else typical[resource] / 4)
                    borrowing: int | None = None
                    if index % 4 == 1 and resource != GPU:
                        borrowing = _round_up(resource, nominal / 4)
                    elif index % 10 == 3 and resource == GPU:
                        borrowing = 0
                    lending = _round_up(resource, nominal / 2) if index % 5 == 2 else None
                    quotas[resource] = Quota(nominal, borrowing, lending)
                flavor_quotas.append(FlavorQuotas(flavor, quotas))
            groups.append(ResourceGroup(covered, tuple(flavor_quotas)))
        specs.append(
            QueueSpec(
                name=name,
                groups=tuple(groups),
                cohort=f"cohort-{leaf_of(index)}",
                namespaces=Selector(match_labels=(("team", teams[index]),)),
                within=(WithinQueue.LOWER_PRIORITY, WithinQueue.NEVER)[index % 2],
                reclaim=(Reclaim.ANY, Reclaim.LOWER_PRIORITY, Reclaim.NEVER)[index % 3],
                borrow_preemption=(
                    BorrowPreemption.LOWER_PRIORITY if index % 4 == 0 else BorrowPreemption.NEVER
                ),
                when_can_borrow=(
                    WhenCanBorrow.TRY_NEXT_FLAVOR if index % 3 == 1 else WhenCanBorrow.BORROW
                ),
                when_can_preempt=(
                    WhenCanPreempt.PREEMPT if index % 7 == 0 else WhenCanPreempt.TRY_NEXT_FLAVOR
                ),
                weight=(1.0, 2.0, 0.5)[(index // 2) % 3],
            )
        )

    on_demand = [(ON_DEMAND, r) for r in QUOTA_RESOURCES]
    cohorts = [
        CohortSpec(
            ROOT_COHORT,
            groups=_cohort_groups({fr: Quota(_nominal(specs, fr, 0.02)) for fr in on_demand}),
        )
    ]
    for middle in range(middle_cohorts):
        members = [s for i, s in enumerate(specs) if leaf_of(i) % middle_cohorts == middle]
        own: dict[FlavorResource, Quota] = {}
        if middle % 3 == 0:  # a spot pool of its own
            for fr in [(SPOT, "cpu"), (SPOT, "memory")]:
                own[fr] = Quota(_nominal(members, fr, 0.05))
        elif middle % 3 == 2:  # borrows little from the root
            for fr in on_demand[:2]:
                own[fr] = Quota(0, borrowing_limit=_nominal(members, fr, 0.05))
        cohorts.append(CohortSpec(f"div-{middle}", parent=ROOT_COHORT, groups=_cohort_groups(own)))
    for leaf in range(leaf_cohorts):
        members = [s for i, s in enumerate(specs) if leaf_of(i) == leaf]
        pool = {fr: _nominal(members, fr, 0.05) if leaf % 3 == 0 else 0 for fr in on_demand}
        own = {fr: Quota(amount) for fr, amount in pool.items() if amount}
        if leaf % 4 == 1:  # keeps half of its on-demand cpu for its own queues
            cpu = (ON_DEMAND, "cpu")
            lend = _nominal(members, cpu, 0.5) + pool[cpu] // 2
            own[cpu] = Quota(pool[cpu], lending_limit=lend)
        cohorts.append(
            CohortSpec(
                f"cohort-{leaf}",
                parent=f"div-{leaf % middle_cohorts}",
                groups=_cohort_groups(own),
            )
        )

    setup = QuotaSetup(
        queues={spec.name: spec for spec in specs},
        cohorts={c.name: c for c in cohorts},
        flavors={f.name: f for f in QUOTA_FLAVORS},
        local_queues={
            (team, DEFAULT_QUEUE): LocalQueue(team, DEFAULT_QUEUE, name)
            for team, name in zip(teams, names, strict=True)
        },
        namespace_labels={
            team: {"team": team, "division": f"div-{leaf_of(i) % middle_cohorts}"}
            for i, team in enumerate(teams)
        },
    )

    cluster_names = [c.name for c in base.clusters]
    popularity = [rng.uniform(0.2, 2.0) for _ in names]
    workloads = []
    for index, queue in enumerate(rng.choices(range(queues), weights=popularity, k=pending)):
        # Nine in ten name no queue and go to their namespace's `default` AppQueue.
        queue_name = "" if rng.random() < 0.9 else DEFAULT_QUEUE
        key = f"{teams[queue]}/aw-{index:06d}"
        workloads.append(pending_workload(key, cluster_names, rng, queue_name))
    return QuotaScenario(pending=workloads, clusters=base.clusters, setup=setup, charges=charges)


def quota_summary(scenario: QuotaScenario) -> dict[str, Any]:
    """What the quota scenario holds, and how long the tree takes to build (once per setup,
    outside the cycle)."""
    setup = scenario.setup
    started = time.perf_counter()
    tree = QuotaTree(setup)
    tree_ms = (time.perf_counter() - started) * 1000
    ledger = QuotaView(tree, scenario.charges).ledger
    specs = list(setup.queues.values())
    quotas = [q for s in specs for g in s.groups for f in g.flavors for q in f.quotas.values()]
    return {
        "queues": len(specs),
        "cohorts": len(setup.cohorts),
        "cohort_levels": max(len(tree.path(TreeNode("queue", s.name))) - 1 for s in specs),
        "cohorts_with_quotas": sum(bool(c.groups) for c in setup.cohorts.values()),
        "flavors": len(setup.flavors),
        "queues_with_two_flavors": sum(any(len(g.flavors) > 1 for g in s.groups) for s in specs),
        "queue_quotas_with_borrowing_limit": sum(q.borrowing_limit is not None for q in quotas),
        "queue_quotas_with_lending_limit": sum(q.lending_limit is not None for q in quotas),
        "namespaces": len(setup.namespace_labels),
        "charges": len(scenario.charges),
        "borrowing_queues": sum(ledger.borrowing(s.name) for s in specs),
        "inactive_queues": sum(bool(problems) for problems in tree.problems.values()),
        "tree_build_ms": round(tree_ms, 2),
    }


@dataclass(frozen=True)
class QuotaFigure:
    quotas: str  # "none" (the same workloads on capacity alone), "quotas", "fair sharing"
    cycle: CycleFigure
    quota_waits: int  # waits whose queue's quota keeps them out
    view_ms: float  # building the cycle's QuotaView alone (median; part of the cycle)

    def as_json(self) -> dict[str, Any]:
        return {
            "quotas": self.quotas,
            **self.cycle.as_json(),
            "quota_waits": self.quota_waits,
            "view_ms": round(self.view_ms, 2),
        }


def _view_ms(tree: QuotaTree, charges: Sequence[Charge], runs: int) -> float:
    times, _ = timed(lambda: QuotaView(tree, charges), runs)
    return statistics.median(times) * 1000


QUOTA_HEADER = (
    f"{'quotas':<13} {'mode':<15} {'preemption':<20} {'runs':>4} "
    f"{'median ms':>10} {'max ms':>9} {'cpu ms':>8} {'view ms':>8} "
    f"{'admits':>6} {'quota':>6} {'pre':>4}"
)


def _quota_row(figure: QuotaFigure) -> str:
    cycle = figure.cycle
    view = f"{figure.view_ms:>8.1f}" if figure.quotas != "none" else f"{'-':>8}"
    return (
        f"{figure.quotas:<13} {cycle.mode:<15} {cycle.preemption:<20} {cycle.runs:>4} "
        f"{cycle.median_ms:>10.1f} {cycle.max_ms:>9.1f} {cycle.cpu_median_ms:>8.1f} {view} "
        f"{cycle.admits:>6} {figure.quota_waits:>6} {cycle.preemptions:>4}"
    )


def quota_cycles(
    scenario: QuotaScenario, *, preemptions: Sequence[str], runs: int
) -> list[QuotaFigure]:
    """Per mode and preemption: the workloads on capacity alone, then with quotas, then
    with quotas and fair sharing. The tree is built once per setup (the controller caches
    it); the `QuotaView` is built inside every timed cycle."""
    figures = []
    for mode in (QueueMode.STRICT_FIFO, QueueMode.BEST_EFFORT_FIFO):
        for preemption in preemptions:
            for label, fair in (("none", None), ("quotas", False), ("fair sharing", True)):
                tree = None if fair is None else QuotaTree(scenario.setup_for(mode, fair=fair))
                cycle, result = measure(
                    scenario,
                    mode=mode,
                    preemption=preemption,
                    runs=runs,
                    tree=tree,
                    charges=scenario.charges,
                )
                figure = QuotaFigure(
                    quotas=label,
                    cycle=cycle,
                    quota_waits=sum(w.message.startswith("queue ") for w in result.waits),
                    view_ms=0.0 if tree is None else _view_ms(tree, scenario.charges, runs),
                )
                print(_quota_row(figure), flush=True)
                figures.append(figure)
    return figures
