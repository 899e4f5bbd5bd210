"""Who may get what through an AppWrapper: the rules of the admission webhook and of the
check before dispatch. Pure, no I/O.

The dispatcher creates wrapped objects with its own rights, so without these rules anyone
who may create an AppWrapper could create anything it wraps. The rules:

- The requester is recorded by the mutating webhook (annotation `USER`, the user's name,
  uid, groups and, when there are any, `extra` as the API server authenticated them) with
  an HMAC signature (`SIGNATURE`) over the namespace, that record and the spec. Only the
  dispatcher holds the key, so a record written by anyone else, or a spec edited while the
  webhook was absent, does not verify: such an AppWrapper counts as unattributed and is
  refused at dispatch unless the operator allows it (`Config.unattributed`).
- Every change of the spec is a new request: the record then names whoever made it (the
  creator at CREATE, the editor at an UPDATE of the spec), and every right is checked for
  that user. An update of metadata only keeps the record as it is.
- Every wrapped item needs the recorded user's own right to create that kind in the
  namespace (SubjectAccessReviews, asked by the shell; `accesses` says which).
- Priorities follow the namespace's `PriorityRule`; `preemptible: false` needs a verb of
  its own on appwrappers (`PriorityPolicy.nonpreemptible_verb`).
- Nobody writes the record by hand, and a dispatched AppWrapper's items do not change.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dispatcher.api.constants import GROUP
from dispatcher.core.phase import Phase, phase_of_raw

USER = f"{GROUP}/user"
"""Annotation: who created the AppWrapper or last changed its spec, as JSON {"username",
"uid", "groups"} and "extra" (only when not empty, so records written before it existed
read, and verify, as they were)."""
SIGNATURE = f"{GROUP}/user-signature"
"""Annotation: "v2:<signed at>:" + HMAC-SHA256 (hex) of the namespace, the USER text, the
spec and the time it was signed (whole seconds since the epoch, the webhook's clock); or,
written before records were bound to a time, "v1:" + HMAC of the first three."""
SIGNATURE_VERSION = "v1:"
TIMED_VERSION = "v2:"
_SECONDS = re.compile(r"[0-9]{1,12}")


class PriorityRule(BaseModel):
    """The priorities one namespace's AppWrappers may ask for."""

    model_config = ConfigDict(extra="forbid")

    classes: list[str] | None = None
    """Classes it may name, by any way a priority is named (`spec.priorityClassName`, a
    PriorityClass; Kueue's label `kueue.x-k8s.io/priority-class`, a WorkloadPriorityClass);
    None: any not refused by `refused_class_prefixes` whose value is in the range. A class
    listed here is allowed whatever its value and name."""
    max_priority: int | None = None
    """Highest priority it may use: a raw `spec.priority`, or the value of a class it names
    that is not listed in `classes`."""
    min_priority: int | None = None
    """Lowest priority it may use, read as `max_priority` is."""


class PriorityPolicy(BaseModel):
    """Which priorities each namespace may use (checked by the webhook and at dispatch)."""

    model_config = ConfigDict(extra="forbid")

    refused_class_prefixes: list[str] = Field(default_factory=lambda: ["system-"])
    """PriorityClass names no AppWrapper may use, unless its namespace's rule lists the
    class in `classes`."""
    default: PriorityRule = Field(default_factory=lambda: PriorityRule(max_priority=1_000_000_000))
    """For namespaces not in `namespaces`. 1e9 is the highest value of a user PriorityClass."""
    namespaces: dict[str, PriorityRule] = Field(default_factory=dict)
    """Namespace -> its rule, which narrows `default` and never widens it."""
    nonpreemptible_verb: str = "nonpreemptible"
    """`preemptible: false` needs this verb on workload.codeflare.dev appwrappers in the
    namespace (cluster-admin's `*` has it; the built-in admin and edit roles do not)."""

    def rule(self, namespace: str) -> PriorityRule:
        """The rule `namespace` is held to: its own narrows the default, never widens it
        (ranges intersected, class lists too), so a rule that lists only `classes` keeps
        the default's cap on every other priority."""
        own = self.namespaces.get(namespace)
        return self.default if own is None else narrowed(self.default, own)


def narrowed(default: PriorityRule, own: PriorityRule) -> PriorityRule:
    """`own` within `default`: the higher lower bound, the lower upper bound, and only the
    classes both allow (a rule with no list allows any)."""
    if default.classes is None or own.classes is None:
        classes = own.classes if default.classes is None else default.classes
    else:
        classes = [name for name in own.classes if name in default.classes]
    bounds = [own.max_priority, default.max_priority]
    floors = [own.min_priority, default.min_priority]
    return PriorityRule(
        classes=classes,
        max_priority=min((b for b in bounds if b is not None), default=None),
        min_priority=max((b for b in floors if b is not None), default=None),
    )


Extra = tuple[tuple[str, tuple[str, ...]], ...]
"""A user's `extra` (scopes, authentication method...) as a hashable value, sorted by key."""


def _extra_of(value: Any) -> Extra | None:
    """`extra` as the API server writes it ({key: [values]}), sorted; None when malformed."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        return None
    pairs: list[tuple[str, tuple[str, ...]]] = []
    for key, values in value.items():
        if not isinstance(key, str) or not isinstance(values, list):
            return None
        if not all(isinstance(v, str) for v in values):
            return None
        pairs.append((key, tuple(values)))
    return tuple(sorted(pairs))


@dataclass(frozen=True, slots=True)
class Creator:
    """A user as the API server authenticated them."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Extra = ()
    """Sent back in every SubjectAccessReview: an authorizer (or a webhook authorizer) may
    decide on it, e.g. a token's scopes."""

    @classmethod
    def from_user_info(cls, info: Mapping[str, Any]) -> Creator:
        """From an AdmissionRequest's `userInfo`."""
        groups = info.get("groups") or []
        return cls(
            username=str(info.get("username") or ""),
            uid=str(info.get("uid") or ""),
            groups=tuple(str(g) for g in groups if isinstance(g, str)),
            # A malformed extra is left out rather than guessed at: the API server never
            # sends one, and without it a review is only narrower.
            extra=_extra_of(info.get("extra")) or (),
        )

    @classmethod
    def from_annotation(cls, text: str) -> Creator | None:
        """The record read back; None when it is not one."""
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("username"), str):
            return None
        groups = data.get("groups") or []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            return None
        extra = _extra_of(data.get("extra"))
        if extra is None:
            return None
        return cls(
            username=data["username"],
            uid=str(data.get("uid") or ""),
            groups=tuple(groups),
            extra=extra,
        )

    def annotation(self) -> str:
        record: dict[str, Any] = {
            "username": self.username,
            "uid": self.uid,
            "groups": list(self.groups),
        }
        if self.extra:  # only then: a record without extra reads as it always did
            record["extra"] = self.extra_map()
        return json.dumps(record, separators=(",", ":"))

    def extra_map(self) -> dict[str, list[str]]:
        """`extra` as a SubjectAccessReview's `spec.extra` wants it."""
        return {key: list(values) for key, values in self.extra}


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(key: bytes, namespace: str, record: str, spec: Any, signed_at: int | None = None) -> str:
    """The signature of `record` for an AppWrapper of `namespace` with this `spec`, bound to
    `signed_at` (None: the old form, bound to no time; kept to sign again a record of that
    form with a newer key).

    The name is left out: with generateName it is not known yet when the webhook signs. A
    record copied onto another AppWrapper of the same namespace verifies only with the very
    same spec, so a copy gets nothing its creator was not allowed. The time lets the check
    before dispatch ask whether the webhook was in place from then on (core/recordtime.py).
    """
    if signed_at is None:
        signed = _canonical([namespace, record, spec])
        return SIGNATURE_VERSION + hmac.new(key, signed, hashlib.sha256).hexdigest()
    signed = _canonical([namespace, record, spec, signed_at])
    digest = hmac.new(key, signed, hashlib.sha256).hexdigest()
    return f"{TIMED_VERSION}{signed_at}:{digest}"


