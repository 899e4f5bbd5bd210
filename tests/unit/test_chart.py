"""The Helm chart (charts/appwrapper-dispatcher) without helm: what `make test` can check with
Python alone. `make chart-test` runs the helm binary itself (lint, template and the comparison
with manifests/), and tests/e2e/test_chart.py installs the chart.

- values.schema.json is what `python -m dispatcher.chartschema` generates today;
- values.yaml's `config` is valid settings (Config.model_validate), and its other keys are
  ones the schema declares (jsonschema is not a dependency: helm checks the rest);
- the chart's CRDs are the repository's, byte for byte; its appVersion is setup.cfg's;
- the wrapped kinds: the default allow-list, each placed by rbac.wrappedKinds in groups the
  dispatcher accepts it from.
"""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher import chartschema
from dispatcher.config import Config
from dispatcher.core.kindgroups import KNOWN_GROUPS
from dispatcher.core.validation import DEFAULT_ALLOWED_KINDS

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "appwrapper-dispatcher"


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def test_values_schema_is_generated_from_the_settings_model() -> None:
    committed = (CHART / "values.schema.json").read_text()
    assert committed == chartschema.render(), (
        "charts/appwrapper-dispatcher/values.schema.json is out of date: "
        "run .venv/bin/python -m dispatcher.chartschema"
    )


def test_schema_check_mode_tells_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "values.schema.json"
    stale.write_text("{}\n")
    assert chartschema.main(["--out", str(stale), "--check"]) == 1
    assert chartschema.main(["--out", str(stale)]) == 0
    assert chartschema.main(["--out", str(stale), "--check"]) == 0


def test_schema_describes_settings_with_their_docstrings() -> None:
    defs = chartschema.values_schema()["$defs"]
    unattributed = defs["Config"]["properties"]["unattributed"]
    assert unattributed["enum"] == ["refuse", "allow"]
    assert unattributed["description"].startswith("An AppWrapper without a creator record")
    assert defs["Config"]["additionalProperties"] is False
    cert_dir = defs["WebhookConfig"]["properties"]["cert_dir"]["description"]
    assert "cert-manager" in cert_dir


def test_values_config_is_valid_settings() -> None:
    config = Config.model_validate(values()["config"])
    assert config.leader_election
    assert config.webhook.enabled is False  # the chart sets it; values.yaml leaves it out


def test_values_keys_are_declared_by_the_schema() -> None:
    properties = chartschema.values_schema()["properties"]
    given = values()
    assert set(given) <= set(properties)
    for key, value in given.items():
        declared = properties[key].get("properties")
        if declared is not None and isinstance(value, dict):
            assert set(value) <= set(declared), key


@pytest.mark.parametrize("name", ["appwrapper.yaml", "queues.yaml"])
def test_chart_crds_are_the_repositorys(name: str) -> None:
    copy = CHART / "crd-files" / name
    assert copy.read_bytes() == (REPO / "crds" / name).read_bytes(), (
        f"{copy.relative_to(REPO)} differs from crds/{name}: "
        f"cp crds/{name} {copy.relative_to(REPO)}"
    )


def test_app_version_is_the_package_version() -> None:
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    assert str(chart["appVersion"]) == setup["metadata"]["version"]


def test_allowed_kinds_default_and_their_rbac_places() -> None:
    given = values()
    assert given["config"]["allowed_kinds"] == sorted(DEFAULT_ALLOWED_KINDS)
    table = given["rbac"]["wrappedKinds"]
    assert set(DEFAULT_ALLOWED_KINDS) <= set(table)
    for kind, place in table.items():
        assert kind in KNOWN_GROUPS, f"{kind}: not a kind the dispatcher knows the groups of"
        assert set(place["apiGroups"]) <= KNOWN_GROUPS[kind], kind
    assert not [kind for kind, place in table.items() if "watch" in place]


def test_chart_dashboard_is_manifests_grafana_dashboard() -> None:
    # helm reads only files inside the chart: grafanaDashboard.enabled serves this copy.
    copy = CHART / "dashboards" / "dispatcher-dashboard.json"
    shipped = REPO / "manifests" / "grafana" / "dispatcher-dashboard.json"
    assert copy.read_bytes() == shipped.read_bytes(), (
        f"{copy.relative_to(REPO)} differs from {shipped.relative_to(REPO)}: "
        f"cp {shipped.relative_to(REPO)} {copy.relative_to(REPO)}"
    )


def test_image_user_is_numeric_so_run_as_non_root_needs_no_uid() -> None:
    # The chart's pods say runAsNonRoot without runAsUser (OpenShift assigns the uid): the
    # kubelet can check a numeric USER only.
    users = [
        line.split()[1]
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("USER ")
    ]
    assert users, "the Dockerfile sets no USER"
    assert users[-1].isdigit(), users
    assert int(users[-1]) != 0, users
