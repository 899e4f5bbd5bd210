"""Session-wide test wiring.

Unit tests (tests/unit) need nothing. Tests that talk to Kubernetes use the `cluster`
fixture: one local control plane per session (see testenv), or the cluster
named by APPWRAPPER_KUBECONFIG (e.g. one made with kind). Each test gets its own namespace.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testenv.localcluster import ExistingCluster, LocalCluster


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A tier users consume (`tier(present, why)`: the chart with helm, the web view in
    Chromium, the image) skips on a machine without its tool, but never under CI (`CI` set,
    as .ci/run sets it): there it fails, saying what is missing."""
    for mark in item.iter_markers("tier"):
        present, why = mark.args
        if not present:
            if os.environ.get("CI"):
                pytest.fail(f"{why}; CI runs every tier and never skips one", pytrace=False)
            pytest.skip(why)


@pytest.fixture(scope="session")
def cluster_workdir() -> Iterator[Path]:
    keep = os.environ.get("APPWRAPPER_TEST_WORKDIR")
    if keep:
        # One folder per test process (`make test` runs several, each with its own cluster).
        path = Path(keep) / os.environ.get("PYTEST_XDIST_WORKER", "main")
        path.mkdir(parents=True, exist_ok=True)
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="aw-test-") as tmp:
            yield Path(tmp)


@pytest.fixture(scope="session")
def cluster(cluster_workdir: Path) -> Iterator[LocalCluster | ExistingCluster]:
    existing = os.environ.get("APPWRAPPER_KUBECONFIG")
    if existing:
        yield ExistingCluster("existing", Path(existing))
        return
    # Audited: the leader-election test checks, from the API server's side, whose writes it
    # accepted and when.
    started = LocalCluster.start("hub", cluster_workdir, kuberay=True, audit=True)
    try:
        yield started
    finally:
        started.stop()


def _namespace_for(node_id: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", node_id.split("::")[-1].lower()).strip("-")[:40]
    digest = hashlib.sha1(node_id.encode()).hexdigest()[:6]
    return f"t-{base}-{digest}".replace("--", "-")


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, cluster: LocalCluster | ExistingCluster
) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = _namespace_for(request.node.nodeid)
    cluster.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", timeout=120)
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


class FakeNodes:
    """Creates KWOK nodes for one test and deletes them when it ends."""

    def __init__(self, cluster: LocalCluster | ExistingCluster, prefix: str) -> None:
        self.cluster = cluster
        self.prefix = prefix
        self.names: list[str] = []

    def add(self, suffix: str, *, wait: bool = True, **kwargs: object) -> str:
        name = f"{self.prefix}-{suffix}"[:63]
        labels = dict(kwargs.pop("labels", None) or {})  # type: ignore[call-overload]
        labels["appwrapper.test/pool"] = self.prefix
        self.cluster.add_node(name, labels=labels, **kwargs)
        self.names.append(name)
        if wait:
            self.cluster.wait_nodes_ready([name])
        return name

    @property
    def pool(self) -> dict[str, str]:
        """The label selector matching this test's nodes only."""
        return {"appwrapper.test/pool": self.prefix}

    def delete_all(self) -> None:
        if self.names:
            self.cluster.kubectl("delete", "node", *self.names, "--wait=false", check=False)


@pytest.fixture
def fake_nodes(cluster: LocalCluster | ExistingCluster, namespace: str) -> Iterator[FakeNodes]:
    nodes = FakeNodes(cluster, namespace)
    yield nodes
    nodes.delete_all()
