"""Member kubeconfigs read from a Secret in the hub: one whose user runs a credential plugin
(`exec`, `auth-provider`) is refused at start unless `allow_exec_kubeconfigs`."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml

from dispatcher.app import SECRETS, _kubeconfig_from_secret, refuse_plugins
from dispatcher.cluster.objects import ensure_namespace
from testenv.fakekube import FakeKube

EXEC = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh"}}
AUTH_PROVIDER = {"auth-provider": {"name": "oidc", "config": {}}}


def kubeconfig(*users: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "west", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": name, "user": user} for name, user in users],
        "contexts": [{"name": "west", "context": {"cluster": "west", "user": users[0][0]}}],
        "current-context": "west",
    }


@pytest.mark.parametrize(
    ("config", "want"),
    [
        pytest.param(kubeconfig(("token", {"token": "t"})), None, id="token"),
        pytest.param(
            kubeconfig(("cert", {"client-certificate-data": "x", "client-key-data": "y"})),
            None,
            id="client-certificate",
        ),
        pytest.param(
            kubeconfig(("token", {"token": "t"}), ("runner", EXEC)),
            "Secret ns/west: kubeconfig user 'runner' uses exec (users[].user)",
            id="exec-in-any-user",
        ),
        pytest.param(
            kubeconfig(("sso", AUTH_PROVIDER)),
            "Secret ns/west: kubeconfig user 'sso' uses auth-provider (users[].user)",
            id="auth-provider",
        ),
        pytest.param(
            kubeconfig(("both", {**EXEC, **AUTH_PROVIDER})),
            "kubeconfig user 'both' uses exec and auth-provider",
            id="both",
        ),
        pytest.param(
            {"users": [{"user": EXEC}]}, "kubeconfig user #0 uses exec", id="unnamed-entry"
        ),
        pytest.param({"users": "nonsense"}, None, id="malformed-left-to-the-client"),
        pytest.param({"users": [None, {"name": "u", "user": None}]}, None, id="empty-entries"),
    ],
)
def test_refuse_plugins(config: dict[str, Any], want: str | None) -> None:
    if want is None:
        refuse_plugins(config, where="Secret ns/west")
        return
    with pytest.raises(ValueError, match="allow_exec_kubeconfigs: true") as raised:
        refuse_plugins(config, where="Secret ns/west")
    assert want in str(raised.value)


async def hub_with_secret(config: dict[str, Any]) -> FakeKube:
    hub = FakeKube(name="hub")
    await ensure_namespace(hub, "ns")
    data = base64.b64encode(yaml.safe_dump(config).encode()).decode()
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "west"}}
    await hub.create(SECRETS, "ns", {**secret, "data": {"kubeconfig": data}})
    return hub


async def test_a_secret_with_an_exec_user_is_refused_unless_allowed() -> None:
    config = kubeconfig(("runner", EXEC))
    hub = await hub_with_secret(config)
    with pytest.raises(ValueError, match=r"^Secret ns/west: kubeconfig user 'runner' uses exec"):
        await _kubeconfig_from_secret(hub, "ns/west", allow_exec=False)
    assert await _kubeconfig_from_secret(hub, "ns/west", allow_exec=True) == config


async def test_a_secret_with_a_token_is_read() -> None:
    config = kubeconfig(("token", {"token": "t"}))
    hub = await hub_with_secret(config)
    assert await _kubeconfig_from_secret(hub, "ns/west", allow_exec=False) == config
