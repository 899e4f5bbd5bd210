"""An async client for one API server: raw JSON requests, discovery, watch streams.

Side effects: network I/O to one Kubernetes API server.

Built on kubernetes_asyncio's configuration loading (kubeconfig, in-cluster, exec
plugins) and its aiohttp session, but speaks plain JSON dicts: the dispatcher handles
arbitrary kinds (whatever an AppWrapper wraps), so typed models would only get in the
way. Every failure leaves here as one of the typed errors in `errors.py`.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import json
import os
import re
import socket
import time
import urllib.request
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from prometheus_client import Histogram

from dispatcher import __version__
from dispatcher.kube.errors import (
    KubeError,
    NotFound,
    TooManyRequests,
    UnknownKind,
    Unreachable,
    error_from_response,
)
from dispatcher.kube.jsoncodec import decode, encode

JSON = "application/json"
TLS_READ_BUFFER = 64 * 1024
"""Bytes each TLS connection reads at a time. asyncio's default (256 KiB) is allocated whole
per connection: with a pool of 64 connections, 16 MB of a dispatcher's memory for answers
that are mostly a few KB; a list page of 500 objects still takes only a few reads."""
WATCH_READ_BUFFER = 2**21
"""aiohttp's read buffer per response, as kubernetes_asyncio sets it: a watch event carries
a whole object, and etcd takes up to 1.5 MiB per object."""
MERGE_PATCH = "application/merge-patch+json"
DISCOVERY_LIMIT = 256
"""Group-versions whose discovery answer is kept (least recently used go first): the
apiVersions asked about come from users' templates and must not grow memory without bound."""
MISSING_TTL = 10.0
"""Seconds a "not served" answer is believed: a CRD installed later is found soon after,
and a template naming a made-up group costs one request per this period, not one per read."""
_GROUP_VERSION = re.compile(
    r"(([a-z0-9]([-a-z0-9]*[a-z0-9])?)(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+((alpha|beta)[0-9]+)?"
)
_KIND = re.compile(r"[A-Z][A-Za-z0-9]*")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
"""Seconds (client-go's rest_client_request_duration_seconds buckets, less the longest)."""


def _segment(value: str) -> str:
    """One path segment, escaped: a name or namespace can never add segments or a query."""
    if value in ("", ".", ".."):
        raise UnknownKind(f"{value!r} is not a valid name")
    try:
        return quote(value, safe="")
    except UnicodeEncodeError:  # a lone surrogate: JSON can carry one, UTF-8 cannot
        raise UnknownKind(f"{value!r} is not a valid name") from None


def well_formed(api_version: str, kind: str) -> bool:
    """apiVersion and kind as Kubernetes spells them; only those are ever put into a URL."""
    return (
        len(api_version) <= 317
        and api_version.isascii()
        and _GROUP_VERSION.fullmatch(api_version) is not None
        and len(kind) <= 63
        and kind.isascii()
        and _KIND.fullmatch(kind) is not None
    )


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """How to reach a kind over REST."""

    group_version: str  # "v1", "apps/v1", "ray.io/v1"
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        # Every segment is escaped (defence in depth: validation already refuses names that
        # need it), so "../api/v1/pods" stays one segment the server answers NotFound to.
        if self.group_version == "v1":
            base = "/api/v1"
        else:
            group, _, version = self.group_version.rpartition("/")
            base = f"/apis/{_segment(group)}/{_segment(version)}"
        if self.namespaced and namespace:
            base += f"/namespaces/{_segment(namespace)}"
        base += f"/{_segment(self.plural)}"
        if name:
            base += f"/{_segment(name)}"
        if sub:
            base += f"/{_segment(sub)}"
        return base


