"""Conversion between the two AppWrapper generations, v1beta1 (MCAD's fields, the
dispatcher's own model and the storage version) and v1beta2 (the AppWrapper controller's
`components`). Pure, no I/O: the conversion webhook (dispatcher/kube/webhook.py) calls
`convert` for every object the API server asks about.

Both directions work on the objects as JSON (dicts), not on the pydantic models: a
conversion must hand back every field it was given, including ones the models drop.

What each generation expresses natively:

- both: `metadata`, `spec.suspend`, and per wrapped object its template
  (`generictemplate` / `template`), `podSets`, `podSetInfos` and `annotations` (v1beta1
  carries the last four as this dispatcher's additions to MCAD's fields);
- v1beta1 only: everything else in `spec` (priority, schedulingSpec, custompodresources,
  completionstatus, MCAD's legacy fields...). In v1beta2 it is kept, as JSON, in the
  annotation `V1BETA1_FIELDS`, and restored from it;
- v1beta2 only: `spec.managedBy` and spec fields this dispatcher does not know. In v1beta1
  they are kept in the annotation `V1BETA2_FIELDS`;
- status: the dispatcher writes status in v1beta1 only, and it is never taken from anywhere
  but the stored status (the status subresource): not from an annotation, not from a status
  written in v1beta2 (a v1beta2 status with nothing of v1beta1's in it is dropped on the way
  to storage). The v1beta2 status is the v1beta1
  one, every field of it, plus what v1beta2 adds (`phase`, `resettingCount`,
  `componentStatus` once the objects are made, and the
  conditions QuotaReserved, ResourcesDeployed, PodsReady, Unhealthy, DeletingResources
  beside the v1beta1 ones: no type is in both), derived by `v1beta2_status`
  (core/v1beta2status.py). So `kubectl get aw` (v1beta2, the preferred version) still
  shows `status.state` and `kubectl wait --for=condition=Running` still works; and on an
  update of the main resource in v1beta2, where the API server keeps the old status *as
  converted* and converts it back, nothing of the v1beta1 status is lost. The derived
  fields are dropped on the way back (they are derived again).

The reserved annotations are the conversion's alone (`RESERVED_ANNOTATIONS`): each direction
reads the one it wrote for the other (`V1BETA2_FIELDS` in v1beta1, `V1BETA1_FIELDS` in
v1beta2) and drops every reserved annotation it finds. So a value a user wrote where it is not
read is dropped, and one read is never a source of status: `V1BETA1_FIELDS` written in a
v1beta2 request becomes that request's v1beta1 spec, as any spec the user writes (the
admission webhook judges it converted, and refuses a reserved annotation set or changed in a
v1beta1 request: `reserved_annotation_problems`). A value that is not JSON, not an object, or
nested past `jsontext.DEEP_DECODE_LIMIT` is dropped, not fatal.

Reading (v1beta1 to v1beta2: every get, list and watch in the preferred version) never fails:
a stored object v1beta2 cannot express (say a spec that is not an object, stored under an
older schema) is shown in a marked form, `spec.components` empty, its whole v1beta1 spec
kept in `V1BETA1_FIELDS` and the reason in `UNREADABLE` (see `unreadable_v1beta2`), which
converts back to the same object; one such object never fails a list. Writing (v1beta2 to
v1beta1) fails with a ConversionError naming the field, which the API server shows the
writer; it is never an exception of another kind (the webhook turns any into a Failure
naming the object).

A template stash whose item no longer matches (a v1beta2 edit removed or reordered
components) is matched by the wrapped object's kind and name, never by position alone, so
one item's MCAD fields never land on another object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dispatcher.core import jsontext
from dispatcher.core.v1beta2status import (
    V1BETA2_CONDITION_TYPES,
    component_status,
    v1beta2_status,
)

GROUP: Final = "workload.codeflare.dev"
V1BETA1: Final = f"{GROUP}/v1beta1"
V1BETA2: Final = f"{GROUP}/v1beta2"
V1BETA1_FIELDS: Final = f"{GROUP}/v1beta1-fields"
"""Annotation on a v1beta2 object: the v1beta1 fields v1beta2 cannot express (JSON)."""
V1BETA2_FIELDS: Final = f"{GROUP}/v1beta2-fields"
"""Annotation on a v1beta1 object: the v1beta2 fields v1beta1 cannot express (JSON)."""
UNREADABLE: Final = f"{GROUP}/v1beta2-unreadable"
"""Annotation on a v1beta2 view: why this AppWrapper is shown without its components (a
stored object v1beta2 cannot express); read or change it as v1beta1."""
RESERVED_ANNOTATIONS: Final = (V1BETA1_FIELDS, V1BETA2_FIELDS, UNREADABLE)
RAW_SPEC: Final = "$spec"
"""Key, in a `V1BETA1_FIELDS` stash, of a whole v1beta1 spec kept as it is
(`unreadable_v1beta2`)."""
V1BETA2_STATUS_FIELDS: Final = frozenset(
    {"phase", "resettingCount", "retryCount", "componentStatus"}
)
"""Status fields only v1beta2 has."""

ANNOTATIONS_LIMIT: Final = 256 * 1024 - 1024
"""The API server's bound on all annotations of an object together (256 KiB of keys and
values), less a margin. A stash that would pass it is left out of the v1beta2 view (`OMITTED`
says so and how large it was): a conversion whose answer the API server refuses would make
every list of the namespace fail in v1beta2."""
OMITTED: Final = "$omitted"

# Fields of a wrapped object both generations carry under the same name.
SHARED_ITEM_FIELDS: Final = ("podSets", "podSetInfos", "annotations")
STASH_KEYS: Final = frozenset({"spec", "items", "resources", "GenericItems", OMITTED, RAW_SPEC})
"""What a stash names itself: a stored spec field of one of these names is kept whole
(`unreadable_v1beta2`), not mixed in among them."""
ABSENT: Final = "absent"
"""Marks, in a stash, a v1beta1 field that was absent where v1beta2 requires one
(`resources`, an item's `generictemplate`)."""

Obj = dict[str, Any]


class ConversionError(ValueError):
    """The object cannot be converted; the message names the field."""


def copy_json(value: Any) -> Any:
    """A copy of a JSON value (dicts, lists, scalars) made with an explicit stack: a user's
    object may be nested deeper than `copy.deepcopy`'s recursion allows (two frames a level),
    and a conversion that failed on it would fail every read of its namespace."""
    if not isinstance(value, dict | list):
        return value
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        source, target = stack.pop()
        items = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in items:
            if isinstance(item, dict | list):
                child: Any = {} if isinstance(item, dict) else []
                stack.append((item, child))
            else:
                child = item
            if isinstance(target, dict):
                target[key] = child
            else:
                target.append(child)
    return root


def convert(obj: Mapping[str, Any], desired: str) -> Obj:
    """`obj` (an AppWrapper of either generation) as `desired` ("group/version").
    Raises ConversionError naming the field that stops it."""
    source = str(obj.get("apiVersion") or "")
    if source not in (V1BETA1, V1BETA2):
        raise ConversionError(f"apiVersion {source!r}: not an AppWrapper version served here")
    if desired not in (V1BETA1, V1BETA2):
        raise ConversionError(f"desiredAPIVersion {desired!r}: not served here")
    if source == desired:
        same: Obj = copy_json(dict(obj))
        return same
    if desired == V1BETA1:
        return to_v1beta1(obj)
    try:
        return to_v1beta2(obj)
    except Exception as exc:  # a read must never fail: see the module docstring
        return unreadable_v1beta2(obj, exc)


def reserved_annotation_problems(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None, *, in_v1beta2: bool
) -> list[str]:
    """What the admission webhook refuses of a request's reserved annotations: set, changed or
    removed by the user. A request made in v1beta2 reaches the webhook as v1beta1, converted:
    its reserved annotations are the conversion's writing, not the user's, and pass."""
    if in_v1beta2:
        return []
    now, before = _annotations(dict(obj)), _annotations(dict(old or {}))
    return [
        f"metadata.annotations[{key}] is written by the dispatcher's conversion between "
        "v1beta1 and v1beta2; it cannot be set, changed or removed"
        for key in RESERVED_ANNOTATIONS
        if now.get(key) != before.get(key)
    ]


def reserved_field_problems(obj: Mapping[str, Any]) -> list[str]:
    """Fields of a request the conversion reserves: an item's `$ref` (what a stash entry
    names its object by). Such an AppWrapper would be shown in v1beta2 only in the marked
    form (`unreadable_v1beta2`): refused at apply instead, naming the field."""
    spec = obj.get("spec")
    resources = spec.get("resources") if isinstance(spec, Mapping) else None
    items = resources.get("GenericItems") if isinstance(resources, Mapping) else None
    return [
        f"spec.resources.GenericItems[{index}].$ref: a field name the conversion between "
        "v1beta1 and v1beta2 reserves"
        for index, item in enumerate(items if isinstance(items, list) else [])
        if isinstance(item, Mapping) and "$ref" in item
    ]


# -- v1beta1 -> v1beta2 ----------------------------------------------------------------------


def to_v1beta2(obj: Mapping[str, Any]) -> Obj:
    """A v1beta1 AppWrapper as v1beta2 (see the module docstring for what goes where)."""
    out = _copy_top(obj, V1BETA2)
    annotations = _annotations(out)
    carried = _take_reserved(annotations, V1BETA2_FIELDS)
    spec = copy_json(_stored_mapping(obj, "spec", "spec"))
    stash: Obj = {} if "spec" in obj else {"spec": ABSENT}
    new_spec: Obj = {}
    if isinstance(carried.get("spec"), Mapping):
        # v1beta2 fields this dispatcher does not know; never those v1beta1 holds itself.
        new_spec.update(
            (k, v) for k, v in carried["spec"].items() if k not in ("components", "suspend")
        )
    new_spec.pop("managedBy", None)
    if "suspend" in spec:
        new_spec["suspend"] = spec.pop("suspend")
    if "managedBy" in carried:
        new_spec["managedBy"] = carried["managedBy"]
    if "resources" not in spec:
        stash["resources"] = ABSENT
        new_spec["components"] = []
    else:
        resources = _stored_mapping(spec, "resources", "spec.resources")
        del spec["resources"]
        if "GenericItems" not in resources:
            stash["GenericItems"] = ABSENT
        items = resources.pop("GenericItems", [])
        if not isinstance(items, list):
            raise ConversionError("spec.resources.GenericItems: not a list")
        components, item_stash = _components(items)
        new_spec["components"] = components
        if any(len(entry) > 1 for entry in item_stash):
            stash["items"] = item_stash
        if resources:
            stash["resources"] = resources
    taken = STASH_KEYS & set(spec)
    if taken:
        raise ConversionError(f"spec.{sorted(taken)[0]}: a field name the conversion reserves")
    stash.update(spec)  # what is left of spec is v1beta1's alone
    if stash:
        _stash(annotations, stash)
    _set_annotations(out, annotations)
    out["spec"] = new_spec
    # The stored status alone (never `carried`): see the module docstring.
    status = obj.get("status")
    if isinstance(status, Mapping) and status:
        out["status"] = _v1beta2_status(status, obj.get("spec"))
        made = component_status(new_spec["components"], status, seed=_seed(obj))
        if made:
            out["status"]["componentStatus"] = made
    elif "status" in obj:
        out["status"] = copy_json(status)
    return out


def unreadable_v1beta2(obj: Mapping[str, Any], cause: Exception) -> Obj:
    """The marked v1beta2 view of a stored v1beta1 object `to_v1beta2` could not express:
    listable and readable (metadata, status), no components, the whole v1beta1 spec kept as it
    is in `V1BETA1_FIELDS` (so `to_v1beta1` gives back the same object: a deletion or a label
    made in v1beta2 loses nothing), and why in `UNREADABLE`."""
    out = _copy_top(obj, V1BETA2)
    annotations = _annotations(out)
    _take_reserved(annotations, V1BETA2_FIELDS)
    _stash(annotations, {RAW_SPEC: copy_json(obj["spec"])} if "spec" in obj else {"spec": ABSENT})
    annotations[UNREADABLE] = (
        f"this AppWrapper cannot be shown in v1beta2 ({str(cause)[:200]}); read or change it "
        "as v1beta1 (appwrappers.v1beta1.workload.codeflare.dev)"
    )
    _set_annotations(out, annotations)
    out["spec"] = {"components": []}
    status = obj.get("status")
    if isinstance(status, Mapping):
        out["status"] = copy_json(dict(status))
    return out


def _stash(annotations: dict[str, str], stash: Obj) -> None:
    """Write `stash` into `V1BETA1_FIELDS`, or where the annotations could not hold it, its
    size under `OMITTED`."""
    text = _dump(stash)
    if _annotations_size(annotations) + len(V1BETA1_FIELDS) + _size(text) > ANNOTATIONS_LIMIT:
        text = _dump({OMITTED: _size(text)})
    annotations[V1BETA1_FIELDS] = text


def _seed(obj: Mapping[str, Any]) -> str:
    """What generated names are seeded by: the uid (as `AppWrapper._generated_names`)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


def _components(items: list[Any]) -> tuple[list[Obj], list[Obj]]:
    components: list[Obj] = []
    stashes: list[Obj] = []
    for index, raw in enumerate(items):
        if not isinstance(raw, Mapping) or "$ref" in raw:
            raise ConversionError(
                f"spec.resources.GenericItems[{index}]: not an object without a field $ref"
            )
        item = dict(raw)
        component: Obj = {}
        if "generictemplate" in item:
            component["template"] = item.pop("generictemplate")
        else:
            component["template"] = {}
            item["generictemplate"] = ABSENT
        for name in SHARED_ITEM_FIELDS:
            if name in item:
                component[name] = item.pop(name)
        components.append(component)
        # The item's MCAD fields (maybe none), with the object they belong to: every item
        # has an entry, so that positions still match where nothing was reordered.
        stashes.append({"$ref": _ref(component["template"]), **item})
    return components, stashes


# -- v1beta2 -> v1beta1 ----------------------------------------------------------------------


def to_v1beta1(obj: Mapping[str, Any]) -> Obj:
    """A v1beta2 AppWrapper as v1beta1 (see the module docstring for what goes where)."""
    out = _copy_top(obj, V1BETA1)
    annotations = _annotations(out)
    stash = _take_reserved(annotations, V1BETA1_FIELDS)
    if OMITTED in stash:
        raise ConversionError(
            f"metadata.annotations[{V1BETA1_FIELDS}]: this AppWrapper's v1beta1 fields "
            f"({stash[OMITTED]} bytes as JSON) are more than annotations may hold, so they are "
            "not in its v1beta2 view and a change made there would lose them: change it as "
            "v1beta1 (appwrappers.v1beta1.workload.codeflare.dev)"
        )
    spec = copy_json(_mapping(obj.get("spec"), "spec"))
    if RAW_SPEC in stash:
        return _from_unreadable(obj, out, annotations, stash[RAW_SPEC])
    carried: Obj = {}
    if "managedBy" in spec:
        carried["managedBy"] = spec.pop("managedBy")
    components = spec.pop("components", [])
    if not isinstance(components, list):
        raise ConversionError("spec.components: not a list")
    new_spec: Obj = {}
    spec_absent = stash.pop("spec", None) == ABSENT
    item_stash = stash.pop("items", [])
    resources_stash = stash.pop("resources", None)
    items_absent = stash.pop("GenericItems", None) == ABSENT
    new_spec.update(stash)
    if "suspend" in spec:
        new_spec["suspend"] = spec.pop("suspend")
    if spec:  # fields of v1beta2 this dispatcher does not know: kept, not dropped
        carried["spec"] = spec
    items = _items(components, item_stash if isinstance(item_stash, list) else [])
    if resources_stash == ABSENT and not items:
        pass
    else:
        resources: Obj = dict(resources_stash) if isinstance(resources_stash, Mapping) else {}
        if items or not items_absent:
            resources["GenericItems"] = items
        new_spec["resources"] = resources
    if new_spec or not spec_absent:
        out["spec"] = new_spec
    _set_v1beta1_status(out, obj)
    if carried:
        annotations[V1BETA2_FIELDS] = _dump(carried)
    _set_annotations(out, annotations)
    return out


def _set_v1beta1_status(out: Obj, obj: Mapping[str, Any]) -> None:
    """The v1beta1 part of `obj`'s status (what the dispatcher wrote), nothing else: a status
    with nothing of v1beta1's in it is dropped, never kept for later (see the docstring)."""
    status = obj.get("status")
    own = _v1beta1_status(status) if isinstance(status, Mapping) else {}
    if own:
        out["status"] = own
    elif "status" in obj and not (isinstance(status, Mapping) and status):
        out["status"] = copy_json(status)  # empty, or not an object: as it is


def _from_unreadable(
    obj: Mapping[str, Any], out: Obj, annotations: dict[str, str], spec: Any
) -> Obj:
    """The v1beta1 object an `unreadable_v1beta2` view was made of: its spec as kept. A change
    of the components made in v1beta2 cannot be applied to it."""
    if (_mapping(obj.get("spec"), "spec")).get("components"):
        raise ConversionError(
            f"metadata.annotations[{UNREADABLE}]: this AppWrapper cannot be shown in v1beta2, "
            "so its components cannot be changed there: change it as v1beta1 "
            "(appwrappers.v1beta1.workload.codeflare.dev)"
        )
    out["spec"] = copy_json(spec)
    _set_v1beta1_status(out, obj)
    _set_annotations(out, annotations)
    return out


def _items(components: list[Any], stashes: list[Any]) -> list[Obj]:
    entries = [dict(e) if isinstance(e, Mapping) else {} for e in stashes]
    used = [False] * len(entries)
    items: list[Obj] = []
    for index, raw in enumerate(components):
        component = dict(_mapping(raw, f"spec.components[{index}]"))
        template = component.pop("template", {})
        extra = _take(entries, used, index, _ref(template))
        item: Obj = {}
        if extra.pop("generictemplate", None) != ABSENT or template != {}:
            item["generictemplate"] = template
        for name in SHARED_ITEM_FIELDS:
            if name in component:
                item[name] = component.pop(name)
        if component:
            raise ConversionError(
                f"spec.components[{index}]: fields {sorted(component)} are not AppWrapper "
                "v1beta2 fields this dispatcher knows"
            )
        item.update(extra)
        items.append(item)
    return items


def _take(entries: list[Obj], used: list[bool], index: int, ref: str) -> Obj:
    """The stash entry of the component at `index` making `ref`: the one at the same
    position if it makes the same object, else the first unused one that does."""
    order = [index] if index < len(entries) else []
    order += [i for i in range(len(entries)) if i != index]
    for i in order:
        if not used[i] and entries[i].get("$ref") == ref:
            used[i] = True
            entry = dict(entries[i])
            entry.pop("$ref", None)
            return entry
    return {}


def _v1beta2_status(status: Mapping[str, Any], spec: Any) -> Obj:
    derived = v1beta2_status(status, spec=spec)
    out: Obj = copy_json(dict(status))
    out.update((k, v) for k, v in derived.items() if k != "conditions")
    own = [c for c in status.get("conditions") or [] if isinstance(c, Mapping)]
    out["conditions"] = [*copy_json(own), *derived["conditions"]]
    return out


def _v1beta1_status(status: Mapping[str, Any]) -> Obj:
    out: Obj = {k: copy_json(v) for k, v in status.items() if k not in V1BETA2_STATUS_FIELDS}
    conditions = out.pop("conditions", None)
    if isinstance(conditions, list):
        own = [c for c in conditions if not _is_v1beta2_condition(c)]
        if own:
            out["conditions"] = own
    elif conditions is not None:
        out["conditions"] = conditions
    return out


def _is_v1beta2_condition(condition: Any) -> bool:
    return isinstance(condition, Mapping) and condition.get("type") in V1BETA2_CONDITION_TYPES


# -- helpers ---------------------------------------------------------------------------------


def _copy_top(obj: Mapping[str, Any], api_version: str) -> Obj:
    out: Obj = {k: copy_json(v) for k, v in obj.items() if k not in ("spec", "status")}
    out["apiVersion"] = api_version
    return out


def _annotations(obj: Obj) -> dict[str, str]:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return {}
    annotations = metadata.get("annotations")
    return dict(annotations) if isinstance(annotations, Mapping) else {}


def _set_annotations(obj: Obj, annotations: dict[str, str]) -> None:
    metadata = obj.setdefault("metadata", {})
    if annotations:
        metadata["annotations"] = annotations
    elif metadata.get("annotations"):  # held only ours; an empty map written so stays
        del metadata["annotations"]


def _take_reserved(annotations: dict[str, str], key: str) -> Obj:
    """The JSON object a conversion wrote under `key` (one of the reserved annotations), and
    every reserved annotation taken out of `annotations`. A value that is not a JSON object
    (written by hand; or past any depth `jsontext` reads) is dropped: a conversion that
    failed on it would make every list of the namespace fail in the other version."""
    text = annotations.get(key)
    for reserved in RESERVED_ANNOTATIONS:
        annotations.pop(reserved, None)
    if text is None:
        return {}
    try:
        value = jsontext.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _size(text: str) -> int:
    return len(text.encode())


def _annotations_size(annotations: Mapping[str, str]) -> int:
    return sum(_size(k) + _size(v) for k, v in annotations.items())


def _dump(value: Obj) -> str:
    return jsontext.dumps(value, sort_keys=True)


def _stored_mapping(parent: Mapping[str, Any], key: str, where: str) -> Obj:
    """`parent[key]`, which must be an object where present: a stored null or other value
    cannot be told apart from an absent one in v1beta2, so it is not converted but kept
    (`unreadable_v1beta2`)."""
    if key not in parent:
        return {}
    value = parent[key]
    if not isinstance(value, Mapping):
        raise ConversionError(f"{where}: not an object")
    return dict(value)


def _mapping(value: Any, where: str) -> Obj:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConversionError(f"{where}: not an object")
    return dict(value)


def _ref(template: Any) -> str:
    """Which wrapped object a template makes, as "kind/name" (what a stash is matched by)."""
    if not isinstance(template, Mapping):
        return ""
    metadata = template.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return f"{template.get('kind') or ''}/{name or ''}"
