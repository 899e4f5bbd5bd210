"""The peer benchmark's pure parts: ratios, percentiles, what pods and the audit log show,
the work each system is given, the tables. No cluster."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks import peer_bench, peers
from benchmarks.peer_measure import (
    HIGHER,
    LOWER,
    PodSample,
    PodState,
    admission_figures,
    compare,
    fully_placed_at,
    gang_of,
    gone_at,
    over_admitted,
    overcommitted_pods,
    partial_gangs,
    percentile,
    pod_state,
    quantiles,
    ratio,
    requests_of,
    split_capacity,
    spread,
    waits_after,
)
from benchmarks.peer_systems import (
    HOLD_ANNOTATION,
    KUEUE_PRIORITY_LABEL,
    KUEUE_QUEUE_LABEL,
    MCAD_POD_LABEL,
    NAMESPACE,
    PRIORITIES,
    System,
    Workload,
    admitted,
    kueue_objects,
    kwok_stages,
    native,
    parse_systems,
    plain,
)
from benchmarks.peer_watch import AuditTail, job_finished
from testenv.localcluster import Binaries

Obj = dict[str, Any]

# -- builders --------------------------------------------------------------------------------


def pod(
    name: str = "p",
    *,
    phase: str = "Pending",
    node: str = "",
    unschedulable: bool = False,
    deleting: bool = False,
    labels: dict[str, str] | None = None,
) -> Obj:
    metadata: Obj = {"name": name, "labels": labels or {}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: Obj = {"phase": phase}
    if unschedulable:
        status["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
        ]
    return {"metadata": metadata, "spec": {"nodeName": node} if node else {}, "status": status}


def sample(at: float, pod_name: str, gang: str, state: PodState) -> PodSample:
    return PodSample(at, pod_name, gang, state)


P, U, D, G = PodState.PLACED, PodState.UNSCHEDULABLE, PodState.DONE, PodState.GONE


def audit(
    verb: str,
    at: str = "2026-01-01T00:00:10.000000Z",
    *,
    user: str = "me",
    stage: str = "ResponseComplete",
    resource: str = "jobs",
    subresource: str = "",
) -> Obj:
    ref: Obj = {"resource": resource}
    if subresource:
        ref["subresource"] = subresource
    return {
        "verb": verb,
        "stage": stage,
        "user": {"username": user},
        "requestReceivedTimestamp": at,
        "objectRef": ref,
    }


T0 = 1767225600.0  # 2026-01-01T00:00:00Z


@dataclass
class Run:
    """A run's figures, as peer_run writes them (only what the tests read)."""

    admitted_per_second: float = 10.0
    p50: float = 1.0
    capped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> Obj:
        return {
            "admitted_per_second": self.admitted_per_second,
            "create_to_admitted_seconds": {"p50": self.p50, "p99": 2 * self.p50, "max": 9.0},
            "capped": self.capped,
            **self.extra,
        }


# -- arguments -------------------------------------------------------------------------------


def test_parse_systems() -> None:
    assert parse_systems("ours, mcad,kueue,kueue:200,appwrapper,appwrapper:100") == [
        System("ours"),
        System("mcad"),
        System("kueue"),
        System("kueue", 200),
        System("appwrapper"),
        System("appwrapper", 100),
    ]
    assert System("kueue", 200).label == "kueue:200"
    assert System("kueue").client_qps == "50/100"
    assert System("kueue", 200).client_qps == "200/400"
    assert System("appwrapper").client_qps == "50/100 + 20/30"
    assert System("appwrapper").version == "v1.1.2 + kueue v0.15.0"
    for bad in ("slurm", "ours:200", "mcad:10"):
        with pytest.raises(ValueError, match="unknown system"):
            parse_systems(bad)


@pytest.mark.parametrize(
    ("values", "system", "want"),
    [
        pytest.param([], System("ours"), 600.0, id="default"),
        pytest.param(["300"], System("ours"), 300.0, id="all"),
        pytest.param(["300", "mcad=60"], System("mcad"), 60.0, id="one-system"),
        pytest.param(["300", "mcad=60"], System("kueue"), 300.0, id="others-keep-all"),
        pytest.param(["kueue=90", "kueue:200=30"], System("kueue", 200), 30.0, id="by-label"),
        pytest.param(["kueue=90"], System("kueue", 200), 90.0, id="by-kind"),
    ],
)
def test_caps(values: list[str], system: System, want: float) -> None:
    assert peer_bench.cap_for(peer_bench.parse_caps(values), system) == want


