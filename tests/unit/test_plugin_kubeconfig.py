"""kubectl aw reads the kubeconfig as kubectl does (dispatcher/plugin/kubeconfig.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatcher.plugin.kubeconfig import PluginError, connect
from dispatcher.plugin.main import main


def kubeconfig(
    path: Path, *, current: str, contexts: dict[str, dict[str, str]], token: str
) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": current,
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:1",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": n, "context": c} for n, c in contexts.items()],
            }
        )
    )
    return path


def test_kubeconfig_list_first_wins_and_context_namespace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kubeconfig(
        tmp_path / "a",
        current="one",
        contexts={"one": {"cluster": "c", "user": "u", "namespace": "team-a"}},
        token="first",
    )
    second = kubeconfig(
        tmp_path / "b",
        current="two",
        contexts={"two": {"cluster": "c", "user": "u"}},
        token="second",
    )
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    api = connect()
    assert api.namespace == "team-a"
    assert api.headers["Authorization"] == "Bearer first"  # the first file's user "u" wins
    other = connect(context="two", namespace="team-b", impersonate="alice")
    assert other.namespace == "team-b"
    assert other.headers["Impersonate-User"] == "alice"
    assert connect(context="two").namespace == "default"
    with pytest.raises(PluginError, match='context "nope" does not exist'):
        connect(context="nope")


def test_errors_are_one_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = kubeconfig(
        tmp_path / "k", current="one", contexts={"one": {"cluster": "c", "user": "u"}}, token="t"
    )
    assert main(["list", "--kubeconfig", str(config), "--request-timeout", "2"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach the API server at https://127.0.0.1:1")
    assert err.count("\n") == 1
    assert main(["list", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert (
        capsys.readouterr().err
        == "error: no current context: pass --context or set one in the kubeconfig\n"
    )
