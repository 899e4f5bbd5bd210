"""The peer benchmark's figures, from what a run recorded. Pure: no I/O, no clock reads.

Where it sits: benchmarks.peer_watch records (admission times, pod states, the API server's
audit events); this module turns those records into figures - percentiles, rates, overcommits,
partially placed gangs, requests by verb - and the ratios of this dispatcher against each peer
over the pairs of a run. benchmarks.peer_bench writes them out.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

Obj = dict[str, Any]


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (q in [0, 1]) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max, rounded to the millisecond."""
    return {
        "p50": round(percentile(values, 0.5), 3),
        "p99": round(percentile(values, 0.99), 3),
        "max": round(max(values), 3),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """min / median / max of the values (one per pair)."""
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


# -- pods: overcommits and partially placed gangs --------------------------------------------


class PodState(Enum):
    """Where one pod stands, as seen from the API server."""

    PENDING = "pending"  # not bound yet, and the scheduler has not said it cannot be
    UNSCHEDULABLE = "unschedulable"  # PodScheduled False, reason Unschedulable
    PLACED = "placed"  # bound to a node or Running
    DONE = "done"  # Succeeded or Failed
    GONE = "gone"  # deleted, or being deleted


@dataclass(frozen=True)
class PodSample:
    """A pod's state changed at `at` (seconds, one clock for the whole run)."""

    at: float
    pod: str
    gang: str
    state: PodState


def pod_state(pod: Mapping[str, Any]) -> PodState:
    """The state of a pod object (as the API server returns it)."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return PodState.GONE
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        return PodState.DONE
    if phase == "Running" or (pod.get("spec") or {}).get("nodeName"):
        return PodState.PLACED
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return PodState.UNSCHEDULABLE
    return PodState.PENDING


GANG_LABELS = ("ray.io/cluster", "batch.kubernetes.io/job-name", "job-name")
"""The label naming a pod's gang: its RayCluster, else its Job."""


def gang_of(pod: Mapping[str, Any]) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    for key in GANG_LABELS:
        if key in labels:
            return str(labels[key])
    return str((pod.get("metadata") or {}).get("name", ""))


def overcommitted_pods(samples: Iterable[PodSample]) -> set[str]:
    """Pods ever seen Unschedulable: admitted work the nodes had no room for."""
    return {s.pod for s in samples if s.state is PodState.UNSCHEDULABLE}


def partial_gangs(samples: Iterable[PodSample]) -> set[str]:
    """Gangs seen at some moment with a pod placed while a sibling was Unschedulable (replayed
    in time order; a pod that is gone no longer counts)."""
    states: dict[str, dict[str, PodState]] = {}
    partial: set[str] = set()
    for sample in sorted(samples, key=lambda s: s.at):
        gang = states.setdefault(sample.gang, {})
        if sample.state is PodState.GONE:
            gang.pop(sample.pod, None)
        else:
            gang[sample.pod] = sample.state
        present = set(gang.values())
        if PodState.PLACED in present and PodState.UNSCHEDULABLE in present:
            partial.add(sample.gang)
    return partial


def fully_placed_at(samples: Iterable[PodSample], sizes: Mapping[str, int]) -> dict[str, float]:
    """When each gang of `sizes` first had all its pods placed at once."""
    placed: dict[str, set[str]] = {}
    first: dict[str, float] = {}
    for sample in sorted(samples, key=lambda s: s.at):
        pods = placed.setdefault(sample.gang, set())
        if sample.state is PodState.PLACED:
            pods.add(sample.pod)
        else:
            pods.discard(sample.pod)
        size = sizes.get(sample.gang)
        if size and sample.gang not in first and len(pods) >= size:
            first[sample.gang] = sample.at
    return first


def gone_at(samples: Iterable[PodSample], gangs: Iterable[str]) -> dict[str, float]:
    """When the last pod of each of `gangs` went (those with a pod left are left out)."""
    last: dict[str, float] = {}
    present: dict[str, set[str]] = {}
    for sample in sorted(samples, key=lambda s: s.at):
        pods = present.setdefault(sample.gang, set())
        if sample.state is PodState.GONE:
            pods.discard(sample.pod)
            last[sample.gang] = sample.at
        else:
            pods.add(sample.pod)
    return {g: last[g] for g in gangs if g in last and not present.get(g)}


def waits_after(freed: Iterable[float], admitted: Iterable[float]) -> list[float]:
    """For each moment room was freed, how long until the next admission (none after it: left
    out) - the time a controller leaves freed room unused while work waits."""
    admissions = sorted(admitted)
    waits = []
    for moment in sorted(freed):
        later = [a for a in admissions if a >= moment]
        if later:
            waits.append(later[0] - moment)
    return waits


# -- API requests, from the audit log --------------------------------------------------------


def audit_time(stamp: str) -> float:
    """An audit event's RFC 3339 timestamp as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def counted(event: Mapping[str, Any]) -> bool:
    """One audit event per request: a watch when its response starts, anything else when it
    completes (a watch still open at the end has no ResponseComplete)."""
    stage = event.get("stage")
    if event.get("verb") == "watch":
        return stage == "ResponseStarted"
    return stage == "ResponseComplete"


@dataclass(frozen=True)
class Requests:
    """A user's API requests in a window: by verb, and by verb and resource."""

    by_verb: dict[str, int]
    by_resource: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_verb.values())


