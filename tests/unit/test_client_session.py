"""The API client's wire: the proxy decided once from the environment (not looked up on
every request), the kubeconfig's own proxy first; JSON encoded and decoded fast, with
nothing the server can send (or a user can write) refused for it."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.kube.client import KubeClient
from dispatcher.kube.jsoncodec import decode, decode_deep, encode


def kubeconfig(server: str, proxy: str | None = None) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": server, "insecure-skip-tls-verify": True}
    if proxy:
        cluster["proxy-url"] = proxy
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


async def proxy_of(config: dict[str, Any]) -> tuple[str | None, bool]:
    client = await KubeClient.connect(kubeconfig_dict=config)
    try:
        rest = client._api.rest_client
        return rest.proxy, rest.pool_manager.trust_env
    finally:
        await client.close()


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("env", "server", "config_proxy", "want"),
    [
        ({}, "https://api.example.com:6443", None, None),
        (
            {"HTTPS_PROXY": "http://proxy:3128"},
            "https://api.example.com:6443",
            None,
            "http://proxy:3128",
        ),
        ({"HTTP_PROXY": "http://proxy:3128"}, "https://api.example.com:6443", None, None),
        (
            {"HTTP_PROXY": "http://proxy:3128"},
            "http://api.example.com:8080",
            None,
            "http://proxy:3128",
        ),
        (
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "example.com"},
            "https://api.example.com:6443",
            None,
            None,
        ),
        (
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "other.org"},
            "https://api.example.com:6443",
            None,
            "http://proxy:3128",
        ),
        (
            {"HTTPS_PROXY": "http://proxy:3128"},
            "https://api.example.com:6443",
            "http://mine:8888",
            "http://mine:8888",
        ),
    ],
)
async def test_the_proxy_is_decided_once_at_connect(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    server: str,
    config_proxy: str | None,
    want: str | None,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proxy, trusts_env = await proxy_of(kubeconfig(server, config_proxy))
    assert proxy == want
    assert trusts_env is False  # nothing looked up again per request


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def test_decode_reads_what_the_server_sends() -> None:
    text = '{"metadata": {"name": "x"}, "n": 3, "f": 0.5, "u": "\u00e9", "l": [true, null]}'
    assert decode(text) == decode(text.encode()) == json.loads(text)


def test_a_number_past_64_bits_reads_as_the_api_server_keeps_it() -> None:
    # The API server decodes such a number into a float64 and sends it so.
    assert decode(b'{"n": 123456789012345678901234567890}') == {"n": 1.2345678901234568e29}


@pytest.mark.parametrize("depth", [2000, 5000])
def test_nesting_past_the_fast_decoders_limit_is_read(depth: int) -> None:
    value = decode(nested(depth).encode())
    levels = 0
    while isinstance(value, dict):
        value, levels = value["a"], levels + 1
    assert (levels, value) == (depth, 1)


def test_a_malformed_answer_is_refused() -> None:
    with pytest.raises(json.JSONDecodeError, match="Expecting value"):
        decode(b'{"metadata": ')


@pytest.mark.parametrize(
    "body",
    [
        {"metadata": {"name": "x", "labels": {"a": "b"}}, "spec": {"replicas": 3, "f": 1.5}},
        {"huge": 123456789012345678901234567890},
        {"labels": {1: "a key YAML read as a number"}},
        ["é", None, True],
    ],
)
def test_encode_writes_what_json_would_mean(body: object) -> None:
    written = encode(body)
    assert isinstance(written, bytes)
    assert json.loads(written) == json.loads(json.dumps(body))


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values, st.booleans())
def test_the_deep_reader_reads_what_the_json_module_reads(value: object, spaced: bool) -> None:
    text = json.dumps(value, indent=1 if spaced else None)
    assert decode_deep(text) == json.loads(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1',
        '{"a" 1}',
        "[1, 2]]",
        "{1: 2}",
        '{"a": 1}{}',
        "[tru]",
        '"\\x"',
        "",
        "]",
        "[1 2]",
        "[1,]",
        '{"a":1,}',
        "1 2",
        '{"a":}',
    ],
)
def test_the_deep_reader_refuses_what_is_not_one_json_value(text: str) -> None:
    with pytest.raises(ValueError, match=r"unexpected|not one complete|must be a string|Invalid"):
        decode_deep(text)


def test_reading_deep_nesting_leaves_the_recursion_limit_alone() -> None:
    before = sys.getrecursionlimit()
    decode(nested(3000).encode())
    assert sys.getrecursionlimit() == before