class RateLimiter:
    """Token bucket: `qps` requests a second on average, bursts up to `burst`."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._updated = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        # Real time, not a `Clock`: the bucket limits the rate requests reach the API server
        # (its load), not when the controller decides anything.
        if self.qps <= 0:
            return
        async with self._lock:
            while True:
                now = time.monotonic()
                self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.qps)
                self._updated = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self.qps)


@dataclass
class RequestStats:
    """Requests made, by verb and resource; read by benchmarks and metrics. `answered`
    adds, per request, the HTTP code ("<error>" when none came) and the seconds until the
    answer's headers (for a watch: until it opened), as client-go's rest_client metrics."""

    counts: dict[str, int]
    codes: dict[tuple[str, str, str], int] = field(default_factory=dict)
    latency: Histogram = field(
        default_factory=lambda: Histogram(
            "appwrapper_dispatcher_api_request_duration_seconds",
            "Seconds from sending a request to the hub until its answer's headers.",
            ["verb", "resource"],
            buckets=LATENCY_BUCKETS,
            registry=None,  # the manager's collector yields it with its own registry's
        )
    )

    def record(self, method: str, path: str, watch: bool = False) -> None:
        key = f"{'WATCH' if watch else method} {_resource_of(path)}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def answered(
        self, method: str, path: str, code: int | None, seconds: float, watch: bool = False
    ) -> None:
        verb, resource = "WATCH" if watch else method, _resource_of(path)
        key = (verb, resource, "<error>" if code is None else str(code))
        self.codes[key] = self.codes.get(key, 0) + 1
        self.latency.labels(verb, resource).observe(seconds)


def _resource_of(path: str) -> str:
    parts = [p for p in path.split("?")[0].split("/") if p]
    if "namespaces" in parts:
        i = parts.index("namespaces")
        rest = parts[i + 2 :]
        if rest:
            return "/".join([rest[0], *rest[2:3]]) if len(rest) > 2 else rest[0]
        return "namespaces"
    if parts[:1] == ["api"]:
        return parts[2] if len(parts) > 2 else "api"
    return parts[3] if len(parts) > 3 else "/".join(parts)


def replica_identity() -> str:
    """This process among the dispatcher's replicas: the Lease's holderIdentity and the comment
    in every request's User-Agent, so that the API server's audit log tells apart the writes
    of each replica (a check that two never lead at once needs exactly that)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def user_agent() -> str:
    return f"appwrapper-dispatcher/{__version__} ({replica_identity()})"


def _read_environment_once(rest: Any, host: str) -> None:
    """kubernetes_asyncio opens its aiohttp session with `trust_env=True`: every request
    then looks up the proxy variables and ~/.netrc again, in a thread (about a fifth of the
    controller's CPU, measured by the peer benchmark's profile). The server's address does
    not change, so its proxy is decided here, once, as kubectl decides it at start
    (HTTPS_PROXY / HTTP_PROXY unless NO_PROXY names the host; a `proxy-url` in the
    kubeconfig wins), and the session is replaced by one that reads nothing per request.
    ~/.netrc is never used: the API server is not given basic auth from it."""
    if not rest.proxy:
        address = urlsplit(host)
        proxy = urllib.request.getproxies().get(address.scheme or "https")
        if proxy and not urllib.request.proxy_bypass(address.hostname or ""):
            rest.proxy = proxy
    old: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector,
        trust_env=False,
        read_bufsize=WATCH_READ_BUFFER,
    )
    old.detach()  # the connector now belongs to the new session


