"""The chart's values a platform team sets (security contexts, probes, spread, extra env,
args and volumes, the ServiceAccount, cert-manager's issuer, secure metrics, PodMonitor,
PrometheusRule, the Grafana dashboard, the NetworkPolicy's visibility port), each through
`helm template` with the real helm binary (tests/e2e/test_chart.py has the helpers and the
comparison with manifests/)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.e2e.test_chart import (
    CHART,
    HELM,
    MANIFESTS,
    RELEASE,
    SYSTEM_NAMESPACE,
    Docs,
    container,
    grants,
    helm,
    names,
    one,
    render,
    settings,
)

pytestmark = pytest.mark.tier(
    HELM.exists(), "helm is not named (APPWRAPPER_HELM): `make test` builds it and names it"
)


@pytest.fixture(scope="module")
def rendered() -> Docs:
    """The chart with its defaults."""
    return render()


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
