"""One scheduling cycle: pending workloads + cluster snapshots -> decisions. Pure, no I/O.

`schedule` is a function of its arguments only. It decides; the controller carries the
decisions out (creates the objects of each `Admit`, evicts the victims of each `Preempt`,
writes each `Wait` message to the AppWrapper's status) and runs the next cycle on fresh
snapshots. Every pending workload gets exactly one `Admit` or one `Wait`; a `Preempt`
comes in addition to the `Wait` of the workload that asked for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dispatcher.core.model import ClusterSnapshot, QueueMode, Workload
from dispatcher.core.scheduling.clusters import CycleState, best_fit
from dispatcher.core.scheduling.placement import Gang
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


def _preempt(
    workload: Workload,
    gang: Gang,
    cycle: CycleState,
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
            if len(victims) == 1:
                break  # no later cluster can name fewer, and a tie goes to the earlier one
    return best


def _policy_done(
    workload: Workload, gang: Gang, cycle: CycleState, usable: Sequence[ClusterSnapshot]
) -> bool:
    """Whether `_preempt` would ask the policy nothing for this workload now."""
    for cluster in usable:
        if cluster.reachable and cluster.name not in cycle.held:
            failed_at = cycle.no_victims.get((cluster.name, gang.shape))
            if failed_at is None or workload.priority > failed_at:
                return False
    return True


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
    cycle = CycleState(clusters, now)
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
        # A gang of the same shape and placement refused since the last admission or hold
        # is refused again for the same reasons (the policy's answers also depend on the
        # priority; without a policy it plays no part).
        priority = None if preemption is None else workload.priority
        placement = workload.placement
        question = (gang.shape, None if placement.anywhere else placement, priority)
        known = cycle.known_refusal(question)
        chosen: Preempt | None = None
        if known is not None:
            reasons, why = known
        else:
            outcome = best_fit(cycle, gang, usable)
            if isinstance(outcome, tuple):
                admits.append(Admit(workload.key, outcome[0].name))
                cycle.admit(workload, outcome[0].name)
                continue
            reasons, why = outcome, cycle.combine(outcome)
            if preemption is not None:
                chosen = _preempt(workload, gang, cycle, usable, preemption)
            if chosen is None and (
                preemption is None or _policy_done(workload, gang, cycle, usable)
            ):
                cycle.refused[question] = (cycle.version, reasons, why)

        # 4. It fits nowhere: say why, maybe preempt, and hold what it is owed.
        head_key = head_key or workload.key
        message = cycle.message(workload, reasons, why)
        if chosen is not None:
            preemptions.append(chosen)
            cycle.hold(chosen.cluster, f"held for {workload.key}, which is preempting")
            where = "" if len(cycle.clusters) == 1 else f" in {chosen.cluster}"
            message += f"; preempting {', '.join(chosen.victims)}{where}"
        waits.append(Wait(workload.key, message))
        if mode is QueueMode.STRICT_FIFO:
            if any(cycle.could_ever_fit(gang, c) for c in usable):
                blocked = f"waiting behind {workload.key} (head of line)"
        elif now - workload.queued_since > starvation_after:
            for cluster in usable:
                if cluster.name not in cycle.held and cycle.could_ever_fit(gang, cluster):
                    cycle.hold(
                        cluster.name,
                        f"held for {workload.key}, queued longer than {starvation_after:g}s"
                        " (starvation guard)",
                    )

    # 5. Hand the decisions back to the controller.
    return CycleResult(
        admits=tuple(admits), waits=tuple(waits), preemptions=tuple(preemptions), head_key=head_key
    )
