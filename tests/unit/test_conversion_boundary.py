"""The conversion as a boundary a tenant writes to (dispatcher/core/convert.py and the
/convert endpoint of dispatcher/kube/webhook.py): nothing it is sent becomes a status, the
reserved annotations are the conversion's alone, a read never fails whatever is stored (any
depth, size or type), and a flood of conversions never takes an admission request's turn.

The same attacks against the real API server: tests/e2e/test_conversion_boundary.py."""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
import threading
import time
import tracemalloc
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.core import jsontext
from dispatcher.core.convert import (
    RESERVED_ANNOTATIONS,
    UNREADABLE,
    V1BETA1,
    V1BETA1_FIELDS,
    V1BETA2,
    V1BETA2_FIELDS,
    ConversionError,
    convert,
    reserved_annotation_problems,
    reserved_field_problems,
    to_v1beta1,
    to_v1beta2,
)
from dispatcher.kube import webhook
from dispatcher.kube.jsoncodec import decode, encode
from tests.unit.test_webhook_server import contexts, review

FORGED_STATUS = {
    "state": "Running",
    "priority": 2_000_000_000,
    "conditions": [
        {"type": "Dispatched", "status": "True", "reason": "Chosen", "message": "by me"},
    ],
    "admission": {"clusterQueue": "team-b", "flavors": {"gpu": "a100"}},
}


def stored(**annotations: str) -> dict[str, Any]:
    """A v1beta1 AppWrapper as a tenant may store it: no status (create cannot set one)."""
    metadata: dict[str, Any] = {"name": "aw", "namespace": "team-a"}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": V1BETA1,
        "kind": "AppWrapper",
        "metadata": metadata,
        "spec": {"resources": {"GenericItems": []}},
    }