def test_scenarios_and_shares() -> None:
    assert peer_bench.parse_scenarios("burst, gangs") == ["burst", "gangs"]
    with pytest.raises(ValueError, match="unknown scenario"):
        peer_bench.parse_scenarios("burst,soak")
    assert peer_bench.parse_share("2000/100") == (2000, 100)


# -- figures ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        pytest.param([3.0], 0.99, 3.0, id="one"),
        pytest.param([1.0, 2.0, 3.0], 0.5, 2.0, id="median"),
        pytest.param([5.0, 1.0, 4.0, 2.0, 3.0], 0.0, 1.0, id="min-unsorted"),
        pytest.param([float(i) for i in range(101)], 0.99, 99.0, id="p99"),
    ],
)
def test_percentile(values: list[float], q: float, want: float) -> None:
    assert percentile(values, q) == want


def test_quantiles_and_spread() -> None:
    assert quantiles([0.1, 0.2, 0.3]) == {"p50": 0.2, "p99": 0.3, "max": 0.3}
    assert spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0}


@pytest.mark.parametrize(
    ("ours", "peer", "better", "want"),
    [
        pytest.param(20.0, 10.0, HIGHER, 2.0, id="rate-ahead"),
        pytest.param(5.0, 10.0, HIGHER, 0.5, id="rate-behind"),
        pytest.param(1.0, 4.0, LOWER, 4.0, id="latency-ahead"),
        pytest.param(4.0, 1.0, LOWER, 0.25, id="latency-behind"),
        pytest.param(0.0, 1.0, LOWER, None, id="zero-latency"),
        pytest.param(1.0, 0.0, HIGHER, None, id="peer-did-nothing"),
    ],
)
def test_ratio(ours: float, peer: float, better: str, want: float | None) -> None:
    assert ratio(ours, peer, better) == want


def test_compare_over_pairs() -> None:
    runs = {
        "ours": [Run(20, 1).figures(), Run(30, 1).figures(), Run(40, 2).figures()],
        "kueue": [Run(10, 2).figures(), Run(10, 1).figures(), Run(10, 8).figures()],
        "mcad": [Run(1, 10, capped=True).figures(), {"error": "boom"}, Run(2, 10).figures()],
    }
    result = compare(runs)
    assert set(result) == {"kueue", "mcad"}
    rate = result["kueue"]["admitted_per_second"]
    assert (rate["min"], rate["median"], rate["max"]) == (2.0, 3.0, 4.0)
    assert rate["pairs"] == [2.0, 3.0, 4.0]
    p50 = result["kueue"]["create_to_admitted_p50"]
    assert (p50["min"], p50["median"], p50["max"]) == (1.0, 2.0, 4.0)
    # The failed pair gives no ratio; the capped one counts.
    mcad = result["mcad"]["admitted_per_second"]
    assert mcad["pairs"] == [20.0, 20.0]
    assert mcad["capped_pairs"] == 1
    assert "high_priority_seconds_to_running" not in result["kueue"]


def test_compare_priority_and_cost() -> None:
    ours = {"high_priority": {"seconds_to_running": 0.5}, "controller_cpu_seconds_per_workload": 1}
    peer = {"high_priority": {"seconds_to_running": 2.0}, "controller_cpu_seconds_per_workload": 4}
    result = compare({"ours": [ours], "kueue": [peer]})["kueue"]
    assert result["high_priority_seconds_to_running"]["median"] == 4.0
    assert result["controller_cpu_seconds_per_workload"]["median"] == 4.0


def test_admission_figures() -> None:
    names = ["a", "b"]
    created = {"a": 100.0, "b": 100.5}
    whole = admission_figures(names, created, {"a": 110.0, "b": 112.0}, 108.0, 60)
    assert whole["all_admitted"] is True
    assert whole["seconds_to_all_admitted"] == 4.0
    assert whole["admitted_per_second"] == 0.5
    assert whole["create_to_admitted_seconds"]["max"] == 11.5
    capped = admission_figures(names, created, {"a": 110.0, "warm-up": 1.0}, 108.0, 60)
    assert (capped["admitted"], capped["seconds_to_all_admitted"]) == (1, None)
    assert capped["admitted_per_second"] == round(1 / 60, 3)
    none = admission_figures(names, created, {}, 108.0, 60)
    assert none["admitted"] == 0
    assert "create_to_admitted_seconds" not in none


