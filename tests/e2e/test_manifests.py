"""The production manifests (manifests/) against a real API server.

- They are valid: a server-side dry run of `kubectl apply -k manifests/` and of the plain
  `kubectl apply -f crds/ -f manifests/` accepts every object, and so does the base with the
  cert-manager component (but for cert-manager's own kinds, not installed here).
- They agree with each other: the webhook Service selects the Deployment's pods and targets
  its named port; the webhook configurations call the two paths, for the spec only (not the
  status subresource); the names in the settings, the objects and the RBAC are the same.
- The RBAC is least privilege: the dispatcher's ServiceAccount may do what the code does
  and is denied what it must never do (`kubectl auth can-i`): no Secret but its own, no
  webhook configuration but its two, no wildcard; every kind in the default allow-list is
  covered (SubjectAccessReview, which also works for kinds whose CRD is not installed here).
- The RBAC is sufficient: the real dispatcher, run as that ServiceAccount with the shipped
  settings file, takes an AppWrapper to Running, holds its Lease, and removes its finalizer;
  with its webhook registered, it also keeps its certificate Secret and writes the caBundle.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher import cli
from dispatcher.config import Config
from dispatcher.core.quota.kueue import KUEUE_WEBHOOK
from dispatcher.core.validation import DEFAULT_ALLOWED_KINDS
from testenv.localcluster import LocalCluster, free_port
from testenv.waits import wait_until

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
WEBHOOK_CONFIGURATION = "appwrapper-dispatcher"
WEBHOOK_SECRET = "appwrapper-dispatcher-webhook"
WEBHOOK_PATHS = {
    "MutatingWebhookConfiguration": "/mutate-appwrapper",
    "ValidatingWebhookConfiguration": "/validate-appwrapper",
}

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
    "Service": [("", "services")],
    "ServiceAccount": [("", "serviceaccounts")],
    "StatefulSet": [("apps", "statefulsets")],
}


def documents(path: Path) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML file."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def settings_text(configmap: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(configmap["data"]["config.yaml"])
    return loaded


def shipped_settings() -> Config:
    (configmap,) = documents(MANIFESTS / "config.yaml")
    return Config.model_validate(settings_text(configmap))


def dispatcher_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "dispatcher"
    ]
    return dict(container)


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
        "role.rbac.authorization.k8s.io/appwrapper-dispatcher-webhook",
        "rolebinding.rbac.authorization.k8s.io/appwrapper-dispatcher-webhook",
        "clusterrole.rbac.authorization.k8s.io/appwrapper-user",
        "clusterrole.rbac.authorization.k8s.io/appwrapper-admin",
        "clusterrole.rbac.authorization.k8s.io/appwrapper-viewer",
        "configmap/appwrapper-dispatcher-config",
        "deployment.apps/appwrapper-dispatcher",
        "poddisruptionbudget.policy/appwrapper-dispatcher",
        "service/appwrapper-dispatcher-metrics",
        "clusterrole.rbac.authorization.k8s.io/appwrapper-dispatcher-metrics-reader",
        "service/appwrapper-dispatcher-webhook",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/appwrapper-dispatcher",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/appwrapper-dispatcher",
        "validatingadmissionpolicy.admissionregistration.k8s.io/appwrapper-status-writers",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/appwrapper-status-writers",
    ):
        assert name in kustomized.stdout, kustomized.stdout

    # The plain-YAML route reads the same files; the kustomization file must not get in its
    # way (kubectl apply -f DIR reads only *.yaml, *.yml and *.json).
    plain = cluster.kubectl(
        "apply", "--dry-run=server", "-f", str(REPO / "crds"), "-f", str(MANIFESTS)
    )
    assert "deployment.apps/appwrapper-dispatcher" in plain.stdout
    assert "mutatingwebhookconfiguration.admissionregistration.k8s.io/appwrapper-dispatcher" in (
        plain.stdout
    )


def test_shipped_settings_file_loads() -> None:
    config = shipped_settings()
    assert config.leader_election
    assert config.lease_namespace == SYSTEM_NAMESPACE
    assert config.health_port == 8081
    assert sorted(config.allowed_kinds) == sorted(DEFAULT_ALLOWED_KINDS)
    # The webhook on, and everything else about it at the names the other manifests use.
    assert config.webhook.enabled
    assert config.webhook.cert_dir is None  # the dispatcher makes its own certificate
    assert config.webhook.namespace == SYSTEM_NAMESPACE
    assert config.webhook.secret_name == WEBHOOK_SECRET
    assert config.webhook.service_name == "appwrapper-dispatcher-webhook"
    assert config.webhook.mutating_configuration == WEBHOOK_CONFIGURATION
    assert config.webhook.validating_configuration == WEBHOOK_CONFIGURATION
    assert config.unattributed == "refuse"
    assert config.check_at_dispatch
    # The new settings the file spells out are their defaults.
    defaults = Config()
    assert config.priority_policy == defaults.priority_policy
    assert config.debug_memory is defaults.debug_memory is False
    assert config.allow_exec_kubeconfigs is defaults.allow_exec_kubeconfigs is False
    assert config.provisioning == defaults.provisioning  # admission checks off

    deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    ports = {p["name"]: p["containerPort"] for p in dispatcher_container(deployment)["ports"]}
    assert ports == {"http": config.health_port, "webhook": config.webhook.port}
    assert config.webhook.port == 9443
    service = yaml.safe_load((MANIFESTS / "service.yaml").read_text())
    assert [p["name"] for p in service["spec"]["ports"]] == ["metrics"]


def test_webhook_manifests_agree_with_the_deployment_and_the_settings() -> None:
    config = shipped_settings()
    docs = documents(MANIFESTS / "webhook.yaml")
    assert sorted(d["kind"] for d in docs) == [
        "MutatingWebhookConfiguration",
        "Service",
        "ValidatingWebhookConfiguration",
    ]

    # The Service: every replica's pods (the leader and the standby), port 443 to the named
    # container port.
    deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one(docs, "Service", config.webhook.service_name)
    assert service["metadata"]["namespace"] == config.webhook.namespace
    selector = service["spec"]["selector"]
    assert selector
    assert selector.items() <= pod_labels.items()
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443
    assert port["targetPort"] == "webhook"
    assert "webhook" in {p["name"] for p in dispatcher_container(deployment)["ports"]}
    assert deployment["spec"]["replicas"] >= 2

    for kind, path in WEBHOOK_PATHS.items():
        configuration = one(docs, kind, WEBHOOK_CONFIGURATION)
        (webhook,) = configuration["webhooks"]
        where = f"{kind} {webhook['name']}"
        assert webhook["name"].endswith(".appwrappers.workload.codeflare.dev"), where
        client = webhook["clientConfig"]
        assert "caBundle" not in client, f"{where}: the dispatcher writes the caBundle"
        assert "url" not in client, where
        assert client["service"] == {
            "namespace": config.webhook.namespace,
            "name": config.webhook.service_name,
            "path": path,
            "port": port["port"],
        }, where
        (rule,) = webhook["rules"]
        assert rule["apiGroups"] == ["workload.codeflare.dev"], where
        assert rule["apiVersions"] == ["v1beta1"], where
        # The spec only: neither the status subresource (status-policy.yaml's) nor a
        # wildcard that would take it in.
        assert rule["resources"] == ["appwrappers"], where
        assert not any("/" in r or "*" in r for r in rule["resources"]), where
        assert sorted(rule["operations"]) == ["CREATE", "UPDATE"], where
        assert webhook["failurePolicy"] == "Fail", where
        assert webhook["sideEffects"] == "None", where
        assert webhook["admissionReviewVersions"] == ["v1"], where
        assert webhook["timeoutSeconds"] == 10, where
        assert webhook["matchPolicy"] == "Equivalent", where
        # No way around it by labels.
        assert "namespaceSelector" not in webhook, where
        assert "objectSelector" not in webhook, where
    (mutating,) = one(docs, "MutatingWebhookConfiguration", WEBHOOK_CONFIGURATION)["webhooks"]
    assert mutating["reinvocationPolicy"] == "IfNeeded"


def test_cert_manager_component(cluster: Any, installed: None, tmp_path: Path) -> None:
    # Used the way manifests/README.md says: an overlay of the base with the component.
    base_path = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [base_path],
                "components": [f"{base_path}/cert-manager"],
            }
        )
    )
    built = cluster.kubectl("kustomize", str(tmp_path)).stdout
    docs = [d for d in yaml.safe_load_all(built) if d]
    base = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(MANIFESTS)).stdout) if d]
    cert_manager = [d for d in docs if d["apiVersion"].startswith("cert-manager.io/")]
    assert sorted(d["kind"] for d in cert_manager) == ["Certificate", "Issuer"]
    # Everything else is the base, patched.
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs if d not in cert_manager) == (
        sorted((d["kind"], d["metadata"]["name"]) for d in base)
    )

    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config = Config.model_validate(settings_text(configmap))
    # The base's settings, with the certificate's directory given on the command line.
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = dispatcher_container(deployment)["args"]
    parsed = cli.parser().parse_args(args)
    cert_dir = parsed.webhook_cert_dir
    assert cert_dir, "the component must give --webhook-cert-dir"
    assert str(parsed.config) == "/etc/appwrapper-dispatcher/config.yaml"
    (base_deployment,) = [d for d in base if d["kind"] == "Deployment"]
    base_args = dispatcher_container(base_deployment)["args"]
    assert args[: len(base_args)] == base_args

    certificate = one(cert_manager, "Certificate", "appwrapper-dispatcher-webhook")
    issuer = one(cert_manager, "Issuer", certificate["spec"]["issuerRef"]["name"])
    assert certificate["spec"]["issuerRef"]["kind"] == "Issuer"
    assert "selfSigned" in issuer["spec"]
    assert issuer["metadata"]["namespace"] == certificate["metadata"]["namespace"]
    service = f"{config.webhook.service_name}.{config.webhook.namespace}.svc"
    assert service in certificate["spec"]["dnsNames"]
    secret_name = certificate["spec"]["secretName"]
    # Not the dispatcher's own Secret (which keeps the key that signs creator records).
    assert secret_name != config.webhook.secret_name

    # The Secret cert-manager keeps is mounted where cert_dir points.
    volumes = {
        v["name"]: v["secret"]["secretName"]
        for v in deployment["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    mounts = {m["mountPath"]: m["name"] for m in dispatcher_container(deployment)["volumeMounts"]}
    assert volumes.get(mounts.get(cert_dir, "")) == secret_name, (volumes, mounts)

    # cert-manager's CA injector fills caBundle of both configurations.
    inject = f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}"
    for kind in WEBHOOK_PATHS:
        configuration = one(docs, kind, WEBHOOK_CONFIGURATION)
        annotations = configuration["metadata"].get("annotations") or {}
        assert annotations.get("cert-manager.io/inject-ca-from") == inject, kind

    # The rest is accepted by the API server (cert-manager's kinds are not installed here).
    others = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [d for d in docs if d not in cert_manager],
    }
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(others))


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
    pytest.param(["create", "deployments.apps", "-n", SOME_NAMESPACE], id="create-deployments"),
    pytest.param(["delete", "rayclusters.ray.io", "-n", SOME_NAMESPACE], id="delete-rayclusters"),
    pytest.param(["get", "jobs.batch", "-n", SOME_NAMESPACE], id="get-jobs"),
    pytest.param(["create", "events", "-n", SOME_NAMESPACE], id="create-events"),
    pytest.param(["patch", "events", "-n", SOME_NAMESPACE], id="patch-events"),
    pytest.param(["watch", "pods", "-A"], id="watch-pods"),
    pytest.param(["watch", "nodes"], id="watch-nodes"),
    pytest.param(["list", "priorityclasses.scheduling.k8s.io"], id="list-priorityclasses"),
    pytest.param(["get", "priorityclasses.scheduling.k8s.io/high"], id="get-priorityclass-by-name"),
    pytest.param(["watch", "clusterappqueues.workload.codeflare.dev"], id="watch-queues"),
    pytest.param(["watch", "appqueues.workload.codeflare.dev", "-A"], id="watch-appqueues"),
    pytest.param(
        ["patch", "clusterappqueues.workload.codeflare.dev", "--subresource=status"],
        id="patch-queue-status",
    ),
    pytest.param(["watch", "namespaces"], id="watch-namespace-labels"),
    pytest.param(
        [
            "get",
            "customresourcedefinitions.apiextensions.k8s.io/appwrappers.workload.codeflare.dev",
        ],
        id="get-appwrapper-crd",
    ),
    # The caBundle of its conversion webhook (/convert), as for its webhook configurations.
    pytest.param(
        [
            "update",
            "customresourcedefinitions.apiextensions.k8s.io/appwrappers.workload.codeflare.dev",
        ],
        id="update-appwrapper-crd",
    ),
    pytest.param(
        ["update", "leases.coordination.k8s.io", "-n", SYSTEM_NAMESPACE], id="update-own-lease"
    ),
    pytest.param(
        ["create", "leases.coordination.k8s.io", "-n", SYSTEM_NAMESPACE], id="create-own-lease"
    ),
    # The admission webhook: who may create what, its own certificate Secret, its caBundle.
    pytest.param(
        ["create", "subjectaccessreviews.authorization.k8s.io"], id="create-subjectaccessreviews"
    ),
    # /metrics with metrics.auth: kubernetes: whose token a scrape carries.
    pytest.param(["create", "tokenreviews.authentication.k8s.io"], id="create-tokenreviews"),
    pytest.param(["create", "secrets", "-n", SYSTEM_NAMESPACE], id="create-webhook-secret"),
    pytest.param(
        ["watch", f"secrets/{WEBHOOK_SECRET}", "-n", SYSTEM_NAMESPACE], id="watch-webhook-secret"
    ),
    pytest.param(
        ["get", f"secrets/{WEBHOOK_SECRET}", "-n", SYSTEM_NAMESPACE], id="get-webhook-secret"
    ),
    pytest.param(
        ["update", f"secrets/{WEBHOOK_SECRET}", "-n", SYSTEM_NAMESPACE],
        id="update-webhook-secret",
    ),
    *(
        pytest.param(
            [verb, f"{resource}.admissionregistration.k8s.io/{WEBHOOK_CONFIGURATION}"],
            id=f"{verb}-own-{resource}",
        )
        for resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
        for verb in ("get", "patch", "update")
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
    # The AppWrapper CRD is read by name at start; no other CRD, and no list.
    pytest.param(["list", "customresourcedefinitions"], id="list-crds"),
    pytest.param(
        [
            "get",
            "customresourcedefinitions.apiextensions.k8s.io/clusterappqueues.workload.codeflare.dev",
        ],
        id="get-another-crd",
    ),
    pytest.param(
        [
            "update",
            "customresourcedefinitions.apiextensions.k8s.io/clusterappqueues.workload.codeflare.dev",
        ],
        id="update-another-crd",
    ),
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
    # No Secret but its own: not in a user's namespace, not another one in its own.
    pytest.param(["get", "secrets", "-n", SOME_NAMESPACE], id="get-secrets"),
    pytest.param(["get", "secrets/db-password", "-n", SOME_NAMESPACE], id="get-a-secret"),
    pytest.param(["create", "secrets", "-n", SOME_NAMESPACE], id="create-secrets"),
    pytest.param(["delete", "secrets", "-n", SOME_NAMESPACE], id="delete-secrets"),
    pytest.param(["list", "secrets", "-n", SYSTEM_NAMESPACE], id="list-own-namespace-secrets"),
    pytest.param(
        ["get", "secrets/other", "-n", SYSTEM_NAMESPACE], id="get-another-own-namespace-secret"
    ),
    pytest.param(
        ["delete", f"secrets/{WEBHOOK_SECRET}", "-n", SYSTEM_NAMESPACE],
        id="delete-webhook-secret",
    ),
    # Its two webhook configurations and no other.
    *(
        pytest.param(
            [verb, f"{resource}.admissionregistration.k8s.io/{name}"],
            id=f"{verb}-{name}-{resource}",
        )
        for resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
        for verb, name in (
            ("patch", "other-webhook"),
            ("update", "other-webhook"),
            ("get", "other-webhook"),
            ("delete", WEBHOOK_CONFIGURATION),
        )
    ),
    pytest.param(
        ["list", "validatingwebhookconfigurations.admissionregistration.k8s.io"],
        id="list-validatingwebhookconfigurations",
    ),
    pytest.param(
        ["create", "validatingwebhookconfigurations.admissionregistration.k8s.io"],
        id="create-validatingwebhookconfigurations",
    ),
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
    # list and watch: a label-selected watch tells when one completes or is deleted.
    used = ("get", "list", "watch", "create", "delete")
    unused = ("update", "patch", "deletecollection")
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
        if verb in unused and allowed
    ]
    assert not missing, f"not granted: {missing}"
    assert not excess, f"granted but never used: {excess}"


def test_no_verb_on_secrets_outside_its_own(cluster: Any, installed: None) -> None:
    verbs = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
    answers = access_reviews(cluster, [(verb, "", "secrets") for verb in verbs], SOME_NAMESPACE)
    granted = [verb for verb, allowed in zip(verbs, answers, strict=True) if allowed]
    assert not granted, f"the dispatcher may {granted} Secrets in a user's namespace"


def test_rbac_has_no_secrets_rule_and_no_wildcards() -> None:
    """What `kubectl auth can-i` cannot enumerate: no rule anywhere is broader than named."""
    docs = documents(MANIFESTS / "rbac.yaml")
    roles = [d for d in docs if d["kind"] in ("ClusterRole", "Role")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            where = f"{role['kind']} {role['metadata']['name']}: {rule}"
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert not any("*" in value for value in rule.get(field, [])), where

    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    for rule in cluster_role["rules"]:
        resources = {r.split("/")[0] for r in rule["resources"]}
        assert not ("" in rule["apiGroups"] and "secrets" in resources), rule
        if "mutatingwebhookconfigurations" in resources or (
            "validatingwebhookconfigurations" in resources
        ):
            # Ours to keep; Kueue's only looked at (kueue_quotas: does Kueue itself run?).
            kueue = rule["resourceNames"] == [KUEUE_WEBHOOK] and rule["verbs"] == ["get"]
            assert rule["resourceNames"] == [WEBHOOK_CONFIGURATION] or kueue, rule

    for role in (d for d in docs if d["kind"] == "Role"):
        assert role["metadata"]["namespace"] == SYSTEM_NAMESPACE, role["metadata"]
    webhook_role = one(docs, "Role", "appwrapper-dispatcher-webhook")
    secrets = {
        (tuple(rule.get("resourceNames", ())), tuple(sorted(rule["verbs"])))
        for rule in webhook_role["rules"]
        if rule["resources"] == ["secrets"]
    }
    # create cannot be limited by name; get, update, list and watch (a fieldSelector on the
    # name: its key taken up at once when it changes) are, to the dispatcher's own Secret.
    assert secrets == {
        ((), ("create",)),
        ((WEBHOOK_SECRET,), ("get", "list", "update", "watch")),
    }
    binding = one(docs, "RoleBinding", "appwrapper-dispatcher-webhook")
    assert binding["roleRef"]["name"] == "appwrapper-dispatcher-webhook"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE}
    ]


# -- (c) the real dispatcher runs with exactly these permissions ---------------------------


def service_account_kubeconfig(
    cluster: Any,
    path: Path,
    *,
    namespace: str = SYSTEM_NAMESPACE,
    account: str = SERVICE_ACCOUNT,
) -> Path:
    """A kubeconfig for the same server that authenticates as ServiceAccount `account` of
    `namespace` (the dispatcher's, unless told otherwise)."""
    token = cluster.kubectl(
        "create", "token", account, "-n", namespace, "--duration=1h"
    ).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    current = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    server = next(c for c in admin["clusters"] if c["name"] == current["context"]["cluster"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hub", "cluster": server["cluster"]}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": account}}],
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


