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

from dispatcher.core.fit import ClusterState, Demand, NodeAssignment, PlaceResult
from dispatcher.core.model import ClusterSnapshot, QueueMode, Reservation, Workload
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

    def __init__(self, clusters: Sequence[ClusterSnapshot]) -> None:
        self.clusters = sorted(clusters, key=lambda c: c.name)
        self.single = len(self.clusters) == 1
        self._states: dict[str, ClusterState] = {}
        self._empty: dict[str, ClusterState] = {}
        self._ever: dict[tuple[str, tuple[object, ...]], bool] = {}
        # Clusters later workloads may not use this cycle, and why (a preemptor's claim, a
        # starving head's reservation).
        self.held: dict[str, str] = {}
        self.admitted: dict[str, list[Reservation]] = {}
        # (cluster, gang shape) -> highest priority for which the policy found no victims.
        self.no_victims: dict[tuple[str, tuple[object, ...]], int] = {}

    def state(self, cluster: ClusterSnapshot) -> ClusterState:
        state = self._states.get(cluster.name)
        if state is None:
            state = self._states[cluster.name] = ClusterState(cluster)
        return state

    def could_ever_fit(self, demand: Demand, cluster: ClusterSnapshot) -> bool:
        """Whether it fits the cluster emptied; an unreachable cluster may (we cannot tell)."""
        if not cluster.reachable:
            return True
        shape = (cluster.name, demand.shape)
        answer = self._ever.get(shape)
        if answer is None:
            empty = self._empty.get(cluster.name)
            if empty is None:
                empty = self._empty[cluster.name] = ClusterState(cluster, empty=True)
            answer = self._ever[shape] = empty.fits(demand) is None
        return answer

    def with_admitted(self, cluster: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot plus this cycle's admissions to it, as reservations."""
        extra = self.admitted.get(cluster.name)
        if not extra:
            return cluster
        return replace(cluster, reservations=cluster.reservations + tuple(extra))

    def wait_message(self, reasons: list[tuple[str, str]]) -> str:
        if not reasons:
            return "no member cluster matches the placement (clusterScheduling)"
        if self.single:
            return reasons[0][1]
        return "no cluster fits: " + "; ".join(f"{name}: {why}" for name, why in reasons)


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


def _best_fit(
    demand: Demand, cycle: _Cycle, usable: list[ClusterSnapshot]
) -> tuple[ClusterSnapshot, PlaceResult] | list[tuple[str, str]]:
    """Place the workload in the best cluster that fits, or say why none does.

    Best fit: among the clusters where the whole gang fits, the one left with the least
    free of the workload's scarcest resource (the requested resource the workload takes the
    largest share of, over the usable clusters), absolute milli-units, after placement;
    ties by cluster name. Packing the tightest cluster keeps larger holes elsewhere for
    larger workloads, and the same inputs always give the same choice.
    """
    reasons: list[tuple[str, str]] = []
    fitting: list[tuple[ClusterSnapshot, PlaceResult]] = []
    for cluster in usable:
        if not cluster.reachable:
            reasons.append((cluster.name, "unreachable"))
            continue
        held = cycle.held.get(cluster.name)
        if held is not None:
            reasons.append((cluster.name, held))
            continue
        result = cycle.state(cluster).try_place(demand)
        if result.ok:
            fitting.append((cluster, result))  # applied for now; undone unless chosen
        else:
            reasons.append((cluster.name, result.reason))
    if not fitting:
        return reasons
    chosen = fitting[0]
    if len(fitting) > 1:
        resource = _scarcest(demand, [cycle.state(c) for c, _ in fitting])
        best: tuple[int, str] | None = None
        for cluster, result in fitting:
            left = 0 if resource is None else cycle.state(cluster).free_of(resource)
            if best is None or (left, cluster.name) < best:
                best, chosen = (left, cluster.name), (cluster, result)
        for cluster, result in fitting:
            if cluster is not chosen[0]:
                result.undo()
    return chosen


def _preempt(
    workload: Workload,
    demand: Demand,
    cycle: _Cycle,
    usable: list[ClusterSnapshot],
    policy: PreemptionPolicy,
) -> Preempt | None:
    """Ask the policy in every usable cluster; take the fewest victims, then cluster name."""
    best: Preempt | None = None
    for cluster in usable:
        if not cluster.reachable or cluster.name in cycle.held:
            continue
        # Within a cycle room only shrinks, and a lower priority has fewer candidates: a
        # gang of the same shape that could not preempt here will not do better.
        failed_at = cycle.no_victims.get((cluster.name, demand.shape))
        if failed_at is not None and workload.priority <= failed_at:
            continue
        victims = policy.choose_victims(workload, cycle.with_admitted(cluster))
        if not victims:  # None: cannot make room; (): fits there by the policy's own check
            if victims is None:
                cycle.no_victims[(cluster.name, demand.shape)] = workload.priority
            continue
        if best is None or len(victims) < len(best.victims):
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
      taken again and again by smaller ones. (Admitting a later workload only when the
      starving one would still fit afterwards comes to the same: it does not fit there now,
      and room only shrinks within a cycle.) One that could not fit even an empty cluster
      holds nothing.
    - Preemption: a workload that fits nowhere asks `preemption` for victims; the cluster
      where it preempts is held for it for the rest of the cycle (its victims' room is its
      claim), and at most one preemption happens per cluster per cycle.
    """
    # 1. Order the queue: priority, then age, then key.
    ordered = sorted(pending, key=queue_order_key)

    # 2. Snapshot: one mutable simulation per cluster, built on first use.
    cycle = _Cycle(clusters)
    admits: list[Admit] = []
    waits: list[Wait] = []
    preemptions: list[Preempt] = []
    head_key: str | None = None
    blocked_behind: str | None = None

    # 3. Fit, or preempt, each workload in order.
    for workload in ordered:
        if blocked_behind is not None:
            waits.append(Wait(workload.key, f"waiting behind {blocked_behind} (head of line)"))
            continue
        usable = [c for c in cycle.clusters if workload.placement.allows(c)]
        demand = Demand(workload.pod_sets)
        outcome = _best_fit(demand, cycle, usable)
        if isinstance(outcome, tuple):
            cluster, result = outcome
            admits.append(Admit(workload.key, cluster.name, result.assignments))
            cycle.admitted.setdefault(cluster.name, []).append(
                Reservation(
                    key=workload.key,
                    pod_sets=workload.pod_sets,
                    priority=workload.priority,
                    dispatched_at=now,
                    preemptible=workload.preemptible,
                )
            )
            continue

        # 4. It fits nowhere: say why, maybe preempt, and hold what it is owed.
        if head_key is None:
            head_key = workload.key
        message = cycle.wait_message(outcome)
        chosen = (
            None if preemption is None else _preempt(workload, demand, cycle, usable, preemption)
        )
        if chosen is not None:
            preemptions.append(chosen)
            cycle.held[chosen.cluster] = f"held for {workload.key}, which is preempting"
            where = "" if cycle.single else f" in {chosen.cluster}"
            message += f"; preempting {', '.join(chosen.victims)}{where}"
        waits.append(Wait(workload.key, message))
        if mode is QueueMode.STRICT_FIFO:
            if any(cycle.could_ever_fit(demand, c) for c in usable):
                blocked_behind = workload.key
        elif now - workload.queued_since > starvation_after:
            for cluster in usable:
                if not cycle.could_ever_fit(demand, cluster):
                    continue
                cycle.held.setdefault(
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