def update_through_v1beta2(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores after `kubectl label` in v1beta2: the stored object read as
    v1beta2, labelled, its status kept from that old view (a main-resource update keeps the
    old status), written back as v1beta1."""
    old = to_v1beta2(obj)
    new = copy.deepcopy(old)
    new["metadata"].setdefault("labels", {})["touched"] = "yes"
    if "status" in old:
        new["status"] = old["status"]
    else:
        new.pop("status", None)
    return to_v1beta1(new)


# -- 1. status is never taken from what the conversion is sent ---------------------------------


def test_a_status_in_the_reserved_annotation_never_becomes_the_status() -> None:
    forged = stored(**{V1BETA2_FIELDS: json.dumps({"status": FORGED_STATUS})})
    assert "status" not in to_v1beta2(forged)
    after = update_through_v1beta2(forged)
    assert "status" not in after
    assert V1BETA2_FIELDS not in after["metadata"].get("annotations", {})


def test_a_status_written_in_v1beta2_is_dropped_not_kept_for_later() -> None:
    """Nothing of v1beta1's in it: not stored, and not parked in an annotation either."""
    written = to_v1beta2(stored())
    written["status"] = {"phase": "Running", "conditions": [{"type": "PodsReady"}]}
    back = to_v1beta1(written)
    assert "status" not in back
    assert not back["metadata"].get("annotations")


def test_a_reserved_annotation_in_the_v1beta2_view_is_never_stored() -> None:
    view = to_v1beta2(stored())
    view["metadata"]["annotations"] = {V1BETA2_FIELDS: json.dumps({"status": FORGED_STATUS})}
    back = to_v1beta1(view)
    assert not back["metadata"].get("annotations")
    assert "status" not in to_v1beta2(back)


def test_carried_spec_fields_never_override_what_v1beta1_holds() -> None:
    """`suspend` and the components are v1beta1's own: a carried copy of them is ignored."""
    carried = {"spec": {"suspend": True, "components": [{"template": {"kind": "Pod"}}]}}
    obj = stored(**{V1BETA2_FIELDS: json.dumps(carried)})
    obj["spec"]["suspend"] = False
    view = to_v1beta2(obj)
    assert view["spec"] == {"suspend": False, "components": []}


# -- the webhook refuses reserved annotations set in v1beta1 ----------------------------------

FIELDS = json.dumps({"managedBy": "example.com/other"})


@pytest.mark.parametrize(
    ("new", "old", "in_v1beta2", "refused"),
    [
        pytest.param({V1BETA2_FIELDS: FIELDS}, None, False, [V1BETA2_FIELDS], id="set-at-create"),
        pytest.param({V1BETA1_FIELDS: "{}"}, None, False, [V1BETA1_FIELDS], id="v1beta1-fields"),
        pytest.param({UNREADABLE: "x"}, None, False, [UNREADABLE], id="unreadable"),
        pytest.param({V1BETA2_FIELDS: "{}"}, {V1BETA2_FIELDS: FIELDS}, False, [V1BETA2_FIELDS]),
        pytest.param({}, {V1BETA2_FIELDS: FIELDS}, False, [V1BETA2_FIELDS], id="removed"),
        pytest.param({V1BETA2_FIELDS: FIELDS}, {V1BETA2_FIELDS: FIELDS}, False, [], id="kept"),
        pytest.param({"other": "x"}, None, False, [], id="other-annotations"),
        pytest.param({V1BETA2_FIELDS: FIELDS}, None, True, [], id="written-by-the-conversion"),
    ],
)
def test_reserved_annotations_set_or_changed_in_v1beta1_are_refused(
    new: dict[str, str], old: dict[str, str] | None, in_v1beta2: bool, refused: list[str]
) -> None:
    before = None if old is None else {"metadata": {"annotations": old}}
    problems = reserved_annotation_problems(
        {"metadata": {"annotations": new}}, before, in_v1beta2=in_v1beta2
    )
    assert [p.split("]")[0].removeprefix("metadata.annotations[") for p in problems] == refused
    assert all("written by the dispatcher's conversion" in p for p in problems)


# -- 2. a read never fails, whatever is stored ---------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal, at any depth (`==` on nested dicts recurses)."""
    return jsontext.dumps(a, sort_keys=True) == jsontext.dumps(b, sort_keys=True)


def nested_list(depth: int) -> str:
    return "[" * depth + "]" * depth


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("key", RESERVED_ANNOTATIONS)
def test_a_reserved_annotation_nested_past_any_reader_is_dropped(key: str) -> None:
    for text in ("[" * 5000, nested_list(5000), nested_list(200_000)):
        view = to_v1beta2(stored(**{key: text}))
        assert key not in view["metadata"].get("annotations", {})


def test_an_object_nested_as_deep_as_the_api_server_stores_converts_both_ways() -> None:
    """10,000 levels: the API server's own limit. Converted and encoded, both ways, at the
    conversion endpoint's answer, not a RecursionError (which answered 500 and failed every
    list of the AppWrapper)."""
    obj = stored()
    template = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    obj["spec"]["resources"]["GenericItems"] = [{"generictemplate": {**template, **nested(9990)}}]
    obj["spec"]["service"] = nested(9990)  # v1beta1 only: it goes into the stash
    started = time.monotonic()
    answer = webhook.conversion_response(
        {"uid": "u", "desiredAPIVersion": V1BETA2, "objects": [obj]}
    )
    assert answer["result"] == {"status": "Success"}
    view = decode(encode(answer))["convertedObjects"][0]
    back = webhook.conversion_response(
        {"uid": "u", "desiredAPIVersion": V1BETA1, "objects": [view]}
    )
    assert same(decode(encode(back))["convertedObjects"][0], obj)
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        pytest.param(["not", "an", "object"], "spec: not an object", id="spec-a-list"),
        pytest.param({"resources": {"GenericItems": 3}}, "GenericItems: not a list", id="items"),
        pytest.param({"resources": {"GenericItems": ["x"]}}, "GenericItems[0]", id="item"),
        pytest.param({"resources": "x"}, "spec.resources: not an object", id="resources"),
    ],
)
def test_an_object_v1beta2_cannot_express_is_listed_marked_and_converts_back_unchanged(
    spec: Any, why: str
) -> None:
    obj = stored(other="kept")
    obj["spec"] = spec
    obj["status"] = {"state": "Pending"}
    view = convert(obj, V1BETA2)
    annotations = view["metadata"]["annotations"]
    assert why in annotations[UNREADABLE]
    assert "read or change it as v1beta1" in annotations[UNREADABLE]
    assert view["spec"] == {"components": []}
    assert view["status"] == {"state": "Pending"}
    assert view["metadata"]["name"] == "aw"
    labelled = copy.deepcopy(view)
    labelled["metadata"]["labels"] = {"a": "b"}
    back = convert(labelled, V1BETA1)
    assert back == {**obj, "metadata": {**obj["metadata"], "labels": {"a": "b"}}}


