"""Cluster-total fit (MCAD's accounting), as a setting: a member seen as one node."""

from __future__ import annotations

import pytest

from dispatcher.config import Fit
from dispatcher.core.model import DispatchedWorkload, QueueMode, Reservation
from dispatcher.core.scheduling import Admit, Wait, schedule
from dispatcher.core.scheduling.pooled import POOL, anywhere, pooled
from testenv.fakeenv import fake_env
from testenv.manifests import appwrapper, deployment
from tests.unit.builders import cluster, node, pods, res, workload

# MCAD's CI nodes after its suite's first AppWrapper (2 x 550m): 500m and 350m free.
MCAD_CI = (
    node("control-plane", cpu="1050m", used=res(cpu="550m"), max_pods=110),
    node("worker", cpu="900m", used=res(cpu="550m"), max_pods=110),
)
TWO_425 = workload("ns/two", pods(2, cpu="425m"))


def decide(clusters: list, pending: list) -> list:  # type: ignore[type-arg]
    result = schedule(
        pending,
        clusters,
        mode=QueueMode.STRICT_FIFO,
        now=0.0,
        starvation_after=300.0,
        preemption=None,
    )
    return [*result.admits, *result.waits]


def test_two_pods_that_fit_the_total_but_not_the_nodes() -> None:
    per_node = decide([cluster("c", *MCAD_CI)], [TWO_425])
    total = decide([pooled(cluster("c", *MCAD_CI))], [anywhere(TWO_425)])
    assert isinstance(per_node[0], Wait)
    assert total == [Admit("ns/two", "c")]
    # 852m is more than the 850m free in total, either way.
    more = workload("ns/more", pods(2, cpu="426m"))
    assert isinstance(decide([pooled(cluster("c", *MCAD_CI))], [anywhere(more)])[0], Wait)


def test_the_pool_adds_up_schedulable_nodes_only_and_counts_no_pods() -> None:
    nodes = (*MCAD_CI, node("cordoned", cpu="64", unschedulable=True))
    pool = pooled(cluster("c", *nodes)).nodes
    assert [(n.name, n.allocatable, n.requested) for n in pool] == [
        (POOL, res(cpu="1950m", memory="128Gi"), res(cpu="1100m"))
    ]


def test_selectors_tolerations_reservations_and_usage_follow_the_pool() -> None:
    picky = pods(1, cpu="1", selector={"zone": "a"})
    held = Reservation(key="ns/held", pod_sets=(picky,))
    admitted = DispatchedWorkload(
        key="ns/held",
        priority=0,
        dispatched_at=0.0,
        usage=(("control-plane", res(cpu="100m")), ("worker", res(cpu="200m"))),
    )
    seen = pooled(cluster("c", *MCAD_CI, reservations=(held,), admitted=(admitted,)))
    assert seen.reservations[0].pod_sets[0].node_selector == ()
    assert seen.admitted[0].usage == ((POOL, res(cpu="300m")),)
    assert anywhere(workload("ns/w", picky)).pod_sets[0].node_selector == ()


@pytest.mark.parametrize(
    ("fit", "dispatched"), [(Fit.PER_NODE, "False"), (Fit.CLUSTER_TOTAL, "True")]
)
async def test_the_setting_dispatches_as_mcad_and_records_the_spec_as_written(
    fit: Fit, dispatched: str
) -> None:
    """The admission checks the spec is still the one fitted: with the pods set free to go
    anywhere for the fit, the spec as written (node selector included) is what it checks."""
    async with fake_env(fit=fit) as env:
        await env.add_node("control-plane", cpu="500m")
        await env.add_node("worker", cpu="350m")
        aw = appwrapper("two", deployment("two", 2, {"cpu": "425m"}, nodeSelector={"x": "y"}))
        await env.apply(aw)
        await env.reconcile("two")
        await env.cycle()
        assert (await env.conditions("two"))["Dispatched"] == dispatched
