"""The cap on the whole AppWrapper (max_appwrapper_bytes) on the real API server: the CRD
bounds the breadth of the legacy fields at apply; AppWrappers of about 1 MB stored while the
webhook is absent are failed by a dispatcher that runs as a real deployment does (its own
process) and stays far within the shipped Deployment's 512Mi memory limit."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.controller.status import APPWRAPPERS
from dispatcher.kube.client import KubeClient
from testenv.manifests import appwrapper, deployment
from testenv.waits import async_wait_until

pytestmark = [pytest.mark.cluster]

STORED = 100
"""AppWrappers of about 1 MB each: half there before the dispatcher starts (its first
list), half created while it runs (its watch)."""
DEPLOYMENT_LIMIT_MIB = 512
"""manifests/: the memory limit of the shipped Deployment."""
PEAK_LIMIT_MIB = 256
"""What the dispatcher may reach here: half the Deployment's limit."""


def stuffed(name: str) -> dict[str, Any]:
    """An AppWrapper whose legacy `service` field (unknown fields kept, no schema to bound
    them) carries about 1 MB: a thousand strings of a thousand characters."""
    obj = appwrapper(name, deployment(name, 1, {"cpu": "1"}))
    obj["spec"]["service"] = {"spec": {"blob": [f"{i:04d}" + "x" * 996 for i in range(1000)]}}
    return obj


async def for_each(names: list[str], act: Callable[[str], Awaitable[Any]]) -> None:
    """`act` on every name, eight at a time: the API server takes a 1 MB write in a few ms."""
    gate = asyncio.Semaphore(8)

    async def one(name: str) -> None:
        async with gate:
            await act(name)

    await asyncio.gather(*(one(name) for name in names))


async def create_all(client: KubeClient, namespace: str, names: list[str]) -> None:
    await for_each(names, lambda name: client.create(APPWRAPPERS, namespace, stuffed(name)))


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


STORED_VERSION = "appwrappers.v1beta1.workload.codeflare.dev"


def failed_names(cluster: Any, namespace: str) -> set[str]:
    """AppWrappers whose State column reads Failed: the server prints the table, so the
    megabytes of each object never travel. Read as stored (v1beta1): no conversion of each
    megabyte on every look."""
    out = cluster.kubectl("get", STORED_VERSION, "-n", namespace, "--no-headers").stdout
    return {row.split()[0] for row in out.splitlines() if row.split()[1:2] == ["Failed"]}


def size_events(cluster: Any, namespace: str) -> dict[str, str]:
    """AppWrapper name -> message of its InvalidSpec Event."""
    out = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector=reason=InvalidSpec", "-o", "json"
    ).stdout
    return {e["involvedObject"]["name"]: e["message"] for e in json.loads(out)["items"]}


@pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads the dispatcher's memory in /proc"
)
async def test_oversized_appwrappers_stored_without_the_webhook_are_failed_within_memory(
    cluster, namespace, appwrapper_crd, fake_nodes, tmp_path
):
    names = [f"big-{i:03d}" for i in range(STORED)]
    client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), name="test")
    process: asyncio.subprocess.Process | None = None
    try:
        await create_all(client, namespace, names[: STORED // 2])
        config = tmp_path / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "kubeconfig": str(cluster.kubeconfig),
                    "members": [{"name": "local", "node_selector": fake_nodes.pool}],
                    "health_port": 0,
                    "log_level": "warning",
                    "unattributed": "allow",
                }
            )
        )
        with (tmp_path / "dispatcher.log").open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                *[sys.executable, "-m", "dispatcher", "run", "--config", str(config)],
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        await create_all(client, namespace, names[STORED // 2 :])

        async def all_failed() -> set[str] | None:
            assert process is not None
            assert process.returncode is None, "the dispatcher exited"
            found = await asyncio.to_thread(failed_names, cluster, namespace)
            return found if found == set(names) else None

        await async_wait_until(all_failed, timeout=120, what=f"{STORED} AppWrappers Failed")
        peak = peak_rss_mib(process.pid)
        print(f"dispatcher peak RSS {peak:.0f} MiB for {STORED} AppWrappers of ~1 MB")
        assert peak < PEAK_LIMIT_MIB < DEPLOYMENT_LIMIT_MIB, peak

        messages = await async_wait_until(
            lambda: _all_told(cluster, namespace, names), timeout=30, what="every Event"
        )
        told = re.compile(
            r"(.*; )?the AppWrapper is 1,00[0-9],[0-9]{3} bytes as JSON; at most 524,288 are"
            r" accepted \(the dispatcher's max_appwrapper_bytes\); its largest field is"
            r" spec\.service\.spec\.blob \(1,00[0-9],[0-9]{3} bytes\)"
        )
        for name in names:
            assert told.fullmatch(messages[name]), messages[name]
        # Deleted while the dispatcher runs: it lets them go (nothing was created).
        await for_each(names, lambda name: client.delete(APPWRAPPERS, namespace, name))
        await async_wait_until(
            lambda: _none_left(cluster, namespace), timeout=60, what="the AppWrappers gone"
        )
    finally:
        await client.close()
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
                await process.wait()


async def _none_left(cluster: Any, namespace: str) -> bool:
    out = await cluster.akubectl("get", STORED_VERSION, "-n", namespace, "--no-headers")
    return not out.stdout.strip()


async def _all_told(cluster: Any, namespace: str, names: list[str]) -> dict[str, str] | None:
    found = await asyncio.to_thread(size_events, cluster, namespace)
    return found if set(names) <= set(found) else None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("service", {f"k{i}": i for i in range(9)}, id="service"),
        pytest.param("selector", {f"k{i}": i for i in range(9)}, id="selector"),
    ],
)
async def test_the_crd_bounds_the_breadth_of_legacy_fields(
    cluster, namespace, appwrapper_crd, field, value
):
    obj = appwrapper("wide", deployment("wide", 1, {"cpu": "1"}))
    obj["spec"][field] = value
    out = cluster.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False
    )
    assert out.returncode != 0
    assert f"spec.{field}: Too many: 9: must have at most 8 items" in out.stderr
