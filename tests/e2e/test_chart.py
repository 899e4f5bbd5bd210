"""The Helm chart (charts/appwrapper-dispatcher) with the real helm binary.

Needs helm, built by `make test` and `make chart-test` (testenv/build-helm.sh, from the Go
module proxy), which name it in APPWRAPPER_HELM; without it every test here is skipped, with
that said, and fails under CI (the `tier` mark, tests/conftest.py). tests/unit/test_chart.py
checks what needs no helm (the schema is up to date, the CRDs are copies).

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

import contextlib
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
from dispatcher.core.crdforms import converting, readable
from dispatcher.core.gatekeeping import USER
from dispatcher.kube.preflight import APPWRAPPER_CRD
from dispatcher.testing.converter import Converter, crd_calling
from dispatcher.testing.localcluster import LocalCluster, free_port
from dispatcher.testing.waits import holds_for, wait_until
from tests.e2e.conftest import CRD, apply_crd, wait_established
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

pytestmark = pytest.mark.tier(
    HELM.exists(), "helm is not named (APPWRAPPER_HELM): `make test` builds it and names it"
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
    """Every (group, resource, verb, name) a role's rules allow ("" name: any); a
    non-resource URL (the metrics reader's /metrics) as ("", URL, verb, "")."""
    return {
        (group, resource, verb, name)
        for rule in role.get("rules") or []
        for group in rule.get("apiGroups") or [""]
        for resource in rule.get("resources") or rule["nonResourceURLs"]
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
    crds = {
        ("CustomResourceDefinition", f"{plural}.workload.codeflare.dev")
        for plural in ("appwrappers", "clusterappqueues", "appqueues", "appcohorts", "appflavors")
    }
    # The namespace is helm's (--create-namespace); the CRDs are crd-files/ (kubectl applies
    # crds/ before manifests/);
    # metrics.secure (on by default, off in manifests/) adds the metrics certificate.
    secure_only = {("Secret", f"{RELEASE}-metrics-tls")}
    assert names(rendered) - names(render("metrics.secure=false")) == secure_only
    assert names(rendered) == names(shipped) | crds | secure_only
    for doc in rendered:
        if doc["kind"] != "CustomResourceDefinition" and "namespace" in doc["metadata"]:
            assert doc["metadata"]["namespace"] == SYSTEM_NAMESPACE, doc["metadata"]


def test_the_appwrapper_crd_converts_through_the_releases_service() -> None:
    """The chart's AppWrapper CRD is crds/appwrapper.yaml in its converting form (the
    manifests' crd-patches/conversion.json, for this release's Service), kept on uninstall; with
    cert-manager, its CA injected from the release's Certificate."""
    shipped = yaml.safe_load((REPO / "crds" / "appwrapper.yaml").read_text())
    for manager in ("false", "true"):
        (crd,) = [
            d
            for d in render(f"certManager.enabled={manager}", release="team", namespace="ops")
            if d["metadata"]["name"] == APPWRAPPER_CRD
        ]
        service = {"namespace": "ops", "name": "team-appwrapper-dispatcher-webhook"}
        wanted = converting(shipped, {"service": {**service, "path": "/convert", "port": 443}})
        assert crd["spec"] == wanted["spec"]
        annotations = crd["metadata"]["annotations"]
        assert annotations["helm.sh/resource-policy"] == "keep"
        injected = annotations.get("cert-manager.io/inject-ca-from")
        assert injected == ("ops/team-appwrapper-dispatcher-webhook" if manager == "true" else None)


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


def test_same_settings_and_container_as_the_manifests() -> None:
    # manifests/ serve /metrics over plain HTTP: compared with metrics.secure off.
    plain = render("metrics.secure=false")
    (configmap,) = manifest("config.yaml")
    assert settings(plain) == settings([configmap])
    (deployment,) = manifest("deployment.yaml")
    ours, theirs = container(plain), container([deployment])
    for key in ("args", "ports", "livenessProbe", "readinessProbe", "resources"):
        assert ours[key] == theirs[key], key
    assert (ours["securityContext"], ours["volumeMounts"]) == (
        theirs["securityContext"],
        theirs["volumeMounts"],
    )
    pod = one(plain, "Deployment", RELEASE)["spec"]
    assert pod["replicas"] == deployment["spec"]["replicas"] == 2
    # The chart fixes no user or group (OpenShift assigns them); manifests/ do.
    shipped = dict(deployment["spec"]["template"]["spec"]["securityContext"])
    assert (shipped.pop("runAsUser"), shipped.pop("runAsGroup")) == (65532, 65532)
    assert pod["template"]["spec"]["securityContext"] == shipped


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
    # Readable by all (0444) instead of 0440 with manifests/' fsGroup: the chart fixes no
    # group (OpenShift assigns it).
    volume = patch["spec"]["template"]["spec"]["volumes"][0]
    volume["secret"]["defaultMode"] = 0o444
    assert volume in pod["volumes"]
    assert "fsGroup" not in pod["securityContext"]
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
    # metrics.secure: HTTPS checked against the chart's CA for the Service's name, with
    # Prometheus' own token.
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["scheme"] == "https"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {
        "serverName": f"{RELEASE}-metrics.{SYSTEM_NAMESPACE}.svc",
        "ca": {"secret": {"name": f"{RELEASE}-metrics-tls", "key": "ca.crt"}},
    }
    plain = render("metrics.serviceMonitor.enabled=true", "metrics.secure=false")
    endpoint = one(plain, "ServiceMonitor", RELEASE)["spec"]["endpoints"][0]
    assert not {"scheme", "tlsConfig", "bearerTokenFile"} & set(endpoint)


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
    # Every wrapped kind is listed and watched, label-selected (values.yaml, rbac).
    verbs = ("get", "list", "watch", "create", "delete")
    assert wrapped_grants(docs) == {
        *(("batch", "jobs", verb, "") for verb in verbs),
        *(("", "secrets", verb, "") for verb in verbs),
    }


def test_quotas_off_leaves_out_their_crds_and_every_right() -> None:
    docs = render("quotas.enabled=false")
    crds = {name for kind, name in names(docs) if kind == "CustomResourceDefinition"}
    assert crds <= {"appwrappers.workload.codeflare.dev"}
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
        "team-appwrapper-dispatcher-metrics-reader",
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


def render_json(**values: Any) -> Docs:
    """`helm template` with `--set-json` values (lists and objects)."""
    argv = ["template", RELEASE, str(CHART), "-n", SYSTEM_NAMESPACE]
    for key, value in values.items():
        argv += ["--set-json", f"{key}={json.dumps(value)}"]
    return [doc for doc in yaml.safe_load_all(helm(*argv).stdout) if doc]


def pod_spec(docs: Docs) -> dict[str, Any]:
    return dict(one(docs, "Deployment", RELEASE)["spec"]["template"]["spec"])


def test_security_contexts_fix_no_user_and_are_the_values(rendered: Docs) -> None:
    # The image's USER is numeric (tests/unit/test_chart.py), so runAsNonRoot holds without
    # runAsUser; OpenShift's restricted SCC assigns the user and group.
    assert pod_spec(rendered)["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container(rendered)["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # Helm merges a value into the default: null takes a key out.
    pod_context = {"runAsUser": 1000, "fsGroup": 2000, "seccompProfile": None}
    docs = render_json(podSecurityContext=pod_context, securityContext={"privileged": False})
    assert pod_spec(docs)["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "fsGroup": 2000,
    }
    assert container(docs)["securityContext"]["privileged"] is False


def test_probes_are_the_values_with_https_for_secure_metrics(rendered: Docs) -> None:
    ours = container(rendered)
    assert ours["livenessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": "http",
        "scheme": "HTTPS",
    }
    assert ours["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert "startupProbe" not in ours
    startup = {"httpGet": {"path": "/healthz", "port": "http"}, "failureThreshold": 30}
    # Helm merges a value into the default: another handler takes httpGet out with null.
    liveness = {"tcpSocket": {"port": "http"}, "httpGet": None, "initialDelaySeconds": 1}
    docs = render_json(startupProbe=startup, livenessProbe=liveness)
    assert container(docs)["startupProbe"]["httpGet"]["scheme"] == "HTTPS"
    probe = container(docs)["livenessProbe"]
    assert (probe["tcpSocket"], probe["initialDelaySeconds"]) == ({"port": "http"}, 1)
    assert "httpGet" not in probe
    plain = container(render("metrics.secure=false"))
    assert "scheme" not in plain["livenessProbe"]["httpGet"]


def test_spread_strategy_env_and_args_reach_the_deployment(rendered: Docs) -> None:
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": RELEASE}},
        }
    ]
    strategy = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    env = [{"name": "PYTHONTRACEMALLOC", "value": "1"}]
    docs = render_json(
        topologySpreadConstraints=spread,
        strategy=strategy,
        extraEnv=env,
        extraArgs=["--log-level", "debug"],
    )
    deployment = one(docs, "Deployment", RELEASE)["spec"]
    assert deployment["strategy"] == strategy
    assert pod_spec(docs)["topologySpreadConstraints"] == spread
    assert container(docs)["env"][-1] == env[0]
    assert container(docs)["args"][-2:] == ["--log-level", "debug"]
    default = one(rendered, "Deployment", RELEASE)["spec"]
    assert "strategy" not in default
    assert "topologySpreadConstraints" not in pod_spec(rendered)


def test_service_account_name_is_followed_and_create_false_makes_none() -> None:
    sets = ("serviceAccount.create=false", "serviceAccount.name=platform-sa")
    docs = render(*sets, "config.members[0].name=east", "config.members[0].kubeconfig_secret=kc/e")
    assert not [d for d in docs if d["kind"] == "ServiceAccount"]
    assert pod_spec(docs)["serviceAccountName"] == "platform-sa"
    bindings = [d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert {b["metadata"]["name"] for b in bindings} >= {
        RELEASE,
        f"{RELEASE}-leader-election",
        f"{RELEASE}-webhook",
        f"{RELEASE}-member-kubeconfigs",
    }
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "platform-sa", "namespace": SYSTEM_NAMESPACE}
        ], binding["metadata"]["name"]
    policy = one(docs, "ValidatingAdmissionPolicy", "appwrapper-status-writers")
    assert "system:serviceaccount:appwrapper-system:platform-sa" in str(policy["spec"])
    made = render("serviceAccount.name=mine")
    assert names(made) >= {("ServiceAccount", "mine")}
    result = helm(
        "template", RELEASE, str(CHART), "--set", "serviceAccount.create=false", check=False
    )
    assert result.returncode != 0
    assert "serviceAccount.create false needs serviceAccount.name" in result.stderr


def test_cert_manager_issuer_ref_replaces_the_chart_issuer() -> None:
    own = render("certManager.enabled=true")
    assert one(own, "Issuer", f"{RELEASE}-selfsigned")["spec"] == {"selfSigned": {}}
    for name in (f"{RELEASE}-webhook", f"{RELEASE}-metrics"):
        issuer = one(own, "Certificate", name)["spec"]["issuerRef"]
        assert issuer == {"kind": "Issuer", "name": f"{RELEASE}-selfsigned"}
    ref = {"kind": "ClusterIssuer", "name": "corp-ca", "group": "cert-manager.io"}
    docs = render_json(**{"certManager.enabled": True, "certManager.issuerRef": ref})
    assert "Issuer" not in {d["kind"] for d in docs}
    for name in (f"{RELEASE}-webhook", f"{RELEASE}-metrics"):
        assert one(docs, "Certificate", name)["spec"]["issuerRef"] == ref


def test_secure_metrics_are_https_with_reviews_and_a_certificate(rendered: Docs) -> None:
    config = settings(rendered).metrics
    mounted = "/etc/appwrapper-dispatcher-metrics"
    assert (config.auth, config.cert_file, config.key_file) == (
        "kubernetes",
        f"{mounted}/tls.crt",
        f"{mounted}/tls.key",
    )
    mount = {"name": "metrics-cert", "mountPath": mounted, "readOnly": True}
    assert mount in container(rendered)["volumeMounts"]
    volume = next(v for v in pod_spec(rendered)["volumes"] if v["name"] == "metrics-cert")
    secret = one(rendered, "Secret", f"{RELEASE}-metrics-tls")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    service = one(rendered, "Service", f"{RELEASE}-metrics")
    assert service["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    # With cert-manager, a Certificate for the metrics Service's names instead.
    docs = render("certManager.enabled=true")
    certificate = one(docs, "Certificate", f"{RELEASE}-metrics")["spec"]
    assert certificate["secretName"] == f"{RELEASE}-metrics-tls"
    assert f"{RELEASE}-metrics.{SYSTEM_NAMESPACE}.svc" in certificate["dnsNames"]
    assert "Secret" not in {d["kind"] for d in docs}
    # Plain by choice: config.metrics as given, no certificate.
    plain = render("metrics.secure=false")
    assert settings(plain).metrics.cert_file is None
    assert settings(plain).metrics.auth == "none"
    assert "metrics-cert" not in {v["name"] for v in pod_spec(plain)["volumes"]}
    refused = helm(
        "template", RELEASE, str(CHART), "--set", "config.metrics.auth=none", check=False
    )
    assert "config.metrics.auth is set by the chart" in refused.stderr


def test_metrics_readers_are_bound_to_the_metrics_reader() -> None:
    readers = [{"name": "prometheus-k8s", "namespace": "monitoring"}]
    docs = render_json(**{"metrics.readerServiceAccounts": readers})
    binding = one(docs, "ClusterRoleBinding", f"{RELEASE}-metrics-reader")
    assert binding["roleRef"]["name"] == f"{RELEASE}-metrics-reader"
    assert binding["subjects"] == [{"kind": "ServiceAccount", **readers[0]}]
    reader = one(docs, "ClusterRole", f"{RELEASE}-metrics-reader")
    assert grants(reader) == {("", "/metrics", "get", "")}


def test_pod_monitor_scrapes_the_pods_with_a_token_secret() -> None:
    token = {"name": "prometheus-token", "key": "token"}
    docs = render_json(
        **{"metrics.podMonitor.enabled": True, "metrics.podMonitor.bearerTokenSecret": token}
    )
    monitor = one(docs, "PodMonitor", RELEASE)["spec"]
    assert monitor["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": RELEASE,
        "app.kubernetes.io/instance": RELEASE,
    }
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["scheme"]) == ("http", "https")
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": token}
    assert endpoint["tlsConfig"]["ca"]["secret"] == {
        "name": f"{RELEASE}-metrics-tls",
        "key": "ca.crt",
    }
    plain = render("metrics.podMonitor.enabled=true", "metrics.secure=false")
    (endpoint,) = one(plain, "PodMonitor", RELEASE)["spec"]["podMetricsEndpoints"]
    assert not {"scheme", "authorization"} & set(endpoint)
    result = helm(
        "template", RELEASE, str(CHART), "--set", "metrics.podMonitor.enabled=true", check=False
    )
    assert "needs metrics.podMonitor.bearerTokenSecret" in result.stderr


def test_prometheus_rule_holds_the_recommended_alert() -> None:
    docs = render("metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.r=x")
    rule = one(docs, "PrometheusRule", RELEASE)
    assert rule["metadata"]["labels"]["r"] == "x"
    (group,) = rule["spec"]["groups"]
    (alert,) = group["rules"]
    # docs/operations.md: "Alert on a growing inadmissible".
    inadmissible = 'appwrapper_dispatcher_pending_workloads{status="inadmissible"}'
    assert alert["expr"] == (
        f"sum by (cluster_queue) ({inadmissible}) > sum by (cluster_queue) ({inadmissible}"
        " offset 1h)"
    )
    assert (alert["for"], alert["labels"]) == ("15m", {"severity": "warning"})
    assert "{{ $labels.cluster_queue }}" in alert["annotations"]["summary"]
    assert "PrometheusRule" not in {d["kind"] for d in render()}


def test_grafana_dashboard_is_manifests_dashboard_for_the_sidecar() -> None:
    docs = render("grafanaDashboard.enabled=true", "grafanaDashboard.namespace=grafana")
    configmap = one(docs, "ConfigMap", f"{RELEASE}-dashboard")
    assert configmap["metadata"]["namespace"] == "grafana"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((MANIFESTS / "grafana" / "dispatcher-dashboard.json").read_text())
    assert json.loads(configmap["data"]["appwrapper-dispatcher.json"]) == shipped
    relabelled = render(
        "grafanaDashboard.enabled=true",
        "grafanaDashboard.labels.grafana_dashboard=null",
        "grafanaDashboard.labels.dashboards=batch",
    )
    labels = one(relabelled, "ConfigMap", f"{RELEASE}-dashboard")["metadata"]["labels"]
    assert labels["dashboards"] == "batch"
    assert "grafana_dashboard" not in labels


def test_network_policy_lets_the_api_server_reach_the_visibility_api() -> None:
    cidrs = ("networkPolicy.enabled=true", "networkPolicy.apiServerCIDRs={10.0.0.1/32}")
    docs = render(*cidrs, "config.visibility.enabled=true")
    ingress = one(docs, "NetworkPolicy", f"{RELEASE}-webhook")["spec"]["ingress"]
    assert {
        "ports": [{"port": "visibility", "protocol": "TCP"}],
        "from": [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
    } in ingress
    assert "visibility" in {p["name"] for p in container(docs)["ports"]}
    without = one(render(*cidrs), "NetworkPolicy", f"{RELEASE}-webhook")["spec"]["ingress"]
    assert len(without) == 2


# -- installed into the local control plane -----------------------------------------------

# The chart as it last installed before this one (0.1.0, before v1beta2: its own CRD in
# crds/); `helm upgrade` from it is a test.
PREVIOUS_CHART = "f469773^"
V1BETA1 = "appwrappers.v1beta1.workload.codeflare.dev"
V1BETA2 = "appwrappers.v1beta2.workload.codeflare.dev"
READABLE_PATCH_LINE = "kubectl patch crd appwrappers.workload.codeflare.dev --type=json -p "


def install(cluster: Any, name: str, chart: Path, namespace: str, *more: str) -> str:
    """`helm install|upgrade --install` of `chart` as release `name`, replicas 0 (no image can
    be pulled here); its NOTES. The quota CRDs and the AppWrapper CRD may be there already,
    applied by other tests with kubectl: the release takes them over."""
    return helm(
        "upgrade",
        "--install",
        name,
        str(chart),
        "--kubeconfig",
        str(cluster.kubeconfig),
        "-n",
        namespace,
        "--create-namespace",
        "--take-ownership",
        "--set",
        "replicas=0",
        "--wait",
        "--timeout=60s",
        *more,
    ).stdout


@pytest.fixture
def release(cluster: Any, converter: Converter) -> Iterator[tuple[str, str]]:
    """The chart installed as release `chart-e2e` in a namespace of its own, replicas 0;
    (release namespace, full name). Uninstalled afterwards, and the AppWrapper CRD given back
    to the session's converter for the tests that follow."""
    namespace = f"t-chart-{uuid.uuid4().hex[:6]}"
    try:
        notes = install(cluster, "chart-e2e", CHART, namespace)
        # NOTES.txt: how to check this release, by its names.
        assert "get lease chart-e2e-appwrapper-dispatcher" in notes, notes
        assert "bind chart-e2e-appwrapper-user" in notes, notes
        for crd in ("appwrappers", "clusterappqueues", "appqueues", "appcohorts", "appflavors"):
            wait_established(cluster, f"{crd}.workload.codeflare.dev")
        yield namespace, "chart-e2e-appwrapper-dispatcher"
    finally:
        uninstall(cluster, "chart-e2e", namespace)
        apply_crd(cluster, crd_calling(CRD, converter.url, converter.ca_bundle))


def uninstall(cluster: Any, name: str, namespace: str) -> None:
    helm(
        "uninstall",
        name,
        "--kubeconfig",
        str(cluster.kubeconfig),
        "-n",
        namespace,
        "--wait",
        "--timeout=60s",
        check=False,
    )
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def send_webhook_here(cluster: Any, name: str, port: int, namespace: str) -> None:
    """The release's webhook configurations and the CRD's conversion pointed at this
    machine's dispatcher (the local control plane has no Service network); the webhooks
    limited to `namespace` (they fail closed)."""
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
    to_here = [
        {
            "op": "replace",
            "path": "/spec/conversion/webhook/clientConfig",
            "value": {"url": f"https://127.0.0.1:{port}/convert"},
        }
    ]
    if converts(cluster):
        cluster.kubectl("patch", "crd", APPWRAPPER_CRD, "--type=json", "-p", json.dumps(to_here))


def send_webhook_back(cluster: Any, name: str, namespace: str) -> None:
    """The release's webhook configurations calling its Service again, as the chart made them."""
    for kind, path in (
        ("mutatingwebhookconfiguration", "/mutate-appwrapper"),
        ("validatingwebhookconfiguration", "/validate-appwrapper"),
    ):
        service = {"namespace": namespace, "name": f"{name}-webhook", "path": path, "port": 443}
        patch = [
            {"op": "replace", "path": "/webhooks/0/clientConfig", "value": {"service": service}}
        ]
        cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(patch))


def converts(cluster: Any) -> bool:
    """Whether the AppWrapper CRD is in its converting form (core/crdforms.py)."""
    path = "jsonpath={.spec.conversion.strategy}"
    return bool(cluster.kubectl("get", "crd", APPWRAPPER_CRD, "-o", path).stdout == "Webhook")


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


@contextlib.contextmanager
def dispatcher_of(
    cluster: Any, system: str, full: str, work: str, tmp_path: Path, *, its_rbac: bool = True
) -> Iterator[DispatcherProcess]:
    """The dispatcher run from the checkout with the release's ServiceAccount and settings
    (for this machine's addresses and ports and the node pool `work`), its webhook and
    conversion reached by the API server, its CA written; stopped after, and proven never
    denied a request where the release is this chart's (`its_rbac`: an older chart's rules
    lack rights this dispatcher asks for, and it carries on without them)."""
    pool = {"appwrapper.test/pool": work}
    webhook_port, health_port = free_port(), free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    configmap = json.loads(
        cluster.kubectl("get", "configmap", f"{full}-config", "-n", system, "-o", "json").stdout
    )
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    assert (config["lease_namespace"], config["webhook"]["namespace"]) == (system, system)
    config["members"] = [{"name": "local", "node_selector": pool}]
    config["webhook"].update(host="127.0.0.1", port=webhook_port, extra_names=["127.0.0.1"])
    # The metrics certificate is a Secret mounted into the pod; there is none on this machine.
    for key in ("cert_file", "key_file"):
        (config.get("metrics") or {}).pop(key, None)
    config_file = tmp_path / f"config-{webhook_port}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    kubeconfig = service_account_kubeconfig(
        cluster, tmp_path / f"sa-kubeconfig-{webhook_port}", namespace=system, account=full
    )
    send_webhook_here(cluster, full, webhook_port, work)
    process = DispatcherProcess(
        [
            *("run", "--config", str(config_file), "--kubeconfig", str(kubeconfig)),
            *("--health-port", str(health_port), "--log-format", "json"),
        ],
        tmp_path / f"dispatcher-{webhook_port}.log",
    )
    try:

        def ready() -> bool:
            assert process.alive(), "the dispatcher exited"
            return http_get(f"http://127.0.0.1:{health_port}/readyz")[0] == 200

        wait_until(ready, timeout=60, what="the dispatcher to lead and sync its caches")
        wait_until(lambda: port_open(webhook_port), timeout=30, what="the webhook to listen")
        # The CA written into both of the release's configurations and the CRD's conversion.
        paths = {
            "mutatingwebhookconfiguration": "{.webhooks[0].clientConfig.caBundle}",
            "validatingwebhookconfiguration": "{.webhooks[0].clientConfig.caBundle}",
            "crd": "{.spec.conversion.webhook.clientConfig.caBundle}",
        }
        names = {"crd": APPWRAPPER_CRD}
        if not converts(cluster):  # the previous chart's: nothing to convert, no CA there
            del paths["crd"]
        wait_until(
            lambda: all(
                cluster.kubectl("get", kind, names.get(kind, full), "-o", f"jsonpath={path}").stdout
                for kind, path in paths.items()
            ),
            timeout=60,
            what="caBundle in both webhook configurations and the CRD's conversion",
        )
        yield process
    except BaseException:
        process.stop()
        print(f"---- dispatcher output ----\n{process.output()}")
        raise
    code = process.stop()
    output = process.output()
    if code != 0 or "forbidden" in output.lower():
        print(f"---- dispatcher output (exit {code}) ----\n{output}")
    assert code == 0, f"the dispatcher exited with {code}"
    if its_rbac:
        assert "forbidden" not in output.lower(), "the dispatcher was denied a request"