def requests_of(
    events: Iterable[Mapping[str, Any]], *, user: str, since: float, until: float
) -> Requests:
    """Count `user`'s requests received in [since, until] (epoch seconds)."""
    verbs: Counter[str] = Counter()
    resources: Counter[str] = Counter()
    for event in events:
        if (event.get("user") or {}).get("username") != user or not counted(event):
            continue
        stamp = event.get("requestReceivedTimestamp")
        if not stamp or not since <= audit_time(stamp) <= until:
            continue
        verb = str(event.get("verb"))
        ref = event.get("objectRef") or {}
        resource = ref.get("resource") or "(non-resource)"
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        verbs[verb] += 1
        resources[f"{verb} {resource}"] += 1
    return Requests(dict(sorted(verbs.items())), dict(sorted(resources.items())))


def per_workload(counts: Mapping[str, int], workloads: int) -> dict[str, float]:
    return {k: round(v / workloads, 3) for k, v in counts.items()} if workloads else {}


PER_WORKLOAD = (
    "controller_cpu_seconds_per_workload",
    "apiserver_cpu_seconds_per_workload",
    "requests_per_workload",
)
PER_WORKLOAD_TABLES = ("requests_per_workload_by_verb", "requests_per_workload_by_resource")
COSTS_OVER_ADMITTED = "admitted"


def over_admitted(run: Obj) -> Obj:
    """`run` with its per-workload costs over the workloads it admitted. Results written
    before costs were counted so (no `costs_per`) divided them over every workload given,
    which flatters a run cut at its cap: its CPU went on the few it admitted."""
    given, admitted = run.get("count"), run.get("admitted")
    if run.get("costs_per") == COSTS_OVER_ADMITTED or not given or admitted is None:
        return run
    scale = given / max(1, admitted)
    fixed = {**run, "costs_per": COSTS_OVER_ADMITTED}
    for key in PER_WORKLOAD:
        if fixed.get(key) is not None:
            fixed[key] = round(fixed[key] * scale, 4)
    for key in PER_WORKLOAD_TABLES:
        if isinstance(fixed.get(key), dict):
            fixed[key] = {k: round(v * scale, 3) for k, v in fixed[key].items()}
    return fixed


# -- runs and ratios -------------------------------------------------------------------------


