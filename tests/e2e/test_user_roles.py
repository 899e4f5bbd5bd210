"""The roles for people (manifests/user-roles.yaml) against a real API server.

Users bound as manifests/README.md says (`appwrapper-user` by a RoleBinding in one
namespace, `appwrapper-admin` by a ClusterRoleBinding) and users holding only the built-in
`edit`, `admin` or `view` in that namespace are asked `kubectl auth can-i --as`: a user may
submit AppWrappers where bound and nowhere else, nobody gets `appwrappers/status` or the
`nonpreemptible` verb, only the admin writes the quota kinds, and the built-in roles take in
exactly what the file says aggregates (through the API server's aggregation controller).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testenv.waits import wait_until

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
USER_ROLES = REPO / "manifests" / "user-roles.yaml"
GROUP = "workload.codeflare.dev"
AW = f"appwrappers.{GROUP}"
QUOTA_KINDS = ("clusterappqueues", "appcohorts", "appflavors")
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"

# Who is bound to what; "NS" in a test row stands for the test's namespace.
USER, ADMIN, EDITOR, NS_ADMIN, VIEWER = "aw-alice", "aw-carol", "aw-bob", "aw-dana", "aw-erin"
NS, OTHER = "NS", "default"


def documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(USER_ROLES.read_text()) if d]


def role(name: str) -> dict[str, Any]:
    (found,) = [d for d in documents() if d["metadata"]["name"] == name]
    return found


def test_no_role_grants_status_the_nonpreemptible_verb_or_a_wildcard() -> None:
    roles = documents()
    assert sorted(d["metadata"]["name"] for d in roles) == [
        "appwrapper-admin",
        "appwrapper-user",
        "appwrapper-viewer",
    ]
    for doc in roles:
        assert doc["kind"] == "ClusterRole"
        for rule in doc["rules"]:
            where = f"{doc['metadata']['name']}: {rule}"
            assert rule["apiGroups"] == [GROUP], where
            assert not any("/" in r or "*" in r for r in rule["resources"]), where
            assert "*" not in rule["verbs"], where
            assert "nonpreemptible" not in rule["verbs"], where


def test_aggregation_labels_are_the_documented_ones() -> None:
    def aggregates(name: str) -> set[str]:
        labels = role(name)["metadata"].get("labels") or {}
        return {k.removeprefix(AGGREGATE) for k, v in labels.items() if k.startswith(AGGREGATE)}

    assert aggregates("appwrapper-user") == {"edit", "admin"}
    assert aggregates("appwrapper-viewer") == {"view"}
    assert aggregates("appwrapper-admin") == set()  # the quota kinds stay the platform's
    viewer_verbs = {v for rule in role("appwrapper-viewer")["rules"] for v in rule["verbs"]}
    assert viewer_verbs == {"get", "list", "watch"}


@pytest.fixture(scope="module")
def bound(cluster: Any, quota_crds: None) -> Iterator[str]:
    """user-roles.yaml applied; the five users bound; the namespace they are bound in."""
    namespace = f"t-roles-{uuid.uuid4().hex[:6]}"
    binding = f"t-roles-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("apply", "-f", str(USER_ROLES))
    for user, cluster_role in (
        (USER, "appwrapper-user"),
        (EDITOR, "edit"),
        (NS_ADMIN, "admin"),
        (VIEWER, "view"),
    ):
        cluster.kubectl(
            "create",
            "rolebinding",
            f"{binding}-{user}",
            "-n",
            namespace,
            f"--clusterrole={cluster_role}",
            f"--user={user}",
        )
    cluster.kubectl(
        "create", "clusterrolebinding", binding, "--clusterrole=appwrapper-admin", f"--user={ADMIN}"
    )
    try:
        # The aggregation controller folds the labelled roles into edit, admin and view.
        for user, verb in ((EDITOR, "create"), (NS_ADMIN, "create"), (VIEWER, "list")):
            wait_until(
                lambda user=user, verb=verb: can_i(cluster, user, verb, AW, "-n", namespace),
                timeout=30,
                what=f"{user} to get {verb} on AppWrappers by aggregation",
            )
        yield namespace
    finally:
        cluster.kubectl("delete", "clusterrolebinding", binding, "--ignore-not-found", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "-f", str(USER_ROLES), "--ignore-not-found", check=False)


def can_i(cluster: Any, user: str, *args: str) -> bool:
    result = cluster.kubectl("auth", "can-i", f"--as={user}", *args, check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), (result.stdout, result.stderr)
    return answer == "yes"


STATUS = ("update", AW, "--subresource=status")
CASES = [
    # appwrapper-user, bound in NS only.
    pytest.param(USER, ("create", AW), NS, True, id="user-creates-appwrappers"),
    pytest.param(USER, ("delete", AW), NS, True, id="user-deletes-appwrappers"),
    pytest.param(USER, ("watch", f"appqueues.{GROUP}"), NS, True, id="user-watches-appqueues"),
    pytest.param(USER, ("create", AW), OTHER, False, id="user-not-in-another-namespace"),
    pytest.param(USER, STATUS, NS, False, id="user-no-status"),
    pytest.param(USER, ("patch", AW, "--subresource=status"), NS, False, id="user-no-status-patch"),
    pytest.param(USER, ("nonpreemptible", AW), NS, False, id="user-no-nonpreemptible"),
    pytest.param(USER, ("create", f"appqueues.{GROUP}"), NS, False, id="user-no-appqueue-write"),
    *(
        pytest.param(USER, ("create", f"{kind}.{GROUP}"), None, False, id=f"user-no-{kind}")
        for kind in QUOTA_KINDS
    ),
    # appwrapper-admin, bound cluster-wide.
    *(
        pytest.param(ADMIN, ("create", f"{kind}.{GROUP}"), None, True, id=f"admin-creates-{kind}")
        for kind in QUOTA_KINDS
    ),
    pytest.param(ADMIN, ("delete", f"appqueues.{GROUP}"), NS, True, id="admin-deletes-appqueues"),
    pytest.param(ADMIN, ("create", AW), NS, True, id="admin-creates-appwrappers"),
    pytest.param(ADMIN, STATUS, NS, False, id="admin-no-status"),
    pytest.param(
        ADMIN,
        ("patch", f"clusterappqueues.{GROUP}", "--subresource=status"),
        None,
        False,
        id="admin-no-queue-status",
    ),
    pytest.param(ADMIN, ("nonpreemptible", AW), NS, False, id="admin-no-nonpreemptible"),
    # The built-in roles, by aggregation.
    pytest.param(EDITOR, ("create", AW), NS, True, id="edit-creates-appwrappers"),
    pytest.param(EDITOR, STATUS, NS, False, id="edit-no-status"),
    pytest.param(EDITOR, ("nonpreemptible", AW), NS, False, id="edit-no-nonpreemptible"),
    pytest.param(EDITOR, ("create", f"appqueues.{GROUP}"), NS, False, id="edit-no-appqueue-write"),
    pytest.param(
        EDITOR, ("create", f"clusterappqueues.{GROUP}"), None, False, id="edit-no-clusterappqueues"
    ),
    pytest.param(NS_ADMIN, ("create", AW), NS, True, id="ns-admin-creates-appwrappers"),
    pytest.param(NS_ADMIN, STATUS, NS, False, id="ns-admin-no-status"),
    pytest.param(
        NS_ADMIN, ("create", f"appqueues.{GROUP}"), NS, False, id="ns-admin-no-appqueue-write"
    ),
    pytest.param(VIEWER, ("watch", AW), NS, True, id="view-watches-appwrappers"),
    pytest.param(VIEWER, ("get", f"appqueues.{GROUP}"), NS, True, id="view-reads-appqueues"),
    pytest.param(VIEWER, ("create", AW), NS, False, id="view-no-create"),
]


@pytest.mark.parametrize(("user", "request_", "where", "want"), CASES)
def test_who_may_do_what(
    cluster: Any, bound: str, user: str, request_: tuple[str, ...], where: str | None, want: bool
) -> None:
    scope = [] if where is None else ["-n", bound if where == NS else where]
    assert can_i(cluster, user, *request_, *scope) is want, (user, request_, scope)