def apply_as_user(cluster: Any, work: str, path: Path) -> None:
    """`kubectl apply` of a sample; the first may come before the webhook registration is
    seen: tried again, as a user would."""
    wait_until(
        lambda: cluster.kubectl("apply", "-n", work, "-f", str(path), check=False).returncode == 0,
        timeout=30,
        what=f"{path.name} applied through the webhook",
    )


def node_pool(cluster: Any, work: str, cpu: str) -> str:
    node = f"{work}-node"
    cluster.kubectl("create", "namespace", work)
    cluster.add_node(node, cpu=cpu, memory="8Gi", labels={"appwrapper.test/pool": work})
    cluster.wait_nodes_ready([node])
    return node


@pytest.mark.cluster
def test_installed_chart_runs_the_sample(
    cluster: Any, release: tuple[str, str], tmp_path: Path
) -> None:
    if not isinstance(cluster, LocalCluster):
        pytest.skip("the API server must reach this machine's 127.0.0.1 to call the webhook")
    system, full = release
    work = f"{system}-work"
    # The CRD's conversion follows the release: its Service, in its namespace.
    service = json.loads(
        cluster.kubectl(
            "get", "crd", APPWRAPPER_CRD, "-o", "jsonpath={.spec.conversion.webhook.clientConfig}"
        ).stdout
    )["service"]
    assert (service["namespace"], service["name"]) == (system, f"{full}-webhook")
    node = node_pool(cluster, work, "2")
    try:
        with dispatcher_of(cluster, system, full, work, tmp_path):
            apply_as_user(cluster, work, REPO / "samples" / "job-completion.yaml")
            cluster.kubectl(
                *("wait", "-n", work, "--for=condition=Completed"),
                *("appwrapper/job-completion", "--timeout=90s"),
                timeout=110,
            )
            # Read in v1beta2, the preferred version, through the conversion (named: kubectl
            # caches discovery, and may still know v1beta1 alone).
            aw = json.loads(
                cluster.kubectl("get", V1BETA2, "job-completion", "-n", work, "-o", "json").stdout
            )
            assert aw["apiVersion"] == "workload.codeflare.dev/v1beta2"
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
    finally:
        cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", work, "--wait=false", check=False)


