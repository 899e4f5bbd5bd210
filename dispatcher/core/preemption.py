"""Choosing preemption victims (rule 4). Pure, no I/O.

`PreemptionPolicy` is the one-method seam the scheduling cycle calls when a workload fits
nowhere; tests hand the cycle canned answers through it. `LowestPriorityFirst` is the
default policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from dispatcher.core.fit import Demand, Evictions
from dispatcher.core.model import AdmittedWorkload, ClusterSnapshot, Workload

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
    that is a knapsack problem).

    "Fits" is the check the next cycle will make once the victims are gone: a fresh state
    built from the snapshot without them (`Evictions` answers it without building each
    state). Answering from the same construction keeps the promise "evicting these makes
    it fit" (and so avoids evicting, then evicting again).

    A cluster can hold hundreds of candidates, so both searches skip checks: the shortest
    prefix of candidates that fits is found by galloping then halving (`first_fit`), and
    victims are given back by blocks (a run of victims, last taken first, that can all be
    given back at once is, else the run is halved). Whenever evicting more never makes the
    workload fit worse (the usual case; greedy packing can rarely break it) that ends
    exactly where taking and giving back one at a time would, with far fewer checks; in
    every case a last pass one at a time makes sure each victim left is needed.
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
        check = Evictions(cluster, Demand(workload.pod_sets))
        if check.fits(()):
            return ()
        keys = [c.key for c in candidates]
        taken = check.first_fit(keys)  # None: evicting them all leaves it short
        if taken is None:
            return None
        victims = keys[:taken]
        # Give back victims that are not needed, last taken first, a block at a time.
        kept = list(victims)

        def give_back(block: list[str]) -> None:
            if not block:
                return
            given = set(block)
            rest = [v for v in kept if v not in given]
            if check.fits(rest):
                kept[:] = rest
                return
            if len(block) > 1:
                half = len(block) // 2
                give_back(block[:half])
                give_back(block[half:])

        give_back(victims[::-1])
        # Then one at a time, last taken first, until each one left is needed.
        while True:
            for key in reversed(kept):
                rest = [v for v in kept if v != key]
                if check.fits(rest):
                    kept = rest
                    break
            else:
                return tuple(kept)


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
