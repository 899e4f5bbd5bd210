"""Kueue's own quota objects (`kueue.x-k8s.io` ResourceFlavor, ClusterQueue, LocalQueue,
Cohort, WorkloadPriorityClass) read as this dispatcher's quota specs. Pure, no I/O.

Our kinds were modelled on Kueue's, so most fields carry over by name; what differs is
said where it is read. Each Kueue field is one of three things (docs/quotas.md, "Kueue's
quota objects", has the table):

- honoured: it means here what it means to Kueue;
- refused: its meaning cannot be kept (admission checks, topology-aware scheduling), so
  admitting by the rest would admit what its author meant to hold back: the cluster queue
  becomes inactive with the reason, and its AppWrappers wait with that message;
- not read: it only tunes what Kueue does beyond quota (admission fair sharing between
  LocalQueues, a flavor-search preference): noted, and the queue admits as without it.

The status of Kueue's objects is Kueue's to write and is never written here (a Kueue started
later would find it as it left it); what the dispatcher makes of them is its log
(`kueue_quota_note`) and the message of every AppWrapper waiting in them.

Names: one of our objects and one of Kueue's of the same kind and name are one object when
they read the same; when they differ, ours is kept and the cluster queues it concerns become
inactive with both named, so that neither is admitted by silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import ValidationError

from dispatcher.api.queues import AppCohort, AppFlavor, AppQueue, ClusterAppQueue
from dispatcher.core.quota.model import CohortSpec, Flavor, LocalQueue, QueueSpec, QuotaSetup
from dispatcher.core.quota.read import cohort_of, flavor_of, local_of, queue_of

__all__ = [
    "KUEUE_GROUP",
    "KUEUE_KINDS",
    "KUEUE_PRIORITY_LABEL",
    "KueueObjects",
    "KueueQuotas",
    "kueue_running",
    "priority_value",
    "with_kueue",
]

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_KINDS = {
    "ClusterQueue": "clusterqueues",
    "LocalQueue": "localqueues",
    "Cohort": "cohorts",
    "ResourceFlavor": "resourceflavors",
    "WorkloadPriorityClass": "workloadpriorityclasses",
}
"""kind -> plural, in KUEUE_GROUP."""
KUEUE_PRIORITY_LABEL = f"{KUEUE_GROUP}/priority-class"
"""Names a WorkloadPriorityClass, whose value is the AppWrapper's priority."""

Obj = Mapping[str, Any]


class KueueQuotas(StrEnum):
    """The `kueue_quotas` setting."""

    OFF = "off"
    """Kueue's objects are not read."""
    BESIDE = "beside"
    """Kueue's objects are read as well as ours."""
    INSTEAD = "instead"
    """Only Kueue's objects are read; ours are not."""


@dataclass(frozen=True, slots=True)
class KueueObjects:
    """Kueue's quota objects as listed (raw), and whether Kueue itself runs."""

    cluster_queues: Iterable[Obj] = ()
    cohorts: Iterable[Obj] = ()
    flavors: Iterable[Obj] = ()
    local_queues: Iterable[Obj] = ()
    kueue_running: str = ""
    """Why Kueue is thought to run ("" = it is not): then its queues are left to it."""


# -- one object -----------------------------------------------------------------------------

_CQ_READ = {
    "resourceGroups",
    "cohort",
    "cohortName",
    "namespaceSelector",
    "queueingStrategy",
    "preemption",
    "flavorFungibility",
    "fairSharing",
    "stopPolicy",
}
_CQ_NOT_READ = {
    "admissionScope": "admission fair sharing (ordering by each LocalQueue's past usage)",
}
_WHEN_CAN_BORROW = {"MayStopSearch": "Borrow", "Borrow": "Borrow", "TryNextFlavor": "TryNextFlavor"}
_WHEN_CAN_PREEMPT = {
    "MayStopSearch": "Preempt",
    "Preempt": "Preempt",
    "TryNextFlavor": "TryNextFlavor",
}


@dataclass(frozen=True, slots=True)
class _Read:
    """One Kueue object in our terms: refused fields make its queue inactive; notes are
    fields without effect here."""

    refused: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _spec(obj: Obj) -> dict[str, Any]:
    spec = obj.get("spec")
    return dict(spec) if isinstance(spec, Mapping) else {}


