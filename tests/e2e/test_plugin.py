"""`kubectl aw`'s options of issue 37 against the real API server: `-l` and `-A`, an unknown
namespace, `version`, `--watch` printing again when an AppWrapper appears, the kubeconfig's
`proxy-url` (a CONNECT proxy in the test counts the tunnels), kubectl's plugin completion
through `kubectl_complete-aw`, and `make plugin`'s zipapp run with the standard library alone.

No dispatcher runs: the AppWrappers stay without status (listed as Pending) and `list` warns
that it has no positions where no visibility API answers. The e2e tests with a dispatcher
and the visibility API are in test_visibility.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.plugin.bundle import build
from tests.unit.test_plugin_features import ConnectProxy

pytestmark = [pytest.mark.cluster]

BIN = Path(sys.executable).parent  # the virtualenv's bin, where kubectl-aw is


def labelled(name: str, **labels: str) -> dict[str, Any]:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {"name": name, "labels": labels},
        "spec": {"resources": {"GenericItems": [{"generictemplate": pod}]}},
    }


def aw(
    cluster: Any, *args: str, kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`kubectl-aw ARGS` with the cluster's kubeconfig."""
    return subprocess.run(
        [str(BIN / "kubectl-aw"), *args],
        env={**os.environ, "KUBECONFIG": str(kubeconfig or cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def two(cluster: Any, namespace: str, appwrapper_crd: None) -> str:
    """Two AppWrappers in `namespace`: `a-1` labelled team=<namespace>-a, `b-1` team=...-b."""
    for name, team in (("a-1", f"{namespace}-a"), ("b-1", f"{namespace}-b")):
        cluster.kubectl(
            "apply", "-n", namespace, "-f", "-", input=json.dumps(labelled(name, team=team))
        )
    return namespace


def names(listed: str) -> list[str]:
    return [line.split()[0] for line in listed.splitlines()[1:]]


def test_selector_all_namespaces_and_an_unknown_namespace(cluster: Any, two: str) -> None:
    ns = two
    done = aw(cluster, "list", "-n", ns)
    assert done.returncode == 0, done.stderr
    assert sorted(names(done.stdout)) == ["a-1", "b-1"]
    only_a = aw(cluster, "list", "-n", ns, "-l", f"team={ns}-a")
    assert names(only_a.stdout) == ["a-1"]
    everywhere = aw(cluster, "list", "-A", "-l", f"team in ({ns}-b)")
    rows = [line.split()[:2] for line in everywhere.stdout.splitlines()]
    assert rows == [["NAMESPACE", "NAME"], [ns, "b-1"]]
    none = aw(cluster, "list", "-n", ns, "-l", "team=nobody")
    assert (none.returncode, none.stdout) == (0, "")
    assert "No AppWrappers matching team=nobody found in namespace" in none.stderr
    missing = aw(cluster, "list", "-n", f"{ns}-nope")
    assert missing.returncode == 1
    assert missing.stderr == f'error: namespace "{ns}-nope" not found\n'
    why = aw(cluster, "why", "a-1", "-n", f"{ns}-nope")
    assert why.stderr == f'error: namespace "{ns}-nope" not found\n'
    bad = aw(cluster, "list", "-l", "team=a=b")
    assert bad.returncode == 2
    assert "invalid selector 'team=a=b': expected ',' or the end, found '='" in bad.stderr


def test_version(cluster: Any) -> None:
    done = aw(cluster, "version", "-o", "json")
    assert done.returncode == 0, done.stderr
    versions = json.loads(done.stdout)
    assert versions["server"].startswith("v1.")
    assert set(versions) >= {"plugin", "server", "visibilityAPI"}


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_watch_prints_again_when_an_appwrapper_appears(cluster: Any, two: str) -> None:
    """`list -w`: the table first, then the table again once a new AppWrapper is created
    (well within the 10 s of the periodic render: the watch woke it); Ctrl-C ends it with
    exit code 130 and no traceback."""
    ns = two
    process = subprocess.Popen(
        [str(BIN / "kubectl-aw"), "list", "-n", ns, "-w"],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as a user's terminal delivers it: a runner that starts the suite in the
        # background (a shell without job control) hands it SIGINT ignored, which Python
        # would then leave ignored in the plugin.
        preexec_fn=_interruptible,
    )
    assert process.stdout is not None
    try:
        first = [process.stdout.readline() for _ in range(3)]
        assert sorted(line.split()[0] for line in first[1:]) == ["a-1", "b-1"]
        started = time.monotonic()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(labelled("c-1", team="c")))
        again = [process.stdout.readline() for _ in range(5)]  # blank line, header, 3 rows
        took = time.monotonic() - started
        assert again[0] == "\n"
        assert sorted(line.split()[0] for line in again[2:]) == ["a-1", "b-1", "c-1"]
        assert took < 8, f"printed again after {took:.1f}s: not woken by the watch"
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "Traceback" not in err


def test_proxy_url_of_the_kubeconfig(cluster: Any, two: str, tmp_path: Path) -> None:
    """The kubeconfig's `proxy-url` is used even for a loopback server (as kubectl does):
    every connection of the command is a tunnel through the proxy."""
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = urllib.parse.urlsplit(config["clusters"][0]["cluster"]["server"])
    proxy = ConnectProxy((server.hostname or "", server.port or 443))
    for entry in config["clusters"]:
        entry["cluster"]["proxy-url"] = f"http://127.0.0.1:{proxy.port}"
    proxied = tmp_path / "kubeconfig"
    proxied.write_text(yaml.safe_dump(config))
    try:
        done = aw(cluster, "list", "-n", two, "-o", "json", kubeconfig=proxied)
    finally:
        proxy.close()
    assert done.returncode == 0, done.stderr
    assert sorted(i["name"] for i in json.loads(done.stdout)["items"]) == ["a-1", "b-1"]
    assert len(proxy.tunnels) == 1  # one connection for the command's requests


def test_kubectl_completes_through_kubectl_complete_aw(
    cluster: Any, two: str, tmp_path: Path
) -> None:
    """`kubectl __complete aw why ''` (what kubectl's shell completion asks) runs
    kubectl_complete-aw from PATH, which lists the namespace's AppWrappers."""
    helper = tmp_path / "kubectl_complete-aw"
    helper.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        "'import sys; from dispatcher.plugin.main import complete_main; sys.exit(complete_main())'"
        ' "$@"\n'
    )
    helper.chmod(0o755)
    kubectl = Path(str(cluster.kubectl_path))
    done = subprocess.run(
        [str(kubectl), "__complete", "aw", "why", "-n", two, ""],
        env={
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "PATH": os.pathsep.join(
                [str(tmp_path), str(BIN), str(kubectl.parent), os.environ["PATH"]]
            ),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines()[:2] == ["a-1", "b-1"]
    assert done.stdout.splitlines()[-1] == ":4"


def test_the_zipapp_against_the_api_server(cluster: Any, two: str, tmp_path: Path) -> None:
    app = build(tmp_path / "dist", version="0.0.0-test")
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(app), "list", "-n", two, "-o", "json"],
        env={
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "KUBECONFIG": str(cluster.kubeconfig),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(i["name"] for i in json.loads(done.stdout)["items"]) == ["a-1", "b-1"]
