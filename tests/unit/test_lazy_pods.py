"""Pod watch events read lazily (`kube/lazyjson.py`, `slim_pod_lazy`) give exactly what
decoding them whole and `slim_pod` give, or step aside (None) so that the whole decode runs.

tests/e2e/test_lazy_pods.py holds the same comparison over real pods from the API server."""

from __future__ import annotations

import asyncio
import json
from copy import deepcopy as copy_of
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.cluster.capacity import CapacityCache, slim_pod, slim_pod_lazy
from dispatcher.cluster.member import PODS, Member
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.informer import Informer, object_key
from dispatcher.kube.jsoncodec import decode, encode
from dispatcher.kube.lazyjson import LazyEvents
from testenv.fakekube import FakeKube
from testenv.waits import async_wait_until

Obj = dict[str, Any]
OWNER_LABELS = (LABEL_NAME, LABEL_NAMESPACE, LABEL_UID)
ROOT = Path(__file__).resolve().parents[2]
_NS = ResourceInfo("v1", "Namespace", "namespaces", namespaced=False)


def read_lazily(line: bytes) -> tuple[str, Obj] | None:
    return LazyEvents(slim_pod_lazy)(line)


def read_whole(line: bytes) -> tuple[str, Obj | None]:
    """(type, slim_pod of the object), with None where slim_pod fails (the informer then
    keeps the raw object and logs it)."""
    event = decode(line)
    try:
        return event["type"], slim_pod(event["object"])
    except Exception:
        return event["type"], None


def assert_same(line: bytes) -> bool:
    """The lazy reading equals the whole one wherever it answers; whether it answered."""
    lazy = read_lazily(line)
    if lazy is None:
        return False
    kind, whole = read_whole(line)
    assert whole is not None, "the lazy path took a pod that slim_pod refuses"
    assert lazy == (kind, whole)
    raw = decode(line)["object"]
    # What the informer reads of the raw object (its key, its version) it reads alike of the
    # lazily transformed one.
    assert object_key(lazy[1]) == object_key(raw)
    assert lazy[1]["metadata"]["resourceVersion"] == raw["metadata"]["resourceVersion"]
    return True


def line_of(kind: str, pod: Any, *, ascii_only: bool = False) -> bytes:
    if ascii_only:  # \uXXXX escapes, as some writers send them
        return json.dumps({"type": kind, "object": pod}, ensure_ascii=True).encode() + b"\n"
    return encode({"type": kind, "object": pod}) + b"\n"


# -- pods as the API server writes them -------------------------------------------------

names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=20)
quantities = st.sampled_from(["1", "500m", "2Gi", "0", "1.5", "100Mi", "3e2", "1k"])
resource_lists = st.dictionaries(
    st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "ephemeral-storage"]), quantities
)
resources = st.fixed_dictionaries(
    {}, optional={"requests": resource_lists, "limits": resource_lists, "claims": st.just([])}
)
noise = st.dictionaries(
    st.sampled_from(["image", "env", "ports", "args", "livenessProbe", "volumeMounts"]),
    st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=30),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
        max_leaves=8,
    ),
)


@st.composite
def containers(draw: st.DrawFn, init: bool) -> Obj:
    container: Obj = {"name": draw(names), **draw(noise)}
    if draw(st.booleans()) or not init:  # the server defaults `resources: {}`
        container["resources"] = draw(resources)
    if init and draw(st.booleans()):
        container["restartPolicy"] = "Always"  # a sidecar
    return container


def label_maps() -> st.SearchStrategy[dict[str, str]]:
    ours = st.dictionaries(st.sampled_from(OWNER_LABELS), names)
    others = st.dictionaries(st.sampled_from(["app", "ray.io/group", "x/y"]), st.text(max_size=10))
    return st.builds(lambda a, b: {**b, **a}, ours, others)


