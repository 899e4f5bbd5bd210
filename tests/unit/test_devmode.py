"""`run --dev` settings and what it says (dispatcher/devmode.py): pure parts."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.config import Config, load_config
from dispatcher.devmode import DEV_NAME, SECRET_NAMESPACE, Probe, announcement, dev_config

REACHED = Probe(port=40123, reached=True)
NOT_REACHED = Probe(port=40123, reached=False, problem="no call reached 127.0.0.1:40123 within 5s")


def test_reached_serves_the_webhook_on_loopback_under_its_own_names() -> None:
    config = dev_config(load_config(None, {}), REACHED)
    webhook = config.webhook
    assert webhook.enabled
    assert (webhook.host, webhook.port) == ("127.0.0.1", 40123)
    assert "127.0.0.1" in webhook.extra_names
    assert (webhook.mutating_configuration, webhook.validating_configuration) == (
        DEV_NAME,
        DEV_NAME,
    )
    assert (webhook.namespace, webhook.secret_name) == (SECRET_NAMESPACE, DEV_NAME)
    assert config.unattributed == "refuse"  # nothing weakened: records are made and checked


def test_not_reached_allows_unattributed_without_a_webhook() -> None:
    config = dev_config(load_config(None, {}), NOT_REACHED)
    assert not config.webhook.enabled
    assert config.unattributed == "allow"


@pytest.mark.parametrize(
    ("settings", "want_port"),
    [
        pytest.param({}, 0, id="default-off"),
        pytest.param({"health_port": 9000}, 9000, id="flag-kept"),
        pytest.param({"health_port": 8081}, 8081, id="default-value-given-kept"),
    ],
)
def test_health_port_is_off_unless_given(settings: dict[str, Any], want_port: int) -> None:
    assert dev_config(load_config(None, settings), REACHED).health_port == want_port


def test_settings_of_a_file_are_kept_but_the_webhook_address() -> None:
    given = Config.model_validate(
        {
            "webhook": {"client_ca_file": "/ca.pem", "cert_dir": "/certs", "host": "0.0.0.0"},
            "workers": 4,
        }
    )
    config = dev_config(given, REACHED)
    assert config.workers == 4
    assert config.webhook.client_ca_file == "/ca.pem"
    assert config.webhook.cert_dir is None  # the dev webhook's certificate is its own
    assert config.webhook.host == "127.0.0.1"


def test_announcement_when_reached() -> None:
    text = "\n".join(announcement(dev_config(load_config(None, {}), REACHED), REACHED))
    assert "FOR TRYING IT OUT" in text
    assert "https://127.0.0.1:40123" in text
    assert (
        f"kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration {DEV_NAME}"
        in (text)
    )
    assert f"Secret {SECRET_NAMESPACE}/{DEV_NAME}" in text
    assert "unattributed: refuse" in text
    assert "webhook.client_ca_file unset" in text
    assert "NO ADMISSION WEBHOOK" not in text


def test_announcement_when_not_reached_warns() -> None:
    text = "\n".join(announcement(dev_config(load_config(None, {}), NOT_REACHED), NOT_REACHED))
    assert "NO ADMISSION WEBHOOK" in text
    assert "no call reached 127.0.0.1:40123 within 5s" in text
    assert "unattributed: allow" in text
    assert "THIS kubeconfig's user" in text
    assert "https://127.0.0.1" not in text