class KubeClient:
    """JSON over REST to one API server. Create with `connect()`; `close()` when done."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        configuration: k8s_client.Configuration,
        *,
        name: str = "",
        qps: float = 0,
        burst: int = 0,
        request_timeout: float = 30,
    ) -> None:
        self.name = name
        self._api = api_client
        self._cfg = configuration
        self._host = str(configuration.host).rstrip("/")
        self._limiter = RateLimiter(qps, burst or max(1, int(qps * 2)))
        self._timeout = request_timeout
        self._agent = user_agent()
        self._resources: OrderedDict[str, dict[str, ResourceInfo]] = OrderedDict()
        """group-version -> kind -> info, least recently used first (DISCOVERY_LIMIT)."""
        self._missing: OrderedDict[str, float] = OrderedDict()
        """group-version -> monotonic time it was found not served (MISSING_TTL)."""
        self._discovery_lock = asyncio.Lock()
        self.stats = RequestStats({})
        rest = api_client.rest_client
        settings = {
            "proxy": rest.proxy,
            "proxy_headers": rest.proxy_headers,
            "server_hostname": rest.server_hostname,
        }
        self._session_settings: dict[str, Any] = {k: v for k, v in settings.items() if v}
        """Per-request aiohttp settings fixed at connect (only those set)."""

    @classmethod
    async def connect(
        cls,
        *,
        kubeconfig: str | None = None,
        kubeconfig_dict: dict[str, Any] | None = None,
        context: str | None = None,
        name: str = "",
        qps: float = 0,
        burst: int = 0,
        pool_size: int = 64,
    ) -> KubeClient:
        """From a kubeconfig (file or parsed), or the pod's service account when none given."""
        configuration = k8s_client.Configuration()
        if kubeconfig_dict is not None:
            await k8s_config.load_kube_config_from_dict(
                kubeconfig_dict, context=context, client_configuration=configuration
            )
        elif kubeconfig:
            await k8s_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        configuration.connection_pool_maxsize = pool_size
        protocol = asyncio.sslproto.SSLProtocol
        protocol.max_size = min(protocol.max_size, TLS_READ_BUFFER)
        api_client = k8s_client.ApiClient(configuration)
        _read_environment_once(api_client.rest_client, str(configuration.host))
        return cls(api_client, configuration, name=name, qps=qps, burst=burst)

    async def close(self) -> None:
        await self._api.close()

    @property
    def server(self) -> str:
        return self._host

    async def _headers(self, content_type: str = JSON) -> dict[str, str]:
        headers = {"Accept": JSON, "Content-Type": content_type, "User-Agent": self._agent}
        for setting in (await self._cfg.auth_settings()).values():
            headers[setting["key"]] = setting["value"]
        return headers

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: float | aiohttp.ClientTimeout | None = None,
        watch: bool = False,
    ) -> aiohttp.ClientResponse:
        await self._limiter.acquire()
        self.stats.record(method, path, watch=watch)
        # Straight to the aiohttp session (kubernetes_asyncio's REST layer would encode the
        # body with the slower json module and rebuild its settings on every request).
        rest = self._api.rest_client
        limit = timeout if timeout is not None else self._timeout
        started = time.monotonic()
        try:
            response: aiohttp.ClientResponse = await rest.pool_manager.request(
                method,
                self._host + path,
                params=dict(query) if query else None,
                headers=await self._headers(content_type),
                data=None if body is None else encode(body),
                timeout=limit
                if isinstance(limit, aiohttp.ClientTimeout)
                else aiohttp.ClientTimeout(total=limit),
                **self._session_settings,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.stats.answered(method, path, None, time.monotonic() - started, watch)
            raise Unreachable(f"{self.name or self._host}: {exc!r}") from exc
        self.stats.answered(method, path, response.status, time.monotonic() - started, watch)
        return response

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        """The whole body; the connection goes back to the pool whatever happens."""
        try:
            return await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(f"{self.name or self._host}: {exc!r}") from exc
        finally:
            response.release()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Any:
        """One request; returns the parsed JSON answer or raises a typed `KubeError`."""
        for _attempt in range(5):
            response = await self._send(
                method, path, query=query, body=body, content_type=content_type
            )
            data = await self._read(response)
            if 200 <= response.status < 300:
                return decode(data) if data else None
            error = error_from_response(response.status, data, dict(response.headers))
            if isinstance(error, TooManyRequests):
                # The server asked us to slow down; honour its Retry-After (real seconds:
                # the server's time, not the controller's).
                await asyncio.sleep(min(error.retry_after, 10))
                continue
            raise error
        raise error

    async def ping(self, timeout: float = 5.0) -> None:
        """A cheap request (GET /version) that must answer within `timeout` seconds."""
        response = await self._send("GET", "/version", timeout=timeout)
        await self._read(response)
        if response.status != 200:
            raise Unreachable(f"{self.name or self._host}: /version answered {response.status}")

    # -- discovery --------------------------------------------------------------------

    async def resource_info(self, api_version: str, kind: str) -> ResourceInfo:
        """Map apiVersion/kind to its REST path; UnknownKind if the server does not serve it
        (or either is not spelled as Kubernetes spells them: no request is made for those)."""
        if not well_formed(api_version, kind):
            raise UnknownKind(f"{api_version!r}/{kind!r} is not a valid apiVersion and kind")
        found = self._known(api_version, kind)
        if found is not None:
            return found
        async with self._discovery_lock:
            found = self._known(api_version, kind)
            if found is None and not self._recently_missing(api_version):
                # A CRD installed after we started must be found: re-read this group-version.
                await self._discover(api_version)
                found = self._known(api_version, kind)
        if found is None:
            raise UnknownKind(
                f"the server does not serve kind {kind!r} in {api_version!r} "
                "(is its CustomResourceDefinition installed?)"
            )
        return found

    def _known(self, api_version: str, kind: str) -> ResourceInfo | None:
        kinds = self._resources.get(api_version)
        if kinds is None:
            return None
        self._resources.move_to_end(api_version)
        return kinds.get(kind)

    def _recently_missing(self, api_version: str) -> bool:
        since = self._missing.get(api_version)
        if since is None:
            return False
        if time.monotonic() - since < MISSING_TTL:
            return True
        del self._missing[api_version]
        return False

    async def _discover(self, api_version: str) -> None:
        if api_version == "v1":
            path = "/api/v1"
        else:
            group, _, version = api_version.rpartition("/")
            path = f"/apis/{_segment(group)}/{_segment(version)}"
        try:
            listing = await self.request("GET", path)
        except NotFound:
            # Not served (any more): forget what was known of it, and believe the answer
            # for a while.
            self._resources.pop(api_version, None)
            self._missing[api_version] = time.monotonic()
            while len(self._missing) > DISCOVERY_LIMIT:
                self._missing.popitem(last=False)
            return
        self._missing.pop(api_version, None)
        kinds: dict[str, ResourceInfo] = {}
        for resource in listing.get("resources", []):
            if "/" in resource["name"]:
                continue  # subresources (status, scale, ...)
            info = ResourceInfo(
                api_version, resource["kind"], resource["name"], bool(resource["namespaced"])
            )
            kinds[info.kind] = info
        self._resources[api_version] = kinds
        self._resources.move_to_end(api_version)
        while len(self._resources) > DISCOVERY_LIMIT:
            self._resources.popitem(last=False)

    def forget_discovery(self, api_version: str) -> None:
        """Drop cached mappings for a group-version (its CRD may have gone or changed)."""
        self._resources.pop(api_version, None)
        self._missing.pop(api_version, None)

    # -- objects ----------------------------------------------------------------------

    async def get(self, info: ResourceInfo, namespace: str | None, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", info.path(namespace, name))
        return result

    async def create(
        self, info: ResourceInfo, namespace: str | None, body: Any, *, field_manager: str = ""
    ) -> dict[str, Any]:
        query = {"fieldManager": field_manager} if field_manager else None
        result: dict[str, Any] = await self.request(
            "POST", info.path(namespace), query=query, body=body
        )
        return result

    async def replace(
        self, info: ResourceInfo, namespace: str | None, name: str, body: Any, sub: str = ""
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "PUT", info.path(namespace, name, sub), body=body
        )
        return result

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
        result: dict[str, Any] = await self.request(
            "PATCH",
            info.path(namespace, name, sub),
            query={"fieldManager": field_manager} if field_manager else None,
            body=patch,
            content_type=MERGE_PATCH,
        )
        return result

    async def delete(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        uid: str | None = None,
    ) -> bool:
        """Delete; NotFound means it is already gone and is not an error here. True when it
        is gone now; False when its deletion has only begun (finalizers, a grace period: the
        API server answers with the object, marked with a deletionTimestamp)."""
        body: dict[str, Any] = {"propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            answer = await self.request("DELETE", info.path(namespace, name), body=body)
        except NotFound:
            return True
        meta = answer.get("metadata") if isinstance(answer, dict) else None
        return not (isinstance(meta, dict) and meta.get("deletionTimestamp"))

    async def list(
        self,
        info: ResourceInfo,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self.request("GET", info.path(namespace), query=query)
        return result

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
        """Yield watch events from `resource_version` with bookmarks until the server closes;
        cluster-wide, or in `namespace` (where a Role allows no more). `decode_line` reads
        each event's line in place of `decode` (a cache that keeps a few fields of each
        object reads only those: `kube/lazyjson.py`).

        Raises Gone (410) when the version is too old, so the caller relists.
        """
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            **(query or {}),
        }
        # No total timeout: the server ends the watch after timeoutSeconds. A read
        # inactivity limit catches a silently dead connection.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_seconds + 30)
        response = await self._send(
            "GET", info.path(namespace), query=params, timeout=timeout, watch=True
        )
        try:
            if response.status != 200:
                data = await response.read()
                raise error_from_response(response.status, data, dict(response.headers))
            while True:
                try:
                    line = await response.content.readline()
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    raise Unreachable(f"{self.name or self._host}: watch broke: {exc!r}") from exc
                if not line:
                    return
                event = (decode_line or decode)(line)
                if event.get("type") == "ERROR":
                    status = event.get("object", {})
                    raise error_from_response(
                        int(status.get("code", 500)), json.dumps(status).encode(), {}
                    )
                yield event
        finally:
            response.release()


__all__ = ["KubeClient", "KubeError", "RequestStats", "ResourceInfo"]