@st.composite
def api_pods(draw: st.DrawFn) -> Obj:
    """Pods of the shapes the API server writes, with the fields the cache does not read."""
    meta: Obj = {
        "name": draw(names),
        "namespace": draw(names),
        "uid": draw(st.uuids()).hex,
        "resourceVersion": str(draw(st.integers(1, 10**12))),
        "managedFields": [{"manager": "x", "fieldsV1": {"f:spec": {}}}],
    }
    if draw(st.booleans()):
        meta["labels"] = draw(label_maps())
    if draw(st.booleans()):
        meta["deletionTimestamp"] = "2026-11-26T10:00:00Z"
    spec: Obj = {"containers": draw(st.lists(containers(False), min_size=1, max_size=3))}
    if draw(st.booleans()):
        spec["initContainers"] = draw(st.lists(containers(True), max_size=3))
    if draw(st.booleans()):
        spec["nodeName"] = draw(names)
    if draw(st.booleans()):
        spec["overhead"] = draw(resource_lists)
    status: Obj = {}
    if draw(st.booleans()):
        status["phase"] = draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]))
    status["conditions"] = [{"type": "Ready", "status": "True"}]
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": status}


@settings(max_examples=150, deadline=None)
@given(
    pod=api_pods(),
    kind=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
    ascii_only=st.booleans(),
)
def test_pods_the_server_writes_are_read_lazily_and_alike(
    pod: Obj, kind: str, ascii_only: bool
) -> None:
    assert assert_same(line_of(kind, pod, ascii_only=ascii_only))


# -- any shape at all -------------------------------------------------------------------

KEYS = [
    *("metadata", "spec", "status", "name", "resourceVersion", "labels", "containers"),
    *("initContainers", "resources", "phase", "nodeName", "overhead", "restartPolicy"),
    *("deletionTimestamp", "namespace", "uid", LABEL_NAME, "requests"),
]
anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=6)
    ),
    max_leaves=25,
)


def mutated(pod: Obj, path: list[str], value: Any) -> Obj:
    """`pod` with the value at `path` (dict keys) replaced, created as needed."""
    copy = copy_of(pod)
    here = copy
    for key in path[:-1]:
        if not isinstance(here.get(key), dict):
            here[key] = {}
        here = here[key]
    here[path[-1]] = value
    return copy


paths = st.sampled_from(
    [
        ["metadata"], ["spec"], ["status"], ["metadata", "name"],
        ["metadata", "resourceVersion"], ["metadata", "labels"], ["metadata", "namespace"],
        ["metadata", "labels", LABEL_NAME], ["metadata", "deletionTimestamp"],
        ["spec", "containers"], ["spec", "initContainers"], ["spec", "nodeName"],
        ["spec", "overhead"], ["status", "phase"],
    ]
)  # fmt: skip


@settings(max_examples=250, deadline=None)
@given(pod=api_pods(), path=paths, value=anything, ascii_only=st.booleans())
def test_odd_shapes_are_read_alike_or_left_to_the_whole_decode(
    pod: Obj, path: list[str], value: Any, ascii_only: bool
) -> None:
    # Unlike the API server's: the lazy path answers as the whole decode does, or not at all.
    assert_same(line_of("MODIFIED", mutated(pod, path, value), ascii_only=ascii_only))


@settings(max_examples=200, deadline=None)
@given(obj=anything)
def test_any_object_is_read_alike_or_left_to_the_whole_decode(obj: Any) -> None:
    assert_same(line_of("ADDED", obj))


# -- what the lazy path never takes ------------------------------------------------------

POD = {
    "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7"},
    "spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]},
    "status": {"phase": "Running"},
}


def test_a_real_kuberay_worker_pod_is_read_lazily_in_each_of_its_states() -> None:
    """The pod `benchmarks/watch_decode_bench.py` times: read from the local control plane
    (KubeRay's worker of the gangs scenario, run by KWOK), managed fields included."""
    real = json.loads((ROOT / "benchmarks" / "kuberay_worker_pod.json").read_text())
    terminating = mutated(real, ["metadata", "deletionTimestamp"], "2026-11-27T00:00:00Z")
    unbound = copy_of(real)
    del unbound["spec"]["nodeName"]
    for pod in (real, terminating, unbound, mutated(real, ["status", "phase"], "Succeeded")):
        for kind in ("ADDED", "MODIFIED", "DELETED"):
            assert assert_same(line_of(kind, pod))


def test_a_usual_pod_is_read_lazily() -> None:
    assert read_lazily(line_of("MODIFIED", POD)) == ("MODIFIED", slim_pod(POD))


