"""kubectl aw reads the kubeconfig as kubectl does (dispatcher/plugin/kubeconfig.py)."""

from __future__ import annotations

import base64
import json
import ssl
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from dispatcher.kube import certplan
from dispatcher.plugin.errors import PluginError
from dispatcher.plugin.kubeconfig import connect
from dispatcher.plugin.main import cmd_list, main


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


CA = certplan.make_ca(time.time(), 3600, name="cluster-ca")


@pytest.mark.parametrize(
    ("cluster", "want_cas", "want_roots", "want_verify"),
    [
        pytest.param(
            {"certificate-authority-data": base64.b64encode(CA.cert_pem).decode()},
            ["cluster-ca"],
            False,
            True,
            id="CA data: that CA alone, as kubectl",
        ),
        pytest.param(
            {"certificate-authority": "ca.crt"},
            ["cluster-ca"],
            False,
            True,
            id="CA file beside the kubeconfig: that CA alone",
        ),
        pytest.param({}, [], True, True, id="no CA: the system's roots"),
        pytest.param(
            {"insecure-skip-tls-verify": True}, [], False, False, id="insecure: nothing checked"
        ),
    ],
)
def test_tls_trusts_what_the_kubeconfig_names(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cluster: dict[str, Any],
    want_cas: list[str],
    want_roots: bool,
    want_verify: bool,
) -> None:
    (tmp_path / "ca.crt").write_bytes(CA.cert_pem)
    config = tmp_path / "config"
    config.write_text(
        json.dumps(
            {
                "current-context": "one",
                "clusters": [{"name": "c", "cluster": {"server": "https://h:1", **cluster}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "one", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    roots_loaded: list[object] = []
    plain = ssl.SSLContext.load_default_certs
    monkeypatch.setattr(
        ssl.SSLContext,
        "load_default_certs",
        lambda self, *a: roots_loaded.append(a) or plain(self, *a),
    )
    tls = connect(kubeconfig=str(config)).context
    if not want_roots:  # the system's roots, where loaded, are many: only the named CA here
        cas = [dict(n[0] for n in c["subject"])["commonName"] for c in tls.get_ca_certs()]
        assert cas == want_cas
    assert bool(roots_loaded) == want_roots
    assert tls.check_hostname == want_verify
    assert tls.verify_mode == (ssl.CERT_REQUIRED if want_verify else ssl.CERT_NONE)


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


class FakeApi:
    """The two reads `kubectl aw list -A` makes, canned."""

    namespace = "default"

    def get(self, path: str, **query: str) -> dict[str, object]:
        if path.endswith("/appwrappers"):
            return {
                "items": [
                    {"metadata": {"namespace": "b", "name": "run"}, "status": {"state": "Running"}},
                    {
                        "metadata": {"namespace": "a", "name": "wait"},
                        "status": {"state": "Pending"},
                    },
                ]
            }
        pending = {
            "metadata": {"namespace": "a", "name": "wait"},
            "position": 1,
            "positionInClusterQueue": 1,
            "clusterQueue": "cq",
            "priority": 3,
            "waitingSeconds": 200,
            "reason": "QuotaExceeded",
            "message": "queue cq: needs cpu 2",
            "eta": {"at": "2027-01-15T08:01:00Z", "latest": True, "basis": "after b/run ends"},
        }
        return {"items": [pending]}


def test_list_all_namespaces_wide_and_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    cmd_list(FakeApi(), Namespace(all_namespaces=True, selector=None, output="wide"))  # type: ignore[arg-type]
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0][:6] == ["NAMESPACE", "NAME", "STATE", "QUEUE", "POSITION", "ETA"]
    assert rows[1][:9] == ["a", "wait", "Pending", "cq", "1", "by", "08:01", "3", "3m"]
    assert rows[2][:5] == ["b", "run", "Running", "-", "-"]
    cmd_list(FakeApi(), Namespace(all_namespaces=True, selector=None, output="yaml"))  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert out.startswith("kind: List\n")
    assert "basis: after b/run ends" in out
