"""The image (Dockerfile) run as a container against the local control plane.

Needs the image, built by `make image-test` (`make image BASE=local` with buildah: the base
from Debian's packages, testenv/build-base-image.sh), which names it in APPWRAPPER_IMAGE, and
buildah to run it; without either every test here is skipped, or fails under CI (the `tier`
mark, tests/conftest.py). `podman run` cannot run it on a VM that refuses setrlimit (see
manifests/README.md, "The image"); `buildah run --isolation chroot --network host` can, and is
what runs it here: the dispatcher in the container reaches the API server at 127.0.0.1, and the
API server its webhook, as they would over a pod network.

- The image's configuration: entrypoint `appwrapper-dispatcher`, user 65532, no pip.
- The dispatcher in it, with the shipped settings (manifests/config.yaml, but for this
  machine's addresses and this test's node pool) and a kubeconfig of the shipped
  ServiceAccount mounted in, leads, serves its webhook (its CA in both configurations), takes
  the sample job-completion AppWrapper to Completed, and exits 0 on SIGTERM, denied nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.localcluster import LocalCluster, free_port
from testenv.waits import wait_until
from tests.e2e.test_manifests import (
    MANIFESTS,
    SYSTEM_NAMESPACE,
    WEBHOOK_SECRET,
    DispatcherProcess,
    ca_bundles,
    documents,
    http_get,
    port_open,
    register_webhook,
    remove_webhook_objects,
    service_account_kubeconfig,
    settings_text,
)

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("APPWRAPPER_IMAGE", "")
STORAGE_DRIVER = os.environ.get("APPWRAPPER_STORAGE_DRIVER", "vfs")
BUILDAH = shutil.which("buildah")
MOUNT = "/etc/appwrapper"

pytestmark = [
    pytest.mark.tier(
        bool(IMAGE and BUILDAH),
        "no image named (APPWRAPPER_IMAGE) or no buildah: `make image-test` builds it and runs "
        "these",
    ),
]


def buildah(*args: str, timeout: float = 120) -> str:
    argv = [str(BUILDAH), "--storage-driver", STORAGE_DRIVER, *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


@pytest.fixture
def container() -> Iterator[str]:
    """A working container of the image (buildah's), removed afterwards."""
    name = f"aw-image-test-{uuid.uuid4().hex[:6]}"
    buildah("from", "--pull=never", "--name", name, IMAGE)
    try:
        yield name
    finally:
        buildah("rm", name)


def test_image_runs_the_entrypoint_as_65532_without_pip(container: str) -> None:
    config = json.loads(buildah("inspect", "--type", "image", IMAGE))["OCIv1"]
    assert config["config"]["Entrypoint"] == ["appwrapper-dispatcher"]
    assert config["config"]["Cmd"] == ["run"]
    assert config["config"]["User"] == "65532"
    script = "import importlib.util as u; print(u.find_spec('pip') is None, end='')"
    run = ["run", "--isolation", "chroot", container, "--"]
    assert buildah(*run, "python", "-c", script) == "True"
    assert buildah(*run, "id", "-u").strip() == "65532"


def children() -> dict[int, list[int]]:
    """Every process's children, by parent pid (/proc)."""
    tree: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        tree[int(fields[1])].append(int(stat.parent.name))
    return tree


class ContainerProcess(DispatcherProcess):
    """`buildah run` of the image in a child process, its output kept for failures. buildah
    kills the container's command when it is itself signalled, so `terminate` sends SIGTERM
    to that command (the innermost process; chroot isolation shares the host's pid space), as
    the kubelet would to the pod's; `stop` returns buildah's exit code, which is the
    command's."""

    def __init__(self, container: str, volume: Path, argv: list[str], log: Path) -> None:
        super().__init__(
            argv,
            log,
            command=[
                *(str(BUILDAH), "--storage-driver", STORAGE_DRIVER, "run"),
                *("--isolation", "chroot", "--network", "host", "-v", f"{volume}:{MOUNT}:ro"),
                *(container, "--", *argv),
            ],
        )

    def innermost(self) -> list[int]:
        tree, pids, leaves = children(), [self.proc.pid], []
        while pids:
            pid = pids.pop()
            if tree[pid]:
                pids.extend(tree[pid])
            else:
                leaves.append(pid)
        return [pid for pid in leaves if pid != self.proc.pid]

    def terminate(self) -> None:
        for pid in self.innermost():
            os.kill(pid, signal.SIGTERM)


@pytest.fixture
def installed(cluster: Any, quota_crds: None) -> Iterator[None]:
    """The shipped namespace, ServiceAccount, RBAC and status policy; the webhook's objects
    the test makes are deleted afterwards (its configurations are cluster-wide)."""
    cluster.kubectl("apply", "-f", str(MANIFESTS / "namespace.yaml"))
    for name in ("serviceaccount.yaml", "rbac.yaml", "status-policy.yaml"):
        cluster.kubectl("apply", "-f", str(MANIFESTS / name))
    cluster.kubectl(
        "delete", "secret", WEBHOOK_SECRET, "-n", SYSTEM_NAMESPACE, "--ignore-not-found"
    )
    try:
        yield
    finally:
        remove_webhook_objects(cluster)


def mounted_settings(cluster: Any, volume: Path, *, namespace: str, webhook_port: int) -> None:
    """The shipped settings, for this machine's addresses and the node pool `namespace`, and a
    kubeconfig of the shipped ServiceAccount, in `volume`, readable by the image's user."""
    (configmap,) = documents(MANIFESTS / "config.yaml")
    settings = settings_text(configmap)
    settings.update(
        members=[{"name": "local", "node_selector": {"appwrapper.test/pool": namespace}}],
        lease_name=f"test-{namespace}",
    )
    settings["webhook"].update(host="127.0.0.1", port=webhook_port, extra_names=["127.0.0.1"])
    volume.mkdir(mode=0o755)
    (volume / "config.yaml").write_text(yaml.safe_dump(settings))
    service_account_kubeconfig(cluster, volume / "kubeconfig")
    for path in volume.iterdir():
        path.chmod(0o644)


@pytest.mark.cluster
def test_dispatcher_in_the_image_completes_the_sample(
    cluster: Any, installed: None, container: str, tmp_path: Path
) -> None:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("the API server must reach this machine's 127.0.0.1 to call the webhook")
    namespace = f"t-image-{uuid.uuid4().hex[:6]}"
    node = f"{namespace}-node"
    webhook_port, health_port = free_port(), free_port()
    volume = tmp_path / "mounted"
    mounted_settings(cluster, volume, namespace=namespace, webhook_port=webhook_port)
    cluster.kubectl("create", "namespace", namespace)
    register_webhook(cluster, namespace, webhook_port)
    cluster.add_node(node, cpu="2", memory="4Gi", labels={"appwrapper.test/pool": namespace})
    process = ContainerProcess(
        container,
        volume,
        [
            *("appwrapper-dispatcher", "run", "--config", f"{MOUNT}/config.yaml"),
            *("--kubeconfig", f"{MOUNT}/kubeconfig", "--health-port", str(health_port)),
            *("--log-format", "json"),
        ],
        tmp_path / "dispatcher.log",
    )
    try:
        cluster.wait_nodes_ready([node])
        complete_the_sample(cluster, process, namespace=namespace, health_port=health_port)
    except BaseException:
        process.stop()
        print(f"---- dispatcher output ----\n{process.output()}")
        raise
    finally:
        process.stop()
        cluster.kubectl(
            "delete", "lease", f"test-{namespace}", "-n", SYSTEM_NAMESPACE, "--ignore-not-found",
            check=False,
        )  # fmt: skip
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    process.assert_clean_exit("the dispatcher in the image")


def complete_the_sample(
    cluster: Any, process: ContainerProcess, *, namespace: str, health_port: int
) -> None:
    def ready() -> bool:
        assert process.alive(), "the container exited"
        return http_get(f"http://127.0.0.1:{health_port}/readyz")[0] == 200

    wait_until(ready, timeout=90, what="the dispatcher in the image to lead and sync")
    wait_until(lambda: all(ca_bundles(cluster)), timeout=60, what="caBundle in both")
    assert port_open(health_port)
    sample = REPO / "samples" / "job-completion.yaml"
    # The first create may come before the registration is seen: try again.
    wait_until(
        lambda: (
            cluster.kubectl("apply", "-n", namespace, "-f", str(sample), check=False).returncode
            == 0
        ),
        timeout=30,
        what="the sample applied through the webhook",
    )
    cluster.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=condition=Completed",
        "appwrapper/job-completion",
        "--timeout=120s",
        timeout=140,
    )
    # While the dispatcher still runs, so that it removes its finalizer.
    cluster.kubectl(
        "delete", "appwrapper", "job-completion", "-n", namespace, "--timeout=60s", timeout=90
    )
