"""The mutating webhook sets the dispatcher's finalizer at CREATE (no PATCH per AppWrapper)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from dispatcher.api.constants import FINALIZER
from dispatcher.config import Config
from dispatcher.controller.access.gatekeeper import Gatekeeper
from testenv.fakekube import FakeKube
from testenv.manifests import appwrapper, deployment


def _request(operation: str, finalizers: list[str] | None) -> dict[str, Any]:
    obj = appwrapper("a", deployment("a", 1, {"cpu": "1"}))
    obj["metadata"]["namespace"] = "team"
    if finalizers is not None:
        obj["metadata"]["finalizers"] = finalizers
    return {
        "uid": "r1",
        "operation": operation,
        "namespace": "team",
        "userInfo": {"username": "alice", "uid": "u1", "groups": ["team"]},
        "object": obj,
        "oldObject": obj if operation == "UPDATE" else None,
    }


def _finalizer_ops(answer: dict[str, Any]) -> list[dict[str, Any]]:
    if "patch" not in answer:
        return []
    ops = json.loads(base64.b64decode(answer["patch"]))
    return [op for op in ops if op["path"].startswith("/metadata/finalizers")]


@pytest.mark.parametrize(
    ("operation", "finalizers", "keys", "want_ops"),
    [
        pytest.param(
            "CREATE",
            None,
            [],
            [{"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}],
            id="create-none",
        ),
        pytest.param(
            "CREATE",
            ["example.com/other"],
            [b"k" * 32],
            [{"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}],
            id="create-beside-another-signed",
        ),
        pytest.param("CREATE", [FINALIZER], [], [], id="create-has-it"),
        pytest.param("UPDATE", None, [b"k" * 32], [], id="update-never"),
    ],
)
async def test_mutate_sets_the_finalizer_at_create(
    operation: str, finalizers: list[str] | None, keys: list[bytes], want_ops: list[Any]
) -> None:
    hub = FakeKube(name="hub")
    admission = Gatekeeper(
        config=Config(unattributed="allow"), hub=hub, discovery=[hub], signing_keys=lambda: keys
    )
    answer = await admission.mutate(_request(operation, finalizers))
    assert answer["allowed"] is True
    assert _finalizer_ops(answer) == want_ops
    if keys and operation == "CREATE":
        ops = json.loads(base64.b64decode(answer["patch"]))
        assert any(op["path"].startswith("/metadata/annotations") for op in ops)  # signed too