def remove_webhook_objects(cluster: Any) -> None:
    """What a test of the shipped webhook made: the status policy, both configurations (they
    are cluster-wide) and the webhook's Secret."""
    cluster.kubectl("delete", "-f", str(MANIFESTS / "status-policy.yaml"), check=False)
    for kind in WEBHOOK_PATHS:
        cluster.kubectl(
            "delete", kind.lower(), WEBHOOK_CONFIGURATION, "--ignore-not-found", check=False
        )
    cluster.kubectl(
        "delete", "secret", WEBHOOK_SECRET, "-n", SYSTEM_NAMESPACE, "--ignore-not-found",
        check=False,
    )  # fmt: skip


class DispatcherProcess:
    """`python -m dispatcher` with `argv` in a child process (or `command`, which runs it
    otherwise); its output is kept for failures."""

    def __init__(self, argv: list[str], log: Path, *, command: list[str] | None = None) -> None:
        self.log = log
        self._out = log.open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBECONFIG", None)
        self.proc = subprocess.Popen(
            command or [sys.executable, "-m", "dispatcher", *argv],
            cwd=REPO,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def terminate(self) -> None:
        """SIGTERM, as the kubelet stops a pod."""
        self.proc.terminate()

    def assert_clean_exit(self, what: str = "the dispatcher", *, its_rights: bool = True) -> None:
        """Stopped (if it was not), it exited 0 and, where it ran with the rights it is given
        (`its_rights`), was denied no request: a denied request is logged with the server's
        "forbidden", and there must be none. Its output is printed where not."""
        code = self.stop()
        output = self.output()
        if code != 0 or "forbidden" in output.lower():
            print(f"---- {what} output (exit {code}) ----\n{output}")
        assert code == 0, f"{what} exited with {code}"
        if its_rights:
            assert "forbidden" not in output.lower(), f"{what} was denied a request"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.alive():
            self.terminate()
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


@dataclass(frozen=True)
class Running:
    process: DispatcherProcess
    namespace: str
    health_port: int
    lease: str


@contextlib.contextmanager
def dispatcher_as_service_account(
    cluster: Any, namespace: str, tmp_path: Path, **overrides: Any
) -> Iterator[Running]:
    """The real dispatcher, authenticated as the ServiceAccount, with the shipped settings
    file but for this test's node pool, its own Lease and `overrides`. On leaving the block
    it must exit 0, and no request of its may have been denied."""
    node = f"{namespace}-node"
    pool = {"appwrapper.test/pool": namespace}
    lease = f"test-{namespace}"
    port = free_port()

    (configmap,) = documents(MANIFESTS / "config.yaml")
    settings = settings_text(configmap)
    settings.update(members=[{"name": "local", "node_selector": pool}], lease_name=lease)
    settings.update(overrides)
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
        yield Running(process, namespace, port, lease)
    except BaseException:
        process.stop()
        print(f"---- dispatcher output ----\n{process.output()}")
        raise
    finally:
        process.stop()
        cluster.kubectl(
            "delete", "lease", lease, "-n", SYSTEM_NAMESPACE, "--ignore-not-found", check=False
        )
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
    process.assert_clean_exit()


def test_dispatcher_runs_as_the_service_account(
    cluster: Any, installed: None, scratch_namespace: str, tmp_path: Path
) -> None:
    # The dispatch path alone. No webhook is registered here, so AppWrappers carry no
    # creator record and are let through unattributed; the next test runs the webhook.
    with dispatcher_as_service_account(
        cluster, scratch_namespace, tmp_path, webhook={"enabled": False}, unattributed="allow"
    ) as running:
        run_appwrapper(cluster, running)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def register_webhook(cluster: Any, namespace: str, port: int) -> None:
    """The shipped webhook configurations, sent to a dispatcher on this machine and limited
    to `namespace` (they are cluster-wide, and fail closed)."""
    for doc in documents(MANIFESTS / "webhook.yaml"):
        if doc["kind"] not in WEBHOOK_PATHS:
            continue
        for webhook in doc["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
            webhook["namespaceSelector"] = {
                "matchLabels": {"kubernetes.io/metadata.name": namespace}
            }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))


