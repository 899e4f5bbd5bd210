"""The pending status rule (core.pending), the client's request stats, and the recorder
as the controller drives it on the in-memory API server."""

from __future__ import annotations

import pytest

from dispatcher.api.models import Reason
from dispatcher.core.pending import PendingStatus, pending_status
from dispatcher.kube.client import RequestStats
from testenv.fakeenv import fake_env
from testenv.manifests import appwrapper, deployment
from tests.unit.test_controller_preemption import fill_with_low

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


async def test_the_recorder_counts_admissions_running_preemptions_and_evictions() -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="4")
        pods = await fill_with_low(env, ["low-a", "low-b"])  # dispatched, pods made
        await env.set_pod_phase(pods["low-a"], "Running")
        await env.caught_up()
        await env.reconcile("low-a")  # Running: low-b's pods never ran
        await env.apply(appwrapper("high", deployment("high", 1, {"cpu": "2"}), priority=10))
        await env.reconcile("high")
        await env.cycle()
        await env.reconcile("low-b")  # the victim: its objects go, it is requeued
        await env.remove_pods(pods["low-b"])
        await env.cycle()

        registry = env.manager.recorder.registry

        def sample(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(f"appwrapper_dispatcher_{name}", labels)

        unqueued = {"cluster_queue": "", "priority_class": ""}
        assert sample("admitted_workloads_total", **unqueued) == 3
        assert sample("admission_wait_time_seconds_count", **unqueued) == 3
        assert sample("admitted_until_ready_wait_time_seconds_count", **unqueued) == 1
        reason = "PreemptedByHigherPriority"
        assert sample("preempted_workloads_total", preempting_cluster_queue="", reason=reason) == 1
        assert sample("evicted_workloads_total", cluster_queue="", reason="Preempted") == 1
        assert sample("admission_attempts_total", result="success") == 3
        assert sample("admission_attempt_duration_seconds_count", result="success") == 3
