"""The Helm chart (charts/appwrapper-dispatcher) with the real helm binary.

Needs helm, built by `make chart-test` (testenv/build-helm.sh, from the Go module proxy),
which names it in APPWRAPPER_HELM; without it every test here is skipped, with that said (so
`make test` runs none of them, whatever is in the cache: helm is a tool users run, and its
tests belong to `make chart-test`). tests/unit/test_chart.py checks what
needs no helm (the schema is up to date, the CRDs are copies).

- `helm template` agrees with manifests/ for the release `appwrapper-dispatcher` in
  appwrapper-system: the same names, the same rights (every rule expanded to
  group/resource/verb/name), the same webhook configurations, status policy, settings,
  container and, with the switches, the same cert-manager and NetworkPolicy objects.
- The switches and the generated RBAC: the wrapped kinds' rules follow config.allowed_kinds;
  quotas.enabled leaves out the quota CRDs and every right on them; values the schema or the
  chart refuses fail the render with the key named.
- Installed into the local control plane (`helm install`, replicas 0: no image can be pulled
  here), the chart's ServiceAccount, RBAC and settings run the dispatcher from the checkout:
  its webhook signs the sample job-completion AppWrapper, which Completes; the chart's status
  policy refuses status written by anyone else; no request of the dispatcher is denied.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import Config
from dispatcher.core.gatekeeping import USER
from dispatcher.testing.localcluster import LocalCluster, free_port
from dispatcher.testing.waits import wait_until
from tests.e2e.conftest import wait_established
from tests.e2e.test_manifests import (
    DispatcherProcess,
    http_get,
    port_open,
    service_account_kubeconfig,
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "appwrapper-dispatcher"
MANIFESTS = REPO / "manifests"
HELM = Path(os.environ.get("APPWRAPPER_HELM", "/nonexistent/helm"))
RELEASE = "appwrapper-dispatcher"
SYSTEM_NAMESPACE = "appwrapper-system"

pytestmark = pytest.mark.skipif(
    not HELM.exists(),
    reason="helm is not named (APPWRAPPER_HELM): `make chart-test` builds it and runs these",
)

Docs = list[dict[str, Any]]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(*sets: str, release: str = RELEASE, namespace: str = SYSTEM_NAMESPACE) -> Docs:
    """`helm template` of the chart with `--set` values, as objects."""
    argv = ["template", release, str(CHART), "-n", namespace]
    for value in sets:
        argv += ["--set", value]
    return [doc for doc in yaml.safe_load_all(helm(*argv).stdout) if doc]


def manifest(*paths: str) -> Docs:
    return [
        doc for path in paths for doc in yaml.safe_load_all((MANIFESTS / path).read_text()) if doc
    ]


def one(docs: Docs, kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def names(docs: Docs) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def grants(role: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """Every (group, resource, verb, name) a role's rules allow ("" name: any)."""
    return {
        (group, resource, verb, name)
        for rule in role.get("rules") or []
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [""]
    }


def settings(docs: Docs, configmap: str = "appwrapper-dispatcher-config") -> Config:
    return Config.model_validate(
        yaml.safe_load(one(docs, "ConfigMap", configmap)["data"]["config.yaml"])
    )


def container(docs: Docs) -> dict[str, Any]:
    spec = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    (found,) = spec["containers"]
    return dict(found)


@pytest.fixture(scope="module")
def rendered() -> Docs:
    return render()


# -- helm template agrees with manifests/ -------------------------------------------------


def test_lint_passes_with_every_switch() -> None:
    for sets in (
        [],
        [
            "certManager.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "networkPolicy.enabled=true",
            "networkPolicy.apiServerCIDRs={10.0.0.1/32}",
        ],
        ["quotas.enabled=false", "userRoles.enabled=false", "statusPolicy.enabled=false"],
    ):
        argv = ["lint", "--strict", str(CHART)]
        for value in sets:
            argv += ["--set", value]
        assert "0 chart(s) failed" in helm(*argv).stdout


