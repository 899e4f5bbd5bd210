"""An in-memory Kubernetes API server for fast controller tests. No I/O.

`FakeKube` satisfies `dispatcher.kube.api.KubeApi`, the Protocol `KubeClient` also satisfies,
so code and tests written against a client run on it unchanged (the real `Informer` too). It
keeps objects in dicts and does what kube-apiserver does for the requests the dispatcher
makes: server-set metadata (uid, creationTimestamp, a global resourceVersion, generation),
optimistic concurrency, status subresources, finalizers and deletionTimestamp, owner-reference
garbage collection, label-selected paged lists, and watches from a version (410 Gone once
`compact()` dropped it). Faults are injected with `fail_next` and `unreachable`; `calls`
records every request. Objects are deep-copied in and out, so callers may change what they
hold. Watches wait on asyncio queues: time only passes when the test calls `advance()` (or
on the injected clock), and requests sleep only when `latency` is set.

It does not run controllers (no pods from Jobs, no kubelet): tests play those parts.
`tests/e2e/test_fake_contract.py` runs the same checks against it and a real control plane.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from dispatcher.kube.client import RequestStats, ResourceInfo, well_formed
from dispatcher.kube.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    TooManyRequests,
    UnknownKind,
    Unreachable,
)
from testenv.fakekube_store import (
    BUILTIN_KINDS,
    CLIENT_MANAGER,
    Change,
    Fault,
    KindSpec,
    Obj,
    bookmark,
    copy_json,
    event_for,
    keep_server_fields,
    managed_by,
    merge_patch,
    object_in,
    same_content,
    selector_of,
    sent_as_client,
    take_fault,
    timestamp,
    without,
)

Call = tuple[str, str, str | None, str | None, str]  # (method, kind, namespace, name, sub)
WRITES = ("create", "replace", "merge_patch", "delete")
_Key = tuple[str, str]  # (apiVersion, kind)
_WAKE, _END = "wake", "end"


@dataclass(eq=False)
class _Watcher:
    key: _Key
    queue: asyncio.Queue[Change | str] = field(default_factory=asyncio.Queue)


class FakeKube:
    """An API server in memory; see the module docstring."""

    def __init__(
        self,
        *,
        name: str = "fake",
        clock: Callable[[], float] | None = None,
        namespaces_must_exist: bool = True,
    ) -> None:
        self.name = name
        self.stats = RequestStats({})
        self.calls: list[Call] = []
        self.counts: Counter[str] = Counter()
        self.latency = 0.0
        self.namespaces_must_exist = namespaces_must_exist
        self._clock = clock
        self._now = 0.0
        self._unreachable = False
        self._kinds: dict[_Key, KindSpec] = {}
        self._discovered: dict[_Key, ResourceInfo] = {}
        self._objects: dict[_Key, dict[tuple[str, str], Obj]] = {}
        self._version = 1
        self._compacted = 0
        self._history: list[Change] = []
        self._watchers: set[_Watcher] = set()
        self._faults: list[Fault] = []
        self._snapshots: dict[int, tuple[int, list[Obj]]] = {}
        self._snapshot_ids = count(1)
        for spec in BUILTIN_KINDS:
            self._kinds[(spec.api_version, spec.kind)] = spec
        for namespace in ("default", "kube-system", "kube-public"):
            self._store({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    # -- test controls ----------------------------------------------------------------

    def add_kind(
        self,
        api_version: str,
        kind: str,
        plural: str,
        namespaced: bool,
        *,
        status: bool = False,
        custom: bool = True,
    ) -> None:
        """Serve a kind from now on (a CRD installed). Custom kinds track generation."""
        spec = KindSpec(api_version, kind, plural, namespaced, status, custom, custom)
        self._kinds[(api_version, kind)] = spec

    def remove_kind(self, api_version: str, kind: str) -> None:
        """Stop serving a kind (its CRD deleted): requests get NotFound, discovery UnknownKind
        once a client forgets its cached mapping, as with the real client."""
        self._kinds.pop((api_version, kind), None)
        self._objects.pop((api_version, kind), None)

    def fail_next(
        self,
        method: str,
        *,
        kind: str | None = None,
        name: str | None = None,
        error: KubeError,
        times: int = 1,
    ) -> None:
        """The next `times` requests of `method` (a KubeApi method name) matching `kind` and
        `name` raise `error`. TooManyRequests is retried the way `KubeClient.request` does
        (up to 5 attempts, sleeping its retry_after), and `ping` turns every error into
        Unreachable, also as the client does."""
        self._faults.append(Fault(method, kind, name, error, times))

    @property
    def unreachable(self) -> bool:
        """True: every request raises Unreachable and open watches break."""
        return self._unreachable

    @unreachable.setter
    def unreachable(self, value: bool) -> None:
        self._unreachable = value
        if value:
            self._broadcast(_END)

    def now(self) -> float:
        """The clock watches time out on: the injected one, else seconds of `advance()`."""
        return self._clock() if self._clock else self._now

    def advance(self, seconds: float = 0.0) -> None:
        """Move the built-in clock, and let every watch check its timeout."""
        self._now += seconds
        self._broadcast(_WAKE)

    def end_watches(self) -> None:
        """The server closes every open watch (cleanly, as at timeoutSeconds)."""
        self._broadcast(_END)

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current resourceVersion on every open watch."""
        self._broadcast(str(self._version))

    def compact(self) -> None:
        """Forget history: watches and list pages from older versions get 410 Gone."""
        self._compacted = self._version
        self._history.clear()

    @property
    def resource_version(self) -> str:
        return str(self._version)

    @property
    def writes(self) -> int:
        """Requests that ask for a change (create, replace, merge_patch, delete)."""
        return sum(self.counts[m] for m in WRITES)

    def objects(self, api_version: str, kind: str) -> list[Obj]:
        """Copies of every stored object of a kind, for assertions."""
        return [copy_json(o) for _, o in sorted(self._objects.get((api_version, kind), {}).items())]

    # -- the KubeApi protocol ---------------------------------------------------------

    async def ping(self, timeout: float = 5.0) -> None:
        await self._begin("ping", "GET", "/version", None, None)

    async def resource_info(self, api_version: str, kind: str) -> ResourceInfo:
        if not well_formed(api_version, kind):
            # As the real client: an ill-formed apiVersion or kind never reaches a request.
            raise UnknownKind(f"{api_version!r}/{kind!r} is not a valid apiVersion and kind")
        key = (api_version, kind)
        if key not in self._discovered:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            await self._begin("resource_info", "GET", path, kind, None)
            for spec in self._kinds.values():
                if spec.api_version == api_version:
                    info = ResourceInfo(api_version, spec.kind, spec.plural, spec.namespaced)
                    self._discovered[(api_version, spec.kind)] = info
        if key not in self._discovered:
            raise UnknownKind(f"the server does not serve kind {kind!r} in {api_version!r}")
        return self._discovered[key]

    def forget_discovery(self, api_version: str) -> None:
        for key in [k for k in self._discovered if k[0] == api_version]:
            del self._discovered[key]

    async def get(self, info: ResourceInfo, namespace: str | None, name: str) -> dict[str, Any]:
        spec = await self._request("get", "GET", info, namespace, name)
        return self._out(spec, self._existing(spec, namespace, name))

    async def create(
        self, info: ResourceInfo, namespace: str | None, body: Any, *, field_manager: str = ""
    ) -> dict[str, Any]:
        name = (body.get("metadata") or {}).get("name") if isinstance(body, dict) else None
        spec = await self._request("create", "POST", info, namespace, name)
        obj = object_in(spec, body, namespace, None)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise Invalid("metadata.name: Required value", status=422, reason="Invalid")
        namespaces = self._objects.get(("v1", "Namespace"), {})
        if spec.namespaced and self.namespaces_must_exist and ("", namespace) not in namespaces:
            raise NotFound(f'namespaces "{namespace}" not found', status=404, reason="NotFound")
        if self._key_of(obj) in self._objects.get(spec.key, {}):
            raise AlreadyExists(
                f'{spec.plural} "{meta["name"]}" already exists', status=409, reason="AlreadyExists"
            )
        for server_field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(server_field, None)
        # As the API server: who made the object is recorded under the request's fieldManager
        # (without one, the product name in the client's User-Agent).
        meta["managedFields"] = [managed_by(field_manager or CLIENT_MANAGER, spec.api_version)]
        if spec.status:
            obj.pop("status", None)
        return self._out(spec, self._store(obj))

    async def replace(
        self, info: ResourceInfo, namespace: str | None, name: str, body: Any, sub: str = ""
    ) -> dict[str, Any]:
        spec = await self._request("replace", "PUT", info, namespace, name, sub)
        old = self._existing(spec, namespace, name)
        new = object_in(spec, body, namespace, name)
        given = new["metadata"].get("resourceVersion")
        if not given and spec.custom:
            raise Invalid("metadata.resourceVersion: must be specified for an update", status=422)
        return self._out(spec, self._update(spec, old, new, sub, given))

    async def merge_patch(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        patch: Any,
        sub: str = "",
        *,
        field_manager: str = "",
    ) -> dict[str, Any]:
        spec = await self._request("merge_patch", "PATCH", info, namespace, name, sub)
        old = self._existing(spec, namespace, name)
        if not isinstance(patch, dict):
            raise BadRequest("a merge patch must be a JSON object", status=400)
        given = (patch.get("metadata") or {}).get("resourceVersion")
        new = merge_patch(copy_json(old), copy_json(patch))
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        manager = field_manager or CLIENT_MANAGER
        return self._out(spec, self._update(spec, old, new, sub, given, manager=manager))

    async def delete(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        uid: str | None = None,
    ) -> bool:
        try:
            spec = await self._request("delete", "DELETE", info, namespace, name)
            old = self._existing(spec, namespace, name)
        except NotFound:
            return True  # as KubeClient.delete: already gone
        meta = old["metadata"]
        if uid and meta.get("uid") != uid:
            raise Conflict(
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{meta.get('uid')}",
                status=409,
                reason="Conflict",
            )
        self._delete(spec, old, propagation)
        return not old["metadata"].get("finalizers")

    async def list(
        self,
        info: ResourceInfo,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        spec = await self._request("list", "GET", info, namespace, None)
        query = query or {}
        token = query.get("continue", "")
        if token:  # a later page of the same snapshot, as etcd serves it at the list's version
            snapshot_id, _, offset_text = token.partition(":")
            version, matching = self._snapshots.get(int(snapshot_id), (-1, []))
            if version < self._compacted:
                raise Gone("the provided continue parameter is too old", status=410)
            offset = int(offset_text)
        else:
            selected = selector_of(query)
            snapshot_id, version, offset = str(next(self._snapshot_ids)), self._version, 0
            matching = [
                copy_json(o)
                for (ns, _), o in sorted(self._objects.get(spec.key, {}).items())
                if (not spec.namespaced or not namespace or ns == namespace) and selected(o)
            ]
        limit = int(query.get("limit") or 0) or len(matching)
        page = matching[offset : offset + limit]
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if offset + limit < len(matching):
            self._snapshots[int(snapshot_id)] = (version, matching)
            meta["continue"] = f"{snapshot_id}:{offset + limit}"
            if "labelSelector" not in query and "fieldSelector" not in query:
                meta["remainingItemCount"] = len(matching) - offset - limit
        else:
            self._snapshots.pop(int(snapshot_id), None)
        items = page if spec.custom else [without(o, "kind", "apiVersion") for o in page]
        return {
            "apiVersion": spec.api_version,
            "kind": f"{spec.kind}List",
            "metadata": meta,
            "items": items,
        }

    async def watch(
        self,
        info: ResourceInfo,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        query: Mapping[str, str] | None = None,
        namespace: str | None = None,
        decode_line: Callable[[bytes], Any] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Cluster-wide, or in `namespace`, like KubeClient.watch (with `decode_line`, each
        event goes through JSON text and it, as from the server)."""
        spec = await self._request("watch", "GET", info, namespace, None, watch=True)
        labels_and_fields = selector_of(query)

        def selected(obj: dict[str, Any]) -> bool:
            within = not namespace or (obj.get("metadata") or {}).get("namespace") == namespace
            return within and labels_and_fields(obj)

        deadline = self.now() + timeout_seconds
        start = int(resource_version or 0)
        if start and start < self._compacted:
            raise Gone(f"too old resource version: {start} ({self._compacted})", status=410)
        watcher = _Watcher(spec.key)
        if start:
            backlog = [c for c in self._history if c.version > start and c.key == watcher.key]
        else:  # "0" or "": the current state as ADDED events, then changes
            objects = self._objects.get(watcher.key, {})
            backlog = [
                Change(self._version, watcher.key, "ADDED", None, o)
                for _, o in sorted(objects.items())
            ]
        for change in backlog:
            watcher.queue.put_nowait(change)
        self._watchers.add(watcher)
        try:
            while self.now() < deadline:
                item = await watcher.queue.get()
                if item == _END:
                    if self._unreachable:
                        raise Unreachable(f"{self.name}: watch broke")
                    return
                if isinstance(item, str):
                    if item != _WAKE:
                        yield sent_as_client(
                            {"type": "BOOKMARK", "object": bookmark(spec, item)}, decode_line
                        )
                    continue
                event = event_for(item, selected)
                if event is not None:
                    yield sent_as_client(
                        {"type": event, "object": self._out(spec, item.new)}, decode_line
                    )
        finally:
            self._watchers.discard(watcher)

    # -- the server's rules -----------------------------------------------------------

    async def _request(
        self,
        method: str,
        verb: str,
        info: ResourceInfo,
        namespace: str | None,
        name: str | None,
        sub: str = "",
        *,
        watch: bool = False,
    ) -> KindSpec:
        self.calls.append((method, info.kind, namespace, name, sub))
        path = info.path(namespace, name, sub)
        await self._begin(method, verb, path, info.kind, name, watch=watch)
        spec = self._kinds.get((info.group_version, info.kind))
        if spec is None:
            raise NotFound(f"the server could not find the requested resource ({path})", status=404)
        if spec.namespaced and not namespace and method not in ("list", "watch"):
            raise BadRequest("a namespace is required for a namespaced kind", status=400)
        if sub and (sub != "status" or not spec.status):
            raise NotFound(f"no subresource {sub!r} on {spec.plural}", status=404)
        return spec

    async def _begin(
        self,
        method: str,
        verb: str,
        path: str,
        kind: str | None,
        name: str | None,
        *,
        watch: bool = False,
    ) -> None:
        """Latency, reachability and injected faults, once per attempt (429 is retried)."""
        self.counts[method] += 1
        error: KubeError | None = None
        for _attempt in range(5):
            await asyncio.sleep(self.latency)
            self.stats.record(verb, path, watch=watch)
            if self._unreachable:
                raise Unreachable(f"{self.name}: connection refused")
            error = take_fault(self._faults, method, kind, name)
            if error is None:
                return
            if method == "ping":
                raise Unreachable(f"{self.name}: /version answered {error.status}") from error
            if not isinstance(error, TooManyRequests) or method == "watch":
                raise error
            await asyncio.sleep(min(error.retry_after, 10))
        assert error is not None
        raise error

    def _existing(self, spec: KindSpec, namespace: str | None, name: str) -> Obj:
        found = self._objects.get(spec.key, {}).get((spec.scope(namespace), name))
        if found is None:
            raise NotFound(f'{spec.plural} "{name}" not found', status=404, reason="NotFound")
        return found

    def _update(
        self,
        spec: KindSpec,
        old: Obj,
        new: Obj,
        sub: str,
        given: str | None,
        *,
        manager: str | None = None,
    ) -> Obj:
        """PUT or PATCH: preconditions, subresource rules, server fields, then store."""
        old_meta, meta = old["metadata"], new["metadata"]
        if given and given != old_meta["resourceVersion"]:
            raise Conflict(
                f'Operation cannot be fulfilled on {spec.plural} "{old_meta["name"]}": the object '
                "has been modified; please apply your changes to the latest version and try again",
                status=409,
                reason="Conflict",
            )
        if meta.get("uid", old_meta["uid"]) != old_meta["uid"]:
            raise Conflict(f"Precondition failed: UID in object meta: {meta['uid']}", status=409)
        if sub == "status":  # only status changes; the rest stays as stored
            status = new.get("status")
            new = copy_json(old)
            new.pop("status", None)
            if status is not None:
                new["status"] = status
        elif spec.status:  # the main resource does not change status
            new.pop("status", None)
            if "status" in old:
                new["status"] = copy_json(old["status"])
        meta = new["metadata"]
        keep_server_fields(old_meta, meta, manager, spec.api_version)
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise Invalid(
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the "
                    "object is being deleted",
                    status=422,
                )
        ignored = ("metadata", "status") if spec.status else ("metadata",)
        if spec.generation and without(old, *ignored) != without(new, *ignored):
            meta["generation"] = old_meta.get("generation", 1) + 1
        if same_content(old, new):
            return old
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._remove(spec, new, "Background")
            return new
        return self._store(new, old)

    def _store(self, obj: Obj, old: Obj | None = None) -> Obj:
        """Keep a new or changed object at the next resourceVersion, and tell watchers."""
        key = (obj["apiVersion"], obj["kind"])
        spec = self._kinds[key]
        meta = obj["metadata"]
        self._version += 1
        meta["resourceVersion"] = str(self._version)
        if old is None:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = timestamp()
            if spec.generation:
                meta["generation"] = 1
        self._objects.setdefault(key, {})[self._key_of(obj)] = obj
        self._record(Change(self._version, key, "MODIFIED" if old else "ADDED", old, obj))
        return obj

    def _delete(self, spec: KindSpec, obj: Obj, propagation: str) -> None:
        """A DELETE: gone at once without finalizers; else marked (generation bumped)."""
        meta = obj["metadata"]
        if not meta.get("finalizers"):
            self._remove(spec, obj, propagation)
        elif not meta.get("deletionTimestamp"):
            new = copy_json(obj)
            new["metadata"].update(deletionTimestamp=timestamp(), deletionGracePeriodSeconds=0)
            if spec.generation:
                new["metadata"]["generation"] = meta.get("generation", 1) + 1
            self._store(new, obj)

    def _remove(self, spec: KindSpec, obj: Obj, propagation: str) -> None:
        """Delete for good; dependents follow unless orphaned (the garbage collector's job),
        and a namespace's objects with it."""
        key = spec.key
        self._version += 1
        gone = copy_json(obj)
        gone["metadata"]["resourceVersion"] = str(self._version)
        previous = self._objects[key].pop(self._key_of(obj))
        self._record(Change(self._version, key, "DELETED", previous, gone))
        uid, name = obj["metadata"].get("uid"), obj["metadata"]["name"]
        is_namespace = key == ("v1", "Namespace")
        for other_key, objects in list(self._objects.items()):
            for other_name, other in list(objects.items()):
                other_meta = other["metadata"]
                owners = other_meta.get("ownerReferences") or []
                owned = propagation != "Orphan" and any(r.get("uid") == uid for r in owners)
                live = objects.get(other_name) is other  # not already gone in this sweep
                if live and ((is_namespace and other_name[0] == name) or owned):
                    self._delete(self._kinds[other_key], other, "Background")

    def _record(self, change: Change) -> None:
        self._history.append(change)
        for watcher in self._watchers:
            if watcher.key == change.key:
                watcher.queue.put_nowait(change)

    def _broadcast(self, item: str) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(item)

    def _key_of(self, obj: Obj) -> tuple[str, str]:
        meta = obj["metadata"]
        return (meta.get("namespace") or "", meta["name"])

    def _out(self, spec: KindSpec, obj: Obj) -> Obj:
        result = copy_json(obj)
        result["kind"], result["apiVersion"] = spec.kind, spec.api_version
        return result
