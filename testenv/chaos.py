"""Faults, crashes and a kubelet for randomized controller tests on `FakeEnv`. No I/O.

`Chaos` wraps the write methods of an env's `FakeKube` (on the instance; the class is not
touched) to tell the controller's writes from the test's own, to kill the leader at an
exact write (`crash_after(k)`: the next `k` writes land, the one after fails and so does every
later write of that leader, as if its process died), and to record every eviction and
admission written on an AppWrapper. `Kubelet` plays the workload controllers, the
kube-scheduler and the kubelets: it makes the pods of wrapped Deployments and Jobs, binds
them only where they fit, runs and finishes them, and removes the pods of deleted objects.

Which leader a request comes from is carried in a context variable: tasks inherit the
context they were created in, so the background work of a dead leader stays dead after
`restart()` starts a new one.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dispatcher.api.constants import LABEL_UID
from dispatcher.api.quantity import parse_milli
from dispatcher.cluster.member import PODS
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError, Unreachable
from testenv.fakeenv import APPWRAPPER, NAMESPACE, FakeEnv

Obj = dict[str, Any]
OBJECT_UID = "chaos.testing/object-uid"
"""Label on each pod: the uid of the wrapped object it was made for."""
KUBELET_FINALIZER = "chaos.testing/kubelet"
"""On each pod: it goes only once the kubelet has finished it (`Kubelet.collect`), so that a
pod whose object was deleted terminates for a while with a deletionTimestamp, as it does."""
DEPLOYMENTS = ResourceInfo("apps/v1", "Deployment", "deployments", namespaced=True)
JOBS = ResourceInfo("batch/v1", "Job", "jobs", namespaced=True)
WRAPPED_KINDS = (DEPLOYMENTS, JOBS)
TERMINAL = ("Succeeded", "Failed")

_LEADER: contextvars.ContextVar[int] = contextvars.ContextVar("chaos_leader", default=0)
_TEST: contextvars.ContextVar[bool] = contextvars.ContextVar("chaos_test", default=False)


@dataclass(frozen=True, slots=True)
class Eviction:
    """A status write that made `victim` Preempted for `preemptor`."""

    victim: str
    victim_uid: str
    preemptor: str
    round: int
    at: float


@dataclass
class Chaos:
    """Leader crashes at exact writes, and a record of evictions and admissions."""

    env: FakeEnv
    round: int = 0
    """Bumped by the test at each scheduling cycle: evictions of one cycle are one set."""
    leader: int = 0
    crashed: bool = False
    controller_writes: int = 0
    errors: int = 0
    """Writes of the controller that raised (injected faults, conflicts, the crash)."""
    evictions: list[Eviction] = field(default_factory=list)
    admissions: list[tuple[str, int]] = field(default_factory=list)
    """(key, how many evictions were recorded before) of each write that dispatched it."""
    violations: list[str] = field(default_factory=list)
    """Evictions for a preemptor while an earlier set's room was still being freed."""
    claim_seconds: float = 120.0
    _crash_in: int | None = None
    _originals: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fake = self.env.fake
        self._originals = {
            "create": fake.create,
            "replace": fake.replace,
            "merge_patch": fake.merge_patch,
            "delete": fake.delete,
        }
        fake.create = self._create  # type: ignore[method-assign]
        fake.replace = self._replace  # type: ignore[method-assign]
        fake.merge_patch = self._merge_patch  # type: ignore[method-assign]
        fake.delete = self._delete  # type: ignore[method-assign]

    # -- controls -----------------------------------------------------------------------

    @contextlib.contextmanager
    def as_test(self) -> Iterator[None]:
        """Writes made inside are the test's (a kubelet's, a user's): never failed, never
        counted, never a crash point."""
        token = _TEST.set(True)
        try:
            yield
        finally:
            _TEST.reset(token)

    def crash_after(self, writes: int) -> None:
        """The leader dies after `writes` more writes of its own."""
        self._crash_in = writes

    def disarm(self) -> None:
        """No crash armed any more."""
        self._crash_in = None

    def crash(self) -> None:
        """The leader dies now."""
        self.crashed = True
        self._crash_in = None

    async def restart(self) -> None:
        """A new leader; whatever the old one still had running can write nothing more."""
        self.leader += 1
        _LEADER.set(self.leader)
        self.crashed = False
        self._crash_in = None
        await self.env.restart()

    # -- the wrapped writes -------------------------------------------------------------

    def _gate(self, kind: str) -> bool:
        """Whether this write is the controller's; raises if its leader is dead."""
        if _TEST.get() or kind == "Event":
            return False
        if self.crashed or _LEADER.get() < self.leader:
            raise Unreachable("chaos: the leader that sent this has crashed")
        if self._crash_in is not None:
            if self._crash_in == 0:
                self.crash()
                raise Unreachable("chaos: the leader crashed before this write")
            self._crash_in -= 1
        self.controller_writes += 1
        return True

    async def _create(
        self, info: ResourceInfo, namespace: str | None, body: Any, *, field_manager: str = ""
    ) -> Obj:
        controller = self._gate(info.kind)
        try:
            result: Obj = await self._originals["create"](
                info, namespace, body, field_manager=field_manager
            )
        except KubeError:
            self.errors += controller
            raise
        return result

    async def _merge_patch(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        patch: Any,
        sub: str = "",
        *,
        field_manager: str = "",
    ) -> Obj:
        controller = self._gate(info.kind)
        try:
            result: Obj = await self._originals["merge_patch"](
                info, namespace, name, patch, sub, field_manager=field_manager
            )
        except KubeError:
            self.errors += controller
            raise
        return result

    async def _delete(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        uid: str | None = None,
    ) -> bool:
        controller = self._gate(info.kind)
        try:
            gone: bool = await self._originals["delete"](
                info, namespace, name, propagation=propagation, uid=uid
            )
            return gone
        except KubeError:
            self.errors += controller
            raise

    async def _replace(
        self, info: ResourceInfo, namespace: str | None, name: str, body: Any, sub: str = ""
    ) -> Obj:
        controller = self._gate(info.kind)
        before = None
        if info.kind == APPWRAPPER[1]:
            before = next((o for o in self.env.objects(*APPWRAPPER) if name_of(o) == name), None)
        try:
            result: Obj = await self._originals["replace"](info, namespace, name, body, sub)
        except KubeError:
            self.errors += controller
            raise
        if before is not None:
            self._note(before, result)
        return result

    def _note(self, before: Obj, after: Obj) -> None:
        key = f"{after['metadata']['namespace']}/{name_of(after)}"
        was, now = true_conditions(before), true_conditions(after)
        if "Preempted" in now and "Preempted" not in was:
            eviction = Eviction(
                victim=key,
                victim_uid=after["metadata"]["uid"],
                preemptor=str((after.get("status") or {}).get("preemptedBy") or ""),
                round=self.round,
                at=self.env.clock.time(),
            )
            self._judge(eviction)
            self.evictions.append(eviction)
        if "Dispatched" in now and "Dispatched" not in was:
            self.admissions.append((key, len(self.evictions)))

    def _judge(self, eviction: Eviction) -> None:
        """An eviction for a preemptor whose earlier victims (chosen in another cycle,
        since its last admission) still hold their room is a second set for one need."""
        admitted = max((n for key, n in self.admissions if key == eviction.preemptor), default=0)
        earlier = [
            e
            for e in self.evictions[admitted:]
            if e.preemptor == eviction.preemptor and e.round != eviction.round
        ]
        for previous in earlier:
            if eviction.at - previous.at <= self.claim_seconds and self._holds(previous):
                self.violations.append(
                    f"{eviction.victim} evicted for {eviction.preemptor} in cycle "
                    f"{eviction.round} while {previous.victim}, evicted for it in cycle "
                    f"{previous.round}, still holds its room"
                )

    def _holds(self, eviction: Eviction) -> bool:
        """Whether a victim still holds the room it is to free for its preemptor."""
        victim = next(
            (
                o
                for o in self.env.objects(*APPWRAPPER)
                if o["metadata"]["uid"] == eviction.victim_uid
            ),
            None,
        )
        if victim is None:
            return False
        status = victim.get("status") or {}
        true = true_conditions(victim)
        if status.get("preemptedBy") != eviction.preemptor or "Preempted" not in true:
            return False
        if "Dispatched" in true:
            return True
        return any(
            holds_room(p) and owner_uid(p) == eviction.victim_uid
            for p in self.env.objects("v1", "Pod")
        )


