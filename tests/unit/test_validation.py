"""Semantic validation of wrapped objects (rules 6 and 7)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.core.validation import (
    DEFAULT_ALLOWED_KINDS,
    DEFAULT_CLUSTER_SCOPED,
    validate_appwrapper,
    validate_item,
)
from tests.unit.builders import container, deployment, job, obj, pod, pod_spec


def with_metadata(template: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    template["metadata"].update(metadata)
    return template


def without(template: dict[str, Any], *path: str) -> dict[str, Any]:
    node = template
    for step in path[:-1]:
        node = node[step]
    del node[path[-1]]
    return template


ITEM_CASES: list[Any] = [
    pytest.param(deployment("web"), [], id="valid-deployment"),
    pytest.param(with_metadata(pod("p"), namespace="team-a"), [], id="same-namespace"),
    pytest.param(without(pod("p"), "apiVersion"), ["missing apiVersion"], id="no-apiversion"),
    pytest.param(without(pod("p"), "kind"), ["missing kind"], id="no-kind"),
    pytest.param(without(pod("p"), "metadata", "name"), ["missing metadata.name"], id="no-name"),
    pytest.param(
        # Read from an AppWrapper, a string generateName has been made a name already
        # (tests/unit/test_generated_names.py); a bare template has none to create.
        with_metadata(without(pod("p"), "metadata", "name"), generateName="p-"),
        ["missing metadata.name"],
        id="generate-name-unread",
    ),
    pytest.param(
        with_metadata(without(pod("p"), "metadata", "name"), generateName=7),
        ["missing metadata.name, and metadata.generateName 7 is not a string"],
        id="generate-name-not-a-string",
    ),
    pytest.param(
        with_metadata(pod("p"), namespace="kube-system"),
        [
            "metadata.namespace 'kube-system' differs from the AppWrapper's namespace 'team-a'; "
            "wrapped objects are created in the AppWrapper's namespace"
        ],
        id="other-namespace",
    ),
    pytest.param(
        obj("Namespace", "evil"),
        ["kind Namespace is cluster-scoped; only namespaced objects may be wrapped"],
        id="namespace-kind",
    ),
    pytest.param(
        obj("ClusterRoleBinding", "admin", api_version="rbac.authorization.k8s.io/v1"),
        ["kind ClusterRoleBinding is cluster-scoped; only namespaced objects may be wrapped"],
        id="clusterrolebinding",
    ),
    pytest.param(
        obj("RoleBinding", "rb", api_version="rbac.authorization.k8s.io/v1"),
        ["kind RoleBinding is not allowed (allowed: "],
        id="rolebinding-not-allowed-by-default",
    ),
    pytest.param(
        obj("DaemonSet", "ds", api_version="apps/v1"),
        ["kind DaemonSet is not allowed (allowed: "],
        id="daemonset-not-allowed",
    ),
    pytest.param(
        pod("p", pod_spec(container("main", requests={"cpu": "one"}))),
        ["Pod/p container 'main': cpu: malformed quantity 'one'"],
        id="malformed-quantity",
    ),
    pytest.param("not an object", ["generictemplate is not an object"], id="not-a-mapping"),
    pytest.param(
        {},
        ["missing apiVersion", "missing kind", "missing metadata.name"],
        id="empty-object",
    ),
]


@pytest.mark.parametrize(("template", "want"), ITEM_CASES)
def test_validate_item(template: Any, want: list[str]) -> None:
    errors = validate_item(
        template,
        namespace="team-a",
        allowed_kinds=DEFAULT_ALLOWED_KINDS,
        cluster_scoped_kinds=DEFAULT_CLUSTER_SCOPED,
    )
    assert len(errors) == len(want), errors
    for error, wanted in zip(errors, want, strict=True):
        assert error.startswith(wanted)


def test_no_allow_list_allows_any_namespaced_kind() -> None:
    rolebinding = obj("RoleBinding", "rb", api_version="rbac.authorization.k8s.io/v1")
    namespace_object = obj("Namespace", "ns")
    kwargs: dict[str, Any] = {
        "namespace": "a",
        "allowed_kinds": None,
        "cluster_scoped_kinds": DEFAULT_CLUSTER_SCOPED,
    }
    assert validate_item(rolebinding, **kwargs) == []
    assert validate_item(namespace_object, **kwargs) != []


def test_defaults() -> None:
    assert {"Role", "RoleBinding", "Secret"}.isdisjoint(DEFAULT_ALLOWED_KINDS)
    assert DEFAULT_ALLOWED_KINDS.isdisjoint(DEFAULT_CLUSTER_SCOPED)
    assert {"RayCluster", "Job", "Service", "PodGroup"} <= DEFAULT_ALLOWED_KINDS
    assert {"Namespace", "ClusterRole", "CustomResourceDefinition"} <= DEFAULT_CLUSTER_SCOPED


def test_validate_appwrapper_indexes_items_and_finds_duplicates() -> None:
    items: list[Any] = [
        obj("Service", "svc"),
        deployment("web"),
        with_metadata(job("train"), namespace="other"),
        obj("Service", "svc"),
        obj("ConfigMap", "svc"),
        without(obj("ConfigMap", "s"), "metadata", "name"),
    ]
    assert validate_appwrapper(items, namespace="team-a") == [
        "item 2 (Job/train): metadata.namespace 'other' differs from the AppWrapper's namespace "
        "'team-a'; wrapped objects are created in the AppWrapper's namespace",
        "item 3 (Service/svc): duplicate of item 0 (same kind and name)",
        "item 5 (ConfigMap/?): missing metadata.name",
    ]


def test_validate_appwrapper_valid() -> None:
    assert validate_appwrapper([deployment("web"), obj("Service", "web")], namespace="a") == []
