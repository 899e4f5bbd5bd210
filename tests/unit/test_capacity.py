"""Capacity accounting fed by watch events, and what dispatched AppWrappers still reserve."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.api.resources import Resources
from dispatcher.cluster.capacity import CapacityCache, slim_pod
from dispatcher.core.model import PodSet
from dispatcher.core.reservations import unplaced as _unplaced


def node(name: str, cpu: str = "8", *, ready: bool = True, cordoned: bool = False) -> dict:
    return {
        "metadata": {"name": name, "labels": {"pool": "a"}, "resourceVersion": "1"},
        "spec": {"unschedulable": cordoned},
        "status": {
            "allocatable": {"cpu": cpu, "memory": "32Gi"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    name: str, cpu: str, node_name: str = "", phase: str = "Pending", owner: str | None = None
) -> dict[str, Any]:
    labels = {LABEL_NAME: owner, LABEL_NAMESPACE: "ns", LABEL_UID: f"uid-{owner}"} if owner else {}
    return slim_pod(
        {
            "metadata": {"name": name, "namespace": "ns", "labels": labels, "resourceVersion": "1"},
            "spec": {
                "nodeName": node_name,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}],
            },
            "status": {"phase": phase},
        }
    )


def test_pods_on_nodes_reduce_free_until_they_end() -> None:
    cache = CapacityCache(cluster="c")
    cache.on_node("ADDED", None, node("n1"))
    cache.on_pod("ADDED", None, pod("p", "3", "n1", "Running", owner="aw"))
    snapshot = cache.snapshot()
    assert snapshot.nodes[0].free["cpu"] == 5000
    assert cache.pod_counts("ns/aw", "uid-aw").running == 1
    cache.on_pod("MODIFIED", None, pod("p", "3", "n1", "Succeeded", owner="aw"))
    assert cache.snapshot().nodes[0].free["cpu"] == 8000
    assert cache.pod_counts("ns/aw", "uid-aw").succeeded == 1
    cache.on_pod("DELETED", pod("p", "3", "n1", "Succeeded", owner="aw"), None)
    assert cache.pod_counts("ns/aw", "uid-aw").total == 0


def test_unbound_pods_hold_nothing_and_selector_filters_nodes() -> None:
    cache = CapacityCache(cluster="c", node_selector={"pool": "b"})
    cache.on_node("ADDED", None, node("n1"))
    assert cache.snapshot().nodes == ()
    cache = CapacityCache(cluster="c")
    cache.on_node("ADDED", None, node("n1"))
    cache.on_pod("ADDED", None, pod("p", "3"))
    assert cache.snapshot().nodes[0].free["cpu"] == 8000


def test_change_callback_reports_freed_capacity() -> None:
    reasons: list[str] = []
    cache = CapacityCache(cluster="c", on_change=reasons.append)
    cache.on_node("ADDED", None, node("n1"))
    cache.on_pod("ADDED", None, pod("p", "1", "n1", "Running"))
    cache.on_pod("MODIFIED", None, pod("p", "1", "n1", "Failed"))
    assert reasons == ["node-changed", "pod-changed", "pod-freed"]


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["p1", "p2", "p3"]),
        st.sampled_from(["", "n1", "n2"]),
        st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "DELETE"]),
        st.integers(1, 4),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(EVENTS)
def test_incremental_sums_equal_a_fresh_recount(events) -> None:
    cache = CapacityCache(cluster="c")
    for name in ("n1", "n2"):
        cache.on_node("ADDED", None, node(name))
    live: dict[str, dict] = {}
    for name, node_name, phase, cpu in events:
        if phase == "DELETE":
            if name in live:
                cache.on_pod("DELETED", live.pop(name), None)
            continue
        obj = pod(name, str(cpu), node_name, phase)
        cache.on_pod("MODIFIED" if name in live else "ADDED", live.get(name), obj)
        live[name] = obj
    expected = {"n1": 0, "n2": 0}
    for obj in live.values():
        spec, status = obj["spec"], obj["status"]
        if spec["nodeName"] and status["phase"] not in ("Succeeded", "Failed"):
            expected[spec["nodeName"]] += (
                int(spec["containers"][0]["resources"]["requests"]["cpu"]) * 1000
            )
    for state in cache.snapshot().nodes:
        assert state.requested["cpu"] == expected[state.name]


def test_unplaced_subtracts_bound_pods_and_errs_towards_reserving() -> None:
    head = PodSet(count=1, requests=Resources({"cpu": 2000}))
    worker = PodSet(count=2, requests=Resources({"cpu": 3000}))
    remaining = _unplaced((head, worker), [Resources({"cpu": 3000})])
    assert [(p.count, p.requests["cpu"]) for p in remaining] == [(1, 2000), (1, 3000)]
    # A pod matching no declared shape takes the smallest set's place (reserve more, not less).
    remaining = _unplaced((head, worker), [Resources({"cpu": 9000})])
    assert [(p.count, p.requests["cpu"]) for p in remaining] == [(2, 3000)]
    assert _unplaced((head,), [Resources({"cpu": 2000}), Resources({"cpu": 2000})]) == ()


def test_owner_revision_moves_with_its_pods_only() -> None:
    cache = CapacityCache(cluster="c")
    cache.on_node("ADDED", None, node("n1"))
    assert cache.owner_revision("ns/aw", "uid-aw") == 0
    cache.on_pod("ADDED", None, pod("p1", "1", owner="aw"))
    first = cache.owner_revision("ns/aw", "uid-aw")
    cache.on_pod("ADDED", None, pod("other", "1", owner="someone"))
    assert cache.owner_revision("ns/aw", "uid-aw") == first
    cache.on_pod("MODIFIED", None, pod("p1", "1", "n1", "Running", owner="aw"))
    second = cache.owner_revision("ns/aw", "uid-aw")
    assert second != first
    cache.on_pod("MODIFIED", None, pod("p1", "1", "n1", "Running", owner="aw"))
    assert cache.owner_revision("ns/aw", "uid-aw") == second  # nothing changed
    cache.on_pod("DELETED", pod("p1", "1", "n1", "Running", owner="aw"), None)
    assert cache.owner_revision("ns/aw", "uid-aw") == 0
    cache.on_pod("ADDED", None, pod("p2", "1", owner="aw"))
    assert cache.owner_revision("ns/aw", "uid-aw") not in (0, first, second)


def test_a_pod_resized_in_place_is_accounted_at_its_new_size() -> None:
    cache = CapacityCache(cluster="c")
    cache.on_node("ADDED", None, node("n1"))
    small = pod("p", "1", "n1", "Running")
    cache.on_pod("ADDED", None, small)
    ready = pod("p", "1", "n1", "Running")
    ready["metadata"]["resourceVersion"] = "2"  # a change that leaves its size alone
    cache.on_pod("MODIFIED", small, ready)
    assert cache.snapshot().nodes[0].requested["cpu"] == 1000
    resized = pod("p", "3", "n1", "Running")
    cache.on_pod("MODIFIED", ready, resized)
    assert cache.snapshot().nodes[0].requested["cpu"] == 3000
