"""The commands the docs give a user, run as written against the local control plane, read
from the Markdown itself (testenv/docblocks.py), so that the docs cannot drift from
what works.

Every command of every `sh` block in DOC_FILES is accounted for here: run (the sections in
RUN_SECTIONS), run with `--dry-run=server` added (DRY_RUN: the API server checks it without
it taking effect), or not run, with the reason (NOT_RUN). A command the docs gain or change
fails `test_every_documented_command_is_accounted_for` until it is placed in one of them.

The user's machine is imitated: HOME is a temporary directory whose `.kube/config` is the
test cluster's kubeconfig (so `~/.kube/config` in a command is the test's cluster), KUBECONFIG
points at it too, the cluster's kubectl and the checkout's `.venv/bin` come first on PATH,
and the commands run from the checkout's root, each in its own `bash -c`. A command that
starts the dispatcher runs in the background, as a user runs it in another terminal; it is
stopped with SIGINT (Ctrl-C), as the user stops it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from dispatcher.core.gatekeeping import SIGNATURE, USER
from dispatcher.devmode import (
    DEV_NAME,
    INSTALLED_NAME,
    SECRET_NAMESPACE,
    free_loopback_port,
    probe_loopback,
)
from dispatcher.kube.client import KubeClient
from testenv.converter import Converter, crd_calling
from testenv.docblocks import Block, blocks, without_comment
from testenv.localcluster import LocalCluster
from testenv.waits import async_wait_until
from tests.e2e.conftest import CRD, apply_crd

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
DOC_FILES += ["manifests/README.md", "charts/appwrapper-dispatcher/README.md"]

README_TRIAL = ("README.md", "Using an existing cluster instead of the local control plane")
OPERATIONS_TRIAL = ("docs/operations.md", "Two ways to run it")
INSTALL = ("manifests/README.md", "Install")
RUN_SECTIONS = [README_TRIAL, OPERATIONS_TRIAL, INSTALL]
"""(file, heading): the sections whose commands run here, in the order they stand (but
those in NOT_RUN, and those in DRY_RUN as dry runs)."""

NO_IMAGE = (
    "the manifests' image (appwrapper-dispatcher:latest) is built by nobody here and cannot "
    "be pulled: the API server checks every object (--dry-run=server) instead of an install"
)
CONVERTING = (
    "kubectl patch crd appwrappers.workload.codeflare.dev --type=json "
    "--patch-file manifests/crd-patches/conversion.json"
)
DRY_RUN = {
    "kubectl apply -k manifests/": NO_IMAGE,
    "kubectl apply -f crds/ -f manifests/": NO_IMAGE,
    CONVERTING: "the conversion through the manifests' Service, which no dispatcher answers "
    "here (NO_IMAGE): other tests would read no v1beta2; the API server checks the patch",
}
NEEDS_INSTALL = "needs the dispatcher installed by the manifests, which cannot run here (image)"
PLACEHOLDER = "names placeholders (NS, NAME) for the reader to fill in"
NOT_RUN = {
    "make demo": "the demo starts a control plane of its own, for minutes (make demo)",
    "kubectl api-resources --api-group=workload.codeflare.dev": "after an uninstall; run as "
    "written, where the chart's NOTES print it, by tests/e2e/test_chart_install.py",
    "kubectl patch crd appwrappers.workload.codeflare.dev --type=json "
    "--patch-file manifests/crd-patches/readable.json": "after an uninstall; the same patch, "
    "as the chart's NOTES print it, runs after `helm uninstall` in "
    "tests/e2e/test_chart_install.py, and tests/unit/test_devmode_crd.py proves the file "
    "makes the converting CRD readable",
    "make test": "the whole suite; this test is part of it",
    "make image IMAGE=registry.example.com/appwrapper-dispatcher:0.1.0": "the base image's "
    "registry is out of the test machine's reach: make image-test builds the image on a base "
    "from Debian's packages and runs it (tests/e2e/test_image.py)",
    "docker push registry.example.com/appwrapper-dispatcher:0.1.0": "no registry to push to",
    "helm install appwrapper-dispatcher charts/appwrapper-dispatcher   --namespace "
    "appwrapper-system --create-namespace --set "
    "image.repository=registry.example.com/appwrapper-dispatcher --set image.tag=0.1.0": "helm "
    "is a tool users run, built and used by make chart-test, whose tests/e2e/test_chart_install.py "
    "installs the chart this way (replicas 0: no image can be pulled here)",
    "cd /etc/kubernetes/pki": "kubeadm's control-plane node only; the local control plane "
    "makes the same client certificate itself (testenv/pki.py)",
    "openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=webhook-client-ca "
    "-keyout webhook-client-ca.key -out webhook-client-ca.crt": "kubeadm's node (above)",
    "openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver-webhook-client "
    "-keyout webhook-client.key -out webhook-client.csr": "kubeadm's node (above)",
    "printf 'extendedKeyUsage=clientAuth\\n' > client.ext": "kubeadm's node (above)",
    "openssl x509 -req -in webhook-client.csr -CA webhook-client-ca.crt -CAkey "
    "webhook-client-ca.key -CAcreateserial -days 365 -extfile client.ext "
    "-out webhook-client.crt": "kubeadm's node (above)",
    "kubectl get aw -n NS": PLACEHOLDER,
    "kubectl describe aw NAME -n NS": PLACEHOLDER,
    'kubectl patch aw NAME -n NS --type=merge -p \'{"metadata":{"finalizers":null}}\'': (
        PLACEHOLDER
    ),
    "kubectl get all,cm,secret,pvc -n NS -l workload.codeflare.dev/appwrapper=NAME": PLACEHOLDER,
    "kubectl -n appwrapper-system get pods": NEEDS_INSTALL,
    "kubectl -n appwrapper-system get lease appwrapper-dispatcher "
    "-o jsonpath='{.spec.holderIdentity}{\"\\n\"}'": NEEDS_INSTALL,
    "kubectl -n appwrapper-system logs deploy/appwrapper-dispatcher | grep -E "
    "'leader_elected|caches_synced'": NEEDS_INSTALL,
    "kubectl get validatingwebhookconfiguration appwrapper-dispatcher "
    "-o jsonpath='{.webhooks[0].clientConfig.caBundle}' | head -c 40; echo": NEEDS_INSTALL,
    "kubectl apply -f samples/service-deployment.yaml && kubectl get aw -w": NEEDS_INSTALL,
    "kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration "
    "appwrapper-dispatcher": "the outage procedure: removes an installed dispatcher's webhook",
    "kubectl -n team-a create rolebinding alice-appwrappers --clusterrole=appwrapper-user "
    "--user=alice": "binds roles of an install (tests/e2e/test_user_roles.py binds them)",
    "kubectl create clusterrolebinding platform-quotas --clusterrole=appwrapper-admin "
    "--group=platform-team": "binds roles of an install (tests/e2e/test_user_roles.py)",
}

pytestmark = [pytest.mark.cluster]


def documented() -> list[Block]:
    return [b for path in DOC_FILES for b in blocks((REPO / path).read_text(), path=path)]


def section(path: str, heading: str) -> list[str]:
    """The commands (comments taken off) of the shell blocks under `heading` in `path`."""
    found = [b for b in documented() if b.path == path and heading in b.sections]
    assert found, f"{path} has no shell block under {heading!r}"
    return [without_comment(c) for b in found for c in b.commands]


def test_every_documented_command_is_accounted_for() -> None:
    run = {c for path, heading in RUN_SECTIONS for c in section(path, heading)}
    unplaced = []
    seen = set()
    for block in documented():
        for command in block.commands:
            bare = without_comment(command)
            seen.add(bare)
            if bare not in run and bare not in NOT_RUN and not block.note.startswith("not run"):
                unplaced.append(f"{block.where()}: {bare}")
    assert unplaced == [], "commands in the docs that this test neither runs nor lists"
    assert sorted(set(NOT_RUN) - seen) == [], "NOT_RUN lists commands the docs no longer give"
    assert sorted(set(DRY_RUN) - run) == [], "DRY_RUN lists commands no run section gives"


# -- the user's machine ---------------------------------------------------------------


@dataclass
class Shell:
    """Runs documented commands as a user's shell would, on the test's cluster."""

    cluster: Any
    home: Path
    env: dict[str, str]
    background: list[tuple[str, asyncio.subprocess.Process, Path]] = field(default_factory=list)

    async def run(self, command: str, *, timeout: float = 180) -> str:
        """`command` in bash from the checkout's root; its output. Fails the test with the
        output when it exits non-zero."""
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=REPO, env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        text = out.decode(errors="replace")
        assert proc.returncode == 0, f"$ {command}\n{text}"
        return text

    async def start(self, command: str) -> Path:
        """`command` in the background (in its own process group); the file of its output,
        once the dispatcher it starts is serving (its caches synced)."""
        log = self.home / f"run-{len(self.background)}.log"
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", command, cwd=REPO, env=self.env, start_new_session=True,
            stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        self.background.append((command, proc, log))

        async def serving() -> bool:
            if proc.returncode is not None:
                pytest.fail(f"$ {command}\nexited {proc.returncode}:\n{log.read_text()}")
            return "caches_synced" in log.read_text()

        await async_wait_until(serving, timeout=60, what=f"{command} serving")
        return log

    async def stop(self, *, timeout: float = 30) -> tuple[int, str]:
        """Ctrl-C to the last command started in the background: its exit code and output."""
        _, proc, log = self.background.pop()
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), timeout)
        return code, log.read_text()


@pytest_asyncio.fixture
async def shell(cluster: Any, tmp_path: Path, converter: Converter) -> AsyncIterator[Shell]:
    """A user's shell on the test's cluster. The commands may apply crds/ as written (the
    CRD's conversion then calls the in-cluster Service): the session's CRD, converted by the
    session's converter, is put back after them."""
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    kubeconfig = home / ".kube" / "config"
    shutil.copy(cluster.kubeconfig, kubeconfig)
    kubectl = shutil.which(str(cluster.kubectl_path))
    assert kubectl, f"no kubectl at {cluster.kubectl_path}"
    path = os.pathsep.join(
        [str(Path(kubectl).parent), str(Path(sys.executable).parent), os.environ["PATH"]]
    )
    env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(kubeconfig), "PATH": path}
    env["PYTHONUNBUFFERED"] = "1"
    user = Shell(cluster, home, env)
    try:
        yield user
    finally:
        while user.background:
            await user.stop()
        cluster.kubectl(
            "delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", DEV_NAME,
            "--ignore-not-found", check=False,
        )  # fmt: skip
        apply_crd(cluster, crd_calling(CRD, converter.url, converter.ca_bundle))
        cluster.kubectl(
            "delete", "secret", DEV_NAME, "-n", SECRET_NAMESPACE, "--ignore-not-found", check=False
        )


