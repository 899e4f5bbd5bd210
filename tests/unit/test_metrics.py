"""The pending status rule (core.pending) and the client's request stats."""

from __future__ import annotations

import pytest

from dispatcher.api.models import Reason
from dispatcher.core.pending import PendingStatus, pending_status
from dispatcher.kube.client import RequestStats

ACTIVE, INADMISSIBLE = PendingStatus.ACTIVE, PendingStatus.INADMISSIBLE


@pytest.mark.parametrize(
    ("reason", "message", "status"),
    [
        (None, "", ACTIVE),  # not judged by a cycle yet
        (Reason.INSUFFICIENT_RESOURCES, "no cluster fits: needs cpu 2, free 1 of 2", ACTIVE),
        (Reason.INSUFFICIENT_RESOURCES, "waiting behind ns/a (head of line)", ACTIVE),
        (Reason.QUOTA_EXCEEDED, "cpu in default: 2 in use, quota 2", INADMISSIBLE),
        (Reason.QUEUE_NOT_READY, "AppQueue ns/team does not exist", INADMISSIBLE),
        (
            Reason.INSUFFICIENT_RESOURCES,
            "no member cluster matches the placement (clusterScheduling)",
            INADMISSIBLE,
        ),
    ],
)
def test_pending_status(reason: Reason | None, message: str, status: PendingStatus) -> None:
    assert pending_status(reason, message) is status


def test_request_stats_count_codes_and_time_answers() -> None:
    stats = RequestStats({})
    path = "/apis/workload.codeflare.dev/v1beta1/namespaces/ns/appwrappers/a/status"
    stats.answered("PUT", path, 200, 0.02)
    stats.answered("PUT", path, 409, 0.03)
    stats.answered("PUT", path, 200, 0.2)
    stats.answered("GET", "/api/v1/pods", None, 30.0, watch=True)
    assert stats.codes == {
        ("PUT", "appwrappers/status", "200"): 2,
        ("PUT", "appwrappers/status", "409"): 1,
        ("WATCH", "pods", "<error>"): 1,
    }
    samples = {
        (s.name, s.labels.get("verb"), s.labels.get("le")): s.value
        for metric in stats.latency.collect()
        for s in metric.samples
    }
    name = "appwrapper_dispatcher_api_request_duration_seconds"
    assert samples[(f"{name}_count", "PUT", None)] == 3
    assert samples[(f"{name}_bucket", "PUT", "0.025")] == 1
    assert samples[(f"{name}_bucket", "PUT", "0.05")] == 2
    assert samples[(f"{name}_bucket", "WATCH", "+Inf")] == 1