def signed_at_of(signature: Any) -> int | None:
    """The time a "v2:" signature says it was signed (None: another form, or malformed;
    the HMAC, checked with it, says whether it is true)."""
    if not isinstance(signature, str) or not signature.startswith(TIMED_VERSION):
        return None
    when, _, _ = signature[len(TIMED_VERSION) :].partition(":")
    # ASCII digits only: str.isdigit() takes "²" too, which int() refuses.
    return int(when) if _SECONDS.fullmatch(when) else None


@dataclass(frozen=True, slots=True)
class Attribution:
    """Who created an AppWrapper, if that can be trusted; else why not."""

    creator: Creator | None
    problem: str = ""
    signed_at: int | None = None
    """When the record was signed (a "v2:" signature that verified); None: the old form."""


def attribution(obj: Mapping[str, Any], keys: Sequence[bytes]) -> Attribution:
    """The verified creator of `obj` (an AppWrapper as the API server returns it)."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    record = annotations.get(USER)
    if not isinstance(record, str):
        return Attribution(
            None,
            f"no record of who created it (annotation {USER}): it was created while the "
            "dispatcher's admission webhook was not in place; apply it again",
        )
    creator = Creator.from_annotation(record)
    given = annotations.get(SIGNATURE)
    namespace = str(meta.get("namespace") or "")
    spec = obj.get("spec")
    if creator is not None and isinstance(given, str):
        signed_at = signed_at_of(given)
        for key in keys:
            # As bytes: compare_digest refuses str with non-ASCII characters (TypeError).
            expected = sign(key, namespace, record, spec, signed_at).encode()
            if hmac.compare_digest(expected, given.encode()):
                return Attribution(creator, signed_at=signed_at)
    return Attribution(
        None,
        f"its record of who created it (annotation {USER}) is not signed by the dispatcher's "
        "admission webhook for this spec: it was written or edited while the webhook was not "
        "in place; apply it again",
    )


# ------------------------------------------------------------------------------------------
# The mutating webhook


def _pointer(key: str) -> str:
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def record_patch(
    *,
    operation: str,
    obj: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: Creator,
    keys: Sequence[bytes],
    signed_at: int | None = None,
) -> list[dict[str, Any]]:
    """JSON patch that records the requester and signs the spec with `keys[0]`, bound to
    `signed_at` (the webhook's clock, whole seconds; None: the old form, bound to no time).

    A CREATE, and an UPDATE that changes the spec, are new requests: the record is `user`'s,
    whatever the object carried (the validating webhook checks every right of theirs). An
    UPDATE of metadata only keeps the old record, put back if the new object dropped it
    (`kubectl replace` of a file without it must not erase it); a changed one is left for the
    validating webhook to refuse with its reason. Such an update is signed again (with the
    current key) only when the old record verified with one of `keys`: signing an unverified
    one would launder a record forged while the webhook was absent. It keeps the time the
    record was first signed: a new time would launder a record stored while the webhook was
    away (the check before dispatch asks whether the webhook was in place since then).
    """
    meta = obj.get("metadata") or {}
    annotations = dict(meta.get("annotations") or {})
    namespace = str(meta.get("namespace") or "")
    wanted = dict(annotations)
    if operation == "CREATE" or spec_changed(obj, old):
        wanted[USER] = user.annotation()
        wanted[SIGNATURE] = sign(keys[0], namespace, wanted[USER], obj.get("spec"), signed_at)
    else:
        old_annotations = ((old or {}).get("metadata") or {}).get("annotations") or {}
        record = old_annotations.get(USER)
        if isinstance(record, str) and annotations.get(USER, record) == record:
            wanted[USER] = record
            found = attribution(old, keys) if old is not None else None
            if found is not None and found.creator is not None:
                wanted[SIGNATURE] = sign(
                    keys[0], namespace, record, obj.get("spec"), found.signed_at
                )
    if wanted == annotations:
        return []
    if "annotations" not in meta or not isinstance(meta.get("annotations"), dict):
        return [{"op": "add", "path": "/metadata/annotations", "value": wanted}]
    return [
        {"op": "add", "path": _pointer(k), "value": v}
        for k, v in wanted.items()
        if annotations.get(k) != v
    ]


# ------------------------------------------------------------------------------------------
# The validating webhook and the check before dispatch


def update_problems(obj: Mapping[str, Any], old: Mapping[str, Any], user: Creator) -> list[str]:
    """What an UPDATE by `user` may not do: set the record to anyone but `user` when it
    changes the spec, or change it at all when it does not; change the wrapped items of an
    AppWrapper that is dispatched (its objects exist: they would no longer match it)."""
    problems = []
    new_record = ((obj.get("metadata") or {}).get("annotations") or {}).get(USER)
    old_record = ((old.get("metadata") or {}).get("annotations") or {}).get(USER)
    what = f"annotation {USER} records who created the AppWrapper or last changed its spec"
    if spec_changed(obj, old):
        if new_record != user.annotation():
            problems.append(f"{what}; with this change of the spec it names {user.username}")
    elif old_record != new_record and (old_record is not None or new_record is not None):
        problems.append(f"{what}; it cannot change")
    if phase_of_raw(old) in (Phase.DISPATCHED, Phase.EVICTING) and _items(obj) != _items(old):
        problems.append(
            "the wrapped items cannot change while the AppWrapper is dispatched (its objects "
            "exist); delete it and apply the new version, or wait until it finishes"
        )
    return problems


def _items(obj: Mapping[str, Any]) -> Any:
    resources = (obj.get("spec") or {}).get("resources") or {}
    return resources.get("GenericItems") if isinstance(resources, dict) else resources


def spec_changed(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    return old is None or obj.get("spec") != old.get("spec")


def priority_problems(
    spec: Mapping[str, Any],
    *,
    namespace: str,
    policy: PriorityPolicy,
    class_value: int | None,
    workload_class: str = "",
    workload_class_value: int | None = None,
) -> list[str]:
    """Whether the namespace may use the priority `spec` asks for. `class_value` is the
    value of the PriorityClass it names (None: not found, or it names none);
    `workload_class` the Kueue WorkloadPriorityClass its label names, where the dispatcher
    reads that label ("" otherwise), with its value. Every class named is judged by the
    same rule; a raw `spec.priority` only when no class is named (it is not used then)."""
    rule = policy.rule(namespace)
    named = [
        ("PriorityClass", spec.get("priorityClassName"), class_value),
        ("WorkloadPriorityClass", workload_class, workload_class_value),
    ]
    problems: list[str] = []
    judged = False
    for kind, name, value in named:
        if isinstance(name, str) and name:
            judged = True
            problems += _class_problems(kind, name, value, rule, policy, namespace)
    if judged:
        return problems
    raw = spec.get("priority", 0)
    number = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if number is None:
        return []  # the schema and the spec validation answer a non-integer
    return _range_problems("priority", number, rule)


def _class_problems(
    kind: str,
    name: str,
    value: int | None,
    rule: PriorityRule,
    policy: PriorityPolicy,
    namespace: str,
) -> list[str]:
    if rule.classes is not None:
        if name in rule.classes:
            return []
        return [
            f"{kind} {name!r} is not one namespace {namespace} may use "
            f"(allowed: {', '.join(rule.classes) or 'none'})"
        ]
    refused = [p for p in policy.refused_class_prefixes if name.startswith(p)]
    if refused:
        return [
            f"{kind} {name!r} is reserved for the system (names starting with "
            f"{refused[0]!r} are refused)"
        ]
    if value is not None:
        return _range_problems(f"{kind} {name!r} has value", value, rule)
    return []


def _range_problems(what: str, value: int, rule: PriorityRule) -> list[str]:
    if rule.max_priority is not None and value > rule.max_priority:
        return [f"{what} {value}, above the highest this namespace may use ({rule.max_priority})"]
    if rule.min_priority is not None and value < rule.min_priority:
        return [f"{what} {value}, below the lowest this namespace may use ({rule.min_priority})"]
    return []


def wants_nonpreemptible(spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """`preemptible: false` asked for now and not already granted in the old spec. The
    webhook passes no `old`: an edit of the spec is a new request, and the right is not
    inherited from whoever set it before."""
    if spec.get("preemptible", True) is not False:
        return False
    return old is None or (old.get("spec") or {}).get("preemptible", True) is not False


@dataclass(frozen=True, slots=True, order=True)
class Access:
    """One right to ask the API server about (a SubjectAccessReview's resourceAttributes)."""

    verb: str
    group: str
    resource: str
    namespace: str

    def text(self) -> str:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.verb} {resource} in namespace {self.namespace}"

    def attributes(self) -> dict[str, str]:
        return {
            "verb": self.verb,
            "group": self.group,
            "resource": self.resource,
            "namespace": self.namespace,
        }

    def review(self) -> dict[str, dict[str, str]]:
        """This right as the part of a SubjectAccessReview's spec that names it."""
        return {"resourceAttributes": self.attributes()}


@dataclass(frozen=True, slots=True, order=True)
class PathAccess:
    """A right on a path that is no API resource (a SubjectAccessReview's
    nonResourceAttributes): `get /metrics`, as RBAC grants it with `nonResourceURLs`."""

    verb: str
    path: str

    def text(self) -> str:
        return f"{self.verb} {self.path}"

    def review(self) -> dict[str, dict[str, str]]:
        return {"nonResourceAttributes": {"verb": self.verb, "path": self.path}}


def nonpreemptible_access(namespace: str, policy: PriorityPolicy) -> Access:
    return Access(policy.nonpreemptible_verb, GROUP, "appwrappers", namespace)


def refusal(user: Creator, refused: Mapping[Access, list[str]]) -> str:
    """One message naming every refused right and the items that needed it."""
    parts = [
        f"{', '.join(items)}: {user.username} may not {access.text()}"
        for access, items in sorted(refused.items())
    ]
    return "; ".join(parts)
