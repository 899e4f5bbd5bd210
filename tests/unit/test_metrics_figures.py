"""/metrics reads the last published view (metrics/view.py, kept by figures.py): a scrape
never makes the controller pass over pending work nor drives its cache, and the figures
follow changes on the controller's timer."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import NoReturn, cast

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from dispatcher import metrics
from dispatcher.core.quota.model import FlavorQuotas, QueueSpec, Quota, ResourceGroup
from dispatcher.core.quota.summary import QueueSummary
from dispatcher.kube.client import RequestStats
from dispatcher.metrics import (
    Counted,
    Figures,
    ManagerCollector,
    MetricsFigures,
    PendingFigures,
    QueueFigures,
)
from testenv.fakeenv import fake_env
from testenv.manifests import appwrapper, job

PENDING = "appwrapper_dispatcher_pending_workloads"


def pending(text: str) -> float:
    """Pending AppWrappers without queues, whatever their status."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == PENDING and sample.labels["cluster_queue"] == ""
    )


async def test_a_scrape_computes_nothing_and_the_figures_follow_on_the_timer() -> None:
    async with fake_env(metrics={"refresh_seconds": 5}) as env:
        manager = env.manager
        passes = 0

        def counted() -> PendingFigures:
            nonlocal passes
            passes += 1
            return manager.pending_figures()

        # The manager's own Figures, its timer on the test's clock.
        manager.figures = Figures(counted, every=5, sleep=env.clock.sleep)
        timer = asyncio.create_task(manager.figures.run())
        try:
            await env.until(lambda: passes == 1, "the first figures")
            await env.add_node("n1", cpu="1")
            for name in ("a", "b"):  # neither fits: both wait
                await env.apply(appwrapper(name, job(name, 1, {"cpu": "2"})))
                await env.reconcile(name)
            await env.cycle()
            for _ in range(20):
                assert pending(metrics.render(manager)) == 0  # the last figures: none yet
            assert passes == 1
            env.clock.advance(5)
            await env.until(lambda: passes == 2, "the timer's pass")
            assert pending(metrics.render(manager)) == 2
            await env.delete("a")
            await env.reconcile("a")
            await env.cycle()  # the figures read what a cycle left (`Scheduler.view`)
            assert pending(metrics.render(manager)) == 2
            env.clock.advance(5)
            await env.until(lambda: passes == 3, "the next pass")
            assert pending(metrics.render(manager)) == 1
            assert passes == 3
        finally:
            timer.cancel()


async def test_the_leaders_manager_runs_the_timer() -> None:
    async with fake_env(loops=True) as env:
        await env.until(lambda: env.manager.figures.computed >= 1, "the figures computed")
        computed = env.manager.figures.computed
        for _ in range(10):
            metrics.render(env.manager)
        assert env.manager.figures.computed == computed


async def test_a_pass_that_fails_is_logged_and_the_timer_goes_on() -> None:
    """A bug in the figures must not end the manager's task group (the leader's work)."""
    async with fake_env(metrics={"refresh_seconds": 5}) as env:
        passes = 0

        def failing() -> PendingFigures:
            nonlocal passes
            passes += 1
            if passes == 1:
                raise RuntimeError("a bug")
            return env.manager.pending_figures()

        figures = Figures(failing, every=5, sleep=env.clock.sleep)
        timer = asyncio.create_task(figures.run())
        try:
            await env.until(lambda: passes == 1, "the failing pass")
            env.clock.advance(5)
            await env.until(lambda: passes == 2, "the next pass")
            assert not timer.done()
        finally:
            timer.cancel()


