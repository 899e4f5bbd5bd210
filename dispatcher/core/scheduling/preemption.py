"""Choosing preemption victims (rule 4). Pure, no I/O.

`PreemptionPolicy` is the one-method seam the scheduling cycle calls when a workload fits
nowhere; tests hand the cycle canned answers through it. `LowestPriorityFirst` is the
default policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from dispatcher.core.model import AdmittedWorkload, ClusterSnapshot, Workload
from dispatcher.core.scheduling.evictions import evict, without
from dispatcher.core.scheduling.placement import ClusterState, Gang

__all__ = ["Claim", "HonourClaims", "LowestPriorityFirst", "PreemptionPolicy", "VictimRules"]


class VictimRules(Protocol):
    """A second thing victims must free besides room in the cluster (a queue's quota),
    and who may be a victim for it (see `core.quota.victims`)."""

    def allowed(self, candidate: AdmittedWorkload) -> bool: ...

    def order(self, candidate: AdmittedWorkload) -> int: ...

    def still_allowed(self, candidate: AdmittedWorkload) -> bool: ...

    def evict(self, key: str) -> Callable[[], None]: ...

    def fits(self) -> bool: ...

    def fits_without(self, keys: Iterable[str]) -> bool: ...


class PreemptionPolicy(Protocol):
    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot, rules: VictimRules | None = None
    ) -> tuple[str, ...] | None:
        """Keys of the dispatched AppWrappers in `cluster` to evict so that `workload` fits
        (and, given `rules`, its quota fits too, victims chosen as the rules allow).

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

    "Fits" is checked on one `ClusterState` of the cluster, built as the cycle builds
    it, with the victims evicted on it (see `evictions`: each gives back what it holds),
    and the set found is confirmed on a state built afresh without the victims, as the next
    cycle will build it. Where that falls short (a reservation that found no node takes the
    room the victims free), the shortest run of further candidates that makes it fit there
    is taken, and then every victim the fresh state does without is spared. Evicting the
    set named always makes the workload fit in the next cycle.
    """

    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot, rules: VictimRules | None = None
    ) -> tuple[str, ...] | None:
        if rules is None:
            candidates: list[AdmittedWorkload] = sorted(
                (a for a in cluster.admitted if a.preemptible and a.priority < workload.priority),
                key=lambda a: (a.priority, -a.dispatched_at, a.key),
            )
        else:
            candidates = sorted(
                (a for a in cluster.admitted if rules.allowed(a)),
                key=lambda a: (rules.order(a), a.priority, -a.dispatched_at, a.key),
            )
        gang = Gang.of(workload.pod_sets)
        state = ClusterState(cluster)

        def fits() -> bool:
            return state.fits(gang) and (rules is None or rules.fits())

        if candidates and fits():
            return ()
        if not candidates:
            return None
        # Evict candidates in order until it fits.
        undo: dict[str, Callable[[], None]] = {}
        taken: list[AdmittedWorkload] = []

        def take(victim: AdmittedWorkload) -> None:
            room = evict(state, victim)
            quota = rules.evict(victim.key) if rules is not None else None

            def back() -> None:
                room()
                if quota is not None:
                    quota()

            undo[victim.key] = back

        for candidate in candidates:
            if rules is not None and not rules.still_allowed(candidate):
                continue
            take(candidate)
            taken.append(candidate)
            if fits():
                break
        else:
            for victim in taken:
                undo[victim.key]()
            return None  # evicting all of them still leaves it short
        # Give back victims that are not needed, last taken first, until each one left is
        # needed (after one is given back, an earlier one may have become unneeded).
        given_back = True
        while given_back:
            given_back = False
            for victim in reversed(taken):
                undo[victim.key]()
                if fits():
                    taken.remove(victim)
                    given_back = True
                    break
                take(victim)
        for victim in taken:
            undo[victim.key]()  # the rules' ledger is the caller's to use again
        # Confirm on the member as the next cycle will build it without the victims: there
        # the other reservations are placed afresh and may take room the victims free (as
        # their pending pods would). Take further candidates, in order, while it falls short,
        # or evicting these would not make it fit and it would have to evict again.
        chosen = [v.key for v in taken]

        def fits_afresh(keys: list[str]) -> bool:
            if rules is not None and not rules.fits_without(keys):
                return False
            return ClusterState(without(cluster, frozenset(keys))).fits(gang)

        if fits_afresh(chosen):
            return tuple(chosen)
        # Each check builds a state: the shortest run of further candidates that makes it
        # fit is found by doubling, then halving; then every victim the fresh state does
        # without is spared, last taken first, a block at a time while blocks can go.
        # (Never another queue's work here: whether its queue still borrows is known only
        # along the run above.)
        spare = [
            c.key
            for c in candidates
            if c.key not in set(chosen) and (rules is None or rules.order(c) == 1)
        ]
        if not spare or not fits_afresh(chosen + spare):
            return None
        low, high = 0, 1
        while high < len(spare) and not fits_afresh(chosen + spare[:high]):
            low, high = high, min(2 * high, len(spare))
        while high - low > 1:
            middle = (low + high) // 2
            if fits_afresh(chosen + spare[:middle]):
                high = middle
            else:
                low = middle
        chosen += spare[:high]

        def give_back(block: list[str]) -> None:
            """Spare `block` at once if the fresh state does without it, else its halves."""
            nonlocal chosen
            rest = [k for k in chosen if k not in set(block)]
            if fits_afresh(rest):
                chosen = rest
            elif len(block) > 1:
                give_back(block[: len(block) // 2])
                give_back(block[len(block) // 2 :])

        give_back(chosen[::-1])  # last taken first
        given_back = True
        while given_back:  # then one at a time, until each one left is needed
            given_back = False
            for key in reversed(chosen):
                rest = [k for k in chosen if k != key]
                if fits_afresh(rest):
                    chosen, given_back = rest, True
                    break
        return tuple(chosen)


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
        self, workload: Workload, cluster: ClusterSnapshot, rules: VictimRules | None = None
    ) -> tuple[str, ...] | None:
        claim = self.claims.get(workload.key)
        if claim is None:
            return self.inner.choose_victims(workload, cluster, rules)
        return claim.victims if claim.cluster == cluster.name else None
