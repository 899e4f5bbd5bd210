"""The wrapped objects of an AppWrapper in a member cluster: the namespace they go to
there, create all or nothing, delete, and read their completion.

Side effects: API requests to the member cluster holding the objects.

Objects keep the AppWrapper's identity on the hub in their labels (name, namespace, uid)
whatever namespace of the member holds them (members[].namespaces): every function here
takes the member namespace, and a body is created with it as metadata.namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.api.constants import (
    API_VERSION,
    FIELD_MANAGER,
    KIND,
    LABEL_NAME,
    LABEL_NAMESPACE,
    LABEL_UID,
    MCAD_LABEL_APPWRAPPER,
    MCAD_LABEL_RESOURCE,
)
from dispatcher.api.models import AppWrapper, GenericItem, WrappedRef
from dispatcher.cluster.member import Member
from dispatcher.core.declared import dispatch_template
from dispatcher.core.podsets import inject_flavors, inject_labels
from dispatcher.core.quota.model import Flavor
from dispatcher.core.validation import is_label_value
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo, well_formed
from dispatcher.kube.errors import (
    AlreadyExists,
    BadRequest,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    UnknownKind,
)
from dispatcher.kube.informer import Informer

NAMESPACES = ResourceInfo("v1", "Namespace", "namespaces", namespaced=False)


class DispatchError(Exception):
    """Creating the wrapped objects failed for a reason that may pass (the server
    unreachable or overloaded, the namespace no longer mapped to the member): everything
    created was removed again, and the AppWrapper goes back to the queue."""


class UserInputError(DispatchError):
    """The objects as the user wrote them cannot be created: a template that cannot be
    built, a kind the member does not serve or that is cluster-scoped, a body the member
    refuses (invalid, forbidden), a name another object holds, the namespace missing in the
    member (only an operator can change that). The one dispatch error that fails the
    user's AppWrapper; any other exception met while dispatching is the dispatcher's own."""


@dataclass(frozen=True, slots=True)
class Wrapped:
    index: int
    api_version: str
    kind: str
    name: str
    body: dict[str, Any]
    completion: tuple[str, ...]

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.name}"


def wrapped_objects(
    aw: AppWrapper,
    *,
    owner_reference: bool,
    lenient: bool = False,
    flavors: Sequence[tuple[Flavor, Sequence[str]]] = (),
) -> list[Wrapped]:
    """The objects to create, labelled with the AppWrapper (and owned by it on the hub).

    Templates are user data that validation has passed, but building must not depend on
    that: an item of a shape that cannot be built raises UserInputError naming it, or, with
    `lenient` (deleting, where only identity matters), is reduced to its apiVersion, kind
    and name, or left out when those are not well formed (it was never created). The
    `flavors` of its admission go into every pod template they apply to.
    """
    labels = {
        LABEL_NAME: aw.metadata.name,
        LABEL_NAMESPACE: aw.metadata.namespace,
        LABEL_UID: aw.metadata.uid or "",
    }
    result = []
    for index, item in enumerate(aw.spec.items):
        try:
            item_labels = labels | mcad_labels(aw, item)
            template = dispatch_template(item, item_labels)
            body = _build(aw, template, item_labels, owner_reference)
            if flavors:
                inject_flavors(body, flavors)
            if lenient and _identity(body) is None:
                continue  # no well-formed identity: it was never created
            metadata = body["metadata"]
            result.append(
                Wrapped(
                    index=index,
                    api_version=body["apiVersion"],
                    kind=body["kind"],
                    name=metadata["name"],
                    body=body,
                    completion=item.completion_conditions(),
                )
            )
        except Exception as exc:
            if not lenient:
                if not isinstance(exc, UserInputError | RecursionError):
                    # Only the shapes `_build` refuses, and nesting deeper than the
                    # interpreter goes, are the template's fault; anything else is a bug of
                    # the dispatcher's, which must not fail the user's AppWrapper.
                    raise
                raise UserInputError(
                    f"item {index}: the object cannot be built: {type(exc).__name__}: "
                    f"{str(exc)[:200]}"
                ) from exc
            identity = _identity(item.generictemplate)
            if identity is not None:
                api_version, kind, name = identity
                result.append(Wrapped(index, api_version, kind, name, {}, ()))
    return result


def wrapped_identities(aw: AppWrapper) -> list[Wrapped]:
    """Which objects the spec makes and the conditions that mean each is done, without
    building their bodies (a deep copy of every template): what reading their completion
    needs, on every change of a dispatched AppWrapper's pods. An item with no well-formed
    identity is left out (it was never created)."""
    result = []
    for index, item in enumerate(aw.spec.items):
        identity = _identity(item.generictemplate)
        if identity is not None:
            api_version, kind, name = identity
            result.append(Wrapped(index, api_version, kind, name, {}, item.completion_conditions()))
    return result


def mcad_labels(aw: AppWrapper, item: GenericItem) -> dict[str, str]:
    """MCAD's labels for one item (the AppWrapper's name; the object's name), each only when
    it is a valid label value: a longer name would make the create fail, where MCAD's
    labels are only there to be found by."""
    metadata = item.generictemplate.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    candidates = {MCAD_LABEL_APPWRAPPER: aw.metadata.name, MCAD_LABEL_RESOURCE: name}
    return {
        key: value
        for key, value in candidates.items()
        if isinstance(value, str) and is_label_value(value)
    }


def _identity(template: Any) -> tuple[str, str, str] | None:
    """(apiVersion, kind, name) of a template when all three are well formed."""
    if not isinstance(template, Mapping):
        return None
    metadata = template.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    api_version, kind = template.get("apiVersion"), template.get("kind")
    if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)):
        return None
    if not name or name in (".", "..") or not well_formed(api_version, kind):
        return None
    if not name.isprintable() or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        return None  # no API server accepts it: it was never created
    return api_version, kind, name


def _build(
    aw: AppWrapper, template: dict[str, Any], labels: dict[str, str], owner_reference: bool
) -> dict[str, Any]:
    """The body to create; UserInputError on a template of a shape it cannot build
    (RecursionError on one nested too deep)."""
    body = inject_labels(template, labels)
    metadata = body.setdefault("metadata", {})
    metadata["namespace"] = aw.metadata.namespace
    for field in ("resourceVersion", "uid", "creationTimestamp", "generation"):
        metadata.pop(field, None)
    body.pop("status", None)
    if owner_reference and aw.metadata.uid:
        # On the hub itself, the garbage collector then removes the objects even if the
        # dispatcher is not running when the AppWrapper goes.
        owners = metadata.get("ownerReferences") or []
        if not isinstance(owners, list):
            raise UserInputError("metadata.ownerReferences is not a list")
        metadata["ownerReferences"] = [
            *owners,
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": aw.metadata.name,
                "uid": aw.metadata.uid,
                "controller": True,
            },
        ]
    api_version, kind, name = body.get("apiVersion"), body.get("kind"), metadata.get("name")
    if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)):
        raise UserInputError("apiVersion, kind and metadata.name must be strings")
    return body


def spec_change(aw: AppWrapper) -> str:
    """How the spec's objects differ from those recorded at dispatch ("" if they do not, or
    nothing was recorded): an edit after dispatch must not create objects that were never
    validated or fitted, nor orphan the ones it renamed or removed, nor leave running an
    object whose content (its pods) is no longer what the dispatcher accounts for."""
    recorded = aw.status.dispatchedObjects if aw.status is not None else None
    if recorded is None:
        return ""
    now = [item.ref() for item in aw.spec.items]
    before = {r.identity: r for r in recorded}
    after = {r.identity: r for r in now}
    gone = [r.label for r in recorded if r.identity not in after]
    added = [r.label for r in now if r.identity not in before]
    edited = [
        r.label
        for r in now
        if r.identity in before
        and before[r.identity].digest is not None  # recorded before fingerprints existed
        and before[r.identity].digest != r.digest
    ]
    parts = []
    if gone:
        parts.append("removed or renamed " + ", ".join(gone[:5]))
    if added:
        parts.append("added " + ", ".join(added[:5]))
    if edited:
        parts.append("edited " + ", ".join(edited[:5]))
    if parts:
        return "; ".join(parts)
    if [r.identity for r in now] != [r.identity for r in recorded]:
        return "reordered the wrapped objects"
    return ""


def dispatched_objects(aw: AppWrapper, *, owner_reference: bool) -> list[Wrapped]:
    """The objects its latest dispatch made, for deletion: those recorded in its status, or,
    dispatched without a record (by MCAD), those its spec names."""
    recorded = aw.status.dispatchedObjects if aw.status is not None else None
    if recorded is None:
        # Lenient: a template that cannot be built was never created, and must not keep
        # the finalizer (and the AppWrapper) forever.
        return wrapped_objects(aw, owner_reference=owner_reference, lenient=True)
    return [_deletable(index, ref) for index, ref in enumerate(recorded)]


def _deletable(index: int, ref: WrappedRef) -> Wrapped:
    # Deletion needs only the identity; the body is never sent.
    return Wrapped(index, ref.apiVersion, ref.kind, ref.name, {}, ())


def dispatch_error(message: str, exc: KubeError) -> DispatchError:
    """What a member's answer means for the dispatch: the body refused (bad request,
    invalid, forbidden, kind not served) is the user's input; anything else may pass."""
    if isinstance(exc, BadRequest | Forbidden | Invalid | UnknownKind):
        return UserInputError(message)
    return DispatchError(message)


