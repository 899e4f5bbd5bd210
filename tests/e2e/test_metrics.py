"""/metrics and `kubectl get appwrappers` on the real control plane: a Job AppWrapper goes
through a queue to Running, another waits on the queue's quota; the scrape names them with
Kueue's labels and its histograms counted the first; the table shows what each asks for and
why the second waits."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatcher import health, metrics
from testenv.manifests import appwrapper, job
from testenv.ports import free_port
from tests.e2e.conftest import apply, get_aw, wait_condition
from tests.e2e.test_quotas import get_table, one_queue, wait_message, work

pytestmark = [pytest.mark.cluster]

P = "appwrapper_dispatcher"
DASHBOARD = Path(__file__).parents[2] / "manifests" / "grafana" / "dispatcher-dashboard.json"
QUERIED = re.compile(r"\b(?:appwrapper_dispatcher|process|python)_[a-z_]+\b")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture
def priority_class(cluster: Any, namespace: str) -> Iterator[str]:
    name = f"{namespace}-batch"
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": 10,
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    yield name
    cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found", check=False)


SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "info": ["_info"]}


def exported_names(text: str) -> set[str]:
    """The series names a scrape declares, those with no series yet included (a counter by
    reason has none until the first eviction)."""
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, [""])
    }


async def scrape(port: int) -> tuple[str, Samples]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        assert response.status == 200
        text = await response.text()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return text, samples


def value(samples: Samples, metric: str, **labels: str) -> float:
    return samples[(metric, frozenset(labels.items()))]


async def test_a_job_through_a_queue_is_counted_and_shown(
    cluster, namespace, fake_nodes, run_dispatcher, quotas, priority_class
):
    cq = await one_queue(cluster, namespace, fake_nodes)  # 4 cpu, AppQueue "team"
    dispatcher = await run_dispatcher()
    port = free_port()
    runner = await health.serve(
        port=port, ready=dispatcher.ready.is_set, metrics=lambda: metrics.render(dispatcher)
    )
    try:
        batch = appwrapper(
            "batch",
            job("batch", 1, {"cpu": "1"}),
            queue="team",
            priority_class=priority_class,
            completion="Complete",
        )
        await apply(cluster, namespace, batch)
        await apply(cluster, namespace, work("huge", "5", "team"))  # more than the quota
        await wait_condition(cluster, namespace, "batch", "Running")
        await wait_message(cluster, namespace, "huge", "the most it can ever have is 4")

        rows = {r["NAME"]: r for r in await get_table(cluster, "appwrappers", "-n", namespace)}
        assert list(rows["huge"]) == [
            "NAME",
            "STATE",
            "STAGE",
            "APPQUEUE",
            "REASON",
            "STATUS",
            "CLUSTER",
            "PRIORITY",
            "AGE",
        ]
        assert (rows["huge"]["APPQUEUE"], rows["huge"]["REASON"]) == ("team", "QuotaExceeded")
        assert (rows["batch"]["APPQUEUE"], rows["batch"]["REASON"]) == (
            "team",
            "AppWrapperRunnable",
        )
        table = (await cluster.akubectl("get", "appwrappers", "-n", namespace)).stdout
        assert max(len(line) for line in table.splitlines()) <= 120
        (wide,) = [
            r
            for r in await get_table(cluster, "appwrappers", "-n", namespace, "-o", "wide")
            if r["NAME"] == "batch"
        ]
        assert (wide["CLUSTERQUEUE"], wide["REQUEUES"]) == (cq, "0")

        # The queue's status (and so its gauges) is written a moment after a change, the
        # pending figures every metrics.refresh_seconds: both now.
        await dispatcher.quotas.write_status()
        dispatcher.figures.refresh()
        text, samples = await scrape(port)
        labels = {"cluster_queue": cq, "priority_class": priority_class}
        assert value(samples, f"{P}_admission_wait_time_seconds_count", **labels) == 1
        assert value(samples, f"{P}_admitted_until_ready_wait_time_seconds_count", **labels) == 1
        assert value(samples, f"{P}_admitted_workloads_total", **labels) == 1
        # Created, admitted and running within the first minute: all in the 60 s bucket.
        waited = value(samples, f"{P}_admission_wait_time_seconds_bucket", le="60.0", **labels)
        assert waited == 1
        for status, count in (("active", 0), ("inadmissible", 1)):
            pending = {"cluster_queue": cq, "status": status}
            assert value(samples, f"{P}_pending_workloads", **pending) == count
            local = {"name": "team", "namespace": namespace, "status": status}
            assert value(samples, f"{P}_local_queue_pending_workloads", **local) == count
        assert value(samples, f"{P}_cluster_queue_nominal_quota", **_cpu(cq)) == 4
        assert value(samples, f"{P}_leader") == 1
        assert value(samples, f"{P}_admission_attempts_total", result="success") >= 1
        build = {
            k
            for (name, labels_), _ in samples.items()
            if name == f"{P}_build_info"
            for k, _ in labels_
        }
        assert build == {"version", "python"}
        assert "process_resident_memory_bytes" in text
        assert "python_info" in text
        # The hub's requests, by code, with their latency: the admission was a status write.
        status_write = {"verb": "PUT", "resource": "appwrappers/status", "code": "200"}
        assert value(samples, f"{P}_api_requests_total", **status_write) >= 1
        latency = {"verb": "PUT", "resource": "appwrappers/status"}
        assert value(samples, f"{P}_api_request_duration_seconds_count", **latency) >= 1
        # Every series the Grafana dashboard queries is one this scrape has.
        assert dashboard_metrics() - exported_names(text) == set()
        # The names before Kueue's stay for one release.
        assert value(samples, f"{P}_queue_pending", queue=cq) == 1
        aw = await get_aw(cluster, namespace, "batch")
        assert aw["status"]["admission"]["clusterQueue"] == cq
    finally:
        await runner.cleanup()


def _cpu(cq: str) -> dict[str, str]:
    return {"cohort": "", "cluster_queue": cq, "flavor": "default-flavor", "resource": "cpu"}


def dashboard_metrics() -> set[str]:
    """Every metric name the dashboard's panels query (and its variables read)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    names = {name for expr in exprs for name in QUERIED.findall(expr)}
    assert len(names) >= 15, names  # the parse found the queries
    return names
