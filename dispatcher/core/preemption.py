"""Choosing preemption victims (rule 4). Pure, no I/O.

`PreemptionPolicy` is the one-method seam the scheduling cycle calls when a workload fits
nowhere; tests hand the cycle canned answers through it. `LowestPriorityFirst` is the
default policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from dispatcher.core.fit import ClusterState, Demand
from dispatcher.core.model import AdmittedWorkload, ClusterSnapshot, PodSet, Workload

__all__ = ["Claim", "HonourClaims", "LowestPriorityFirst", "PreemptionPolicy"]


class PreemptionPolicy(Protocol):
    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot
    ) -> tuple[str, ...] | None:
        """Keys of the dispatched AppWrappers in `cluster` to evict so that `workload` fits.

        None when eviction cannot help: there is nothing it may evict, or evicting all of
        that still leaves it short. () when it fits already.
        """
        ...


def _fits(workload: Workload, cluster: ClusterSnapshot, victims: Sequence[str]) -> bool:
    # The check the next cycle will make once the victims are gone: a fresh state built from
    # the snapshot without them. Answering from the same construction keeps the promise
    # "evicting these makes it fit" (and so avoids evicting, then evicting again).
    state = ClusterState(cluster.without(frozenset(victims)))
    return state.fits(workload.pod_sets) is None


@dataclass(frozen=True, slots=True)
class LowestPriorityFirst:
    """Evict the fewest, least important AppWrappers that make room.

    Candidates are the cluster's dispatched AppWrappers that are preemptible and of strictly
    lower priority than the workload (equal or higher priority is never evicted, so two
    workloads can never evict each other in turn). They are taken lowest priority first,
    then most recently dispatched first (the least work lost), until the workload fits;
    then every victim whose eviction turns out unnecessary is given back, last taken first,
    until each remaining victim is needed: sparing any one of them would leave the workload
    short. The set is minimal in that sense, not necessarily the smallest possible (finding
    that is a knapsack problem). Each "fits" is answered by the aggregate when that is
    already short, else by a fresh `ClusterState` of the cluster without the victims.
    """

    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot
    ) -> tuple[str, ...] | None:
        candidates: list[AdmittedWorkload] = sorted(
            (a for a in cluster.admitted if a.preemptible and a.priority < workload.priority),
            key=lambda a: (a.priority, -a.dispatched_at, a.key),
        )
        if not candidates:
            return None
        demand = Demand(workload.pod_sets)
        now = ClusterState(cluster)
        if now.fits(demand) is None:
            return ()
        short = _Shortfall(now, demand, candidates, cluster)

        def fits(victims: Sequence[str]) -> bool:
            # The aggregate first (cheap), then the full check on a fresh state.
            return not short.after_evicting(victims) and _fits(workload, cluster, victims)

        keys = [c.key for c in candidates]
        if not fits(keys):
            return None
        victims: list[str] = []
        for key in keys:
            victims.append(key)
            if fits(victims):
                break
        # Give back victims that are not needed, last taken first, until each one left is.
        while True:
            for key in reversed(victims):
                rest = [v for v in victims if v != key]
                if fits(rest):
                    victims = rest
                    break
            else:
                return tuple(victims)


class _Shortfall:
    """How far the aggregate falls short of a demand once some candidates are evicted."""

    def __init__(
        self,
        now: ClusterState,
        demand: Demand,
        candidates: Sequence[AdmittedWorkload],
        cluster: ClusterSnapshot,
    ) -> None:
        self._missing = {r: v - now.free_of(r) for r, v in demand.totals.items()}
        schedulable = {n.name for n in cluster.nodes if n.schedulable}
        reserved: dict[str, list[PodSet]] = {}
        for reservation in cluster.reservations:
            reserved.setdefault(reservation.key, []).extend(reservation.pod_sets)
        self._frees: dict[str, dict[str, int]] = {}
        for candidate in candidates:
            frees: dict[str, int] = {}
            for node_name, used in candidate.usage:
                if node_name in schedulable:
                    for resource in self._missing:
                        frees[resource] = frees.get(resource, 0) + used[resource]
            for pod_set in reserved.get(candidate.key, ()):
                for resource in self._missing:
                    frees[resource] = (
                        frees.get(resource, 0) + pod_set.requests[resource] * pod_set.count
                    )
            self._frees[candidate.key] = frees

    def after_evicting(self, victims: Sequence[str]) -> bool:
        """True when the aggregate would still be short with these victims gone."""
        for resource, missing in self._missing.items():
            if missing > 0 and sum(self._frees[v].get(resource, 0) for v in victims) < missing:
                return True
        return False


@dataclass(frozen=True, slots=True)
class Claim:
    """A preemptor's hold on the room its victims are freeing, in one cluster."""

    cluster: str
    victims: tuple[str, ...]
    at: float  # when the victims were chosen


@dataclass(frozen=True, slots=True)
class HonourClaims:
    """Wraps a policy so that a preemptor with a claim never asks for more victims.

    Between the eviction and the moment the victims' pods are gone, the preemptor still
    does not fit. Asking the inner policy again then would evict a second set for the same
    need. Instead the claim's victims are named again: the cycle records the preemption and
    holds the cluster for the preemptor (lower priorities cannot take the freed room), and
    the shell evicts nobody twice. A claim elsewhere keeps the preemptor from preempting in
    another cluster as well.
    """

    inner: PreemptionPolicy
    claims: Mapping[str, Claim]

    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot
    ) -> tuple[str, ...] | None:
        claim = self.claims.get(workload.key)
        if claim is None:
            return self.inner.choose_victims(workload, cluster)
        return claim.victims if claim.cluster == cluster.name else None
