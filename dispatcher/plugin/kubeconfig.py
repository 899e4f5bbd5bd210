"""The user's kubeconfig read as kubectl reads it, and requests made with it (the standard
library and PyYAML only: the plugin starts in a fraction of the time kubernetes-asyncio
takes to import). What only some kubeconfigs need (`subprocess` for an exec plugin,
`tempfile` for a client certificate) is imported where it is used, and the system's CA
roots are read only when the kubeconfig names no CA: every command pays its imports and its
TLS setup, and `kubectl aw` is timed against `kubectl get` (benchmarks/plugin_bench.py).

Side effects: reads the kubeconfig files and the files it names; runs the `exec`
credential plugin it names (as kubectl does); HTTPS requests to the API server.

Covered: `--kubeconfig`, else `$KUBECONFIG` (a list, merged first-wins as kubectl merges
it), else ~/.kube/config; `--context`; the context's namespace; the cluster's CA (file or
data) or `insecure-skip-tls-verify`; a user's token, token file, client certificate and key
(files or data), basic auth, or an `exec` plugin (client.authentication.k8s.io ExecCredential);
`--as` / `--as-group` impersonation (one group); the cluster's `proxy-url`, else
`HTTPS_PROXY` / `NO_PROXY` (dispatcher/plugin/proxy.py). Not covered: the long-deprecated
`auth-provider`.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from dispatcher.plugin.errors import ApiError, PluginError
from dispatcher.plugin.proxy import Proxy, proxy_for

Obj = dict[str, Any]
STANDBY_RETRIES = 4
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it: the same documents, parsed in C."""


class Connection:
    # A plain class, not a dataclass: `dataclasses` imports `inspect`, milliseconds on
    # every command.
    def __init__(
        self,
        *,
        server: str,
        namespace: str,
        context: ssl.SSLContext,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        proxy: Proxy | None = None,
    ) -> None:
        self.server = server
        self.namespace = namespace
        self.context = context
        self.headers = headers if headers is not None else {}
        self.timeout = timeout
        self.proxy = proxy
        self._open: http.client.HTTPConnection | None = None

    def clone(self) -> Connection:
        """The same server and credentials on a connection of its own (one per thread: an
        http.client connection serves one request at a time)."""
        return Connection(
            server=self.server,
            namespace=self.namespace,
            context=self.context,
            headers=self.headers,
            timeout=self.timeout,
            proxy=self.proxy,
        )

    def _dial(self, *, timeout: float | None) -> http.client.HTTPConnection:
        """A new connection to the server, through the proxy's CONNECT tunnel where one is
        set (TLS, and its name check, then run inside the tunnel, with the server)."""
        target = urllib.parse.urlsplit(self.server)
        netloc = target.netloc if self.proxy is None else f"{self.proxy.host}:{self.proxy.port}"
        connection: http.client.HTTPConnection
        if target.scheme == "https":
            connection = http.client.HTTPSConnection(netloc, timeout=timeout, context=self.context)
        else:
            connection = http.client.HTTPConnection(netloc, timeout=timeout)
        if self.proxy is not None:
            auth = self.proxy.authorization
            connection.set_tunnel(
                target.hostname or "",
                target.port or (443 if target.scheme == "https" else 80),
                headers={"Proxy-Authorization": auth} if auth else None,
            )
        return connection

    def _connection(self) -> http.client.HTTPConnection:
        """One connection for every request of a command: one TLS handshake, not one each."""
        if self._open is None:
            self._open = self._dial(timeout=self.timeout)
        return self._open

    def _unreachable(self, exc: Exception) -> PluginError:
        via = f" through the proxy {self.proxy.url}" if self.proxy is not None else ""
        return PluginError(f"cannot reach the API server at {self.server}{via}: {exc}")

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        url = self._url(path, query)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json", **self.headers}
        if data is not None:
            headers["Content-Type"] = content_type
        connection = self._connection()
        try:
            connection.request(method, url, body=data, headers=headers)
            answer = connection.getresponse()
            raw = answer.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            self._open = None
            raise self._unreachable(exc) from None
        if answer.status >= 400:
            raise ApiError(answer.status, _message(raw, answer.reason))
        return dict(json.loads(raw or b"{}"))

    def _url(self, path: str, query: dict[str, str] | None) -> str:
        url = urllib.parse.urlsplit(self.server).path.rstrip("/") + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return url

    def watch(self, path: str, *, idle_timeout: float, **query: str) -> Iterator[Obj]:
        """The events of a watch of `path` (`watch=1` added), one JSON object a line, on a
        connection of its own, until the server ends the stream; `idle_timeout` seconds
        without a byte is a lost connection (PluginError), as is a request that fails."""
        connection = self._dial(timeout=idle_timeout)
        try:
            try:
                connection.request(
                    "GET",
                    self._url(path, {**query, "watch": "1"}),
                    headers={"Accept": "application/json", **self.headers},
                )
                answer = connection.getresponse()
                if answer.status >= 400:
                    raise ApiError(answer.status, _message(answer.read(), answer.reason))
                while line := answer.readline():
                    if line.strip():
                        yield dict(json.loads(line))
            except (OSError, http.client.HTTPException) as exc:
                raise self._unreachable(exc) from None
        finally:
            connection.close()

    def get(self, path: str, **query: str) -> Obj:
        """A read; a 503 is asked again a few times: the visibility API's Service reaches
        every replica, and only the leader answers (a standby says 503)."""
        for attempt in range(STANDBY_RETRIES):
            try:
                return self.request("GET", path, query=query or None)
            except ApiError as exc:
                if exc.code != 503 or attempt + 1 == STANDBY_RETRIES:
                    raise
        raise AssertionError("unreachable")


def _message(raw: bytes, fallback: str) -> str:
    try:
        status = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip() or fallback
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return fallback