def admission_figures(
    names: Sequence[str],
    created: Mapping[str, float],
    admitted: Mapping[str, float],
    started: float,
    cap: float,
) -> Obj:
    """How fast the workloads `names` were admitted: created and admitted are epoch seconds by
    name, `started` is when the clock of the run started (the controller's start for a backlog,
    the first create otherwise), `cap` how long the run could last."""
    done = [n for n in names if n in admitted]
    last = max((admitted[n] for n in done), default=started)
    everyone = len(done) == len(names)
    seconds = last - started
    figures: Obj = {
        "count": len(names),
        "admitted": len(done),
        "all_admitted": everyone,
        "seconds_to_all_admitted": round(seconds, 3) if everyone else None,
        # Over the time it took when all made it, else over the whole capped run.
        "admitted_per_second": round(len(done) / (seconds if everyone and seconds > 0 else cap), 3),
    }
    from_create = [admitted[n] - created[n] for n in done if n in created]
    if from_create:
        figures["create_to_admitted_seconds"] = quantiles(from_create)
    return figures


HIGHER = "higher"
LOWER = "lower"

HEADLINES: dict[str, str] = {
    "admitted_per_second": HIGHER,
    "completed_per_second": HIGHER,
    "create_to_admitted_p50": LOWER,
    "create_to_admitted_p99": LOWER,
    "seconds_to_done": LOWER,
    "high_priority_seconds_to_running": LOWER,
    "controller_cpu_seconds_per_workload": LOWER,
}
"""The figures compared as ratios, and which way is better."""


def headline(run: Mapping[str, Any]) -> dict[str, float]:
    """The figures of one run that ratios are taken of (missing ones are left out)."""
    values: dict[str, float] = {}
    for key in ("admitted_per_second", "completed_per_second", "seconds_to_done"):
        if run.get(key) is not None:
            values[key] = float(run[key])
    latency = run.get("create_to_admitted_seconds")
    if latency:
        values["create_to_admitted_p50"] = float(latency["p50"])
        values["create_to_admitted_p99"] = float(latency["p99"])
    high = run.get("high_priority") or {}
    if high.get("seconds_to_running") is not None:
        values["high_priority_seconds_to_running"] = float(high["seconds_to_running"])
    if run.get("controller_cpu_seconds_per_workload") is not None:
        values["controller_cpu_seconds_per_workload"] = float(
            run["controller_cpu_seconds_per_workload"]
        )
    return values


def ratio(ours: float, peer: float, better: str) -> float | None:
    """Above 1 when ours is ahead: ours/peer for a rate, peer/ours for a time or a cost."""
    numerator, denominator = (ours, peer) if better == HIGHER else (peer, ours)
    if denominator <= 0:
        return None
    return numerator / denominator


def compare(runs: Mapping[str, Sequence[Mapping[str, Any]]], ours: str = "ours") -> Obj:
    """Per peer and headline figure: the ratio in each pair (pair i of ours against pair i of
    the peer) and their min/median/max. A pair where either run failed or lacks the figure
    gives no ratio; a peer capped before it finished gives a ratio that is a lower bound
    (`capped_pairs` says how many)."""
    result: Obj = {}
    for peer, peer_runs in runs.items():
        if peer == ours:
            continue
        figures: Obj = {}
        for key, better in HEADLINES.items():
            values = []
            capped = 0
            for mine, theirs in zip(runs.get(ours, []), peer_runs, strict=False):
                a, b = headline(mine).get(key), headline(theirs).get(key)
                if a is None or b is None:
                    continue
                value = ratio(a, b, better)
                if value is not None:
                    values.append(value)
                    capped += bool(theirs.get("capped"))
            if values:
                figures[key] = {
                    **spread(values),
                    "pairs": [round(v, 3) for v in values],
                    "capped_pairs": capped,
                }
        result[peer] = figures
    return result


def medians(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The median of each headline figure over one system's runs of one scenario."""
    collected: dict[str, list[float]] = {}
    for run in runs:
        for key, value in headline(run).items():
            collected.setdefault(key, []).append(value)
    return {k: round(statistics.median(v), 4) for k, v in collected.items()}


def split_capacity(total: int, per_node: int) -> list[int]:
    """`total` units over as few nodes of at most `per_node` as hold them, as even as can be."""
    nodes = max(1, -(-total // per_node))
    base, extra = divmod(total, nodes)
    return [base + (1 if i < extra else 0) for i in range(nodes)]