def ca_bundles(cluster: Any) -> list[str]:
    return [
        cluster.kubectl(
            "get",
            kind.lower(),
            WEBHOOK_CONFIGURATION,
            "-o",
            "jsonpath={.webhooks[*].clientConfig.caBundle}",
            check=False,
        ).stdout.strip()
        for kind in WEBHOOK_PATHS
    ]


def test_webhook_runs_as_the_service_account(
    cluster: Any, installed: None, scratch_namespace: str, tmp_path: Path
) -> None:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("the API server must reach this machine's 127.0.0.1 to call the webhook")
    namespace = scratch_namespace
    webhook_port = free_port()
    settings = shipped_settings()
    webhook = {
        **settings.webhook.model_dump(),
        "host": "127.0.0.1",
        "port": webhook_port,
        "extra_names": ["127.0.0.1"],
    }
    cluster.kubectl(
        "delete", "secret", WEBHOOK_SECRET, "-n", SYSTEM_NAMESPACE, "--ignore-not-found"
    )
    register_webhook(cluster, namespace, webhook_port)
    # The shipped status policy: the ServiceAccount's own status writes pass it.
    cluster.kubectl("apply", "-f", str(MANIFESTS / "status-policy.yaml"))
    try:
        # unattributed as shipped (refuse): the AppWrapper runs only if the webhook saw it.
        with dispatcher_as_service_account(
            cluster, namespace, tmp_path, webhook=webhook
        ) as running:
            wait_until(lambda: port_open(webhook_port), timeout=30, what="the webhook to listen")
            # Its Secret made (create, then get/update) and its CA in both configurations
            # (get and patch on those two names).
            wait_until(lambda: all(ca_bundles(cluster)), timeout=60, what="caBundle in both")
            secret = json.loads(
                cluster.kubectl(
                    "get", "secret", WEBHOOK_SECRET, "-n", SYSTEM_NAMESPACE, "-o", "json"
                ).stdout
            )
            assert secret.get("data"), "the webhook Secret is empty"
            run_appwrapper(cluster, running)
    finally:
        remove_webhook_objects(cluster)