def _files(explicit: str | None) -> list[Path]:
    if explicit:
        return [Path(explicit)]
    listed = os.environ.get("KUBECONFIG")
    if listed:
        return [Path(p) for p in listed.split(os.pathsep) if p]
    return [Path.home() / ".kube" / "config"]


def _merged(paths: list[Path]) -> tuple[Obj, dict[str, Path]]:
    """The kubeconfig files merged (the first file to set a name wins), and the file each
    named entry came from (relative paths in it are relative to that file)."""
    merged: Obj = {"clusters": {}, "users": {}, "contexts": {}, "current-context": ""}
    origin: dict[str, Path] = {}
    for path in paths:
        try:
            loaded = yaml.load(path.read_text(), Loader=SAFE_LOADER) or {}
        except FileNotFoundError:
            continue
        except (OSError, yaml.YAMLError) as exc:
            raise PluginError(f"cannot read kubeconfig {path}: {exc}") from None
        if not isinstance(loaded, dict):
            raise PluginError(f"kubeconfig {path} is not a mapping")
        for section in ("clusters", "users", "contexts"):
            for entry in loaded.get(section) or []:
                name = entry.get("name")
                if name not in merged[section]:
                    merged[section][name] = entry.get(section[:-1]) or {}
                    origin[f"{section}/{name}"] = path
        if not merged["current-context"]:
            merged["current-context"] = loaded.get("current-context") or ""
    return merged, origin


def kubeconfig_contexts(explicit: str | None) -> list[str]:
    """The names of the contexts of the kubeconfig (`--kubeconfig`, else as `connect` finds
    it): what `--context` may name."""
    merged, _ = _merged(_files(explicit))
    return sorted(str(name) for name in merged["contexts"])


def _data_or_file(entry: Obj, key: str, base: Path) -> bytes | None:
    data = entry.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    name = entry.get(key)
    if name:
        path = Path(name)
        return (path if path.is_absolute() else base.parent / path).read_bytes()
    return None


def _exec_credential(spec: Obj) -> Obj:
    import subprocess  # only here: most kubeconfigs name no exec plugin

    command = [spec.get("command", ""), *(spec.get("args") or [])]
    env = dict(os.environ)
    for item in spec.get("env") or []:
        env[str(item.get("name"))] = str(item.get("value"))
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {
            "apiVersion": spec.get("apiVersion", "client.authentication.k8s.io/v1"),
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
    )
    try:
        done = subprocess.run(command, env=env, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PluginError(f"the kubeconfig's exec credential plugin failed: {exc}") from None
    return dict((json.loads(done.stdout) or {}).get("status") or {})


def connect(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    namespace: str | None = None,
    impersonate: str | None = None,
    groups: tuple[str, ...] = (),
    timeout: float = 30.0,
) -> Connection:
    merged, origin = _merged(_files(kubeconfig))
    name = context or merged["current-context"]
    if not name:
        raise PluginError("no current context: pass --context or set one in the kubeconfig")
    ctx = merged["contexts"].get(name)
    if ctx is None:
        raise PluginError(f'context "{name}" does not exist in the kubeconfig')
    cluster = merged["clusters"].get(ctx.get("cluster"))
    if cluster is None:
        raise PluginError(f'cluster "{ctx.get("cluster")}" of context "{name}" does not exist')
    user = merged["users"].get(ctx.get("user"), {})
    cluster_file = origin.get(f"clusters/{ctx.get('cluster')}", Path("."))
    user_file = origin.get(f"users/{ctx.get('user')}", Path("."))
    tls = _tls(cluster, cluster_file)
    headers: dict[str, str] = {}
    cert = _data_or_file(user, "client-certificate", user_file)
    key = _data_or_file(user, "client-key", user_file)
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(user["tokenFile"]).read_text().strip()
    if user.get("exec"):
        status = _exec_credential(user["exec"])
        token = status.get("token") or token
        if status.get("clientCertificateData"):
            cert = str(status["clientCertificateData"]).encode()
            key = str(status.get("clientKeyData", "")).encode()
    if cert and key:
        _load_pair(tls, cert, key)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password', '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    if impersonate:
        headers["Impersonate-User"] = impersonate
    server = str(cluster.get("server") or "")
    if not server:
        raise PluginError(f'cluster "{ctx.get("cluster")}" has no server')
    connection = Connection(
        server=server,
        namespace=namespace or ctx.get("namespace") or "default",
        context=tls,
        headers=headers,
        timeout=timeout,
        proxy=proxy_for(server, proxy_url=cluster.get("proxy-url"), environ=os.environ),
    )
    if len(groups) > 1:
        raise PluginError("--as-group may be given once (urllib sends one header per name)")
    if groups:
        connection.headers["Impersonate-Group"] = groups[0]
    return connection


def _tls(cluster: Obj, cluster_file: Path) -> ssl.SSLContext:
    """As kubectl trusts: the cluster's CA alone where the kubeconfig names one, the system's
    roots only where it names none (reading them costs tens of milliseconds), nothing
    checked with `insecure-skip-tls-verify`."""
    if cluster.get("insecure-skip-tls-verify"):
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
        return tls
    ca = _data_or_file(cluster, "certificate-authority", cluster_file)
    return ssl.create_default_context(cadata=ca.decode() if ca else None)


def _load_pair(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate only from files: written owner-only, read, removed."""
    import tempfile  # only here: a kubeconfig with a token or an exec plugin needs none

    with tempfile.TemporaryDirectory(prefix="kubectl-aw-") as directory:
        cert_path, key_path = Path(directory) / "tls.crt", Path(directory) / "tls.key"
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        cert_path.write_bytes(cert)
        context.load_cert_chain(cert_path, key_path)
