"""Fixtures for dispatcher tests against the real control plane.

`run_dispatcher` starts the dispatcher in this event loop, counting only the test's own fake
nodes (a node pool selected by label), and removes the test's AppWrappers before stopping it
so no finalizer is left behind.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from dispatcher.app import running
from dispatcher.config import Config, MemberConfig
from dispatcher.controller.manager import Manager
from testenv.converter import Converter, crd_calling
from testenv.manifests import appwrapper, deployment, job, pod_template, service
from testenv.waits import wait_until

# The builders live in testenv.manifests (the benchmarks use them too); the tests
# import them from here with the other e2e helpers.
__all__ = ["appwrapper", "deployment", "job", "pod_template", "service"]

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "appwrapper.yaml"
QUOTA_CRDS = REPO / "crds" / "queues.yaml"
QUOTA_KINDS = "clusterappqueues,appcohorts,appflavors"


def wait_established(cluster: Any, crd: str) -> None:
    """Until the API server serves the CRD named `crd`."""
    wait_until(
        lambda: (
            "True"
            in cluster.kubectl(
                "get",
                "crd",
                crd,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Established')].status}",
                check=False,
            ).stdout
        ),
        timeout=60,
        what=f"CRD {crd} established",
    )


@pytest.fixture(scope="session")
def converter() -> Iterator[Converter]:
    """The conversion endpoint for the session: the CRD serves v1beta2, its preferred
    version, so every `kubectl get aw` converts (testenv/converter.py)."""
    running_converter = Converter()
    running_converter.start()
    yield running_converter
    running_converter.stop()


def apply_crd(cluster: Any, crd: dict[str, Any]) -> None:
    """Apply or, where its conversion was written another way (a URL over a Service),
    replace the AppWrapper CRD; then until kubectl's discovery shows the versions it serves."""
    text = json.dumps(crd)
    if cluster.kubectl("apply", "-f", "-", input=text, check=False).returncode != 0:
        cluster.kubectl("replace", "-f", "-", input=text)
    wait_established(cluster, "appwrappers.workload.codeflare.dev")
    served = {f"{crd['spec']['group']}/{v['name']}" for v in crd["spec"]["versions"] if v["served"]}
    wait_discovered(cluster, crd["spec"]["group"], served)


def wait_discovered(cluster: Any, group: str, versions: set[str]) -> None:
    """Until discovery lists exactly `versions` of `group`. kubectl caches discovery for
    6 hours and asks again only for a kind it does not know (docs/api.md, "Who serves
    v1beta2"): where a test changes the versions the CRD serves, a later `kubectl get aw`
    would go on asking for the old preferred one. `kubectl api-versions` reads discovery
    afresh and writes what it read to that cache."""

    def listed() -> bool:
        out = cluster.kubectl("api-versions", check=False).stdout.split()
        return {v for v in out if v.startswith(f"{group}/")} == versions

    wait_until(listed, timeout=60, what=f"discovery to list {sorted(versions)}")


@pytest.fixture(scope="session")
def appwrapper_crd(cluster: Any, converter: Converter) -> None:
    apply_crd(cluster, crd_calling(CRD, converter.url, converter.ca_bundle))


@pytest.fixture(scope="session")
def quota_crds(cluster: Any, appwrapper_crd: None) -> None:
    cluster.kubectl("apply", "-f", str(QUOTA_CRDS))
    for plural in ("clusterappqueues", "appqueues", "appcohorts", "appflavors"):
        wait_established(cluster, f"{plural}.workload.codeflare.dev")


@pytest.fixture
def quotas(cluster: Any, quota_crds: None) -> Iterator[None]:
    """The quota kinds installed; the test's cluster-scoped quota objects removed after it
    (tests run one at a time: no other test's are there)."""
    yield
    cluster.kubectl("delete", QUOTA_KINDS, "--all", "--wait=false", check=False)
    # The dispatcher is stopped by now: its finalizer on the queues is nobody's to remove.
    names = cluster.kubectl("get", "clusterappqueues", "-o", "name", check=False).stdout.split()
    for name in names:
        cluster.kubectl(
            "patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False
        )


