"""`kubectl aw` options of issue 37: `-l` selectors, `-A`, `--watch`, `version`, shell
completion, proxies (a tiny CONNECT proxy in the test counts what went through it) and the
zipapp of `make plugin` (dispatcher/plugin)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import threading
import time
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.kube import certplan
from dispatcher.plugin import watch
from dispatcher.plugin.bundle import build
from dispatcher.plugin.complete import complete, script
from dispatcher.plugin.errors import ApiError, PluginError
from dispatcher.plugin.main import _parser, cmd_list, cmd_queues, complete_main, main
from dispatcher.plugin.proxy import proxy_for
from dispatcher.plugin.selector import check_selector


@pytest.mark.parametrize(
    "selector",
    [
        pytest.param("app=train", id="equals"),
        pytest.param("app==train,tier!=gpu", id="double-equals-and-not"),
        pytest.param("!canary", id="does-not-exist"),
        pytest.param("canary", id="exists"),
        pytest.param("team.example.com/app in (a, b),x notin (c)", id="sets-with-prefix"),
        pytest.param("x in ()", id="empty-set-is-the-empty-value"),
        pytest.param("gen>3,gen<10", id="numeric"),
        pytest.param("app=", id="empty-value"),
    ],
)
def test_a_selector_the_api_server_accepts_is_sent_as_written(selector: str) -> None:
    assert check_selector(selector) == selector


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        pytest.param("a=b=c", "expected ',' or the end, found '='", id="two-equals"),
        pytest.param("a=b,", "expected a label key, found the end", id="trailing-comma"),
        pytest.param("x in a", "expected '(' after 'in'", id="set-without-parens"),
        pytest.param("x in (a b)", "expected ',' or ')' in the values of 'in'", id="set-no-comma"),
        pytest.param("x>a", "'>' needs a whole number, found 'a'", id="gt-not-a-number"),
        pytest.param("a b", "expected an operator", id="no-operator"),
        pytest.param("-a=b", "key '-a': a name of 63 characters", id="bad-key"),
        pytest.param("A_/b=c", "the prefix of key 'A_/b' is not a DNS subdomain", id="bad-prefix"),
        pytest.param("a=" + "v" * 64, "63 characters at most", id="long-value"),
    ],
)
def test_a_bad_selector_is_named_before_any_request(selector: str, want: str) -> None:
    with pytest.raises(PluginError, match="invalid selector") as refused:
        check_selector(selector)
    assert want in str(refused.value)


def test_a_bad_selector_is_a_usage_error_of_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["list", "-l", "a=b=c", "--kubeconfig", "/nonexistent"])
    assert done.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.endswith(
        "argument -l/--selector: invalid selector 'a=b=c': expected ',' or the end, found '='"
    )


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        pytest.param(["list", "-A", "-l", "a=b"], {"all_namespaces": True, "selector": "a=b"}),
        pytest.param(["list", "-w"], {"watch": True, "all_namespaces": False, "selector": None}),
        pytest.param(["queues", "-A", "--watch"], {"all_namespaces": True, "watch": True}),
        pytest.param(["queues", "--selector", "x"], {"selector": "x"}),
        pytest.param(["why", "n", "-w"], {"name": "n", "watch": True}),
        pytest.param(["version", "--client", "-o", "json"], {"client": True, "output": "json"}),
        pytest.param(["completion", "zsh"], {"shell": "zsh"}),
    ],
)
def test_arguments(argv: list[str], want: dict[str, Any]) -> None:
    args = vars(_parser()[0].parse_args(argv))
    assert {k: args[k] for k in want} == want


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["stop", "q", "-w"], id="stop-does-not-watch"),
        pytest.param(["why", "n", "-A"], id="why-lists-nothing"),
        pytest.param(["completion", "fish"], id="unknown-shell"),
    ],
)
def test_options_only_where_they_mean_something(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _parser()[0].parse_args(argv)


class Recorder:
    """Reads answered from canned lists, each request recorded with its query."""

    namespace = "team-a"

    def __init__(self, *, namespaces: tuple[str, ...] = ("team-a",)) -> None:
        self.asked: list[tuple[str, dict[str, str]]] = []
        self.namespaces = namespaces

    def get(self, path: str, **query: str) -> dict[str, Any]:
        self.asked.append((path, query))
        if path.startswith("/api/v1/namespaces/"):
            if path.rsplit("/", 1)[1] not in self.namespaces:
                raise ApiError(404, "namespaces not found")
            return {}
        return {"items": []}


def test_the_selector_goes_to_every_list_and_an_unknown_namespace_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = Recorder()
    cmd_list(api, Namespace(all_namespaces=False, selector="app=x", output=None))  # type: ignore[arg-type]
    assert api.asked[0] == (
        "/apis/workload.codeflare.dev/v1beta1/namespaces/team-a/appwrappers",
        {"labelSelector": "app=x"},
    )
    assert capsys.readouterr().err == "No AppWrappers matching app=x found in namespace team-a.\n"
    api = Recorder()
    args = Namespace(namespace=None, all_namespaces=True, selector="a", output="json")
    cmd_queues(api, args)  # type: ignore[arg-type]
    assert [q for _, q in api.asked[:2]] == [{"labelSelector": "a"}, {"labelSelector": "a"}]
    assert api.asked[1][0].endswith("/v1beta1/appqueues")  # -A: every namespace's AppQueues
    nowhere = Recorder(namespaces=())
    with pytest.raises(PluginError, match='namespace "team-a" not found'):
        cmd_list(nowhere, Namespace(all_namespaces=False, selector=None, output=None))  # type: ignore[arg-type]
    with pytest.raises(PluginError, match='namespace "team-a" not found'):
        cmd_queues(
            nowhere, Namespace(namespace="team-a", all_namespaces=False, selector=None, output=None)
        )  # type: ignore[arg-type]


class Names:
    """What completion lists: namespaces, AppWrappers of team-a, ClusterAppQueues."""

    namespace = "team-a"

    def get(self, path: str, **query: str) -> dict[str, Any]:
        names = {
            "/api/v1/namespaces": ["team-b", "team-a"],
            "/apis/workload.codeflare.dev/v1beta1/namespaces/team-a/appwrappers": ["run-1", "eval"],
            "/apis/workload.codeflare.dev/v1beta1/clusterappqueues": ["gpu"],
        }[path]
        return {"items": [{"metadata": {"name": n}} for n in names]}


def completed(*args: str) -> list[str]:
    out = io.StringIO()
    assert complete(list(args), commands=_parser()[1], connect=lambda **_: Names(), out=out) == 0
    return out.getvalue().splitlines()


@pytest.mark.parametrize(
    ("args", "want"),
    [
        pytest.param(("q",), ["queues\tClusterAppQueues and AppQueues", ":4"], id="command"),
        pytest.param(("list", "-o", ""), ["json", "yaml", "wide", ":4"], id="output-formats"),
        pytest.param(("list", "--output=y"), ["--output=yaml", ":4"], id="output-equals"),
        pytest.param(("list", "-n", ""), ["team-a", "team-b", ":4"], id="namespaces"),
        pytest.param(("why", "r"), ["run-1", ":4"], id="appwrapper-names"),
        pytest.param(("why", "run-1", ""), [":4"], id="one-name-only"),
        pytest.param(("stop", "-n", "x", ""), ["gpu", ":4"], id="queue-after-a-flag"),
        pytest.param(("completion", ""), ["bash", "zsh", ":4"], id="shells"),
        pytest.param(("list", "--kubeconfig", ""), [":0"], id="kubeconfig-is-a-file"),
        pytest.param(("list", "--sel"), ["--selector\tlabel selector (as kubectl's)", ":4"]),
        pytest.param(
            ("version", "--c"),
            ["--context", "--client\tthe plugin's version only (no request)", ":4"],
        ),
    ],
)
def test_completion_answers_as_cobra(args: tuple[str, ...], want: list[str]) -> None:
    assert completed(*args) == want


def test_completion_offers_nothing_when_the_cluster_cannot_answer() -> None:
    def refused(**_: Any) -> Any:
        raise PluginError("cannot reach the API server")

    out = io.StringIO()
    complete(["why", ""], commands=_parser()[1], connect=refused, out=out)
    assert out.getvalue() == ":4\n"


def test_kubectl_complete_aw_is_the_same_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["kubectl_complete-aw", "list", "-o", "j"])
    assert complete_main() == 0
    assert capsys.readouterr().out == "json\n:4\n"


def test_the_bash_script_fills_compreply(tmp_path: Path) -> None:
    """The bash script, sourced in a real bash, with `kubectl-aw` a stub that answers as the
    plugin does: COMPREPLY holds the values, without their descriptions."""
    stub = tmp_path / "kubectl-aw"
    stub.write_text(f'#!/bin/sh\nexec {sys.executable} -m dispatcher.plugin.main "$@"\n')
    stub.chmod(0o755)
    (tmp_path / "aw.bash").write_text(script("bash"))
    run = (
        "source aw.bash; COMP_WORDS=(kubectl-aw list -o w); COMP_CWORD=3; _kubectl_aw;"
        ' printf "%s\\n" "${COMPREPLY[@]}";'
        " COMP_WORDS=(kubectl-aw qu); COMP_CWORD=1; _kubectl_aw;"
        ' printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "--norc", "-c", run],
        cwd=tmp_path,
        env={**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.splitlines() == ["wide", "queues"]
    assert script("zsh").startswith("#compdef kubectl-aw\n")


def test_version_client_needs_no_kubeconfig(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version", "--client", "--kubeconfig", "/nonexistent"], version="9.9.9") == 0
    assert capsys.readouterr().out == "Plugin Version:   9.9.9\n"


def test_watch_prints_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wake renders; a render equal to the last one printed prints nothing; a burst of
    wakes is one render; a failed watch ends it."""
    monkeypatch.setattr(watch, "SETTLE", 0.01)
    texts = iter(["a\n", "a\n", "b\n"])
    renders: list[int] = []
    rendered = [threading.Event() for _ in range(3)]  # the n-th render has begun

    def pump(api: Any, source: Any, wakes: Any) -> None:
        # Each wake after the render it is for began: no wall-clock pause between them (a
        # render that never comes ends the watch with an error the test does not expect).
        for n, burst in enumerate([[None] * 5, [None], [PluginError("watch ended: 403")]]):
            if not rendered[n].wait(10):
                wakes.put(PluginError(f"render {n + 1} never came"))
                return
            for wake in burst:  # the first: one burst, one render
                wakes.put(wake)

    def render() -> str:
        renders.append(1)
        rendered[len(renders) - 1].set()
        return next(texts)

    monkeypatch.setattr(watch, "_pump", pump)
    out = io.StringIO()

    class Api:
        def clone(self) -> Api:
            return self

    with pytest.raises(PluginError, match="watch ended"):
        watch.follow(render, [watch.Source("/x")], api=Api(), every=30, out=out)  # type: ignore[arg-type]
    assert out.getvalue() == "a\n\nb\n"
    assert len(renders) == 3


