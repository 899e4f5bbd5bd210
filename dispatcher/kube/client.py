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
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config

from dispatcher.kube.errors import (
    KubeError,
    NotFound,
    TooManyRequests,
    UnknownKind,
    Unreachable,
    error_from_response,
)

JSON = "application/json"
TLS_READ_BUFFER = 64 * 1024
"""Bytes each TLS connection reads at a time. asyncio's default (256 KiB) is allocated whole
per connection: with a pool of 64 connections, 16 MB of a dispatcher's memory for answers
that are mostly a few KB; a list page of 500 objects still takes only a few reads."""
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """How to reach a kind over REST."""

    group_version: str  # "v1", "apps/v1", "ray.io/v1"
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if sub:
            base += f"/{sub}"
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
    """Requests made, by verb and resource; read by benchmarks and metrics."""

    counts: dict[str, int]

    def record(self, method: str, path: str, watch: bool = False) -> None:
        key = f"{'WATCH' if watch else method} {_resource_of(path)}"
        self.counts[key] = self.counts.get(key, 0) + 1


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
        self._resources: dict[tuple[str, str], ResourceInfo] = {}
        self._discovery_lock = asyncio.Lock()
        self.stats = RequestStats({})

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
        return cls(api_client, configuration, name=name, qps=qps, burst=burst)

    async def close(self) -> None:
        await self._api.close()

    @property
    def server(self) -> str:
        return self._host

    async def _headers(self, content_type: str = JSON) -> dict[str, str]:
        headers = {"Accept": JSON, "Content-Type": content_type}
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
        try:
            response: aiohttp.ClientResponse = await self._api.rest_client.request(
                method,
                self._host + path,
                query_params=dict(query or {}),
                headers=await self._headers(content_type),
                body=body,
                _preload_content=False,
                _request_timeout=timeout if timeout is not None else self._timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Unreachable(f"{self.name or self._host}: {exc!r}") from exc
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
                return json.loads(data) if data else None
            error = error_from_response(response.status, data, dict(response.headers))
            if isinstance(error, TooManyRequests):
                # The server asked us to slow down; honour its Retry-After.
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
        """Map apiVersion/kind to its REST path; UnknownKind if the server does not serve it."""
        key = (api_version, kind)
        if key in self._resources:
            return self._resources[key]
        async with self._discovery_lock:
            if key not in self._resources:
                # A CRD installed after we started must be found: re-read this group-version.
                await self._discover(api_version)
        if key not in self._resources:
            raise UnknownKind(
                f"the server does not serve kind {kind!r} in {api_version!r} "
                "(is its CustomResourceDefinition installed?)"
            )
        return self._resources[key]

    async def _discover(self, api_version: str) -> None:
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            listing = await self.request("GET", path)
        except NotFound:
            return
        for resource in listing.get("resources", []):
            if "/" in resource["name"]:
                continue  # subresources (status, scale, ...)
            info = ResourceInfo(
                api_version, resource["kind"], resource["name"], bool(resource["namespaced"])
            )
            self._resources[(api_version, info.kind)] = info

    def forget_discovery(self, api_version: str) -> None:
        """Drop cached mappings for a group-version (its CRD may have gone or changed)."""
        for key in [k for k in self._resources if k[0] == api_version]:
            del self._resources[key]

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
        self, info: ResourceInfo, namespace: str | None, name: str, patch: Any, sub: str = ""
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "PATCH", info.path(namespace, name, sub), body=patch, content_type=MERGE_PATCH
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
    ) -> None:
        """Delete; NotFound means it is already gone and is not an error here."""
        body: dict[str, Any] = {"propagationPolicy": propagation}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", info.path(namespace, name), body=body)
        except NotFound:
            return

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
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events from `resource_version` with bookmarks until the server closes.

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
        response = await self._send("GET", info.path(), query=params, timeout=timeout, watch=True)
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
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object", {})
                    raise error_from_response(
                        int(status.get("code", 500)), json.dumps(status).encode(), {}
                    )
                yield event
        finally:
            response.release()


__all__ = ["KubeClient", "KubeError", "RequestStats", "ResourceInfo"]
