"""Choosing flavors for a workload in its queue, and what a flavor adds to its pods.
Pure, no I/O.

Per resource group the queue's flavors are tried in its order. In each, every requested
resource of the group is one of: fits within the nominal quota (FIT), fits by borrowing
from the cohort (BORROW), could fit if admitted work were preempted (PREEMPT), or can never
fit (NO_FIT); the flavor takes its worst. `candidates` returns the assignments to try, best
first, as the queue's fungibility settings rank them; the scheduling cycle tries each for
capacity in that order, so a flavor whose nodes are full gives way to the next.

A flavor applies to a pod set when the pod set requests a resource of the flavor's group:
its node labels join the pods' node selector and its tolerations their tolerations. The
same rule decides what the reconciler injects into the wrapped pod templates.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

from dispatcher.api.quantity import format_milli
from dispatcher.api.resources import Resources
from dispatcher.core.model import PODS, PodSet, Workload
from dispatcher.core.quota.model import (
    Charge,
    Flavor,
    FlavorResource,
    QueueSpec,
    WhenCanBorrow,
    WhenCanPreempt,
)
from dispatcher.core.quota.tree import QuotaLedger

__all__ = ["Assignment", "Mode", "QuotaRefusal", "applies", "candidates", "flavored"]

_MAX_COMBINATIONS = 16

_Option = tuple[int, int, str, tuple[str, ...], "Mode", str]
"""(rank, index in the group, flavor, the group's resources, mode, limiting figure)."""


class Mode(IntEnum):
    NO_FIT = 0
    PREEMPT = 1
    BORROW = 2
    FIT = 3


@dataclass(frozen=True, slots=True)
class Assignment:
    """A flavor for each resource group the workload uses, and what it charges."""

    flavors: tuple[tuple[str, tuple[str, ...]], ...]  # (flavor, the group's resources)
    amounts: Mapping[FlavorResource, int]
    mode: Mode
    borrows: bool
    limit: str = ""  # when not admissible: the figure that keeps it out

    @property
    def admissible(self) -> bool:
        return self.mode >= Mode.BORROW

    def describe(self) -> str:
        return ", ".join(flavor for flavor, _ in self.flavors)


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """No flavor can take the workload now; `message` has the limiting figure. `never`:
    it cannot fit the queue even with all the queue may ever have (waiting cannot help).
    `user`: its user's own limit keeps it out (it never blocks other users' work)."""

    message: str
    never: bool = False
    user: bool = False


def applies(resources: Iterable[str], requested: Iterable[str]) -> bool:
    """Whether a flavor of a group covering `resources` applies to pods requesting
    `requested` (`pods` alone never pulls a flavor in)."""
    covered = set(resources)
    return any(r in covered for r in requested if r != PODS)


def request_of(pod_sets: Sequence[PodSet]) -> Resources:
    total: dict[str, int] = {}
    for pod_set in pod_sets:
        for resource, value in pod_set.requests.items():
            total[resource] = total.get(resource, 0) + value * pod_set.count
    return Resources(total)


def _amount(resource: str, milli: int) -> str:
    return format_milli(milli, resource)


def _flavor_mode(
    queue: QueueSpec,
    flavor: str,
    needs: Mapping[str, int],
    ledger: QuotaLedger,
    name_flavor: bool,
) -> tuple[Mode, str]:
    """The flavor's worst mode over the group's requested resources, and (for a flavor
    that does not fit now) the figure that limits it."""
    worst, why = Mode.FIT, ""
    nominals = ledger.tree.nominal[ledger.tree.queue_nodes[queue.name]]
    for resource, need in needs.items():
        fr = (flavor, resource)
        nominal = nominals.get(fr, 0)
        used = ledger.used(queue.name, fr)
        available = ledger.available(queue.name, fr)
        if need <= available:
            mode = Mode.FIT if used + need <= nominal else Mode.BORROW
        elif need <= ledger.available(queue.name, fr, empty=True):
            mode = Mode.PREEMPT
        else:
            mode = Mode.NO_FIT
        if mode < worst:
            worst = mode
            if mode < Mode.BORROW:  # the figure that keeps it out, for the message
                own = max(0, nominal - used)
                lend = max(0, available - own)
                where = f" in flavor {flavor}" if name_flavor else ""
                why = (
                    f"queue {queue.name}: needs {resource} {_amount(resource, need)}{where}; "
                    f"nominal {_amount(resource, nominal)}, in use {_amount(resource, used)}, "
                    f"cohort can lend {_amount(resource, lend)}"
                )
                if available < own:  # part of its own unused quota is lent out now
                    why += f", {_amount(resource, own - max(available, 0))} of its own lent out"
    return worst, why


def _untolerated(flavor: Flavor, pod_sets: Sequence[PodSet], resources: Sequence[str]) -> str:
    for pod_set in pod_sets:
        if not applies(resources, pod_set.requests):
            continue
        given = (*pod_set.tolerations, *flavor.tolerations)
        for taint in flavor.node_taints:
            if taint.repels and not any(t.tolerates(taint) for t in given):
                who = pod_set.name or "pods"
                return f"{who} do not tolerate flavor {flavor.name}'s taint {taint.key}"
        own = dict(pod_set.node_selector)
        for key, value in flavor.node_labels:
            if key in own and own[key] != value:
                who = pod_set.name or "pods"
                return f"{who} select {key}={own[key]}; flavor {flavor.name} has {value}"
    return ""


def candidates(
    queue: QueueSpec,
    pod_sets: Sequence[PodSet],
    ledger: QuotaLedger,
    flavors: Mapping[str, Flavor],
    request: Resources | None = None,
) -> list[Assignment] | QuotaRefusal:
    """The assignments worth trying, best first (never empty), or why there is none
    (`request`: the pod sets' total, when the caller has it)."""
    if request is None:
        request = request_of(pod_sets)
    covered = {r for g in queue.groups for r in g.covered}
    missing = sorted(r for r, v in request.items() if v and r != PODS and r not in covered)
    if missing:
        return QuotaRefusal(
            f"queue {queue.name} does not cover {', '.join(missing)}"
            f" (it covers {', '.join(sorted(covered)) or 'nothing'})",
            never=True,
        )
    per_group: list[list[_Option]] = []
    first_why = ""
    never_why = ""
    for group in queue.groups:
        needs = {r: request[r] for r in group.covered if request[r]}
        if not needs:
            continue
        options: list[_Option] = []
        for index, fq in enumerate(group.flavors):
            flavor = flavors.get(fq.flavor)
            if flavor is None:
                continue
            why = _untolerated(flavor, pod_sets, group.covered)
            if why:
                first_why = first_why or why
                continue
            mode, limit = _flavor_mode(queue, fq.flavor, needs, ledger, len(group.flavors) > 1)
            if mode is Mode.NO_FIT:
                first_why = first_why or limit
                continue
            if mode is Mode.FIT:
                rank = 0
            elif mode is Mode.BORROW:
                rank = 0 if queue.when_can_borrow is WhenCanBorrow.BORROW else 1
            else:
                rank = 0 if queue.when_can_preempt is WhenCanPreempt.PREEMPT else 2
            options.append((rank, index, fq.flavor, group.covered, mode, limit))
        if not options:
            never_why = never_why or _never(queue, group.covered, needs, ledger)
            return QuotaRefusal(never_why or first_why, never=bool(never_why))
        options.sort(key=lambda o: (o[0], o[1]))
        per_group.append(options)
    found: list[tuple[tuple[int, ...], Assignment]] = []
    for combination in itertools.islice(itertools.product(*per_group), _MAX_COMBINATIONS):
        amounts = amounts_of(request, [(c[2], c[3]) for c in combination])
        mode = min((c[4] for c in combination), default=Mode.FIT)
        nominals = ledger.tree.nominal[ledger.tree.queue_nodes[queue.name]]
        borrows = any(
            ledger.used(queue.name, fr) + amount > nominals.get(fr, 0)
            for fr, amount in amounts.items()
        )
        assignment = Assignment(
            flavors=tuple((c[2], c[3]) for c in combination),
            amounts=amounts,
            mode=mode,
            borrows=borrows,
            limit=next((c[5] for c in combination if c[4] < Mode.BORROW), ""),
        )
        found.append((tuple(c[0] for c in combination), assignment))
    found.sort(key=lambda f: sum(f[0]))  # stable: equal ranks keep the queue's order
    return [a for _, a in found]


def _never(
    queue: QueueSpec, resources: Sequence[str], needs: Mapping[str, int], ledger: QuotaLedger
) -> str:
    """The message when no flavor of the group could take the request even with the
    whole tree empty ("" when some flavor could)."""
    for resource, need in needs.items():
        most = max(
            (
                ledger.available(queue.name, (f.flavor, resource), empty=True)
                for g in queue.groups
                if resource in g.covered
                for f in g.flavors
            ),
            default=0,
        )
        if need > most:
            return (
                f"queue {queue.name}: needs {resource} {_amount(resource, need)}, the most it"
                f" can ever have is {_amount(resource, max(most, 0))}"
            )
    return ""


Chosen = Sequence[tuple[str, Sequence[str]]]
"""(flavor, the resources of its group) for each resource group: an assignment's flavors,
or an admission's as recorded in the AppWrapper's status."""


def amounts_of(request: Mapping[str, int], chosen: Chosen) -> dict[FlavorResource, int]:
    """What a request charges, per (flavor, resource), under the chosen flavors."""
    return {(f, r): request[r] for f, resources in chosen for r in resources if request.get(r)}


def charge_of(
    key: str,
    queue: str,
    workload: Workload,
    chosen: Chosen,
    *,
    admitted_at: float,
    spec: QueueSpec | None = None,
) -> Charge:
    """What `workload` admitted through `queue` (`spec`, when it still exists) charges:
    the pods the queue charges (`QueueSpec.charged`; without the spec, at least the
    templates, the default)."""
    if spec is not None:
        pods = spec.charged(workload)
    else:
        pods = workload.charge_pod_sets or workload.pod_sets
    return Charge(
        key=key,
        queue=queue,
        amounts=amounts_of(request_of(pods), chosen),
        priority=workload.priority,
        admitted_at=admitted_at,
        preemptible=workload.preemptible,
        user=workload.user,
        groups=workload.groups,
        limit=workload.duration_limit,
    )


def with_flavors(workload: Workload, chosen: Chosen, flavors: Mapping[str, Flavor]) -> Workload:
    """The workload with its pods as they are made under the chosen flavors."""
    pod_sets = flavored(workload.pod_sets, chosen, flavors)
    return workload if pod_sets == workload.pod_sets else workload.with_pod_sets(pod_sets)


def flavored(
    pod_sets: tuple[PodSet, ...], chosen: Chosen, flavors: Mapping[str, Flavor]
) -> tuple[PodSet, ...]:
    """The pod sets as the pods will be made: each chosen flavor's node labels and
    tolerations added where the flavor applies (a flavor no longer defined adds nothing)."""
    result = []
    for pod_set in pod_sets:
        selector = dict(pod_set.node_selector)
        tolerations = list(pod_set.tolerations)
        for name, resources in chosen:
            flavor = flavors.get(name)
            if flavor is None or not applies(resources, pod_set.requests):
                continue
            selector.update(flavor.node_labels)
            tolerations += [t for t in flavor.tolerations if t not in tolerations]
        if selector == dict(pod_set.node_selector) and len(tolerations) == len(pod_set.tolerations):
            result.append(pod_set)
        else:
            result.append(
                replace(
                    pod_set,
                    node_selector=tuple(sorted(selector.items())),
                    tolerations=tuple(tolerations),
                )
            )
    if all(a is b for a, b in zip(result, pod_sets, strict=True)):
        return pod_sets  # the same object: callers tell "no change" by identity
    return tuple(result)