def test_same_objects_as_the_manifests(rendered: Docs) -> None:
    shipped = manifest(
        "serviceaccount.yaml",
        "rbac.yaml",
        "user-roles.yaml",
        "config.yaml",
        "deployment.yaml",
        "poddisruptionbudget.yaml",
        "service.yaml",
        "metrics-reader.yaml",
        "webhook.yaml",
        "status-policy.yaml",
    )
    quota_crds = {
        ("CustomResourceDefinition", f"{plural}.workload.codeflare.dev")
        for plural in ("clusterappqueues", "appqueues", "appcohorts", "appflavors")
    }
    # The namespace is helm's (--create-namespace); the CRDs come from crds/ and quota-crds/.
    assert names(rendered) == names(shipped) | quota_crds
    for doc in rendered:
        if doc["kind"] != "CustomResourceDefinition" and "namespace" in doc["metadata"]:
            assert doc["metadata"]["namespace"] == SYSTEM_NAMESPACE, doc["metadata"]


def test_same_rights_as_the_manifests(rendered: Docs) -> None:
    shipped = manifest("rbac.yaml", "user-roles.yaml")
    for doc in shipped:
        kind, name = doc["kind"], doc["metadata"]["name"]
        ours = one(rendered, kind, name)
        if kind in ("ClusterRole", "Role"):
            assert grants(ours) == grants(doc), f"{kind} {name}"
            wanted = {k: v for k, v in doc["metadata"]["labels"].items() if "aggregate" in k}
            assert {k: v for k, v in ours["metadata"]["labels"].items() if "aggregate" in k} == (
                wanted
            ), name
        else:
            assert (ours["roleRef"], ours["subjects"]) == (doc["roleRef"], doc["subjects"])


def test_same_webhook_and_status_policy_as_the_manifests(rendered: Docs) -> None:
    for doc in manifest("webhook.yaml", "status-policy.yaml"):
        ours = one(rendered, doc["kind"], doc["metadata"]["name"])
        if "webhooks" in doc:
            assert ours["webhooks"] == doc["webhooks"], doc["kind"]
            continue
        spec, wanted = dict(ours["spec"]), dict(doc["spec"])
        if doc["kind"] == "Service":
            # The release's instance label besides the name: two releases never select
            # each other's pods.
            selector = spec.pop("selector")
            assert selector == {
                **wanted.pop("selector"),
                "app.kubernetes.io/instance": RELEASE,
            }
        assert spec == wanted, doc["kind"]


def test_same_settings_and_container_as_the_manifests(rendered: Docs) -> None:
    (configmap,) = manifest("config.yaml")
    assert settings(rendered) == settings([configmap])
    (deployment,) = manifest("deployment.yaml")
    ours, theirs = container(rendered), container([deployment])
    for key in ("args", "ports", "livenessProbe", "readinessProbe", "resources"):
        assert ours[key] == theirs[key], key
    assert (ours["securityContext"], ours["volumeMounts"]) == (
        theirs["securityContext"],
        theirs["volumeMounts"],
    )
    pod = one(rendered, "Deployment", RELEASE)["spec"]
    assert pod["replicas"] == deployment["spec"]["replicas"] == 2
    assert (
        pod["template"]["spec"]["securityContext"]
        == (deployment["spec"]["template"]["spec"]["securityContext"])
    )


def test_cert_manager_switch_is_the_component(rendered: Docs) -> None:
    docs = render("certManager.enabled=true")
    component = manifest("cert-manager/certificate.yaml")
    for doc in component:
        assert one(docs, doc["kind"], doc["metadata"]["name"])["spec"] == doc["spec"]
    (patch,) = manifest("cert-manager/deployment.yaml")
    wanted = container([patch])
    ours = container(docs)
    assert ours["args"] == wanted["args"]
    assert wanted["volumeMounts"][0] in ours["volumeMounts"]
    pod = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    assert patch["spec"]["template"]["spec"]["volumes"][0] in pod["volumes"]
    assert pod["securityContext"]["fsGroup"] == 65532
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = one(docs, kind, RELEASE)["metadata"]["annotations"]
        assert annotations == {
            "cert-manager.io/inject-ca-from": f"{SYSTEM_NAMESPACE}/appwrapper-dispatcher-webhook"
        }
    assert settings(docs).webhook.cert_dir == "/etc/appwrapper-dispatcher-webhook"
    assert settings(rendered).webhook.cert_dir is None
    assert not {"Issuer", "Certificate"} & {d["kind"] for d in rendered}


