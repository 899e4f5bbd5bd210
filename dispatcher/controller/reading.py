"""AppWrappers as the controller reads them: validated models and workloads, each derived
once per version of its object and shared by the scheduler and the reconciler.

No I/O. Validating a whole AppWrapper and inferring its pod sets are the costly steps of
reading one; a cycle over 10k queued AppWrappers must not repeat them.

What is kept of each AppWrapper (`slimmer`): the object without bookkeeping, or, for one
larger than `max_appwrapper_bytes` (stored while the webhook was absent), a stub of its
metadata and status with a marker (`OVERSIZE`) that makes it Failed: its spec is never held.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from dispatcher.api.models import AppWrapper
from dispatcher.core.gatekeeping import PriorityPolicy, priority_problems
from dispatcher.core.model import Workload
from dispatcher.core.quota.kueue import KUEUE_PRIORITY_LABEL, priority_value
from dispatcher.core.validation import LAST_APPLIED, appwrapper_size, size_problem
from dispatcher.core.workloads import InvalidSpec, queue_name_of, workload_of

Obj = dict[str, Any]
PARSED_LIMIT = 512
"""AppWrapperReader kept (most recently used): a model weighs about twice its object."""
OVERSIZE = "oversize"
"""Top-level key of a stub (`slimmer`): why the AppWrapper is refused. No stored AppWrapper
has it: the CRD's structural schema prunes unknown top-level fields."""
STUB_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "finalizers",
    "labels",
)


