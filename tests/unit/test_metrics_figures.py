"""/metrics reads the last computed figures (metrics/figures.py): a scrape never makes the
controller pass over pending work, and the figures follow changes on the controller's timer."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from dispatcher import metrics
from dispatcher.metrics import Figures, pending_figures
from dispatcher.testing.fakeenv import fake_env
from dispatcher.testing.manifests import appwrapper, job

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

        def counted() -> metrics.figures.PendingFigures:
            nonlocal passes
            passes += 1
            return pending_figures(manager)

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

        def failing() -> metrics.figures.PendingFigures:
            nonlocal passes
            passes += 1
            if passes == 1:
                raise RuntimeError("a bug")
            return pending_figures(env.manager)

        figures = Figures(failing, every=5, sleep=env.clock.sleep)
        timer = asyncio.create_task(figures.run())
        try:
            await env.until(lambda: passes == 1, "the failing pass")
            env.clock.advance(5)
            await env.until(lambda: passes == 2, "the next pass")
            assert not timer.done()
        finally:
            timer.cancel()