def test_components_added_to_a_marked_view_are_refused_naming_what_to_do() -> None:
    obj = stored()
    obj["spec"] = ["x"]
    view = convert(obj, V1BETA2)
    view["spec"]["components"] = [{"template": {"kind": "Pod"}}]
    with pytest.raises(ConversionError, match="change it as v1beta1"):
        convert(view, V1BETA1)


def test_one_object_that_cannot_be_written_fails_its_review_naming_it_never_a_500() -> None:
    """v1beta2 to v1beta1 (a write): a Failure naming the object, whatever the error."""
    objects = [
        {"apiVersion": V1BETA2, "metadata": {"namespace": "n", "name": "x"}, "spec": "bad"},
    ]
    answer = webhook.conversion_response(
        {"uid": "u", "desiredAPIVersion": V1BETA1, "objects": objects}
    )
    assert answer["result"]["status"] == "Failure"
    assert answer["result"]["message"].startswith("AppWrapper n/x: spec")


# -- the fuzz: random and hostile objects, both ways --------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
anything = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    ["resources", "GenericItems", "generictemplate", "components", "template", "suspend",
     "managedBy", "status", "spec", "$ref", "$spec", "$omitted", "items", "priority",
     "podSets", "annotations", "completionstatus", "custompodresources", "absent"]
)  # fmt: skip
hostile = st.recursive(
    scalars | st.just("absent"),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(field_names | st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)
reserved_values = st.one_of(
    st.text(max_size=12),
    hostile.map(lambda v: json.dumps(v)),
    st.fixed_dictionaries(
        {}, optional={"status": hostile, "spec": hostile, "managedBy": hostile, "items": hostile}
    ).map(json.dumps),
    st.integers(1, 3000).map(lambda d: "[" * d),
)
annotation_maps = st.dictionaries(
    st.sampled_from([*RESERVED_ANNOTATIONS, "team", "kubectl.kubernetes.io/last-applied"]),
    reserved_values,
    max_size=4,
)


def appwrappers(version: str) -> st.SearchStrategy[dict[str, Any]]:
    names: dict[str, st.SearchStrategy[Any]] = {"name": st.just("aw"), "namespace": st.just("ns")}
    more: dict[str, st.SearchStrategy[Any]] = {
        "annotations": annotation_maps,
        "labels": st.just({"a": "b"}),
    }
    top: dict[str, st.SearchStrategy[Any]] = {
        "apiVersion": st.just(version),
        "kind": st.just("AppWrapper"),
        "metadata": st.fixed_dictionaries(names, optional=more),
    }
    return st.fixed_dictionaries(top, optional={"spec": hostile, "status": hostile})


def without_reserved(obj: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(obj))
    kept = {
        k: v
        for k, v in (out["metadata"].get("annotations") or {}).items()
        if k not in RESERVED_ANNOTATIONS
    }
    out["metadata"].pop("annotations", None)
    if kept:
        out["metadata"]["annotations"] = kept
    return out


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(appwrappers(V1BETA1))
def test_any_stored_object_reads_as_v1beta2_and_writes_back_unchanged(obj: dict[str, Any]) -> None:
    """Reading never fails; no status appears that was not stored; the reserved
    annotations the conversion did not write are dropped and nothing else changes; and what
    was read converts back to the same object (a deletion or label made in v1beta2 loses
    nothing)."""
    before = copy.deepcopy(obj)
    view = convert(obj, V1BETA2)
    assert obj == before  # the input is never changed
    encode(view)  # whatever it holds, the answer can be written
    if "status" not in obj:
        assert "status" not in view
    assert V1BETA2_FIELDS not in (view["metadata"].get("annotations") or {})
    back = convert(view, V1BETA1)
    if "status" not in obj:
        assert "status" not in back
    # Everything but the status (of which only the v1beta1 part is kept, by design) and the
    # reserved annotations comes back as it was stored.
    expected, got = without_reserved(obj), without_reserved(back)
    expected.pop("status", None)
    got.pop("status", None)
    assert got == expected
    # And once through, it is a fixed point.
    assert convert(convert(back, V1BETA2), V1BETA1) == back


@FUZZ
@given(appwrappers(V1BETA2))
def test_any_v1beta2_write_converts_or_fails_naming_the_field(obj: dict[str, Any]) -> None:
    """A write in v1beta2 becomes a v1beta1 object whose status holds nothing v1beta2-only, or
    a ConversionError; never another exception."""
    try:
        out = convert(obj, V1BETA1)
    except ConversionError:
        return  # a failure naming the field: what the API server shows the writer
    encode(out)
    status = out.get("status")
    if isinstance(status, dict):
        assert not {"phase", "componentStatus", "resettingCount", "retryCount"} & set(status)
    assert set(RESERVED_ANNOTATIONS) & set(out["metadata"].get("annotations") or {}) <= {
        V1BETA2_FIELDS
    }


def test_conversion_time_and_memory_are_bounded_by_the_objects_size() -> None:
    """The largest object the API server stores (~1.5 MB as JSON): converted both ways in
    well under a second of work, its peak memory a small multiple of its size."""
    items = [
        {
            "generictemplate": {
                "kind": "ConfigMap",
                "metadata": {"name": f"c{i}"},
                "data": {"k": "v" * 1400},
            }
        }
        for i in range(1000)
    ]
    obj = stored()
    obj["spec"]["resources"]["GenericItems"] = items
    size = len(encode(obj))
    tracemalloc.start()
    started = time.process_time()
    view = convert(obj, V1BETA2)
    back = convert(view, V1BETA1)
    elapsed = time.process_time() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert back == obj
    assert peak < 20 * size, f"peak {peak:,} bytes for an object of {size:,}"
    assert elapsed < 5


# -- 3. /convert has turns of its own, and a body is read before any turn ------------------


async def never(request: Mapping[str, Any]) -> dict[str, Any]:
    raise AssertionError("not called")


async def slow_body(
    port: int, client: ssl.SSLContext, path: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A sender that announces a body and never finishes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000000\r\n\r\n{".encode()
    )
    await writer.drain()
    return reader, writer


async def test_slow_conversion_bodies_never_take_an_admission_turn() -> None:
    server, client = contexts()
    admitted: list[str] = []

    async def mutate(request: Mapping[str, Any]) -> dict[str, Any]:
        admitted.append(str(request["uid"]))
        return {"uid": request["uid"], "allowed": True}

    limits = webhook.Limits(
        max_in_flight=1, conversion_max_in_flight=1, queue_seconds=0.3, read_seconds=1.5
    )
    runner, port = await webhook.serve(
        host="127.0.0.1", port=0, ssl_context=server, mutate=mutate, validate=never, limits=limits
    )
    base = f"https://127.0.0.1:{port}"
    senders = [await slow_body(port, client, webhook.CONVERT_PATH) for _ in range(4)]
    conversion = {"request": {"uid": "c", "desiredAPIVersion": V1BETA2, "objects": []}}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client)) as session:
            # The conversion's readers are all taken by the slow senders...
            async with session.post(base + webhook.CONVERT_PATH, json=conversion) as response:
                assert response.status == 429
                assert "conversion_max_in_flight" in (await response.json())["message"]
            # ...and admission is answered all the same.
            async with session.post(base + webhook.MUTATE_PATH, json=review("a")) as response:
                assert response.status == 200
            assert admitted == ["a"]
            # The slow senders are cut off at read_seconds (408) and hold nothing after.
            async with asyncio.timeout(10):
                answers = [await reader.readline() for reader, _ in senders[:2]]
            assert all(b" 408 " in line for line in answers), answers
            async with session.post(base + webhook.CONVERT_PATH, json=conversion) as response:
                assert response.status == 200
                assert (await response.json())["response"]["result"]["status"] == "Success"
    finally:
        for _, writer in senders:
            writer.close()
        await runner.cleanup()


