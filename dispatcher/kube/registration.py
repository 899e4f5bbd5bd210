"""Whether this replica's webhook is registered: its MutatingWebhookConfiguration exists and
one of its webhooks calls this replica (its Service, or a URL naming its address and port).

Side effects: lists and watches one MutatingWebhookConfiguration (by name) in the hub; where
the dispatcher may not list or watch it (RBAC of an older install), reads it by name every
`poll_seconds` instead.

Why: a creator record is worth something only because the API server asked for it. A
replica that signs for any caller while its configuration is absent (a reinstall, the
documented outage procedure) hands out records a tenant could store on an AppWrapper of her
own. While this says "not registered", /mutate-appwrapper signs nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Mapping
from typing import Any, NoReturn
from urllib.parse import urlsplit

import structlog

from dispatcher.clock import Clock, SystemClock
from dispatcher.config import WebhookConfig
from dispatcher.kube.api import KubeApi
from dispatcher.kube.certs import MUTATING
from dispatcher.kube.errors import Forbidden, Gone, KubeError, NotFound
from dispatcher.kube.webhook import MUTATE_PATH, VALIDATE_PATH

RETRY_SECONDS = 1.0
WATCH_SECONDS = 300


def calls_us(
    configuration: Mapping[str, Any] | None,
    *,
    path: str,
    service: tuple[str, str],
    hosts: Collection[str],
    port: int,
) -> str:
    """Why `configuration` does not send its calls to this replica ("" when one of its
    webhooks does): by `service` (namespace, name) at `path`, or by a URL whose host is one
    of `hosts`, whose port is `port` and whose path is `path`."""
    if configuration is None:
        return "its MutatingWebhookConfiguration does not exist"
    for webhook in configuration.get("webhooks") or []:
        client = (webhook or {}).get("clientConfig") or {}
        target = client.get("service")
        if isinstance(target, dict):
            if (target.get("namespace"), target.get("name")) == service and (
                target.get("path") or "/"
            ) == path:
                return ""
            continue
        url = client.get("url")
        if isinstance(url, str):
            with contextlib.suppress(ValueError):
                parts = urlsplit(url)
                if (
                    parts.scheme == "https"
                    and parts.hostname in hosts
                    and (parts.port or 443) == port
                    and parts.path == path
                ):
                    return ""
    return "its MutatingWebhookConfiguration calls another server"


class Registration:
    """`problem` is "" while the configuration named `config.mutating_configuration` calls
    this replica; otherwise why not. Start with `start(port)`, then run `run()` as a task."""

    def __init__(
        self,
        client: KubeApi,
        config: WebhookConfig,
        *,
        path: str,
        poll_seconds: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self._clock = clock or SystemClock()
        self._config = config
        self._path = path
        self._poll = poll_seconds
        self._port = 0
        self._name = config.mutating_configuration
        self._hosts = {
            *config.extra_names,
            *(
                f"{config.service_name}.{config.namespace}{suffix}"
                for suffix in ("", ".svc", ".svc.cluster.local")
            ),
        }
        self.problem = "its registration has not been read yet"
        self.log = structlog.get_logger("webhook_registration").bind(name=self._name)

    @property
    def registered(self) -> bool:
        return not self.problem

    def _see(self, configuration: Mapping[str, Any] | None) -> None:
        problem = calls_us(
            configuration,
            path=self._path,
            service=(self._config.namespace, self._config.service_name),
            hosts=self._hosts,
            port=self._port,
        )
        if problem != self.problem:
            if problem:
                self.log.warning("webhook_not_registered", reason=problem)
            else:
                self.log.info("webhook_registered")
        self.problem = problem

    async def start(self, port: int) -> None:
        """Read the configuration once (this replica serves on `port`); errors are raised."""
        self._port = port
        await self._read()

    async def _read(self) -> None:
        try:
            found: dict[str, Any] | None = await self._client.get(MUTATING, None, self._name)
        except NotFound:
            found = None
        self._see(found)

    async def run(self) -> NoReturn:
        """Follow the configuration until cancelled: a watch, else polling."""
        while True:
            try:
                await self._watch()
            except Forbidden as exc:
                self.log.warning("webhook_registration_polled", error=str(exc)[:200])
                await self._poll_forever()
            except (KubeError, OSError) as exc:
                # What was last seen stays believed until the next read succeeds.
                self.log.warning("webhook_registration_watch_failed", error=str(exc)[:200])
            await self._clock.sleep(RETRY_SECONDS)

    async def _watch(self) -> None:
        """List, then watch from there, until the watch ends or fails (Gone: relist)."""
        query = {"fieldSelector": f"metadata.name={self._name}"}
        listed = await self._client.list(MUTATING, query=query)
        items = listed.get("items") or []
        self._see(items[0] if items else None)
        version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
        with contextlib.suppress(Gone):
            async for event in self._client.watch(
                MUTATING, resource_version=version, timeout_seconds=WATCH_SECONDS, query=query
            ):
                kind = event.get("type")
                if kind in ("ADDED", "MODIFIED"):
                    self._see(event.get("object") or {})
                elif kind == "DELETED":
                    self._see(None)

    async def _poll_forever(self) -> NoReturn:
        while True:
            await self._clock.sleep(self._poll)
            try:
                await self._read()
            except (KubeError, OSError) as exc:
                self.log.warning("webhook_registration_read_failed", error=str(exc)[:200])


def webhook_configurations(
    name: str, port: int, *, namespace: str | None = None, failure_policy: str = "Fail"
) -> list[dict[str, Any]]:
    """The dispatcher's mutating and validating webhook configurations, for a dispatcher
    serving on 127.0.0.1:`port` (outside the cluster: a URL, not a Service), limited to
    `namespace` when given. The dispatcher writes their caBundle."""
    rules = [
        {
            "apiGroups": ["workload.codeflare.dev"],
            "apiVersions": ["v1beta1"],
            "resources": ["appwrappers"],
            "operations": ["CREATE", "UPDATE"],
        }
    ]
    common: dict[str, Any] = {
        "rules": rules,
        "failurePolicy": failure_policy,
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 10,
    }
    if namespace is not None:
        common["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    made = []
    for kind, path, extra in (
        ("MutatingWebhookConfiguration", MUTATE_PATH, {"reinvocationPolicy": "IfNeeded"}),
        ("ValidatingWebhookConfiguration", VALIDATE_PATH, {}),
    ):
        webhook = {
            "name": f"{path.strip('/')}.workload.codeflare.dev",
            "clientConfig": {"url": f"https://127.0.0.1:{port}{path}"},
            **common,
            **extra,
        }
        made.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": kind,
                "metadata": {"name": name},
                "webhooks": [webhook],
            }
        )
    return made
