"""A list+watch cache of one resource type in one cluster.

Side effects: long-running watch requests to one API server.

List once (in pages), then watch from the list's resourceVersion with bookmarks; when the server
answers 410 Gone, relist and emit the difference, so handlers never miss a change.
Handlers only record or enqueue (they must be quick and must not mutate objects).
An optional `transform` slims each object on arrival and an optional `cold` test picks the
objects kept as compact text (see `store.py`), both to bound memory. A list page is decoded
whole before anything is slimmed: with `page_bytes`, the pages are sized by what the last
one weighed, so a few hundred objects at etcd's 1.5 MiB limit never arrive at once.

With a `lazy` transform (the same result, over a lazily decoded object: `lazyjson.py`), each
watch event is decoded only as far as that transform reads; what it cannot read is decoded
whole and goes through `transform` as before. Lists are decoded whole (once per relist).

Objects are user data: a transform or handler that fails on one of them is logged (once per
version of that object) and the watch carries on with the raw object, since ending the
watch would only read the same object again on every restart, a crash loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog

from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import Forbidden, Gone, KubeError, NotFound
from dispatcher.kube.jsoncodec import decode
from dispatcher.kube.lazyjson import LazyEvents, LazyTransform
from dispatcher.kube.store import ObjectStore

Obj = dict[str, Any]
FIRST_PAGE_OF_UNKNOWN_SIZE = 10
"""With `page_bytes`: objects asked for before their size is known."""
ABSENT_RETRY_SECONDS = 30.0
"""How often a cache of a kind that is not installed looks for it again."""
Handler = Callable[[str, Obj | None, Obj | None], None]
"""(event type, old, new): ADDED has old None, DELETED has new None."""
_KEPT = "kept"
_TRANSFORMED = object()
"""`event[_KEPT] is _TRANSFORMED`: the event's object went through the lazy transform (no
decoded JSON holds this value)."""


def object_key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


class Informer:
    """Keeps `store` (key -> object) equal to the server's view, calling handlers on change."""

    def __init__(
        self,
        client: KubeApi,
        info: ResourceInfo,
        *,
        label_selector: str = "",
        field_selector: str = "",
        transform: Callable[[Obj], Obj] | None = None,
        lazy: LazyTransform | None = None,
        cold: Callable[[Obj], bool] | None = None,
        watch_timeout: int = 300,
        page_size: int = 500,
        page_bytes: int | None = None,
        optional: bool = False,
        absent_ok: bool = False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.info = info
        self._cold = cold
        self.store = ObjectStore(cold)
        self.synced = asyncio.Event()
        self._monotonic = monotonic
        self.last_contact = 0.0  # monotonic time of the last answer from the server
        self.relists = 0
        self.resource_version = ""
        """The last version the cache is known to reflect (where a watch resumes)."""
        self._query: dict[str, str] = {}
        if label_selector:
            self._query["labelSelector"] = label_selector
        if field_selector:
            self._query["fieldSelector"] = field_selector
        self._transform = transform
        self._lazy = LazyEvents(lazy) if lazy is not None else None
        self._handlers: list[Handler] = []
        self._watch_timeout = watch_timeout
        self._page_size = page_size
        self._page_bytes = page_bytes
        self._optional = optional
        self.permitted = True
        """False once an optional cache was refused its list: it will never sync."""
        self._absent_ok = absent_ok
        self._log = structlog.get_logger("informer").bind(cluster=client.name, resource=info.plural)
        self._reported: dict[tuple[str, str], None] = {}
        """(key, resourceVersion) of objects whose failure was logged, most recent last."""

    def get(self, key: str) -> Obj | None:
        """The object of `key` in the cache now (through the store a relist replaces)."""
        return self.store.get(key)

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def _emit(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        for handler in self._handlers:
            try:
                handler(kind, old, new)
            except Exception as exc:  # one object must not stop the watch
                self._report("handler_failed", new if new is not None else old, exc)

    def _accept(self, obj: Obj) -> Obj:
        if self._transform is None:
            return obj
        try:
            return self._transform(obj)
        except Exception as exc:  # keep the raw object rather than stop
            self._report("transform_failed", obj, exc)
            return obj

    def _report(self, event: str, obj: Obj | None, exc: Exception) -> None:
        """Log a failure on one object, once per version of it."""
        try:
            key = object_key(obj or {})
        except Exception:  # an object without a name still gets a line
            key = "?"
        stamp = (key, _version(obj or {}))
        if stamp in self._reported:
            return
        self._reported[stamp] = None
        if len(self._reported) > 1000:
            del self._reported[next(iter(self._reported))]
        self._log.error(event, key=key, error=f"{type(exc).__name__}: {str(exc)[:300]}")

    async def run(self) -> None:
        """List and watch until cancelled; reconnects with backoff when the server is away.

        A watch that fails resumes from the last resourceVersion it delivered: relisting
        everything (thousands of objects) on every timeout of an overloaded server would only
        load it more. Only 410 Gone (that version is compacted away) costs a relist."""
        backoff = 0.2
        while True:
            try:
                if not self.resource_version:
                    self.resource_version = await self._relist()
                while True:
                    await self._watch_from(self.resource_version)
                    backoff = 0.2
            except Gone:
                self._log.debug("watch_expired_relisting")
                self.resource_version = ""
            except KubeError as exc:
                if self._optional and isinstance(exc, Forbidden):
                    # A cache the caller can do without (it reads by GET instead): not being
                    # allowed to list is an answer, not an outage to retry forever.
                    self._log.info("watch_not_permitted", error=str(exc)[:300])
                    self.permitted = False
                    return
                if self._absent_ok and isinstance(exc, NotFound | Forbidden) and not self.store:
                    # The kind is not installed (an optional CRD), or not ours to read: that
                    # is an empty cache, synced; it is looked for again now and then.
                    if not self.synced.is_set():
                        self._log.info("resource_not_available", error=str(exc)[:200])
                    self.synced.set()
                    await asyncio.sleep(ABSENT_RETRY_SECONDS)
                    continue
                self._log.warning("watch_failed", error=str(exc)[:300], retry_in=round(backoff, 2))
                # Real time, as the transport's: how soon a failed connection is tried again
                # (spares the API server), not when the controller decides anything.
                await asyncio.sleep(backoff * (1 + random.random() / 2))
                backoff = min(backoff * 2, 10.0)

    async def _relist(self) -> str:
        fresh = ObjectStore(self._cold)
        kind = self.info.kind
        api_version = self.info.group_version
        token = ""
        limit = self._page_size
        if self._page_bytes is not None:
            limit = min(limit, FIRST_PAGE_OF_UNKNOWN_SIZE)
        while True:
            # In pages: one answer holding 10k AppWrappers would be a body of tens of MB,
            # decoded at once, and the process's peak memory would keep its size.
            query = {**self._query, "limit": str(limit)}
            if token:
                query["continue"] = token
            listing = await self.client.list(self.info, query=query)
            self.last_contact = self._monotonic()
            if self._page_bytes is not None:
                limit = self._next_limit(listing.get("items") or [])
            for item in listing.get("items", []):
                # Items of a list carry no kind/apiVersion; fill them so handlers see whole
                # objects.
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", api_version)
                fresh[object_key(item)] = self._accept(item)
            token = str(listing.get("metadata", {}).get("continue") or "")
            if not token:
                break
        self.relists += 1
        old_store = self.store
        self.store = fresh
        for key, obj in fresh.items():
            previous = old_store.get(key)
            if previous is None:
                self._emit("ADDED", None, obj)
            elif _version(previous) != _version(obj):
                self._emit("MODIFIED", previous, obj)
        for key, obj in old_store.items():
            if key not in fresh:
                self._emit("DELETED", obj, None)
        self.synced.set()
        return str(listing.get("metadata", {}).get("resourceVersion", ""))

    def _next_limit(self, items: list[Obj]) -> int:
        """Objects in the next page: as many as `page_bytes` holds at this page's mean
        size (at least one, at most `page_size`)."""
        assert self._page_bytes is not None
        if not items:
            return self._page_size
        try:
            size = len(orjson.dumps(items))
        except (orjson.JSONEncodeError, TypeError):  # too deep for orjson: assume the worst
            return 1
        return max(1, min(self._page_size, self._page_bytes * len(items) // max(size, 1)))

    async def _watch_from(self, version: str) -> None:
        """Apply events until the server ends the watch; `resource_version` follows them."""
        async for event in self.client.watch(
            self.info,
            resource_version=version,
            timeout_seconds=self._watch_timeout,
            query=self._query,
            decode_line=self._decode_line if self._lazy is not None else None,
        ):
            self.last_contact = self._monotonic()
            kind = event.get("type")
            obj = event.get("object") or {}
            new_version = _version(obj)
            if kind == "BOOKMARK":
                self.resource_version = new_version or self.resource_version
                continue
            key = object_key(obj)
            kept = event.get(_KEPT) is _TRANSFORMED
            if kind == "DELETED":
                previous = self.store.pop(key, None)
                self._emit("DELETED", previous or (obj if kept else self._accept(obj)), None)
            elif kind in ("ADDED", "MODIFIED"):
                accepted = obj if kept else self._accept(obj)
                previous = self.store.get(key)
                self.store[key] = accepted
                self._emit("ADDED" if previous is None else "MODIFIED", previous, accepted)
            self.resource_version = new_version or self.resource_version
        self.last_contact = self._monotonic()

    def _decode_line(self, line: bytes) -> Obj:
        """A watch event's line: read lazily, its object transformed, where the lazy
        transform takes it; else decoded whole."""
        assert self._lazy is not None
        read = self._lazy(line)
        if read is None:
            event: Obj = decode(line)
            return event
        return {"type": read[0], "object": read[1], _KEPT: _TRANSFORMED}


def _version(obj: Obj) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))