async def ensure_namespace(
    client: KubeApi, namespace: str, *, labels: Mapping[str, str] | None = None
) -> None:
    """Create `namespace` with `labels` unless it exists (an existing one is left as it is)."""
    metadata: dict[str, Any] = {"name": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    try:
        await client.create(
            NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata}
        )
    except AlreadyExists:
        return


def target_namespace(member: Member, namespace: str) -> str:
    """The namespace of `member` where objects of an AppWrapper of hub namespace `namespace`
    go. One that it does not take was dispatched there before the mapping changed (the
    scheduler sends nothing else): DispatchError (not the user's), so the AppWrapper goes back
    to the queue, where only members that take it are considered."""
    placed = member.namespace_for(namespace)
    if placed is None:
        raise DispatchError(
            f"namespace {namespace} is not mapped to cluster {member.name} (members[].namespaces)"
        )
    return placed


async def prepare_namespace(member: Member, namespace: str) -> str:
    """The member namespace for hub namespace `namespace` (`target_namespace`), created with
    the member's `namespace_labels` when it may create it and it is missing."""
    placed = target_namespace(member, namespace)
    if member.create_namespaces and not member.is_hub:
        try:
            await ensure_namespace(member.client, placed, labels=member.namespace_labels)
        except KubeError as exc:
            raise dispatch_error(
                f"creating namespace {placed} in cluster {member.name}: {exc}", exc
            ) from exc
    return placed