def run_appwrapper(cluster: Any, running: Running) -> None:
    process, namespace = running.process, running.namespace
    port, lease = running.health_port, running.lease

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


def test_provisioning_component_grants_what_the_admission_check_uses(
    cluster: Any, tmp_path: Path
) -> None:
    base_path = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [base_path],
                "components": [f"{base_path}/provisioning"],
            }
        )
    )
    docs = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(tmp_path)).stdout) if d]
    role = one(docs, "ClusterRole", "appwrapper-dispatcher-provisioning")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # controller/lifecycle/provisioning.py: templates and requests made, listed and watched.
    for resource, group, verbs in (
        ("podtemplates", "", ("create", "get")),
        ("provisioningrequests", "autoscaling.x-k8s.io", ("create", "list", "watch")),
    ):
        for verb in verbs:
            assert (group, resource, verb) in granted, (resource, verb)
    binding = one(docs, "ClusterRoleBinding", "appwrapper-dispatcher-provisioning")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "appwrapper-dispatcher", "namespace": SYSTEM_NAMESPACE}
    ]
    # The CRD shipped for clusters without the autoscaler's own is one the API server takes.
    crd = REPO / "crds" / "provisioning" / "provisioningrequest.yaml"
    applied = cluster.kubectl("apply", "--dry-run=server", "-f", str(crd))
    assert "provisioningrequests.autoscaling.x-k8s.io" in applied.stdout