@pytest.mark.parametrize(
    ("total", "per_node", "want"),
    [
        pytest.param(100, 25, [25, 25, 25, 25], id="exact"),
        pytest.param(15, 10, [8, 7], id="even"),
        pytest.param(3, 10, [3], id="one-node"),
    ],
)
def test_split_capacity(total: int, per_node: int, want: list[int]) -> None:
    assert split_capacity(total, per_node) == want
    assert sum(want) == total


# -- pods: overcommits and partial gangs -----------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "want"),
    [
        pytest.param(pod(), PodState.PENDING, id="new"),
        pytest.param(pod(unschedulable=True), PodState.UNSCHEDULABLE, id="unschedulable"),
        pytest.param(pod(node="n1"), PodState.PLACED, id="bound"),
        pytest.param(pod(phase="Running", node="n1"), PodState.PLACED, id="running"),
        pytest.param(pod(phase="Succeeded", node="n1"), PodState.DONE, id="succeeded"),
        pytest.param(pod(phase="Failed"), PodState.DONE, id="failed"),
        pytest.param(pod(phase="Running", deleting=True), PodState.GONE, id="terminating"),
    ],
)
def test_pod_state(obj: Obj, want: PodState) -> None:
    assert pod_state(obj) is want


def test_gang_of() -> None:
    assert gang_of(pod(labels={"ray.io/cluster": "rc-1", "job-name": "x"})) == "rc-1"
    assert gang_of(pod(labels={"batch.kubernetes.io/job-name": "j"})) == "j"
    assert gang_of(pod("lonely")) == "lonely"


@pytest.mark.parametrize(
    ("samples", "want_overcommits", "want_partial"),
    [
        pytest.param(
            [sample(1, "a", "g", P), sample(2, "b", "g", P)], set(), set(), id="all-placed"
        ),
        pytest.param(
            [sample(1, "a", "g", P), sample(2, "b", "g", U), sample(3, "b", "g", P)],
            {"b"},
            {"g"},
            id="sibling-unschedulable-while-one-runs",
        ),
        pytest.param(
            [sample(1, "a", "g", U), sample(1, "b", "g", U), sample(5, "a", "g", P)],
            {"a", "b"},
            {"g"},
            id="one-placed-after-both-waited",
        ),
        pytest.param(
            [sample(1, "a", "g", U), sample(2, "a", "g", P)],
            {"a"},
            set(),
            id="a-one-pod-gang-is-never-partial",
        ),
        pytest.param(
            [sample(1, "a", "g", P), sample(2, "a", "g", G), sample(3, "b", "g", U)],
            {"b"},
            set(),
            id="placed-sibling-gone-first",
        ),
        pytest.param(
            [sample(1, "a", "g", D), sample(2, "b", "g", U)],
            {"b"},
            set(),
            id="finished-sibling-is-not-placed",
        ),
        pytest.param(
            [sample(1, "a", "g1", P), sample(2, "b", "g2", U)],
            {"b"},
            set(),
            id="different-gangs",
        ),
        pytest.param(
            [sample(3, "b", "g", U), sample(1, "a", "g", P)],
            {"b"},
            {"g"},
            id="replayed-in-time-order",
        ),
    ],
)
def test_overcommits_and_partial_gangs(
    samples: list[PodSample], want_overcommits: set[str], want_partial: set[str]
) -> None:
    assert overcommitted_pods(samples) == want_overcommits
    assert partial_gangs(samples) == want_partial


def test_fully_placed_at() -> None:
    samples = [
        sample(1, "h", "rc", P),
        sample(2, "w1", "rc", P),
        sample(3, "w1", "rc", G),
        sample(4, "w2", "rc", P),
        sample(5, "w1b", "rc", P),
        sample(6, "x", "other", P),
    ]
    assert fully_placed_at(samples, {"rc": 3}) == {"rc": 5}
    assert fully_placed_at(samples, {"rc": 4}) == {}