def _unread(spec: Mapping[str, Any], read: set[str], notes: list[str]) -> None:
    for key in sorted(set(spec) - read):
        notes.append(f"spec.{key} is not read")


def cluster_queue_model(obj: Obj) -> tuple[ClusterAppQueue, _Read]:
    """A ClusterQueue (v1beta1 or v1beta2) as a ClusterAppQueue (raises ValidationError)."""
    spec = _spec(obj)
    refused: list[str] = []
    notes: list[str] = []
    checks = list(spec.get("admissionChecks") or [])
    strategy = spec.get("admissionChecksStrategy") or {}
    checks += [c.get("name") for c in strategy.get("admissionChecks") or [] if c]
    if checks:
        refused.append(
            f"admission checks ({', '.join(map(str, checks))}) are not run by this"
            " dispatcher: it would admit what they hold back"
        )
    for key, what in _CQ_NOT_READ.items():
        if spec.get(key):
            notes.append(f"spec.{key} ({what}) is not read")
    fungibility = dict(spec.get("flavorFungibility") or {})
    if fungibility.pop("preference", None):
        notes.append("spec.flavorFungibility.preference is not read")
    if "whenCanBorrow" in fungibility:
        fungibility["whenCanBorrow"] = _WHEN_CAN_BORROW.get(
            fungibility["whenCanBorrow"], fungibility["whenCanBorrow"]
        )
    if "whenCanPreempt" in fungibility:
        fungibility["whenCanPreempt"] = _WHEN_CAN_PREEMPT.get(
            fungibility["whenCanPreempt"], fungibility["whenCanPreempt"]
        )
    _unread(spec, _CQ_READ | {"admissionChecks", "admissionChecksStrategy", *_CQ_NOT_READ}, notes)
    ours = {k: spec[k] for k in _CQ_READ - {"cohort", "cohortName"} if k in spec}
    ours["flavorFungibility"] = fungibility
    # v1beta1 says `cohort`, v1beta2 `cohortName`; either may be what the storage holds.
    ours["cohort"] = spec.get("cohortName") or spec.get("cohort")
    model = ClusterAppQueue.model_validate({"metadata": obj.get("metadata"), "spec": ours})
    return model, _Read(tuple(refused), tuple(notes))


def local_queue_model(obj: Obj) -> tuple[AppQueue, _Read]:
    spec = _spec(obj)
    notes: list[str] = []
    if spec.get("fairSharing"):
        notes.append("spec.fairSharing (admission fair sharing) is not read")
    _unread(spec, {"clusterQueue", "stopPolicy", "fairSharing"}, notes)
    ours = {k: spec[k] for k in ("clusterQueue", "stopPolicy") if k in spec}
    return AppQueue.model_validate({"metadata": obj.get("metadata"), "spec": ours}), _Read(
        (), tuple(notes)
    )


def cohort_model(obj: Obj) -> tuple[AppCohort, _Read]:
    spec = _spec(obj)
    notes: list[str] = []
    weight = (spec.get("fairSharing") or {}).get("weight")
    if weight is not None and str(weight) != "1":
        notes.append("spec.fairSharing.weight of a cohort is not read (cohorts weigh 1 here)")
    _unread(spec, {"parentName", "resourceGroups", "fairSharing"}, notes)
    ours = {"parent": spec.get("parentName"), "resourceGroups": spec.get("resourceGroups") or []}
    return AppCohort.model_validate({"metadata": obj.get("metadata"), "spec": ours}), _Read(
        (), tuple(notes)
    )


def flavor_model(obj: Obj) -> tuple[AppFlavor, _Read]:
    spec = _spec(obj)
    refused: list[str] = []
    notes: list[str] = []
    if spec.get("topologyName"):
        refused.append(
            f"topologyName {spec['topologyName']}: topology-aware scheduling is not done by"
            " this dispatcher"
        )
    _unread(spec, {"nodeLabels", "nodeTaints", "tolerations", "topologyName"}, notes)
    taints = [
        {k: t[k] for k in ("key", "value", "effect") if k in t}
        for t in spec.get("nodeTaints") or []
    ]
    ours = {
        "nodeLabels": spec.get("nodeLabels") or {},
        "nodeTaints": taints,  # timeAdded only dates the taint
        "tolerations": spec.get("tolerations") or [],
    }
    return AppFlavor.model_validate({"metadata": obj.get("metadata"), "spec": ours}), _Read(
        tuple(refused), tuple(notes)
    )


