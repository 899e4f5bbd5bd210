"""What users do: kubectl get/describe/wait, and a dispatcher process killed mid-run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml

from testenv.waits import async_holds_for, async_wait_until
from tests.e2e.conftest import (
    QUIET_SECONDS,
    apply,
    appwrapper,
    conditions,
    deployment,
    get_aw,
    load_sample,
    pod_template,
    wait_condition,
)
from tests.e2e.test_visibility import kubectl_aw

pytestmark = [pytest.mark.cluster]


async def test_kubectl_get_describe_wait(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1", cpu="2", memory="8Gi")
    await run_dispatcher()
    await apply(
        cluster, namespace, appwrapper("web", deployment("web", 1, {"cpu": "1"}), priority=7)
    )
    await apply(cluster, namespace, appwrapper("too-big", deployment("tb", 1, {"cpu": "2"})))
    await wait_condition(cluster, namespace, "web", "Running")

    table = (await cluster.akubectl("get", "aw", "-n", namespace)).stdout
    header, *rows = table.strip().splitlines()
    assert header.split() == [
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
    # `kubectl get aw` reads v1beta2, the preferred version (STATUS is its phase). It asks
    # for no queue: its APPQUEUE cell is blank, and a whitespace split skips it.
    web = next(r.split() for r in rows if r.startswith("web"))
    assert web[1:7] == ["Running", "Running", "AppWrapperRunnable", "Running", "local", "7"]

    async def too_big_waits() -> bool:
        described = (await cluster.akubectl("describe", "aw", "too-big", "-n", namespace)).stdout
        return "needs cpu 2, free 1 of 2" in described

    await async_wait_until(too_big_waits, timeout=30, what="describe shows why it waits")

    async def web_story() -> str | None:
        described = (await cluster.akubectl("describe", "aw", "web", "-n", namespace)).stdout
        wanted = ("Queued", "Dispatched", "PodsRunning", "dispatched to cluster local")
        return described if all(w in described for w in wanted) else None

    described = await async_wait_until(web_story, timeout=30, what="events in describe")
    assert "Events:" in described
    for condition in ("Init", "Queueing", "HeadOfLine", "Dispatched", "Running"):
        assert condition in described

    # Events tell the steps taken, not the states between: web's one Event is its dispatch
    # (queued, at the head and Running are in its conditions); too-big, waiting, has none.
    async def reasons(name: str) -> list[str]:
        selector = f"involvedObject.kind=AppWrapper,involvedObject.name={name}"
        listed = await cluster.akubectl(
            "get", "events", "-n", namespace, "--field-selector", selector,
            "-o", "jsonpath={.items[*].reason}",
        )  # fmt: skip
        return sorted(listed.stdout.split())

    async def web_dispatched_event() -> bool:
        return bool(await reasons("web"))

    await async_wait_until(web_dispatched_event, timeout=30, what="web's Event")

    async def only_the_steps() -> bool:
        assert await reasons("web") == ["AppWrapperRunnable"]
        assert await reasons("too-big") == []
        return True

    await async_holds_for(only_the_steps, seconds=QUIET_SECONDS, what="no Event for states")


def _dispatcher_process(config: Path, log: Path) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return asyncio.create_subprocess_exec(  # type: ignore[return-value]
        sys.executable,
        "-m",
        "dispatcher",
        "run",
        "--config",
        str(config),
        stdout=log.open("ab"),
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )


async def test_killed_and_restarted_dispatcher_converges(
    cluster, namespace, fake_nodes, appwrapper_crd, tmp_path
):
    fake_nodes.add("a", cpu="8", memory="32Gi")
    fake_nodes.add("b", cpu="8", memory="32Gi")
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kubeconfig": str(cluster.kubeconfig),
                "members": [{"name": "local", "node_selector": fake_nodes.pool}],
                "health_port": 0,
                "log_level": "info",
                "unattributed": "allow",  # no admission webhook here
            }
        )
    )
    log = tmp_path / "dispatcher.log"
    names = [f"aw-{i:02d}" for i in range(24)]
    # 24 gangs of 2 pods x 1 CPU would need 48 CPUs; there are 16: 8 fit at a time.
    for name in names:
        await apply(cluster, namespace, appwrapper(name, deployment(name, 2, {"cpu": "1"})))

    process = await _dispatcher_process(config, log)
    try:

        async def some_dispatched() -> bool:
            states = [(await conditions(cluster, namespace, n)).get("Dispatched") for n in names]
            return states.count("True") >= 3

        await async_wait_until(some_dispatched, timeout=60, what="first dispatches")
        process.send_signal(signal.SIGKILL)
        await process.wait()
        process = await _dispatcher_process(config, log)

        async def eight_running() -> bool:
            running = [(await conditions(cluster, namespace, n)).get("Running") for n in names]
            return running.count("True") == 8

        await async_wait_until(eight_running, timeout=90, what="8 AppWrappers running")
        out = await cluster.akubectl("get", "deployments", "-n", namespace, "-o", "json")
        deployments = [d["metadata"]["name"] for d in json.loads(out.stdout)["items"]]
        assert len(deployments) == len(set(deployments)) == 8
        pods = json.loads(
            (await cluster.akubectl("get", "pods", "-n", namespace, "-o", "json")).stdout
        )["items"]
        live = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")]
        assert len(live) == 16
        assert all(p["status"]["phase"] == "Running" for p in live)
        # Nothing lost: the 8 whose pods run are Running, the other 16 wait with a reason.
        states = {"Running": 0, "Pending": 0}
        for name in names:
            got = json.loads(
                (await cluster.akubectl("get", "aw", name, "-n", namespace, "-o", "json")).stdout
            )
            status = got["status"]
            running = any(
                c["type"] == "Running" and c["status"] == "True" for c in status["conditions"]
            )
            if running:
                assert status["state"] == "Running", status
            else:
                assert status["state"] == "Pending", status
                assert status["message"], status
            states[status["state"]] += 1
        assert states == {"Running": 8, "Pending": 16}
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
        # Remove the AppWrappers while a dispatcher can still run their finalizers.
        cleanup = await _dispatcher_process(config, log)
        await cluster.akubectl(
            "delete", "aw", "--all", "-n", namespace, "--timeout=60s", check=False, timeout=90
        )
        cleanup.send_signal(signal.SIGTERM)
        await cleanup.wait()


async def test_mcad_legacy_yaml_applies_and_runs(cluster, namespace, fake_nodes, run_dispatcher):
    fake_nodes.add("n1", gpu=2)
    await run_dispatcher()
    sample = load_sample("mcad-legacy.yaml")
    await apply(cluster, namespace, sample)
    await wait_condition(cluster, namespace, sample["metadata"]["name"], "Completed", timeout=90)


async def test_kubectl_aw_shows_a_tenants_escape_sequences_as_text(
    cluster, namespace, fake_nodes, run_dispatcher
):
    """A worker group name and a node-selector value carrying terminal escape sequences
    (clear the screen, set the window title) reach the dispatcher's message; `kubectl aw`
    prints them escaped, never to the terminal as they are."""
    fake_nodes.add("n1", cpu="4")
    await run_dispatcher()
    group = "\x1b[2J\x1b[Hgpu"
    spec = pod_template({"cpu": "1"}, nodeSelector={"accelerator": "\x1b]0;owned\x07a100"})
    ray = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": "rc"},
        "spec": {"workerGroupSpecs": [{"groupName": group, "replicas": 1, "template": spec}]},
    }
    await apply(cluster, namespace, appwrapper("rc", ray))
    said = f"no schedulable node matches pod RayCluster/rc worker {group}"

    async def waits_saying_why() -> bool:
        status = (await get_aw(cluster, namespace, "rc")).get("status") or {}
        return any(said in (c.get("message") or "") for c in status.get("conditions") or [])

    await async_wait_until(waits_saying_why, timeout=30, what="rc waits, naming its group")
    why = await kubectl_aw(cluster, "why", "rc", "-n", namespace)
    listed = await kubectl_aw(cluster, "list", "-n", namespace, "-o", "wide")
    for ran in (why, listed):
        assert "\x1b" not in ran.stdout + ran.stderr
        assert "\x07" not in ran.stdout + ran.stderr
    assert "worker \\x1b[2J\\x1b[Hgpu (nodeSelector/taints)" in why.stdout
    # -o json keeps the data exact.
    as_json = json.loads(
        (await kubectl_aw(cluster, "why", "rc", "-n", namespace, "-o", "json")).stdout
    )
    assert any(said in c["message"] for c in as_json["status"]["conditions"])
