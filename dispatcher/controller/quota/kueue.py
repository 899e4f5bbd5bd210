"""Kueue's own quota objects, watched when the `kueue_quotas` setting asks for them.

Side effects: on the hub, a GET of Kueue's ClusterQueue CRD (which version it stores), one
watch per Kueue kind once that CRD exists, and every GUARD_EVERY_SECONDS a GET of Kueue's
leader Lease and of Kueue's validating webhook configuration, both by name (is Kueue itself
running?). By name, not a list of every webhook configuration: the dispatcher may read no
other cluster's admission setup.

The kinds are read in the version the CRD stores: Kueue's CRDs serve v1beta1 and v1beta2
without a conversion webhook when Kueue is not installed, so a field only the other version
has (`cohort` / `cohortName`) is not there when read through it. What is made of the
objects is `core.quota.kueue`'s; this module only keeps them and says when they changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from dispatcher.clock import Clock
from dispatcher.core.quota.kueue import (
    KUEUE_GROUP,
    KUEUE_KINDS,
    KUEUE_LEASE,
    KUEUE_WEBHOOK,
    KueueObjects,
    KueueQuotas,
    kueue_running,
)
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError, NotFound
from dispatcher.kube.informer import Informer

Obj = dict[str, Any]
CRDS = ResourceInfo(
    "apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions", False
)
LEASES = ResourceInfo("coordination.k8s.io/v1", "Lease", "leases", namespaced=True)
WEBHOOKS = ResourceInfo(
    "admissionregistration.k8s.io/v1",
    "ValidatingWebhookConfiguration",
    "validatingwebhookconfigurations",
    namespaced=False,
)
DEFAULT_VERSION = "v1beta1"
"""The version Kueue v0.15's own CRDs store."""
CRD_EVERY_SECONDS = 30.0
GUARD_EVERY_SECONDS = 15.0


def storage_version(crd: Obj) -> str:
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("storage"):
            return str(version["name"])
    return DEFAULT_VERSION


class KueueSource:
    """Kueue's quota objects as last seen, and whether Kueue itself runs."""

    def __init__(self, *, hub: KubeApi, mode: KueueQuotas, namespace: str, clock: Clock) -> None:
        self._hub = hub
        self.mode = mode
        self._namespace = namespace
        self._clock = clock
        self.informers: dict[str, Informer] = {}
        self.running = ""
        """Why Kueue itself is thought to run ("" = it is not)."""
        self.synced = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._log = structlog.get_logger("kueue")
        self._unreadable: set[str] = set()  # what the guard could not read, logged once
        if mode is KueueQuotas.OFF:
            self.synced.set()

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _changed(self, *_: object) -> None:
        for listener in self._listeners:
            listener()

    def objects(self) -> KueueObjects:
        def listed(kind: str) -> list[Obj]:
            informer = self.informers.get(kind)
            return list(informer.store.values()) if informer is not None else []

        return KueueObjects(
            cluster_queues=listed("ClusterQueue"),
            cohorts=listed("Cohort"),
            flavors=listed("ResourceFlavor"),
            local_queues=listed("LocalQueue"),
            kueue_running=self.running,
        )

    def priority_class(self, name: str) -> Obj | None:
        """A WorkloadPriorityClass by name (None: unknown, or not read)."""
        informer = self.informers.get("WorkloadPriorityClass")
        return informer.store.get(name) if informer is not None else None

    async def run(self) -> None:
        if self.mode is KueueQuotas.OFF:
            return
        async with asyncio.TaskGroup() as group:
            group.create_task(self._guard_loop(), name="kueue-guard")
            await self._guard()  # known before the objects are first read
            version = await self._version()
            for kind, plural in KUEUE_KINDS.items():
                info = ResourceInfo(
                    f"{KUEUE_GROUP}/{version}", kind, plural, namespaced=kind == "LocalQueue"
                )
                informer = Informer(self._hub, info, absent_ok=True)
                informer.add_handler(self._changed)
                self.informers[kind] = informer
                group.create_task(informer.run(), name=f"watch-kueue-{plural}")
            for informer in self.informers.values():
                await informer.synced.wait()
            self._log.info("kueue_quotas_read", version=version, mode=str(self.mode))
            self.synced.set()
            self._changed()

    async def _version(self) -> str:
        """The version Kueue's CRDs store, once they exist (looked for now and then; until
        then Kueue's objects are none, and dispatching does not wait for them)."""
        name = f"{KUEUE_KINDS['ClusterQueue']}.{KUEUE_GROUP}"
        while True:
            try:
                return storage_version(await self._hub.get(CRDS, None, name))
            except NotFound:
                self._log.info("kueue_crds_absent", crd=name)
            except KubeError as exc:  # cannot read CRDs: Kueue's default version
                self._log.warning("kueue_crd_unreadable", crd=name, error=str(exc)[:200])
                return DEFAULT_VERSION
            self.synced.set()
            await self._clock.sleep(CRD_EVERY_SECONDS)

    def _cannot_read(self, what: str, exc: KubeError) -> None:
        """That sign is not looked at (every GUARD_EVERY_SECONDS: said once)."""
        if what not in self._unreadable:
            self._unreadable.add(what)
            self._log.warning("kueue_guard_unreadable", what=what, error=str(exc)[:200])

    async def _guard_loop(self) -> None:
        while True:
            await self._clock.sleep(GUARD_EVERY_SECONDS)
            await self._guard()

    async def _guard(self) -> None:
        lease: Obj | None = None
        webhooks: list[Obj] = []
        try:
            lease = await self._hub.get(LEASES, self._namespace, KUEUE_LEASE)
        except NotFound:
            pass
        except KubeError as exc:
            self._cannot_read("lease", exc)
        try:
            webhooks = [await self._hub.get(WEBHOOKS, None, KUEUE_WEBHOOK)]
        except NotFound:
            pass
        except KubeError as exc:
            self._cannot_read("webhooks", exc)
        running = kueue_running(lease, webhooks, self._clock.time())
        if running != self.running:
            if running:
                self._log.warning("kueue_running", reason=running)
            else:
                self._log.info("kueue_not_running")
            self.running = running
            self._changed()
