"""Choosing preemption victims (rule 4). Pure, no I/O.

`PreemptionPolicy` is the one-method seam the scheduling cycle calls when a workload fits
nowhere; tests hand the cycle canned answers through it. `LowestPriorityFirst` is the
default policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dispatcher.api.models import Reason
from dispatcher.core.mentions import mention, mention_all
from dispatcher.core.model import ClusterSnapshot, DispatchedWorkload, Workload
from dispatcher.core.quota.model import Charge
from dispatcher.core.scheduling.evictions import evict, without
from dispatcher.core.scheduling.placement import ClusterRoom, Gang

__all__ = [
    "HonourClaims",
    "LowestPriorityFirst",
    "PreemptionPolicy",
    "PreemptorClaim",
    "VictimRules",
    "evicting",
    "why_evicted",
]


def why_evicted(
    victim: str,
    charged: Charge | None,
    *,
    preemptor: str,
    preemptor_uid: str,
    priority: int,
    queue: str,
) -> tuple[Reason, str]:
    """The victim's reason and message (its Preempted condition and Event) for its eviction
    by `preemptor` (of `priority`, charged to cluster queue `queue`, "" for none): named
    only for the victim's own namespace (`core.mentions`)."""
    by = mention(preemptor, to=victim, uid=preemptor_uid)
    if charged is not None and queue and charged.queue != queue:
        return Reason.RECLAIMED_WITHIN_COHORT, (
            f"reclaimed by {by} for cluster queue {queue}: cluster queue"
            f" {charged.queue} was borrowing from the cohort"
        )
    if charged is not None and charged.priority >= priority:
        return Reason.PREEMPTED_WITHIN_QUEUE, (
            f"preempted by {by}, priority {priority}, within cluster"
            f" queue {charged.queue} (admitted later at the same priority)"
        )
    return Reason.PREEMPTED_BY_HIGHER_PRIORITY, f"preempted by {by}, priority {priority}"


def evicting(preemptor: str, victims: Sequence[str], cluster: str) -> str:
    """The preemptor's Event when its victims are evicted, in its own namespace's terms."""
    return f"evicting {mention_all(victims, to=preemptor)} in cluster {cluster}"


class VictimRules(Protocol):
    """A second thing victims must free besides room in the cluster (a queue's quota),
    and who may be a victim for it (see `core.quota.victims`)."""

    def allowed(self, candidate: DispatchedWorkload) -> bool: ...

    def order(self, candidate: DispatchedWorkload) -> int: ...

    def still_allowed(self, candidate: DispatchedWorkload) -> bool: ...

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

    Candidates are the cluster's dispatched AppWrappers that are preemptible, of strictly
    lower priority than the workload (equal or higher priority is never evicted, so two
    workloads can never evict each other in turn), and no longer protected at `now` (their
    minimum runtime run: `DispatchedWorkload.protected_until`). They are taken lowest
    priority first, then the least runtime lost first (the shortest run since their dispatch
    or their last declared checkpoint, whichever is later), then most recently dispatched
    first, until the workload fits; then every victim whose eviction turns out unnecessary is
    given back, last taken first, until each remaining victim is needed: sparing any one of
    them would leave the workload short. The set is minimal in that sense, not necessarily
    the smallest possible (finding that is a knapsack problem).

    "Fits" is checked on one `ClusterRoom` of the cluster, built as the cycle builds
    it, with the victims evicted on it (see `evictions`: each gives back what it holds),
    and the set found is confirmed on a state built afresh without the victims, as the next
    cycle will build it. Where that falls short (a reservation that found no node takes the
    room the victims free), the shortest run of further candidates that makes it fit there
    is taken, and then every victim the fresh state does without is spared. Evicting the
    set named always makes the workload fit in the next cycle.

    Where protection alone stands in the way (with the protected candidates it would find
    victims), the earliest time it no longer does is noted in `protected` under the
    workload's key: its wait says so, and the shell wakes it then.
    """

    now: float | None = None
    """The cycle's time; None: protection is not looked at (every candidate may be taken)."""
    protected: dict[str, float] | None = field(default=None, compare=False)
    """Filled as it is asked: workload key -> when the protection holding it back ends
    (the earliest over the clusters asked)."""

    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot, rules: VictimRules | None = None
    ) -> tuple[str, ...] | None:
        everyone = _candidates(workload, cluster, rules)
        now = self.now
        if now is None:
            return _search(workload, cluster, rules, everyone)
        candidates = [c for c in everyone if not _protected(c, now)]
        found = _search(workload, cluster, rules, candidates)
        if found is None and len(candidates) < len(everyone) and self.protected is not None:
            until = _protection_ends(workload, cluster, rules, everyone, now)
            if until is not None:
                known = self.protected.get(workload.key, until)
                self.protected[workload.key] = min(known, until)
        return found


