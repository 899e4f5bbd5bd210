"""Builders of Kubernetes manifests and AppWrappers for tests, demos and benchmarks. Pure,
but for `status_policy`, which reads the shipped manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dispatcher.api.constants import API_VERSION, KIND, LABEL_QUEUE

# The webhook configurations are built at run time too (`run --dev`); kept importable here.
from dispatcher.kube.registration import webhook_configurations as webhook_configurations


def appwrapper(
    name: str,
    *items: dict[str, Any],
    priority: int | None = None,
    scheduling: dict[str, Any] | None = None,
    completion: str | None = None,
    custom: list[dict[str, Any]] | None = None,
    queue: str | None = None,
    priority_class: str | None = None,
) -> dict[str, Any]:
    generic: list[dict[str, Any]] = []
    for item in items:
        entry: dict[str, Any] = {"generictemplate": item}
        if completion and item.get("kind") == "Job":
            entry["completionstatus"] = completion
        if custom is not None:
            entry["custompodresources"] = custom
        generic.append(entry)
    spec: dict[str, Any] = {"resources": {"GenericItems": generic}}
    if priority is not None:
        spec["priority"] = priority
    if priority_class is not None:
        spec["priorityClassName"] = priority_class
    if scheduling:
        spec["schedulingSpec"] = scheduling
    metadata: dict[str, Any] = {"name": name}
    if queue is not None:
        metadata["labels"] = {LABEL_QUEUE: queue}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": spec,
    }


# -- quotas -------------------------------------------------------------------------------

QuotaAmounts = dict[str, Any]
"""resource -> nominal quota, or -> {"nominalQuota": ..., "borrowingLimit": ..., ...}."""


def resource_group(flavors: dict[str, QuotaAmounts]) -> dict[str, Any]:
    """One resource group: flavor -> its quotas, flavors in order of preference."""
    covered: list[str] = []
    for amounts in flavors.values():
        covered += [r for r in amounts if r not in covered]

    def quota(resource: str, value: Any) -> dict[str, Any]:
        fields = value if isinstance(value, dict) else {"nominalQuota": value}
        return {"name": resource, **fields}

    return {
        "coveredResources": covered,
        "flavors": [
            {"name": flavor, "resources": [quota(r, v) for r, v in amounts.items()]}
            for flavor, amounts in flavors.items()
        ],
    }


def cluster_queue(
    name: str,
    flavors: dict[str, QuotaAmounts],
    *,
    cohort: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A ClusterAppQueue admitting every namespace (unless `namespaceSelector` is given)."""
    body: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [resource_group(flavors)]}
    if cohort:
        body["cohort"] = cohort
    body.update(spec)
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterAppQueue",
        "metadata": {"name": name},
        "spec": body,
    }


def app_queue(name: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AppQueue",
        "metadata": {"name": name},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def app_flavor(name: str, node_labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AppFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": node_labels or {}, **spec},
    }


def app_cohort(
    name: str, parent: str | None = None, flavors: dict[str, QuotaAmounts] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if parent:
        spec["parent"] = parent
    if flavors:
        spec["resourceGroups"] = [resource_group(flavors)]
    return {
        "apiVersion": API_VERSION,
        "kind": "AppCohort",
        "metadata": {"name": name},
        "spec": spec,
    }


def pod_template(requests: dict[str, Any], **spec: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": requests}
    extended = {k: v for k, v in requests.items() if "/" in k}
    if extended:
        resources["limits"] = extended  # Kubernetes requires limits for extended resources
    return {
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "resources": resources}],
            **spec,
        }
    }


def deployment(name: str, replicas: int, requests: dict[str, Any], **spec: Any) -> dict[str, Any]:
    template = pod_template(requests, **spec)
    template["metadata"] = {"labels": {"app": name}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template,
        },
    }


def job(name: str, parallelism: int, requests: dict[str, Any], **spec: Any) -> dict[str, Any]:
    template = pod_template(requests, restartPolicy="Never", **spec)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"parallelism": parallelism, "completions": parallelism, "template": template},
    }


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80}]},
    }


STATUS_POLICY = Path(__file__).resolve().parents[1] / "manifests" / "status-policy.yaml"


def status_policy(writers: list[str]) -> list[dict[str, Any]]:
    """manifests/status-policy.yaml (the ValidatingAdmissionPolicy that lets only the
    dispatcher write AppWrapper status, and its binding) with `writers` as its list of
    writers: a test's dispatcher runs as the test cluster's user, not the ServiceAccount."""
    docs = [d for d in yaml.safe_load_all(STATUS_POLICY.read_text()) if d]
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    (variable,) = [v for v in policy["spec"]["variables"] if v["name"] == "writers"]
    variable["expression"] = json.dumps(writers)  # a JSON list of strings is a CEL list
    return docs


VISIBILITY_GROUP = "visibility.workload.codeflare.dev"
VISIBILITY_READER = "appwrapper-visibility-reader"


def visibility_reader_role() -> list[dict[str, Any]]:
    """Every authenticated user may ask the visibility API (the dispatcher then shows each
    only the namespaces where they may list AppWrappers): manifests/visibility.yaml's."""
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": VISIBILITY_READER},
            "rules": [
                {
                    "apiGroups": [VISIBILITY_GROUP],
                    "resources": ["*"],
                    "verbs": ["get", "list"],
                }
            ],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": VISIBILITY_READER},
            "roleRef": {
                "apiGroup": rbac.split("/")[0],
                "kind": "ClusterRole",
                "name": VISIBILITY_READER,
            },
            "subjects": [
                {"apiGroup": rbac.split("/")[0], "kind": "Group", "name": "system:authenticated"}
            ],
        },
    ]


def visibility_registration(
    port: int, *, namespace: str, host: str = "127.0.0.1"
) -> list[dict[str, Any]]:
    """The APIService of the visibility API served out of the cluster at `host:port`: the
    Service it names is an ExternalName (the API server resolves it itself; a control plane
    with no kube-proxy cannot reach a ClusterIP), and its certificate is not checked (made
    by the dispatcher at start; the user's identity rides on the front proxy's certificate,
    which the dispatcher checks)."""
    name = "appwrapper-dispatcher-visibility"
    service: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": "ExternalName", "externalName": host, "ports": [{"port": port}]},
    }
    apiservice = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"v1alpha1.{VISIBILITY_GROUP}"},
        "spec": {
            "group": VISIBILITY_GROUP,
            "version": "v1alpha1",
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
            "insecureSkipTLSVerify": True,
            "service": {"name": name, "namespace": namespace, "port": port},
        },
    }
    return [service, apiservice, *visibility_reader_role()]
