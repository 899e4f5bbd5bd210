"""The member clusters as one scheduling cycle sees them, and the best-fit choice among
them. Pure, no I/O.

`CycleScratch` carries what a cycle learns from one workload to the next: a `ClusterRoom`
per cluster (built on first use), the clusters held for a preemptor or a starving
workload, the nodes reserved for a head (`Fence`, made by `core.scheduling.reservation`)
that work ending after the reservation starts may not use, this cycle's admissions, and
answers that stand until the next admission, hold or fence. It also says which clusters a
workload may use at all: those its placement (clusterScheduling) allows that take its
namespace (a member's `namespaces` mapping), and why none, when none is left. `best_fit`
places a gang in the best cluster that fits, or says why none does; `ask_victims` asks the
preemption policy in every cluster for one that fits nowhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from dispatcher.core.model import (
    NOT_MAPPED,
    ClusterSnapshot,
    Placement,
    PodSet,
    Reservation,
    Workload,
)
from dispatcher.core.scheduling.evictions import withhold
from dispatcher.core.scheduling.kept import KeptRooms
from dispatcher.core.scheduling.placement import POD, ClusterRoom, Gang, Placed, Refusal
from dispatcher.core.scheduling.preemption import PreemptionPolicy, VictimRules

__all__ = [
    "CycleScratch",
    "Fence",
    "Reasons",
    "Victims",
    "ask_victims",
    "backfills",
    "best_fit",
    "policy_done",
    "scarcest_of",
]

Reasons = list[tuple[str, Refusal]]  # (cluster name, why it does not fit there)

# `_best_fit` reasons over every subset of up to this many clusters (see `settled`).
_MAX_SUBSETS_OF = 6


@dataclass(frozen=True, slots=True)
class Fence:
    """Nodes of one cluster reserved this cycle for head `holder` from `start`."""

    holder: str
    start: float
    nodes: tuple[int, ...]  # indices in the cluster's `ClusterRoom`


def backfills(workload: Workload, now: float, start: float) -> bool:
    """Whether `workload`, started `now`, is gone by `start` at the latest: its declared
    limit ends it by then (EASY backfill). Work without a limit never is."""
    limit = workload.duration_limit
    return limit is not None and now + limit <= start


class CycleScratch:
    """What one `schedule` call carries from one workload to the next."""

    def __init__(
        self, clusters: Sequence[ClusterSnapshot], now: float, kept: KeptRooms | None = None
    ) -> None:
        self.clusters = sorted(clusters, key=lambda c: c.name)
        self.now = now
        self.kept = kept
        self.states: dict[str, ClusterRoom] = {}  # built (or copied from `kept`) on first use
        self.gangs: dict[tuple[str, ...], Gang] = {}
        self.usable_for: dict[tuple[Placement, str], list[ClusterSnapshot]] = {}
        # Whether some cluster takes only some namespaces (else the namespace filters nothing).
        self.by_namespace = any(c.namespaces is not None for c in self.clusters)
        self.ever: dict[tuple[str, tuple[str, ...]], bool] = {}
        self.empty: dict[str, ClusterRoom] = {}
        # Clusters later workloads may not use this cycle, and why (a preemptor's claim,
        # a starving head's reservation).
        self.held: dict[str, str] = {}
        self.fences: dict[str, Fence] = {}  # cluster -> the nodes reserved there, at most one
        self.admitted: dict[str, list[Workload]] = {}
        # Per cluster, this cycle's admissions and where their pods went.
        self.placed: dict[str, list[tuple[Workload, Placed]]] = {}
        # (cluster, gang shape) -> the highest priority for which the policy found no
        # victims: room only shrinks within a cycle, and a lower priority has fewer
        # candidates, so asking again could not do better.
        self.no_victims: dict[tuple[str, tuple[str, ...], object], int] = {}
        # Equal messages share one string: thousands of waits often say the same.
        self.messages: dict[str, str] = {}
        # Answers for gangs that fit nowhere, by (gang shape, usable clusters, priority),
        # each with the `version` it was found at. Room only shrinks within a cycle and
        # holds only add, so until the next admission or hold the same question gets the
        # same answer; the version counts admissions and holds.
        self.refused: dict[tuple[object, ...], tuple[int, Reasons, Refusal]] = {}
        self.version = 0
        self.scarcest: dict[tuple[object, ...], tuple[bool, str | None]] = {}  # see `settled`

    def admit(self, workload: Workload, cluster: str, placed: Placed) -> None:
        """Record an admission (its pods are placed in the cluster's state already)."""
        self.admitted.setdefault(cluster, []).append(workload)
        self.placed.setdefault(cluster, []).append((workload, placed))
        self.version += 1

    def fence(self, cluster: str, fence: Fence) -> None:
        """Keep later work that ends after `fence.start` off the fence's nodes."""
        self.fences[cluster] = fence
        self.version += 1

    def fenced(self, workload: Workload) -> tuple[str, ...]:
        """The clusters whose reserved nodes `workload` may not use (it would not be gone
        when the reservation starts)."""
        if not self.fences:
            return ()
        return tuple(
            name for name, f in self.fences.items() if not backfills(workload, self.now, f.start)
        )

    def fence_off(self, clusters: Sequence[str]) -> Callable[[], None]:
        """Take the fenced nodes of `clusters` out of their room until the function returned
        gives them back (what was placed meanwhile stays, on other nodes)."""
        undos = [withhold(self.states[name], self.fences[name].nodes) for name in clusters]

        def give_back() -> None:
            for undo in reversed(undos):
                undo()

        return give_back

    def hold(self, cluster: str, why: str) -> None:
        """Keep later workloads out of `cluster` for the rest of the cycle."""
        self.held[cluster] = why
        self.version += 1

    def state(self, cluster: ClusterSnapshot) -> ClusterRoom:
        state = self.states.get(cluster.name)
        if state is None:
            state = self.kept.state(cluster) if self.kept is not None else ClusterRoom(cluster)
            self.states[cluster.name] = state
        return state

    def gang(self, workload: Workload) -> Gang:
        gang = self.gangs.get(workload.shape)
        if gang is None:
            gang = self.gangs[workload.shape] = Gang.of(workload.pod_sets)
        return gang

    def namespace(self, workload: Workload) -> str:
        """The workload's namespace where it decides which clusters it may use, else ""."""
        return workload.key.partition("/")[0] if self.by_namespace else ""

    def usable(self, workload: Workload) -> list[ClusterSnapshot]:
        """The clusters its placement allows that take its namespace."""
        placement, namespace = workload.placement, self.namespace(workload)
        if placement.anywhere and not namespace:
            return self.clusters  # the usual case, without hashing the placement
        key = (placement, namespace)
        clusters = self.usable_for.get(key)
        if clusters is None:
            clusters = self.usable_for[key] = [
                c for c in self.clusters if placement.allows(c) and c.takes(namespace)
            ]
        return clusters

    def nowhere(self, workload: Workload) -> Refusal:
        """Why no cluster is usable for the workload: its placement, or its namespace."""
        allowed = [c.name for c in self.clusters if workload.placement.allows(c)]
        if not allowed:
            return Refusal("no member cluster matches the placement (clusterScheduling)")
        namespace = workload.key.partition("/")[0]
        # Clusters grouped by why they do not take the namespace, in the clusters' order.
        why: dict[str, list[str]] = {}
        for cluster in self.clusters:
            if cluster.name in allowed:
                why.setdefault(cluster.refusal(namespace) or NOT_MAPPED, []).append(cluster.name)
        parts = []
        for reason, names in why.items():
            if len(names) == 1:
                where, it = f"cluster {names[0]}", "it"
            else:
                where, it = f"clusters {', '.join(names)}", "them"
            text = f"{where}: namespace {namespace} is not mapped to {it} (members[].namespaces)"
            parts.append(text if reason == NOT_MAPPED else f"{text}: {reason}")
        return Refusal("; ".join(parts))

    def could_ever_fit(self, gang: Gang, cluster: ClusterSnapshot) -> bool:
        """Whether it fits the cluster emptied; an unreachable cluster may (we cannot tell)."""
        if not cluster.reachable:
            return True
        key = (cluster.name, gang.shape)
        if key not in self.ever:
            empty = self.empty.get(cluster.name)
            if empty is None:
                empty = self.empty[cluster.name] = ClusterRoom(cluster, empty=True)
            self.ever[key] = empty.fits(gang)
        return self.ever[key]

    def with_admitted(self, cluster: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot plus this cycle's admissions to it, as reservations."""
        extra = self.admitted.get(cluster.name)
        if not extra:
            return cluster
        added = tuple(
            Reservation(w.key, w.pod_sets, w.priority, self.now, w.preemptible) for w in extra
        )
        return replace(cluster, reservations=cluster.reservations + added)

    def settled(self, gang: Gang, states: list[ClusterRoom]) -> tuple[bool, str | None]:
        """(True, the gang's scarcest resource) when it is the same over every subset of
        `states`, so whichever of them the gang turns out to fit; else (False, None).
        Capacities do not change within a cycle: the answer is remembered."""
        key = (gang.shape, tuple(s.name for s in states))
        answer = self.scarcest.get(key)
        if answer is None:
            answer = (False, None)
            if len(states) <= _MAX_SUBSETS_OF:
                subsets = [
                    [s for bit, s in enumerate(states) if mask >> bit & 1]
                    for mask in range(1, 1 << len(states))
                ]
                found = {scarcest_of(gang, subset) for subset in subsets}
                if len(found) == 1:
                    answer = (True, found.pop())
            self.scarcest[key] = answer
        return answer

    def known_refusal(self, question: tuple[object, ...]) -> tuple[Reasons, Refusal] | None:
        """The reasons found for the same question since the last admission or hold, and
        the message they make."""
        known = self.refused.get(question)
        if known is None or known[0] != self.version:
            return None
        return known[1], known[2]

    def message(self, workload: Workload, reasons: Reasons, why: Refusal) -> str:
        """Why the workload waits: `why` combines the `reasons` each usable cluster gave."""
        if why.pod_set >= 0 or POD not in why.text:
            text = why.message(workload.pod_sets)
        else:  # the reasons name different pod sets
            text = self.combine(reasons, workload.pod_sets).text
        return self.messages.setdefault(text, text)

    def combine(self, reasons: Reasons, pod_sets: Sequence[PodSet] = ()) -> Refusal:
        """One `Refusal` for all the clusters (naming the pods, given `pod_sets`)."""
        if not reasons:
            return Refusal("no member cluster matches the placement (clusterScheduling)")
        if len(self.clusters) == 1 and not pod_sets:
            return reasons[0][1]
        named = {why.pod_set for _, why in reasons if why.pod_set >= 0}
        pod_set = named.pop() if len(named) == 1 else -1
        parts = [
            f"{name}: {why.message(pod_sets) if pod_sets else why.text}" for name, why in reasons
        ]
        if len(self.clusters) == 1:
            return Refusal(parts[0].partition(": ")[2], pod_set)
        return Refusal("no cluster fits: " + "; ".join(parts), pod_set)


UNREACHABLE = Refusal("unreachable")


def best_fit(
    cycle: CycleScratch, gang: Gang, usable: Sequence[ClusterSnapshot]
) -> tuple[ClusterRoom, Placed] | Reasons:
    """Place the gang in the best cluster that fits, or say why none does.

    Best fit: among the clusters where the whole gang fits, the one left with the least
    free of the gang's scarcest resource (the requested resource it takes the largest share
    of, over the clusters where it fits) after placement; ties by cluster name. Packing
    the tightest cluster keeps larger holes elsewhere for larger workloads.
    """
    why: dict[str, Refusal] = {}
    candidates: list[ClusterRoom] = []
    for cluster in usable:
        if not cluster.reachable:
            why[cluster.name] = _unreachable(cycle, gang, cluster)
            continue
        state = cycle.state(cluster)
        refused: Refusal | None
        if cluster.name in cycle.held:
            # Held for another only where its gang fits the free room in total: where it
            # does not, that is its own reason, and one that does not change with who holds
            # (a backlog crossing the starvation limit rewrites no waiting status).
            refused = state.short_in_total(gang) or Refusal(cycle.held[cluster.name])
        else:
            refused = state.refusal(gang)
        if refused is None:
            candidates.append(state)
        else:
            why[cluster.name] = refused
    fitting: list[tuple[ClusterRoom, Placed]] = []
    settled, scarcest = cycle.settled(gang, candidates)
    if settled and scarcest is not None:
        # The scarcest resource is the same whichever candidates the gang fits, and each
        # would be left with its free room less the same amount: the first that fits,
        # best first, is the best fit, and the others need not be tried.
        resource = scarcest
        candidates.sort(key=lambda state: (state.free_of(resource), state.name))
    for state in candidates:
        placed = state.place(gang, checked=True)
        if isinstance(placed, Refusal):
            why[state.name] = placed
            continue
        fitting.append((state, placed))
        if settled:
            break
    if not fitting:
        return [(cluster.name, why[cluster.name]) for cluster in usable]
    best = scarcest_of(gang, [state for state, _ in fitting])
    chosen = min(fitting, key=lambda f: (0 if best is None else f[0].free_of(best), f[0].name))
    for state, placed in fitting:
        if state is not chosen[0]:
            placed.undo()
    return chosen


def _unreachable(cycle: CycleScratch, gang: Gang, cluster: ClusterSnapshot) -> Refusal:
    """Why the gang waits for an unreachable cluster: unreachable only where it would fit the
    cluster as last seen; where it would not, its own shortfall, as while the cluster
    answered. A member that answers slowly under load (the probe gives it a few seconds)
    then rewrites no waiting status, only that of work it would take. Never synced (no
    nodes seen): unreachable."""
    if not cluster.nodes:
        return UNREACHABLE
    placed = cycle.state(cluster).place(gang)
    if isinstance(placed, Refusal):
        return placed
    placed.undo()
    return UNREACHABLE


def scarcest_of(gang: Gang, states: Sequence[ClusterRoom]) -> str | None:
    """The requested resource the gang takes the largest share of, over `states`."""
    best: tuple[float, str] | None = None
    for resource, value in gang.totals:
        capacity = sum(s.capacity_of(resource) for s in states)
        share = value / capacity if capacity > 0 else math.inf
        if best is None or share > best[0]:
            best = (share, resource)
    return None if best is None else best[1]


@dataclass(frozen=True, slots=True)
class Victims:
    """Evicting `keys` in `cluster` makes room for the workload that asked."""

    cluster: str
    keys: tuple[str, ...]


def ask_victims(
    workload: Workload,
    gang: Gang,
    cycle: CycleScratch,
    usable: Sequence[ClusterSnapshot],
    policy: PreemptionPolicy,
    rules: Callable[[], VictimRules] | None,
    context: object,
) -> Victims | None:
    """Ask the policy in every usable cluster; take the fewest victims, then cluster name.
    The quota `rules` are made only if the policy is asked (they copy the ledger)."""
    best: Victims | None = None
    made: VictimRules | None = None
    for cluster in usable:
        if not cluster.reachable or cluster.name in cycle.held:
            continue
        failed_at = cycle.no_victims.get((cluster.name, gang.shape, context))
        if failed_at is not None and workload.priority <= failed_at:
            continue
        if rules is not None and made is None:
            made = rules()
        victims = policy.choose_victims(workload, cycle.with_admitted(cluster), made)
        if victims is None:  # cannot make room there
            cycle.no_victims[(cluster.name, gang.shape, context)] = workload.priority
        elif victims and (best is None or len(victims) < len(best.keys)):
            best = Victims(cluster.name, victims)
            if len(victims) == 1:
                break  # no later cluster can name fewer, and a tie goes to the earlier one
    return best


def policy_done(
    workload: Workload,
    gang: Gang,
    cycle: CycleScratch,
    usable: Sequence[ClusterSnapshot],
    context: object,
) -> bool:
    """Whether `ask_victims` would ask the policy nothing for this workload now."""
    for cluster in usable:
        if cluster.reachable and cluster.name not in cycle.held:
            failed_at = cycle.no_victims.get((cluster.name, gang.shape, context))
            if failed_at is None or workload.priority > failed_at:
                return False
    return True
