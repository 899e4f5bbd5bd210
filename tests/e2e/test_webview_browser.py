"""The web view in a real browser: Debian's headless Chromium opens it through `kubectl
proxy` against the local control plane, and what it shows is read from its DOM.

Skips where /usr/bin/chromium is absent, and fails there under CI (`make test-deps`, which
.ci/run calls, and `make browser-test` install Debian's package). The screenshot it takes is
docs/images/webview.png when APPWRAPPER_SCREENSHOT names that path.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dispatcher.controller.visibility.api import BASE
from testenv.localcluster import free_port
from testenv.manifests import app_flavor, app_queue, cluster_queue
from testenv.waits import async_wait_until
from tests.e2e.conftest import StartDispatcher, apply, appwrapper, wait_condition
from tests.e2e.test_visibility import pod, start_visible, unregister

CHROMIUM = Path("/usr/bin/chromium")
# The flags that work on these machines: no sandbox as root, and nothing that phones home.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.tier(CHROMIUM.exists(), "no /usr/bin/chromium: make browser-test installs it"),
]


async def chromium(url: str, *extra: str) -> str:
    with tempfile.TemporaryDirectory(prefix="aw-chromium-") as profile:
        process = await asyncio.create_subprocess_exec(
            str(CHROMIUM),
            *FLAGS,
            f"--user-data-dir={profile}",
            *extra,
            url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(process.communicate(), timeout=90)
    return out.decode()


async def test_web_view_in_chromium(
    cluster: Any, namespace: str, fake_nodes: Any, quotas: None, run_dispatcher: StartDispatcher
) -> None:
    fake_nodes.add("n", cpu="8")
    cq = f"{namespace}-gpu-team"
    cluster.apply(app_flavor("default-flavor"))
    cluster.apply(cluster_queue(cq, {"default-flavor": {"cpu": 4}}))
    await apply(cluster, namespace, app_queue("team", cq))
    await start_visible(cluster, namespace, run_dispatcher)
    port = free_port()
    proxy = await asyncio.create_subprocess_exec(
        str(cluster.kubectl_path),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "proxy",
        f"--port={port}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        limit = {"dispatchDuration": {"limit": 1800}}
        await apply(
            cluster,
            namespace,
            appwrapper("train-1", pod("train-1", "3"), queue="team", scheduling=limit),
        )
        await wait_condition(cluster, namespace, "train-1", "Dispatched")
        for name in ("train-2", "eval-3"):
            await apply(cluster, namespace, appwrapper(name, pod(name, "2"), queue="team"))
        url = f"http://127.0.0.1:{port}{BASE}/views/queues"

        async def shown() -> str | None:
            dom = await chromium(url, "--dump-dom")
            return dom if f"{namespace}/eval-3" in dom else None

        dom = await async_wait_until(shown, timeout=60, what="the pending list in the browser")
        assert f'<h2 class="queue">{cq}</h2>' in dom
        assert "3 of 4" in dom  # the usage bar's label: 3 cpu used of 4
        assert f"after {namespace}/train-1 ends, at the latest" in dom
        assert dom.index(f"{namespace}/train-2") < dom.index(f"{namespace}/eval-3")
        screenshot = Path(
            os.environ.get("APPWRAPPER_SCREENSHOT")
            or Path(tempfile.gettempdir()) / "aw-webview.png"
        )
        await chromium(url, f"--screenshot={screenshot}", "--window-size=1400,700")
        assert os.stat(screenshot).st_size > 1000  # an image, not an error page
        page = await chromium(
            f"http://127.0.0.1:{port}{BASE}/namespaces/{namespace}/views/train-2", "--dump-dom"
        )
        assert "Timeline" in page
        assert "position 1 overall" in page
        assert "QuotaExceeded" in page
    finally:
        proxy.terminate()
        await proxy.wait()
        unregister(cluster)