def test_network_policy_switch_is_the_component(rendered: Docs) -> None:
    docs = render("networkPolicy.enabled=true", "networkPolicy.apiServerCIDRs={10.0.0.1/32}")
    (shipped,) = manifest("network-policy/networkpolicy.yaml")
    shipped["spec"]["ingress"][0]["from"] = [{"ipBlock": {"cidr": "10.0.0.1/32"}}]
    shipped["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] = RELEASE
    assert one(docs, "NetworkPolicy", "appwrapper-dispatcher-webhook")["spec"] == (shipped["spec"])
    assert "NetworkPolicy" not in {d["kind"] for d in rendered}


def test_service_monitor_selects_the_metrics_service() -> None:
    docs = render("metrics.serviceMonitor.enabled=true")
    monitor = one(docs, "ServiceMonitor", RELEASE)
    selector = monitor["spec"]["selector"]["matchLabels"]
    matched = [
        d
        for d in docs
        if d["kind"] == "Service" and selector.items() <= d["metadata"]["labels"].items()
    ]
    assert [d["metadata"]["name"] for d in matched] == ["appwrapper-dispatcher-metrics"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


# -- generated RBAC and the switches ------------------------------------------------------


def wrapped_grants(docs: Docs) -> set[tuple[str, str, str, str]]:
    """The ClusterRole's rights on kinds that are not the dispatcher's own reads."""
    own = {"appwrappers", "nodes", "priorityclasses", "events", "namespaces"}
    return {
        g
        for g in grants(one(docs, "ClusterRole", RELEASE))
        if g[0] in ("", "apps", "batch", "ray.io", "kubeflow.org", "networking.k8s.io")
        and g[1] not in own
        and not (g[1] == "pods" and g[2] in ("list", "watch"))
    }


def test_rbac_follows_allowed_kinds() -> None:
    docs = render("config.allowed_kinds={Job,Secret}")
    assert settings(docs).allowed_kinds == ["Job", "Secret"]
    assert wrapped_grants(docs) == {
        *(("batch", "jobs", verb, "") for verb in ("get", "list", "watch", "create", "delete")),
        *(("", "secrets", verb, "") for verb in ("get", "create", "delete")),
    }


def test_quotas_off_leaves_out_their_crds_and_every_right() -> None:
    docs = render("quotas.enabled=false")
    assert "CustomResourceDefinition" not in {d["kind"] for d in docs}
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role"):
            resources = {g[1].split("/")[0] for g in grants(doc)}
            assert not resources & {"clusterappqueues", "appqueues", "appcohorts", "appflavors"}
    assert ("", "namespaces", "list", "") not in grants(one(docs, "ClusterRole", RELEASE))


def test_quota_crds_are_the_repositorys_and_kept_on_uninstall(rendered: Docs) -> None:
    shipped = [d for d in yaml.safe_load_all((REPO / "crds" / "queues.yaml").read_text()) if d]
    for doc in shipped:
        ours = one(rendered, "CustomResourceDefinition", doc["metadata"]["name"])
        assert ours["spec"] == doc["spec"]
        assert ours["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_another_release_names_everything_apart() -> None:
    docs = render(release="team", namespace="team-system")
    cluster_scoped = {
        d["metadata"]["name"]
        for d in docs
        if d["kind"] != "CustomResourceDefinition" and "namespace" not in d["metadata"]
    }
    assert cluster_scoped == {
        "team-appwrapper-dispatcher",
        "team-appwrapper-user",
        "team-appwrapper-admin",
        "team-appwrapper-viewer",
        "team-appwrapper-status-writers",
    }
    config = settings(docs, "team-appwrapper-dispatcher-config")
    assert (config.lease_namespace, config.webhook.namespace) == ("team-system", "team-system")
    assert config.webhook.service_name == "team-appwrapper-dispatcher-webhook"
    policy = one(docs, "ValidatingAdmissionPolicy", "team-appwrapper-status-writers")
    assert policy["spec"]["variables"] == [
        {
            "name": "writers",
            "expression": "['system:serviceaccount:team-system:team-appwrapper-dispatcher']",
        }
    ]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("config.bogus=1", "additional properties 'bogus' not allowed"),
        ("config.queue_mode=Random", "/config/queue_mode"),
        ("config.webhook.port=70000", "/config/webhook/port"),
        ("replicas=-1", "/replicas"),
        ("config.lease_name=mine", "config.lease_name is set by the chart"),
        ("config.webhook.enabled=false", "config.webhook.enabled is set by the chart"),
        ("config.leader_election=false", "config.leader_election is set by the chart"),
        ("config.allowed_kinds={MPIJob}", "add rbac.wrappedKinds.MPIJob"),
        ("networkPolicy.enabled=true", "networkPolicy.enabled needs"),
        ("statusPolicy.extraWriters={a'b}", "is not a plain username"),
        ("config.health_port=0", "config.health_port 0"),
    ],
)
def test_refused_values_name_the_key(value: str, says: str) -> None:
    result = helm("template", RELEASE, str(CHART), "--set", value, check=False)
    assert result.returncode != 0
    assert says in result.stderr


LOOKUP = (
    'lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" ""'
    ' "appwrappers.workload.codeflare.dev"'
)


def crd(served: list[str], stored: list[str]) -> dict[str, Any]:
    return {
        "spec": {"versions": [{"name": name, "served": True} for name in served]},
        "status": {"storedVersions": stored},
    }


@pytest.mark.parametrize(
    ("found", "says"),
    [
        (crd(["v1beta1"], ["v1beta1"]), ""),
        (crd(["v1beta2"], ["v1beta2"]), "has versions v1beta2 (served), v1beta2 (stored), no v1"),
        (crd(["v1beta1"], ["v1beta1", "v1beta2"]), "has versions v1beta2 (stored);"),
        (crd(["v1beta1", "v1beta2"], ["v1beta1"]), "has versions v1beta2 (served);"),
    ],
)
def test_crd_check_refuses_another_controllers_crd(
    tmp_path: Path, found: dict[str, Any], says: str
) -> None:
    # `helm template` cannot look into a cluster, and the shared test cluster's AppWrapper
    # CRD must stay ours: a copy of the chart reads the CRD from a value instead.
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    (copy / "values.schema.json").unlink()
    check = copy / "templates" / "crd-check.yaml"
    assert LOOKUP in check.read_text()
    check.write_text(check.read_text().replace(LOOKUP, ".Values.foundCrd"))
    result = helm(
        "template", RELEASE, str(copy), "--set-json", f"foundCrd={json.dumps(found)}", check=False
    )
    if says:
        assert result.returncode != 0
        assert says in result.stderr
        assert "run one AppWrapper controller per cluster" in result.stderr
    else:
        assert result.returncode == 0, result.stderr


def test_member_kubeconfig_secrets_are_readable_by_name_only() -> None:
    members = [
        {"name": "east", "kubeconfig_secret": "kc/east"},
        {"name": "west", "kubeconfig_secret": "kc/west"},
        {"name": "north", "kubeconfig_secret": "appwrapper-system/north"},
        {"name": "hub"},
    ]
    argv = ["template", RELEASE, str(CHART), "-n", SYSTEM_NAMESPACE]
    docs = [
        doc
        for doc in yaml.safe_load_all(
            helm(*argv, "--set-json", f"config.members={json.dumps(members)}").stdout
        )
        if doc
    ]
    roles = {
        d["metadata"]["namespace"]: grants(d)
        for d in docs
        if d["kind"] == "Role" and d["metadata"]["name"].endswith("-member-kubeconfigs")
    }
    assert roles == {
        "kc": {("", "secrets", "get", "east"), ("", "secrets", "get", "west")},
        "appwrapper-system": {("", "secrets", "get", "north")},
    }
    bindings = [
        d
        for d in docs
        if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-kubeconfigs")
    ]
    assert {b["metadata"]["namespace"] for b in bindings} == {"kc", "appwrapper-system"}
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": RELEASE, "namespace": SYSTEM_NAMESPACE}
        ]
    assert not [d for d in render() if d["metadata"]["name"].endswith("-member-kubeconfigs")]


