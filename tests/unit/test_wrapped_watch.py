"""Which changes of a wrapped object wake its AppWrapper (`cluster.member.telling`): its
deletion and a change of what its verdict reads, never its creation nor the status updates
its own controller makes all along."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.cluster.member import telling


def wrapped(*true: str, deleting: bool = False, version: str = "1") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "x", "resourceVersion": version}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    conditions = [{"type": t, "status": "True"} for t in true]
    conditions.append({"type": "Progressing", "status": "False"})
    return {"metadata": metadata, "status": {"conditions": conditions}}


@pytest.mark.parametrize(
    ("old", "new", "wakes"),
    [
        pytest.param(None, wrapped(), False, id="created"),
        pytest.param(wrapped(), None, True, id="deleted"),
        pytest.param(wrapped(), wrapped(deleting=True), True, id="being-deleted"),
        pytest.param(wrapped(), wrapped("Complete"), True, id="completed"),
        pytest.param(wrapped("Running"), wrapped("Failed"), True, id="failed"),
        pytest.param(wrapped("Ready"), wrapped("Ready", version="2"), False, id="status-update"),
    ],
)
def test_what_wakes_the_owner(
    old: dict[str, Any] | None, new: dict[str, Any] | None, wakes: bool
) -> None:
    seen: list[str] = []
    telling(lambda kind, _old, _new: seen.append(kind), conditions_read=lambda: True)(
        "EVENT", old, new
    )
    assert bool(seen) is wakes


@pytest.mark.parametrize(
    ("old", "new", "wakes"),
    [
        pytest.param(wrapped(), wrapped("HeadPodReady"), False, id="conditions-unread"),
        pytest.param(wrapped(), wrapped(deleting=True), True, id="being-deleted"),
        pytest.param(wrapped(), None, True, id="deleted"),
    ],
)
def test_a_kind_whose_completion_nobody_reads_wakes_only_when_it_goes(
    old: dict[str, Any] | None, new: dict[str, Any] | None, wakes: bool
) -> None:
    seen: list[str] = []
    telling(lambda kind, _old, _new: seen.append(kind), conditions_read=lambda: False)(
        "EVENT", old, new
    )
    assert bool(seen) is wakes


def test_a_deletion_the_dispatcher_asked_for_wakes_no_one() -> None:
    seen: list[str] = []
    member_says = {"u1"}

    def ours(uid: str, gone: bool) -> bool:
        mine = uid in member_says
        if mine and gone:
            member_says.discard(uid)
        return mine

    told = telling(lambda kind, _o, _n: seen.append(kind), conditions_read=lambda: True, ours=ours)
    mine = {**wrapped(), "metadata": {"name": "x", "uid": "u1"}}
    theirs = {**wrapped(), "metadata": {"name": "y", "uid": "u2"}}
    told("DELETED", mine, None)
    assert seen == []
    assert member_says == set()  # forgotten once gone
    told("DELETED", theirs, None)
    assert seen == ["DELETED"]