# --- Proxies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server", "proxy_url", "env", "want"),
    [
        pytest.param(
            "https://k.example:6443", "http://p:3128", {}, "http://p:3128", id="proxy-url"
        ),
        pytest.param(
            "https://127.0.0.1:6443",
            "http://p:3128",
            {},
            "http://p:3128",
            id="proxy-url-even-loopback",
        ),
        pytest.param(
            "https://k.example", None, {"HTTPS_PROXY": "p:8080"}, "http://p:8080", id="env-bare"
        ),
        pytest.param(
            "https://k.example", None, {"https_proxy": "http://p"}, "http://p:80", id="env-lower"
        ),
        pytest.param(
            "http://k.example", None, {"HTTPS_PROXY": "http://p"}, None, id="https-only-for-https"
        ),
        pytest.param(
            "https://localhost:1", None, {"HTTPS_PROXY": "http://p"}, None, id="localhost"
        ),
        pytest.param("https://127.0.0.2:1", None, {"HTTPS_PROXY": "http://p"}, None, id="loopback"),
        pytest.param("https://[::1]:1", None, {"HTTPS_PROXY": "http://p"}, None, id="loopback-v6"),
        pytest.param(
            "https://a.k.example",
            None,
            {"HTTPS_PROXY": "http://p", "NO_PROXY": "k.example"},
            None,
            id="no-proxy-domain-and-subdomains",
        ),
        pytest.param(
            "https://k.example",
            None,
            {"HTTPS_PROXY": "http://p", "NO_PROXY": ".k.example"},
            "http://p:80",
            id="no-proxy-dot-subdomains-only",
        ),
        pytest.param(
            "https://10.1.2.3",
            None,
            {"HTTPS_PROXY": "http://p", "no_proxy": "x, 10.0.0.0/8"},
            None,
            id="no-proxy-cidr",
        ),
        pytest.param(
            "https://k.example:6443",
            None,
            {"HTTPS_PROXY": "http://p", "NO_PROXY": "k.example:443"},
            "http://p:80",
            id="no-proxy-other-port",
        ),
        pytest.param(
            "https://k.example",
            None,
            {"HTTPS_PROXY": "http://p", "NO_PROXY": "*"},
            None,
            id="no-proxy-star",
        ),
        pytest.param(
            "https://k.example", "http://u:p%40ss@p:1", {}, "http://p:1", id="credentials-not-shown"
        ),
    ],
)
def test_which_proxy(
    server: str, proxy_url: str | None, env: dict[str, str], want: str | None
) -> None:
    proxy = proxy_for(server, proxy_url=proxy_url, environ=env)
    assert (proxy.url if proxy else None) == want


