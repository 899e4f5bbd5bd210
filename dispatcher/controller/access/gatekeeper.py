"""The gatekeeper: the admission webhook's answers and the permission check before
dispatch, with the requests they need: SubjectAccessReviews, discovery, PriorityClasses.
(Named for who gets in; "admission" is the quota record, `status.admission`.)

Side effects: reads from and creates SubjectAccessReviews in the hub. The rules are in
`dispatcher.core.gatekeeping`; this module asks the API server what they need to know.
Every replica answers the webhook (followers too), so nothing here reads the manager's
informers: PriorityClasses are read by name, discovery is the clients' own.
"""

from __future__ import annotations

import base64
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from pydantic import ValidationError

from dispatcher.api.constants import FINALIZER
from dispatcher.api.models import AppWrapper
from dispatcher.config import Config, DeclaredPodResources
from dispatcher.controller.access.answers import KeptAnswers
from dispatcher.controller.access.witness import RecordWitness
from dispatcher.core import gatekeeping as rules
from dispatcher.core import v1beta2rules as v1beta2
from dispatcher.core.convert import reserved_annotation_problems, reserved_field_problems
from dispatcher.core.gatekeeping import Access, Creator, PathAccess
from dispatcher.core.kindgroups import group_problem
from dispatcher.core.quota.kueue import (
    KUEUE_GROUP,
    KUEUE_PRIORITY_LABEL,
    KueueQuotas,
    priority_value,
)
from dispatcher.core.validation import annotation_problems, bounded_message, size_problem
from dispatcher.core.workloads import InvalidSpec, workload_of
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError, NotFound, UnknownKind

Obj = dict[str, Any]
SUBJECT_ACCESS_REVIEWS = ResourceInfo(
    "authorization.k8s.io/v1", "SubjectAccessReview", "subjectaccessreviews", namespaced=False
)
PRIORITY_CLASSES = ResourceInfo(
    "scheduling.k8s.io/v1", "PriorityClass", "priorityclasses", namespaced=False
)
KUEUE_VERSIONS = ("v1beta1", "v1beta2")
"""Kueue's API versions a WorkloadPriorityClass is looked up in, in this order."""
ANSWERS_LIMIT = 4096
UNSERVED_LIMIT = 4096
"""apiVersion/kind pairs remembered as served nowhere: names come from users' templates, so
the memory they take is bounded (oldest forgotten first)."""


