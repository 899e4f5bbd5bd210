"""The production manifests (manifests/) against a real API server.

- They are valid: a server-side dry run of `kubectl apply -k manifests/` and of the plain
  `kubectl apply -f crds/ -f manifests/` accepts every object.
- The RBAC is least privilege: the dispatcher's ServiceAccount may do what the code does
  and is denied what it must never do (`kubectl auth can-i`), and every kind in the default
  allow-list is covered (SubjectAccessReview, which also works for kinds whose CRD is not
  installed here).
- The RBAC is sufficient: the real dispatcher, run as that ServiceAccount with the shipped
  settings file, takes an AppWrapper to Running, holds its Lease, and removes its finalizer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.core.validation import DEFAULT_ALLOWED_KINDS
from dispatcher.testing.localcluster import free_port
from dispatcher.testing.waits import wait_until

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
SYSTEM_NAMESPACE = "appwrapper-system"
SERVICE_ACCOUNT = "appwrapper-dispatcher"
SA_USER = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{SERVICE_ACCOUNT}"
SA_GROUPS = [
    "system:serviceaccounts",
    f"system:serviceaccounts:{SYSTEM_NAMESPACE}",
    "system:authenticated",
]
SOME_NAMESPACE = "some-team"

# Kinds whose completion is read from a label-selected watch (list + watch granted).
COMPLETION_KINDS = ("jobs", "rayjobs", "pytorchjobs")

# Where each kind of the default allow-list lives: (API group, plural) pairs.
WRAPPED_KINDS: dict[str, list[tuple[str, str]]] = {
    "ConfigMap": [("", "configmaps")],
    "Deployment": [("apps", "deployments")],
    "Ingress": [("networking.k8s.io", "ingresses")],
    "Job": [("batch", "jobs")],
    "NetworkPolicy": [("networking.k8s.io", "networkpolicies")],
    "PersistentVolumeClaim": [("", "persistentvolumeclaims")],
    "Pod": [("", "pods")],
    "PodGroup": [("scheduling.sigs.k8s.io", "podgroups"), ("scheduling.x-k8s.io", "podgroups")],
    "PyTorchJob": [("kubeflow.org", "pytorchjobs")],
    "RayCluster": [("ray.io", "rayclusters")],
    "RayJob": [("ray.io", "rayjobs")],
    "RayService": [("ray.io", "rayservices")],
    "ReplicaSet": [("apps", "replicasets")],
    "Route": [("route.openshift.io", "routes")],
    "Secret": [("", "secrets")],
    "Service": [("", "services")],
    "ServiceAccount": [("", "serviceaccounts")],
    "StatefulSet": [("apps", "statefulsets")],
}


@pytest.fixture(scope="module")
def installed(cluster: Any, quota_crds: None) -> None:
    """The CRDs, the namespace, the ServiceAccount and the RBAC, applied for real (kubectl
    auth can-i names the quota kinds by resource: their CRDs must be served)."""
    cluster.kubectl("apply", "-f", str(MANIFESTS / "namespace.yaml"))
    cluster.kubectl(
        "apply",
        "-f",
        str(MANIFESTS / "serviceaccount.yaml"),
        "-f",
        str(MANIFESTS / "rbac.yaml"),
    )


# -- (a) the manifests are accepted by the API server ------------------------------------


def test_manifests_apply_with_server_side_dry_run(cluster: Any, installed: None) -> None:
    crd = cluster.kubectl("apply", "--dry-run=server", "-f", str(REPO / "crds" / "appwrapper.yaml"))
    assert "appwrappers.workload.codeflare.dev" in crd.stdout

    kustomized = cluster.kubectl("apply", "--dry-run=server", "-k", str(MANIFESTS))
    for name in (
        "namespace/appwrapper-system",
        "serviceaccount/appwrapper-dispatcher",
        "clusterrole.rbac.authorization.k8s.io/appwrapper-dispatcher",
        "clusterrolebinding.rbac.authorization.k8s.io/appwrapper-dispatcher",
        "role.rbac.authorization.k8s.io/appwrapper-dispatcher-leader-election",
        "rolebinding.rbac.authorization.k8s.io/appwrapper-dispatcher-leader-election",
        "configmap/appwrapper-dispatcher-config",
        "deployment.apps/appwrapper-dispatcher",
        "service/appwrapper-dispatcher-metrics",
    ):
        assert name in kustomized.stdout, kustomized.stdout

    # The plain-YAML route reads the same files; the kustomization file must not get in its
    # way (kubectl apply -f DIR reads only *.yaml, *.yml and *.json).
    plain = cluster.kubectl(
        "apply", "--dry-run=server", "-f", str(REPO / "crds"), "-f", str(MANIFESTS)
    )
    assert "deployment.apps/appwrapper-dispatcher" in plain.stdout


def test_shipped_settings_file_loads() -> None:
    from dispatcher.config import Config

    configmap = yaml.safe_load((MANIFESTS / "config.yaml").read_text())
    config = Config.model_validate(yaml.safe_load(configmap["data"]["config.yaml"]))
    assert config.leader_election
    assert config.lease_namespace == SYSTEM_NAMESPACE
    assert config.health_port == 8081
    assert sorted(config.allowed_kinds) == sorted(DEFAULT_ALLOWED_KINDS)

    deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == config.health_port
    service = yaml.safe_load((MANIFESTS / "service.yaml").read_text())
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


# -- (b) least privilege ----------------------------------------------------------------


def can_i(cluster: Any, *args: str) -> bool:
    result = cluster.kubectl("auth", "can-i", f"--as={SA_USER}", *args, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), (result.stdout, result.stderr)
    return result.returncode == 0 and answer == "yes"


ALLOWED = [
    pytest.param(["list", "appwrappers.workload.codeflare.dev", "-A"], id="list-appwrappers"),
    pytest.param(["watch", "appwrappers.workload.codeflare.dev", "-A"], id="watch-appwrappers"),
    pytest.param(
        ["patch", "appwrappers.workload.codeflare.dev", "-n", SOME_NAMESPACE],
        id="patch-appwrappers-finalizer",
    ),
    pytest.param(
        ["update", "appwrappers.workload.codeflare.dev", "--subresource=status", "-A"],
        id="update-appwrappers-status",
    ),
    pytest.param(
        ["update", "appwrappers.workload.codeflare.dev", "--subresource=finalizers", "-A"],
        id="update-appwrappers-finalizers",
    ),
    pytest.param(["create", "deployments.apps", "-n", SOME_NAMESPACE], id="create-deployments"),
    pytest.param(["delete", "rayclusters.ray.io", "-n", SOME_NAMESPACE], id="delete-rayclusters"),
    pytest.param(["get", "jobs.batch", "-n", SOME_NAMESPACE], id="get-jobs"),
    pytest.param(["create", "events", "-n", SOME_NAMESPACE], id="create-events"),
    pytest.param(["watch", "pods", "-A"], id="watch-pods"),
    pytest.param(["watch", "nodes"], id="watch-nodes"),
    pytest.param(["list", "priorityclasses.scheduling.k8s.io"], id="list-priorityclasses"),
    pytest.param(["watch", "clusterappqueues.workload.codeflare.dev"], id="watch-queues"),
    pytest.param(["watch", "appqueues.workload.codeflare.dev", "-A"], id="watch-appqueues"),
    pytest.param(
        ["patch", "clusterappqueues.workload.codeflare.dev", "--subresource=status"],
        id="patch-queue-status",
    ),
    pytest.param(["watch", "namespaces"], id="watch-namespace-labels"),
    pytest.param(
        ["update", "leases.coordination.k8s.io", "-n", SYSTEM_NAMESPACE], id="update-own-lease"
    ),
    pytest.param(
        ["create", "leases.coordination.k8s.io", "-n", SYSTEM_NAMESPACE], id="create-own-lease"
    ),
]

DENIED = [
    pytest.param(["create", "clusterroles"], id="create-clusterroles"),
    pytest.param(["bind", "clusterroles"], id="bind-clusterroles"),
    pytest.param(["escalate", "clusterroles"], id="escalate-clusterroles"),
    pytest.param(["create", "clusterrolebindings"], id="create-clusterrolebindings"),
    pytest.param(["create", "roles", "-n", SOME_NAMESPACE], id="create-roles"),
    pytest.param(["create", "rolebindings", "-n", SOME_NAMESPACE], id="create-rolebindings"),
    pytest.param(
        ["create", "mutatingwebhookconfigurations"], id="create-mutatingwebhookconfigurations"
    ),
    pytest.param(["create", "customresourcedefinitions"], id="create-crds"),
    pytest.param(["update", "clusterappqueues.workload.codeflare.dev"], id="change-queue-specs"),
    pytest.param(["create", "appqueues.workload.codeflare.dev", "-A"], id="create-appqueues"),
    pytest.param(["delete", "namespaces"], id="delete-namespaces"),
    pytest.param(["update", "nodes"], id="update-nodes"),
    pytest.param(["delete", "nodes"], id="delete-nodes"),
    pytest.param(["impersonate", "users"], id="impersonate"),
    pytest.param(["create", "pods", "--subresource=exec", "-n", SOME_NAMESPACE], id="exec-pods"),
    pytest.param(
        ["create", "serviceaccounts", "--subresource=token", "-n", SOME_NAMESPACE],
        id="mint-tokens",
    ),
    pytest.param(["list", "secrets", "-A"], id="list-secrets"),
    pytest.param(["update", "deployments.apps", "-n", SOME_NAMESPACE], id="update-deployments"),
    pytest.param(
        ["create", "appwrappers.workload.codeflare.dev", "-n", SOME_NAMESPACE],
        id="create-appwrappers",
    ),
    pytest.param(
        ["delete", "appwrappers.workload.codeflare.dev", "-n", SOME_NAMESPACE],
        id="delete-appwrappers",
    ),
    pytest.param(["update", "leases.coordination.k8s.io", "-n", "kube-system"], id="other-leases"),
]


@pytest.mark.parametrize("request_", ALLOWED)
def test_service_account_may(cluster: Any, installed: None, request_: list[str]) -> None:
    assert can_i(cluster, *request_), f"the dispatcher must be allowed to: {' '.join(request_)}"


@pytest.mark.parametrize("request_", DENIED)
def test_service_account_may_not(cluster: Any, installed: None, request_: list[str]) -> None:
    assert not can_i(cluster, *request_), f"the dispatcher must not be able to: {request_}"


def json_stream(text: str) -> list[dict[str, Any]]:
    """Concatenated JSON documents (what `kubectl create -o json` prints for several
    objects), or one List of them."""
    decoder = json.JSONDecoder()
    documents: list[dict[str, Any]] = []
    index = 0
    while index < len(text.rstrip()):
        document, index = decoder.raw_decode(text, index)
        documents.append(document)
        while index < len(text) and text[index].isspace():
            index += 1
    if len(documents) == 1 and documents[0].get("kind") == "List":
        return list(documents[0]["items"])
    return documents


def access_reviews(cluster: Any, checks: list[tuple[str, str, str]], namespace: str) -> list[bool]:
    """SubjectAccessReviews for the ServiceAccount, one per (verb, group, resource), sent in
    one kubectl call. Unlike `kubectl auth can-i` they need no discovery, so they also answer
    for kinds whose CRD this cluster lacks (Route, PodGroup, PyTorchJob)."""
    reviews = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": SA_USER,
                    "groups": SA_GROUPS,
                    "resourceAttributes": {
                        "verb": verb,
                        "group": group,
                        "resource": resource,
                        "namespace": namespace,
                    },
                },
            }
            for verb, group, resource in checks
        ],
    }
    out = cluster.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(reviews))
    items = json_stream(out.stdout)
    assert len(items) == len(checks)
    for item, (verb, group, resource) in zip(items, checks, strict=True):
        attributes = item["spec"]["resourceAttributes"]
        assert (attributes["verb"], attributes.get("group", ""), attributes["resource"]) == (
            verb,
            group,
            resource,
        )
    return [bool(item["status"].get("allowed")) for item in items]


def test_every_default_allowed_kind_is_granted_and_nothing_more(
    cluster: Any, installed: None
) -> None:
    # A kind added to the default allow-list needs a rule in manifests/rbac.yaml (and here).
    assert set(WRAPPED_KINDS) == set(DEFAULT_ALLOWED_KINDS)
    used = ("get", "create", "delete")
    unused = ("update", "patch", "list", "watch", "deletecollection")
    checks = [
        (verb, group, resource)
        for places in WRAPPED_KINDS.values()
        for group, resource in places
        for verb in (*used, *unused)
    ]
    answers = access_reviews(cluster, checks, SOME_NAMESPACE)
    missing = [
        f"{verb} {resource}.{group or 'core'}"
        for (verb, group, resource), allowed in zip(checks, answers, strict=True)
        if verb in used and not allowed
    ]
    excess = [
        f"{verb} {resource}.{group or 'core'}"
        for (verb, group, resource), allowed in zip(checks, answers, strict=True)
        if verb in unused
        and allowed
        and not (verb in ("list", "watch") and resource in ("pods", *COMPLETION_KINDS))
    ]
    watched = [
        f"{verb} {resource}"
        for (verb, _group, resource), allowed in zip(checks, answers, strict=True)
        if verb in ("list", "watch") and resource in COMPLETION_KINDS and not allowed
    ]
    assert not watched, f"completion kinds must be watchable: {watched}"
    assert not missing, f"not granted: {missing}"
    assert not excess, f"granted but never used: {excess}"


# -- (c) the real dispatcher runs with exactly these permissions ---------------------------


def service_account_kubeconfig(cluster: Any, path: Path) -> Path:
    """A kubeconfig for the same server that authenticates as the dispatcher's ServiceAccount."""
    token = cluster.kubectl(
        "create", "token", SERVICE_ACCOUNT, "-n", SYSTEM_NAMESPACE, "--duration=1h"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    current = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    server = next(c for c in admin["clusters"] if c["name"] == current["context"]["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hub", "cluster": server["cluster"]}],
        "users": [{"name": SERVICE_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": SERVICE_ACCOUNT}}],
        "current-context": "hub",
    }
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    return path


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


class DispatcherProcess:
    """`python -m dispatcher run` in a child process; its output is kept for failures."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher", *argv],
            cwd=REPO,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if not self._out.closed:
            self._out.close()
        return self.proc.returncode


@pytest.fixture
def scratch_namespace(cluster: Any) -> Iterator[str]:
    name = f"t-manifests-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def test_dispatcher_runs_as_the_service_account(
    cluster: Any, installed: None, scratch_namespace: str, tmp_path: Path
) -> None:
    namespace = scratch_namespace
    node = f"{namespace}-node"
    pool = {"appwrapper.test/pool": namespace}
    lease = f"test-{namespace}"
    port = free_port()

    # The shipped settings, with this test's node pool and its own Lease.
    configmap = yaml.safe_load((MANIFESTS / "config.yaml").read_text())
    settings = yaml.safe_load(configmap["data"]["config.yaml"])
    settings.update(members=[{"name": "local", "node_selector": pool}], lease_name=lease)
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    kubeconfig = service_account_kubeconfig(cluster, tmp_path / "sa-kubeconfig")

    cluster.add_node(node, cpu="2", memory="4Gi", labels=pool)
    process = DispatcherProcess(
        [
            "run",
            "--config",
            str(config_file),
            "--kubeconfig",
            str(kubeconfig),
            "--health-port",
            str(port),
            "--log-format",
            "json",
        ],
        tmp_path / "dispatcher.log",
    )
    try:
        cluster.wait_nodes_ready([node])
        run_appwrapper(cluster, process, namespace, port, lease)
    except BaseException:
        process.stop()
        print(f"---- dispatcher output ----\n{process.output()}")
        raise
    finally:
        code = process.stop()
        cluster.kubectl(
            "delete", "lease", lease, "-n", SYSTEM_NAMESPACE, "--ignore-not-found", check=False
        )
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
    output = process.output()
    if code != 0 or "forbidden" in output.lower():
        print(f"---- dispatcher output (exit {code}) ----\n{output}")
    assert code == 0, f"the dispatcher exited with {code}"
    # A denied request would be logged with the server's "forbidden"; there must be none.
    assert "forbidden" not in output.lower(), "the dispatcher was denied a request"


def run_appwrapper(
    cluster: Any, process: DispatcherProcess, namespace: str, port: int, lease: str
) -> None:
    def ready() -> bool:
        assert process.alive(), "the dispatcher exited"
        return http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200

    wait_until(ready, timeout=60, what="the dispatcher to lead and sync its caches")

    holder = cluster.kubectl(
        "get", "lease", lease, "-n", SYSTEM_NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}"
    ).stdout
    assert holder, "the Lease names no holder"

    name = "web"
    appwrapper = {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "resources": {
                "GenericItems": [
                    {
                        "generictemplate": {
                            "apiVersion": "apps/v1",
                            "kind": "Deployment",
                            "metadata": {"name": name},
                            "spec": {
                                "replicas": 1,
                                "selector": {"matchLabels": {"app": name}},
                                "template": {
                                    "metadata": {"labels": {"app": name}},
                                    "spec": {
                                        "containers": [
                                            {
                                                "name": "c",
                                                "image": "busybox",
                                                "resources": {"requests": {"cpu": "100m"}},
                                            }
                                        ]
                                    },
                                },
                            },
                        }
                    }
                ]
            }
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(appwrapper))
    try:
        cluster.kubectl(
            "wait",
            "-n",
            namespace,
            "--for=condition=Running",
            f"appwrapper/{name}",
            "--timeout=90s",
            timeout=110,
        )
        aw = json.loads(
            cluster.kubectl("get", "appwrapper", name, "-n", namespace, "-o", "json").stdout
        )
        assert aw["metadata"]["finalizers"] == ["workload.codeflare.dev/finalizer"]
        cluster.kubectl("get", "deployment", name, "-n", namespace)
        events = cluster.kubectl(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            f"involvedObject.name={name}",
            "-o",
            "jsonpath={.items[*].reason}",
        ).stdout
        assert events, "no Events were recorded on the AppWrapper"

        status, metrics = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert "appwrapper_dispatcher_cycles_total" in metrics
    finally:
        # While the dispatcher still runs, so that it removes the wrapped objects and its
        # finalizer (that needs `patch appwrappers` and `delete deployments`).
        cluster.kubectl(
            "delete",
            "appwrapper",
            name,
            "-n",
            namespace,
            "--timeout=60s",
            check=False,
            timeout=90,
        )
    wait_until(
        lambda: (
            "NotFound"
            in cluster.kubectl("get", "deployment", name, "-n", namespace, check=False).stderr
        ),
        timeout=30,
        what="the wrapped Deployment to be deleted",
    )
    gone = cluster.kubectl("get", "appwrapper", name, "-n", namespace, check=False)
    assert gone.returncode != 0, "the AppWrapper is still there: its finalizer was not removed"
    assert "NotFound" in gone.stderr, gone.stderr