def is_dispatcher(command: str) -> bool:
    return "appwrapper-dispatcher run" in command


def reaches_loopback(cluster: Any) -> bool:
    """Whether the cluster's API server runs on this machine (and so calls 127.0.0.1 here):
    the local control plane does; a cluster given by APPWRAPPER_KUBECONFIG is taken to be
    kind's or a remote one."""
    return isinstance(cluster, LocalCluster)


async def dev_configurations(cluster: Any) -> list[str]:
    out = await cluster.akubectl(
        "get", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
        "-o", "name", "--field-selector", f"metadata.name={DEV_NAME}",
    )  # fmt: skip
    return sorted(out.stdout.split())


async def test_readme_trial_on_an_existing_cluster(
    shell: Shell, cluster: Any, fake_nodes: Any
) -> None:
    """README.md: the CRDs, `run --dev` in the background, the sample, `kubectl wait` for it
    Completed; then Ctrl-C, and the webhook configurations are gone, and AppWrappers (and a
    namespace holding one) can be listed, described and deleted with no dispatcher."""
    fake_nodes.add("n1")  # the existing cluster's node, for the sample's pods
    commands = section(*README_TRIAL)
    assert sum(map(is_dispatcher, commands)) == 1, commands
    assert any(c.startswith("kubectl wait --for=condition=Completed") for c in commands)
    log = ""
    try:
        for command in commands:
            if is_dispatcher(command):
                log = (await shell.start(command)).read_text()
            else:
                await shell.run(command)
        aw = json.loads(await shell.run("kubectl get aw job-completion -o json"))
        assert aw["status"]["state"] == "Completed"
        annotations = aw["metadata"].get("annotations") or {}
        if reaches_loopback(cluster):
            assert f"ValidatingWebhookConfiguration {DEV_NAME} (failurePolicy: Fail)" in log, log
            assert "NO ADMISSION WEBHOOK" not in log
            assert USER in annotations, annotations
            assert SIGNATURE in annotations, annotations
        else:
            assert "NO ADMISSION WEBHOOK" in log, log
            assert "unattributed: allow" in log, log
            assert USER not in annotations
    finally:
        # As the uninstall says: AppWrappers go while the dispatcher runs (its finalizer).
        await cluster.akubectl(
            "delete", "aw", "job-completion", "-n", "default", "--ignore-not-found",
            "--timeout=60s", check=False,
        )  # fmt: skip
    code, log = await shell.stop()
    assert code == 0, log
    if reaches_loopback(cluster):
        assert f"removed the webhook configurations {DEV_NAME} and the Secret" in log
    assert await dev_configurations(cluster) == []
    secret = await cluster.akubectl(
        "get", "secret", DEV_NAME, "-n", SECRET_NAMESPACE, "--ignore-not-found", "-o", "name"
    )
    assert secret.stdout.strip() == ""
    # No dispatcher answers now: the CRD is readable (before, it converted through a Service
    # never installed and every `kubectl get aw` failed), with the same kubectl, whose cached
    # discovery knew the v1beta2 the run served; and a namespace holding an AppWrapper that
    # no dispatcher saw is deleted (it hung on the conversion).
    crd = json.loads(await shell.run("kubectl get crd appwrappers.workload.codeflare.dev -o json"))
    assert crd["spec"]["conversion"] == {"strategy": "None"}
    if reaches_loopback(cluster):
        assert "removed kubectl's cached discovery" in log, log
    await shell.run("kubectl create namespace after-dev")
    await shell.run("kubectl apply -n after-dev -f samples/job-completion.yaml")
    assert "job-completion" in await shell.run("kubectl get aw -n after-dev")
    assert "job-completion" in await shell.run("kubectl describe aw job-completion -n after-dev")
    await shell.run("kubectl delete aw job-completion -n after-dev")
    await shell.run("kubectl apply -n after-dev -f samples/job-completion.yaml")
    await shell.run("kubectl delete namespace after-dev --timeout=60s")