def name_of(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def true_conditions(obj: Obj) -> set[str]:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return {str(c.get("type")) for c in conditions if c.get("status") == "True"}


def cpu_milli(pod_or_template: Obj) -> int:
    """The CPU requests of a pod (or pod template), in millicores."""
    containers = (pod_or_template.get("spec") or {}).get("containers") or []
    return sum(
        parse_milli(((c.get("resources") or {}).get("requests") or {}).get("cpu", 0))
        for c in containers
    )


def desired_pods(obj: Obj) -> int:
    """Pods a Deployment (replicas) or Job (parallelism) runs at once."""
    spec = obj.get("spec") or {}
    return int(spec.get("replicas", spec.get("parallelism", 1)))


def holds_room(pod: Obj) -> bool:
    return bool(pod["spec"].get("nodeName")) and pod_phase(pod) not in TERMINAL


def pod_phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


class Kubelet:
    """Workload controllers, kube-scheduler and kubelets for `FakeEnv`, step by step.

    Pods are made per wrapped object (a Deployment's replicas, a Job's parallelism; a Job's
    succeeded pods are not made again), bound first-fit to a node whose allocatable CPU
    still has room for them (else left Pending and unbound), and named uniquely. Each is
    owned by its object: deleting the object marks them deleting at once (the garbage
    collector), and they terminate until `collect` (the kubelet).
    """

    def __init__(self, env: FakeEnv, chaos: Chaos, rng: random.Random) -> None:
        self.env = env
        self.chaos = chaos
        self.rng = rng
        self._names = itertools.count()

    def wrapped(self) -> list[Obj]:
        return [
            o for info in WRAPPED_KINDS for o in self.env.objects(info.group_version, info.kind)
        ]

    def pods(self) -> list[Obj]:
        return self.env.objects("v1", "Pod")

    def free(self) -> dict[str, int]:
        """Allocatable CPU minus the requests of the bound pods not finished, per node."""
        room = {
            name_of(n): parse_milli(n["status"]["allocatable"].get("cpu", 0))
            for n in self.env.objects("v1", "Node")
        }
        for pod in self.pods():
            if holds_room(pod):
                room[pod["spec"]["nodeName"]] -= cpu_milli(pod)
        return room

    def _node_for(self, cpu: int, room: dict[str, int]) -> str:
        nodes = sorted(room)
        self.rng.shuffle(nodes)
        return next((n for n in nodes if room[n] >= cpu), "")

    async def make_pods(self, *, limit: int | None = None) -> list[str]:
        """Create the missing pods of wrapped objects (up to `limit`), bound where they fit."""
        made: list[str] = []
        room = self.free()
        pods = self.pods()
        with self.chaos.as_test():
            for obj in self.wrapped():
                uid = obj["metadata"]["uid"]
                mine = [
                    p
                    for p in pods
                    if p["metadata"]["labels"].get(OBJECT_UID) == uid and pod_phase(p) != "Failed"
                ]
                template = obj["spec"]["template"]
                cpu = cpu_milli(template)
                for _ in range(desired_pods(obj) - len(mine)):
                    if limit is not None and len(made) >= limit:
                        return made
                    node = self._node_for(cpu, room)
                    if node:
                        room[node] -= cpu
                    name = f"{name_of(obj)}-{next(self._names)}"
                    labels = {**(template.get("metadata") or {}).get("labels", {})}
                    labels[OBJECT_UID] = uid
                    spec: Obj = {**template["spec"]}
                    if node:
                        spec["nodeName"] = node
                    owner = {
                        "apiVersion": obj["apiVersion"],
                        "kind": obj["kind"],
                        "name": name_of(obj),
                        "uid": uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                    pod = {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": name,
                            "labels": labels,
                            "ownerReferences": [owner],
                            "finalizers": [KUBELET_FINALIZER],
                        },
                        "spec": spec,
                    }
                    await self.env.fake.create(PODS, NAMESPACE, pod)
                    await self.env.set_pod_phase([name], "Pending")
                    made.append(name)
        return made

    async def bind(self) -> list[str]:
        """Bind pending unbound pods where they now fit."""
        bound = []
        room = self.free()
        with self.chaos.as_test():
            for pod in self.pods():
                if pod["spec"].get("nodeName") or pod_phase(pod) in TERMINAL:
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    continue  # on its way out: kube-scheduler binds no deleted pod
                node = self._node_for(cpu_milli(pod), room)
                if node:
                    room[node] -= cpu_milli(pod)
                    patch = {"spec": {"nodeName": node}}
                    await self.env.fake.merge_patch(PODS, NAMESPACE, name_of(pod), patch)
                    bound.append(name_of(pod))
        return bound

    async def start(self, share: float = 1.0) -> list[str]:
        """Bound Pending pods start Running (each with probability `share`)."""
        names = [
            name_of(p)
            for p in self.pods()
            if p["spec"].get("nodeName") and pod_phase(p) == "Pending" and self.rng.random() < share
        ]
        with self.chaos.as_test():
            await self.env.set_pod_phase(names, "Running")
        return names

    async def finish(self, share: float = 1.0) -> list[str]:
        """Running pods of Jobs succeed (each with probability `share`); a Job all of whose
        pods succeeded reports Complete."""
        jobs = {o["metadata"]["uid"]: o for o in self.env.objects(JOBS.group_version, JOBS.kind)}
        pods = self.pods()
        names = [
            name_of(p)
            for p in pods
            if p["metadata"]["labels"].get(OBJECT_UID) in jobs
            and pod_phase(p) == "Running"
            and self.rng.random() < share
        ]
        with self.chaos.as_test():
            await self.env.set_pod_phase(names, "Succeeded")
            for uid, job in jobs.items():
                succeeded = [
                    p
                    for p in self.pods()
                    if p["metadata"]["labels"].get(OBJECT_UID) == uid
                    and pod_phase(p) == "Succeeded"
                ]
                done = (job.get("status") or {}).get("conditions")
                if len(succeeded) >= desired_pods(job) and not done:
                    complete = {"conditions": [{"type": "Complete", "status": "True"}]}
                    await self.env.fake.merge_patch(
                        JOBS, NAMESPACE, name_of(job), {"status": complete}, sub="status"
                    )
        return names

    async def collect(self, share: float = 1.0) -> list[str]:
        """Pods being deleted, or whose object is gone, finish terminating and go (each
        with probability `share`): the kubelet's part of a deletion."""
        live = {o["metadata"]["uid"] for o in self.wrapped()}
        names = [
            name_of(p)
            for p in self.pods()
            if (
                p["metadata"].get("deletionTimestamp")
                or p["metadata"]["labels"].get(OBJECT_UID) not in live
            )
            and self.rng.random() < share
        ]
        with self.chaos.as_test():
            for name in names:
                await self.env.fake.delete(PODS, NAMESPACE, name)
                patch = {"metadata": {"finalizers": None}}
                await self.env.fake.merge_patch(PODS, NAMESPACE, name, patch)
        return names


def appwrapper_uids(env: FakeEnv) -> dict[str, str]:
    """uid -> name of every AppWrapper stored."""
    return {o["metadata"]["uid"]: name_of(o) for o in env.objects(*APPWRAPPER)}


def owner_uid(obj: Obj) -> str:
    return str((obj["metadata"].get("labels") or {}).get(LABEL_UID) or "")


__all__ = [
    "OBJECT_UID",
    "Chaos",
    "Eviction",
    "Kubelet",
    "appwrapper_uids",
    "cpu_milli",
    "desired_pods",
    "holds_room",
    "name_of",
    "owner_uid",
    "pod_phase",
    "true_conditions",
]
