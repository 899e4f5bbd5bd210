"""Choosing preemption victims (rule 4). Pure, no I/O.

`PreemptionPolicy` is the one-method seam the scheduling cycle calls when a workload fits
nowhere; tests hand the cycle canned answers through it. `LowestPriorityFirst` is the
default policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dispatcher.core.fit import ClusterState
from dispatcher.core.model import AdmittedWorkload, ClusterSnapshot, Workload

__all__ = ["LowestPriorityFirst", "PreemptionPolicy"]


class PreemptionPolicy(Protocol):
    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot
    ) -> tuple[str, ...] | None:
        """Keys of the dispatched AppWrappers in `cluster` to evict so that `workload` fits.

        None when no allowed set of victims makes it fit; () when it fits already.
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
    until each remaining victim is needed: removing any one of them from the set breaks the
    fit. The set is minimal in that sense, not necessarily the smallest possible (finding
    that is a knapsack problem).
    """

    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot
    ) -> tuple[str, ...] | None:
        candidates: list[AdmittedWorkload] = sorted(
            (a for a in cluster.admitted if a.preemptible and a.priority < workload.priority),
            key=lambda a: (a.priority, -a.dispatched_at, a.key),
        )
        if _fits(workload, cluster, ()):
            return ()
        keys = [c.key for c in candidates]
        if not keys or not _fits(workload, cluster, keys):
            return None
        victims: list[str] = []
        for key in keys:
            victims.append(key)
            if _fits(workload, cluster, victims):
                break
        # Give back victims that are not needed, last taken first, until each one left is.
        while True:
            for key in reversed(victims):
                rest = [v for v in victims if v != key]
                if _fits(workload, cluster, rest):
                    victims = rest
                    break
            else:
                return tuple(victims)