def test_extra_volumes_reach_the_pods() -> None:
    volume = {"name": "client-ca", "configMap": {"name": "apiserver-webhook-client-ca"}}
    mount = {"name": "client-ca", "mountPath": "/etc/appwrapper-dispatcher-client-ca"}
    argv = ["template", RELEASE, str(CHART), "-n", SYSTEM_NAMESPACE]
    argv += ["--set-json", f"extraVolumes={json.dumps([volume])}"]
    argv += ["--set-json", f"extraVolumeMounts={json.dumps([mount])}"]
    docs = [doc for doc in yaml.safe_load_all(helm(*argv).stdout) if doc]
    pod = one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"]
    assert volume in pod["volumes"]
    assert mount in container(docs)["volumeMounts"]


def test_one_replica_may_run_without_leader_election() -> None:
    docs = render("replicas=1", "config.leader_election=false")
    assert not settings(docs).leader_election


# -- installed into the local control plane -----------------------------------------------


@pytest.fixture
def release(cluster: Any) -> Iterator[tuple[str, str]]:
    """The chart installed as release `chart-e2e` in a namespace of its own, replicas 0;
    (release namespace, full name). Uninstalled afterwards."""
    namespace = f"t-chart-{uuid.uuid4().hex[:6]}"
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig), "-n", namespace]
    try:
        # The quota CRDs may be there already, applied by other tests with kubectl: the release
        # takes them over (they are kept when it is uninstalled).
        installed = helm(
            "install",
            "chart-e2e",
            str(CHART),
            *kubeconfig,
            "--create-namespace",
            "--take-ownership",
            "--set",
            "replicas=0",
            "--wait",
            "--timeout=60s",
        )
        # NOTES.txt: how to check this release, by its names.
        assert "get lease chart-e2e-appwrapper-dispatcher" in installed.stdout, installed.stdout
        assert "bind chart-e2e-appwrapper-user" in installed.stdout, installed.stdout
        for crd in ("appwrappers", "clusterappqueues", "appqueues", "appcohorts", "appflavors"):
            wait_established(cluster, f"{crd}.workload.codeflare.dev")
        yield namespace, "chart-e2e-appwrapper-dispatcher"
    finally:
        helm("uninstall", "chart-e2e", *kubeconfig, "--wait", "--timeout=60s", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def send_webhook_here(cluster: Any, name: str, port: int, namespace: str) -> None:
    """The release's webhook configurations pointed at this machine's dispatcher (the local
    control plane has no Service network) and limited to `namespace` (they fail closed)."""
    for kind, path in (
        ("mutatingwebhookconfiguration", "/mutate-appwrapper"),
        ("validatingwebhookconfiguration", "/validate-appwrapper"),
    ):
        patch = [
            {
                "op": "replace",
                "path": "/webhooks/0/clientConfig",
                "value": {"url": f"https://127.0.0.1:{port}{path}"},
            },
            {
                "op": "add",
                "path": "/webhooks/0/namespaceSelector",
                "value": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            },
        ]
        cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(patch))


