"""Node health by labels (core/nodehealth.py): which resources a labelled node withholds and
evicts, the anti-affinities a pod template gets, what a dispatched AppWrapper with pods on
an evicting node comes to (core/lifecycle.py), the capacity cache's part (the fit offers
none of a withheld resource; a label change wakes the AppWrappers with pods there), and the
settings (a bad effect or label refused at start)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from dispatcher.api.constants import LABEL_NAME, LABEL_NAMESPACE, LABEL_UID
from dispatcher.api.models import AppWrapper, Reason, Requeuing
from dispatcher.api.resources import Resources
from dispatcher.cluster.capacity import CapacityCache, slim_pod
from dispatcher.cluster.objects import wrapped_objects
from dispatcher.config import Config
from dispatcher.controller.lifecycle.making import keep_off_unhealthy_nodes
from dispatcher.core.faulttolerance import Retry
from dispatcher.core.lifecycle import Progress, Verdict, assess
from dispatcher.core.model import Taint
from dispatcher.core.nodehealth import (
    AUTOPILOT_LABEL,
    OFF,
    NodeHealth,
    evicted_nodes,
    inject_anti_affinities,
    label_problem,
    offered,
    requested_names,
)
from tests.unit.builders import container as c
from tests.unit.builders import job, obj, pod_spec, pod_template

RULES = NodeHealth()  # the AppWrapper controller's defaults
GPU = "nvidia.com/gpu"


def gpu_label(value: str) -> dict[str, str]:
    return {AUTOPILOT_LABEL: value, "zone": "a"}


@pytest.mark.parametrize(
    ("rules", "labels", "want_withheld", "want_evicting"),
    [
        pytest.param(RULES, {}, set(), set(), id="unlabelled"),
        pytest.param(RULES, gpu_label("WARN"), set(), set(), id="prefer-no-schedule-offers"),
        pytest.param(RULES, gpu_label("TESTING"), {GPU}, set(), id="no-schedule-withholds"),
        pytest.param(RULES, gpu_label("EVICT"), {GPU}, {GPU}, id="no-execute-evicts"),
        pytest.param(RULES, gpu_label("evict"), set(), set(), id="values-are-exact"),
        pytest.param(
            replace(RULES, monitor_nodes=False),
            gpu_label("EVICT"),
            set(),
            set(),
            id="not-monitored",
        ),
        pytest.param(OFF, gpu_label("EVICT"), set(), set(), id="off"),
        pytest.param(
            NodeHealth(
                resource_taints=(
                    (GPU, (Taint("health", "bad", "NoExecute"),)),
                    ("example.com/fpga", (Taint("health", "bad", "NoSchedule"),)),
                )
            ),
            {"health": "bad"},
            {GPU, "example.com/fpga"},
            {GPU},
            id="one-label-two-resources",
        ),
    ],
)
def test_what_a_node_withholds_and_evicts(
    rules: NodeHealth, labels: dict[str, str], want_withheld: set[str], want_evicting: set[str]
) -> None:
    assert rules.withheld(labels) == want_withheld
    assert rules.evicting(labels) == want_evicting


@pytest.mark.parametrize(
    ("allocatable", "requested", "want"),
    [
        pytest.param({"cpu": 8000, GPU: 4000}, {}, {"cpu": 8000}, id="idle-offers-none"),
        pytest.param(
            {"cpu": 8000, GPU: 4000}, {GPU: 1000}, {"cpu": 8000, GPU: 1000}, id="in-use-kept"
        ),
        pytest.param(
            {"cpu": 8000, GPU: 4000}, {GPU: 6000}, {"cpu": 8000, GPU: 4000}, id="never-above"
        ),
    ],
)
def test_offered_leaves_no_free_withheld_resource(
    allocatable: dict[str, int], requested: dict[str, int], want: dict[str, int]
) -> None:
    got = offered(Resources(allocatable), Resources(requested), {GPU})
    assert got == Resources(want)
    assert (got - Resources(requested))[GPU] <= 0


def test_evicted_nodes_are_those_whose_evicted_resource_a_pod_asks_for() -> None:
    pods = [
        ("bad", Resources({"cpu": 200, GPU: 1000})),
        ("bad-cpu-only", Resources({"cpu": 200})),
        ("good", Resources({GPU: 1000})),
        ("also-bad", Resources({GPU: 2000})),
    ]
    evicting = {
        "bad": frozenset({GPU}),
        "bad-cpu-only": frozenset({GPU}),
        "also-bad": frozenset({GPU}),
    }
    assert evicted_nodes(pods, evicting) == ("also-bad", "bad")
    assert evicted_nodes(pods, {}) == ()


def container(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None) -> dict:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "image": "busybox", "resources": resources}


def template(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {}, "spec": {"containers": list(containers), **spec}}


REQUIRED = {
    "key": AUTOPILOT_LABEL,
    "operator": "NotIn",
    "values": ["TESTING", "EVICT"],
}
PREFERRED = {
    "weight": 50,
    "preference": {
        "matchExpressions": [{"key": AUTOPILOT_LABEL, "operator": "NotIn", "values": ["WARN"]}]
    },
}


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        pytest.param({"containers": [container({GPU: "1"})]}, {GPU}, id="request"),
        pytest.param({"containers": [container(limits={GPU: 2})]}, {GPU}, id="limit-int"),
        pytest.param({"containers": [container({GPU: "0"})]}, set(), id="zero-is-none"),
        pytest.param(
            {"containers": [container({"cpu": "1"})], "initContainers": [container({GPU: "1"})]},
            {"cpu", GPU},
            id="init-container",
        ),
        pytest.param({"containers": "junk"}, set(), id="malformed"),
    ],
)
def test_requested_names(spec: dict[str, Any], want: set[str]) -> None:
    assert requested_names(spec) == want


def test_a_gpu_template_gets_required_and_preferred_terms() -> None:
    pod = template(container({"cpu": "200m", GPU: "1"}, {GPU: "1"}))
    assert inject_anti_affinities(pod, RULES)
    node_affinity = pod["spec"]["affinity"]["nodeAffinity"]
    required = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required == {"nodeSelectorTerms": [{"matchExpressions": [REQUIRED]}]}
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [PREFERRED]


def test_a_template_asking_for_no_covered_resource_is_untouched() -> None:
    pod = template(container({"cpu": "1", GPU: "0"}))
    before = copy.deepcopy(pod)
    assert not inject_anti_affinities(pod, RULES)
    assert pod == before


def test_the_users_affinity_is_kept_and_ours_holds_in_each_of_their_terms() -> None:
    user_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
    ]
    user_preferred = [{"weight": 10, "preference": {"matchExpressions": []}}]
    pod = template(
        container({GPU: "1"}),
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": copy.deepcopy(user_terms)
                },
                "preferredDuringSchedulingIgnoredDuringExecution": copy.deepcopy(user_preferred),
            },
            "podAntiAffinity": {"x": 1},
        },
    )
    assert inject_anti_affinities(pod, RULES)
    affinity = pod["spec"]["affinity"]
    assert affinity["podAntiAffinity"] == {"x": 1}
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [*user_terms[0]["matchExpressions"], REQUIRED]},
        {**user_terms[1], "matchExpressions": [REQUIRED]},
    ]
    preferred = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred == [*user_preferred, PREFERRED]
    # Made again (each attempt builds from the template): nothing doubles.
    assert not inject_anti_affinities(pod, RULES)
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == [
        *user_preferred,
        PREFERRED,
    ]


@pytest.mark.parametrize(
    "rules",
    [
        pytest.param(replace(RULES, inject_anti_affinities=False), id="switched-off"),
        pytest.param(OFF, id="off"),
    ],
)
def test_no_injection_when_switched_off(rules: NodeHealth) -> None:
    pod = template(container({GPU: "1"}))
    assert not inject_anti_affinities(pod, rules)
    assert "affinity" not in pod["spec"]


def test_a_shape_the_api_server_refuses_is_left_to_it() -> None:
    pod = template(container({GPU: "1"}), affinity=["not", "a", "map"])
    assert not inject_anti_affinities(pod, RULES)
    assert pod["spec"]["affinity"] == ["not", "a", "map"]


# -- the verdict (core/lifecycle.py) ------------------------------------------------------

RUNNING = Progress(
    expected_pods=1,
    min_available=1,
    pending=0,
    running=1,
    succeeded=0,
    failed=0,
    seconds_since_dispatch=100,
    requeue_count=0,
    reached_running=True,
    completion_items=1,
    completed_items=0,
)
EVICTED = replace(RUNNING, evicted_nodes=("gpu-1",))
RETRY = Retry(failure_grace_seconds=5, retry_limit=3, pause_seconds=5)
NEVER = Requeuing(timeInSeconds=0)


@pytest.mark.parametrize(
    ("progress", "retry", "want_verdict", "want_reason", "want_recheck"),
    [
        pytest.param(RUNNING, RETRY, Verdict.RUNNING, Reason.PODS_RUNNING, None, id="healthy"),
        pytest.param(EVICTED, None, Verdict.REQUEUE, Reason.NODE_UNHEALTHY, None, id="no-rule"),
        pytest.param(
            replace(EVICTED, seconds_failing=1),
            RETRY,
            Verdict.WAIT,
            Reason.NODE_UNHEALTHY,
            4.0,
            id="within-grace",
        ),
        pytest.param(
            replace(EVICTED, seconds_failing=5),
            RETRY,
            Verdict.RESET,
            Reason.RESETTING,
            None,
            id="grace-over",
        ),
        pytest.param(
            replace(EVICTED, seconds_failing=5, requeue_count=3),
            RETRY,
            Verdict.FAILED,
            Reason.RETRY_LIMIT_REACHED,
            None,
            id="past-retry-limit",
        ),
        pytest.param(
            replace(EVICTED, running=0, succeeded=1, completed_items=1),
            RETRY,
            Verdict.COMPLETED,
            Reason.WORKLOAD_COMPLETED,
            None,
            id="done-is-done",
        ),
        pytest.param(
            replace(EVICTED, failed=1, seconds_failing=1),
            RETRY,
            Verdict.WAIT,
            Reason.PODS_FAILED,
            4.0,
            id="failed-pods-first",
        ),
    ],
)
def test_pods_on_an_evicting_node(
    progress: Progress,
    retry: Retry | None,
    want_verdict: Verdict,
    want_reason: Reason,
    want_recheck: float | None,
) -> None:
    verdict = assess(progress, requeuing=NEVER, duration_limit=None, retry=retry)
    assert (verdict.verdict, verdict.reason) == (want_verdict, want_reason)
    if want_recheck is not None:
        assert verdict.recheck_after == pytest.approx(want_recheck)
    if want_reason in (Reason.NODE_UNHEALTHY, Reason.RESETTING, Reason.RETRY_LIMIT_REACHED):
        assert "gpu-1" in verdict.message


def test_evicted_pods_start_the_failure_grace() -> None:
    assert EVICTED.failing
    assert not RUNNING.failing


# -- the capacity cache ---------------------------------------------------------------------


def node(name: str, labels: dict[str, str] | None = None, gpu: str = "4") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}, "resourceVersion": "1"},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "8", GPU: gpu},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_pod(name: str, node_name: str, owner: str, gpus: str = "1") -> dict[str, Any]:
    labels = {LABEL_NAME: owner, LABEL_NAMESPACE: "ns", LABEL_UID: f"uid-{owner}"}
    return slim_pod(
        {
            "metadata": {"name": name, "namespace": "ns", "labels": labels, "resourceVersion": "1"},
            "spec": {
                "nodeName": node_name,
                "containers": [{"name": "c", "resources": {"requests": {GPU: gpus}}}],
            },
            "status": {"phase": "Running"},
        }
    )


def test_a_labelled_node_offers_no_gpu_and_wakes_its_pods_owners() -> None:
    woken: list[str] = []
    cache = CapacityCache(cluster="c")
    cache.on_node("ADDED", None, node("n1"))
    cache.on_node("ADDED", None, node("n2"))
    cache.follow_health(RULES, wake=woken.append)
    cache.on_pod("ADDED", None, gpu_pod("p1", "n1", "train"))
    cache.on_pod("ADDED", None, gpu_pod("p2", "n1", "other", gpus="0"))
    cache.on_pod("ADDED", None, gpu_pod("p3", "n2", "elsewhere"))

    def free_gpus() -> dict[str, int]:
        return {n.name: n.free[GPU] for n in cache.snapshot().nodes}

    assert free_gpus() == {"n1": 3000, "n2": 3000}
    cache.on_node("MODIFIED", None, node("n1", gpu_label("EVICT")))
    assert free_gpus() == {"n1": 0, "n2": 3000}
    assert sorted(woken) == ["ns/other", "ns/train"]  # its pods' owners, not n2's
    assert cache.evicted_nodes("ns/train", "uid-train") == ("n1",)
    assert cache.evicted_nodes("ns/other", "uid-other") == ()  # it asks for no GPU
    assert cache.evicted_nodes("ns/elsewhere", "uid-elsewhere") == ()

    woken.clear()
    cache.on_node("MODIFIED", None, node("n1", gpu_label("TESTING")))
    assert free_gpus() == {"n1": 0, "n2": 3000}  # still withheld, no longer evicting
    assert sorted(woken) == ["ns/other", "ns/train"]
    assert cache.evicted_nodes("ns/train", "uid-train") == ()

    woken.clear()
    cache.on_node("MODIFIED", None, node("n1", {**gpu_label("TESTING"), "x": "y"}))
    assert woken == []  # what it evicts did not change
    cache.on_node("MODIFIED", None, node("n1"))
    assert free_gpus() == {"n1": 3000, "n2": 3000}


def test_rules_set_after_nodes_arrived_judge_them_too() -> None:
    cache = CapacityCache(cluster="c")
    cache.on_node("ADDED", None, node("n1", gpu_label("EVICT")))
    assert cache.snapshot().nodes[0].free[GPU] == 4000  # not followed yet
    cache.follow_health(RULES, wake=lambda key: None)
    assert cache.snapshot().nodes[0].free[GPU] == 0
    cache.on_node("DELETED", node("n1"), None)
    assert cache.withheld == {}
    assert cache.evicting == {}


# -- settings ---------------------------------------------------------------------------------


def test_default_settings_are_the_appwrapper_controllers() -> None:
    assert Config().node_health.rules() == RULES


@pytest.mark.parametrize(
    ("label", "want"),
    [
        pytest.param({"key": "a", "value": "b", "effect": "Evict"}, "effect", id="bad-effect"),
        pytest.param({"key": "a b", "effect": "NoExecute"}, "label key", id="bad-key"),
        pytest.param({"key": "Bad_Prefix/x", "effect": "NoExecute"}, "prefix", id="bad-prefix"),
        pytest.param({"key": "a", "value": "-x", "effect": "NoExecute"}, "value", id="bad-value"),
    ],
)
def test_bad_settings_are_refused_at_start(label: dict[str, str], want: str) -> None:
    with pytest.raises(ValidationError, match=want):
        Config(node_health={"resource_taints": {GPU: [label]}})


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        (AUTOPILOT_LABEL, "EVICT", True),
        ("health", "", True),
        ("x" * 64, "v", False),
        ("example.com/" + "x" * 63, "v", True),
    ],
)
def test_label_problem(key: str, value: str, ok: bool) -> None:
    assert (label_problem(key, value) == "") is ok


# -- the objects made (controller/lifecycle/making.py) ---------------------------------------------


def test_every_gpu_pod_template_of_an_appwrapper_gets_the_terms() -> None:

    trainer = obj(
        "Trainer",
        "t",
        api_version="example.com/v1",
        spec={
            "roles": [
                {"template": pod_template(pod_spec(c(requests={GPU: "1"})))},
                {"template": pod_template(pod_spec(c(requests={"cpu": "1"})))},
            ]
        },
    )
    items = [
        {"generictemplate": job("gpu", pod_spec(c(limits={GPU: "1"})))},
        {"generictemplate": job("cpu", pod_spec(c(requests={"cpu": "1"})))},
        {"generictemplate": obj("Service", "svc", spec={"ports": [{"port": 80}]})},
        {
            "generictemplate": trainer,
            "podSets": [
                {"path": "template.spec.roles[0].template"},
                {"path": "template.spec.roles[1].template"},
            ],
        },
    ]
    aw = AppWrapper.model_validate(
        {
            "metadata": {"name": "aw", "namespace": "ns", "uid": "u"},
            "spec": {"resources": {"GenericItems": items}},
        }
    )
    objects = wrapped_objects(aw, owner_reference=False)
    before = copy.deepcopy([o.body for o in objects])
    keep_off_unhealthy_nodes(aw, objects, RULES)
    gpu_job, cpu_job, service, custom = (o.body for o in objects)
    assert "affinity" in gpu_job["spec"]["template"]["spec"]
    assert (cpu_job, service) == (before[1], before[2])
    roles = custom["spec"]["roles"]
    assert "affinity" in roles[0]["template"]["spec"]
    assert "affinity" not in roles[1]["template"]["spec"]
    assert aw.spec.items[0].generictemplate == items[0]["generictemplate"]  # a copy changed

    objects = wrapped_objects(aw, owner_reference=False)
    keep_off_unhealthy_nodes(aw, objects, replace(RULES, inject_anti_affinities=False))
    assert [o.body for o in objects] == before
