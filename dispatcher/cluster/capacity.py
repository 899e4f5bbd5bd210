"""Per-cluster capacity accounting, fed incrementally by node and pod watch events.

No I/O of its own: informer handlers call `on_node` / `on_pod`; the controller reads
`snapshot()`. Each pod event adjusts one node's sum in O(resources), so a decision never
lists pods. Pods of AppWrappers are also indexed by AppWrapper for pod counts.

A pod belongs to an AppWrapper only if it lives in the namespace where that AppWrapper's
objects go in this cluster and carries its uid label: anyone may label a pod with another
tenant's AppWrapper name, but wrapped objects are only ever created there, and a pod of an
earlier AppWrapper of the same name carries that one's uid. The member's pod watch checks the
namespace on arrival and drops the labels of look-alikes (`cluster/member.py`); the labels
then name the AppWrapper on the hub, whatever namespace the member puts its objects in.

Node health (`core/nodehealth.py`, once `follow_health` is called): a node labelled
NoSchedule or NoExecute for a resource offers none of it in `snapshot()`, and when the
resources a node evicts change, the AppWrappers with pods there are handed to `wake`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.api.quantity import QuantityError
from dispatcher.api.resources import EMPTY, Resources
from dispatcher.core.model import ClusterSnapshot, NodeSnapshot, Reservation, Taint
from dispatcher.core.nodehealth import OFF, NodeHealth, evicted_nodes, offered
from dispatcher.core.podsets import pod_requests
from dispatcher.kube.lazyjson import LazyArray, LazyObject, fields, plain

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
Obj = dict[str, Any]
Owner = tuple[str, str]
"""An AppWrapper as the owner of pods: ("namespace/name", uid)."""
POD_LABELS = (LABEL_NAME, LABEL_NAMESPACE, LABEL_UID)
_POD_LABEL_SET = frozenset(POD_LABELS)


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the dispatcher keeps of a pod."""

    key: str
    node: str
    phase: str
    requests: Resources
    owner: Owner | None  # ("namespace/name", uid) of the AppWrapper on the hub, if any
    deleting: bool = False

    @property
    def occupies_node(self) -> bool:
        return bool(self.node) and self.phase not in TERMINAL_PHASES

    @property
    def may_be_bound(self) -> bool:
        """Not on a node yet, but kube-scheduler may still put it on one."""
        return not self.node and not self.deleting and self.phase not in TERMINAL_PHASES


@dataclass
class PodCounts:
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return self.pending + self.running + self.succeeded + self.failed


def slim_metadata(meta: Obj, labels: tuple[str, ...]) -> Obj:
    """Identity, version and the dispatcher's own `labels` of an object's metadata."""
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
        "labels": {k: v for k, v in (meta.get("labels") or {}).items() if k in labels},
    }