def previous_chart(tmp_path: Path) -> Path:
    """The chart as `PREVIOUS_CHART` shipped it, from git."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS_CHART, "charts/appwrapper-dispatcher"],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True, timeout=60)
    return tmp_path / "charts" / "appwrapper-dispatcher"


def uids(cluster: Any, work: str) -> dict[str, str]:
    listed = json.loads(cluster.kubectl("get", V1BETA1, "-n", work, "-o", "json").stdout)
    return {i["metadata"]["name"]: i["metadata"]["uid"] for i in listed["items"]}


def wait_for(cluster: Any, work: str, name: str, condition_type: str) -> None:
    cluster.kubectl(
        *("wait", "-n", work, f"--for=condition={condition_type}", f"appwrapper/{name}"),
        *("--timeout=90s",),
        timeout=110,
    )


def condition(cluster: Any, work: str, name: str, condition_type: str) -> str:
    path = f'jsonpath={{.status.conditions[?(@.type=="{condition_type}")].status}}'
    return str(cluster.kubectl("get", V1BETA1, name, "-n", work, "-o", path).stdout)


@pytest.mark.cluster
def test_upgrade_from_the_previous_chart_then_uninstall_leaves_appwrappers_readable(
    cluster: Any, converter: Converter, tmp_path: Path
) -> None:
    """0.1.0 installed and running a Deployment's AppWrapper while another waits for room;
    `helm upgrade` to this chart (the CRD now upgraded with it) and the dispatcher rolled:
    neither is lost, the running one keeps running, the waiting one keeps waiting and then
    runs once room is made. Uninstalled, the NOTES' command makes the CRD readable: with no
    dispatcher, AppWrappers are listed, described, deleted, and their namespace deleted."""
    if not isinstance(cluster, LocalCluster):
        pytest.skip("the API server must reach this machine's 127.0.0.1 to call the webhook")
    system = f"t-up-{uuid.uuid4().hex[:6]}"
    name, full, work = "team", "team-appwrapper-dispatcher", f"{system}-work"
    # The previous chart's pre-flight reads the CRD as it was then: readable (v1beta1 alone).
    apply_crd(cluster, readable(yaml.safe_load(CRD.read_text())))
    node = ""
    try:
        install(cluster, name, previous_chart(tmp_path), system)
        node = node_pool(cluster, work, "1")
        with dispatcher_of(cluster, system, full, work, tmp_path / "old", its_rbac=False):
            apply_as_user(cluster, work, REPO / "samples" / "service-deployment.yaml")
            wait_for(cluster, work, "service-deployment", "Running")
            # Three pods of 300m: they fit only once the Deployment's two of 250m are gone.
            waiting = yaml.safe_load((REPO / "samples" / "job-completion.yaml").read_text())
            (item,) = waiting["spec"]["resources"]["GenericItems"]
            sized = {"cpu": "300m", "memory": "64Mi"}
            item["custompodresources"][0].update(requests=sized, limits=sized)
            (container,) = item["generictemplate"]["spec"]["template"]["spec"]["containers"]
            container["resources"] = {"requests": sized, "limits": sized}
            (tmp_path / "waiting.yaml").write_text(yaml.safe_dump(waiting))
            apply_as_user(cluster, work, tmp_path / "waiting.yaml")
            wait_for(cluster, work, "job-completion", "Queueing")
            before = uids(cluster, work)
        # As installed (the test pointed them here): Helm's three-way merge would otherwise
        # add the Service beside the URL.
        send_webhook_back(cluster, full, system)
        notes = install(cluster, name, CHART, system)
        with dispatcher_of(cluster, system, full, work, tmp_path / "new"):
            assert uids(cluster, work) == before
            listed = cluster.kubectl("get", V1BETA2, "-n", work).stdout
            assert "service-deployment" in listed
            assert "job-completion" in listed
            wait_for(cluster, work, "service-deployment", "Running")
            holds_for(
                lambda: condition(cluster, work, "job-completion", "Dispatched") != "True",
                seconds=3,
                what="the waiting AppWrapper still waiting",
            )
            cluster.kubectl("delete", "aw", "service-deployment", "-n", work, "--timeout=60s")
            wait_for(cluster, work, "job-completion", "Dispatched")
            # As the NOTES say: AppWrappers deleted while the dispatcher runs (its finalizer).
            cluster.kubectl("delete", "aw", "job-completion", "-n", work, "--timeout=60s")
        uninstall(cluster, name, system)
        # No dispatcher, the CRD still converting through a Service that is gone: v1beta2
        # requests fail; v1beta1 reads.
        fresh = REPO / "samples" / "job-completion.yaml"
        cluster.kubectl("apply", "-n", work, "-f", str(fresh))
        refused = cluster.kubectl("get", V1BETA2, "-n", work, check=False)
        assert refused.returncode != 0, refused.stdout
        assert "conversion webhook" in refused.stderr, refused.stderr
        assert "job-completion" in cluster.kubectl("get", V1BETA1, "-n", work).stdout
        # The NOTES' command as printed, then what users do: list, describe, delete, and
        # delete a namespace that holds one.
        lines = notes.splitlines()
        (at,) = [i for i, line in enumerate(lines) if READABLE_PATCH_LINE in line]
        user = f"{cluster.kubectl_path} --kubeconfig {cluster.kubeconfig} "
        for command in (lines[at].strip(), lines[at + 1].strip()):
            assert command.startswith("kubectl "), command
            subprocess.run(
                ["bash", "-c", command.replace("kubectl ", user, 1)], check=True, timeout=60
            )
        assert "job-completion" in cluster.kubectl("get", "aw", "-n", work).stdout
        described = cluster.kubectl("describe", "aw", "job-completion", "-n", work).stdout
        assert "job-completion" in described
        cluster.kubectl("delete", "aw", "job-completion", "-n", work, "--timeout=60s")
        cluster.kubectl("apply", "-n", work, "-f", str(fresh))
        cluster.kubectl("delete", "namespace", work, "--timeout=60s", timeout=90)
    finally:
        if node:
            cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        uninstall(cluster, name, system)
        cluster.kubectl("delete", "namespace", work, "--wait=false", check=False)
        apply_crd(cluster, crd_calling(CRD, converter.url, converter.ca_bundle))
