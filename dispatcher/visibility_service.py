"""Starts the visibility API (controller/visibility/api.py) in the controller's own loop.

Side effects: reads ConfigMap kube-system/extension-apiserver-authentication (the front
proxy's CA and names) and, on a standby's answer, the Lease; listens on a TCP port with TLS
(a certificate made at start unless `visibility.cert_dir` names one); opens a connection
of its own to the hub for its SubjectAccessReviews (`connect`: its own rate limiter and
pool, with a budget in front, visibility_reviews.py), so that no request to this API
spends the controller's. Every replica serves it, from before it waits for the Lease, so
that a standby can say who leads.
"""

from __future__ import annotations

import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from aiohttp import web
from cryptography.hazmat.primitives import serialization

from dispatcher.config import Config
from dispatcher.controller.access.gatekeeper import AccessReviews
from dispatcher.controller.access.reviews import ReviewBudget
from dispatcher.controller.manager import Manager
from dispatcher.controller.visibility.api import FrontProxy, VisibilityApi
from dispatcher.controller.visibility.webview import QueueRow, UsageBar
from dispatcher.core.visibility import audiences
from dispatcher.kube import certplan
from dispatcher.kube.client import KubeClient, ResourceInfo
from dispatcher.kube.errors import KubeError
from dispatcher.kube.leader import LEASES

CONFIGMAPS = ResourceInfo("v1", "ConfigMap", "configmaps", namespaced=True)
AUTHENTICATION = ("kube-system", "extension-apiserver-authentication")
CERT_VALIDITY = 365 * 86400.0


async def front_proxy(config: Config, dispatcher: Manager) -> FrontProxy:
    settings = config.visibility
    ca_pem = None
    if settings.requestheader_client_ca_file:
        ca_pem = Path(settings.requestheader_client_ca_file).read_bytes()  # noqa: ASYNC240 (at start)
    data: dict[str, str] = {}
    if ca_pem is None or settings.requestheader_allowed_names is None:
        configmap = await dispatcher.hub.get(CONFIGMAPS, *AUTHENTICATION)
        data = {str(k): str(v) for k, v in (configmap.get("data") or {}).items()}
    return FrontProxy.from_configmap(
        data, ca_pem=ca_pem, names=settings.requestheader_allowed_names
    )


def _tls(config: Config, proxy: FrontProxy, directory: Path) -> ssl.SSLContext:
    settings = config.visibility
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    if settings.cert_dir:
        cert, key = Path(settings.cert_dir) / "tls.crt", Path(settings.cert_dir) / "tls.key"
    else:
        now = time.time()
        authority = certplan.make_ca(now, CERT_VALIDITY, name="appwrapper-dispatcher-visibility-ca")
        names = certplan.serving_names(
            settings.service_name, settings.namespace, settings.extra_names
        )
        issued = certplan.issue_serving(authority, names, now, CERT_VALIDITY)
        cert, key = directory / "tls.crt", directory / "tls.key"
        key.touch(mode=0o600)
        cert.write_bytes(issued.cert_pem)
        key.write_bytes(issued.key_pem)
    context.load_cert_chain(cert, key)
    # Ask every caller for a certificate; `FrontProxy.problem` judges it (probes need none).
    context.verify_mode = ssl.CERT_OPTIONAL
    for ca in proxy.cas:
        context.load_verify_locations(cadata=ca.public_bytes(serialization.Encoding.PEM).decode())
    return context


def queue_rows(dispatcher: Manager) -> list[QueueRow]:
    """Each cluster queue's usage against its nominal quota, per flavor and resource."""
    tree = dispatcher.quotas.tree()
    # The last status write's (at most a few seconds old): computing them afresh would cost
    # a pass over all pending work per request, on the controller's loop.
    summaries = dispatcher.quotas.summaries
    admits = audiences(tree.setup)
    counts: dict[str, int] = {}
    for pending in dispatcher.visibility.view().items:
        counts[pending.cluster_queue] = counts.get(pending.cluster_queue, 0) + 1
    rows = []
    for name, spec in sorted(tree.setup.queues.items()):
        summary = summaries.get(name)
        usage = []
        for group in spec.groups:
            for flavor in group.flavors:
                for resource, quota in flavor.quotas.items():
                    fr = (flavor.flavor, resource)
                    used = summary.usage.get(fr, 0) if summary else 0
                    borrowed = summary.borrowed.get(fr, 0) if summary else 0
                    usage.append(UsageBar(flavor.flavor, resource, used, quota.nominal, borrowed))
        rows.append(
            QueueRow(
                name=name,
                usage=tuple(usage),
                pending=counts.get(name, 0),
                admitted=summary.admitted if summary else 0,
                active=summary.active if summary else True,
                message=summary.message if summary else "",
                admits=admits.get(name, ()),
            )
        )
    return rows


class VisibilityService:
    def __init__(
        self,
        config: Config,
        dispatcher: Manager,
        *,
        connect: Callable[[], Awaitable[KubeClient]],
    ) -> None:
        self._config = config
        self._dispatcher = dispatcher
        self._connect = connect
        self._client: KubeClient | None = None
        self.budget: ReviewBudget | None = None
        self._runner: web.AppRunner | None = None
        self._directory = tempfile.TemporaryDirectory(prefix="aw-visibility-")
        self.port = 0
        self._log = structlog.get_logger("visibility")

    async def start(self) -> None:
        config, dispatcher = self._config, self._dispatcher
        proxy = await front_proxy(config, dispatcher)
        context = _tls(config, proxy, Path(self._directory.name))
        settings = config.visibility
        client = self._client = await self._connect()
        self.budget = ReviewBudget(client, qps=settings.review_qps, burst=settings.review_burst)
        api = VisibilityApi(
            front_proxy=proxy,
            reviews=AccessReviews(self.budget, keep_seconds=config.access_review_cache_seconds),
            view=dispatcher.visibility.view,
            leading=lambda: dispatcher.ready.is_set() and not dispatcher.fenced,
            leader=self._leader,
            appwrapper=dispatcher.status.current,
            queues=lambda: queue_rows(dispatcher),
            now=dispatcher.clock.time,
        )
        self._runner = web.AppRunner(api.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, settings.host, settings.port, ssl_context=context)
        await site.start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else settings.port
        self._log.info("visibility_serving", host=settings.host, port=self.port)

    async def _leader(self) -> str:
        if not self._config.leader_election:
            return ""
        try:
            lease = await self._dispatcher.hub.get(
                LEASES, self._config.lease_namespace, self._config.lease_name
            )
        except KubeError:
            return ""
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._client is not None:
            await self._client.close()
        self._directory.cleanup()