def slim_pod(pod: Obj) -> Obj:
    """Keep only what accounting needs (bounds memory with many pods)."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    status = pod.get("status", {})
    phase = status.get("phase", "Pending")
    if phase in TERMINAL_PHASES:
        # A finished pod holds no room on its node: only its phase still counts (thousands
        # of finished Jobs' pods can stay in a cluster).
        return {
            "metadata": slim_metadata(meta, POD_LABELS),
            "spec": {"nodeName": spec.get("nodeName", "")},
            "status": {"phase": phase},
        }
    return {
        "metadata": {
            **slim_metadata(meta, POD_LABELS),
            "deletionTimestamp": meta.get("deletionTimestamp"),
        },
        "spec": {
            "nodeName": spec.get("nodeName", ""),
            "containers": [
                {"resources": c.get("resources", {})} for c in spec.get("containers", [])
            ],
            "initContainers": [
                {"resources": c.get("resources", {}), "restartPolicy": c.get("restartPolicy")}
                for c in spec.get("initContainers", []) or []
            ],
            "overhead": spec.get("overhead"),
        },
        "status": {"phase": phase},
    }


def slim_pod_lazy(pod: LazyObject) -> Obj | None:
    """`slim_pod` of a lazily decoded pod (`kube/lazyjson.py`), the same dict, reading only
    the fields kept; None for a shape the API server does not write (the caller then decodes
    the pod whole and `slim_pod` gives its answer, or its error). A key absent here is absent
    from the whole decode too, so each default below is `slim_pod`'s."""
    top = fields(pod)
    meta = pod["metadata"] if "metadata" in top else None
    spec: Any = pod["spec"] if "spec" in top else {}
    status: Any = pod["status"] if "status" in top else {}
    if not isinstance(meta, LazyObject) or not isinstance(spec, LazyObject | dict):
        return None  # a pod without metadata has no key; spec as a list fails `slim_pod`
    if not isinstance(status, LazyObject | dict):
        return None
    named = fields(meta)
    if not isinstance(meta["name"] if "name" in named else None, str):
        return None
    if not isinstance(meta["resourceVersion"] if "resourceVersion" in named else None, str):
        return None  # the informer reads the version of what it keeps
    labels = meta["labels"] if "labels" in named else None
    if labels is not None and not isinstance(labels, LazyObject):
        return None
    metadata = {
        "name": meta["name"],
        "namespace": plain(meta["namespace"]) if "namespace" in named else None,
        "uid": plain(meta["uid"]) if "uid" in named else None,
        "resourceVersion": meta["resourceVersion"],
        # Equal to `slim_pod`'s (its order may differ, which no reader sees).
        "labels": {k: plain(labels[k]) for k in fields(labels) & _POD_LABEL_SET} if labels else {},
    }
    given = fields(spec) if isinstance(spec, LazyObject) else set()
    phased = isinstance(status, LazyObject) and "phase" in fields(status)
    phase = plain(status["phase"]) if phased else "Pending"
    node = plain(spec["nodeName"]) if "nodeName" in given else ""
    if phase in TERMINAL_PHASES:
        return {"metadata": metadata, "spec": {"nodeName": node}, "status": {"phase": phase}}
    containers = _lazy_containers(spec["containers"] if "containers" in given else [], False)
    init = spec["initContainers"] if "initContainers" in given else None
    init_containers = _lazy_containers(init or [], True)
    if containers is None or init_containers is None:
        return None
    metadata["deletionTimestamp"] = (
        plain(meta["deletionTimestamp"]) if "deletionTimestamp" in named else None
    )
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": containers,
            "initContainers": init_containers,
            "overhead": plain(spec["overhead"]) if "overhead" in given else None,
        },
        "status": {"phase": phase},
    }


def _lazy_containers(containers: Any, init: bool) -> list[Obj] | None:
    """The kept part of each container of a lazily decoded list (None: not a list of
    objects)."""
    if not isinstance(containers, LazyArray | list):
        return None
    kept: list[Obj] = []
    for container in containers:
        if not isinstance(container, LazyObject):
            return None
        given = fields(container)
        entry: Obj = {"resources": plain(container["resources"]) if "resources" in given else {}}
        if init:
            entry["restartPolicy"] = (
                plain(container["restartPolicy"]) if "restartPolicy" in given else None
            )
        kept.append(entry)
    return kept


def pod_owner(meta: Obj) -> Owner | None:
    """The hub AppWrapper a pod (or wrapped object) from a member's watch belongs to, if any:
    named by its labels, with a uid. Only for objects from a member's watches, which keep
    these labels only where the AppWrapper's objects may live (`Member.owner`)."""
    labels = meta.get("labels") or {}
    name, uid = labels.get(LABEL_NAME), labels.get(LABEL_UID)
    if not name or not uid:
        return None
    return f"{labels.get(LABEL_NAMESPACE) or meta.get('namespace')}/{name}", str(uid)


def _pod_record(pod: Obj, requests: Resources | None = None) -> PodRecord:
    """`requests`: already known (the pod's resources did not change since last seen)."""
    meta = pod["metadata"]
    owner = pod_owner(meta)
    if requests is None:
        try:
            requests = pod_requests(pod.get("spec", {}), where=f"pod {meta.get('name')}")
        except QuantityError:
            requests = EMPTY  # the API server validated it; unreachable in practice
    return PodRecord(
        key=f"{meta.get('namespace')}/{meta.get('name')}",
        node=pod.get("spec", {}).get("nodeName") or "",
        phase=pod.get("status", {}).get("phase") or "Pending",
        requests=requests,
        owner=owner,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _node_state(node: Obj) -> NodeSnapshot:
    meta = node.get("metadata", {})
    spec = node.get("spec", {})
    status = node.get("status", {})
    try:
        allocatable = Resources.parse(status.get("allocatable") or status.get("capacity") or {})
    except QuantityError:
        allocatable = EMPTY
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions", []) or []
    )
    taints = tuple(
        Taint(key=t.get("key", ""), value=t.get("value", "") or "", effect=t.get("effect", ""))
        for t in spec.get("taints", []) or []
    )
    return NodeSnapshot(
        name=meta["name"],
        allocatable=allocatable,
        labels=dict(meta.get("labels") or {}),
        taints=taints,
        ready=ready,
        unschedulable=bool(spec.get("unschedulable")),
    )