def test_gone_at() -> None:
    samples = [
        sample(1, "h", "rc-1", P),
        sample(2, "w", "rc-1", P),
        sample(5, "h", "rc-1", G),
        sample(6, "w", "rc-1", G),
        sample(1, "h", "rc-2", P),
        sample(7, "h", "rc-2", G),
        sample(8, "h2", "rc-2", P),  # a pod came back: not gone
        sample(1, "x", "rc-3", P),
    ]
    assert gone_at(samples, ["rc-1", "rc-2", "rc-3", "rc-4"]) == {"rc-1": 6}


@pytest.mark.parametrize(
    ("freed", "admitted", "want"),
    [
        pytest.param([10.0], [3.0, 12.5, 20.0], [2.5], id="next-one"),
        pytest.param([10.0, 11.0], [12.0], [2.0, 1.0], id="shared"),
        pytest.param([30.0], [12.0], [], id="none-after"),
    ],
)
def test_waits_after(freed: list[float], admitted: list[float], want: list[float]) -> None:
    assert waits_after(freed, admitted) == want


# -- the audit log ---------------------------------------------------------------------------


def test_requests_by_verb() -> None:
    events = [
        audit("create"),
        audit("create", resource="events"),
        audit("update", resource="appwrappers", subresource="status"),
        audit("get", resource=""),  # a non-resource URL: /version
        audit("watch", stage="ResponseStarted", resource="pods"),
        audit("watch", stage="ResponseComplete", resource="pods"),  # the same watch, ending
        audit("list", stage="ResponseStarted"),  # not long-running: counted when complete
        audit("create", user="admin"),  # the benchmark's own client
        audit("create", at="2026-01-01T00:00:01Z"),  # before the window
        audit("create", at="2026-01-01T00:01:00.5Z"),  # after it
    ]
    counts = requests_of(events, user="me", since=T0 + 5, until=T0 + 60)
    assert counts.by_verb == {"create": 2, "get": 1, "update": 1, "watch": 1}
    assert counts.by_resource == {
        "create events": 1,
        "create jobs": 1,
        "get (non-resource)": 1,
        "update appwrappers/status": 1,
        "watch pods": 1,
    }
    assert counts.total == 5


