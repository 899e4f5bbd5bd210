"""From an AppWrapper to the core's Workload: its age within a second.

Cluster selectors are tested in test_selectors.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

from dispatcher.api.models import AppWrapper
from dispatcher.core.model import Workload
from dispatcher.core.scheduling import queue_order_key
from dispatcher.core.workloads import workload_of


def _aw(name: str, queued_at: str | None) -> AppWrapper:
    obj = {
        "apiVersion": "workload.codeflare.dev/v1beta1",
        "kind": "AppWrapper",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": name,
            "creationTimestamp": "2026-01-01T00:00:05Z",
        },
        "spec": {},
    }
    if queued_at:
        obj["status"] = {"queuedAt": queued_at}
    return AppWrapper.from_kube(obj)


def test_new_appwrapper_sorts_after_an_older_one_of_the_same_second() -> None:
    now = datetime(2026, 1, 1, 0, 0, 5, 900000, tzinfo=UTC)
    older = workload_of(
        _aw("z-older", "2026-01-01T00:00:05.400000Z"), priority=0, allowed_kinds=None, now=now
    )
    newer = workload_of(_aw("a-newer", None), priority=0, allowed_kinds=None, now=now)
    assert isinstance(older, Workload)
    assert isinstance(newer, Workload)
    assert sorted([newer, older], key=queue_order_key) == [older, newer]