@dataclass
class CapacityCache:
    """Nodes and pods of one cluster, with per-node sums of requests held by live pods."""

    cluster: str
    labels: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    on_change: Callable[[str], None] | None = None  # called with a reason, e.g. "pod-freed"
    nodes: dict[str, NodeSnapshot] = field(default_factory=dict)
    requested: dict[str, Resources] = field(default_factory=dict)
    pods: dict[str, PodRecord] = field(default_factory=dict)
    pods_by_owner: dict[Owner, dict[str, PodRecord]] = field(default_factory=dict)
    owner_revisions: dict[Owner, int] = field(default_factory=dict)
    """owner -> the value of `pod_clock` when one of its pods last changed, so what is derived
    from an owner's pods can be kept until they change (never reused: the clock only grows)."""
    pod_clock: int = 0
    node_health: NodeHealth = OFF
    wake: Callable[[str], None] | None = None
    """Called with the key ("namespace/name") of an AppWrapper with pods on a node whose
    evicted resources changed."""
    withheld: dict[str, frozenset[str]] = field(default_factory=dict)
    """node -> resources its health labels take out of the fit (only nodes with some)."""
    evicting: dict[str, frozenset[str]] = field(default_factory=dict)
    """node -> resources whose pods must leave it (NoExecute; only nodes with some)."""

    def follow_health(self, rules: NodeHealth, *, wake: Callable[[str], None]) -> None:
        """Judge nodes by `rules` from now on (the nodes known so far too)."""
        self.node_health, self.wake = rules, wake
        for node in self.nodes.values():
            self._judge_health(node)

    def _judge_health(self, node: NodeSnapshot | None, name: str = "") -> None:
        """Record what `node`'s labels withhold and evict (None: node `name` is gone or no
        longer counted), and wake the owners of its pods when what it evicts changed."""
        name = node.name if node is not None else name
        labels: Mapping[str, str] = node.labels if node is not None else {}
        before = self.evicting.get(name, frozenset())
        for kept, now in (
            (self.withheld, self.node_health.withheld(labels)),
            (self.evicting, self.node_health.evicting(labels)),
        ):
            if now:
                kept[name] = now
            else:
                kept.pop(name, None)
        if self.wake is not None and self.evicting.get(name, frozenset()) != before:
            # Rare (a health label set or cleared): one pass over the pods is affordable.
            owners = {r.owner[0] for r in self.pods.values() if r.node == name and r.owner}
            for key in sorted(owners):
                self.wake(key)

    def _changed(self, reason: str) -> None:
        if self.on_change is not None:
            self.on_change(reason)

    def _selected(self, node: NodeSnapshot) -> bool:
        return all(node.labels.get(k) == v for k, v in self.node_selector.items())

    # -- event handlers (informer callbacks) ---------------------------------------------

    def on_node(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            name = (old or {}).get("metadata", {}).get("name")
            if name and self.nodes.pop(name, None) is not None:
                self._judge_health(None, name)
                self._changed("node-removed")
            return
        state = _node_state(new)
        if not self._selected(state):
            if self.nodes.pop(state.name, None) is not None:
                self._judge_health(None, state.name)
                self._changed("node-deselected")
            return
        previous = self.nodes.get(state.name)
        self.nodes[state.name] = state
        if previous is None or previous.labels != state.labels:
            self._judge_health(state)
        if previous is None or (
            previous.allocatable != state.allocatable
            or previous.schedulable != state.schedulable
            or previous.taints != state.taints
            or previous.labels != state.labels
        ):
            self._changed("node-changed")

    def on_pod(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if new is None:
            key = _key(old)
            record = self.pods.pop(key, None) if key else None
            if record is not None:
                self._unaccount(record)
                self._unindex(record)
                self._changed("pod-deleted")
            return
        previous = self.pods.get(_key(new))
        # A pod changes phase, node and conditions many times and its resources seldom (an
        # in-place resize): its quantities are parsed again only then.
        same = previous is not None and old is not None and _sized_by(old) == _sized_by(new)
        record = _pod_record(new, previous.requests if same and previous else None)
        if previous == record:
            return
        if previous is not None:
            self._unaccount(previous)
            self._unindex(previous)
        self.pods[record.key] = record
        self._account(record)
        self._index(record)
        freed = previous is not None and previous.occupies_node and not record.occupies_node
        self._changed("pod-freed" if freed else "pod-changed")

    def _account(self, record: PodRecord) -> None:
        if record.occupies_node:
            self.requested[record.node] = self.requested.get(record.node, EMPTY) + record.requests

    def _unaccount(self, record: PodRecord) -> None:
        if record.occupies_node:
            self.requested[record.node] = self.requested.get(record.node, EMPTY) - record.requests

    def _index(self, record: PodRecord) -> None:
        if record.owner:
            self.pod_clock += 1
            self.owner_revisions[record.owner] = self.pod_clock
            self.pods_by_owner.setdefault(record.owner, {})[record.key] = record

    def _unindex(self, record: PodRecord) -> None:
        if record.owner:
            owned = self.pods_by_owner.get(record.owner)
            if owned is not None:
                owned.pop(record.key, None)
                if not owned:
                    del self.pods_by_owner[record.owner]
                    self.owner_revisions.pop(record.owner, None)
                else:
                    self.pod_clock += 1
                    self.owner_revisions[record.owner] = self.pod_clock

    # -- reads ------------------------------------------------------------------------

    def pod_counts(self, key: str, uid: str) -> PodCounts:
        """Pods of the AppWrapper `key` ("namespace/name") whose uid is `uid`."""
        counts = PodCounts()
        for record in self.pods_by_owner.get((key, uid), {}).values():
            if record.phase == "Running":
                counts.running += 1
            elif record.phase == "Succeeded":
                counts.succeeded += 1
            elif record.phase == "Failed":
                counts.failed += 1
            else:
                counts.pending += 1
        return counts

    def owner_revision(self, key: str, uid: str) -> int:
        """Differs from any earlier answer for (`key`, `uid`) whenever its pods changed (0:
        none)."""
        return self.owner_revisions.get((key, uid), 0)

    def owners(self) -> list[Owner]:
        """AppWrappers (key, uid) that have pods in this cluster."""
        return list(self.pods_by_owner)

    def owned_pods(self, key: str, uid: str) -> list[PodRecord]:
        return list(self.pods_by_owner.get((key, uid), {}).values())

    def evicted_nodes(self, key: str, uid: str) -> tuple[str, ...]:
        """The nodes, sorted, where a pod of the AppWrapper (not on its way out) asks for a
        resource the node's health labels evict."""
        if not self.evicting:
            return ()
        return evicted_nodes(
            (
                (r.node, r.requests)
                for r in self.pods_by_owner.get((key, uid), {}).values()
                if r.occupies_node and not r.deleting
            ),
            self.evicting,
        )

    def snapshot(
        self, reservations: tuple[Reservation, ...] = (), *, reachable: bool = True
    ) -> ClusterSnapshot:
        nodes = tuple(
            NodeSnapshot(
                name=n.name,
                allocatable=offered(
                    n.allocatable, self.requested.get(n.name, EMPTY), self.withheld[n.name]
                )
                if n.name in self.withheld
                else n.allocatable,
                requested=self.requested.get(n.name, EMPTY),
                labels=n.labels,
                taints=n.taints,
                ready=n.ready,
                unschedulable=n.unschedulable,
            )
            for n in self.nodes.values()
        )
        return ClusterSnapshot(
            name=self.cluster,
            nodes=nodes,
            reservations=reservations,
            labels=dict(self.labels),
            reachable=reachable,
        )


def _sized_by(pod: Obj) -> tuple[Any, ...]:
    """What a (slim) pod's requests are computed from."""
    spec = pod.get("spec", {})
    return (spec.get("containers"), spec.get("initContainers"), spec.get("overhead"))


def _key(obj: Obj | None) -> str:
    if not obj:
        return ""
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace')}/{meta.get('name')}"
