"""The pending list and the web view, served as an aggregated API
(`visibility.workload.codeflare.dev/v1alpha1`) behind the API server's authentication.

Side effects: listens on a TCP port with TLS; creates SubjectAccessReviews in the hub.

The API server authenticates the user (any method kubectl uses), authorizes the path by
RBAC (`pendingappwrappers`, `clusterappqueues/pendingappwrappers`, `views`) and proxies the
request here with its front-proxy client certificate and the user in `X-Remote-User` /
`X-Remote-Group` / `X-Remote-Extra-*`. Only a caller whose certificate the front proxy's CA
signed, naming one of the allowed names, is believed (`FrontProxy`; both are read from
ConfigMap kube-system/extension-apiserver-authentication, as every aggregated API server
does). Then each AppWrapper is shown only if the user may list AppWrappers in its namespace
(a SubjectAccessReview per namespace, answers kept briefly, on a budget of their own:
visibility_reviews.py; beyond it a request is answered 429). Only the leader has the order:
a standby answers 503 naming the leader.

What a user may see (docs/operations.md#see-the-queue): a user who may list AppWrappers in
every namespace (cluster-wide) sees everything. Anyone else sees
- the pending AppWrappers of the namespaces where they may list AppWrappers (positions
  count every AppWrapper ahead, theirs or not);
- in a start estimate or a wait message, every AppWrapper of a namespace they may not see
  as "another namespace's AppWrapper" (how many stays, the names go: `core.visibility.
  redacted`);
- in `views/queues`, the ClusterAppQueues that admit one of their namespaces: a queue is
  shown when an AppQueue in a namespace where they may list AppWrappers points at it and
  its namespaceSelector admits that namespace (work reaches a cluster queue only through
  an AppQueue, so these are exactly the queues their work can wait in). Its usage and
  counts are the whole queue's.

Paths (under /apis/visibility.workload.codeflare.dev/v1alpha1):
  pendingappwrappers                                   every namespace the user may list
  namespaces/NS/pendingappwrappers[/NAME]              one namespace (or one AppWrapper)
  clusterappqueues/CQ/pendingappwrappers               one cluster queue ("-": capacity only)
  namespaces/NS/appqueues/Q/pendingappwrappers         one AppQueue
  views/queues                                         the web view: queues and pending
  namespaces/NS/views/NAME                             the web view: one AppWrapper
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from aiohttp import web
from cryptography import x509

from dispatcher.api.constants import GROUP as APPWRAPPER_GROUP
from dispatcher.controller.access.gatekeeper import AccessReviews
from dispatcher.controller.visibility.webview import QueueRow, appwrapper_page, queues_page
from dispatcher.core.gatekeeping import Access, Creator
from dispatcher.core.visibility import (
    Pending,
    PendingView,
    Reserved,
    named_namespaces,
    redacted,
    rfc3339,
)
from dispatcher.kube.errors import TooManyRequests
from dispatcher.kube.webhook import (
    certificate_names,
    issued_by,
    peer_certificate,
    status_response,
)

GROUP = "visibility.workload.codeflare.dev"
VERSION = "v1alpha1"
BASE = f"/apis/{GROUP}/{VERSION}"
CAPACITY_ONLY = "-"
"""The cluster queue name that lists work admitted on capacity alone."""
DEFAULT_LIMIT = 1000
MAX_LIMIT = 100_000

Obj = dict[str, Any]
USER = web.RequestKey("user", Creator)


@dataclass(frozen=True)
class FrontProxy:
    """Who may speak for users: the front proxy's CAs, its client certificate's allowed
    names (empty: any the CAs signed), and the headers it names the user in."""

    cas: tuple[x509.Certificate, ...]
    allowed_names: frozenset[str] = frozenset()
    user_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    @classmethod
    def from_configmap(
        cls, data: Mapping[str, str], *, ca_pem: bytes | None, names: Collection[str] | None
    ) -> FrontProxy:
        """From extension-apiserver-authentication's data (explicit settings win)."""

        def listed(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
            raw = data.get(key)
            values = orjson.loads(raw) if raw else None
            return tuple(str(v) for v in values) if values else default

        pem = (
            ca_pem if ca_pem is not None else data.get("requestheader-client-ca-file", "").encode()
        )
        cas = tuple(x509.load_pem_x509_certificates(pem)) if pem.strip() else ()
        if not cas:
            raise ValueError(
                "no front-proxy CA: ConfigMap kube-system/extension-apiserver-authentication has"
                " no requestheader-client-ca-file (kube-apiserver --requestheader-client-ca-file)"
                " and visibility.requestheader_client_ca_file is unset"
            )
        allowed = names if names is not None else listed("requestheader-allowed-names", ())
        return cls(
            cas=cas,
            allowed_names=frozenset(allowed),
            user_headers=listed("requestheader-username-headers", ("X-Remote-User",)),
            group_headers=listed("requestheader-group-headers", ("X-Remote-Group",)),
            extra_prefixes=listed("requestheader-extra-headers-prefix", ("X-Remote-Extra-",)),
        )

    def problem(self, der: bytes | None) -> str:
        """Why this caller may not speak for users; "" when it may."""
        if not der:
            return "no client certificate: only the API server's front proxy is answered"
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            return "the client certificate cannot be read"
        if not any(issued_by(cert, ca) for ca in self.cas):
            return "the client certificate is not issued by the front proxy's CA"
        if self.allowed_names and not certificate_names(cert) & self.allowed_names:
            return "the client certificate names none of requestheader-allowed-names"
        return ""

    def user(self, headers: Mapping[str, str], all_of: Callable[[str], list[str]]) -> Creator:
        name = next((headers[h] for h in self.user_headers if headers.get(h)), "")
        groups = tuple(g for h in self.group_headers for g in all_of(h))
        extra: dict[str, list[str]] = {}
        for header in headers:
            for prefix in self.extra_prefixes:
                if header.lower().startswith(prefix.lower()):
                    key = header[len(prefix) :].lower()
                    extra[key] = all_of(header)
        return Creator(
            username=name,
            groups=groups,
            extra=tuple(sorted((k, tuple(v)) for k, v in extra.items())),
        )


def _rfc3339(at: float | None) -> str | None:
    return None if at is None else rfc3339(at)


def item_of(pending: Pending, now: float) -> Obj:
    """One pending AppWrapper as the API shows it."""
    return {
        "metadata": {"name": pending.name, "namespace": pending.namespace},
        "priority": pending.priority,
        "clusterQueue": pending.cluster_queue,
        "appQueue": pending.local_queue.partition("/")[2],
        "position": pending.position,
        "positionInClusterQueue": pending.queue_position,
        "positionInAppQueue": pending.local_position,
        "queuedSince": _rfc3339(pending.queued_since),
        "waitingSeconds": max(0, round(now - pending.queued_since)),
        "reason": pending.reason,
        "message": pending.message,
        "eta": {
            "at": _rfc3339(pending.eta.at),
            "latest": pending.eta.latest,
            "basis": pending.eta.basis,
        },
        **({"reservation": reservation_of(pending.reserved)} if pending.reserved else {}),
    }


def reservation_of(reserved: Reserved) -> Obj:
    """Nodes reserved for a pending gang, as the API shows them."""
    return {
        "cluster": reserved.cluster,
        "nodes": list(reserved.nodes),
        "expectedFrom": rfc3339(reserved.start),
        "latestFrom": rfc3339(reserved.latest),
    }


def discovery() -> Obj:
    names = [
        ("pendingappwrappers", True, ["get", "list"]),
        ("clusterappqueues/pendingappwrappers", False, ["get"]),
        ("appqueues/pendingappwrappers", True, ["get"]),
        ("views", False, ["get"]),
    ]
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{VERSION}",
        "resources": [
            {
                "name": name,
                "singularName": "",
                "namespaced": namespaced,
                "kind": "PendingAppWrapperList",
                "verbs": verbs,
            }
            for name, namespaced, verbs in names
        ],
    }


