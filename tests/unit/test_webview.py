"""The web view's HTML (controller/visibility/webview.py) and the front proxy's checks
(controller/visibility/api.py): names and messages are user input, callers must be the
API server's front proxy."""

from __future__ import annotations

import time

from dispatcher.controller.visibility.api import FrontProxy, item_of
from dispatcher.controller.visibility.webview import (
    QueueRow,
    UsageBar,
    appwrapper_page,
    queues_page,
)
from dispatcher.core.visibility import Eta, Pending
from dispatcher.kube import certplan

NOW = 1_800_000_000.0
EVIL = "<script>alert('x')</script>"


def pending(message: str = EVIL) -> Pending:
    return Pending(
        key="team-a/job-1",
        priority=5,
        queued_since=NOW - 300,
        cluster_queue="cq",
        local_queue="team-a/main",
        reason="QuotaExceeded",
        message=message,
        position=1,
        queue_position=1,
        local_position=1,
        eta=Eta(NOW + 60, f"after {EVIL} ends", latest=True),
    )


def test_every_user_text_is_escaped() -> None:
    row = QueueRow(f"cq{EVIL}", (UsageBar("f", "cpu", 3000, 4000),), 1, 1, False, EVIL)
    page = queues_page([row], [pending()], NOW, "/apis/x/v1alpha1")
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "3 of 4" in page
    obj = {
        "metadata": {"namespace": "team-a", "name": "job-1"},
        "status": {"conditions": [{"type": "Failed", "status": "True", "message": EVIL}]},
    }
    assert "<script>" not in appwrapper_page(obj, pending(), NOW)


def test_usage_over_nominal_is_marked() -> None:
    row = QueueRow("cq", (UsageBar("f", "cpu", 6000, 4000, borrowed=2000),), 0, 2, True, "")
    page = queues_page([row], [], NOW, "/b")
    assert "class='over'" in page
    assert "6 of 4 (2 borrowed)" in page
    assert "nothing pending" in page


def test_item_as_the_api_shows_it() -> None:
    item = item_of(pending("why"), NOW)
    assert item["metadata"] == {"name": "job-1", "namespace": "team-a"}
    assert item["appQueue"] == "main"
    assert item["waitingSeconds"] == 300
    assert item["eta"] == {
        "at": "2027-01-15T08:01:00Z",
        "latest": True,
        "basis": f"after {EVIL} ends",
    }


def test_front_proxy_believes_only_its_ca_and_names() -> None:
    now = time.time()
    ca = certplan.make_ca(now, 3600, name="front-proxy-ca")
    other = certplan.make_ca(now, 3600, name="other-ca")
    proxy = FrontProxy.from_configmap(
        {"requestheader-allowed-names": '["front-proxy-client"]'}, ca_pem=ca.cert_pem, names=None
    )
    good = certplan.issue_client(ca, "front-proxy-client", now, 3600)
    wrong_name = certplan.issue_client(ca, "someone", now, 3600)
    wrong_ca = certplan.issue_client(other, "front-proxy-client", now, 3600)
    from cryptography.hazmat.primitives.serialization import Encoding

    def der(pair: certplan.KeyPair) -> bytes:
        return pair.cert.public_bytes(Encoding.DER)

    assert proxy.problem(der(good)) == ""
    assert "requestheader-allowed-names" in proxy.problem(der(wrong_name))
    assert "not issued by" in proxy.problem(der(wrong_ca))
    assert "no client certificate" in proxy.problem(None)
    headers = {"X-Remote-User": "alice", "X-Remote-Extra-Scopes": "a"}
    groups = {
        "X-Remote-Group": ["dev", "system:authenticated"],
        "X-Remote-Extra-Scopes": ["a", "b"],
    }
    user = proxy.user(headers, lambda h: groups.get(h, []))
    assert user.username == "alice"
    assert user.groups == ("dev", "system:authenticated")
    assert user.extra == (("scopes", ("a", "b")),)