def resource_version(obj: Obj | None) -> int:
    """etcd revisions are numbers; an unreadable one sorts first (treated as oldest)."""
    try:
        return int((obj or {}).get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


def key_of(obj: Obj) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def without_bookkeeping(obj: Obj) -> Obj:
    """Drops what the dispatcher never reads and that can be as large as the spec again
    (server-side field ownership, kubectl's copy of the last applied object), and shares
    the keys' strings between objects (each decoded object has its own copy of every key,
    a quarter of its size): thousands of AppWrappers are held in memory."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    shared: Obj = _interned(obj)
    return shared


def slimmer(limit: int) -> Callable[[Obj], Obj]:
    """What the watch cache and the status writer keep of an AppWrapper: the object without
    bookkeeping, or a stub when it is larger than `limit` bytes (`appwrapper_size`)."""

    def slim(obj: Obj) -> Obj:
        if appwrapper_size(obj) <= limit:
            return without_bookkeeping(obj)
        return oversize_stub(obj, size_problem(obj, limit=limit))

    return slim


def oversize_stub(obj: Obj, problem: str) -> Obj:
    """Metadata (no annotations), status unless it is itself large, an empty spec, and
    `problem` under OVERSIZE."""
    meta = obj.get("metadata") or {}
    stub: Obj = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {key: meta[key] for key in STUB_METADATA if key in meta},
        "spec": {},
        OVERSIZE: problem,
    }
    status = obj.get("status")
    # A status only the dispatcher writes is small; one written by someone else may not be
    # (it is replaced by the Failed one written next).
    if isinstance(status, dict) and appwrapper_size(status) <= 64 * 1024:
        stub["status"] = status
    return stub


def _interned(value: Any) -> Any:
    """A copy of `value` with its keys interned, built without recursion: the objects are
    user data, and a template nested a thousand levels deep must not end the process (it is
    refused later, by validation, with a message)."""
    if not isinstance(value, dict | list):
        return value
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        if isinstance(source, dict):
            for key, child in source.items():
                copied = _empty_like(child)
                target[sys.intern(key) if type(key) is str else key] = copied
                if copied is not child:
                    stack.append((child, copied))
        else:
            for child in source:
                copied = _empty_like(child)
                target.append(copied)
                if copied is not child:
                    stack.append((child, copied))
    return root


def _empty_like(value: Any) -> Any:
    """A new empty container to fill for a dict or list; any other value itself."""
    if isinstance(value, dict):
        return {}
    if isinstance(value, list):
        return []
    return value


WorkloadStamp = tuple[str, int, int, int, str, str]


class AppWrapperReader:
    """Validated models (per resourceVersion, bounded) and workloads (per uid, generation,
    priority and queueing time) of AppWrappers."""

    def __init__(
        self,
        *,
        allowed_kinds: frozenset[str],
        priority_class: Callable[[str], Obj | None],
        declared_as_written: bool = True,
        attribution: Callable[[Obj], str] = lambda obj: "",
        creator: Callable[[Obj], tuple[str, tuple[str, ...]]] = lambda obj: ("", ()),
        priority_policy: PriorityPolicy | None = None,
        workload_priority_class: Callable[[str], Obj | None] | None = None,
    ) -> None:
        self.allowed_kinds = allowed_kinds
        self.declared_as_written = declared_as_written
        self._priority_class = priority_class
        self._attribution = attribution
        self._creator = creator
        self._priority_policy = priority_policy
        # Kueue's WorkloadPriorityClasses, when its quota objects are read (else None).
        self._workload_priority_class = workload_priority_class
        # key -> (resourceVersion, why it may not be dispatched for want of a trusted
        # creator): `verify`'s answers, read from the object (the signature covers the spec
        # as stored), once per version.
        self._verified: dict[str, tuple[str, str]] = {}
        # Why each AppWrapper held as a stub (larger than the size limit) is refused.
        self._oversize: dict[str, str] = {}
        self._parsed: dict[str, tuple[str, AppWrapper]] = {}
        # key -> who created it and their groups, as its signed record says (("", ()) when
        # it is not signed): read with the model, once per version; kept when it is dropped.
        self._users: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._workloads: dict[str, tuple[WorkloadStamp, Workload | InvalidSpec]] = {}

    def parse(self, obj: Obj) -> AppWrapper:
        """The model of `obj`, validated once per resourceVersion (ValidationError if bad).
        Its creator's record is not checked here: that is `verify`'s.

        The returned model is shared: callers copy the status before changing it.
        """
        meta = obj.get("metadata", {})
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        version = str(meta.get("resourceVersion", ""))
        cached = self._parsed.pop(key, None)
        if cached is not None and cached[0] == version and version:
            self._parsed[key] = cached  # most recently used last
            return cached[1]
        model = AppWrapper.from_kube(obj)
        self._parsed[key] = (version, model)
        self._users[key] = self._creator(obj) if not obj.get(OVERSIZE) else ("", ())
        oversize = obj.get(OVERSIZE)
        if oversize:
            self._oversize[key] = str(oversize)
        else:
            self._oversize.pop(key, None)
        if len(self._parsed) > PARSED_LIMIT:
            del self._parsed[next(iter(self._parsed))]
        return model

    def priority(self, aw: AppWrapper) -> tuple[int, str]:
        """Effective priority and, if its PriorityClass is unknown, the error. Kueue's
        `kueue.x-k8s.io/priority-class` label, where read, wins over a PriorityClass, as in
        Kueue."""
        kueue_class = self._kueue_class(aw)
        if kueue_class:
            value = priority_value(self._workload_priority_class_of(kueue_class))
            if value is None:
                return aw.spec.priority, f"WorkloadPriorityClass {kueue_class!r} not found"
            return value, ""
        name = aw.spec.priorityClassName
        if not name:
            return aw.spec.priority, ""
        found = self._priority_class(name)
        if found is None:
            return aw.spec.priority, f"PriorityClass {name!r} not found"
        return int(found.get("value", 0)), ""

    def _kueue_class(self, aw: AppWrapper) -> str:
        if self._workload_priority_class is None:
            return ""
        return aw.metadata.labels.get(KUEUE_PRIORITY_LABEL) or ""

    def _workload_priority_class_of(self, name: str) -> Obj | None:
        lookup = self._workload_priority_class
        return lookup(name) if lookup is not None else None

    def verify(self, obj: Obj) -> str:
        """Why `obj` may not be dispatched for want of a creator record the admission
        webhook signed (when the operator refuses those); "" when it may. The signature is
        checked once per resourceVersion."""
        meta = obj.get("metadata", {})
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        version = str(meta.get("resourceVersion", ""))
        known = self._verified.get(key)
        if known is not None and known[0] == version and version:
            return known[1]
        # A stub has no record to check: it fails for its size alone.
        problem = "" if obj.get(OVERSIZE) else self._attribution(obj)
        self._verified[key] = (version, problem)
        return problem

    def refusal(self, aw: AppWrapper, obj: Obj) -> str:
        """Why `aw` (the model of `obj`) may not be dispatched however much room there is:
        its creator unverified (`verify`), or a priority its namespace may not use. "" when
        it may. Only for queued AppWrappers: one dispatched before a policy changed keeps
        running and keeps its room."""
        problem = self.verify(obj)
        if problem or self._priority_policy is None:
            return problem
        spec: dict[str, Any] = {
            "priorityClassName": aw.spec.priorityClassName,
            "priority": aw.spec.priority,
        }
        name = aw.spec.priorityClassName
        found = self._priority_class(name) if name else None
        # Every class named is judged by name and value, the Kueue label's included (it
        # wins over the PriorityClass where it is read, so it must pass the same rule).
        kueue_class = self._kueue_class(aw)
        problems = priority_problems(
            spec,
            namespace=aw.metadata.namespace,
            policy=self._priority_policy,
            class_value=int(found.get("value", 0)) if found is not None else None,
            workload_class=kueue_class,
            workload_class_value=(
                priority_value(self._workload_priority_class_of(kueue_class))
                if kueue_class
                else None
            ),
        )
        return problems[0] if problems else ""

    def workload(self, aw: AppWrapper, *, priority: int, now: datetime) -> Workload | InvalidSpec:
        """What the scheduler sees of `aw`, inferred once per (uid, generation, priority,
        requeues, queuedAt, queue label): age and queueing time come from status too."""
        oversize = self._oversize.get(aw.key)
        if oversize:
            return InvalidSpec(oversize)
        status = aw.status
        stamp = (
            aw.metadata.uid or "",
            aw.metadata.generation or 0,
            priority,
            status.requeueCount if status is not None else 0,
            (status.queuedAt or "") if status is not None else "",
            # Labels and annotations: editing them changes no generation.
            queue_name_of(aw.metadata.labels, aw.metadata.annotations),
        )
        cached = self._workloads.get(aw.key)
        user, groups = self._users.get(aw.key, ("", ()))
        if cached is not None and cached[0] == stamp:
            found = cached[1]
            signed = isinstance(found, Workload) and (found.user, found.groups) != (user, groups)
            if signed and isinstance(found, Workload):  # its record signed since
                found = replace(found, user=user, groups=groups)
                self._workloads[aw.key] = (stamp, found)
            return found
        result = workload_of(
            aw,
            priority=priority,
            allowed_kinds=self.allowed_kinds,
            now=now,
            declared_as_written=self.declared_as_written,
        )
        if isinstance(result, Workload) and user:
            result = replace(result, user=user, groups=groups)
        self._workloads[aw.key] = (stamp, result)
        return result

    def forget(self, key: str) -> None:
        """It finished or went: a finished AppWrapper is read again only when deleted."""
        self._parsed.pop(key, None)
        self._workloads.pop(key, None)
        self._users.pop(key, None)
        self._verified.pop(key, None)
        self._oversize.pop(key, None)