def _search(
    workload: Workload,
    cluster: ClusterSnapshot,
    rules: VictimRules | None,
    candidates: list[DispatchedWorkload],
) -> tuple[str, ...] | None:
    """The victims among `candidates` (in the order they are taken) that make `workload`
    fit, as `LowestPriorityFirst` says."""
    gang = Gang.of(workload.pod_sets)
    trial = _Trial(ClusterRoom(cluster), gang, rules)
    if candidates and trial.fits():
        return ()
    if not candidates:
        return None
    # Evict candidates in order until it fits; then give back those not needed.
    if not trial.take_until_fits(candidates):
        return None  # evicting all of them still leaves it short
    trial.give_back_unneeded()
    chosen = trial.release()
    # Confirm on the member as the next cycle will build it without the victims: there
    # the other reservations are placed afresh and may take room the victims free (as
    # their pending pods would). Take further candidates, in order, while it falls short,
    # or evicting these would not make it fit and it would have to evict again.
    afresh = _Afresh(cluster, gang, rules)
    if afresh.fits(chosen):
        return tuple(chosen)
    # Never another queue's work here: whether its queue still borrows is known only
    # along the run above.
    taken = set(chosen)
    spare = [
        c.key for c in candidates if c.key not in taken and (rules is None or rules.order(c) == 1)
    ]
    if not spare or not afresh.fits(chosen + spare):
        return None
    chosen += spare[: afresh.shortest_run(chosen, spare)]
    return tuple(afresh.spare_unneeded(chosen))


def _protection_ends(
    workload: Workload,
    cluster: ClusterSnapshot,
    rules: VictimRules | None,
    everyone: list[DispatchedWorkload],
    now: float,
) -> float | None:
    """The earliest time from which the candidates then unprotected make `workload` fit;
    None if even all of them would not (protection is not what holds it back). Whether they
    do only grows with the time (more candidates), so the time is found by halving."""
    ends = sorted({c.protected_until for c in everyone if _protected(c, now)})

    def works(index: int) -> bool:
        until = ends[index]
        free = [c for c in everyone if not _protected(c, until)]
        return _search(workload, cluster, rules, free) is not None

    high = len(ends) - 1
    if not works(high):
        return None
    low = -1  # ends[low] does not work (-1: now, which did not)
    while high - low > 1:
        middle = (low + high) // 2
        if works(middle):
            high = middle
        else:
            low = middle
    return ends[high]


def _protected(candidate: DispatchedWorkload, now: float) -> bool:
    """Within its minimum runtime at `now`. One with none is never protected, even
    dispatched "after" `now` by a clock ahead of this one."""
    until = candidate.protected_until
    return until > now and until > candidate.dispatched_at


def _since(candidate: DispatchedWorkload) -> float:
    """Where the runtime its eviction loses starts: its dispatch, or its last declared
    checkpoint if later (the checkpoint is held to the attempt by the shell)."""
    return max(candidate.dispatched_at, candidate.checkpointed_at)


def _candidates(
    workload: Workload, cluster: ClusterSnapshot, rules: VictimRules | None
) -> list[DispatchedWorkload]:
    """Who may be evicted for `workload`, in the order they are taken: without `rules`, the
    preemptible of strictly lower priority, lowest priority first, then the least runtime
    lost first, then most recently dispatched first; with them, those the rules allow, in
    the rules' order first. Priority comes before the runtime lost, as in Kueue: priorities
    keep their meaning (the MCAD and AppWrapper suites rely on it)."""
    if rules is None:
        return sorted(
            (a for a in cluster.admitted if a.preemptible and a.priority < workload.priority),
            key=lambda a: (a.priority, -_since(a), -a.dispatched_at, a.key),
        )
    return sorted(
        (a for a in cluster.admitted if rules.allowed(a)),
        key=lambda a: (rules.order(a), a.priority, -_since(a), -a.dispatched_at, a.key),
    )


