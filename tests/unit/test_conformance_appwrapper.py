"""The AppWrapper suite harness's pure parts: the spec list read from a Ginkgo dry-run report,
the focus that selects one spec, the tables, the dispatcher's settings. No cluster, no Go."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks import conformance
from benchmarks.conformance import Outcome
from benchmarks.conformance_appwrapper import (
    Spec,
    comparison,
    focus,
    parse_report,
    table,
)
from benchmarks.conformance_appwrapper_systems import our_settings, translated_queues


def spec_report(containers: list[str], leaf: str, **extra: Any) -> dict[str, Any]:
    return {
        "ContainerHierarchyTexts": containers,
        "ContainerHierarchyLabels": [
            ["Kueue", "Standalone"] if c != "Outer" else [] for c in containers
        ],
        "LeafNodeType": "It",
        "LeafNodeText": leaf,
        "LeafNodeLabels": [],
        **extra,
    }


def test_parse_report_lists_its_with_full_names_and_labels_in_source_order() -> None:
    report = [
        {
            "SuiteDescription": "AppWrapper Test Suite",
            "SpecReports": [
                {"LeafNodeType": "BeforeSuite", "LeafNodeText": ""},
                spec_report(
                    ["Metrics"],
                    'say "hi"',
                    ContainerHierarchyLabels=None,
                    LeafNodeLocation={"FileName": "/e2e/metrics_test.go", "LineNumber": 3},
                ),
                spec_report(
                    ["Outer", "Queueing"],
                    "Basic Queuing",
                    LeafNodeLabels=["slow", "Kueue"],
                    LeafNodeLocation={"FileName": "/e2e/appwrapper_test.go", "LineNumber": 244},
                ),
                spec_report(
                    ["Outer", "Creation of Fundamental GVKs"],
                    "Pods",
                    LeafNodeLocation={"FileName": "/e2e/appwrapper_test.go", "LineNumber": 51},
                ),
            ],
        }
    ]
    assert parse_report(json.dumps(report)) == [
        Spec("Outer Creation of Fundamental GVKs Pods", ("Kueue", "Standalone")),
        Spec("Outer Queueing Basic Queuing", ("Kueue", "Standalone", "slow")),
        Spec('Metrics say "hi"', ()),
    ]


def test_parse_report_of_an_empty_suite() -> None:
    assert parse_report(json.dumps([{"SpecReports": None}])) == []


@pytest.mark.parametrize(
    ("name", "others"),
    [
        ("AppWrapper E2E Test Recognition of Child Jobs Batch Job", ["X Creation Batch Jobs"]),
        (
            "AppWrapper E2E Test Creation of Fundamental GVKs Pods",
            ["AppWrapper E2E Test Creation of Fundamental GVKs Pods (b)"],
        ),
        (
            "W Structural Invariants There must be at least one podspec (a)",
            ["W Structural Invariants There must be at least one podspec (b)"],
        ),
        ("Queueing [x] a.b*c? {1}|$^", ["Queueing [x] aXb*c? {1}|$^"]),
    ],
)
def test_focus_matches_the_name_alone(name: str, others: list[str]) -> None:
    # Go's RE2 and Python's re agree on these escapes.
    pattern = re.compile(focus(name))
    assert pattern.search(f"AppWrapper Test Suite {name}")
    assert not any(pattern.search(f"AppWrapper Test Suite {other}") for other in others)
    assert not pattern.search(f"AppWrapper Test Suite prefix {name}")


def outcome(test: str, result: str, detail: str = "") -> Outcome:
    return Outcome(test, result, 1.5, detail, 300.0)


def test_table_counts_passes_and_keeps_cells_on_one_line() -> None:
    text = table("ours", [outcome("A", "pass"), outcome("B", "fail", "Expected\n a | b")])
    lines = text.splitlines()
    assert lines[0] == "AppWrapper v1.1.2 e2e suite against ours: 1 of 2 pass"
    assert lines[-1] == "| B | fail | 1.5 | 300 | Expected  a / b |"


def test_comparison_names_causes_of_differences_only() -> None:
    reference = [outcome("A", "pass"), outcome("B", "pass"), outcome("C", "fail")]
    ours = [outcome("B", "fail"), outcome("A", "pass"), outcome("D", "pass")]
    other = [outcome("A", "pass"), outcome("B", "pass"), outcome("C", "fail")]
    causes = {"A": "not shown: same outcome", "B": "no Kueue quotas", "C": "not run here"}
    text = comparison([("ref", reference), ("ours", ours), ("other", other)], causes)
    assert text.splitlines() == [
        "| Test | ref | ours | other | Cause of the difference |",
        "|---|---|---|---|---|",
        "| A | pass | pass | pass |  |",
        "| B | pass | fail | pass | no Kueue quotas |",
        "| C | fail | - | fail | not run here |",
        "| D | - | pass | - |  |",
    ]


def test_our_settings_pass_the_kueue_setting_only_when_given(tmp_path: Path) -> None:
    cluster = SimpleNamespace(kubeconfig=tmp_path / "kubeconfig", webhook_client_ca=None)
    plain = our_settings(cluster, 8443, None)  # type: ignore[arg-type]
    assert "kueue_quotas" not in plain
    assert plain["webhook"]["port"] == 8443
    assert plain["webhook"]["client_ca_file"] is None
    assert our_settings(cluster, 8443, "instead")["kueue_quotas"] == "instead"  # type: ignore[arg-type]


def test_mcad_focus_is_unchanged() -> None:
    assert conformance.focus_on("MCAD (a) Test") == r"MCAD \(a\) Test$"


def test_translated_queues_keep_the_suites_names_and_quotas() -> None:
    flavor, cluster_queue, local_queue = translated_queues()
    assert [o["kind"] for o in (flavor, cluster_queue, local_queue)] == [
        "AppFlavor",
        "ClusterAppQueue",
        "AppQueue",
    ]
    assert flavor["metadata"]["name"] == "e2e-test-flavor"
    assert cluster_queue["metadata"]["name"] == "e2e-test-queue"
    assert cluster_queue["spec"]["namespaceSelector"] == {}
    (group,) = cluster_queue["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "nvidia.com/gpu"]
    assert group["flavors"] == [
        {
            "name": "e2e-test-flavor",
            "resources": [
                {"name": "cpu", "nominalQuota": "2000m"},
                {"name": "nvidia.com/gpu", "nominalQuota": 2},
            ],
        }
    ]
    assert local_queue["metadata"] == {"name": "e2e-test-queue", "namespace": "e2e-test"}
    assert local_queue["spec"] == {"clusterQueue": "e2e-test-queue"}


@pytest.mark.parametrize(
    ("output", "detail"),
    [
        (
            "x\n  [FAILED] Failed after 0.1s.\n  Expected\n    <Phase>: Resuming\n  to equal\n",
            "Expected <Phase>: Resuming to equal",
        ),
        (
            "  [FAILED] in [It] - util_test.go:322\n  [FAILED] Unexpected error:\n"
            "    <*fmt.wrapError>:\n    rate: Wait(n=1) would exceed context deadline\n    {\n",
            "[FAILED] Unexpected error: <*fmt.wrapError>: rate: Wait(n=1) would exceed context "
            "deadline {",
        ),
        ("a\nb\nc\nd\n", "b c d"),
    ],
)
def test_failure_detail_is_the_suites_own_message(output: str, detail: str) -> None:
    assert conformance._failure(output) == detail
