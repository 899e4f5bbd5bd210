"""Node health by labels (IBM Autopilot's `autopilot.ibm.com/gpuhealth`, or any other): which
of a node's resources a health label takes out of service, and what that means for new
gangs and running ones. Pure, no I/O: the capacity cache asks which resources a node
withholds, the maker asks for the anti-affinities of a pod template, and `core.lifecycle`
judges a dispatched AppWrapper whose pods sit on a node labelled NoExecute.

The rules are the AppWrapper controller's (`AutopilotConfig`, v1.1.2), read as labels
styled like taints: for each resource, (label key, label value, effect).

| effect           | new gangs (the fit)        | pod templates asking for it | running pods |
|------------------|----------------------------|-----------------------------|--------------|
| PreferNoSchedule | the node still offers it   | preferred NotIn (weight)    | stay         |
| NoSchedule       | the node offers none of it | required NotIn              | stay         |
| NoExecute        | the node offers none of it | required NotIn              | moved        |

A node that is cordoned, not Ready or tainted against the pods offers nothing anyway
(`NodeSnapshot.admits`), as the controller counts such a node NoSchedule for all it has.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dispatcher.api.quantity import QuantityError, parse_milli
from dispatcher.api.resources import Resources
from dispatcher.core.model import Taint

PREFER_NO_SCHEDULE: Final = "PreferNoSchedule"
NO_SCHEDULE: Final = "NoSchedule"
NO_EXECUTE: Final = "NoExecute"
AUTOPILOT_LABEL: Final = "autopilot.ibm.com/gpuhealth"
DEFAULT_RESOURCE_TAINTS: Final = (
    (
        "nvidia.com/gpu",
        (
            Taint(AUTOPILOT_LABEL, "WARN", PREFER_NO_SCHEDULE),
            Taint(AUTOPILOT_LABEL, "TESTING", NO_SCHEDULE),
            Taint(AUTOPILOT_LABEL, "EVICT", NO_EXECUTE),
        ),
    ),
)
"""The AppWrapper controller's defaults."""
DEFAULT_PREFER_WEIGHT: Final = 50

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_problem(key: str, value: str) -> str:
    """What Kubernetes would refuse in a node-affinity term on this label ("" if nothing):
    checked at start, since a bad one would make every create of a pod template asking for
    the resource fail, and fail users' AppWrappers for the operator's typo."""
    prefix, slash, name = key.rpartition("/")
    if not (name.isascii() and len(name) <= 63 and _NAME.fullmatch(name)):
        return f"label key {key!r}: the name part is not a valid label name"
    if slash and not (prefix.isascii() and len(prefix) <= 253 and _PREFIX.fullmatch(prefix)):
        return f"label key {key!r}: the prefix is not a DNS subdomain"
    if value and not (value.isascii() and len(value) <= 63 and _NAME.fullmatch(value)):
        return f"label value {value!r} is not a valid label value"
    return ""


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """The operator's rules (settings `node_health`, dispatcher/config.py)."""

    resource_taints: tuple[tuple[str, tuple[Taint, ...]], ...] = DEFAULT_RESOURCE_TAINTS
    """(resource, the labels that take it out of service, each with its effect)."""
    monitor_nodes: bool = True
    """Whether labelled nodes withhold the resource from the fit and running pods move."""
    inject_anti_affinities: bool = True
    prefer_weight: int = DEFAULT_PREFER_WEIGHT
    _by_label: dict[tuple[str, str], list[tuple[str, str]]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        by_label: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for resource, taints in self.resource_taints:
            for taint in taints:
                by_label.setdefault((taint.key, taint.value), []).append((resource, taint.effect))
        object.__setattr__(self, "_by_label", by_label)

    def _matching(self, labels: Mapping[str, str], effects: tuple[str, ...]) -> frozenset[str]:
        if not self.monitor_nodes or not self._by_label:
            return frozenset()
        found: set[str] = set()
        for key, value in labels.items():
            for resource, effect in self._by_label.get((key, value), ()):
                if effect in effects:
                    found.add(resource)
        return frozenset(found)

    def withheld(self, labels: Mapping[str, str]) -> frozenset[str]:
        """The resources a node with these labels offers none of (NoSchedule, NoExecute)."""
        return self._matching(labels, (NO_SCHEDULE, NO_EXECUTE))

    def evicting(self, labels: Mapping[str, str]) -> frozenset[str]:
        """The resources whose pods must leave a node with these labels (NoExecute)."""
        return self._matching(labels, (NO_EXECUTE,))

    def anti_affinities(
        self, requested: Iterable[str]
    ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """(required, preferred): label key -> the values a pod asking for `requested` must
        (should) not land on, in the order the rules give them."""
        required: dict[str, list[str]] = {}
        preferred: dict[str, list[str]] = {}
        if not self.inject_anti_affinities:
            return required, preferred
        asked = set(requested)
        for resource, taints in self.resource_taints:
            if resource not in asked:
                continue
            for taint in taints:
                target = preferred if taint.effect == PREFER_NO_SCHEDULE else required
                values = target.setdefault(taint.key, [])
                if taint.value not in values:
                    values.append(taint.value)
        return required, preferred


OFF: Final = NodeHealth(resource_taints=(), monitor_nodes=False, inject_anti_affinities=False)


def offered(allocatable: Resources, requested: Resources, withheld: Iterable[str]) -> Resources:
    """What a node offers to the fit: `allocatable`, but of each withheld resource only what
    its pods already use, so none is free (no new gang lands there) and what is in use still
    adds up (never a negative free amount)."""
    cut = {name: min(allocatable[name], max(requested[name], 0)) for name in withheld}
    return Resources({**dict(allocatable.items()), **cut})


def evicted_nodes(
    pods: Iterable[tuple[str, Resources]], evicting: Mapping[str, frozenset[str]]
) -> tuple[str, ...]:
    """The nodes, sorted, where one of `pods` ((node, requests) of pods bound there, not on
    their way out) asks for a resource its node evicts."""
    found = {
        node
        for node, requests in pods
        if node in evicting and any(requests[name] > 0 for name in evicting[node])
    }
    return tuple(sorted(found))


def requested_names(spec: Mapping[str, Any]) -> set[str]:
    """The resources a pod spec's containers (init ones too) request or limit above zero,
    as the AppWrapper controller decides whether to inject. A quantity that does not parse
    counts: the API server will refuse it anyway."""
    names: set[str] = set()
    for part in ("containers", "initContainers"):
        containers = spec.get(part)
        for container in containers if isinstance(containers, list) else []:
            resources = container.get("resources") if isinstance(container, dict) else None
            for kind in ("requests", "limits"):
                amounts = resources.get(kind) if isinstance(resources, dict) else None
                for name, amount in amounts.items() if isinstance(amounts, dict) else ():
                    if _above_zero(amount):
                        names.add(str(name))
    return names


def _above_zero(amount: Any) -> bool:
    try:
        return parse_milli(amount) > 0
    except (QuantityError, TypeError):
        return True


def inject_anti_affinities(pod_template: dict[str, Any], rules: NodeHealth) -> bool:
    """In place: a pod template whose pods ask for a covered resource gets node-affinity
    terms keeping them off nodes labelled against it, added to what the user wrote (each of
    the user's required terms gets ours too: the terms are alternatives, so ours must hold
    in each); whether it changed. A template whose shape Kubernetes would refuse anyway is
    left as it is (its create fails with the API server's own message)."""
    spec = pod_template.get("spec")
    if not isinstance(spec, dict):
        return False
    required, preferred = rules.anti_affinities(requested_names(spec))
    if not required and not preferred:
        return False
    node_affinity = _child(_child(spec, "affinity", {}), "nodeAffinity", {})
    if not isinstance(node_affinity, dict):
        return False
    changed = False
    if required:
        selector = _child(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution", {})
        terms = _child(selector, "nodeSelectorTerms", [{}])
        for term in terms if isinstance(terms, list) else []:
            if isinstance(term, dict):
                changed |= _add_expressions(term, required)
    if preferred:
        terms = _child(node_affinity, "preferredDuringSchedulingIgnoredDuringExecution", [])
        term = {"weight": rules.prefer_weight, "preference": {"matchExpressions": []}}
        added = isinstance(terms, list) and _add_expressions(term["preference"], preferred)
        if added and term not in terms:
            terms.append(term)
            changed = True
    return changed


def _child(parent: Any, key: str, default: Any) -> Any:
    """`parent[key]`, set to `default` where absent or null (as Kubernetes reads a null);
    None when `parent` is no mapping (a shape the API server refuses)."""
    if not isinstance(parent, dict):
        return None
    if parent.get(key) is None:
        parent[key] = default
    return parent[key]


def _add_expressions(term: dict[str, Any], not_in: Mapping[str, list[str]]) -> bool:
    expressions = term.setdefault("matchExpressions", [])
    if not isinstance(expressions, list):
        return False
    added = False
    for key, values in not_in.items():
        expression = {"key": key, "operator": "NotIn", "values": list(values)}
        if expression not in expressions:
            expressions.append(expression)
            added = True
    return added
