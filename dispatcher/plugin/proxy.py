"""Which proxy `kubectl aw` goes through to reach the API server, chosen as kubectl chooses
it (client-go's transport): the cluster's `proxy-url` in the kubeconfig wins; without it,
`HTTPS_PROXY` (for an https server; `HTTP_PROXY` for http), either spelling, unless the
server's host is loopback (`localhost`, 127.0.0.0/8, ::1: Go never proxies those) or matches
`NO_PROXY` (Go's rules: `*`; an IP or CIDR; a domain, which matches itself and its
subdomains, or `.domain`, subdomains only; each with an optional `:port`).

Only http:// proxies, reached with CONNECT (the API server's TLS runs inside the tunnel);
`socks5://` and `https://` proxy URLs are refused, naming the setting. Pure: the environment
comes in as a mapping; `ipaddress` is imported only when a proxy is set.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from dispatcher.plugin.errors import PluginError

if TYPE_CHECKING:
    from ipaddress import IPv4Address, IPv6Address


class Proxy:
    """An http:// proxy: where to connect, and the Proxy-Authorization its URL carries."""

    def __init__(self, *, host: str, port: int, authorization: str | None, url: str) -> None:
        self.host = host
        self.port = port
        self.authorization = authorization
        self.url = url


def proxy_for(server: str, *, proxy_url: str | None, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy for requests to `server`, or None to connect directly."""
    if proxy_url:
        return _parsed(proxy_url, source="the kubeconfig's proxy-url")
    target = urllib.parse.urlsplit(server)
    name = "HTTPS_PROXY" if target.scheme == "https" else "HTTP_PROXY"
    value = environ.get(name) or environ.get(name.lower())
    if not value:
        return None
    host = (target.hostname or "").lower()
    port = target.port or (443 if target.scheme == "https" else 80)
    if _loopback(host) or _bypassed(host, port, environ):
        return None
    return _parsed(value, source=name)


def _parsed(url: str, *, source: str) -> Proxy:
    if "://" not in url:  # Go reads a bare host:port as http://host:port
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http":
        raise PluginError(
            f"{source}: proxy scheme {parts.scheme}:// is not supported by kubectl aw"
            " (an http:// proxy, which it reaches with CONNECT, is)"
        )
    try:
        port = parts.port or 80
    except ValueError:
        raise PluginError(f"{source}: bad proxy URL {url!r}") from None
    if not parts.hostname:
        raise PluginError(f"{source}: bad proxy URL {url!r}: no host")
    authorization = None
    if parts.username is not None:
        import base64

        user, password = parts.username, parts.password or ""
        pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode()
    shown = parts._replace(netloc=f"{parts.hostname}:{port}").geturl()  # no password in errors
    return Proxy(host=parts.hostname, port=port, authorization=authorization, url=shown)


def _ip(host: str) -> IPv4Address | IPv6Address | None:
    import ipaddress

    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _loopback(host: str) -> bool:
    ip = _ip(host)
    return host == "localhost" or (ip is not None and ip.is_loopback)


def _bypassed(host: str, port: int, environ: Mapping[str, str]) -> bool:
    """Whether NO_PROXY names `host` (as Go's golang.org/x/net/http/httpproxy reads it)."""
    import ipaddress

    listed = environ.get("NO_PROXY") or environ.get("no_proxy") or ""
    ip = _ip(host)
    for entry in (e.strip().lower() for e in listed.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                network = ipaddress.ip_network(entry, strict=False)
            except ValueError:
                continue
            if ip is not None and ip in network:
                return True
            continue
        name, wanted = _split_port(entry)
        if wanted is not None and wanted != port:
            continue
        if _ip(name) is not None:
            if ip is not None and _ip(name) == ip:
                return True
            continue
        if name.startswith("*."):
            name = name[1:]
        if name.startswith("."):
            if host.endswith(name):
                return True
        elif host == name or host.endswith("." + name):
            return True
    return False


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [::1]:443
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, int(port) if port.isdigit() else None
    return entry, None
