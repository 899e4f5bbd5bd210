"""The admission webhook's answers and the permission check before dispatch, with the
requests they need: SubjectAccessReviews, discovery, PriorityClasses.

Side effects: reads from and creates SubjectAccessReviews in the hub. The rules are in
`dispatcher.core.admission`; this module asks the API server what they need to know.
Every replica answers the webhook (followers too), so nothing here reads the manager's
informers: PriorityClasses are read by name, discovery is the clients' own.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import structlog
from pydantic import ValidationError

from dispatcher.api.models import AppWrapper
from dispatcher.config import Config, DeclaredPodResources
from dispatcher.core import admission as rules
from dispatcher.core.admission import Access, Creator
from dispatcher.core.validation import bounded_message, size_problem
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
ANSWERS_LIMIT = 4096


class AccessReviews:
    """SubjectAccessReviews, each answer kept `keep_seconds`: a burst of AppWrappers from one
    user asks once, and a right taken away is seen within that time."""

    def __init__(
        self, hub: KubeApi, *, keep_seconds: float, now: Callable[[], float] = time.monotonic
    ) -> None:
        self._hub = hub
        self._keep = keep_seconds
        self._now = now
        self._answers: dict[tuple[Creator, Access], tuple[float, bool]] = {}

    async def allowed(self, user: Creator, access: Access) -> bool:
        key = (user, access)
        cached = self._answers.get(key)
        now = self._now()
        if cached is not None and now - cached[0] < self._keep:
            return cached[1]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.username,
                "uid": user.uid,
                "groups": list(user.groups),
                "resourceAttributes": access.attributes(),
            },
        }
        answer = await self._hub.create(SUBJECT_ACCESS_REVIEWS, None, review)
        allowed = bool((answer.get("status") or {}).get("allowed"))
        if len(self._answers) >= ANSWERS_LIMIT:
            self._answers.clear()  # a bound, not a policy: answers are cheap to ask again
        self._answers[key] = (now, allowed)
        return allowed

    async def refused(self, user: Creator, needed: Mapping[Access, list[str]]) -> str:
        """The message naming each right `user` lacks, "" when they have them all."""
        refused = {a: items for a, items in needed.items() if not await self.allowed(user, a)}
        return rules.refusal(user, refused) if refused else ""


class Admission:
    """Answers AdmissionReviews for AppWrappers, and checks an AppWrapper before dispatch."""

    def __init__(
        self,
        *,
        config: Config,
        hub: KubeApi,
        discovery: Sequence[KubeApi] = (),
        signing_keys: Callable[[], Sequence[bytes]] = lambda: (),
    ) -> None:
        self._config = config
        self._hub = hub
        # Where a wrapped kind's REST name is looked up: the hub, then the members (a CRD
        # such as RayCluster may be installed only where the pods run).
        self._discovery = [hub, *(c for c in discovery if c is not hub)]
        self._keys = signing_keys
        self.reviews = AccessReviews(hub, keep_seconds=config.access_review_cache_seconds)
        self._log = structlog.get_logger("admission")

    # -- the webhook -------------------------------------------------------------------

    async def mutate(self, request: Mapping[str, Any]) -> Obj:
        """Record the creator (CREATE) and sign the spec (AdmissionResponse)."""
        keys = self._keys()
        obj = request.get("object") or {}
        if not keys or request.get("operation") not in ("CREATE", "UPDATE"):
            return _response(request, allowed=True)
        patch = rules.record_patch(
            operation=str(request["operation"]),
            obj=obj,
            old=request.get("oldObject"),
            user=Creator.from_user_info(request.get("userInfo") or {}),
            key=keys[0],
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
        problems: list[str] = []
        if operation == "UPDATE" and old is not None:
            problems += rules.update_problems(obj, old)
            if not rules.spec_changed(obj, old):
                return problems  # metadata only (finalizers, labels): nothing more to check
        elif operation != "CREATE":
            return problems
        namespace = str(request.get("namespace") or "")
        user = Creator.from_user_info(request.get("userInfo") or {})
        spec_problems = await self.spec_problems(obj, namespace)
        if spec_problems:
            return problems + spec_problems
        needed, unknown = await self._needed(obj, namespace, old=old)
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
        problems = rules.priority_problems(
            spec, namespace=namespace, policy=self._config.priority_policy, class_value=class_value
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

    async def _needed(
        self, obj: Obj, namespace: str, *, old: Obj | None, member: KubeApi | None = None
    ) -> tuple[dict[Access, list[str]], list[str]]:
        """Each right the AppWrapper needs of its creator, with the items that need it; and
        the items whose kind no cluster serves (no right can be named for them)."""
        needed: dict[Access, list[str]] = {}
        unknown: list[str] = []
        items = ((obj.get("spec") or {}).get("resources") or {}).get("GenericItems") or []
        for index, item in enumerate(items):
            template = item.get("generictemplate") or {}
            kind = str(template.get("kind") or "")
            label = f"item {index} ({kind}/{(template.get('metadata') or {}).get('name') or ''})"
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

    async def _resource(self, api_version: str, kind: str, member: KubeApi | None) -> ResourceInfo:
        clients = [*self._discovery, *([member] if member is not None else [])]
        last: UnknownKind | None = None
        for client in clients:
            try:
                return await client.resource_info(api_version, kind)
            except UnknownKind as exc:
                last = exc
        raise last or UnknownKind(f"kind {kind!r} in {api_version!r} is not served")

    # -- before dispatch ----------------------------------------------------------------

    def attribution_problem(self, obj: Mapping[str, Any]) -> str:
        """Why `obj` may not be dispatched for want of a trusted creator ("" if it may)."""
        if self._config.unattributed == "allow":
            return ""
        return rules.attribution(obj, self._keys()).problem

    async def dispatch_problem(self, obj: Obj, member: KubeApi) -> str:
        """Asked again just before the objects are created: may the recorded creator still
        create each of them? "" when they may (or when the check is off, or the AppWrapper
        is unattributed and the operator allows that)."""
        if not self._config.check_at_dispatch:
            return ""
        found = rules.attribution(obj, self._keys())
        if found.creator is None:
            return "" if self._config.unattributed == "allow" else found.problem
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        # A kind no cluster serves is left out: creating it says which, as it always has.
        needed, _ = await self._needed(obj, namespace, old=None, member=member)
        return await self.reviews.refused(found.creator, needed)


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
