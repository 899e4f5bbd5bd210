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
- The AppWrapper CRD template is crds/appwrapper.yaml in its converting form, for the
  release's Service. Installed, upgraded and uninstalled: tests/e2e/test_chart_install.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import Config
from dispatcher.core.crdforms import converting
from dispatcher.kube.preflight import APPWRAPPER_CRD

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


def crd(served: list[str], stored: list[str], convert: str = "") -> dict[str, Any]:
    """A CRD as the API server returns it; `convert`: the path of its conversion webhook."""
    spec: dict[str, Any] = {"versions": [{"name": name, "served": True} for name in served]}
    if convert:
        client = {"service": {"namespace": "ns", "name": "svc", "path": convert, "port": 443}}
        spec["conversion"] = {"strategy": "Webhook", "webhook": {"clientConfig": client}}
    return {"spec": spec, "status": {"storedVersions": stored}}


SHIPPED = yaml.safe_load((REPO / "crds" / "appwrapper.yaml").read_text())


@pytest.mark.parametrize(
    ("found", "says"),
    [
        (crd(["v1beta1"], ["v1beta1"]), ""),
        (crd(["v1beta2"], ["v1beta2"]), "has versions v1beta2 (served), v1beta2 (stored), no v1"),
        (crd(["v1beta1"], ["v1beta1", "v1beta2"]), "has versions v1beta2 (stored);"),
        (crd(["v1beta1", "v1beta2"], ["v1beta1"]), "has versions v1beta2 (served);"),
        # Ours: as shipped (v1beta2 listed, not served), and as an install that converts.
        ({**SHIPPED, "status": {"storedVersions": ["v1beta1"]}}, ""),
        (crd(["v1beta1", "v1beta2"], ["v1beta1"], convert="/convert"), ""),
        (crd(["v1beta1", "v1beta2"], ["v1beta1"], convert="/other"), "v1beta2 (served);"),
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
