"""Member clusters' upkeep: wake the reconciler for AppWrappers stranded on a silent
member (it requeues them), and remove wrapped objects whose hub AppWrapper is gone or now
lives elsewhere.

Side effects: lists and deletes wrapped objects in member clusters: in the namespaces its
`namespaces` mapping names (everywhere with "*"), so a member that grants the dispatcher
rights in those namespaces only is swept too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog

from dispatcher.api.constants import LABEL_UID
from dispatcher.clock import Clock
from dispatcher.cluster.member import Member
from dispatcher.cluster.objects import made_by_dispatcher
from dispatcher.kube.errors import KubeError, UnknownKind, Unreachable

COLLECT_EVERY = 60.0
"""Seconds between sweeps of a member for objects no hub AppWrapper places there."""

# Where each allowed kind usually lives; kinds seen in AppWrappers are added at run time.
KNOWN_KINDS: tuple[tuple[str, str], ...] = (
    ("v1", "Pod"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "ServiceAccount"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"),
    ("apps/v1", "ReplicaSet"),
    ("batch/v1", "Job"),
    ("networking.k8s.io/v1", "Ingress"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    ("ray.io/v1", "RayCluster"),
    ("ray.io/v1", "RayJob"),
    ("ray.io/v1", "RayService"),
    ("kubeflow.org/v1", "PyTorchJob"),
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"),
    ("scheduling.sigs.k8s.io/v1alpha1", "PodGroup"),
    ("route.openshift.io/v1", "Route"),
)


async def collect(
    member: Member,
    *,
    kinds: Iterable[tuple[str, str]],
    keep: Mapping[str, tuple[str, str]],
) -> list[str]:
    """Delete objects the dispatcher made for an AppWrapper that `keep` does not place in
    this member.

    `keep` maps AppWrapper key -> (uid, member it is dispatched or being dispatched to).
    Objects are looked for where the member's mapping puts some hub namespace's objects,
    and only those in the namespace their AppWrapper's namespace maps to are its
    (`Member.owner`). Returns "Kind ns/name" of what was deleted.
    """
    client = member.client
    own = member.own_namespaces
    where: tuple[str | None, ...] = (None,) if own is None else own
    deleted: list[str] = []
    for api_version, kind in sorted(set(kinds)):
        try:
            info = await client.resource_info(api_version, kind)
        except UnknownKind:
            continue
        items: list[dict[str, Any]] = []
        for namespace in where:
            try:
                listing = await client.list(
                    info, namespace=namespace, query={"labelSelector": LABEL_UID}
                )
            except Unreachable:
                raise  # the member went quiet: try again when it answers
            except KubeError:
                continue
            items += listing.get("items", [])
        for obj in items:
            owner = member.owner(obj.get("metadata") or {})
            if owner is None or not made_by_dispatcher(obj):
                # Someone else's object wearing our labels: not ours to delete. (Pods of
                # wrapped controllers go with their owner through the garbage collector.)
                continue
            key, uid = owner
            wanted = keep.get(key)
            if wanted is not None and wanted == (uid, member.name):
                continue
            meta = obj["metadata"]
            await client.delete(info, meta.get("namespace"), meta["name"], uid=meta.get("uid"))
            deleted.append(f"{kind} {meta.get('namespace')}/{meta['name']}")
    return deleted


Obj = dict[str, Any]


class Upkeep:
    """Every `every` seconds: hand AppWrappers on a member silent past the timeout to the
    reconciler; sweep answering members for orphans (now and then, and when one comes back)."""

    def __init__(
        self,
        *,
        members: Mapping[str, Member],
        clock: Clock,
        timeout: float,
        reconcile: Callable[[str], None],
        current: Callable[[str], Obj | None],
        appwrappers: Callable[[], Iterable[str]],
        dispatched: Callable[[], Iterable[str]],
        assumed_cluster: Callable[[str], str | None],
    ) -> None:
        """`current`: the newest AppWrapper of a key; `appwrappers`: every key the hub holds;
        `dispatched`: those dispatched or being evicted; `assumed_cluster`: the member an
        admission in flight sends it to."""
        self._members = members
        self._clock = clock
        self._timeout = timeout
        self._reconcile = reconcile
        self._current = current
        self._appwrappers = appwrappers
        self._dispatched = dispatched
        self._assumed_cluster = assumed_cluster
        self._collected: dict[str, float] = {}
        self._lost: set[str] = set()
        self._collecting: dict[str, asyncio.Task[None]] = {}
        self._log = structlog.get_logger("upkeep")

    def fence(self) -> None:
        """Cancel the collections in flight (they delete objects)."""
        for task in list(self._collecting.values()):
            task.cancel()

    async def run(self, every: float = 2.0) -> None:
        while True:
            await self._clock.sleep(every)
            self.tick()

    def tick(self) -> None:
        for member in self._members.values():
            if member.is_hub:
                continue  # objects there are owned by their AppWrapper (garbage collector)
            if member.lost(self._timeout):
                self._lost.add(member.name)
                for key in self.stranded_on(member.name):
                    self._reconcile(key)
                continue
            if not member.reachable() or member.name in self._collecting:
                continue
            came_back = member.name in self._lost
            now = self._clock.monotonic()
            due = now - self._collected.get(member.name, -COLLECT_EVERY) >= COLLECT_EVERY
            if came_back or due:
                self._lost.discard(member.name)
                self._collected[member.name] = now
                # In the background: a member that stops answering mid-sweep must not hold
                # up handing over the work stranded on others.
                task = asyncio.get_running_loop().create_task(self._collect(member))
                self._collecting[member.name] = task

    def stranded_on(self, member: str) -> list[str]:
        """The AppWrappers dispatched (or being evicted) to `member`."""
        stranded = []
        for key in list(self._dispatched()):
            obj = self._current(key)
            if obj is not None and (obj.get("status") or {}).get("clusterName") == member:
                stranded.append(key)
        return stranded

    def object_homes(self) -> tuple[dict[str, tuple[str, str]], set[tuple[str, str]]]:
        """(AppWrapper key -> (uid, member it is or is being dispatched to), the kinds their
        templates name), read from the objects as stored: a sweep must not wait for (nor
        fail on) validating each."""
        keep: dict[str, tuple[str, str]] = {}
        kinds: set[tuple[str, str]] = set()
        for key in list(self._appwrappers()):
            obj = self._current(key)
            if obj is None:
                continue
            meta = obj["metadata"]
            kinds.update(_kinds_named(obj))
            cluster = self._assumed_cluster(key) or (obj.get("status") or {}).get("clusterName")
            if cluster and not meta.get("deletionTimestamp"):
                keep[key] = (meta.get("uid", ""), cluster)
        return keep, kinds

    async def _collect(self, member: Member) -> None:
        keep, kinds = self.object_homes()
        try:
            deleted = await collect(member, kinds=kinds | set(KNOWN_KINDS), keep=keep)
        except KubeError as exc:
            self._log.warning("collection_failed", cluster=member.name, error=str(exc)[:200])
            return
        finally:
            del self._collecting[member.name]
        for what in deleted:
            self._log.info("collected_orphan", cluster=member.name, object=what)


def _kinds_named(obj: Obj) -> set[tuple[str, str]]:
    """(apiVersion, kind) of each template of a stored AppWrapper that names both."""
    kinds = set()
    for item in ((obj.get("spec") or {}).get("resources") or {}).get("GenericItems") or []:
        template = item.get("generictemplate") if isinstance(item, dict) else None
        if isinstance(template, dict) and template.get("apiVersion") and template.get("kind"):
            kinds.add((str(template["apiVersion"]), str(template["kind"])))
    return kinds
