"""What a tenant may read of the queue (core/visibility.py): other namespaces' AppWrappers
named in estimates and wait messages are hidden, how many stays; which cluster queues a
namespace's users may see."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.core.mentions import OTHER
from dispatcher.core.quota.model import LocalQueue, QueueSpec, QuotaSetup, Selector
from dispatcher.core.visibility import (
    Durations,
    Occupant,
    Waiting,
    audiences,
    named_namespaces,
    pending_view,
    redacted,
)

NOW = 1_800_000_000.0


def view_of(order: list[Waiting], active: list[Occupant]):  # type: ignore[no-untyped-def]
    return pending_view(order, active, Durations(), NOW)


@dataclass(frozen=True)
class RedactCase:
    id: str
    key: str
    message: str
    visible: frozenset[str]
    want_message: str
    want_basis_start: str


ORDER = [
    Waiting("team-b/big", 5, NOW - 60, "cq"),
    Waiting(
        "team-a/mine",
        0,
        NOW - 30,
        "cq",
        message="waiting behind team-b/big (head of queue cq); preempting team-b/v1, team-a/v2",
    ),
]
ACTIVE = [
    Occupant("team-b/v1", NOW - 100, "cq", "Job", 400.0),
    Occupant("team-a/v2", NOW - 100, "other", "Job", 400.0),
]

REDACT_CASES = [
    RedactCase(
        "other namespace hidden, count and own names kept",
        key="team-a/mine",
        message="",
        visible=frozenset({"team-a"}),
        want_message=(f"waiting behind {OTHER} (head of queue cq); preempting {OTHER}, team-a/v2"),
        want_basis_start=f"unknown: nothing ahead has a known end ({OTHER} next)",
    ),
    RedactCase(
        "a user who sees both namespaces reads every name",
        key="team-a/mine",
        message="",
        visible=frozenset({"team-a", "team-b"}),
        want_message=(
            "waiting behind team-b/big (head of queue cq); preempting team-b/v1, team-a/v2"
        ),
        want_basis_start="unknown: nothing ahead has a known end (team-b/big next)",
    ),
    RedactCase(
        "the first in line names what runs in another namespace",
        key="team-b/big",
        message="",
        visible=frozenset({"team-a"}),
        want_message="",
        want_basis_start=f"after {OTHER} ends, at the latest",
    ),
]


@pytest.mark.parametrize("case", REDACT_CASES, ids=lambda c: c.id)
def test_redacted(case: RedactCase) -> None:
    view = view_of(ORDER, ACTIVE)

    def known(key: str) -> bool:
        return key in view.by_key or key in view.active

    got = redacted(view.by_key[case.key], known, case.visible)
    assert got.message == case.want_message
    assert got.eta.basis.startswith(case.want_basis_start)
    assert got.eta.at == view.by_key[case.key].eta.at
    if case.visible >= {"team-a", "team-b"}:
        assert got is view.by_key[case.key]


def test_named_namespaces_are_those_of_appwrappers_only() -> None:
    view = view_of(
        [Waiting("team-a/x", 0, NOW, "cq", message="needs 4 nvidia.com/gpu; behind team-c/y")],
        [Occupant("team-c/y", NOW - 10, "cq", "Job", None)],
    )

    def known(key: str) -> bool:
        return key in view.by_key or key in view.active

    assert named_namespaces(view.by_key["team-a/x"], known) == {"team-c"}
    got = redacted(view.by_key["team-a/x"], known, {"team-a"})
    assert got.message == f"needs 4 nvidia.com/gpu; behind {OTHER}"


NAMESPACE = st.sampled_from(["team-a", "team-b", "team-c"])
NAME = st.sampled_from(["x", "y", "z.1"])


@given(
    keys=st.lists(st.tuples(NAMESPACE, NAME), min_size=1, max_size=6, unique=True),
    visible=st.frozensets(NAMESPACE),
)
def test_no_hidden_namespace_is_ever_named(
    keys: list[tuple[str, str]], visible: frozenset[str]
) -> None:
    """Whatever the line, what a user reads names no AppWrapper of a namespace they may
    not see, and hides as many as it named."""
    order = [
        Waiting(
            f"{ns}/{name}",
            0,
            NOW,
            "cq",
            message="behind " + ", ".join(f"{a}/{b}" for a, b in keys),
        )
        for ns, name in keys
    ]
    view = view_of(
        order, [Occupant(f"{ns}/run-{name}", NOW - 5, "cq", "", 60.0) for ns, name in keys]
    )

    def known(key: str) -> bool:
        return key in view.by_key or key in view.active

    for item in view.items:
        got = redacted(item, known, visible | {item.namespace})
        text = got.message + " " + got.eta.basis
        for ns, name in keys:
            for key in (f"{ns}/{name}", f"{ns}/run-{name}"):
                if ns not in visible | {item.namespace}:
                    assert key not in text.replace(OTHER, "")
        hidden = sum(1 for ns, _ in keys if ns not in visible | {item.namespace})
        assert got.message.count(OTHER) == hidden


def test_a_queue_is_seen_by_the_namespaces_whose_appqueues_it_admits() -> None:
    setup = QuotaSetup(
        queues={
            "open": QueueSpec(name="open", namespaces=Selector()),
            "gold": QueueSpec(name="gold", namespaces=Selector((("tier", "gold"),))),
            "closed": QueueSpec(name="closed", namespaces=None),
        },
        local_queues={
            ("team-a", "q"): LocalQueue("team-a", "q", "gold"),
            ("team-b", "q"): LocalQueue("team-b", "q", "gold"),  # not gold: not admitted
            ("team-b", "all"): LocalQueue("team-b", "all", "open"),
            ("team-c", "q"): LocalQueue("team-c", "q", "closed"),
            ("team-c", "gone"): LocalQueue("team-c", "gone", "missing"),
        },
        namespace_labels={"team-a": {"tier": "gold"}, "team-b": {"tier": "silver"}},
    )
    assert audiences(setup) == {"gold": ("team-a",), "open": ("team-b",)}