async def test_a_body_announced_larger_than_the_limit_is_refused_before_it_is_read() -> None:
    server, client = contexts()
    runner, port = await webhook.serve(
        host="127.0.0.1", port=0, ssl_context=server, mutate=never, validate=never
    )
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        writer.write(
            f"POST {webhook.CONVERT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            f"\r\nContent-Length: {webhook.MAX_BODY_BYTES + 1}\r\n\r\n".encode()
        )
        await writer.drain()
        async with asyncio.timeout(10):
            status_line = await reader.readline()
        assert b" 413 " in status_line
        writer.close()
    finally:
        await runner.cleanup()


def test_deep_answers_are_written_by_the_codec_not_the_json_module() -> None:
    """orjson stops at 255 levels and the json module at its recursion limit."""
    value = nested(5000)
    assert same(jsontext.loads(encode(value)), value)
    assert same(decode(jsontext.dumps(value, sort_keys=True)), value)
    assert jsontext.dumps(value) == '{"a":' * 5000 + '{"leaf":1}' + "}" * 5000


def test_a_body_that_is_no_json_at_any_depth_is_a_400_not_a_500() -> None:
    for body in (b"[" * 5000, b"{" * 20_000, b'{"request": ' + b"[" * 3000):
        status, text = webhook.conversion_answer(body)
        assert status == 400
        assert text.startswith(b"not a ConversionReview")