def test_audit_tail_reads_whole_lines(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    tail = AuditTail(log)
    assert tail.read() == []
    log.write_text('{"verb": "get"}\n{"verb": "li')
    assert tail.read() == [{"verb": "get"}]
    with log.open("a") as out:
        out.write('st"}\n')
    assert tail.read() == [{"verb": "list"}]
    assert [e["verb"] for e in tail.events] == ["get", "list"]


# -- the work, per system --------------------------------------------------------------------


def wrapped(body: Obj) -> Obj:
    item: Obj = body["spec"]["resources"]["GenericItems"][0]
    return item


def test_a_job_for_each_system() -> None:
    work = Workload("w-1", hold="2s")
    info, kueue = native(System("kueue"), work)
    assert info.kind == "Job"
    assert kueue["spec"]["suspend"] is True
    assert kueue["metadata"]["labels"] == {KUEUE_QUEUE_LABEL: "bench"}
    assert kueue["spec"]["template"]["metadata"]["annotations"] == {HOLD_ANNOTATION: "2s"}
    for kind in ("ours", "mcad"):
        info, body = native(System(kind), work)
        assert (info.kind, body["metadata"]["name"]) == ("AppWrapper", "w-1")
        item = wrapped(body)
        assert item["completionstatus"] == "Complete"
        assert "suspend" not in item["generictemplate"]["spec"]
    labels = wrapped(native(System("mcad"), work)[1])["generictemplate"]["spec"]["template"]
    assert labels["metadata"]["labels"] == {MCAD_POD_LABEL: "w-1"}
    ours = wrapped(native(System("ours"), work)[1])["generictemplate"]["spec"]["template"]
    assert "labels" not in ours["metadata"]


def test_a_gang_for_each_system() -> None:
    work = Workload("rc-1", pods=5, ray=True, requests=(("cpu", "1"),))
    info, kueue = native(System("kueue"), work)
    assert (info.kind, kueue["spec"]["suspend"]) == ("RayCluster", True)
    (workers,) = kueue["spec"]["workerGroupSpecs"]
    assert (workers["replicas"], workers["minReplicas"], workers["maxReplicas"]) == (4, 4, 4)
    _, mcad = native(System("mcad"), work)
    item = wrapped(mcad)
    assert [c["replicas"] for c in item["custompodresources"]] == [1, 4]
    assert "completionstatus" not in item
    head = item["generictemplate"]["spec"]["headGroupSpec"]["template"]
    assert head["metadata"]["labels"] == {MCAD_POD_LABEL: "rc-1"}


@pytest.mark.parametrize(
    ("kind", "want_spec", "want_pod_class"),
    [
        pytest.param("ours", {"priorityClassName": "bench-high"}, None, id="ours-class"),
        pytest.param("mcad", {"priority": PRIORITIES["bench-high"]}, "bench-high", id="mcad"),
    ],
)
def test_priority_for_wrapping_systems(
    kind: str, want_spec: Obj, want_pod_class: str | None
) -> None:
    _, body = native(System(kind), Workload("high", pods=2, priority="bench-high"))
    assert {k: v for k, v in body["spec"].items() if k != "resources"} == want_spec
    template = wrapped(body)["generictemplate"]["spec"]["template"]["spec"]
    assert template.get("priorityClassName") == want_pod_class


def test_priority_for_kueue() -> None:
    for kind in ("kueue", "appwrapper"):
        _, body = native(System(kind), Workload("high", priority="bench-high"))
        assert body["metadata"]["labels"][KUEUE_PRIORITY_LABEL] == "bench-high"


def test_a_v1beta2_appwrapper_wraps_the_plain_workload() -> None:
    system = System("appwrapper")
    for work in (Workload("w-1", hold="2s"), Workload("rc-1", pods=5, ray=True)):
        info, body = native(system, work)
        assert (info.group_version, info.kind) == ("workload.codeflare.dev/v1beta2", "AppWrapper")
        assert body["metadata"] == {"name": work.name, "labels": {KUEUE_QUEUE_LABEL: "bench"}}
        assert body["spec"]["suspend"] is True
        (component,) = body["spec"]["components"]
        # As a user writes it with no queue at all: Kueue manages the AppWrapper, not this.
        assert component == {"template": plain(work)}
        assert "podSets" not in component  # inferred for a Job and a RayCluster


def test_admission_predicates() -> None:
    ours, kueue, v1beta2 = System("ours"), System("kueue"), System("appwrapper")
    for phase, want in (("Running", True), ("Succeeded", True), ("Resuming", False), ("", False)):
        assert admitted(v1beta2, {"spec": {"suspend": False}, "status": {"phase": phase}}) is want
    assert not admitted(v1beta2, {"spec": {"suspend": False}})
    condition = {"type": "Dispatched", "status": "True"}
    assert admitted(ours, {"status": {"conditions": [condition]}})
    assert not admitted(ours, {"status": {"conditions": [{**condition, "status": "False"}]}})
    assert not admitted(ours, {})
    assert admitted(kueue, {"spec": {"suspend": False}})
    assert not admitted(kueue, {"spec": {"suspend": True}})
    assert not admitted(kueue, {"spec": {}})


def test_job_finished() -> None:
    assert job_finished({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    assert job_finished({"status": {"conditions": [{"type": "Failed", "status": "True"}]}})
    assert not job_finished({"status": {"conditions": [{"type": "Suspended", "status": "True"}]}})


def test_kueue_objects() -> None:
    quota = {"cpu": "100", "memory": "256Gi", "pods": "440"}
    flavor, cluster_queue, local_queue, *classes = kueue_objects(quota)
    assert flavor["kind"] == "ResourceFlavor"
    assert cluster_queue["spec"]["namespaceSelector"] == {}
    assert cluster_queue["spec"]["preemption"] == {"withinClusterQueue": "LowerPriority"}
    (group,) = cluster_queue["spec"]["resourceGroups"]
    assert {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]} == quota
    assert group["coveredResources"] == ["cpu", "memory", "pods"]
    assert (local_queue["metadata"]["namespace"], local_queue["spec"]["clusterQueue"]) == (
        NAMESPACE,
        cluster_queue["metadata"]["name"],
    )
    assert {c["metadata"]["name"]: c["value"] for c in classes} == PRIORITIES


def test_kwok_stages_hold_job_pods(tmp_path: Path) -> None:
    for kind, names in (("node", ["node-initialize"]), ("pod", ["pod-ready", "pod-complete"])):
        folder = tmp_path / "kwok-stages" / kind / "fast"
        folder.mkdir(parents=True)
        for name in names:
            stage = {"kind": "Stage", "metadata": {"name": name}, "spec": {"next": {}}}
            (folder / f"{name}.yaml").write_text(yaml.safe_dump(stage))
    home = tmp_path / "run"
    home.mkdir()
    stages = kwok_stages(Binaries(tmp_path), home)
    assert [p.name for p in stages] == [
        "node-initialize.yaml",
        "pod-ready.yaml",
        "pod-complete-after-hold.yaml",
    ]
    delay = yaml.safe_load(stages[-1].read_text())["spec"]["delay"]
    assert HOLD_ANNOTATION in delay["durationFrom"]["expressionFrom"]
    assert delay["durationMilliseconds"] == 0


# -- tables ----------------------------------------------------------------------------------


def test_tables_show_capped_and_failed_runs() -> None:
    run = {
        **admission_figures(["a", "b"], {"a": 0.0}, {"a": 5.0}, 1.0, 60),
        "system": "mcad",
        "capped": True,
        "seconds_to_done": None,
        "cap_seconds": 60.0,
        "controller_cpu_seconds_per_workload": 0.5,
        "requests_per_workload": 3.0,
        "requests_per_workload_by_verb": {"get": 2.0, "update": 1.0},
        "overcommitted_pods": 2,
    }
    ours = {**run, "system": "ours", "capped": False, "admitted_per_second": 10.0}
    runs = {"ours": [ours], "mcad": [run], "kueue": [{"system": "kueue", "error": "boom"}]}
    results = {"scenarios": {"burst": {"runs": runs, "summary": peer_bench.summarize(runs)}}}
    text = peer_bench.table(results)
    assert "| burst | mcad | 1/2 | 0.02 | 5.00 / 5.00 | > 60 (cap) | 500.0 |" in text
    assert "| 3 (get=2 update=1) |" in text
    assert "error: boom" in text
    ratios = peer_bench.ratio_table(results)
    assert "| burst | mcad | - | 588.24 (588.24-588.24)* |" in ratios
    assert "| burst | kueue | - | - |" in ratios


def test_crd_storage_version_is_switched(tmp_path: Path) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.example.com"},
        "spec": {
            "versions": [
                {"name": "v1beta1", "storage": True, "served": True},
                {"name": "v1beta2", "storage": False, "served": True},
            ]
        },
    }
    (tmp_path / "things.yaml").write_text(yaml.safe_dump(crd))
    peer = peers.Peer("kueue", "v0", tmp_path, tmp_path / "bin", tmp_path)
    (doc,) = peers.crd_documents(peer, storage="v1beta2")
    assert [v["storage"] for v in doc["spec"]["versions"]] == [False, True]
    (kept,) = peers.crd_documents(peer)
    assert [v["storage"] for v in kept["spec"]["versions"]] == [True, False]


def test_kueue_configuration_has_no_cluster_dependencies(tmp_path: Path) -> None:
    config = peers.kueue_configuration(9443, tmp_path, 8081, qps=50, burst=100, frameworks=["x"])
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"]["host"] == "127.0.0.1"
    assert config["metrics"] == {"bindAddress": "0"}
    assert config["clientConnection"] == {"qps": 50, "burst": 100}


def test_costs_are_per_workload_admitted() -> None:
    old = {
        "count": 1000,
        "admitted": 250,
        "controller_cpu_seconds": 20.0,
        "controller_cpu_seconds_per_workload": 0.02,
        "apiserver_cpu_seconds_per_workload": 0.05,
        "requests_per_workload": 7.0,
        "requests_per_workload_by_verb": {"create": 2.0, "patch": 5.0},
    }
    fixed = over_admitted(old)
    assert fixed["controller_cpu_seconds_per_workload"] == 0.08  # 20 s over 250
    assert fixed["apiserver_cpu_seconds_per_workload"] == 0.2
    assert fixed["requests_per_workload"] == 28.0
    assert fixed["requests_per_workload_by_verb"] == {"create": 8.0, "patch": 20.0}
    assert over_admitted(fixed) == fixed  # marked: never scaled twice
    everyone = {**old, "admitted": 1000}
    assert over_admitted(everyone)["controller_cpu_seconds_per_workload"] == 0.02
    assert over_admitted({"fill": 20, "controller_cpu_seconds_per_workload": 0.1}) == {
        "fill": 20,
        "controller_cpu_seconds_per_workload": 0.1,
    }