def _missing_namespace(exc: NotFound, namespace: str) -> bool:
    """Whether a create answered 404 because `namespace` does not exist (not the kind)."""
    body = exc.body if isinstance(exc.body, Mapping) else {}
    details = body.get("details")
    if isinstance(details, Mapping) and details.get("kind") == "namespaces":
        return details.get("name") == namespace
    return str(exc) == f'namespaces "{namespace}" not found'


def made_by_dispatcher(obj: dict[str, Any]) -> bool:
    """Whether the API server recorded the dispatcher's field manager on `obj` (the uid label
    alone can be copied onto anything by whoever may create objects in the namespace)."""
    fields = obj.get("metadata", {}).get("managedFields") or []
    return any(entry.get("manager") == FIELD_MANAGER for entry in fields)


@dataclass(frozen=True, slots=True)
class Created:
    created: int
    """Objects created anew (the rest existed already and were adopted)."""
    terminating: tuple[str, ...] = ()
    """Objects of an earlier attempt still being deleted: created once they are gone."""


async def create_all(
    client: KubeApi, namespace: str, objects: list[Wrapped], *, uid: str
) -> Created:
    """Create every object; adopt ones this AppWrapper's dispatcher made already (a crash or
    restart between status write and creates), unless they are being deleted.

    An object of that name being deleted (an earlier attempt's, removed by a requeue) is
    neither adopted nor replaced: it is reported in `terminating`, and the caller tries again
    once it is gone. On any other failure, removes what this call created and raises
    DispatchError (UserInputError where the user's objects are refused) naming the object
    and the reason; any other exception is raised as it is (the dispatcher's own).
    """
    created: list[tuple[ResourceInfo, Wrapped]] = []
    terminating: list[str] = []

    async def one(obj: Wrapped) -> None:
        try:
            info = await client.resource_info(obj.api_version, obj.kind)
        except UnknownKind as exc:
            raise UserInputError(f"{obj.label}: {exc}") from exc
        if not info.namespaced:
            raise UserInputError(f"{obj.label}: kind {obj.kind} is cluster-scoped")
        # The member's namespace, whatever the template or the hub says (labels keep the
        # hub's identity).
        body = {**obj.body, "metadata": {**obj.body["metadata"], "namespace": namespace}}
        try:
            await client.create(info, namespace, body, field_manager=FIELD_MANAGER)
            created.append((info, obj))
        except AlreadyExists as exc:
            try:
                existing = await client.get(info, namespace, obj.name)
            except NotFound:
                # Gone between the create and the read: the next attempt creates it.
                terminating.append(obj.label)
                return
            meta = existing.get("metadata", {})
            if (meta.get("labels") or {}).get(LABEL_UID) != uid:
                raise UserInputError(
                    f"{obj.label} already exists in namespace {namespace} and does not belong "
                    "to this AppWrapper"
                ) from exc
            if meta.get("deletionTimestamp"):
                terminating.append(obj.label)
            elif not made_by_dispatcher(existing):
                raise UserInputError(
                    f"{obj.label} exists in namespace {namespace} and was not created by the "
                    "dispatcher"
                ) from exc
        except KubeError as exc:
            if isinstance(exc, NotFound) and _missing_namespace(exc, namespace):
                # Permanent, as Forbidden is: the member is not set up for this namespace,
                # and only an operator can change that. Requeued, the AppWrapper would be
                # sent to the same member again (it fits there) and fail again, at the cost
                # of status writes and Events each time, for as long as nobody acts.
                raise UserInputError(
                    f"namespace {namespace} does not exist in cluster {client.name}: create "
                    "it there, or set members[].create_namespaces"
                ) from exc
            if isinstance(exc, NotFound):
                # A create answered 404: the kind may no longer be served (its CRD went);
                # the next attempt asks discovery again instead of trusting the cache.
                client.forget_discovery(obj.api_version)
            raise dispatch_error(f"{obj.label}: {exc}", exc) from exc

    results = await asyncio.gather(*(one(o) for o in objects), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        for info, obj in created:
            # If this fails too, the next deletion attempt or the collector removes it.
            with contextlib.suppress(KubeError):
                await client.delete(info, namespace, obj.name, propagation="Background")
        first = failures[0]
        if isinstance(first, DispatchError):
            raise first
        if isinstance(first, KubeError):
            raise dispatch_error(str(first), first) from first
        raise first
    return Created(len(created), tuple(sorted(terminating)))


async def delete_all(
    client: KubeApi,
    namespace: str,
    objects: list[Wrapped],
    *,
    uid: str,
    deleting: Callable[[str], None] = lambda _uid: None,
) -> list[str]:
    """Ask for every object this AppWrapper owns to go; returns those that still exist.
    `deleting` is told the uid of each object before it is asked to go (its deletion is the
    dispatcher's own: it wakes no one, `Member.deleting`).

    Only objects the dispatcher made carrying the AppWrapper's uid label are touched: an
    object of the same name that someone else made (say, the reason a dispatch failed, even
    with a copied label) is never deleted, or an AppWrapper could delete what its author may
    not.
    """

    async def one(obj: Wrapped) -> str | None:
        try:
            info = await client.resource_info(obj.api_version, obj.kind)
        except UnknownKind:
            return None  # its CRD is gone, so is the object
        try:
            existing = await client.get(info, namespace, obj.name)
        except NotFound:
            return None
        meta = existing.get("metadata", {})
        if (meta.get("labels") or {}).get(LABEL_UID) != uid or not made_by_dispatcher(existing):
            return None
        # The uid precondition: never delete a newer object that took the name meanwhile.
        # Gone at once (no finalizers): nothing left to look for again.
        if meta.get("deletionTimestamp") is not None:
            return obj.label
        deleting(str(meta.get("uid") or ""))
        if await client.delete(
            info, namespace, obj.name, propagation="Background", uid=meta.get("uid")
        ):
            return None
        return obj.label

    results = await asyncio.gather(*(one(o) for o in objects))
    return [r for r in results if r is not None]


@dataclass(frozen=True, slots=True)
class Completion:
    items: int
    """Wrapped objects with a completionstatus."""
    done: int
    """How many of them show one of their completion conditions."""
    failed: str
    """"Kind/name failed: why" if one shows Failed."""
    polled: bool
    """Some object was read by a GET (no synced watch cache for its kind): its status will
    not announce itself, so the caller looks again later."""


async def completion(
    client: KubeApi,
    namespace: str,
    objects: list[Wrapped],
    *,
    uid: str,
    caches: Mapping[str, Informer] | None = None,
) -> Completion:
    """Read the completion of the objects with a completionstatus, from `caches` ("apiVersion/
    kind" -> synced watch cache) where there is one, else from the server."""
    watched = [o for o in objects if o.completion]
    done = 0
    failed = ""
    polled = False
    for obj in watched:
        cache = (caches or {}).get(f"{obj.api_version}/{obj.kind}")
        current: dict[str, Any] | None
        if cache is not None and cache.synced.is_set():
            current = cache.store.get(f"{namespace}/{obj.name}")
            if current is None:
                continue
        else:
            polled = True
            try:
                info = await client.resource_info(obj.api_version, obj.kind)
                current = await client.get(info, namespace, obj.name)
            except (NotFound, UnknownKind):
                continue
        labels = current.get("metadata", {}).get("labels") or {}
        if labels.get(LABEL_UID) != uid or not made_by_dispatcher(current):
            continue  # not ours (someone's look-alike): its status says nothing about us
        conditions = current.get("status", {}).get("conditions") or []
        true_types = {c.get("type") for c in conditions if c.get("status") == "True"}
        if true_types & set(obj.completion):
            done += 1
        elif "Failed" in true_types:
            why = next(
                (
                    c.get("reason") or c.get("message", "")
                    for c in conditions
                    if c.get("type") == "Failed"
                ),
                "",
            )
            failed = f"{obj.label} failed: {why}"
    return Completion(len(watched), done, failed, polled)


async def missing(
    client: KubeApi,
    namespace: str,
    objects: list[Wrapped],
    *,
    uid: str,
    caches: Mapping[str, Informer],
) -> str | None:
    """The first object made for this AppWrapper that is gone ("Kind/name": deleted by
    someone else, or being deleted), "" when all are there, None when some kind's cache has
    not synced yet (look again a little later: a deletion before its first list is never
    announced). Read from the kind's watch cache; an object the cache lacks is read again by
    GET before it counts as gone (the cache may not have seen a create yet). A kind with no
    cache (not served, or not watchable) is not judged: reading every object of it by GET on
    every change of the AppWrapper would cost more than it tells."""
    unsure = False
    for obj in objects:
        cache = caches.get(f"{obj.api_version}/{obj.kind}")
        if cache is None or not cache.permitted:
            continue
        if not cache.synced.is_set():
            unsure = True
            continue
        current = cache.store.get(f"{namespace}/{obj.name}")
        if current is None:
            try:
                info = await client.resource_info(obj.api_version, obj.kind)
                current = await client.get(info, namespace, obj.name)
            except NotFound:
                return obj.label
            except UnknownKind:
                continue
        meta = current.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL_UID) != uid:
            return obj.label  # ours is gone; the name is someone else's now
        if meta.get("deletionTimestamp"):
            return obj.label
    return None if unsure else ""
