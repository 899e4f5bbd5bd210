"""Whose error is it: only errors about the user's input fail the user's AppWrapper.

A bug of the dispatcher's own met while making the objects (here injected on purpose)
leaves the AppWrapper dispatched, says so in its status, and is retried with growing
pauses; once the bug is gone the objects are made. The user's mistakes, and only they, are
`UserInputError`."""

from __future__ import annotations

from typing import Any, cast

import pytest

from dispatcher.api.models import AppWrapper
from dispatcher.cluster import objects as objects_module
from dispatcher.cluster.objects import (
    DispatchError,
    UserInputError,
    create_all,
    wrapped_objects,
)
from dispatcher.kube.api import KubeApi
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import (
    BadRequest,
    Forbidden,
    Invalid,
    KubeError,
    ServerError,
    TooManyRequests,
    UnknownKind,
    Unreachable,
)
from testenv.fakeenv import fake_env
from testenv.manifests import appwrapper

Obj = dict[str, Any]


def config_map(name: str = "c") -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


def model(template: Obj) -> AppWrapper:
    aw = appwrapper("a", template)
    aw["metadata"].update(namespace="ns", uid="u-1")
    return AppWrapper.from_kube(aw)


def conditions(obj: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


async def test_a_bug_while_building_is_retried_not_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    async with fake_env() as env:
        await env.add_node("n1", cpu="8")
        await env.apply(appwrapper("a", config_map("a")))
        await env.reconcile("a")

        def broken(template: Any, labels: Any) -> Obj:
            raise KeyError("a bug of the dispatcher's")

        monkeypatch.setattr(objects_module, "inject_labels", broken)
        await env.cycle()  # dispatched: its first reconcile meets the bug
        first = await env.reconcile("a")
        second = await env.reconcile("a")
        current = await env.get("a")
        status = current["status"]
        assert status["state"] == "Running"  # still dispatched, its room held
        assert "Failed" not in conditions(current)
        running = conditions(current)["Running"]
        assert running["status"] == "False"
        assert running["reason"] == "DispatchFailed"
        assert "error of the dispatcher's own, not of this AppWrapper" in running["message"]
        assert "KeyError" in status["message"]
        assert (first, second) == (1.0, 2.0)  # growing pauses
        assert env.objects("v1", "ConfigMap") == []

        monkeypatch.undo()
        await env.reconcile("a")
        made = [o["metadata"]["name"] for o in env.objects("v1", "ConfigMap")]
        assert made == ["a"]
        assert "Failed" not in conditions(await env.get("a"))


def test_a_bug_while_building_is_not_called_the_users() -> None:
    """Not a DispatchError of any kind: the reconciler's own-error path takes it."""

    def broken(template: Any, labels: Any) -> Obj:
        raise KeyError("bug")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(objects_module, "inject_labels", broken)
        with pytest.raises(KeyError):
            wrapped_objects(model(config_map()), owner_reference=False)


def nested(depth: int) -> Obj:
    value: Obj = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("template", "want_in_message"),
    [
        pytest.param(
            {**config_map(), "metadata": {"name": "c", "ownerReferences": 1}},
            "metadata.ownerReferences is not a list",
            id="owner-references-not-a-list",
        ),
        pytest.param(
            {**config_map(), "data": nested(100_000)},
            "RecursionError",
            id="nested-deeper-than-the-interpreter-goes",
        ),
    ],
)
def test_templates_that_cannot_be_built_are_the_users(template: Obj, want_in_message: str) -> None:
    with pytest.raises(UserInputError, match="item 0: the object cannot be built") as raised:
        wrapped_objects(model(template), owner_reference=True)
    assert want_in_message in str(raised.value)


class Member:
    """A member that serves ConfigMaps (namespaced) and Namespaces (cluster-scoped), and
    answers creates with `answer`."""

    name = "member"

    def __init__(self, answer: KubeError | None) -> None:
        self.answer = answer

    async def resource_info(self, api_version: str, kind: str) -> ResourceInfo:
        if kind == "Unserved":
            raise UnknownKind(f"{api_version}/{kind} is not served")
        return ResourceInfo(api_version, kind, kind.lower() + "s", kind != "Namespace")

    async def create(self, *args: Any, **kwargs: Any) -> Obj:
        if self.answer is not None:
            raise self.answer
        return {}

    def forget_discovery(self, api_version: str) -> None:
        pass


@pytest.mark.parametrize(
    ("template", "answer", "want_users"),
    [
        pytest.param(config_map(), Invalid("data: invalid", status=422), True, id="invalid"),
        pytest.param(config_map(), BadRequest("bad body", status=400), True, id="bad-request"),
        pytest.param(config_map(), Forbidden("not allowed", status=403), True, id="forbidden"),
        pytest.param({**config_map(), "kind": "Unserved"}, None, True, id="kind-not-served-there"),
        pytest.param({**config_map(), "kind": "Namespace"}, None, True, id="cluster-scoped"),
        pytest.param(config_map(), ServerError("boom", status=500), False, id="server-error"),
        pytest.param(config_map(), Unreachable("no route"), False, id="unreachable"),
        pytest.param(config_map(), TooManyRequests("slow down", status=429), False, id="429"),
    ],
)
async def test_the_users_mistakes_and_only_they_are_user_input_errors(
    template: Obj, answer: KubeError | None, want_users: bool
) -> None:
    objects = wrapped_objects(model(template), owner_reference=False)
    with pytest.raises(DispatchError) as raised:
        await create_all(cast(KubeApi, Member(answer)), "ns", objects, uid="u-1")
    assert isinstance(raised.value, UserInputError) is want_users