class VisibilityApi:
    """The request handlers; `app()` is the aiohttp application that serves them."""

    def __init__(
        self,
        *,
        front_proxy: FrontProxy,
        reviews: AccessReviews,
        view: Callable[[], PendingView],
        leading: Callable[[], bool],
        leader: Callable[[], Awaitable[str]],
        appwrapper: Callable[[str], Obj | None],
        queues: Callable[[], Sequence[QueueRow]],
        now: Callable[[], float],
    ) -> None:
        self.front_proxy = front_proxy
        self._reviews = reviews
        self._view = view
        self._leading = leading
        self._leader = leader
        self._appwrapper = appwrapper
        self._queues = queues
        self._now = now
        self._encoded_view: PendingView | None = None
        self._encoded_items: dict[str, bytes] = {}
        self._log = structlog.get_logger("visibility")

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        routes = [
            ("", self.discovery),
            ("/pendingappwrappers", self.all_namespaces),
            ("/namespaces/{namespace}/pendingappwrappers", self.namespace),
            ("/namespaces/{namespace}/pendingappwrappers/{name}", self.one),
            ("/clusterappqueues/{queue}/pendingappwrappers", self.cluster_queue),
            ("/namespaces/{namespace}/appqueues/{queue}/pendingappwrappers", self.app_queue),
            ("/views/queues", self.queues_view),
            ("/namespaces/{namespace}/views/{name}", self.appwrapper_view),
        ]
        for path, handler in routes:
            app.router.add_get(BASE + path, handler)
        app.router.add_get(f"/apis/{GROUP}", self.group)
        app.router.add_get("/healthz", self.healthz)
        return app

    @web.middleware
    async def _guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        problem = self.front_proxy.problem(peer_certificate(request))
        if problem:
            return status_response(403, "Forbidden", problem)
        user = self.front_proxy.user(request.headers, lambda h: request.headers.getall(h, []))
        if not user.username:
            return status_response(401, "Unauthorized", "the front proxy named no user")
        request[USER] = user
        if request.path.rstrip("/") in (BASE, f"/apis/{GROUP}"):
            return await handler(request)  # discovery: standbys answer it too
        if not self._leading():
            leader = await self._leader()
            return status_response(
                503,
                "ServiceUnavailable",
                f"this replica is not the leader; the leader ({leader or 'unknown'}) holds the"
                " queue's order: ask again",
            )
        try:
            return await handler(request)
        except TooManyRequests as exc:  # the access checks' budget (visibility_reviews.py)
            self._log.debug("visibility_reviews_spent", user=user.username)
            answer = status_response(429, "TooManyRequests", str(exc))
            answer.headers["Retry-After"] = str(max(1, round(exc.retry_after)))
            return answer

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def group(self, _: web.Request) -> web.Response:
        version = {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}
        body = {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": GROUP,
            "versions": [version],
            "preferredVersion": version,
        }
        return _json(body)

    async def discovery(self, _: web.Request) -> web.Response:
        return _json(discovery())

    async def everywhere(self, user: Creator) -> bool:
        """Whether `user` may list AppWrappers in every namespace."""
        return await self._reviews.allowed(
            user, Access("list", APPWRAPPER_GROUP, "appwrappers", "")
        )

    async def visible(self, user: Creator, namespaces: Iterable[str]) -> set[str]:
        """The namespaces among `namespaces` where `user` may list AppWrappers."""
        if await self.everywhere(user):
            return set(namespaces)
        allowed = set()
        for namespace in namespaces:
            access = Access("list", APPWRAPPER_GROUP, "appwrappers", namespace)
            if await self._reviews.allowed(user, access):
                allowed.add(namespace)
        return allowed

    async def _redacted(
        self, user: Creator, view: PendingView, items: Sequence[Pending], seen: set[str]
    ) -> list[Pending]:
        """`items` (all in `seen`) as `user` may read them: the AppWrappers their estimates
        and messages name in other namespaces are hidden unless `user` may see those too."""

        def known(key: str) -> bool:
            return key in view.by_key or key in view.active

        named = set().union(*(named_namespaces(p, known) for p in items)) - seen
        if named:
            seen = seen | await self.visible(user, named)
        return [redacted(p, known, seen) for p in items]

    def _encoded(self, view: PendingView, pending: Pending) -> bytes:
        """One item as JSON, made once per view (a view lasts until the next cycle)."""
        if view is not self._encoded_view:
            self._encoded_view, self._encoded_items = view, {}
        data = self._encoded_items.get(pending.key)
        if data is None:
            data = self._encoded_items[pending.key] = orjson.dumps(item_of(pending, view.at))
        return data

    async def _listing(
        self, request: web.Request, view: PendingView, items: Sequence[Pending]
    ) -> web.Response:
        user: Creator = request[USER]
        seen = await self.visible(user, {p.namespace for p in items})
        shown = [p for p in items if p.namespace in seen]
        try:
            limit = int(request.query.get("limit", DEFAULT_LIMIT))
            offset = int(request.query.get("offset", 0))
        except ValueError:
            return status_response(400, "BadRequest", "limit and offset are whole numbers")
        limit = max(0, min(limit, MAX_LIMIT))
        offset = max(0, offset)
        head = orjson.dumps(
            {
                "kind": "PendingAppWrapperList",
                "apiVersion": f"{GROUP}/{VERSION}",
                "metadata": {"creationTimestamp": _rfc3339(view.at)},
                "total": len(shown),
            }
        )
        page_items = await self._redacted(user, view, shown[offset : offset + limit], seen)
        page = b",".join(
            self._encoded(view, p)
            if p is view.by_key.get(p.key)
            else orjson.dumps(item_of(p, view.at))
            for p in page_items
        )
        body = head[:-1] + b',"items":[' + page + b"]}"
        return web.Response(body=body, content_type="application/json")

    async def all_namespaces(self, request: web.Request) -> web.Response:
        view = self._view()
        return await self._listing(request, view, view.items)

    async def namespace(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        if not await self.visible(request[USER], [namespace]):
            return _refused(namespace)
        view = self._view()
        return await self._listing(request, view, view.by_namespace.get(namespace, ()))

    async def cluster_queue(self, request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        queue = "" if queue == CAPACITY_ONLY else queue
        view = self._view()
        return await self._listing(request, view, view.by_queue.get(queue, ()))

    async def app_queue(self, request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['queue']}"
        if not await self.visible(request[USER], [request.match_info["namespace"]]):
            return _refused(request.match_info["namespace"])
        view = self._view()
        return await self._listing(request, view, view.by_local.get(key, ()))

    async def one(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not await self.visible(request[USER], [namespace]):
            return status_response(
                403, "Forbidden", f"you may not list appwrappers in namespace {namespace}"
            )
        view = self._view()
        pending = view.by_key.get(f"{namespace}/{name}")
        if pending is None:
            return status_response(404, "NotFound", f"appwrapper {namespace}/{name} is not pending")
        (pending,) = await self._redacted(request[USER], view, [pending], {namespace})
        return _json(
            {
                "kind": "PendingAppWrapper",
                "apiVersion": f"{GROUP}/{VERSION}",
                **item_of(pending, view.at),
            }
        )

    async def queues_view(self, request: web.Request) -> web.Response:
        user: Creator = request[USER]
        view = self._view()
        rows = self._queues()
        everywhere = await self.everywhere(user)
        seen = await self.visible(user, {*view.by_namespace, *(n for r in rows for n in r.admits)})
        rows = [r for r in rows if everywhere or seen.intersection(r.admits)]
        shown = await self._redacted(
            user, view, [p for p in view.items if p.namespace in seen], seen
        )
        page = queues_page(rows, shown, view.at, _prefix(request))
        return web.Response(text=page, content_type="text/html", charset="utf-8")

    async def appwrapper_view(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not await self.visible(request[USER], [namespace]):
            return status_response(
                403, "Forbidden", f"you may not list appwrappers in namespace {namespace}"
            )
        obj = self._appwrapper(f"{namespace}/{name}")
        if obj is None:
            return status_response(404, "NotFound", f"appwrapper {namespace}/{name} not found")
        view = self._view()
        pending = view.by_key.get(f"{namespace}/{name}")
        if pending is not None:
            (pending,) = await self._redacted(request[USER], view, [pending], {namespace})
        page = appwrapper_page(obj, pending, view.at)
        return web.Response(text=page, content_type="text/html", charset="utf-8")


def _refused(namespace: str) -> web.Response:
    return status_response(
        403, "Forbidden", f"you may not list appwrappers in namespace {namespace}"
    )


def _prefix(request: web.Request) -> str:
    """Links keep working behind `kubectl proxy` (which keeps the path as it is)."""
    return BASE


def _json(body: Obj) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")
