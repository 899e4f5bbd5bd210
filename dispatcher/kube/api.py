"""What the rest of the dispatcher needs from an API server connection, as a Protocol. No I/O.

`KubeClient` (client.py) is the real implementation; `testenv.fakekube.FakeKube`
is an in-memory one for tests. The members are exactly those the other modules use: lifecycle
(`close`) stays on the concrete client, which whoever connected it owns.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from dispatcher.kube.client import RequestStats, ResourceInfo


class KubeApi(Protocol):
    """JSON objects over one API server; failures are the typed errors of `errors.py`."""

    name: str
    stats: RequestStats

    async def ping(self, timeout: float = 5.0) -> None: ...

    async def resource_info(self, api_version: str, kind: str) -> ResourceInfo: ...

    def forget_discovery(self, api_version: str) -> None: ...

    async def get(self, info: ResourceInfo, namespace: str | None, name: str) -> dict[str, Any]: ...

    async def create(
        self, info: ResourceInfo, namespace: str | None, body: Any, *, field_manager: str = ""
    ) -> dict[str, Any]: ...

    async def replace(
        self, info: ResourceInfo, namespace: str | None, name: str, body: Any, sub: str = ""
    ) -> dict[str, Any]: ...

    async def merge_patch(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        patch: Any,
        sub: str = "",
        *,
        field_manager: str = "",
    ) -> dict[str, Any]: ...

    async def delete(
        self,
        info: ResourceInfo,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        uid: str | None = None,
    ) -> bool: ...

    async def list(
        self,
        info: ResourceInfo,
        namespace: str | None = None,
        *,
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]: ...

    def watch(
        self,
        info: ResourceInfo,
        *,
        resource_version: str,
        timeout_seconds: int = 300,
        query: Mapping[str, str] | None = None,
        namespace: str | None = None,
        decode_line: Callable[[bytes], Any] | None = None,
    ) -> AsyncIterator[dict[str, Any]]: ...


__all__ = ["KubeApi"]
