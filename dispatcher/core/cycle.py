"""One scheduling cycle: pending workloads + cluster snapshots -> decisions. Pure, no I/O.

`schedule` is a function of its arguments only. It decides; the controller carries the
decisions out (creates the objects of each `Admit`, evicts the victims of each `Preempt`,
writes each `Wait` message to the AppWrapper's status) and runs the next cycle on fresh
snapshots. Every pending workload gets exactly one `Admit` or one `Wait`; a `Preempt`
comes in addition to the `Wait` of the workload that asked for it.

Speed (10,000 pending workloads are mostly a few dozen shapes): one `Demand` per gang
shape; a workload of a shape that found no room since the last admission or hold gets
the answer the last one got (its message naming its own pod), and so does one after an
admission or hold when each cluster still gives the same reason (asked without placing
anything; a cluster's reasons are remembered until it changes); the best-fit cluster is
known from the aggregate before any pod is placed, so a gang is placed in one cluster,
not tried in all; and the same reasons make the same message string.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter

from dispatcher.core.fit import (
    ClusterState,
    Demand,
    NodeAssignment,
    PlaceResult,
    Shape,
    reason_for,
    shape_of,
    token_parts,
)
from dispatcher.core.model import ClusterSnapshot, Placement, QueueMode, Reservation, Workload
from dispatcher.core.preemption import PreemptionPolicy

__all__ = ["Admit", "CycleResult", "Preempt", "Wait", "queue_order_key", "schedule"]


@dataclass(frozen=True, slots=True)
class Admit:
    """Dispatch workload `key` to `cluster`. `assignments` is one placement that fits."""

    key: str
    cluster: str
    assignments: tuple[NodeAssignment, ...] = ()


@dataclass(frozen=True, slots=True)
class Wait:
    """Workload `key` stays queued; `message` says why, for `kubectl describe`."""

    key: str
    message: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Evict `victims` (AppWrapper keys) from `cluster` to make room for workload `key`."""

    key: str
    cluster: str
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CycleResult:
    admits: tuple[Admit, ...] = ()
    waits: tuple[Wait, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    head_key: str | None = None  # the first workload in queue order not admitted


def queue_order_key(workload: Workload) -> tuple[int, float, str]:
    """Rule 3: higher priority first, then older (created_at), then key."""
    return (-workload.priority, workload.created_at, workload.key)


class _Cycle:
    """The state one `schedule` call carries from one workload to the next."""

    def __init__(self, clusters: Sequence[ClusterSnapshot], now: float) -> None:
        self.clusters = tuple(sorted(clusters, key=lambda c: c.name))
        self.names = tuple(c.name for c in self.clusters)
        self.single = len(self.clusters) == 1
        self.now = now
        self.states: dict[str, ClusterState] = {}
        self._empty: dict[str, ClusterState] = {}
        self._ever: dict[tuple[str, Shape], bool] = {}
        self._usable: dict[Placement, tuple[tuple[ClusterSnapshot, ...], tuple[str, ...]]] = {}
        self._scarcest: dict[tuple[Demand, tuple[str, ...]], str | None] = {}
        self._settled: dict[tuple[Demand, tuple[str, ...]], tuple[bool, str | None]] = {}
        # Clusters later workloads may not use this cycle, and why (a preemptor's claim, a
        # starving head's reservation).
        self.held: dict[str, str] = {}
        self.admitted: dict[str, list[Workload]] = {}
        # (cluster, gang shape) -> highest priority for which the policy found no victims.
        self.no_victims: dict[tuple[str, Shape], int] = {}
        # Bumped on every admission and every new hold: while it stands, a workload of a
        # shape that found no room gets the same answer as the last one of that shape.
        self.version = 0
        self.demands: dict[Shape, Demand] = {}
        # (version, message, the reason per usable cluster it was made of).
        self.verdicts: dict[tuple[object, ...], tuple[int, str, list[tuple[str, str]]]] = {}
        # The same reasons give the same message (one string for all the workloads it is for).
        self._messages: dict[tuple[tuple[str, str], ...], str] = {}

    def state(self, cluster: ClusterSnapshot) -> ClusterState:
        state = self.states.get(cluster.name)
        if state is None:
            state = self.states[cluster.name] = ClusterState(cluster)
        return state

    def usable(self, placement: Placement) -> tuple[tuple[ClusterSnapshot, ...], tuple[str, ...]]:
        """The clusters the placement allows, and their names."""
        if placement.clusters is None and not placement.match_labels:
            return self.clusters, self.names
        known = self._usable.get(placement)
        if known is None:
            clusters = tuple(c for c in self.clusters if placement.allows(c))
            known = self._usable[placement] = (clusters, tuple(c.name for c in clusters))
        return known

    def could_ever_fit(self, demand: Demand, cluster: ClusterSnapshot) -> bool:
        """Whether it fits the cluster emptied; an unreachable cluster may (we cannot tell)."""
        if not cluster.reachable:
            return True
        shape = (cluster.name, demand.key)
        answer = self._ever.get(shape)
        if answer is None:
            empty = self._empty.get(cluster.name)
            if empty is None:
                empty = self._empty[cluster.name] = ClusterState(cluster, empty=True)
            answer = self._ever[shape] = empty.fits(demand) is None
        return answer

    def hold(self, cluster: str, why: str) -> None:
        """Hold `cluster` for the rest of the cycle (it must not be held already)."""
        self.held[cluster] = why
        self.version += 1

    def with_admitted(self, cluster: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot plus this cycle's admissions to it, as reservations."""
        extra = self.admitted.get(cluster.name)
        if not extra:
            return cluster
        return replace(
            cluster,
            reservations=cluster.reservations
            + tuple(
                Reservation(
                    key=w.key,
                    pod_sets=w.pod_sets,
                    priority=w.priority,
                    dispatched_at=self.now,
                    preemptible=w.preemptible,
                )
                for w in extra
            ),
        )

    def wait_message(self, reasons: Sequence[tuple[str, str]]) -> str:
        if not reasons:
            return "no member cluster matches the placement (clusterScheduling)"
        if self.single:
            return reasons[0][1]
        key = tuple(reasons)
        message = self._messages.get(key)
        if message is None:
            message = self._messages[key] = "no cluster fits: " + "; ".join(
                f"{name}: {why}" for name, why in reasons
            )
        return message

    def scarcest(self, demand: Demand, states: Sequence[ClusterState]) -> str | None:
        """The requested resource the workload takes the largest share of, over `states`."""
        key = (demand, tuple([s.name for s in states]))
        if key not in self._scarcest:
            self._scarcest[key] = _scarcest(demand, states)
        return self._scarcest[key]

    def settled(self, demand: Demand, states: Sequence[ClusterState]) -> tuple[bool, str | None]:
        """(True, resource) when every subset of `states` has `resource` as its scarcest
        for `demand` (so it is the scarcest wherever the gang turns out to fit), else
        (False, None)."""
        key = (demand, tuple([s.name for s in states]))
        answer = self._settled.get(key)
        if answer is None:
            answer = (False, None)
            if len(states) <= _MAX_SUBSETS_OF:
                first = self.scarcest(demand, states)
                if all(_scarcest(demand, subset) == first for subset in _subsets(states)):
                    answer = (True, first)
            self._settled[key] = answer
        return answer


# Beyond this many candidate clusters, `_best_fit` tries them all rather than reasoning
# over every subset of them.
_MAX_SUBSETS_OF = 6


def _subsets(items: Sequence[ClusterState]) -> Iterator[list[ClusterState]]:
    """The non-empty subsets of `items`, each in the order of `items`."""
    for mask in range(1, 1 << len(items)):
        yield [item for bit, item in enumerate(items) if mask >> bit & 1]


def _scarcest(demand: Demand, states: Sequence[ClusterState]) -> str | None:
    """The requested resource the workload takes the largest share of, over `states`."""
    best: tuple[float, str] | None = None
    for resource, value in sorted(demand.totals.items()):
        if value <= 0:
            continue
        capacity = sum(s.capacity_of(resource) for s in states)
        share = value / capacity if capacity > 0 else math.inf
        if best is None or share > best[0]:
            best = (share, resource)
    return None if best is None else best[1]


def _choice(
    demand: Demand, cycle: _Cycle, states: Sequence[ClusterState], placed: ClusterState | None
) -> ClusterState:
    """The best-fit cluster among `states` if the gang fits each of them (see `_best_fit`).

    `placed` is the one among them where the gang is placed already (its free room shows
    the placement); for the others, the room left is what would be left after it.
    """
    resource = cycle.scarcest(demand, states)
    best: tuple[int, str] | None = None
    chosen = states[0]
    for state in states:
        if resource is None:
            left = 0
        else:
            left = state.free_of(resource)
            if state is not placed:
                left -= demand.totals.get(resource, 0)
        if best is None or (left, state.name) < best:
            best, chosen = (left, state.name), state
    return chosen


def _certain(
    demand: Demand, cycle: _Cycle, chosen: ClusterState, others: Sequence[ClusterState]
) -> bool:
    """Whether `chosen` (the gang placed there) is the best fit whichever of `others` fit.

    It was the best fit assuming all of them do; every subset of them is checked.
    """
    if len(others) > _MAX_SUBSETS_OF:
        return False
    return all(
        _choice(demand, cycle, [chosen, *subset], chosen) is chosen
        for subset in [[], *_subsets(others)]
    )


def _best_fit(
    demand: Demand, cycle: _Cycle, usable: Sequence[ClusterSnapshot]
) -> tuple[ClusterSnapshot, PlaceResult] | list[tuple[str, str]]:
    """Place the workload in the best cluster that fits, or say why none does.

    Best fit: among the clusters where the whole gang fits, the one left with the least
    free of the workload's scarcest resource (the requested resource the workload takes the
    largest share of, over the clusters where it fits), absolute milli-units, after
    placement; ties by cluster name. Packing the tightest cluster keeps larger holes
    elsewhere for larger workloads, and the same inputs always give the same choice.

    The room left after placement is known from the aggregate alone, so the clusters are
    tried best first and the first that fits is taken whenever the choice could not have
    been different (see `_certain`); only otherwise is the gang placed in every cluster
    where it may fit and the placements not chosen undone. Reasons are templates naming no
    pod (see `reason_for`).
    """
    reasons: dict[str, str] = {}
    candidates: list[ClusterState] = []
    by_name: dict[str, ClusterSnapshot] = {}
    holds = cycle.held
    states = cycle.states
    for cluster in usable:
        name = cluster.name
        if not cluster.reachable:
            reasons[name] = "unreachable"
            continue
        held = holds.get(name)
        if held is not None:
            reasons[name] = held
            continue
        state = states.get(name)
        if state is None:
            state = cycle.state(cluster)
        refused = state.refusal(demand)
        if refused is not None:
            reasons[name] = refused
        else:
            candidates.append(state)
            by_name[name] = cluster
    while candidates:
        if len(candidates) == 1:
            guess = candidates[0]
            settled = True
        else:
            settled, resource = cycle.settled(demand, candidates)
            if settled:
                # The scarcest resource is this one wherever it fits: the best fit is the
                # cluster left with the least of it, known before placing anything.
                need = 0 if resource is None else demand.totals[resource]
                guess = min(
                    candidates,
                    key=lambda s: (0 if resource is None else s.free_of(resource) - need, s.name),
                )
            else:
                guess = _choice(demand, cycle, candidates, None)
        outcome = guess.place(demand, checked=True)
        if isinstance(outcome, str):
            reasons[guess.name] = outcome
            candidates.remove(guess)
            continue
        others = [s for s in candidates if s is not guess]
        if settled or _certain(demand, cycle, guess, others):
            return by_name[guess.name], outcome
        fitting = [(guess, outcome)]
        for state in others:
            tried = state.place(demand)
            if isinstance(tried, str):
                reasons[state.name] = tried
            else:
                fitting.append((state, tried))
        # Placed everywhere: each one's room left is its free room now (taking the gang's
        # totals off all of them alike, as `_choice` does, keeps the order).
        chosen = _choice(demand, cycle, [s for s, _ in fitting], None)
        chosen_result = outcome
        for state, result in fitting:
            if state is chosen:
                chosen_result = result
            else:
                result.undo()
        return by_name[chosen.name], chosen_result
    return [(cluster.name, reasons[cluster.name]) for cluster in usable]


def _still_refused(
    demand: Demand, cycle: _Cycle, usable: Sequence[ClusterSnapshot], reasons: list[tuple[str, str]]
) -> bool:
    """Whether `_best_fit` would answer `reasons` again (it refused the gang everywhere).

    An admission or a hold changes one cluster: the others give the same reasons, and the
    one that changed often does too (a gang that found no room per node finds none after
    another placement either; those answers carry no free amounts). Every cluster is asked
    only what `_best_fit` would ask first, and the answer must be the very same reason.
    With preemption, a verdict is only kept when the policy would be asked nothing
    (`_policy_settled`): that depends on holds and on the policy's earlier answers, which
    admissions do not change.
    """
    holds = cycle.held
    states = cycle.states
    for cluster, (_, why) in zip(usable, reasons, strict=True):
        if not cluster.reachable:
            continue
        held = holds.get(cluster.name)
        if held is not None:
            if held != why:
                return False
            continue
        state = states.get(cluster.name)
        if state is None or state.refusal(demand) != why:
            return False
    return True


def _preempt(
    workload: Workload,
    demand: Demand,
    cycle: _Cycle,
    usable: Sequence[ClusterSnapshot],
    policy: PreemptionPolicy,
) -> Preempt | None:
    """Ask the policy in every usable cluster; take the fewest victims, then cluster name."""
    best: Preempt | None = None
    for cluster in usable:
        if not cluster.reachable or cluster.name in cycle.held:
            continue
        # Within a cycle room only shrinks, and a lower priority has fewer candidates: a
        # gang of the same shape that could not preempt here will not do better.
        failed_at = cycle.no_victims.get((cluster.name, demand.key))
        if failed_at is not None and workload.priority <= failed_at:
            continue
        victims = policy.choose_victims(workload, cycle.with_admitted(cluster))
        if not victims:  # None: cannot make room; (): fits there by the policy's own check
            if victims is None:
                cycle.no_victims[(cluster.name, demand.key)] = workload.priority
            continue
        if best is None or len(victims) < len(best.victims):
            best = Preempt(key=workload.key, cluster=cluster.name, victims=victims)
            if len(victims) == 1:
                # No later cluster can name fewer, and a tie goes to the earlier name: the
                # answer stands, and each search the policy would make costs milliseconds.
                break
    return best


def _policy_settled(
    workload: Workload, demand: Demand, cycle: _Cycle, usable: Sequence[ClusterSnapshot]
) -> bool:
    """Whether `_preempt` would ask the policy nothing for this workload now."""
    for cluster in usable:
        if not cluster.reachable or cluster.name in cycle.held:
            continue
        failed_at = cycle.no_victims.get((cluster.name, demand.key))
        if failed_at is None or workload.priority > failed_at:
            return False
    return True


def _all_numbers(values: Sequence[float]) -> bool:
    """No NaN among `values` (a NaN is unequal to itself, so distinct from every other
    value, yet it leaves the sorted order to the input order)."""
    total = sum(values)
    return total == total


def schedule(
    pending: Sequence[Workload],
    clusters: Sequence[ClusterSnapshot],
    *,
    mode: QueueMode,
    now: float,
    starvation_after: float,
    preemption: PreemptionPolicy | None,
) -> CycleResult:
    """Decide, for every pending workload, admit (where) or wait (why); maybe preempt.

    Each cluster gets one `ClusterState` for the whole cycle, so a workload sees the room
    the workloads before it took. Rules kept:

    - StrictFIFO: the first workload that does not fit blocks every later one. A workload
      that could not fit any allowed cluster even if it were empty does not block (waiting
      cannot help it; the controller reports it as larger than the cluster).
    - BestEffortFIFO: later workloads may pass one that does not fit, except that a workload
      queued longer than `starvation_after` seconds holds every cluster it could fit when
      empty: nothing after it is admitted there this cycle, so the room it waits for is not
      taken again and again by smaller ones. (Admitting a later workload only when the
      starving one would still fit afterwards comes to the same: it does not fit there now,
      and room only shrinks within a cycle.) One that could not fit even an empty cluster
      holds nothing.
    - Preemption: a workload that fits nowhere asks `preemption` for victims; the cluster
      where it preempts is held for it for the rest of the cycle (its victims' room is its
      claim), and at most one preemption happens per cluster per cycle.
    """
    # 1. Order the queue: priority, then age, then key (`queue_order_key`; three stable
    # sorts on one attribute each give that order at less than half the cost).
    # The sort by key only orders workloads created at the same instant: skipped when there
    # are none (comparing strings costs more than hashing the floats once).
    ordered = list(pending)
    created = list(map(attrgetter("created_at"), ordered))
    if len(set(created)) != len(created) or not _all_numbers(created):
        ordered.sort(key=attrgetter("key"))
    ordered.sort(key=attrgetter("created_at"))
    ordered.sort(key=attrgetter("priority"), reverse=True)

    # 2. Snapshot: one mutable simulation per cluster, built on first use.
    cycle = _Cycle(clusters, now)
    admits: list[Admit] = []
    waits: list[Wait] = []
    preemptions: list[Preempt] = []
    head_key: str | None = None
    blocked_message: str | None = None
    strict = mode is QueueMode.STRICT_FIFO
    verdicts = cycle.verdicts
    demands = cycle.demands
    every, every_name = cycle.clusters, cycle.names
    # Reasons that name a pod, cut where they name it (see `token_parts`).
    renderings: dict[str, tuple[int, list[str]]] = {}

    # 3. Fit, or preempt, each workload in order.
    for workload in ordered:
        if blocked_message is not None:
            waits.append(Wait(workload.key, blocked_message))
            continue
        pod_sets = workload.pod_sets
        shape = pod_sets[0].shape if len(pod_sets) == 1 else shape_of(pod_sets)
        demand = demands.get(shape)
        if demand is None:
            demand = demands[shape] = Demand(pod_sets, shape)
        placement = workload.placement
        if placement.clusters is None and not placement.match_labels:
            usable, names = every, every_name
        else:
            usable, names = cycle.usable(placement)
        # A workload of a shape that found no room since the last admission or hold gets
        # the same answer (and the policy, asked already, would find no victims either);
        # after one, so does a workload every cluster refuses for the same reasons again.
        memo = (demand, names) if preemption is None else (demand, names, workload.priority)
        known = verdicts.get(memo)
        chosen: Preempt | None = None
        if known is not None and (
            known[0] == cycle.version or _still_refused(demand, cycle, usable, known[2])
        ):
            template = known[1]
            if known[0] != cycle.version:
                verdicts[memo] = (cycle.version, template, known[2])
        else:
            outcome = _best_fit(demand, cycle, usable)
            if isinstance(outcome, tuple):
                cluster, result = outcome
                admits.append(Admit(workload.key, cluster.name, result.assignments))
                cycle.admitted.setdefault(cluster.name, []).append(workload)
                cycle.version += 1
                continue
            template = cycle.wait_message(outcome)
            if preemption is not None:
                chosen = _preempt(workload, demand, cycle, usable, preemption)
            if chosen is None and (
                preemption is None or _policy_settled(workload, demand, cycle, usable)
            ):
                verdicts[memo] = (cycle.version, template, outcome)

        # 4. It fits nowhere: say why, maybe preempt, and hold what it is owed.
        if head_key is None:
            head_key = workload.key
        parts = renderings.get(template)
        if parts is None:
            parts = renderings[template] = token_parts(template) or (-2, [])
        index = parts[0]
        if index == -1:
            message = template
        elif index >= 0:
            pod_set = workload.pod_sets[index]
            message = (pod_set.name or f"pod set {index}").join(parts[1])
        else:
            message = reason_for(template, workload.pod_sets)
        if chosen is not None:
            preemptions.append(chosen)
            cycle.hold(chosen.cluster, f"held for {workload.key}, which is preempting")
            where = "" if cycle.single else f" in {chosen.cluster}"
            message += f"; preempting {', '.join(chosen.victims)}{where}"
        waits.append(Wait(workload.key, message))
        if strict:
            if any(cycle.could_ever_fit(demand, c) for c in usable):
                blocked_message = f"waiting behind {workload.key} (head of line)"
        elif now - workload.queued_since > starvation_after:
            for cluster in usable:
                if cluster.name not in cycle.held and cycle.could_ever_fit(demand, cluster):
                    cycle.hold(
                        cluster.name,
                        f"held for {workload.key}, queued longer than {starvation_after:g}s"
                        " (starvation guard)",
                    )

    # 5. Hand the decisions to the shell.
    return CycleResult(
        admits=tuple(admits),
        waits=tuple(waits),
        preemptions=tuple(preemptions),
        head_key=head_key,
    )