def test_events_other_than_changes_and_text_simdjson_refuses_are_left_to_the_whole_decode() -> None:
    deep = b"[" * 1500 + b"1" + b"]" * 1500  # past simdjson's depth limit of 1,024
    pod = orjson.dumps(POD)
    lines = [
        line_of("BOOKMARK", {"metadata": {"resourceVersion": "9"}}),
        line_of("ERROR", {"kind": "Status", "code": 410}),
        b'{"type":"ADDED","object":' + pod[:-1] + b"\n",  # cut short
        b'{"type":"ADDED","object":' + pod[:-1] + b',"deep":' + deep + b"}}\n",
        b'{"type":"ADDED","object":' + pod.replace(b'"p"', b'"\\ud800"') + b"}",  # lone surrogate
        b'{"type":"ADDED","object":' + pod + b',"extra":1}\n',
        b"[1,2]\n",
    ]
    for line in lines:
        assert read_lazily(line) is None, line[:80]
    # Each differs in that one thing from a line the lazy path takes.
    assert read_lazily(b'{"type":"ADDED","object":' + pod + b"}") is not None


def test_a_parser_held_by_a_live_proxy_is_replaced_and_the_line_still_read() -> None:
    held: list[Any] = []

    def keep_a_proxy(pod: Any) -> Obj | None:
        held.append(pod["metadata"])  # outlives the event: the next parse must not reuse
        return slim_pod_lazy(pod)

    events = LazyEvents(keep_a_proxy)
    first = events(line_of("ADDED", POD))
    second = events(line_of("MODIFIED", POD))
    assert first == ("ADDED", slim_pod(POD))
    assert second == ("MODIFIED", slim_pod(POD))


# -- through the informer ----------------------------------------------------------------


async def test_the_pod_watch_keeps_what_the_whole_decode_would_keep() -> None:
    """A member's pod cache over the in-memory server, whose watch sends each event through
    JSON text and the informer's line decoder: the store holds `slim_pod`'s answers, the
    labels of look-alikes dropped as before, and a pod the lazy path refuses arrives too."""
    fake = FakeKube()
    await fake.create(_NS, None, {"metadata": {"name": "ns"}})
    member = Member(name="m", client=fake, is_hub=True, capacity=CapacityCache(cluster="m"))
    decoded: list[str] = []
    lazily = member.pods._lazy
    assert lazily is not None

    def counting(line: bytes) -> tuple[str, Obj] | None:
        read = lazily(line)
        decoded.append("lazy" if read is not None else "whole")
        return read

    member.pods._lazy = counting  # type: ignore[assignment]
    task = asyncio.create_task(member.pods.run())
    try:
        await asyncio.wait_for(member.pods.synced.wait(), 10)
        labels = {LABEL_NAME: "aw", LABEL_UID: "u1"}
        await fake.create(PODS, "ns", _pod("a", labels, cpu="2"))
        odd = _pod("b", {}, cpu="1")
        odd["spec"]["containers"] = None  # refused by both: kept raw, logged
        await fake.create(PODS, "ns", odd)
        await fake.merge_patch(PODS, "ns", "a", {"status": {"phase": "Running"}}, sub="status")

        async def all_seen() -> bool:
            stored = member.pods.store.get("ns/a")
            return "ns/b" in member.pods.store and bool(stored and _phase(stored) == "Running")

        await async_wait_until(all_seen, timeout=10, what="both pods and the change arrive")
        a = member.pods.store["ns/a"]
        assert a == member._vouched(slim_pod(fake.objects("v1", "Pod")[0]))
        assert a["metadata"]["labels"] == labels
        assert member.capacity.pod_counts("ns/aw", "u1").running == 1
        assert member.pods.store["ns/b"]["spec"]["containers"] is None
        assert decoded == ["lazy", "whole", "lazy"]
    finally:
        task.cancel()


def test_an_informer_without_a_lazy_transform_decodes_whole() -> None:
    informer = Informer(FakeKube(), PODS, transform=slim_pod)
    assert informer._lazy is None


def _pod(name: str, labels: dict[str, str], cpu: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
    }


def _phase(pod: Obj) -> Any:
    return pod["status"]["phase"]
