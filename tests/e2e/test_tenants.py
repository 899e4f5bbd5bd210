"""Tenants cannot take from each other, against the real API server (users impersonated with
`kubectl --as`; the webhook set up as in test_security.py, whose fixture this shares):

- an edit of the spec by someone other than the recorded user is their request: every right
  is checked for them, and the record then names them (nothing inherited);
- status is the dispatcher's: a tenant allowed `appwrappers/status` is refused;
- the webhook's Secret deleted while AppWrappers queue: the dispatcher makes it anew, keeps the
  old signing key verifying, and the queued AppWrappers dispatch.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.config import WebhookConfig
from dispatcher.core.gatekeeping import SIGNATURE, USER, attribution
from dispatcher.kube.certplan import SIGNING_KEY, KeyPolicy, verification_keys
from testenv import manifests
from testenv.localcluster import KubectlError
from testenv.waits import async_holds_for, async_wait_until
from tests.e2e import test_security
from tests.e2e.conftest import QUIET_SECONDS, appwrapper, get_aw, wait_condition
from tests.e2e.test_security import Secure, pod

pytestmark = [pytest.mark.cluster]

secure = test_security.secure  # the same fixture: alice, bob and the webhook configurations
CPU = {"cpu": "1"}
KEYS = KeyPolicy.from_config(WebhookConfig())


def big_pod(name: str) -> dict[str, Any]:
    """A Pod of one whole CPU: on a one-CPU node, one runs and the next waits."""
    return {**pod(name), **{"spec": {**pod(name)["spec"], "containers": [container(name)]}}}


def container(name: str) -> dict[str, Any]:
    return {"name": "c", "image": "busybox", "resources": {"requests": CPU, "limits": CPU}}


async def record_of(secure: Secure, name: str) -> dict[str, Any]:
    annotations = (await get_aw(secure.cluster, secure.namespace, name))["metadata"]["annotations"]
    return dict(json.loads(annotations[USER]))


async def edit(
    secure: Secure, name: str, patch: list[dict[str, Any]], *, user: str, extra: str = ""
) -> None:
    await secure.cluster.akubectl(
        # v1beta1 by name: `aw` is v1beta2 (the preferred version); the patches are v1beta1's.
        "patch", "appwrappers.v1beta1.workload.codeflare.dev", name, "-n", secure.namespace,
        f"--as={user}", "--type=json",
        "-p", json.dumps(patch), *([f"--as-user-extra={extra}"] if extra else []),
    )  # fmt: skip


async def refused_edit(secure: Secure, name: str, patch: list[dict[str, Any]], *, user: str) -> str:
    with pytest.raises(KubectlError) as caught:
        await edit(secure, name, patch, user=user)
    return str(caught.value.stderr)


async def waits_for_room(secure: Secure, name: str) -> bool:
    status = (await get_aw(secure.cluster, secure.namespace, name)).get("status") or {}
    return "InsufficientResources" in json.dumps(status)


async def test_an_editor_is_a_new_requester_and_inherits_nothing(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1", cpu="1")
    # carol may pin her work (preemptible: false); bob may create Pods but not pin.
    secure.grant("carol", "appwrapper-pinner", {"workload.codeflare.dev/appwrappers": [
        *test_security.APPWRAPPER_RIGHTS, "nonpreemptible"]})  # fmt: skip
    secure.grant("carol", "workloads", {"/pods": ["create", "get"]})
    await run_dispatcher(**secure.settings())
    await secure.apply(appwrapper("filler", big_pod("filler")), user="bob")
    await wait_condition(cluster, namespace, "filler", "Running")
    pinned = appwrapper("pinned", big_pod("pinned"))
    pinned["spec"]["preemptible"] = False
    await secure.apply(pinned, user="carol")
    await async_wait_until(lambda: waits_for_room(secure, "pinned"), timeout=30, what="queued")
    carols = await record_of(secure, "pinned")
    assert carols["username"] == "carol"

    replace_item = [{"op": "replace", "path": "/spec/resources/GenericItems/0",
                     "value": {"generictemplate": big_pod("swapped")}}]  # fmt: skip
    # alice may create no Pods, and may not pin: both named.
    message = await refused_edit(secure, "pinned", replace_item, user="alice")
    assert f"item 0 (Pod/swapped): alice may not create pods in namespace {namespace}" in message
    assert "preemptible: false: alice may not nonpreemptible" in message
    # bob may create Pods, but carol's preemptible: false is not his to keep.
    message = await refused_edit(secure, "pinned", replace_item, user="bob")
    assert "preemptible: false: bob may not nonpreemptible" in message
    assert "may not create pods" not in message
    assert await record_of(secure, "pinned") == carols  # nothing of it was stored
    # Without the pin, bob's edit is his request: the record names him, signed again.
    before = (await get_aw(cluster, namespace, "pinned"))["metadata"]["annotations"][SIGNATURE]
    unpin: list[dict[str, Any]] = [
        *replace_item,
        {"op": "replace", "path": "/spec/preemptible", "value": True},
    ]
    # With an extra (a token's scope): recorded, and sent in every SubjectAccessReview.
    await edit(secure, "pinned", unpin, user="bob", extra="scopes.example.com=workloads")
    edited = await get_aw(cluster, namespace, "pinned")
    bobs = json.loads(edited["metadata"]["annotations"][USER])
    assert bobs["username"] == "bob"
    assert bobs["extra"] == {"scopes.example.com": ["workloads"]}
    assert edited["metadata"]["annotations"][SIGNATURE] != before
    assert edited["spec"]["preemptible"] is True
    # Metadata only (a label, by alice): the record stays bob's, nothing asked.
    await cluster.akubectl("label", "aw", "pinned", "-n", namespace, "team=a", "--as=alice")
    assert await record_of(secure, "pinned") == bobs
    # The record verifies at dispatch and bob's rights are asked (extra included): it runs.
    await cluster.akubectl("delete", "aw", "filler", "-n", namespace, "--timeout=60s")
    await wait_condition(cluster, namespace, "pinned", "Running")
    made = await cluster.akubectl("get", "pod", "swapped", "-n", namespace, "-o", "name")
    assert made.stdout.strip() == "pod/swapped"


FORGED_STATUS = {
    "status": {
        "state": "Running",
        "clusterName": "local",
        "conditions": [{"type": "Dispatched", "status": "True", "reason": "Dispatched"}],
    }
}


async def write_status(cluster: Any, namespace: str, name: str, *who: str) -> None:
    await cluster.akubectl(
        "patch", "aw", name, "-n", namespace, *who, "--subresource=status", "--type=merge",
        "-p", json.dumps(FORGED_STATUS),
    )  # fmt: skip


@pytest.fixture
def status_policy(cluster: Any) -> Iterator[None]:
    """manifests/status-policy.yaml with the test dispatcher's user ("admin") as the writer,
    removed after the test."""
    for doc in manifests.status_policy(["admin"]):
        cluster.apply(doc)
    yield
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        cluster.kubectl("delete", kind, "appwrapper-status-writers", "--ignore-not-found")


async def policy_in_force(cluster: Any, namespace: str, name: str) -> None:
    """Until a forged status write is refused. The API server takes a policy up through its
    own watch; a server-side dry run goes through admission and stores nothing."""

    async def refused() -> bool:
        result = await cluster.akubectl(
            "patch", "aw", name, "-n", namespace, "--as=root", "--as-group=system:masters",
            "--subresource=status", "--type=merge", "--dry-run=server",
            "-p", json.dumps(FORGED_STATUS), check=False,
        )  # fmt: skip
        return result.returncode != 0 and "may not write it" in result.stderr

    await async_wait_until(refused, timeout=30, what="the status policy in force")


async def test_status_is_written_only_by_the_dispatcher(
    cluster: Any,
    namespace: str,
    fake_nodes: Any,
    run_dispatcher: Any,
    secure: Secure,
    status_policy: None,
) -> None:
    fake_nodes.add("n1", cpu="1")
    # dave may write status: a role granting appwrappers/status, as appwrappers/* would.
    secure.grant("dave", "status-writer", {"workload.codeflare.dev/appwrappers": ["get"]})
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "status-writer", "namespace": namespace},
        "rules": [{"apiGroups": ["workload.codeflare.dev"], "verbs": ["get", "update", "patch"],
                   "resources": ["appwrappers", "appwrappers/status"]}],
    }  # fmt: skip
    cluster.apply(role)
    await run_dispatcher(**secure.settings())
    await secure.apply(appwrapper("filler", big_pod("filler")), user="bob")
    # The dispatcher's own status writes pass: it runs.
    await wait_condition(cluster, namespace, "filler", "Running")
    await secure.apply(appwrapper("queued", big_pod("queued")), user="bob")
    await async_wait_until(lambda: waits_for_room(secure, "queued"), timeout=30, what="queued")
    await policy_in_force(cluster, namespace, "queued")
    for who in (["--as=dave"], ["--as=root", "--as-group=system:masters"]):
        with pytest.raises(KubectlError) as caught:
            await write_status(cluster, namespace, "queued", *who)
        message = caught.value.stderr
        assert "the status of an AppWrapper is written only by the dispatcher (admin)" in message
        assert f"{who[0].removeprefix('--as=')} may not write it" in message

    async def still_queued() -> bool:
        return await waits_for_room(secure, "queued")

    await async_holds_for(still_queued, seconds=QUIET_SECONDS, what="nothing dispatched")
    made = await cluster.akubectl("get", "pod", "queued", "-n", namespace, check=False)
    assert made.returncode != 0


async def test_a_recreated_secret_keeps_queued_appwrappers_verifying(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1", cpu="1")
    await run_dispatcher(**secure.settings())

    async def secret_data() -> dict[str, bytes]:
        out = await cluster.akubectl(
            "get", "secret", "appwrapper-dispatcher-webhook", "-n", namespace, "-o", "json",
            check=False,
        )  # fmt: skip
        if out.returncode != 0:
            return {}
        data = json.loads(out.stdout).get("data") or {}
        return {k: base64.b64decode(v) for k, v in data.items()}

    first = (await secret_data())[SIGNING_KEY]
    chain = ["filler", "q0", "q1", "q2"]
    await secure.apply(appwrapper("filler", big_pod("filler")), user="bob")
    await wait_condition(cluster, namespace, "filler", "Running")
    for name in chain[1:]:
        await secure.apply(appwrapper(name, big_pod(name)), user="bob")
    await async_wait_until(lambda: waits_for_room(secure, "q2"), timeout=30, what="queued")
    await cluster.akubectl(
        "delete", "secret", "appwrapper-dispatcher-webhook", "-n", namespace, "--wait=false"
    )

    async def made_anew() -> dict[str, bytes]:
        data = await secret_data()
        return data if data.get(SIGNING_KEY, first) != first else {}

    data = await async_wait_until(made_anew, timeout=15, what="the Secret made anew")
    # The queued ones verify only with the key they were signed with, now a retired one.
    signed_before = await get_aw(cluster, namespace, "q2")
    assert attribution(signed_before, [data[SIGNING_KEY]]).creator is None
    assert attribution(signed_before, verification_keys(data, time.time(), KEYS)).creator
    # One applied now is signed with the new key.
    await secure.apply(appwrapper("after", big_pod("after")), user="bob")
    chain.append("after")
    signed_after = await get_aw(cluster, namespace, "after")
    assert attribution(signed_after, [data[SIGNING_KEY]]).creator
    # Each runs in turn as the one before it goes: none ends Forbidden.
    for done, following in itertools.pairwise(chain):
        await cluster.akubectl("delete", "aw", done, "-n", namespace, "--timeout=60s")
        await wait_condition(cluster, namespace, following, "Running")
    failed = [c for c in (await get_aw(cluster, namespace, "after"))["status"]["conditions"]
              if c["type"] == "Failed" and c["status"] == "True"]  # fmt: skip
    assert failed == []