def test_proxy_credentials_and_unsupported_schemes() -> None:
    proxy = proxy_for("https://k", proxy_url="http://u:p%40ss@p:1", environ={})
    assert proxy is not None
    assert proxy.authorization == "Basic dTpwQHNz"  # u:p@ss
    with pytest.raises(PluginError, match=r"proxy-url: proxy scheme socks5:// is not supported"):
        proxy_for("https://k", proxy_url="socks5://p:1080", environ={})
    with pytest.raises(PluginError, match=r"HTTPS_PROXY: proxy scheme https:// is not supported"):
        proxy_for("https://k", proxy_url=None, environ={"HTTPS_PROXY": "https://p"})


CA = certplan.make_ca(time.time(), 3600, name="proxy-test-ca")
SERVER_NAME = "kube.invalid"  # never resolves: only the proxy can reach it


class ConnectProxy:
    """A CONNECT proxy on 127.0.0.1 that sends every tunnel to `upstream`, whatever host it
    names, and records each CONNECT line and its Proxy-Authorization."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.tunnels: list[tuple[str, str | None]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._tunnel, args=(client,), daemon=True).start()

    def _tunnel(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += client.recv(4096)
        lines = head.decode().split("\r\n")
        auth = next(
            (
                line.split(": ", 1)[1]
                for line in lines
                if line.lower().startswith("proxy-authorization:")
            ),
            None,
        )
        self.tunnels.append((lines[0], auth))
        upstream = socket.create_connection(self.upstream)
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pair = {client: upstream, upstream: client}
        while True:
            ready, _, _ = select.select(list(pair), [], [], 10)
            if not ready:
                break
            data = ready[0].recv(65536)
            if not data:
                break
            pair[ready[0]].sendall(data)
        client.close()
        upstream.close()

    def close(self) -> None:
        self.listener.close()


def _answer_lists(tls: ssl.SSLContext, listener: socket.socket) -> None:
    """Each connection: every request (a GET, no body) answered with an empty list, the
    connection kept open as the plugin keeps it."""
    body = json.dumps({"kind": "List", "items": []}).encode()
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )

    def serve(raw: socket.socket) -> None:
        # OSError (ssl.SSLError among them): a client that gave up
        with contextlib.suppress(OSError), raw, tls.wrap_socket(raw, server_side=True) as conn:
            pending = b""
            while True:
                while b"\r\n\r\n" not in pending:
                    data = conn.recv(4096)
                    if not data:
                        return
                    pending += data
                _, pending = pending.split(b"\r\n\r\n", 1)
                conn.sendall(answer)

    while True:
        try:
            raw, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(raw,), daemon=True).start()


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[int]:
    """An HTTPS server for kube.invalid on 127.0.0.1 that answers any GET with an empty list."""
    pair = certplan.issue_serving(CA, [SERVER_NAME], time.time(), 3600)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_answer_lists, args=(tls, listener), daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


def write_kubeconfig(path: Path, server: str, **cluster: str) -> Path:
    import base64

    path.write_text(
        json.dumps(
            {
                "current-context": "c",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": server,
                            "certificate-authority-data": base64.b64encode(CA.cert_pem).decode(),
                            **cluster,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "a"}}
                ],
            }
        )
    )
    return path


@pytest.mark.parametrize("how", ["HTTPS_PROXY", "proxy-url"])
def test_requests_go_through_the_proxy(
    how: str,
    api_server: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`kube.invalid` resolves nowhere: the command answers only if its requests went through
    the proxy, which counts them; TLS (and its name check) runs with the server in the
    tunnel."""
    proxy = ConnectProxy(("127.0.0.1", api_server))
    server = f"https://{SERVER_NAME}:{api_server}"
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    if how == "HTTPS_PROXY":
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
        config = write_kubeconfig(tmp_path / "config", server)
    else:
        monkeypatch.delenv("HTTPS_PROXY", raising=False)
        monkeypatch.delenv("https_proxy", raising=False)
        config = write_kubeconfig(
            tmp_path / "config", server, **{"proxy-url": f"http://me:secret@127.0.0.1:{proxy.port}"}
        )
    try:
        assert main(["queues", "-o", "json", "--kubeconfig", str(config)]) == 0
    finally:
        proxy.close()
    assert json.loads(capsys.readouterr().out)["items"] == []
    assert [line.rsplit(" ", 1)[0] for line, _ in proxy.tunnels] == [
        f"CONNECT {SERVER_NAME}:{api_server}"
    ]
    want_auth = "Basic bWU6c2VjcmV0" if how == "proxy-url" else None  # me:secret
    assert proxy.tunnels[0][1] == want_auth