async def test_admission_is_answered_while_a_conversion_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Converting is CPU alone and may take long (a large or deep body): it runs in a thread,
    so the webhook's loop answers admission meanwhile."""
    server, client = contexts()
    working, release = threading.Event(), threading.Event()

    def slow(request: Mapping[str, Any]) -> dict[str, Any]:
        working.set()
        assert release.wait(20)
        return {"uid": request.get("uid", ""), "convertedObjects": [], "result": {}}

    async def mutate(request: Mapping[str, Any]) -> dict[str, Any]:
        return {"uid": request["uid"], "allowed": True}

    monkeypatch.setattr(webhook, "conversion_response", slow)
    runner, port = await webhook.serve(
        host="127.0.0.1", port=0, ssl_context=server, mutate=mutate, validate=never
    )
    base = f"https://127.0.0.1:{port}"
    conversion = {"request": {"uid": "c", "desiredAPIVersion": V1BETA2, "objects": []}}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client)) as session:
            converting = asyncio.create_task(
                session.post(base + webhook.CONVERT_PATH, json=conversion)
            )
            assert await asyncio.to_thread(working.wait, 10)
            async with asyncio.timeout(5):
                async with session.post(base + webhook.MUTATE_PATH, json=review("a")) as answer:
                    assert answer.status == 200
            release.set()
            async with await converting as response:
                assert response.status == 200
    finally:
        release.set()
        await runner.cleanup()


def test_an_item_field_the_conversion_reserves_is_refused_at_apply() -> None:
    """An item carrying `$ref` (items keep unknown fields) would read in v1beta2 only in the
    marked form: refused at apply instead, naming it."""
    obj = stored()
    obj["spec"]["resources"]["GenericItems"] = [{"generictemplate": {}}, {"$ref": "Pod/x"}]
    assert reserved_field_problems(obj) == [
        "spec.resources.GenericItems[1].$ref: a field name the conversion between v1beta1 "
        "and v1beta2 reserves"
    ]
    assert reserved_field_problems(stored()) == []
    assert UNREADABLE in convert(obj, V1BETA2)["metadata"]["annotations"]
