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
