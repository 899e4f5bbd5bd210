"""Least privilege against the real API server: users are impersonated (`kubectl --as`),
the dispatcher serves its admission webhook over TLS on 127.0.0.1, and webhook
configurations scoped to the test's namespace send it that namespace's AppWrappers.

alice may only create AppWrappers in the namespace; bob may also create Pods and Services.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from cryptography import x509

from dispatcher.api.constants import FINALIZER
from dispatcher.app import running
from dispatcher.config import WebhookConfig
from dispatcher.core.gatekeeping import SIGNATURE, USER, PriorityPolicy, PriorityRule
from testenv.localcluster import KubectlError, free_port
from testenv.manifests import webhook_configurations
from testenv.waits import async_wait_until
from tests.e2e.conftest import (
    appwrapper,
    dispatcher_config,
    get_aw,
    pod_template,
    service,
    wait_condition,
)

pytestmark = [pytest.mark.cluster]

APPWRAPPER_RIGHTS = ["get", "list", "watch", "create", "update", "patch", "delete"]


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        **pod_template({"cpu": "100m"}, **spec),
    }


@dataclass
class Secure:
    cluster: Any
    namespace: str
    port: int
    name: str

    def settings(self, **webhook: Any) -> dict[str, Any]:
        """The dispatcher's settings: its webhook answers only the API server's client
        certificate where the cluster presents one (a LocalCluster; a cluster made elsewhere
        runs without, and the tests that need it skip)."""
        client_ca = self.cluster.webhook_client_ca
        defaults: dict[str, Any] = {"client_ca_file": str(client_ca) if client_ca else None}
        return {
            "unattributed": "refuse",
            "webhook": WebhookConfig(
                enabled=True,
                host="127.0.0.1",
                port=self.port,
                namespace=self.namespace,
                extra_names=["127.0.0.1"],
                mutating_configuration=self.name,
                validating_configuration=self.name,
                **{**defaults, **webhook},
            ),
        }

    async def apply(self, obj: dict[str, Any], *, user: str | None = None) -> str:
        """kubectl apply as `user`; raises KubectlError with the API server's answer."""
        args = ["apply", "-n", self.namespace, "-f", "-"]
        if user:
            args.append(f"--as={user}")
        result = await self.cluster.akubectl(*args, input=json.dumps(obj))
        return str(result.stdout)

    async def refused(self, obj: dict[str, Any], *, user: str) -> str:
        """The message an apply as `user` is refused with."""
        with pytest.raises(KubectlError) as caught:
            await self.apply(obj, user=user)
        return str(caught.value.stderr)

    def webhook_configurations(self) -> None:
        for configuration in webhook_configurations(self.name, self.port, namespace=self.namespace):
            self.cluster.apply(configuration)

    def remove_webhook_configurations(self) -> None:
        self.cluster.kubectl(
            "delete",
            f"mutatingwebhookconfiguration/{self.name}",
            f"validatingwebhookconfiguration/{self.name}",
            "--ignore-not-found",
            check=False,
        )

    def grant(self, user: str, role: str, resources: dict[str, list[str]]) -> None:
        """A Role of `resources` ({"group/resource": verbs}) bound to `user`."""
        grant(self.cluster, self.namespace, user, role, resources)


def grant(
    cluster: Any, namespace: str, user: str, role: str, resources: dict[str, list[str]]
) -> None:
    """A Role in `namespace` of `resources` ({"group/resource": verbs}) bound to `user`."""
    rules = []
    for what, verbs in resources.items():
        group, _, resource = what.rpartition("/")
        rules.append({"apiGroups": [group], "resources": [resource], "verbs": verbs})
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": role, "namespace": namespace},
            "rules": rules,
        }
    )
    cluster.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{role}-{user}", "namespace": namespace},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": role,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )


@pytest_asyncio.fixture
async def secure(cluster: Any, namespace: str) -> AsyncIterator[Secure]:
    state = Secure(cluster, namespace, free_port(), f"aw-test-{namespace}"[:63])
    appwrappers = {"workload.codeflare.dev/appwrappers": APPWRAPPER_RIGHTS}
    state.grant("alice", "appwrapper-user", appwrappers)
    state.grant("bob", "appwrapper-user", appwrappers)
    state.grant("bob", "workloads", {"/pods": ["create", "get"], "/services": ["create", "get"]})
    state.webhook_configurations()
    try:
        yield state
    finally:
        state.remove_webhook_configurations()


