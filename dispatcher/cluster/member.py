"""Member clusters: a client, node and pod watch caches, and capacity accounting for each;
where each hub namespace's objects go in a member (`namespaces` mapping).

Side effects: holds connections to member API servers; `run` watches them until cancelled.

An object in a member belongs to the hub AppWrapper its labels name only if it lives in the
namespace that AppWrapper's namespace maps to there (`Member.owner`): the labels alone can
be copied by anyone who may create objects in some namespace. The pod and wrapped-object
watches drop the labels of every other object on arrival, so what reads them later
(capacity's pod index, the wake-ups of AppWrappers) sees look-alikes as nobody's.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dispatcher.api.constants import FIELD_MANAGER, LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.clock import Clock, SystemClock
from dispatcher.cluster.capacity import (
    TERMINAL_PHASES,
    CapacityCache,
    slim_metadata,
    slim_pod,
    slim_pod_lazy,
)
from dispatcher.config import MemberConfig
from dispatcher.core.namespaces import Wildcard
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError
from dispatcher.kube.informer import Handler, Informer
from dispatcher.kube.lazyjson import LazyObject

NODES = ResourceInfo("v1", "Node", "nodes", namespaced=False)
PODS = ResourceInfo("v1", "Pod", "pods", namespaced=True)


def _slim_node(node: dict[str, object]) -> dict[str, object]:
    # Images and volumes lists on real nodes are large and never read here.
    status = dict(node.get("status") or {})  # type: ignore[call-overload]
    for key in ("images", "volumesInUse", "volumesAttached", "nodeInfo", "daemonEndpoints"):
        status.pop(key, None)
    return {**node, "status": status}


def _slim_wrapped(obj: dict[str, Any]) -> dict[str, Any]:
    """What reading a wrapped object's completion and presence needs: who owns it, whether
    the dispatcher made it (its own managedFields entry, not a look-alike's), whether it is
    being deleted, and its conditions."""
    meta = obj.get("metadata") or {}
    ours = [
        {"manager": FIELD_MANAGER}
        for entry in meta.get("managedFields") or []
        if entry.get("manager") == FIELD_MANAGER
    ][:1]
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {
            **slim_metadata(meta, (LABEL_NAME, LABEL_NAMESPACE, LABEL_UID)),
            "managedFields": ours,
            # Kept when set: an object being deleted by someone else is a missing component.
            **({"deletionTimestamp": gone} if (gone := meta.get("deletionTimestamp")) else {}),
        },
        "status": {"conditions": (obj.get("status") or {}).get("conditions") or []},
    }


def _said(obj: dict[str, Any]) -> tuple[Any, frozenset[str]]:
    """What of a slimmed wrapped object its AppWrapper's verdict reads: whether it is being
    deleted, and which of its conditions are True."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    true = frozenset(str(c.get("type")) for c in conditions if c.get("status") == "True")
    return (obj.get("metadata") or {}).get("deletionTimestamp"), true


def telling(
    handler: Handler,
    *,
    conditions_read: Callable[[], bool],
    ours: Callable[[str, bool], bool] = lambda _uid, _gone: False,
) -> Handler:
    """`handler`, called only for the changes of a wrapped object that can change its
    AppWrapper's verdict: its deletion, its `deletionTimestamp`, and a change of the
    conditions that are True while some AppWrapper reads this kind's completion
    (`conditions_read`). Not for its creation (the dispatcher made it, and looks at it
    then), nor for the status updates its own controller makes all along (a RayCluster's, a
    Deployment's), nor for a deletion the dispatcher asked for itself (`ours(uid, gone)`):
    each would be a reconcile for nothing."""

    def told(kind: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        uid = str(((new or old or {}).get("metadata") or {}).get("uid") or "")
        if ours(uid, new is None):
            return
        if new is None:
            handler(kind, old, new)
        elif old is not None:
            (was_going, was_true), (going, true) = _said(old), _said(new)
            if was_going != going or (was_true != true and conditions_read()):
                handler(kind, old, new)

    return told


DELETING_KEPT = 4096
"""Deletions of its own a member remembers until their watch event (`Member.deleting`)."""

ANY_NAMESPACE = "*"
"""As a key of `namespaces`: every hub namespace; as a value: the same name as the hub's."""

OWNER_LABELS = (LABEL_NAME, LABEL_NAMESPACE, LABEL_UID)
_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_GLOB = re.compile(r"\*|\?|\[[^]]*\]")
"""Glob syntax (fnmatch): checked as if each were one letter."""


def mapped_namespace(
    mapping: Mapping[str, str], namespace: str, wildcard: Wildcard | None = None
) -> str | None:
    """The member namespace where objects of hub namespace `namespace` go, by a member's
    `namespaces` mapping: its own entry, else the "*" entry if `wildcard` (the member's
    `wildcard_allowed` and `wildcard_reserved`) lets it take the namespace; a value "*"
    keeps the name. None: the mapping does not take it."""
    target = mapping.get(namespace)
    if target is None and (wildcard or Wildcard()).takes(namespace):
        target = mapping.get(ANY_NAMESPACE)
    if target is None:
        return None
    return namespace if target == ANY_NAMESPACE else target


def mapping_problems(
    mapping: Mapping[str, str], allowed: Sequence[str] = (), reserved: Sequence[str] = ()
) -> list[str]:
    """What is wrong with a `namespaces` mapping: every key and value is "*" or a namespace
    name (a DNS-1123 label); a "*" key needs `wildcard_allowed` or `wildcard_reserved`
    (`allowed`, `reserved`), whose patterns are namespace names with glob characters."""
    problems = []
    for text in sorted({*mapping, *mapping.values()}):
        if text != ANY_NAMESPACE and not _namespace_name(text):
            problems.append(f'{text!r} is neither "*" nor a namespace name')
    if ANY_NAMESPACE in mapping and not (allowed or reserved):
        problems.append(
            'the key "*" takes every hub namespace under any name a tenant chooses (one named'
            " like a namespace only this member has, such as gpu-operator, would land pods"
            " there): name the namespaces it may take (wildcard_allowed) or those it must"
            " never take (wildcard_reserved)"
        )
    for pattern in sorted({*allowed, *reserved}):
        if not _namespace_name(_GLOB.sub("a", pattern)):
            problems.append(f"{pattern!r} is not a namespace name or a glob pattern of one")
    return problems


def _namespace_name(text: str) -> bool:
    return len(text) <= 63 and text.isascii() and bool(_NAMESPACE_NAME.fullmatch(text))


def _finished_pod(pod: dict[str, Any]) -> bool:
    # A finished pod's store entry is read again only when it is deleted.
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


@dataclass
class Member:
    name: str
    client: KubeApi
    is_hub: bool
    capacity: CapacityCache
    clock: Clock = field(default_factory=SystemClock)
    nodes: Informer = field(init=False)
    pods: Informer = field(init=False)
    last_answer: float = 0.0  # monotonic time of the last successful probe
    started: float = 0.0  # monotonic time `run` began (silence before the first sync)
    wrapped: dict[str, Informer] = field(default_factory=dict)
    """"apiVersion/kind" -> watch cache of our wrapped objects of that kind: their completion
    (e.g. Jobs) and presence read from here instead of one GET per object."""
    _completion_kinds: set[str] = field(default_factory=set)
    """"apiVersion/kind" of the wrapped kinds whose completion some AppWrapper reads."""
    _deleting: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """uids of wrapped objects the dispatcher asked to go (the most recent DELETING_KEPT)."""
    namespaces: Mapping[str, str] = field(default_factory=dict)
    """Hub namespace -> namespace here (members[].namespaces); not read for the hub."""
    wildcard: Wildcard = field(default_factory=Wildcard)
    """Which hub namespaces a "*" key of `namespaces` takes."""
    create_namespaces: bool = False
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        steady = self.clock.monotonic
        self.nodes = Informer(self.client, NODES, transform=_slim_node, monotonic=steady)
        self.pods = Informer(
            self.client,
            PODS,
            transform=lambda pod: self._vouched(slim_pod(pod)),
            lazy=self._lazy_pod,
            cold=_finished_pod,
            monotonic=steady,
        )
        self.nodes.add_handler(self.capacity.on_node)
        self.pods.add_handler(self.capacity.on_pod)

    @classmethod
    def build(
        cls, config: MemberConfig, client: KubeApi, *, is_hub: bool, clock: Clock | None = None
    ) -> Member:
        capacity = CapacityCache(
            cluster=config.name,
            labels=dict(config.labels),
            node_selector=dict(config.node_selector),
        )
        return cls(
            name=config.name,
            client=client,
            is_hub=is_hub,
            capacity=capacity,
            clock=clock or SystemClock(),
            namespaces=dict(config.namespaces),
            wildcard=Wildcard(tuple(config.wildcard_allowed), tuple(config.wildcard_reserved)),
            create_namespaces=config.create_namespaces,
            namespace_labels=dict(config.namespace_labels),
        )

    def namespace_for(self, namespace: str) -> str | None:
        """Where the objects of an AppWrapper of hub namespace `namespace` go here; None: it
        may not come here. The hub keeps the AppWrapper's own namespace."""
        if self.is_hub:
            return namespace
        return mapped_namespace(self.namespaces, namespace, self.wildcard)

    @property
    def hub_namespaces(self) -> frozenset[str] | None:
        """The hub namespaces whose AppWrappers may come here by name (more with a "*"
        key: `snapshot_wildcard`); None: every one (the hub)."""
        if self.is_hub:
            return None
        return frozenset(self.namespaces) - {ANY_NAMESPACE}

    @property
    def snapshot_wildcard(self) -> Wildcard | None:
        """What a "*" key takes besides `hub_namespaces` (None: no "*" key, or the hub)."""
        if self.is_hub or ANY_NAMESPACE not in self.namespaces:
            return None
        return self.wildcard

    @property
    def own_namespaces(self) -> tuple[str, ...] | None:
        """The namespaces here that hold AppWrappers' objects; None: any (the hub, or "*")."""
        if self.is_hub or ANY_NAMESPACE in self.namespaces:
            return None
        return tuple(sorted({n for n in map(self.namespace_for, self.namespaces) if n}))

    def owner(self, meta: Mapping[str, Any]) -> tuple[str, str] | None:
        """("namespace/name", uid) of the hub AppWrapper an object here (its metadata) was
        made for: named by its labels, and living where that AppWrapper's namespace maps."""
        labels = meta.get("labels") or {}
        name, uid = labels.get(LABEL_NAME), labels.get(LABEL_UID)
        here = meta.get("namespace")
        if not name or not uid or not isinstance(here, str):
            return None
        hub_namespace = labels.get(LABEL_NAMESPACE, here)
        if not isinstance(hub_namespace, str) or self.namespace_for(hub_namespace) != here:
            return None
        return f"{hub_namespace}/{name}", str(uid)

    def _lazy_pod(self, pod: LazyObject) -> dict[str, Any] | None:
        """The pod watch's transform over a lazily decoded pod (`slim_pod_lazy`)."""
        slim = slim_pod_lazy(pod)
        return None if slim is None else self._vouched(slim)

    def _vouched(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A slimmed object, without the owner labels unless `owner` vouches for them."""
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if not any(k in labels for k in OWNER_LABELS) or self.owner(meta) is not None:
            return obj
        kept = {k: v for k, v in labels.items() if k not in OWNER_LABELS}
        return {**obj, "metadata": {**meta, "labels": kept}}

    async def run(self) -> None:
        if not self.started:
            self.started = self.clock.monotonic()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.nodes.run(), name=f"{self.name}-nodes")
            group.create_task(self.pods.run(), name=f"{self.name}-pods")
            group.create_task(self._probe(), name=f"{self.name}-probe")

    def wrapped_informer(self, info: ResourceInfo) -> tuple[Informer, bool]:
        """The watch cache for wrapped objects of `info`'s kind, and whether it is new (the
        caller starts it). Only objects carrying our uid label are listed and watched."""
        key = f"{info.group_version}/{info.kind}"
        existing = self.wrapped.get(key)
        if existing is not None:
            return existing, False
        informer = Informer(
            self.client,
            info,
            label_selector=LABEL_UID,
            transform=lambda obj: self._vouched(_slim_wrapped(obj)),
            # Read only to learn completion and presence, on a change of their AppWrapper.
            cold=lambda _obj: True,
            optional=True,
            monotonic=self.clock.monotonic,
        )
        self.wrapped[key] = informer
        return informer, True

    def deleting(self, uid: str) -> None:
        """The dispatcher asks for the wrapped object `uid` to go: its deletion wakes no one."""
        if uid:
            self._deleting[uid] = None
            if len(self._deleting) > DELETING_KEPT:
                self._deleting.popitem(last=False)

    def _ours(self, uid: str, gone: bool) -> bool:
        """Whether `uid`'s deletion is the dispatcher's own (forgotten once it is gone)."""
        if uid not in self._deleting:
            return False
        if gone:
            del self._deleting[uid]
        return True

    async def wrapped_caches(
        self,
        kinds: Iterable[tuple[str, str]],
        *,
        completion: Iterable[tuple[str, str]] = (),
        on_change: Callable[[str, dict[str, Any] | None, dict[str, Any] | None], None],
        start_task: Callable[[Coroutine[Any, Any, None], str], None],
    ) -> dict[str, Informer]:
        """Watch caches of the wrapped kinds (apiVersion, kind), for their completion and
        their presence, started on first need; a change that can matter is handed to
        `on_change` (the objects are labelled like the pods: it wakes their AppWrapper): a
        deletion, or a change of `deletionTimestamp` or, for the kinds whose completion some
        AppWrapper reads (`completion`, remembered), of the conditions that are True
        (`telling`). A kind unknown to the member has none."""
        caches: dict[str, Informer] = {}
        self._completion_kinds.update(f"{v}/{k}" for v, k in completion)
        for api_version, kind in kinds:
            try:
                info = await self.client.resource_info(api_version, kind)
            except KubeError:
                continue
            informer, new = self.wrapped_informer(info)
            if new:
                key = f"{api_version}/{kind}"
                read = partial(self._completion_kinds.__contains__, key)
                informer.add_handler(telling(on_change, conditions_read=read, ours=self._ours))
                start_task(informer.run(), f"{self.name}-{info.plural}")
            caches[f"{api_version}/{kind}"] = informer
        return caches

    async def _probe(self, every: float = 2.0) -> None:
        """A watch on a server that stopped answering can stay silent for minutes; a short
        request every few seconds tells an outage from a quiet cluster."""
        while True:
            try:
                await self.client.ping(timeout=every * 2)
                self.last_answer = self.clock.monotonic()
            except KubeError:
                pass
            await self.clock.sleep(every)

    async def wait_synced(self) -> None:
        await self.nodes.synced.wait()
        await self.pods.synced.wait()

    @property
    def synced(self) -> bool:
        """Whether its node and pod caches have been listed in full at least once."""
        return self.nodes.synced.is_set() and self.pods.synced.is_set()

    def silent_for(self) -> float:
        """Seconds since the member last answered (0 while it answers). Until its caches
        have synced, since it was started: one that never answers, or forbids the lists,
        is handled like one gone silent."""
        if not self.synced:
            return max(0.0, self.clock.monotonic() - self.started) if self.started else 0.0
        last = max(self.last_answer, min(self.nodes.last_contact, self.pods.last_contact))
        if last == 0:
            return 0.0
        return max(0.0, self.clock.monotonic() - last)

    def lost(self, timeout: float) -> bool:
        """Silent past `timeout`: what runs there is given up on (requeued elsewhere, its
        copies removed when it answers again). Never the hub: the dispatcher reads and
        writes through it, so while it is silent nothing is decided at all."""
        return not self.is_hub and self.silent_for() > timeout

    def reachable(self, *, grace: float = 6.0) -> bool:
        """Synced and answering within `grace` seconds: only such a member gets new
        dispatches (never one whose pods are not all known)."""
        return self.synced and self.silent_for() < grace
