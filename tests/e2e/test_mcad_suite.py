"""A fast part of MCAD v1.40.0's own e2e suite, run against the dispatcher by `make test`.

The whole suite runs with `make conformance` (about 35 minutes; docs/mcad-compatibility.md).
These tests of it take seconds each and do not depend on the sizes of MCAD's CI nodes: they
keep labels, completion, RunningHoldCompletion and the CRD's refusals as MCAD's users know them.
The suite's binary is built from the Go module proxy into the cache directory on first use.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from benchmarks.conformance import build, run_one
from testenv.localcluster import DEFAULT_CACHE

pytestmark = [pytest.mark.cluster]

FAST = [
    "Create AppWrapper - Generic Deployment Only - 3 pods",
    "Create AppWrapper  - Generic Pod Only - 1 Pod",
    "Create AppWrapper  - Bad Generic PodTemplate Only",
    "Create AppWrapper  - Bad Generic Item Only",
    "MCAD Job Completion Test",
    "MCAD Multi-Item Job Completion Test",
    "MCAD Deployment RunningHoldCompletion Test",
    "MCAD Service no RunningHoldCompletion or Complete Test",
]


@pytest.fixture(scope="session")
def mcad_suite() -> tuple[Path, Path]:
    source, binary, _ = build(DEFAULT_CACHE, controller_too=False)
    return source, binary


@pytest.mark.parametrize("name", FAST)
async def test_mcad_suite(cluster, fake_nodes, run_dispatcher, mcad_suite, tmp_path, name):
    source, binary = mcad_suite
    fake_nodes.add("n1", cpu="8", memory="32Gi", gpu=8)
    await run_dispatcher()
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    shutil.copy(cluster.kubeconfig, home / ".kube" / "config")  # where the suite looks
    log = tmp_path / "suite.log"
    try:
        # In a thread: the dispatcher runs in this event loop while the suite waits on it.
        outcome = await asyncio.to_thread(run_one, binary, source, home, name, 240, log)
        assert outcome.result == "pass", (outcome, log.read_text()[-3000:])
    finally:
        # The suite works in namespace `test`; the dispatcher (still running) lets go.
        await cluster.akubectl(
            "delete", "appwrappers", "--all", "-n", "test", "--timeout=60s", check=False, timeout=90
        )