def escalations(namespace: str) -> dict[str, tuple[dict[str, Any], str]]:
    """What alice tries, each with (part of) the answer the webhook gives."""
    return {
        "pod-as-deployer": (
            appwrapper("sa", pod("p", serviceAccountName="deployer")),
            "item 0 (Pod/p): alice may not create pods in namespace " + namespace,
        ),
        "mount-a-secret": (
            appwrapper(
                "mount",
                pod("m", volumes=[{"name": "s", "secret": {"secretName": "db-password"}}]),
            ),
            "alice may not create pods",
        ),
        "token-secret": (
            appwrapper(
                "token",
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": "t",
                        "annotations": {"kubernetes.io/service-account.name": "deployer"},
                    },
                    "type": "kubernetes.io/service-account-token",
                },
            ),
            "kind Secret",
        ),
        "allow-all-networkpolicy": (
            appwrapper(
                "netpol",
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": {"name": "all"},
                    "spec": {"podSelector": {}, "ingress": [{}]},
                },
            ),
            "alice may not create networkpolicies.networking.k8s.io in namespace",
        ),
        "ingress-host": (
            appwrapper(
                "ing",
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "Ingress",
                    "metadata": {"name": "i"},
                    "spec": {"rules": [{"host": "login.example.com"}]},
                },
            ),
            "alice may not create ingresses.networking.k8s.io",
        ),
        "external-ips": (
            appwrapper(
                "ext",
                {**service("s"), "spec": {"ports": [{"port": 80}], "externalIPs": ["1.2.3.4"]}},
            ),
            "alice may not create services",
        ),
        "pvc-volume-name": (
            appwrapper(
                "pvc",
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "c"},
                    "spec": {
                        "volumeName": "someone-elses-data",
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                },
            ),
            "alice may not create persistentvolumeclaims",
        ),
        "huge-priority": (
            appwrapper("prio", service("s1"), priority=2_000_000_000),
            "above the highest this namespace may use (1000000000)",
        ),
        "system-class": (
            appwrapper("sys", service("s2"), priority_class="system-node-critical"),
            "PriorityClass 'system-node-critical' is reserved for the system",
        ),
        "nonpreemptible": (
            {
                **appwrapper("pin", service("s3")),
                "spec": {**appwrapper("pin", service("s3"))["spec"], "preemptible": False},
            },
            "preemptible: false: alice may not nonpreemptible appwrappers.workload.codeflare.dev",
        ),
    }