async def test_operations_trial_starts_and_stops_clean(shell: Shell, cluster: Any) -> None:
    """docs/operations.md's trial (the installed command, on PATH): it serves, then Ctrl-C
    ends it with exit code 0 and nothing of it registered."""
    commands = section(*OPERATIONS_TRIAL)
    assert [c for c in commands if is_dispatcher(c)] == [
        "appwrapper-dispatcher run --dev --kubeconfig ~/.kube/config"
    ]
    for command in commands:
        if is_dispatcher(command):
            await shell.start(command)
            if reaches_loopback(cluster):
                assert await dev_configurations(cluster) == [
                    f"mutatingwebhookconfiguration.admissionregistration.k8s.io/{DEV_NAME}",
                    f"validatingwebhookconfiguration.admissionregistration.k8s.io/{DEV_NAME}",
                ]
        else:
            await shell.run(command)
    code, log = await shell.stop()
    assert code == 0, log
    assert await dev_configurations(cluster) == []


async def test_dev_refuses_a_cluster_with_a_dispatcher_installed(
    shell: Shell, cluster: Any
) -> None:
    """--dev on a cluster where the manifests' webhook configuration exists: exit code 3,
    nothing registered. (The configuration made here has no webhooks: it calls nobody.)"""
    cluster.apply(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": INSTALLED_NAME},
            "webhooks": [],
        }
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", "appwrapper-dispatcher run --dev --kubeconfig ~/.kube/config",
            cwd=REPO, env=shell.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", INSTALLED_NAME, check=False)
    text = out.decode()
    assert proc.returncode == 3, text
    assert f"refusing to start: MutatingWebhookConfiguration {INSTALLED_NAME} exists" in text
    assert await dev_configurations(cluster) == []