def status_write_refused(cluster: Any, namespace: str, name: str) -> str:
    """The API server's answer to an administrator writing an AppWrapper's status."""
    result = cluster.kubectl(
        "patch",
        "appwrapper",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"state":"Completed"}}',
        check=False,
    )
    return result.stderr if result.returncode != 0 else ""


@pytest.mark.cluster
def test_installed_chart_runs_the_sample(
    cluster: Any, release: tuple[str, str], tmp_path: Path
) -> None:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("the API server must reach this machine's 127.0.0.1 to call the webhook")
    system, full = release
    work = f"{system}-work"
    pool = {"appwrapper.test/pool": system}
    node = f"{system}-node"
    webhook_port, health_port = free_port(), free_port()

    # The settings as the chart installed them, but for this machine's addresses and ports
    # and this test's node pool.
    configmap = json.loads(
        cluster.kubectl("get", "configmap", f"{full}-config", "-n", system, "-o", "json").stdout
    )
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    assert (config["lease_namespace"], config["webhook"]["namespace"]) == (system, system)
    config["members"] = [{"name": "local", "node_selector": pool}]
    config["webhook"].update(host="127.0.0.1", port=webhook_port, extra_names=["127.0.0.1"])
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    kubeconfig = service_account_kubeconfig(
        cluster, tmp_path / "sa-kubeconfig", namespace=system, account=full
    )

    send_webhook_here(cluster, full, webhook_port, work)
    cluster.kubectl("create", "namespace", work)
    cluster.add_node(node, cpu="2", memory="4Gi", labels=pool)
    process = DispatcherProcess(
        [
            "run",
            "--config",
            str(config_file),
            "--kubeconfig",
            str(kubeconfig),
            "--health-port",
            str(health_port),
            "--log-format",
            "json",
        ],
        tmp_path / "dispatcher.log",
    )
    try:
        cluster.wait_nodes_ready([node])

        def ready() -> bool:
            assert process.alive(), "the dispatcher exited"
            return http_get(f"http://127.0.0.1:{health_port}/readyz")[0] == 200

        wait_until(ready, timeout=60, what="the dispatcher to lead and sync its caches")
        wait_until(lambda: port_open(webhook_port), timeout=30, what="the webhook to listen")
        # The CA written into both of the release's configurations.
        wait_until(
            lambda: all(
                cluster.kubectl(
                    "get", kind, full, "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}"
                ).stdout
                for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration")
            ),
            timeout=60,
            what="caBundle in both webhook configurations",
        )
        sample = REPO / "samples" / "job-completion.yaml"
        # The first create may come before the registration is seen: try again, as a user.
        wait_until(
            lambda: (
                cluster.kubectl("apply", "-n", work, "-f", str(sample), check=False).returncode == 0
            ),
            timeout=30,
            what="the sample applied through the webhook",
        )
        cluster.kubectl(
            "wait",
            "-n",
            work,
            "--for=condition=Completed",
            "appwrapper/job-completion",
            "--timeout=90s",
            timeout=110,
        )
        aw = json.loads(
            cluster.kubectl("get", "appwrapper", "job-completion", "-n", work, "-o", "json").stdout
        )
        assert aw["metadata"]["annotations"][USER], "no creator record from the webhook"
        # The chart's status policy names the chart's ServiceAccount alone.
        refused = wait_until(
            lambda: status_write_refused(cluster, work, "job-completion"),
            timeout=30,
            what="an administrator's status write refused",
        )
        assert "is written only by the dispatcher" in refused
        cluster.kubectl(
            "delete", "appwrapper", "job-completion", "-n", work, "--timeout=60s", timeout=90
        )
    except BaseException:
        process.stop()
        print(f"---- dispatcher output ----\n{process.output()}")
        raise
    finally:
        code = process.stop()
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", work, "--wait=false", check=False)
    output = process.output()
    if code != 0 or "forbidden" in output.lower():
        print(f"---- dispatcher output (exit {code}) ----\n{output}")
    assert code == 0, f"the dispatcher exited with {code}"
    assert "forbidden" not in output.lower(), "the dispatcher was denied a request"