async def test_escalations_are_refused_at_apply(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1")
    await run_dispatcher(**secure.settings())
    cases = escalations(namespace)
    for case, (obj, expected) in cases.items():
        message = await secure.refused(obj, user="alice")
        assert "denied the request" in message, (case, message)
        assert expected in message, (case, message)
    # 9e18 does not even reach the webhook: the schema holds priorities to int32.
    message = await secure.refused(
        appwrapper("prio9", service("s4"), priority=9_000_000_000_000_000_000), user="alice"
    )
    assert "must be of type integer with format int32 in spec.priority" in message
    # Past the whole AppWrapper's size cap, in a legacy field no schema bounds; created, not
    # applied: kubectl apply's last-applied copy would meet the API server's 256 KiB limit
    # on annotations first.
    huge = appwrapper("huge", service("s5"))
    huge["spec"]["service"] = {"spec": {"blob": ["x" * 1000] * 600}}
    with pytest.raises(KubectlError) as caught:
        await cluster.akubectl(
            "create", "-n", namespace, "--as=alice", "-f", "-", input=json.dumps(huge)
        )
    assert "denied the request: the AppWrapper is 60" in caught.value.stderr
    assert (
        "bytes as JSON; at most 524,288 are accepted (the dispatcher's max_appwrapper_bytes);"
        " its largest field is spec.service.spec.blob (60" in caught.value.stderr
    )
    listed = await cluster.akubectl("get", "aw", "-n", namespace, "-o", "name")
    assert listed.stdout.strip() == ""  # nothing of it was stored


async def test_a_user_with_the_rights_gets_them_and_is_recorded(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1")
    await run_dispatcher(**secure.settings())
    created = await cluster.akubectl(
        "create", "-n", namespace, "-f", "-", "-o", "json", "--as=bob",
        input=json.dumps(appwrapper("web", pod("web-0"), service("web"))),
    )  # fmt: skip
    # The mutating webhook set the finalizer with the object: the dispatcher patches nothing.
    assert json.loads(created.stdout)["metadata"]["finalizers"] == [FINALIZER]
    await wait_condition(cluster, namespace, "web", "Running")
    annotations = (await get_aw(cluster, namespace, "web"))["metadata"]["annotations"]
    record = json.loads(annotations[USER])
    assert record["username"] == "bob"
    assert "system:authenticated" in record["groups"]
    assert annotations[SIGNATURE].startswith("v2:")
    services = await cluster.akubectl("get", "service", "web", "-n", namespace, "-o", "name")
    assert services.stdout.strip() == "service/web"

    # The record is immutable, and the items of a dispatched AppWrapper cannot change.
    forged = json.dumps({"username": "admin", "uid": "", "groups": ["system:masters"]})
    with pytest.raises(KubectlError) as caught:
        await cluster.akubectl(
            "annotate",
            "aw",
            "web",
            "-n",
            namespace,
            "--overwrite",
            f"{USER}={forged}",
            "--as=bob",
        )
    assert f"annotation {USER} records who created the AppWrapper" in caught.value.stderr
    with pytest.raises(KubectlError) as caught:
        await cluster.akubectl(
            "patch",
            # v1beta1 by name: `aw` is v1beta2 (the preferred version), whose items are
            # spec.components.
            "appwrappers.v1beta1.workload.codeflare.dev",
            "web",
            "-n",
            namespace,
            "--as=bob",
            "--type=json",
            "-p",
            json.dumps([{"op": "remove", "path": "/spec/resources/GenericItems/1"}]),
        )
    assert "cannot change while the AppWrapper is dispatched" in caught.value.stderr
    # Metadata may change (labels, the dispatcher's own finalizer).
    await cluster.akubectl("label", "aw", "web", "-n", namespace, "team=a", "--as=bob")


async def test_priority_policy_and_nonpreemptible(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1")
    for name, value in (("dev", 10), ("prod", 100), ("high", 500)):
        cluster.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": f"{namespace}-{name}"[:63]},
                "value": value,
            }
        )
    dev, prod, high = (f"{namespace}-{n}"[:63] for n in ("dev", "prod", "high"))
    policy = PriorityPolicy(
        namespaces={namespace: PriorityRule(classes=[dev, prod], max_priority=50)}
    )
    try:
        await run_dispatcher(**secure.settings(), priority_policy=policy)
        message = await secure.refused(appwrapper("h", pod("h"), priority_class=high), user="bob")
        assert f"PriorityClass {high!r} is not one namespace {namespace} may use" in message
        message = await secure.refused(appwrapper("r", pod("r"), priority=51), user="bob")
        assert "priority 51, above the highest this namespace may use (50)" in message
        await secure.apply(appwrapper("d", pod("d"), priority_class=prod), user="bob")
        await secure.apply(appwrapper("low", pod("low"), priority=50), user="bob")
        pinned = appwrapper("pinned", pod("pinned"))
        pinned["spec"]["preemptible"] = False
        message = await secure.refused(pinned, user="bob")
        assert "bob may not nonpreemptible appwrappers.workload.codeflare.dev" in message
        await secure.apply(pinned)  # the cluster admin may
        await wait_condition(cluster, namespace, "pinned", "Running")
    finally:
        for name in (dev, prod, high):
            cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found", check=False)


async def test_past_the_webhook_refused_at_dispatch(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    """With the webhook configurations deleted, alice's AppWrappers are stored, and the
    dispatcher refuses them before creating anything: no record, or a forged one."""
    fake_nodes.add("n1")
    await run_dispatcher(**secure.settings())
    # Applied while the webhook is there: bob's records are signed.
    await secure.apply(appwrapper("signed", pod("q")), user="bob")
    await secure.apply(appwrapper("edited", service("e")), user="bob")
    await wait_condition(cluster, namespace, "edited", "Running")
    secure.remove_webhook_configurations()
    # Edited past the webhook: its signature no longer covers its spec.
    await cluster.akubectl(
        "patch", "appwrappers.v1beta1.workload.codeflare.dev", "edited", "-n", namespace,
        "--as=bob", "--type=json", "-p",
        json.dumps([{"op": "add", "path": "/spec/resources/GenericItems/-",
                     "value": {"generictemplate": pod("sneaked-in")}}]),
    )  # fmt: skip
    await secure.apply(
        appwrapper("plain", pod("plain", serviceAccountName="deployer")), user="alice"
    )
    forged = appwrapper("forged", pod("forged"))
    forged["metadata"]["annotations"] = {
        USER: json.dumps({"username": "admin", "uid": "", "groups": ["system:masters"]}),
        SIGNATURE: "v1:" + "0" * 64,
    }
    await secure.apply(forged, user="alice")
    # Every escalation of the apply test, now stored: each ends Failed before anything of it
    # exists. Secret is not a kind the dispatcher wraps at all (InvalidSpec, before asking
    # who created it); the others for want of a record.
    reasons = {"plain": "Forbidden", "forged": "Forbidden", "edited": "Forbidden"}
    for case, (obj, _) in escalations(namespace).items():
        obj["metadata"]["name"] = "bypass-" + obj["metadata"]["name"]
        await secure.apply(obj, user="alice")
        reasons[obj["metadata"]["name"]] = "InvalidSpec" if case == "token-secret" else "Forbidden"
    for name, reason in reasons.items():
        await wait_condition(cluster, namespace, name, "Failed")
        status = (await get_aw(cluster, namespace, name))["status"]
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == reason, (name, failed)
        if reason == "Forbidden":
            assert "admission webhook" in failed["message"]
    made = await cluster.akubectl(
        "get", "pods,services,networkpolicies,ingresses,pvc,secrets", "-n", namespace,
        "-l", "workload.codeflare.dev/appwrapper,workload.codeflare.dev/appwrapper!=signed",
        "-o", "name",
    )  # fmt: skip
    assert made.stdout.strip() == ""  # edited's Service went with its requeue
    await wait_condition(cluster, namespace, "signed", "Running")


async def test_rights_taken_away_while_queued_are_seen_at_dispatch(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    fake_nodes.add("n1", cpu="1")
    # Answers not reused: the right is taken away a moment before the dispatch.
    await run_dispatcher(**secure.settings(), access_review_cache_seconds=0)
    big = {"cpu": "1"}
    first = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "first"}, **pod_template(big)}
    second = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "second"},
        **pod_template(big),
    }
    await secure.apply(appwrapper("first", first), user="bob")
    await wait_condition(cluster, namespace, "first", "Running")
    await secure.apply(appwrapper("second", second), user="bob")  # waits: no room

    async def waits() -> bool:
        status = (await get_aw(cluster, namespace, "second")).get("status") or {}
        return "InsufficientResources" in json.dumps(status)

    await async_wait_until(waits, timeout=30, what="second waits for room")
    cluster.kubectl("delete", "rolebinding", "workloads-bob", "-n", namespace)
    await cluster.akubectl("delete", "aw", "first", "-n", namespace, "--timeout=60s")
    await wait_condition(cluster, namespace, "second", "Failed")
    status = (await get_aw(cluster, namespace, "second"))["status"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Forbidden"
    assert (
        f"item 0 (Pod/second): bob may not create pods in namespace {namespace}"
        in (failed["message"])
    )
    pods = await cluster.akubectl("get", "pod", "second", "-n", namespace, check=False)
    assert pods.returncode != 0  # never created


async def test_webhook_down_fails_closed_and_comes_back(
    cluster: Any, namespace: str, fake_nodes: Any, secure: Secure
) -> None:
    fake_nodes.add("n1")
    config = dispatcher_config(cluster, fake_nodes, **secure.settings())
    async with running(config):
        await secure.apply(appwrapper("before", service("before")), user="bob")
    # Stopped: nobody answers, and failurePolicy Fail refuses the apply with the cause.
    message = await secure.refused(appwrapper("while-down", service("down")), user="bob")
    assert "failed calling webhook" in message
    assert f"127.0.0.1:{secure.port}" in message
    async with running(config):
        await secure.apply(appwrapper("after", service("after")), user="bob")
        await wait_condition(cluster, namespace, "after", "Running")
        await cluster.akubectl("delete", "aw", "--all", "-n", namespace, "--timeout=60s")


def served_serial(port: int) -> int:
    """The serial number of the certificate the webhook serves now."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


async def test_certificate_rotation_fails_no_admission(
    cluster: Any, namespace: str, fake_nodes: Any, run_dispatcher: Any, secure: Secure
) -> None:
    """A serving certificate valid 12 s, renewed at half-life, while AppWrappers are applied
    one after another: every apply is admitted across at least two renewals."""
    fake_nodes.add("n1")
    await run_dispatcher(**secure.settings(cert_validity_seconds=12, rotate_when_left=0.5))
    serials = [await asyncio.to_thread(served_serial, secure.port)]
    applied = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while len(set(serials)) < 3 and loop.time() < deadline:
        await secure.apply(appwrapper(f"aw-{applied}", service(f"s-{applied}")), user="bob")
        applied += 1
        serials.append(await asyncio.to_thread(served_serial, secure.port))
    assert len(set(serials)) >= 3, f"the certificate was renewed {len(set(serials)) - 1} times"
    listed = await cluster.akubectl("get", "aw", "-n", namespace, "-o", "name")
    assert len(listed.stdout.split()) == applied