def priority_value(obj: Obj | None) -> int | None:
    """A WorkloadPriorityClass's value (None: no such class, or no integer value)."""
    if obj is None:
        return None
    value = obj.get("value")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- the whole setup ------------------------------------------------------------------------


def _name(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def _with(problems: tuple[str, ...], *more: str) -> tuple[str, ...]:
    return (*problems, *(m for m in more if m not in problems))


M = TypeVar("M")
"""A model of one of Kueue's kinds, as `_Merge.read` yields it."""


@dataclass
class _Merge:
    """The setup being made, with what was noted on the way."""

    queues: dict[str, QueueSpec]
    cohorts: dict[str, CohortSpec]
    flavors: dict[str, Flavor]
    locals_: dict[tuple[str, str], LocalQueue]
    notes: list[str]
    bad_flavors: dict[str, str] = dataclasses.field(default_factory=dict)

    def note(self, kind: str, obj: Obj, read: _Read) -> None:
        self.notes.extend(f"{kind} {_name(obj)}: {n}" for n in (*read.refused, *read.notes))

    def read(
        self, kind: str, objects: Iterable[Obj], model: Callable[[Obj], tuple[M, _Read]]
    ) -> Iterator[tuple[M, _Read]]:
        """Each of `objects` read by `model`, what was refused or not read noted; one that
        cannot be read is noted as unreadable and left out."""
        for obj in objects:
            try:
                found, read = model(obj)
            except ValidationError as exc:
                self.notes.append(f"{kind} {_name(obj)} is unreadable: {str(exc)[:300]}")
                continue
            self.note(kind, obj, read)
            yield found, read


def _clash(kind: str, ours: str, name: str) -> str:
    return (
        f"{KUEUE_GROUP} {kind} {name} and {ours} {name} differ: rename or delete one"
        " (kueue_quotas: beside reads both)"
    )


_Spec = TypeVar("_Spec", QueueSpec, CohortSpec)


def _keep(found: dict[str, _Spec], spec: _Spec, known: set[str], clash: str) -> None:
    """Kueue's `spec` kept beside ours: taken where ours has none of that name (`known`:
    the names of ours), one where both read the same, ours made inactive with `clash`
    where they differ."""
    ours = found.get(spec.name)
    if ours is None or spec.name not in known:
        found[spec.name] = spec
    elif ours != spec:
        found[spec.name] = dataclasses.replace(ours, problems=_with(ours.problems, clash))


def _add_queues(merge: _Merge, objects: Iterable[Obj], known: set[str]) -> None:
    for model, read in merge.read("ClusterQueue", objects, cluster_queue_model):
        spec = queue_of(model)
        refused = tuple(f"{KUEUE_GROUP} ClusterQueue: {r}" for r in read.refused)
        spec = dataclasses.replace(spec, problems=_with(spec.problems, *refused))
        _keep(merge.queues, spec, known, _clash("ClusterQueue", "ClusterAppQueue", spec.name))


def _add_cohorts(merge: _Merge, objects: Iterable[Obj], known: set[str]) -> None:
    for model, _ in merge.read("Cohort", objects, cohort_model):
        spec = cohort_of(model)
        _keep(merge.cohorts, spec, known, _clash("Cohort", "AppCohort", spec.name))


def _add_flavors(merge: _Merge, objects: Iterable[Obj], known: set[str]) -> None:
    for model, read in merge.read("ResourceFlavor", objects, flavor_model):
        flavor = flavor_of(model)
        ours = merge.flavors.get(flavor.name)
        if ours is None or flavor.name not in known:
            merge.flavors[flavor.name] = flavor
        elif ours != flavor:
            merge.bad_flavors[flavor.name] = _clash("ResourceFlavor", "AppFlavor", flavor.name)
        if read.refused:
            merge.bad_flavors[flavor.name] = (
                f"{KUEUE_GROUP} ResourceFlavor {flavor.name}: {'; '.join(read.refused)}"
            )


def _add_locals(merge: _Merge, objects: Iterable[Obj], known: set[tuple[str, str]]) -> None:
    for model, _ in merge.read("LocalQueue", objects, local_queue_model):
        local = local_of(model)
        key = (local.namespace, local.name)
        ours = merge.locals_.get(key)
        if ours is None or key not in known:
            merge.locals_[key] = local
        elif ours != local:
            clash = _clash("LocalQueue", "AppQueue", f"{local.namespace}/{local.name}")
            merge.locals_[key] = dataclasses.replace(ours, problems=_with(ours.problems, clash))


def _guarded(merge: _Merge, objects: Iterable[Obj], why: str) -> None:
    """Kueue runs: its LocalQueues stay known, so that an AppWrapper naming one waits with
    the reason instead of 'does not exist'; nothing of Kueue's is admitted by."""
    for obj in objects:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if key in merge.locals_:
            continue
        problem = f"Kueue itself runs ({why}): its queues are left to it"
        merge.locals_[key] = LocalQueue(key[0], key[1], "", problems=(problem,))


def with_kueue(
    ours: QuotaSetup, kueue: KueueObjects, mode: KueueQuotas
) -> tuple[QuotaSetup, tuple[str, ...]]:
    """`ours` (our quota objects, or none with `instead`) with Kueue's objects added; and
    notes, one line each, on what of Kueue's is refused, not read, or clashes with ours."""
    if mode is KueueQuotas.OFF:
        return ours, ()
    merge = _Merge(
        dict(ours.queues), dict(ours.cohorts), dict(ours.flavors), dict(ours.local_queues), []
    )
    if kueue.kueue_running:
        _guarded(merge, kueue.local_queues, kueue.kueue_running)
        merge.notes.append(
            f"Kueue itself runs ({kueue.kueue_running}): its quota objects are not read"
        )
    else:
        _add_flavors(merge, kueue.flavors, set(ours.flavors))
        _add_cohorts(merge, kueue.cohorts, set(ours.cohorts))
        _add_queues(merge, kueue.cluster_queues, set(ours.queues))
        _add_locals(merge, kueue.local_queues, set(ours.local_queues))
    for name, queue in merge.queues.items():
        bad = [
            merge.bad_flavors[fq.flavor]
            for group in queue.groups
            for fq in group.flavors
            if fq.flavor in merge.bad_flavors
        ]
        if bad:
            merge.queues[name] = dataclasses.replace(queue, problems=_with(queue.problems, *bad))
    setup = dataclasses.replace(
        ours,
        queues=merge.queues,
        cohorts=merge.cohorts,
        flavors=merge.flavors,
        local_queues=merge.locals_,
    )
    return setup, tuple(dict.fromkeys(merge.notes))


# -- is Kueue itself running? ---------------------------------------------------------------

KUEUE_LEASE = "c1f6bfd2.kueue.x-k8s.io"
KUEUE_WEBHOOK = "kueue-validating-webhook-configuration"
"""The name Kueue's manifests and Helm chart give its validating webhook configuration."""
"""The Lease Kueue's manager holds when it leads (its default leader election id)."""


def _stamp(value: object) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def kueue_running(lease: Obj | None, webhooks: Iterable[Obj], now: float) -> str:
    """Why Kueue is thought to run ("" = no sign of it).

    Two signs, either enough: a webhook configuration with a rule on `kueue.x-k8s.io`
    (Kueue's own webhooks, whatever it was installed as: they also suspend and admit Jobs,
    so an installed Kueue is in play even while its pods restart), or Kueue's leader Lease
    renewed within three lease durations (at least a minute) of `now`."""
    for config in webhooks:
        for hook in config.get("webhooks") or []:
            for rule in hook.get("rules") or []:
                if KUEUE_GROUP in (rule.get("apiGroups") or []):
                    name = (config.get("metadata") or {}).get("name")
                    return f"webhook configuration {name} has rules on {KUEUE_GROUP}"
    if lease is not None:
        spec = lease.get("spec") or {}
        renewed = _stamp(spec.get("renewTime"))
        duration = spec.get("leaseDurationSeconds") or 15
        fresh = renewed is not None and now - renewed < max(60.0, 3.0 * float(duration))
        if spec.get("holderIdentity") and fresh:
            meta = lease.get("metadata") or {}
            return f"Lease {meta.get('namespace')}/{meta.get('name')} is held"
    return ""
