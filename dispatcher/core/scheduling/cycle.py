"""One scheduling cycle: pending workloads + cluster snapshots -> decisions. Pure, no I/O.

`schedule` is a function of its arguments only. It decides; the controller carries the
decisions out (creates the objects of each `Admit`, evicts the victims of each `Preempt`,
writes each `Wait` message to the AppWrapper's status) and runs the next cycle on fresh
snapshots. Every pending workload gets exactly one `Admit` or one `Wait`; a `Preempt`
comes in addition to the `Wait` of the workload that asked for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dispatcher.core.model import ClusterSnapshot, Placement, QueueMode, Reservation, Workload
from dispatcher.core.scheduling.placement import ClusterState, Gang, Placed, Refusal
from dispatcher.core.scheduling.preemption import PreemptionPolicy

__all__ = ["Admit", "CycleResult", "Preempt", "Wait", "queue_order_key", "schedule"]


@dataclass(frozen=True, slots=True)
class Admit:
    """Dispatch workload `key` to `cluster`."""

    key: str
    cluster: str


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


Reasons = list[tuple[str, Refusal]]  # (cluster name, why it does not fit there)


class _Cycle:
    """What one `schedule` call carries from one workload to the next."""

    def __init__(self, clusters: Sequence[ClusterSnapshot], now: float) -> None:
        self.clusters = sorted(clusters, key=lambda c: c.name)
        self.now = now
        self.states: dict[str, ClusterState] = {}  # built on first use
        self.gangs: dict[tuple[str, ...], Gang] = {}
        self.usable_for: dict[Placement, list[ClusterSnapshot]] = {}
        self.ever: dict[tuple[str, tuple[str, ...]], bool] = {}
        self.empty: dict[str, ClusterState] = {}
        # Clusters later workloads may not use this cycle, and why (a preemptor's claim,
        # a starving head's reservation).
        self.held: dict[str, str] = {}
        self.admitted: dict[str, list[Workload]] = {}
        # (cluster, gang shape) -> the highest priority for which the policy found no
        # victims: room only shrinks within a cycle, and a lower priority has fewer
        # candidates, so asking again could not do better.
        self.no_victims: dict[tuple[str, tuple[str, ...]], int] = {}
        # Equal messages share one string: thousands of waits often say the same.
        self.messages: dict[str, str] = {}

    def state(self, cluster: ClusterSnapshot) -> ClusterState:
        state = self.states.get(cluster.name)
        if state is None:
            state = self.states[cluster.name] = ClusterState(cluster)
        return state

    def gang(self, workload: Workload) -> Gang:
        shape = tuple(p.shape for p in workload.pod_sets)
        gang = self.gangs.get(shape)
        if gang is None:
            gang = self.gangs[shape] = Gang.of(workload.pod_sets)
        return gang

    def usable(self, placement: Placement) -> list[ClusterSnapshot]:
        clusters = self.usable_for.get(placement)
        if clusters is None:
            clusters = self.usable_for[placement] = [
                c for c in self.clusters if placement.allows(c)
            ]
        return clusters

    def could_ever_fit(self, gang: Gang, cluster: ClusterSnapshot) -> bool:
        """Whether it fits the cluster emptied; an unreachable cluster may (we cannot tell)."""
        if not cluster.reachable:
            return True
        key = (cluster.name, gang.shape)
        if key not in self.ever:
            empty = self.empty.get(cluster.name)
            if empty is None:
                empty = self.empty[cluster.name] = ClusterState(cluster, empty=True)
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

    def message(self, workload: Workload, reasons: Reasons) -> str:
        if not reasons:
            text = "no member cluster matches the placement (clusterScheduling)"
        elif len(self.clusters) == 1:
            text = reasons[0][1].message(workload.pod_sets)
        else:
            text = "no cluster fits: " + "; ".join(
                f"{name}: {why.message(workload.pod_sets)}" for name, why in reasons
            )
        return self.messages.setdefault(text, text)


def _best_fit(
    cycle: _Cycle, gang: Gang, usable: Sequence[ClusterSnapshot]
) -> tuple[ClusterState, Placed] | Reasons:
    """Place the gang in the best cluster that fits, or say why none does.

    Best fit: among the clusters where the whole gang fits, the one left with the least
    free of the gang's scarcest resource (the requested resource it takes the largest share
    of, over the clusters where it fits) after placement; ties by cluster name. Packing
    the tightest cluster keeps larger holes elsewhere for larger workloads.
    """
    reasons: Reasons = []
    fitting: list[tuple[ClusterState, Placed]] = []
    for cluster in usable:
        if not cluster.reachable:
            reasons.append((cluster.name, Refusal("unreachable")))
        elif cluster.name in cycle.held:
            reasons.append((cluster.name, Refusal(cycle.held[cluster.name])))
        else:
            state = cycle.state(cluster)
            placed = state.place(gang)
            if isinstance(placed, Refusal):
                reasons.append((cluster.name, placed))
            else:
                fitting.append((state, placed))
    if not fitting:
        return reasons
    scarcest = _scarcest(gang, [state for state, _ in fitting])
    chosen = min(
        fitting, key=lambda f: (0 if scarcest is None else f[0].free_of(scarcest), f[0].name)
    )
    for state, placed in fitting:
        if state is not chosen[0]:
            placed.undo()
    return chosen


def _scarcest(gang: Gang, states: Sequence[ClusterState]) -> str | None:
    """The requested resource the gang takes the largest share of, over `states`."""
    best: tuple[float, str] | None = None
    for resource, value in gang.totals:
        capacity = sum(s.capacity_of(resource) for s in states)
        share = value / capacity if capacity > 0 else math.inf
        if best is None or share > best[0]:
            best = (share, resource)
    return None if best is None else best[1]


def _preempt(
    workload: Workload,
    gang: Gang,
    cycle: _Cycle,
    usable: Sequence[ClusterSnapshot],
    policy: PreemptionPolicy,
) -> Preempt | None:
    """Ask the policy in every usable cluster; take the fewest victims, then cluster name."""
    best: Preempt | None = None
    for cluster in usable:
        if not cluster.reachable or cluster.name in cycle.held:
            continue
        failed_at = cycle.no_victims.get((cluster.name, gang.shape))
        if failed_at is not None and workload.priority <= failed_at:
            continue
        victims = policy.choose_victims(workload, cycle.with_admitted(cluster))
        if victims is None:  # cannot make room there
            cycle.no_victims[(cluster.name, gang.shape)] = workload.priority
        elif victims and (best is None or len(victims) < len(best.victims)):
            best = Preempt(key=workload.key, cluster=cluster.name, victims=victims)
    return best


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
      taken again and again by smaller ones. One that could not fit even an empty cluster
      holds nothing.
    - Preemption: a workload that fits nowhere asks `preemption` for victims; the cluster
      where it preempts is held for it for the rest of the cycle (its victims' room is its
      claim), and at most one preemption happens per cluster per cycle.
    """
    # 1. Order the queue: priority, then age, then key.
    ordered = sorted(pending, key=queue_order_key)

    # 2. Snapshot: one mutable simulation per cluster, built on first use.
    cycle = _Cycle(clusters, now)
    admits: list[Admit] = []
    waits: list[Wait] = []
    preemptions: list[Preempt] = []
    head_key: str | None = None
    blocked: str | None = None  # StrictFIFO: the message of every workload after the head

    # 3. Fit, or preempt, each workload in order.
    for workload in ordered:
        if blocked is not None:
            waits.append(Wait(workload.key, blocked))
            continue
        gang = cycle.gang(workload)
        usable = cycle.usable(workload.placement)
        outcome = _best_fit(cycle, gang, usable)
        if isinstance(outcome, tuple):
            admits.append(Admit(workload.key, outcome[0].name))
            cycle.admitted.setdefault(outcome[0].name, []).append(workload)
            continue
        chosen = None
        if preemption is not None:
            chosen = _preempt(workload, gang, cycle, usable, preemption)

        # 4. It fits nowhere: say why, maybe preempt, and hold what it is owed.
        head_key = head_key or workload.key
        message = cycle.message(workload, outcome)
        if chosen is not None:
            preemptions.append(chosen)
            cycle.held[chosen.cluster] = f"held for {workload.key}, which is preempting"
            where = "" if len(cycle.clusters) == 1 else f" in {chosen.cluster}"
            message += f"; preempting {', '.join(chosen.victims)}{where}"
        waits.append(Wait(workload.key, message))
        if mode is QueueMode.STRICT_FIFO:
            if any(cycle.could_ever_fit(gang, c) for c in usable):
                blocked = f"waiting behind {workload.key} (head of line)"
        elif now - workload.queued_since > starvation_after:
            for cluster in usable:
                if cluster.name not in cycle.held and cycle.could_ever_fit(gang, cluster):
                    cycle.held[cluster.name] = (
                        f"held for {workload.key}, queued longer than {starvation_after:g}s"
                        " (starvation guard)"
                    )

    # 5. Hand the decisions back to the controller.
    return CycleResult(
        admits=tuple(admits), waits=tuple(waits), preemptions=tuple(preemptions), head_key=head_key
    )
