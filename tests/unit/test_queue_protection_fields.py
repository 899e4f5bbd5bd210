"""A ClusterAppQueue's own fields for reservations and protection, as read into its spec:
`spec.backfill`, `spec.preemption.minimumRuntimeSeconds`, `spec.preemption.noticeSeconds`."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from dispatcher.api.queues import ClusterAppQueue
from dispatcher.core.model import Backfill
from dispatcher.core.quota.read import queue_of
from tests.unit.test_docs_reference import REPO


def read(spec: dict[str, Any]) -> ClusterAppQueue:
    return ClusterAppQueue.model_validate({"metadata": {"name": "team"}, "spec": spec})


def test_defaults_reserve_with_backfill_and_protect_nothing() -> None:
    spec = queue_of(read({}))
    assert (spec.backfill, spec.minimum_runtime, spec.notice_seconds) == (
        Backfill.DECLARED,
        0.0,
        0.0,
    )


def test_the_fields_are_read() -> None:
    spec = queue_of(
        read(
            {
                "backfill": "Never",
                "preemption": {"minimumRuntimeSeconds": 600, "noticeSeconds": 30},
            }
        )
    )
    assert (spec.backfill, spec.minimum_runtime, spec.notice_seconds) == (
        Backfill.NEVER,
        600.0,
        30.0,
    )


@pytest.mark.parametrize(
    "preemption",
    [
        {"minimumRuntimeSeconds": -1},
        {"minimumRuntimeSeconds": 10**9},
        {"noticeSeconds": 3601},
        {"noticeSeconds": "soon"},
    ],
)
def test_out_of_range_values_are_refused_by_the_model_as_by_the_crd(
    preemption: dict[str, Any],
) -> None:
    with pytest.raises(ValidationError):
        read({"preemption": preemption})


def test_the_crd_allows_what_the_model_reads_and_no_yaml_boolean() -> None:
    """`Never`, not `Off`: kubectl's YAML parser reads an unquoted Off as false, which a
    string enum would refuse with a confusing message."""
    docs = list(yaml.safe_load_all((REPO / "crds" / "queues.yaml").read_text()))
    crd = next(d for d in docs if d["spec"]["names"]["kind"] == "ClusterAppQueue")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    backfill = spec["properties"]["backfill"]
    assert backfill["enum"] == [b.value for b in (Backfill.DECLARED, Backfill.NEVER)]
    assert backfill["default"] == Backfill.DECLARED.value
    assert all(isinstance(v, str) and v.lower() not in {"on", "off"} for v in backfill["enum"])
    preemption = spec["properties"]["preemption"]["properties"]
    assert preemption["minimumRuntimeSeconds"]["maximum"] == 7 * 24 * 3600
    assert preemption["noticeSeconds"]["maximum"] == 3600