@dataclass(frozen=True)
class DiscoveryBounds:
    """What one admission request may cost in discovery (the webhook's; the check before
    dispatch has none: what it checks passed the webhook, and an item it left out of the
    rights asked for would be created unchecked)."""

    max_api_versions: int
    """Distinct apiVersions of one AppWrapper's items looked up at most; more is refused."""
    kind_groups: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Kind -> groups, on top of `core.kindgroups.KNOWN_GROUPS`: other groups are refused
    before any lookup."""
    unserved_seconds: float = 10.0
    """How long "no cluster serves this apiVersion and kind" is believed."""


class Creates(Protocol):
    """What `AccessReviews` needs of a client: a KubeApi, or a budget in front of one."""

    async def create(
        self, info: ResourceInfo, namespace: str | None, body: Any, *, field_manager: str = ""
    ) -> dict[str, Any]: ...


class AccessReviews:
    """SubjectAccessReviews, each answer kept `keep_seconds`: a burst of AppWrappers from one
    user asks once, and a right taken away is seen within that time. Questions asked while
    the same one is in flight wait for its answer instead of asking again (a burst arrives
    in parallel, before any answer is kept; `answers.KeptAnswers`)."""

    def __init__(
        self, hub: Creates, *, keep_seconds: float, now: Callable[[], float] = time.monotonic
    ) -> None:
        self._hub = hub
        self._kept: KeptAnswers[tuple[Creator, Access | PathAccess], bool] = KeptAnswers(
            keep_seconds=keep_seconds, limit=ANSWERS_LIMIT, now=now
        )

    async def allowed(self, user: Creator, access: Access | PathAccess) -> bool:
        return await self._kept.get((user, access), lambda: self._ask(user, access))

    async def _ask(self, user: Creator, access: Access | PathAccess) -> bool:
        spec: Obj = {
            "user": user.username,
            "uid": user.uid,
            "groups": list(user.groups),
            **access.review(),
        }
        if user.extra:  # scopes, authentication method...: an authorizer may decide on them
            spec["extra"] = user.extra_map()
        review: Obj = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
        answer = await self._hub.create(SUBJECT_ACCESS_REVIEWS, None, review)
        return bool((answer.get("status") or {}).get("allowed"))

    async def refused(self, user: Creator, needed: Mapping[Access, list[str]]) -> str:
        """The message naming each right `user` lacks, "" when they have them all."""
        refused = {a: items for a, items in needed.items() if not await self.allowed(user, a)}
        return rules.refusal(user, refused) if refused else ""


class Gatekeeper:
    """Answers AdmissionReviews for AppWrappers, and checks an AppWrapper before dispatch."""

    def __init__(
        self,
        *,
        config: Config,
        hub: KubeApi,
        discovery: Sequence[KubeApi] = (),
        signing_keys: Callable[[], Sequence[bytes]] = lambda: (),
        bounds: DiscoveryBounds | None = None,
        now: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        witness: RecordWitness | None = None,
    ) -> None:
        self._config = config
        self._wall = wall
        self.witness = witness
        """Whether the webhook was in place when a record's spec was stored (the check
        before dispatch; None: records are honoured on their signature alone)."""
        self._bounds = bounds
        self._now = now
        self._unserved: OrderedDict[tuple[str, str], float] = OrderedDict()
        """(apiVersion, kind) -> when no cluster served it (with `bounds` only)."""
        self._hub = hub
        # Where a wrapped kind's REST name is looked up: the hub, then the members (a CRD
        # such as RayCluster may be installed only where the pods run).
        self._discovery = [hub, *(c for c in discovery if c is not hub)]
        self._keys = signing_keys
        self.reviews = AccessReviews(hub, keep_seconds=config.access_review_cache_seconds)
        self._log = structlog.get_logger("admission")

    # -- the webhook -------------------------------------------------------------------

    async def mutate(self, request: Mapping[str, Any]) -> Obj:
        """Record the requester (CREATE, a change of the spec) and sign the spec; at CREATE,
        add the dispatcher's finalizer (AdmissionResponse)."""
        keys = self._keys()
        obj = request.get("object") or {}
        operation = request.get("operation")
        if operation not in ("CREATE", "UPDATE") or request.get("subResource"):
            return _response(request, allowed=True)  # none is sent here: nothing to record
        # Set with the object, the finalizer costs the dispatcher no PATCH per AppWrapper
        # (it still adds one where it is missing: created with the webhook off).
        patch = _finalizer_patch(obj) if operation == "CREATE" else []
        if keys:
            patch += rules.record_patch(
                operation=str(operation),
                obj=obj,
                old=request.get("oldObject"),
                user=Creator.from_user_info(request.get("userInfo") or {}),
                keys=keys,
                signed_at=int(self._wall()),
            )
        return _response(request, allowed=True, patch=patch)

    async def validate(self, request: Mapping[str, Any]) -> Obj:
        """Allow, or deny with every problem found (AdmissionResponse)."""
        try:
            problems = await self._problems(request)
        except KubeError as exc:
            # The API server could not answer a question the decision needs: refuse, and
            # say so (failurePolicy Fail would refuse too, with a less useful message).
            problems = [f"could not check the request: {exc}"]
        if not problems:
            return _response(request, allowed=True)
        obj = request.get("object") or {}
        name = (obj.get("metadata") or {}).get("name") or request.get("name") or ""
        self._log.info(
            "admission_denied",
            namespace=request.get("namespace"),
            appwrapper=name,
            user=(request.get("userInfo") or {}).get("username"),
            reason=problems[0][:300],
        )
        return _response(request, allowed=False, message=bounded_message(problems))

    async def _problems(self, request: Mapping[str, Any]) -> list[str]:
        operation = request.get("operation")
        obj: Obj = request.get("object") or {}
        old: Obj | None = request.get("oldObject")
        user = Creator.from_user_info(request.get("userInfo") or {})
        if request.get("subResource"):
            return []  # none is sent here (status: manifests/status-policy.yaml)
        in_v1beta2 = v1beta2.requested_in_v1beta2(request)
        problems = reserved_annotation_problems(obj, old, in_v1beta2=in_v1beta2)
        problems += reserved_field_problems(obj)
        problems += annotation_problems(obj, old if operation == "UPDATE" else None)
        if operation == "UPDATE" and old is not None:
            problems += rules.update_problems(obj, old, user)
            if in_v1beta2:
                problems += v1beta2.immutable_problems(obj, old)
            if not rules.spec_changed(obj, old):
                # Metadata only (finalizers, labels): nothing more to check, but that it does
                # not take the AppWrapper past the size limit (one already past it, stored
                # while the webhook was away, must still lose its finalizer).
                limit = self._config.max_appwrapper_bytes
                grown = size_problem(obj, limit=limit)
                if grown and not size_problem(old, limit=limit):
                    problems.append(grown)
                return problems
        elif operation != "CREATE":
            return problems
        namespace = str(request.get("namespace") or "")
        spec_problems = await self.spec_problems(obj, namespace)
        if operation == "CREATE" and in_v1beta2:
            spec_problems += _structure_problems(obj)
        if spec_problems:
            return problems + spec_problems
        # old=None: a change of the spec is a new request by whoever makes it; every right
        # is theirs to have, `preemptible: false` included (the record will name them).
        needed, unknown = await self._needed(obj, namespace, old=None)
        refused = await self.reviews.refused(user, needed)
        return problems + unknown + ([refused] if refused else [])

    async def spec_problems(self, obj: Obj, namespace: str) -> list[str]:
        """What the dispatcher would fail the AppWrapper for, and the priority policy."""
        # First, before the object is parsed: one past the size limit costs no more.
        oversize = size_problem(obj, limit=self._config.max_appwrapper_bytes)
        if oversize:
            return [oversize]
        try:
            aw = AppWrapper.from_kube(obj)
        except ValidationError as exc:
            return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]]
        spec = obj.get("spec") or {}
        class_name = aw.spec.priorityClassName
        class_value: int | None = None
        if class_name:
            try:
                found = await self._hub.get(PRIORITY_CLASSES, None, class_name)
            except NotFound:
                return [f"PriorityClass {class_name!r} not found"]
            class_value = int(found.get("value", 0))
        kueue_class = (
            ""
            if self._config.kueue_quotas is KueueQuotas.OFF
            else aw.metadata.labels.get(KUEUE_PRIORITY_LABEL) or ""
        )
        problems = rules.priority_problems(
            spec,
            namespace=namespace,
            policy=self._config.priority_policy,
            class_value=class_value,
            workload_class=kueue_class,
            workload_class_value=await self._workload_class_value(kueue_class),
        )
        workload = workload_of(
            aw,
            priority=class_value if class_value is not None else aw.spec.priority,
            allowed_kinds=frozenset(self._config.allowed_kinds),
            now=datetime.now(UTC),
            declared_as_written=(
                self._config.declared_pod_resources is DeclaredPodResources.AS_WRITTEN
            ),
        )
        if isinstance(workload, InvalidSpec):
            problems.append(workload.message)
        return problems

    async def _workload_class_value(self, name: str) -> int | None:
        """The value of Kueue's WorkloadPriorityClass `name` (None: none named, or it cannot
        be read here: its name is judged all the same, and the check before dispatch holds
        its value to the range)."""
        if not name:
            return None
        for version in KUEUE_VERSIONS:
            try:
                info = await self._hub.resource_info(
                    f"{KUEUE_GROUP}/{version}", "WorkloadPriorityClass"
                )
                return priority_value(await self._hub.get(info, None, name))
            except UnknownKind:
                continue
            except KubeError as exc:
                self._log.info("workload_priority_class_unread", name=name, error=str(exc)[:200])
                return None
        return None

    async def _needed(
        self, obj: Obj, namespace: str, *, old: Obj | None, member: KubeApi | None = None
    ) -> tuple[dict[Access, list[str]], list[str]]:
        """Each right the AppWrapper needs of its creator, with the items that need it; and
        the items whose kind no cluster serves (no right can be named for them)."""
        needed: dict[Access, list[str]] = {}
        unknown: list[str] = []
        items = ((obj.get("spec") or {}).get("resources") or {}).get("GenericItems") or []
        refused = self._bounded(items)
        if refused:
            return needed, refused
        for index, item in enumerate(items):
            template = item.get("generictemplate") or {}
            kind = str(template.get("kind") or "")
            label = f"item {index} ({kind}/{(template.get('metadata') or {}).get('name') or ''})"
            if self._bounds is not None:
                problem = group_problem(
                    str(template.get("apiVersion") or ""), kind, self._bounds.kind_groups
                )
                if problem:
                    unknown.append(f"{label}: {problem}")
                    continue
            try:
                info = await self._resource(str(template.get("apiVersion") or ""), kind, member)
            except UnknownKind as exc:
                unknown.append(f"{label}: {exc}")
                continue
            group = info.group_version.rpartition("/")[0]
            access = Access("create", group, info.plural, namespace)
            needed.setdefault(access, []).append(label)
        if rules.wants_nonpreemptible(obj.get("spec") or {}, old):
            access = rules.nonpreemptible_access(namespace, self._config.priority_policy)
            needed.setdefault(access, []).append("preemptible: false")
        return needed, unknown

    def _bounded(self, items: Sequence[Any]) -> list[str]:
        """The refusal of an AppWrapper whose items name more apiVersions than one request
        may look up (empty: within bounds, or no bounds). Counted over the items whose kind
        and group are allowed, so the answer does not depend on what is cached."""
        if self._bounds is None:
            return []
        versions = set()
        for item in items:
            template = (item.get("generictemplate") if isinstance(item, dict) else None) or {}
            api_version = str(template.get("apiVersion") or "")
            kind = str(template.get("kind") or "")
            if not group_problem(api_version, kind, self._bounds.kind_groups):
                versions.add(api_version)
        limit = self._bounds.max_api_versions
        if len(versions) <= limit:
            return []
        return [
            f"the items name {len(versions)} distinct apiVersions; at most {limit} are looked "
            "up for one AppWrapper (webhook.max_api_versions): "
            + ", ".join(sorted(versions)[: limit + 1])
            + ("..." if len(versions) > limit + 1 else "")
        ]

    async def _resource(self, api_version: str, kind: str, member: KubeApi | None) -> ResourceInfo:
        key = (api_version, kind)
        if self._recently_unserved(key):
            raise UnknownKind(
                f"no cluster serves kind {kind!r} in {api_version!r} "
                "(is its CustomResourceDefinition installed?)"
            )
        clients = [*self._discovery, *([member] if member is not None else [])]
        last: UnknownKind | None = None
        for client in clients:
            try:
                return await client.resource_info(api_version, kind)
            except UnknownKind as exc:
                last = exc
        if self._bounds is not None:
            self._unserved[key] = self._now()
            while len(self._unserved) > UNSERVED_LIMIT:
                self._unserved.popitem(last=False)
        raise last or UnknownKind(f"kind {kind!r} in {api_version!r} is not served")

    def _recently_unserved(self, key: tuple[str, str]) -> bool:
        if self._bounds is None:
            return False
        since = self._unserved.get(key)
        if since is None:
            return False
        if self._now() - since < self._bounds.unserved_seconds:
            return True
        del self._unserved[key]
        return False

    # -- before dispatch ----------------------------------------------------------------

    def attribution_problem(self, obj: Mapping[str, Any]) -> str:
        """Why `obj` may not be dispatched for want of a trusted creator ("" if it may)."""
        if self._config.unattributed == "allow":
            return ""
        found = rules.attribution(obj, self._keys())
        if found.creator is not None and self.witness is not None:
            self.witness.receive(obj)  # so that it is proved while it waits in the queue
        return found.problem

    def creator_of(self, obj: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
        """Who created `obj` and their groups, as its signed record says; ("", ()) when it
        has no record the admission webhook signed (per-user and per-group fair sharing and
        limits count such work for no user, whatever `unattributed` allows)."""
        found = rules.attribution(obj, self._keys())
        if found.creator is None:
            return "", ()
        return found.creator.username, found.creator.groups

    async def dispatch_problem(self, obj: Obj, member: KubeApi) -> str:
        """Asked again just before the objects are created: may the recorded creator still
        create each of them? "" when they may (or when the check is off, or the AppWrapper
        is unattributed and the operator allows that). A record is honoured only if the
        webhook was in place when its spec was stored (`witness`), whatever
        `check_at_dispatch` says."""
        refusing = self._config.unattributed != "allow"
        if not self._config.check_at_dispatch and not (refusing and self.witness is not None):
            return ""
        found = rules.attribution(obj, self._keys())
        if found.creator is None:
            return found.problem if refusing else ""
        if refusing and self.witness is not None and not objects_made(obj):
            # Signed is not enough: signed for the API server's call that stored this spec,
            # not for a caller of the port whose record was stored while the webhook was away.
            late = await self.witness.problem(obj, found.signed_at)
            if late or not self._config.check_at_dispatch:
                return late
        if not self._config.check_at_dispatch:
            return ""
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        # A kind no cluster serves is left out: creating it says which, as it always has.
        needed, _ = await self._needed(obj, namespace, old=None, member=member)
        return await self.reviews.refused(found.creator, needed)


def _finalizer_patch(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON patch that adds the dispatcher's finalizer to `obj` (none if it has it)."""
    finalizers = (obj.get("metadata") or {}).get("finalizers")
    if not isinstance(finalizers, list):
        return [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}]
    if FINALIZER in finalizers:
        return []
    return [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}]


def objects_made(obj: Obj) -> bool:
    """Whether the objects of this AppWrapper's current attempt were made (and recorded so):
    its record was judged before they were, and a dispatched AppWrapper is not judged again
    by when it was signed (a restart, a configuration made again since, must not fail running
    work; an edit of its spec requeues it, and the next attempt is judged)."""
    status = obj.get("status") or {}
    attempt = status.get("lastDispatchedAt")
    return bool(attempt) and status.get("objectsMadeFor") == attempt


def _response(
    request: Mapping[str, Any],
    *,
    allowed: bool,
    message: str = "",
    patch: list[dict[str, Any]] | None = None,
) -> Obj:
    response: Obj = {"uid": request.get("uid", ""), "allowed": allowed}
    if message:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return response


def _structure_problems(obj: Obj) -> list[str]:
    """The AppWrapper controller's structural invariants of a v1beta2 create (none when the
    object does not parse: `spec_problems` says why)."""
    try:
        aw = AppWrapper.from_kube(obj)
    except ValidationError:
        return []
    return v1beta2.structure_problems(aw)