class _Trial:
    """Victims evicted one by one on one `ClusterRoom` (and the rules' ledger), each with
    the function that gives back what its eviction freed."""

    __slots__ = ("gang", "rules", "state", "taken", "undo")

    def __init__(self, state: ClusterRoom, gang: Gang, rules: VictimRules | None) -> None:
        self.state = state
        self.gang = gang
        self.rules = rules
        self.taken: list[DispatchedWorkload] = []  # in the order taken
        self.undo: dict[str, Callable[[], None]] = {}

    def fits(self) -> bool:
        return self.state.fits(self.gang) and (self.rules is None or self.rules.fits())

    def take(self, victim: DispatchedWorkload) -> None:
        room = evict(self.state, victim)
        quota = self.rules.evict(victim.key) if self.rules is not None else None

        def back() -> None:
            room()
            if quota is not None:
                quota()

        self.undo[victim.key] = back

    def take_until_fits(self, candidates: Iterable[DispatchedWorkload]) -> bool:
        """Take candidates in order (those the rules still allow) until the workload fits;
        if it never does, give them all back and say so."""
        rules = self.rules
        for candidate in candidates:
            if rules is not None and not rules.still_allowed(candidate):
                continue
            self.take(candidate)
            self.taken.append(candidate)
            if self.fits():
                return True
        for victim in self.taken:
            self.undo[victim.key]()
        return False

    def give_back_unneeded(self) -> None:
        """Give back victims that are not needed, last taken first, until each one left is
        needed (after one is given back, an earlier one may have become unneeded)."""
        taken = self.taken
        given_back = True
        while given_back:
            given_back = False
            for victim in reversed(taken):
                self.undo[victim.key]()
                if self.fits():
                    taken.remove(victim)
                    given_back = True
                    break
                self.take(victim)

    def release(self) -> list[str]:
        """Give back every victim (the rules' ledger is the caller's to use again); their
        keys, in the order taken."""
        for victim in self.taken:
            self.undo[victim.key]()
        return [v.key for v in self.taken]


@dataclass(frozen=True, slots=True)
class _Afresh:
    """Whether the workload fits the cluster as the next cycle will build it without a set
    of victims. Each check builds a state, so the searches below take few checks: the
    shortest run of further candidates by doubling, then halving; victims spared a block at
    a time while blocks can go."""

    cluster: ClusterSnapshot
    gang: Gang
    rules: VictimRules | None

    def fits(self, keys: list[str]) -> bool:
        if self.rules is not None and not self.rules.fits_without(keys):
            return False
        return ClusterRoom(without(self.cluster, frozenset(keys))).fits(self.gang)

    def shortest_run(self, chosen: list[str], spare: list[str]) -> int:
        """How many of `spare`, from the first, `chosen` needs to fit (all of them do)."""
        low, high = 0, 1
        while high < len(spare) and not self.fits(chosen + spare[:high]):
            low, high = high, min(2 * high, len(spare))
        while high - low > 1:
            middle = (low + high) // 2
            if self.fits(chosen + spare[:middle]):
                high = middle
            else:
                low = middle
        return high

    def spare_unneeded(self, chosen: list[str]) -> list[str]:
        """`chosen` without every victim the fresh state does without, last taken first: a
        block at a time while blocks can go, then one at a time, until each one left is
        needed."""
        chosen = self._spare_block(chosen, chosen[::-1])
        given_back = True
        while given_back:
            given_back = False
            for key in reversed(chosen):
                rest = [k for k in chosen if k != key]
                if self.fits(rest):
                    chosen, given_back = rest, True
                    break
        return chosen

    def _spare_block(self, chosen: list[str], block: list[str]) -> list[str]:
        """`chosen` without `block` if the fresh state does without it, else without what
        each of its halves can spare."""
        leaving = set(block)
        rest = [k for k in chosen if k not in leaving]
        if self.fits(rest):
            return rest
        if len(block) > 1:
            chosen = self._spare_block(chosen, block[: len(block) // 2])
            chosen = self._spare_block(chosen, block[len(block) // 2 :])
        return chosen


@dataclass(frozen=True, slots=True)
class PreemptorClaim:
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
    claims: Mapping[str, PreemptorClaim]

    def choose_victims(
        self, workload: Workload, cluster: ClusterSnapshot, rules: VictimRules | None = None
    ) -> tuple[str, ...] | None:
        claim = self.claims.get(workload.key)
        if claim is None:
            return self.inner.choose_victims(workload, cluster, rules)
        return claim.victims if claim.cluster == cluster.name else None