def manifests_install() -> Iterator[tuple[str, str]]:
    """manifests/README.md's Install commands that run here, each with what is run."""
    for command in section(*INSTALL):
        if command in NOT_RUN:
            continue
        yield command, f"{command} --dry-run=server" if command in DRY_RUN else command


async def test_manifests_install_commands(shell: Shell) -> None:
    """manifests/README.md's Install, as far as it can go here: the CRDs and the namespace
    for real, the rest checked by the API server (--dry-run=server): see NO_IMAGE."""
    ran = list(manifests_install())
    assert [c for c, _ in ran] == [
        "kubectl apply -f crds/",
        "kubectl apply -k manifests/",
        CONVERTING,
        "kubectl apply -f manifests/namespace.yaml",
        "kubectl apply -f crds/ -f manifests/",
    ]
    # The kustomization's objects live in appwrapper-system, which a dry run does not make:
    # the plain route's first command (the namespace, for real) goes first here.
    first = ran.pop(3)
    outputs = {}
    for command, as_run in [first, *ran]:
        outputs[command] = await shell.run(as_run)
    for command in set(DRY_RUN) - {CONVERTING}:
        assert "deployment.apps/appwrapper-dispatcher" in outputs[command], outputs[command]
        assert "(server dry run)" in outputs[command]
    # kubectl patch says no "(server dry run)"; the CRD as applied shows nothing was changed.
    assert "appwrappers.workload.codeflare.dev patched" in outputs[CONVERTING]
    served = await shell.run(
        "kubectl get crd appwrappers.workload.codeflare.dev -o "
        "jsonpath='{.spec.conversion.strategy} {.spec.versions[1].served}'"
    )
    assert served == "None false", served
    assert (
        "customresourcedefinition.apiextensions.k8s.io/appwrappers.workload.codeflare.dev"
        in (outputs["kubectl apply -f crds/"])
    )