def _untouchable(what: str) -> Callable[..., NoReturn]:
    def touched(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError(f"a scrape called {what}")

    return touched


async def test_a_scrape_never_drives_the_cache_nor_the_quota_tree() -> None:
    """The scheduler's state is refreshed by its cycle alone and read through the view it
    publishes (built once per cycle): a scrape does neither, nor rebuilds the quota tree."""
    async with fake_env(metrics={"refresh_seconds": 5}) as env:
        manager = env.manager
        await env.add_node("n1", cpu="1")
        for name in ("a", "b"):  # neither fits: both wait
            await env.apply(appwrapper(name, job(name, 1, {"cpu": "2"})))
            await env.reconcile(name)
        await env.cycle()
        manager.figures.refresh()  # the timer's pass, published
        for part, method in (
            (manager.scheduler.state, "refresh"),
            (manager.scheduler.state, "view"),
            (manager.quotas, "tree"),
            (manager.quotas, "summarize"),
        ):
            setattr(part, method, _untouchable(method))  # shadows the method on this object
        for _ in range(5):
            text = metrics.render(manager)
            assert pending(text) == 2
        assert manager.figures.computed == 1
        with pytest.raises(AssertionError, match="a scrape called tree"):
            manager.pending_figures()  # the stand-ins are where a scrape would have hit them


class StandIn:
    """Only what `metrics.Counted` names; the rest of a manager raises if touched."""

    def __init__(self, view: MetricsFigures) -> None:
        self.states = Counter({"Running": 2, "Pending": 1, "Failed": 0})
        self.cycles = 7
        self.preemptions = 3
        self.preemptions_by_queue = {"cq": 3}
        self.finished = Counter({"count": 4, "reconciles": 10, "cycles": 5, "writes": 12})
        self.request_stats = RequestStats({})
        self.metrics_view = view

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"a scrape read manager.{name}")


def test_a_scrape_reads_the_published_view_and_the_counters_only() -> None:
    spec = QueueSpec(
        "cq",
        groups=(ResourceGroup(("cpu",), (FlavorQuotas("default", {"cpu": Quota(4000, 2000)}),)),),
        cohort="all",
    )
    summary = QueueSummary(
        pending=1,
        admitted=2,
        reserving=3,
        usage={("default", "cpu"): 5000},
        borrowed={("default", "cpu"): 1000},
    )
    view = MetricsFigures(
        QueueFigures(
            {"cq": spec},
            {"cq": summary},
            {"ns/team": QueueSummary(admitted=2)},
            {"cq": ("nvidia.com/gpu", 12.5, 487.5)},
            {"cq": (("alice", "cpu", 1.5),)},
        ),
        PendingFigures({("cq", "inadmissible"): 1}, {("ns/team", "inadmissible"): 1}),
    )
    registry = CollectorRegistry(auto_describe=True)
    registry.register(ManagerCollector(cast(Counted, StandIn(view))))

    def sample(metric: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"appwrapper_dispatcher_{metric}", labels)

    resource = {"cohort": "all", "cluster_queue": "cq", "flavor": "default", "resource": "cpu"}
    assert sample("appwrappers", state="Running") == 2
    assert sample("appwrappers", state="Failed") is None  # zero counts are left out
    assert sample("cycles_total") == 7
    assert sample("preemptions_total") == 3
    assert sample("lifecycle_writes_total") == 12
    assert sample("admitted_active_workloads", cluster_queue="cq") == 2
    assert sample("reserving_active_workloads", cluster_queue="cq") == 3
    assert sample("cluster_queue_status", cluster_queue="cq", status="active") == 1
    assert sample("cluster_queue_resource_usage", **resource) == 5
    assert sample("cluster_queue_resource_borrowed", **resource) == 1
    assert sample("cluster_queue_nominal_quota", **resource) == 4
    assert sample("cluster_queue_borrowing_limit", **resource) == 2
    assert sample("cluster_queue_lending_limit", **resource) is None
    assert sample("pending_workloads", cluster_queue="cq", status="inadmissible") == 1
    assert sample("pending_workloads", cluster_queue="cq", status="active") == 0
    team = {"name": "team", "namespace": "ns"}
    assert sample("local_queue_pending_workloads", status="inadmissible", **team) == 1
    assert sample("local_queue_admitted_active_workloads", **team) == 2
    assert sample("queue_pending", queue="cq") == 1
    assert sample("queue_preemptions_total", queue="cq") == 3
    gpu = {"cluster_queue": "cq", "resource": "nvidia.com/gpu"}
    assert sample("cluster_queue_budget_spent_hours", **gpu) == 12.5
    assert sample("cluster_queue_budget_remaining_hours", **gpu) == 487.5
    assert (
        sample("cluster_queue_user_usage", cluster_queue="cq", user="alice", resource="cpu") == 1.5
    )
