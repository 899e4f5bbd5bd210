"""Builders of Kubernetes manifests and AppWrappers for tests, demos and benchmarks. Pure."""

from __future__ import annotations

from typing import Any

from dispatcher.api.constants import API_VERSION, KIND


def appwrapper(
    name: str,
    *items: dict[str, Any],
    priority: int | None = None,
    scheduling: dict[str, Any] | None = None,
    completion: str | None = None,
    custom: list[dict[str, Any]] | None = None,
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
    if scheduling:
        spec["schedulingSpec"] = scheduling
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
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
