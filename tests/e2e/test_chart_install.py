"""The Helm chart installed into the local control plane with the real helm binary (helm
template's checks are tests/e2e/test_chart.py).

- Installed (`helm install`, replicas 0: no image can be pulled here), the chart's
  ServiceAccount, RBAC and settings run the dispatcher from the checkout: its webhook signs
  the sample job-completion AppWrapper, which Completes; the CRD converts through the
  release's own Service (pointed at this machine); the chart's status policy refuses status
  written by anyone else; no request of the dispatcher is denied.
- `helm upgrade` from the previous chart (0.1.0, whose CRD was in crds/) with AppWrappers
  running and waiting: none is lost; then `helm uninstall` and the NOTES' commands: with no
  dispatcher, AppWrappers are listed, described and deleted, and a namespace holding one is
  deleted (docs/api.md, "Who serves v1beta2").
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.core.crdforms import readable
from dispatcher.core.gatekeeping import USER
from dispatcher.kube.preflight import APPWRAPPER_CRD
from testenv.converter import Converter, crd_calling
from testenv.localcluster import LocalCluster, free_port
from testenv.waits import holds_for, wait_until
from tests.e2e.conftest import CRD, apply_crd, wait_established
from tests.e2e.test_chart import CHART, HELM, REPO, helm
from tests.e2e.test_manifests import (
    DispatcherProcess,
    http_get,
    port_open,
    service_account_kubeconfig,
)

pytestmark = pytest.mark.tier(
    HELM.exists(), "helm is not named (APPWRAPPER_HELM): `make test` builds it and names it"
)

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
    # A cluster before the install: the CRD as shipped (the session's converts through a URL,
    # which Helm's three-way merge would keep beside the release's Service).
    apply_crd(cluster, readable(yaml.safe_load(CRD.read_text())))
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
    process.assert_clean_exit(its_rights=its_rbac)


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


def waiting_sample(tmp_path: Path) -> Path:
    """job-completion with three pods of 300m: they fit on the test's node of 1 CPU only once
    service-deployment's two of 250m are gone."""
    waiting = yaml.safe_load((REPO / "samples" / "job-completion.yaml").read_text())
    (item,) = waiting["spec"]["resources"]["GenericItems"]
    sized = {"cpu": "300m", "memory": "64Mi"}
    item["custompodresources"][0].update(requests=sized, limits=sized)
    (container,) = item["generictemplate"]["spec"]["template"]["spec"]["containers"]
    container["resources"] = {"requests": sized, "limits": sized}
    path = tmp_path / "waiting.yaml"
    path.write_text(yaml.safe_dump(waiting))
    return path


def readable_after_uninstall(cluster: Any, work: str, notes: str) -> None:
    """No dispatcher, the CRD still converting through a Service that is gone (as during an
    outage of every replica): v1beta2 requests fail, v1beta1 reads. Then the NOTES' commands
    as printed, and what users do: list, describe, delete, and delete a namespace that holds
    an AppWrapper (one no dispatcher saw: no finalizer)."""
    fresh = REPO / "samples" / "job-completion.yaml"
    cluster.kubectl("apply", "-n", work, "-f", str(fresh))
    refused = cluster.kubectl("get", V1BETA2, "-n", work, check=False)
    assert refused.returncode != 0, refused.stdout
    assert "conversion webhook" in refused.stderr, refused.stderr
    assert "job-completion" in cluster.kubectl("get", V1BETA1, "-n", work).stdout
    lines = notes.splitlines()
    (at,) = [i for i, line in enumerate(lines) if READABLE_PATCH_LINE in line]
    user = f"{cluster.kubectl_path} --kubeconfig {cluster.kubeconfig} "
    for command in (lines[at].strip(), lines[at + 1].strip()):
        assert command.startswith("kubectl "), command
        subprocess.run(["bash", "-c", command.replace("kubectl ", user, 1)], check=True, timeout=60)
    assert "job-completion" in cluster.kubectl("get", "aw", "-n", work).stdout
    described = cluster.kubectl("describe", "aw", "job-completion", "-n", work).stdout
    assert "job-completion" in described
    cluster.kubectl("delete", "aw", "job-completion", "-n", work, "--timeout=60s")
    cluster.kubectl("apply", "-n", work, "-f", str(fresh))
    cluster.kubectl("delete", "namespace", work, "--timeout=60s", timeout=90)


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
            apply_as_user(cluster, work, waiting_sample(tmp_path))
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
        readable_after_uninstall(cluster, work, notes)
    finally:
        if node:
            cluster.kubectl("delete", "node", node, "--wait=false", check=False)
        uninstall(cluster, name, system)
        cluster.kubectl("delete", "namespace", work, "--wait=false", check=False)
        apply_crd(cluster, crd_calling(CRD, converter.url, converter.ca_bundle))
