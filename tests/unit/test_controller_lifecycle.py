"""Whole lives on the in-memory API server with every loop running (workers, scheduler,
waiting writers), counting what each life costs: reconciles, cycles, status writes."""

from __future__ import annotations

from dispatcher.kube.client import ResourceInfo
from testenv.fakeenv import APPWRAPPER, NAMESPACE, FakeEnv, fake_env
from testenv.manifests import appwrapper, job

JOB = ("batch/v1", "Job")
JOBS = ResourceInfo("batch/v1", "Job", "jobs", namespaced=True)


def condition(env: FakeEnv, name: str, type_: str) -> str | None:
    obj = env.manager.status.current(f"{NAMESPACE}/{name}") or {}
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    return found[0]["status"] if found else None


async def test_a_job_from_apply_to_completed_costs_four_status_writes() -> None:
    async with fake_env(loops=True) as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", job("a", 1, {"cpu": "1"}), completion="Complete"))
        await env.until(lambda: len(env.objects(*JOB)) == 1, "the Job is created")
        pods = await env.pods("a", 1)
        await env.until(lambda: condition(env, "a", "Running") == "True", "Running")
        await env.set_pod_phase(pods, "Succeeded")
        done = {"type": "Complete", "status": "True"}
        await env.fake.merge_patch(
            JOBS, NAMESPACE, "a", {"status": {"conditions": [done]}}, sub="status"
        )
        await env.until(lambda: condition(env, "a", "Completed") == "True", "Completed")
        await env.until(lambda: env.manager.finished["count"] == 1, "its hops counted")
        hops = env.manager.finished
        # Dispatched (with Init and Queueing), the record that its objects were made (v1beta2
        # phase Running: written at once, never after its pods run), Running, Completed: the
        # pod's finish alone changes only counts, which wait for the next write.
        assert hops["writes"] == 4
        made = (env.manager.status.current(f"{NAMESPACE}/a") or {}).get("status") or {}
        assert made["objectsMadeFor"] == made["lastDispatchedAt"]
        assert hops["cycles"] == 1
        # One per change it must react to (created, taken in, its Job, each pod change), fewer
        # when changes arrive together; never one for the echo of its own write.
        assert hops["reconciles"] <= 8, hops
        assert condition(env, "a", "Running") == "True"


async def test_a_deleted_appwrapper_leaves_nothing_behind_in_memory() -> None:
    async with fake_env(loops=True) as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", job("a", 1, {"cpu": "1"}), completion="Complete"))
        await env.until(lambda: condition(env, "a", "Dispatched") == "True", "dispatched")
        await env.until(lambda: len(env.objects(*JOB)) == 1, "the Job is created")
        await env.delete("a")
        await env.until(lambda: not env.objects(*APPWRAPPER), "the AppWrapper is gone")
        key = f"{NAMESPACE}/a"
        await env.until(lambda: len(env.manager.cache) == 0, "the cache forgot it")
        manager = env.manager
        held = {
            "reconciles": manager.reconciles,
            "considered": manager.scheduler.considered,
            "writes": manager.status.writes,
            "overlay": manager.status._overlay,
            "parsed": manager.reader._parsed,
            "workloads": manager.reader._workloads,
            "ensured": manager.reconciler._ensured,
            "cleaned": manager.reconciler._endings._cleaned,
            "counts": manager.reconciler._pacing._counts_written,
            "waiting": manager.waiting._written,
        }
        assert [name for name, store in held.items() if key in store] == []
