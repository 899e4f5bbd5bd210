"""v1beta2's declared pod sets and pod set infos on a wrapped object. Pure, no I/O.

A component's `podSets[]` name its pod templates by path (the AppWrapper controller's
notation, rooted at the component: `template.spec.template`,
`template.spec.workerGroupSpecs[0].template`), each with `replicas` (default 1). Where
declared they replace inference (so any kind can be wrapped); where absent the pod templates
are the ones core/podsets.py knows for the kind, in its order.

`podSetInfos[i]` (labels, annotations, nodeSelector, tolerations, schedulingGates) is added
to the i-th pod template at dispatch, and the fit is made with it already added: a node
selector injected there narrows the nodes the pods may go to.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.api.models import GenericItem, PodSetInfo, PodSetRef
from dispatcher.api.quantity import QuantityError
from dispatcher.core.model import PodSet
from dispatcher.core.podsets import MAX_PODS, pod_requests, pod_templates
from dispatcher.core.podsets import _one_pod as one_pod
from dispatcher.core.podsets import _tolerations as tolerations_of

_STEP = re.compile(r"^([A-Za-z0-9_-]+)((?:\[\d+\])*)$")


def parse_path(path: str) -> list[str | int]:
    """`template.spec.workerGroupSpecs[0].template` -> ["spec", "workerGroupSpecs", 0,
    "template"] (the leading `template` names the component's template itself). Raises
    ValueError saying what is wrong."""
    parts = path.split(".")
    if not parts or parts[0] != "template":
        raise ValueError("must start with 'template' (the component's template)")
    steps: list[str | int] = []
    for part in parts[1:]:
        match = _STEP.match(part)
        if not match:
            raise ValueError(f"step {part!r} is not a field name with optional [index]")
        steps.append(match.group(1))
        steps.extend(int(i) for i in re.findall(r"\[(\d+)\]", match.group(2)))
    return steps


def template_at(obj: Any, path: str) -> dict[str, Any]:
    """The pod template at `path` in `obj` (the object itself, to change in place).
    Raises ValueError when the path leads nowhere or to something that is no pod template."""
    node = obj
    for step in parse_path(path):
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                raise ValueError(f"no element [{step}] there")
            node = node[step]
        else:
            if not isinstance(node, dict) or step not in node:
                raise ValueError(f"no field {step!r} there")
            node = node[step]
    spec = node.get("spec") if isinstance(node, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
        raise ValueError("what is there is not a pod template (spec.containers)")
    return node  # type: ignore[no-any-return]


def declared_pod_sets(
    template: Mapping[str, Any], declared: Sequence[PodSetRef], *, where: str
) -> tuple[PodSet, ...]:
    """The pod sets the component declares. Raises QuantityError naming the podSet's field."""
    sets: list[PodSet] = []
    for index, pod_set in enumerate(declared):
        field = f"{where}.podSets[{index}]"
        try:
            pod_template = template_at(template, pod_set.path)
        except ValueError as exc:
            raise QuantityError(f"{field}.path {pod_set.path!r}: {exc}") from exc
        count = 1 if pod_set.replicas is None else pod_set.replicas
        if count > MAX_PODS:
            raise QuantityError(f"{field}.replicas {count}: more than {MAX_PODS} pods")
        if count == 0:
            continue
        spec = pod_template["spec"]
        selector = spec.get("nodeSelector") if isinstance(spec.get("nodeSelector"), dict) else {}
        sets.append(
            PodSet(
                count=count,
                requests=one_pod(pod_requests(spec, where=field)),
                node_selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
                tolerations=tolerations_of(spec),
                name=f"{template.get('kind')}/{(template.get('metadata') or {}).get('name')} "
                f"{pod_set.path}",
            )
        )
    return tuple(sets)


def item_pod_templates(obj: dict[str, Any], item: GenericItem, *, where: str) -> list[Any]:
    """The pod templates of the item's object `obj` (a copy to change), in podSet order:
    the declared paths, else those known for its kind. Raises QuantityError."""
    if item.podSets is None:
        return pod_templates(obj)
    found = []
    for index, pod_set in enumerate(item.podSets):
        try:
            found.append(template_at(obj, pod_set.path))
        except ValueError as exc:
            raise QuantityError(f"{where}.podSets[{index}].path {pod_set.path!r}: {exc}") from exc
    return found


def with_pod_set_infos(item: GenericItem, *, where: str) -> dict[str, Any]:
    """A copy of the item's object with each `podSetInfos[i]` added to its i-th pod
    template (the item's own object when it has none). Raises QuantityError naming the
    field when there are more infos than pod templates."""
    if not item.podSetInfos:
        return item.generictemplate
    obj = copy.deepcopy(item.generictemplate)
    templates = item_pod_templates(obj, item, where=where)
    if len(item.podSetInfos) > len(templates):
        raise QuantityError(
            f"{where}.podSetInfos has {len(item.podSetInfos)} entries but the object has "
            f"{len(templates)} pod templates"
        )
    for info, pod_template in zip(item.podSetInfos, templates, strict=False):
        _apply(info, pod_template)
    return obj


def _apply(info: PodSetInfo, pod_template: dict[str, Any]) -> None:
    metadata = pod_template.setdefault("metadata", {})
    for key, values in (("labels", info.labels), ("annotations", info.annotations)):
        if values:
            metadata[key] = {**(metadata.get(key) or {}), **values}
    spec = pod_template.setdefault("spec", {})
    if info.nodeSelector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **info.nodeSelector}
    for key, entries in (
        ("tolerations", info.tolerations),
        ("schedulingGates", info.schedulingGates),
    ):
        if entries:
            spec[key] = [*(spec.get(key) or []), *entries]


def dispatch_template(item: GenericItem, labels: Mapping[str, str]) -> dict[str, Any]:
    """The item's object as it is created: `podSetInfos` added, and `labels` on every
    declared pod template (core/podsets.inject_labels labels the object and the pod
    templates known for its kind). Raises QuantityError as `with_pod_set_infos`."""
    obj = with_pod_set_infos(item, where="item")
    if item.podSets is None:
        return obj
    obj = copy.deepcopy(obj)
    for pod_template in item_pod_templates(obj, item, where="item"):
        metadata = pod_template.setdefault("metadata", {})
        metadata["labels"] = {**(metadata.get("labels") or {}), **labels}
    return obj
