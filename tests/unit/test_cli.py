"""The command line's answers to bad input: exit code 2 and the reason, before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.cli import main


@pytest.mark.parametrize(
    ("args", "want"),
    [
        pytest.param(
            ["run", "--kubeconfig", "/nonexistent/config"],
            "kubeconfig /nonexistent/config: no such file",
            id="kubeconfig",
        ),
        pytest.param(
            ["run", "--config", "SETTINGS"],
            "members[west].kubeconfig /nonexistent/west: no such file",
            id="member-kubeconfig",
        ),
        pytest.param(["run", "--config", "/nonexistent/settings.yaml"], "settings.yaml", id="file"),
    ],
)
def test_bad_configuration_exits_2_with_the_reason(
    args: list[str], want: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("members:\n- name: west\n  kubeconfig: /nonexistent/west\n")
    assert main([a.replace("SETTINGS", str(settings)) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("appwrapper-dispatcher: bad configuration: ")
    assert want in err


SETTINGS_CASES = [
    pytest.param("qps: [1\n", "settings.yaml:2:1: not YAML:", id="malformed-yaml"),
    pytest.param("- a\n- b\n", "settings.yaml:1: expected a mapping of settings, got list",
                 id="list"),
    pytest.param("qps: 5\nbogus: 1\n", "settings.yaml:2: bogus: Extra inputs are not permitted",
                 id="unknown-key"),
    pytest.param("webhook:\n  enabled: true\n  port: 99999\n",
                 "settings.yaml:3: webhook.port: Input should be less than or equal to 65535",
                 id="nested-range"),
    pytest.param("members:\n  - name: a\n    kubeconfig: 3\n",
                 "settings.yaml:3: members[0].kubeconfig: Input should be a valid string",
                 id="in-a-list"),
    pytest.param("queue_mode: Sometimes\n", "settings.yaml:1: queue_mode: Input should be",
                 id="enum"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "want"), SETTINGS_CASES)
@pytest.mark.parametrize("command", ["run", "check-config"])
def test_a_mistake_in_the_settings_file_names_its_line_and_field(
    command: str, text: str, want: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Malformed YAML, an unknown key, a wrong type: exit 2 and FILE:LINE: field, never a
    parser's traceback (a malformed file ended in one, exit 1)."""
    settings = tmp_path / "settings.yaml"
    settings.write_text(text)
    args = ["run", "--config", str(settings)] if command == "run" else [command, str(settings)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("appwrapper-dispatcher: bad configuration: ")
    assert want in err
    assert "Traceback" not in err


def test_a_flag_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("qps: 5\n")
    assert main(["run", "--config", str(settings), "--qps", "-1"]) == 2
    assert "a flag: qps: Input should be greater than or equal to 0" in capsys.readouterr().err


def test_check_config_passes_the_shipped_configmap_and_names_lines_inside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check-config manifests/config.yaml` checks the settings file the ConfigMap holds; a
    mistake in it is named by its line within that file."""
    # As docs/operations.md writes it, from the checkout's root.
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert main(["check-config", "manifests/config.yaml"]) == 0
    assert capsys.readouterr().out == (
        "manifests/config.yaml (data.config.yaml): the settings are valid\n"
    )
    broken = tmp_path / "config.yaml"
    broken.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n"
        "  config.yaml: |\n    qps: 5\n    workers: none\n"
    )
    assert main(["check-config", str(broken)]) == 2
    assert "config.yaml (data.config.yaml):2: workers: Input should be a valid integer" in (
        capsys.readouterr().err
    )
