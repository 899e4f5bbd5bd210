"""What the admission webhook refuses of a request made in v1beta2 (and of no v1beta1 one):
the AppWrapper controller's structural invariants at create, and its immutable components
at update. Pure, no I/O; the gatekeeper (controller/access/gatekeeper.py) calls these for requests
whose `requestKind` is v1beta2 and hands them the objects as v1beta1 (its webhook names
v1beta1 with matchPolicy Equivalent), where `components[i]` is `GenericItems[i]`.

Why v1beta2 only: MCAD's v1beta1 AppWrappers may wrap objects that make no pods (a Service
alone), any number of pod templates, and have their items edited while queued, and MCAD's
users keep doing so; the AppWrapper controller's users were never allowed to, and Kueue's
limit of 8 pod sets per workload is where its rule comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dispatcher.api.models import AppWrapper, GenericItem
from dispatcher.api.quantity import QuantityError
from dispatcher.core.podsets import infer_pod_sets

MAX_POD_SETS: Final = 8
"""Pod templates in one v1beta2 AppWrapper at most: the AppWrapper controller's limit (Kueue's
pod sets per workload)."""
V1BETA2: Final = "v1beta2"


def requested_in_v1beta2(request: Mapping[str, Any]) -> bool:
    """Whether the AdmissionReview request was made in v1beta2 (what the user sent), whatever
    version the webhook was handed."""
    kind = request.get("requestKind")
    return isinstance(kind, Mapping) and kind.get("version") == V1BETA2


def pod_set_count(item: GenericItem) -> int:
    """Pod templates of one component, counted as the AppWrapper controller counts them: the
    declared `podSets` or the inferred ones, whichever are more. A template whose pods
    cannot be read counts as inferred none (the spec's validation says why)."""
    try:
        inferred = len(infer_pod_sets(item.generictemplate))
    except (QuantityError, RecursionError, ValueError, TypeError):
        inferred = 0
    return max(len(item.podSets or []), inferred)


def structure_problems(aw: AppWrapper) -> list[str]:
    """What a v1beta2 AppWrapper may not be at create: without components, without a pod
    template in any of them, or with more than MAX_POD_SETS pod templates in all."""
    items = aw.spec.items
    if not items:
        return ["spec.components is empty: a v1beta2 AppWrapper wraps at least one component"]
    counts = [pod_set_count(item) for item in items]
    total = sum(counts)
    if total == 0:
        return [
            "spec.components make no pods (no component has a pod template): a v1beta2 "
            "AppWrapper must contain at least one"
        ]
    if total > MAX_POD_SETS:
        each = ", ".join(f"components[{i}]: {n}" for i, n in enumerate(counts) if n)
        return [
            f"spec.components contain {total} pod templates ({each}); a v1beta2 AppWrapper "
            f"may contain at most {MAX_POD_SETS}"
        ]
    return []


def _items(obj: Mapping[str, Any]) -> list[Any]:
    resources = (obj.get("spec") or {}).get("resources")
    items = resources.get("GenericItems") if isinstance(resources, Mapping) else None
    return items if isinstance(items, list) else []


def _pod_sets(item: Any) -> list[tuple[Any, Any]]:
    """(path, replicas) of each declared pod set; replicas None reads as 1, as the
    controller's `utils.Replicas`."""
    declared = item.get("podSets") if isinstance(item, Mapping) else None
    if not isinstance(declared, list):
        return []
    return [
        (p.get("path"), 1 if p.get("replicas") is None else p.get("replicas"))
        if isinstance(p, Mapping)
        else (p, None)
        for p in declared
    ]


def immutable_problems(obj: Mapping[str, Any], old: Mapping[str, Any]) -> list[str]:
    """What a v1beta2 update may not change, at any phase: how many components there are,
    each component's template, and its `podSets` (how many, each one's path and replicas)."""
    new_items, old_items = _items(obj), _items(old)
    if len(new_items) != len(old_items):
        return [
            f"spec.components: {len(old_items)} components cannot become {len(new_items)}; "
            "the components of a v1beta2 AppWrapper are immutable"
        ]
    problems = []
    for index, (new, before) in enumerate(zip(new_items, old_items, strict=True)):
        where = f"spec.components[{index}]"
        new_template = new.get("generictemplate") if isinstance(new, Mapping) else None
        old_template = before.get("generictemplate") if isinstance(before, Mapping) else None
        if new_template != old_template:
            problems.append(f"{where}.template cannot change (immutable in v1beta2)")
        now, then = _pod_sets(new), _pod_sets(before)
        if len(now) != len(then):
            problems.append(
                f"{where}.podSets: {len(then)} pod sets cannot become {len(now)} "
                "(immutable in v1beta2)"
            )
            continue
        for number, ((path, replicas), (old_path, old_replicas)) in enumerate(
            zip(now, then, strict=True)
        ):
            if path != old_path:
                problems.append(
                    f"{where}.podSets[{number}].path cannot change from {old_path!r} to "
                    f"{path!r} (immutable in v1beta2)"
                )
            if replicas != old_replicas:
                problems.append(
                    f"{where}.podSets[{number}].replicas cannot change from {old_replicas!r} "
                    f"to {replicas!r} (immutable in v1beta2)"
                )
    return problems