StartDispatcher = Callable[..., Awaitable[Manager]]


def dispatcher_config(cluster: Any, fake_nodes: Any, **overrides: Any) -> Config:
    """The settings `run_dispatcher` starts with: this test's node pool, no health port."""
    settings: dict[str, Any] = {
        "kubeconfig": str(cluster.kubeconfig),
        "members": [MemberConfig(name="local", node_selector=fake_nodes.pool)],
        "health_port": 0,
        "requeue_pause_seconds": 0.5,
        "log_level": "warning",
        # Most tests run without the admission webhook (it is cluster-wide): their
        # AppWrappers carry no signed creator record. tests/e2e/test_security.py runs it.
        "unattributed": "allow",
    }
    settings.update(overrides)
    return Config(**settings)


# How long a negative check ("nothing was preempted", "still pending") is held, sampled
# every fraction of a second: many scheduling cycles (each change wakes one, and a waiting
# AppWrapper is looked at again within a second or two), so a wrong decision would show.
QUIET_SECONDS = 4.0


@pytest_asyncio.fixture
async def run_dispatcher(
    cluster: Any, namespace: str, fake_nodes: Any, appwrapper_crd: None
) -> AsyncIterator[StartDispatcher]:
    stack = AsyncExitStack()
    started: list[Manager] = []
    current: list[AsyncExitStack] = []

    async def start(*, restart: bool = False, **overrides: Any) -> Manager:
        """Start a dispatcher; with restart=True, stop the running one first."""
        if restart:
            while current:
                await current.pop().aclose()
        own = AsyncExitStack()
        config = dispatcher_config(cluster, fake_nodes, **overrides)
        dispatcher = await own.enter_async_context(running(config))
        current.append(own)
        stack.push_async_callback(own.aclose)
        started.append(dispatcher)
        return dispatcher

    try:
        yield start
    finally:
        if started and not current:
            await start()  # someone must remove the finalizers
        if started:
            await cluster.akubectl(
                "delete",
                "appwrappers",
                "--all",
                "-n",
                namespace,
                "--timeout=60s",
                check=False,
                timeout=90,
            )
        await stack.aclose()


def load_sample(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((REPO / "samples" / name).read_text()))


async def apply(cluster: Any, namespace: str, obj: dict[str, Any] | str) -> None:
    text = obj if isinstance(obj, str) else json.dumps(obj)
    await cluster.akubectl("apply", "-n", namespace, "-f", "-", input=text)


V1BETA1_RESOURCE = "appwrappers.v1beta1.workload.codeflare.dev"
"""AppWrappers as v1beta1 by name: `kubectl get aw` asks for v1beta2, the preferred version."""


async def get_aw(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """The AppWrapper as v1beta1, the version the dispatcher reads and these tests write."""
    out = await cluster.akubectl("get", V1BETA1_RESOURCE, name, "-n", namespace, "-o", "json")
    return dict(json.loads(out.stdout))


async def conditions(cluster: Any, namespace: str, name: str) -> dict[str, str]:
    aw = await get_aw(cluster, namespace, name)
    return {c["type"]: c["status"] for c in (aw.get("status") or {}).get("conditions", [])}


async def wait_condition(
    cluster: Any, namespace: str, name: str, condition: str, timeout: int = 60
) -> None:
    """The way users wait: `kubectl wait --for=condition=X aw/NAME`."""
    await cluster.akubectl(
        "wait",
        "-n",
        namespace,
        f"--for=condition={condition}",
        f"appwrapper/{name}",
        f"--timeout={timeout}s",
        timeout=timeout + 15,
    )


async def pods_of(cluster: Any, namespace: str, appwrapper: str) -> list[dict[str, Any]]:
    out = await cluster.akubectl(
        "get",
        "pods",
        "-n",
        namespace,
        "-o",
        "json",
        "-l",
        f"workload.codeflare.dev/appwrapper={appwrapper}",
    )
    return list(json.loads(out.stdout)["items"])