@pytest.mark.parametrize(
    ("listen_on", "want_reached"),
    [
        pytest.param("127.0.0.1", True, id="api-server-on-this-machine"),
        # 127.0.0.2 is this machine too, but not the address the probe sends the API server
        # to: a connection there is refused, as it is inside kind's container.
        pytest.param("127.0.0.2", False, id="api-server-elsewhere"),
    ],
)
async def test_dev_probe_tells_whether_the_api_server_reaches_this_machine(
    cluster: Any, listen_on: str, want_reached: bool
) -> None:
    if not reaches_loopback(cluster):
        pytest.skip("the API server of this cluster runs elsewhere: both would be unreached")
    client = await KubeClient.connect(kubeconfig=str(cluster.kubeconfig), name="probe-test")
    try:
        probe = await probe_loopback(client, free_loopback_port(), listen_on=listen_on, seconds=2)
    finally:
        await client.close()
    assert probe.reached is want_reached
    assert probe.problem == (
        "" if want_reached else f"no call reached 127.0.0.1:{probe.port} within 2s"
    )
    leftover = await cluster.akubectl(
        "get", "validatingwebhookconfiguration", f"{DEV_NAME}-probe", "--ignore-not-found",
        "-o", "name",
    )  # fmt: skip
    assert leftover.stdout.strip() == ""