def test_no_proxy_bypasses_it(
    api_server: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    proxy = ConnectProxy(("127.0.0.1", api_server))
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY", "invalid")
    config = write_kubeconfig(tmp_path / "config", f"https://{SERVER_NAME}:{api_server}")
    try:
        assert main(["queues", "--kubeconfig", str(config), "--request-timeout", "5"]) == 1
    finally:
        proxy.close()
    assert proxy.tunnels == []
    assert capsys.readouterr().err.startswith(
        f"error: cannot reach the API server at https://{SERVER_NAME}"
    )


# --- The zipapp ------------------------------------------------------------------------------


def test_the_zipapp_runs_with_the_standard_library_alone(api_server: int, tmp_path: Path) -> None:
    """`make plugin`'s zipapp, run by an interpreter told to ignore site-packages (-S) and
    PYTHON* variables (-I): `--help`, `version --client`, and `list -o yaml` (the kubeconfig
    read and the output written by PyYAML's pure-Python code, bundled) and `queues` against
    an API server, through a proxy."""
    app = build(tmp_path / "dist", version="1.2.3")
    assert (tmp_path / "dist" / "kubectl_complete-aw").stat().st_mode & 0o111
    proxy = ConnectProxy(("127.0.0.1", api_server))
    server = f"https://{SERVER_NAME}:{api_server}"
    config = write_kubeconfig(
        tmp_path / "config", server, **{"proxy-url": f"http://127.0.0.1:{proxy.port}"}
    )
    config.write_text(yaml.safe_dump(json.loads(config.read_text())))  # as kubectl writes it

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-I", "-S", str(app), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        )

    try:
        assert "usage: kubectl aw" in run("--help").stdout
        assert run("version", "--client").stdout == "Plugin Version:   1.2.3\n"
        listed = run("list", "-o", "yaml", "--kubeconfig", str(config))
        assert (listed.returncode, listed.stderr) == (0, "")
        assert yaml.safe_load(listed.stdout) == {"kind": "List", "apiVersion": "v1", "items": []}
        queues = run("queues", "--kubeconfig", str(config))
        assert (queues.returncode, queues.stderr) == (0, "")
    finally:
        proxy.close()
    assert len(proxy.tunnels) == 2  # one connection per command
