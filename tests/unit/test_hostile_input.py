"""Hostile AppWrappers: every path from user data into the process is total.

Generated AppWrappers (deep nesting, wrong types in every field, odd apiVersions, kinds and
names, huge counts, odd strings, unicode digits in quantities) go through everything that
reads a spec before anything is created: the watch cache's slimming, the model, the
workload (validation and pod sets), building the objects, the status messages. None may
raise anything but the expected "unreadable" ValidationError, and every message is bounded.
The controller tests below walk the same inputs through a whole reconcile and a delete.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from dispatcher.api.models import AppWrapper, AppWrapperStatus, Reason
from dispatcher.api.quantity import QuantityError, parse_milli
from dispatcher.cluster.objects import (
    DispatchError,
    UserInputError,
    create_all,
    wrapped_objects,
)
from dispatcher.controller.reading import without_bookkeeping
from dispatcher.controller.status import APPWRAPPERS
from dispatcher.core import conditions as cond
from dispatcher.core.validation import (
    MAX_ITEMS,
    MAX_MESSAGE_CHARS,
    MAX_TEMPLATE_DEPTH,
    bounded_message,
    identity_problems,
    template_shape,
    validate_appwrapper,
)
from dispatcher.core.workloads import InvalidSpec, workload_of
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import (
    DISCOVERY_LIMIT,
    KubeClient,
    ResourceInfo,
    decode,
    well_formed,
)
from dispatcher.kube.errors import NotFound, Undecodable, UnknownKind
from dispatcher.kube.store import ObjectStore
from testenv.fakeenv import NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper

NOW = datetime(2026, 1, 1, tzinfo=UTC)
Obj = dict[str, Any]


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


def config_map(name: str = "c", **extra: Any) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, **extra}


def wrap(*templates: Any, name: str = "a") -> Obj:
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "ns", "uid": "u-1", "resourceVersion": "7"},
        "spec": {"resources": {"GenericItems": [{"generictemplate": t} for t in templates]}},
    }


# -- strategies ----------------------------------------------------------------------------

ODD_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "../api/v1/pods",
            "apps/v1?x=1",
            "v1/../../",
            "a/b/c",
            "V1",
            "v1alpha",
            "apps/v\u0661",  # an Arabic-Indic digit
            "\uff21\uff22\uff23",  # full-width letters
            "a" * 300,
            "x\x00y",
            "\ud800",
            "Pod",
            "pod",
            "%2e%2e",
            "a b",
        ]
    ),
)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | ODD_TEXT,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(ODD_TEXT, children, max_size=4)
    ),
    max_leaves=20,
)
QUANTITIES = st.one_of(
    ANY_JSON,
    st.sampled_from(
        ["\u0661", "\u0662Gi", "1e999", "-1", "1.5.5", "Infinity", "NaN", "1Zi", "²", "0x10"]
    ),
)


@st.composite
def metadata(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 5)) == 0:
        return draw(ANY_JSON)
    meta: Obj = {"name": draw(st.one_of(st.just("ok"), ODD_TEXT, ANY_JSON))}
    for field in ("labels", "annotations", "ownerReferences", "finalizers", "namespace"):
        if draw(st.booleans()):
            meta[field] = draw(st.one_of(ANY_JSON, st.integers(), st.just([1]), st.just("x")))
    return meta


@st.composite
def templates(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(ANY_JSON)
    kind = draw(
        st.one_of(
            st.sampled_from(["Pod", "Deployment", "Job", "RayCluster", "PyTorchJob", "ConfigMap"]),
            ODD_TEXT,
            ANY_JSON,
        )
    )
    template: Obj = {
        "apiVersion": draw(
            st.one_of(st.sampled_from(["v1", "apps/v1", "batch/v1", "ray.io/v1"]), ODD_TEXT)
        ),
        "kind": kind,
        "metadata": draw(metadata()),
    }
    requests = draw(st.dictionaries(ODD_TEXT, QUANTITIES, max_size=3))
    container = {"name": "c", "resources": {"requests": requests, "limits": draw(ANY_JSON)}}
    pod = {"containers": draw(st.one_of(st.just([container]), ANY_JSON))}
    template["spec"] = draw(
        st.one_of(
            st.just(pod),
            st.just(
                {"replicas": draw(st.one_of(st.integers(), ANY_JSON)), "template": {"spec": pod}}
            ),
            ANY_JSON,
        )
    )
    if draw(st.integers(0, 6)) == 0:
        template["data"] = nested(draw(st.integers(MAX_TEMPLATE_DEPTH - 2, 700)))
    return template


@st.composite
def hostile_appwrappers(draw: st.DrawFn) -> Obj:
    count = draw(st.one_of(st.integers(0, 4), st.just(MAX_ITEMS + 1)))
    items: list[Any] = []
    for _ in range(count):
        item: Any = {"generictemplate": draw(templates())}
        if draw(st.integers(0, 4)) == 0:
            item["custompodresources"] = draw(
                st.one_of(
                    ANY_JSON,
                    st.just([{"replicas": draw(ANY_JSON), "requests": {"cpu": draw(QUANTITIES)}}]),
                )
            )
        if draw(st.integers(0, 6)) == 0:
            item = draw(ANY_JSON)
        items.append(item)
    obj = wrap()
    obj["spec"]["resources"]["GenericItems"] = items
    if draw(st.integers(0, 6)) == 0:
        obj["spec"]["schedulingSpec"] = draw(ANY_JSON)
    if draw(st.integers(0, 8)) == 0:
        obj["spec"] = draw(ANY_JSON)
    return obj


# -- the pure paths ------------------------------------------------------------------------


def read_as_the_dispatcher_does(obj: Obj) -> str | None:
    """Everything that reads a spec before creating anything; the failure message, if any."""
    slimmed = without_bookkeeping(json.loads(json.dumps(obj)))
    assert slimmed == obj
    try:
        model = AppWrapper.from_kube(slimmed)
    except ValidationError as exc:
        status = AppWrapperStatus()
        message = "spec does not match the AppWrapper API: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5]
        )
        cond.mark_failed(status, Reason.INVALID_SPEC, message, now=NOW)
        assert status.message is not None
        return status.message
    workload = workload_of(model, priority=0, allowed_kinds=None, now=NOW)
    if isinstance(workload, InvalidSpec):
        status = AppWrapperStatus()
        transition = cond.mark_failed(status, Reason.INVALID_SPEC, workload.message, now=NOW)
        assert transition is not None
        assert len(transition.message) <= MAX_MESSAGE_CHARS
        json.dumps(status.model_dump(mode="json"))
        assert status.message is not None
        return status.message
    # Valid: the objects can be built, and what reaches a URL is well formed.
    for built in wrapped_objects(model, owner_reference=True):
        assert well_formed(built.api_version, built.kind)
        ResourceInfo(built.api_version, built.kind, "things", True).path("ns", built.name)
        json.dumps(built.body)
    return None


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(hostile_appwrappers())
def test_no_hostile_appwrapper_raises_and_every_message_is_bounded(obj: Obj) -> None:
    message = read_as_the_dispatcher_does(obj)
    if message is not None:
        assert 0 < len(message) <= MAX_MESSAGE_CHARS


@settings(max_examples=200, deadline=None)
@given(templates())
def test_lenient_building_for_deletion_never_raises(template: Any) -> None:
    """Deleting reads what the template names, whatever else it holds."""
    model = AppWrapper.from_kube(wrap(config_map()))
    model.spec.resources.generic_items[0].generictemplate = (
        template if isinstance(template, dict) else {"x": template}
    )
    for built in wrapped_objects(model, owner_reference=True, lenient=True):
        assert well_formed(built.api_version, built.kind)
        ResourceInfo(built.api_version, built.kind, "things", True).path("ns", built.name)


def test_a_template_500_levels_deep_is_slimmed_and_refused() -> None:
    obj = wrap(config_map(data=nested(500)))
    message = read_as_the_dispatcher_does(obj)
    assert message is not None
    assert "item 0 (ConfigMap/c): generictemplate is nested more than 64 levels deep" in message


def test_owner_references_of_the_wrong_type_are_refused_before_dispatch() -> None:
    for field, value in [
        ("ownerReferences", 1),
        ("ownerReferences", [1]),
        ("labels", "x"),
        ("labels", {"a": 1}),
        ("annotations", []),
        ("finalizers", "f"),
    ]:
        template = config_map()
        template["metadata"][field] = value
        message = read_as_the_dispatcher_does(wrap(template))
        assert message is not None
        assert f"metadata.{field}" in message, (field, message)
    message = read_as_the_dispatcher_does(wrap({**config_map(), "metadata": []}))
    assert message == "item 0 (ConfigMap/?): metadata is not an object"


def test_building_an_unbuildable_template_is_a_user_input_error() -> None:
    template = config_map()
    template["metadata"]["ownerReferences"] = 1
    model = AppWrapper.from_kube(wrap(template))
    with pytest.raises(UserInputError) as raised:
        wrapped_objects(model, owner_reference=True)
    assert "item 0" in str(raised.value)
    [kept] = wrapped_objects(model, owner_reference=True, lenient=True)
    assert (kept.api_version, kept.kind, kept.name) == ("v1", "ConfigMap", "c")


@pytest.mark.parametrize(
    ("api_version", "kind", "name", "wanted"),
    [
        ("../api/v1/pods", "Pod", "p", "apiVersion '../api/v1/pods' is not GROUP/VERSION"),
        ("apps/v1?x=1", "Deployment", "d", "apiVersion 'apps/v1?x=1' is not GROUP/VERSION"),
        ("Apps/v1", "Deployment", "d", "the group is not a DNS-1123 subdomain"),
        ("/v1", "Deployment", "d", "the group is not a DNS-1123 subdomain"),
        ("v1", "pod", "p", "kind 'pod' is not a Kubernetes kind"),
        ("v1", "P" * 64, "p", "is not a Kubernetes kind"),
        ("v1", "Pod", "../x", "metadata.name '../x' is not a DNS-1123 subdomain"),
        ("v1", "Pod", "a" * 254, "is not a DNS-1123 subdomain"),
        ("v1", "Pod", "ab\u0663", "is not a DNS-1123 subdomain"),
        ("v1", "Service", "1svc", "is not a DNS-1035 label"),
        ("apps/v\u0661", "Deployment", "d", "is not GROUP/VERSION"),
    ],
)
def test_identities_follow_kubernetes_grammar(
    api_version: str, kind: str, name: str, wanted: str
) -> None:
    problems = identity_problems(
        {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
    )
    assert any(wanted in p for p in problems), problems
    assert not well_formed(api_version, kind) or "metadata.name" in problems[0]


def test_good_identities_pass() -> None:
    for api_version, kind, name in [
        ("v1", "Pod", "p-1.x"),
        ("apps/v1", "Deployment", "d"),
        ("ray.io/v1", "RayCluster", "r"),
        ("kubeflow.org/v2beta1", "PyTorchJob", "t"),
        ("v1", "Service", "svc-1"),
    ]:
        template = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
        assert identity_problems(template) == []
        assert well_formed(api_version, kind)


def test_path_segments_are_escaped() -> None:
    info = ResourceInfo("v1", "Pod", "pods", True)
    assert info.path("ns", "a/b?c") == "/api/v1/namespaces/ns/pods/a%2Fb%3Fc"
    odd = ResourceInfo("x.io/v1", "Thing", "things", True)
    assert odd.path("n s", "t") == "/apis/x.io/v1/namespaces/n%20s/things/t"


def test_too_many_items_is_one_short_problem() -> None:
    items = [config_map(f"c{i}", data={"k": "v" * 200}) for i in range(3500)]
    errors = validate_appwrapper(items, namespace="ns", allowed_kinds=None)
    assert errors == ["3500 items; an AppWrapper may wrap at most 100"]


def test_many_problems_are_cut_with_a_count() -> None:
    items = [{"kind": "pod", "metadata": {"name": f"../{i}" * 20}} for i in range(MAX_ITEMS)]
    errors = validate_appwrapper(items, namespace="ns", allowed_kinds=None)
    message = bounded_message(errors)
    assert len(message) <= MAX_MESSAGE_CHARS
    assert message.endswith("more problems")
    assert bounded_message(["x" * 10_000]).endswith("...(cut)")


def test_a_large_template_is_refused_without_walking_all_of_it() -> None:
    template = config_map(data={f"k{i}": "v" * 1000 for i in range(300)})
    [problem] = validate_appwrapper([template], namespace="ns", allowed_kinds=None)
    assert problem == "item 0 (ConfigMap/c): generictemplate is larger than 256 KiB"
    depth, size = template_shape(nested(100_000), max_depth=64, max_bytes=1 << 20)
    assert depth == 65
    assert size < 1000


def test_status_messages_are_bounded() -> None:
    status = AppWrapperStatus()
    transition = cond.mark_failed(status, Reason.INVALID_SPEC, "x" * 1_000_000, now=NOW)
    assert transition is not None
    assert len(transition.message) <= MAX_MESSAGE_CHARS
    assert status.message is not None
    assert len(status.message) <= MAX_MESSAGE_CHARS
    [failed] = status.conditions
    assert len(failed.message) <= MAX_MESSAGE_CHARS


async def test_discovery_is_bounded_and_refuses_ill_formed_names_without_a_request() -> None:
    client = KubeClient.__new__(KubeClient)
    client.name = "t"
    client._resources = OrderedDict()
    client._missing = OrderedDict()
    client._discovery_lock = asyncio.Lock()
    asked: list[str] = []

    async def request(method: str, path: str, **kwargs: Any) -> Any:
        asked.append(path)
        if path.startswith("/apis/g"):
            raise NotFound("not served", status=404)
        return {"resources": [{"name": "things", "kind": "Thing", "namespaced": True}]}

    client.request = request  # type: ignore[method-assign]
    for odd in ("../api/v1/pods", "apps/v1?x=1", "v1/../x", "Apps/v1"):
        with pytest.raises(UnknownKind):
            await client.resource_info(odd, "Thing")
    assert asked == []
    for i in range(DISCOVERY_LIMIT + 50):
        await client.resource_info(f"x{i}.io/v1", "Thing")
    assert len(client._resources) == DISCOVERY_LIMIT
    # Not served: asked once, then believed for a while.
    for _ in range(3):
        with pytest.raises(UnknownKind):
            await client.resource_info("g.io/v1", "Thing")
    assert asked.count("/apis/g.io/v1") == 1
    assert len(client._missing) == 1


# -- the controller on the in-memory API server ----------------------------------------------


async def failed_with(env: FakeEnv, name: str) -> str:
    """Reconciled (and scheduled, if it gets that far) until Failed; its message."""
    for _ in range(4):
        await env.reconcile(name)
        status = (await env.get(name)).get("status") or {}
        if status.get("state") == "Failed":
            failed = next(c for c in status["conditions"] if c["type"] == "Failed")
            assert status["message"] == failed["message"]
            assert len(failed["message"]) <= MAX_MESSAGE_CHARS
            return str(failed["reason"]) + ": " + str(failed["message"])
        await env.cycle()
    raise AssertionError(f"{name} did not fail: {status}")


async def deleted_cleanly(env: FakeEnv, name: str) -> None:
    await env.delete(name)
    for _ in range(3):
        await env.reconcile(name)
    await env.caught_up()
    assert name not in {
        (o.get("metadata") or {}).get("name")
        for o in env.objects("workload.codeflare.dev/v1beta1", "AppWrapper")
    }


async def test_deep_template_fails_and_deletes_and_the_watch_carries_on() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("deep", config_map("deep", data=nested(500))))
        await env.apply(appwrapper("fine", config_map("fine")))
        assert await failed_with(env, "deep") == (
            "InvalidSpec: item 0 (ConfigMap/deep): generictemplate is nested more than 64 "
            "levels deep"
        )
        await env.reconcile("fine")
        await env.cycle()
        await env.reconcile("fine")
        assert [o["metadata"]["name"] for o in env.objects("v1", "ConfigMap")] == ["fine"]
        await deleted_cleanly(env, "deep")


async def test_owner_references_one_fails_before_dispatch_and_deletes() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        template = config_map("o")
        template["metadata"]["ownerReferences"] = 1
        await env.apply(appwrapper("o", template))
        message = await failed_with(env, "o")
        assert message.startswith("InvalidSpec: item 0 (ConfigMap/o): metadata.ownerReferences")
        assert env.objects("v1", "ConfigMap") == []
        await deleted_cleanly(env, "o")


async def test_a_template_that_cannot_be_built_after_dispatch_fails_and_deletes() -> None:
    """Validation is not the only guard: a Dispatched AppWrapper whose object cannot be
    built (here: validation told nothing, as an older version of it might) ends Failed."""
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("late", config_map("late")))
        await env.reconcile("late")
        await env.cycle()
        current = await env.get("late")
        assert (current.get("status") or {}).get("state") == "Running"
        env.manager.reconciler._ensured.clear()
        model = env.manager.reader.parse(env.manager.status.current(current_key(current)) or {})
        item = model.spec.resources.generic_items[0]
        item.generictemplate["metadata"]["ownerReferences"] = 1
        # As if dispatched with it (not an edit after dispatch, which would be requeued).
        assert model.status is not None
        model.status.dispatchedObjects = [item.ref()]
        assert (await failed_with(env, "late")).startswith("DispatchFailed: creating the wrapped")
        await deleted_cleanly(env, "late")


def current_key(obj: Obj) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("api_version", ["../api/v1/pods", "apps/v1?x=1", "v1/../../x"])
async def test_odd_api_versions_fail_without_a_request(api_version: str) -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        template = {"apiVersion": api_version, "kind": "Pod", "metadata": {"name": "p"}}
        await env.apply(appwrapper("odd", template))
        message = await failed_with(env, "odd")
        assert message.startswith("InvalidSpec: item 0 (Pod/p): apiVersion")
        await deleted_cleanly(env, "odd")


def test_answers_nested_deeper_than_the_interpreter_allows_are_decoded() -> None:
    """The API server stores objects nested up to 10,000 levels; a list or watch carrying
    one must still be read (it is then refused by validation, like any deep template)."""
    depth = 10_000
    text = '{"data":' + '{"a":' * depth + "1" + "}" * depth + "}"
    decoded = decode(text.encode())
    slimmed = without_bookkeeping(decoded)
    shape = template_shape(slimmed, max_depth=MAX_TEMPLATE_DEPTH, max_bytes=1 << 20)
    assert shape[0] == MAX_TEMPLATE_DEPTH + 1
    store = ObjectStore(lambda _obj: True)
    store["k"] = slimmed  # too deep to pack as text: kept decoded
    assert store.packed() == 0
    with pytest.raises(Undecodable):
        decode(b"[" * 20_000 + b"]" * 20_000)


async def test_an_unreadable_appwrapper_fails_and_one_being_deleted_lets_go() -> None:
    """The "unreadable spec" path is total too: Failed with a bounded message; and one that
    became unreadable while holding the finalizer is still let go when deleted."""
    async with fake_env() as env:
        await env.apply(appwrapper("odd", config_map("odd")))
        await env.reconcile("odd")
        current = await env.get("odd")
        assert "workload.codeflare.dev/finalizer" in current["metadata"]["finalizers"]
        await env.fake.merge_patch(
            APPWRAPPERS, NAMESPACE, "odd", {"spec": {"priority": "x" * 100_000}}
        )
        message = await failed_with(env, "odd")
        assert message.startswith("InvalidSpec: spec does not match the AppWrapper API: ")
        await deleted_cleanly(env, "odd")


async def test_a_create_answered_not_found_forgets_the_kinds_discovery() -> None:
    """A 404 on create means the kind may be gone: the next attempt asks discovery again."""
    forgotten: list[str] = []

    class Gone:
        async def resource_info(self, api_version: str, kind: str) -> ResourceInfo:
            return ResourceInfo(api_version, kind, "things", True)

        async def create(self, *args: Any, **kwargs: Any) -> Obj:
            raise NotFound("the server could not find the requested resource", status=404)

        def forget_discovery(self, api_version: str) -> None:
            forgotten.append(api_version)

    model = AppWrapper.from_kube(wrap({**config_map(), "apiVersion": "x.io/v1", "kind": "Thing"}))
    objects = wrapped_objects(model, owner_reference=False)
    with pytest.raises(DispatchError) as raised:
        await create_all(cast(KubeApi, Gone()), "ns", objects, uid="u-1")
    assert not isinstance(raised.value, UserInputError)
    assert forgotten == ["x.io/v1"]


@pytest.mark.parametrize("value", ["\u0662Gi", "\u0661", "1\u0660", "1e\u0663", "\uff11"])
def test_quantities_with_digits_of_other_scripts_are_malformed(value: str) -> None:
    with pytest.raises(QuantityError):
        parse_milli(value)
