"""Protection from preemption, pure: the annotations read as hostile input, the effective
minimum runtime, checkpoints held to the attempt, the notice's deadline written and read back,
and the victim search that leaves protected work alone (core/protection.py,
core/scheduling/preemption.py)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.config import Config, ProtectionConfig
from dispatcher.controller.access.gatekeeper import Gatekeeper
from dispatcher.core import protection
from dispatcher.core.model import DispatchedWorkload
from dispatcher.core.protection import (
    CHECKPOINTED_AT,
    MAX_NOTICE_SECONDS,
    MINIMUM_RUNTIME,
    Unset,
    annotation_problems,
    asked,
    checkpoint_within,
    effective_minimum_runtime,
    notice_seconds,
    removal_time,
    with_notice,
)
from dispatcher.core.quota.model import QueueSpec
from dispatcher.core.scheduling import LowestPriorityFirst
from dispatcher.core.validation import annotation_problems as webhook_problems
from testenv.fakekube import FakeKube
from testenv.manifests import appwrapper, deployment
from tests.unit.builders import cluster, node, pods, res, running, with_running, workload

T0 = 1_700_000_000.0
NOW = datetime.fromtimestamp(T0, UTC)


def settings(**values: float) -> ProtectionConfig:
    return ProtectionConfig(**values)


# -- the annotations, as a tenant may write them ------------------------------------------------

ASKS: list[Any] = [
    pytest.param("90s", 90.0, id="seconds"),
    pytest.param("10m", 600.0, id="minutes"),
    pytest.param("1h30m", 5400.0, id="hours-and-minutes"),
    pytest.param("0", 0.0, id="zero"),
    pytest.param("168h", 604800.0, id="the-most-any-queue-grants"),
    pytest.param("168h1s", None, id="more-than-any-queue-grants"),
    pytest.param("99999999999999999999h", None, id="huge"),
    pytest.param("-5m", None, id="negative"),
    pytest.param("+5m", None, id="signed"),
    pytest.param("10", None, id="no-unit"),
    pytest.param("ten minutes", None, id="garbage"),
    pytest.param("1e9s", None, id="exponent"),
    pytest.param("NaNs", None, id="nan"),
    pytest.param("infh", None, id="inf"),
    pytest.param("\u0665m", None, id="unicode-digit"),
    pytest.param("1" * 10_000 + "s", None, id="10-KB"),
    pytest.param("", None, id="empty"),
]


@pytest.mark.parametrize(("value", "want"), ASKS)
def test_minimum_runtime_annotation(value: str, want: float | None) -> None:
    found = asked({MINIMUM_RUNTIME: value})
    assert found.minimum_runtime == want
    problems = annotation_problems({MINIMUM_RUNTIME: value})
    assert bool(problems) == (want is None)
    assert bool(found.problems) == (want is None)
    for problem in problems:
        assert problem.startswith(f"metadata.annotations[{MINIMUM_RUNTIME}]: ")
        assert len(problem) < 300  # a 10 KB value is never echoed back


CHECKPOINTS: list[Any] = [
    pytest.param("2023-11-14T22:13:20Z", T0, id="utc"),
    pytest.param("2023-11-14T22:13:20.5Z", T0 + 0.5, id="fraction"),
    pytest.param("2023-11-14T22:13:20.123456789Z", T0 + 0.123456, id="nanoseconds"),
    pytest.param("2023-11-15T00:13:20+02:00", T0, id="offset"),
    pytest.param("2023-11-14t22:13:20z", T0, id="lower-case"),
    pytest.param("2023-11-14 22:13:20Z", None, id="space"),
    pytest.param("2023-11-14T22:13:20", None, id="no-zone"),
    pytest.param("2023-13-14T22:13:20Z", None, id="month-13"),
    pytest.param("2023-11-14T22:13:20+24:00", None, id="offset-24h"),
    pytest.param("1700000000", None, id="epoch-seconds"),
    pytest.param("yesterday", None, id="garbage"),
    pytest.param("2023-11-14T22:13:20Z" + " " * 10_000, None, id="10-KB"),
    pytest.param("0001-01-01T00:00:00Z", -62135596800.0, id="year-1"),
]


@pytest.mark.parametrize(("value", "want"), CHECKPOINTS)
def test_checkpoint_annotation(value: str, want: float | None) -> None:
    found = asked({CHECKPOINTED_AT: value})
    assert found.checkpointed_at == (pytest.approx(want) if want is not None else None)
    assert bool(annotation_problems({CHECKPOINTED_AT: value})) == (want is None)


def test_values_that_are_not_strings_are_no_ask() -> None:
    found = asked({MINIMUM_RUNTIME: 600, CHECKPOINTED_AT: None})
    assert (found.minimum_runtime, found.checkpointed_at) == (None, None)
    assert len(found.problems) == 2


def test_other_annotations_and_none_ask_nothing() -> None:
    assert asked(None) == protection.Asked()
    assert asked({"workload.codeflare.dev/other": "10m"}) == protection.Asked()
    assert annotation_problems({"workload.codeflare.dev/other": "-1"}) == []


def test_the_webhook_refuses_a_bad_value_set_or_changed_not_one_stored_before() -> None:
    def aw(**annotations: str) -> dict[str, Any]:
        return {"metadata": {"name": "a", "annotations": annotations}}

    bad = {MINIMUM_RUNTIME: "forever"}
    assert webhook_problems(aw(**bad), None) == [
        f"metadata.annotations[{MINIMUM_RUNTIME}]: 'forever' is not a duration like 90s,"
        " 5m or 1h30m"
    ]
    # Stored while the webhook was away: a label or finalizer change must still pass.
    assert webhook_problems(aw(**bad), aw(**bad)) == []
    assert webhook_problems(aw(**{MINIMUM_RUNTIME: "-1s"}), aw(**bad)) != []
    assert webhook_problems(aw(**{MINIMUM_RUNTIME: "5m"}), aw(**bad)) == []
    assert webhook_problems(aw(), aw(**bad)) == []  # removing it is fine
    assert webhook_problems({"metadata": {"annotations": "junk"}}, None) == []
    assert webhook_problems({}, None) == []
    assert webhook_problems(aw(**{CHECKPOINTED_AT: "now"}), None) == [
        f"metadata.annotations[{CHECKPOINTED_AT}]: 'now' is not an RFC 3339 time like"
        " 2025-01-31T12:00:00Z"
    ]


# -- the effective minimum runtime --------------------------------------------------------------

QUEUE_10M = QueueSpec(name="q", minimum_runtime=600.0)
QUEUE_NONE = QueueSpec(name="q")
EFFECTIVE: list[Any] = [
    pytest.param(None, QUEUE_10M, settings(), 600.0, id="queue-default"),
    pytest.param(0.0, QUEUE_10M, settings(), 600.0, id="queue-zero-ask-is-none"),
    pytest.param(120.0, QUEUE_10M, settings(), 120.0, id="queue-less-asked"),
    pytest.param(7200.0, QUEUE_10M, settings(), 600.0, id="queue-caps-the-ask"),
    pytest.param(
        7200.0, QUEUE_10M, settings(max_minimum_runtime_seconds=60), 600.0, id="queue-not-setting"
    ),
    pytest.param(None, QUEUE_NONE, settings(minimum_runtime_seconds=30), 30.0, id="queue-none"),
    pytest.param(7200.0, QUEUE_NONE, settings(), 3600.0, id="queue-none-setting-caps"),
    pytest.param(None, None, settings(), 0.0, id="no-queue-nothing"),
    pytest.param(None, None, settings(minimum_runtime_seconds=45), 45.0, id="no-queue-default"),
    pytest.param(90.0, None, settings(), 90.0, id="no-queue-ask"),
    pytest.param(
        9000.0, None, settings(max_minimum_runtime_seconds=600), 600.0, id="no-queue-capped"
    ),
    pytest.param(
        None,
        None,
        settings(minimum_runtime_seconds=900, max_minimum_runtime_seconds=600),
        600.0,
        id="default-above-cap",
    ),
    pytest.param(float("inf"), None, settings(), 0.0, id="not-finite-is-none"),
    pytest.param(-5.0, None, settings(), 0.0, id="negative-is-none"),
]


@pytest.mark.parametrize(("ask", "queue", "defaults", "want"), EFFECTIVE)
def test_effective_minimum_runtime(
    ask: float | None, queue: QueueSpec | None, defaults: ProtectionConfig, want: float
) -> None:
    assert effective_minimum_runtime(ask, queue, defaults) == want


def test_unset_is_the_settings_defaults() -> None:
    unset, config = Unset(), ProtectionConfig()
    assert (
        unset.minimum_runtime_seconds,
        unset.max_minimum_runtime_seconds,
        unset.notice_seconds,
    ) == (
        config.minimum_runtime_seconds,
        config.max_minimum_runtime_seconds,
        config.notice_seconds,
    )


def test_notice_is_the_queues_or_the_settings() -> None:
    assert notice_seconds(QueueSpec(name="q", notice_seconds=30), settings(notice_seconds=5)) == 30
    assert notice_seconds(QueueSpec(name="q"), settings(notice_seconds=5)) == 0
    assert notice_seconds(None, settings(notice_seconds=5)) == 5


# -- checkpoints: claiming one never makes preempting costlier ----------------------------------


@given(
    at=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    dispatched=st.floats(min_value=0, max_value=2e9),
    ran=st.floats(min_value=0, max_value=1e7),
)
def test_a_checkpoint_is_held_to_the_attempt(
    at: float | None, dispatched: float, ran: float
) -> None:
    now = dispatched + ran
    held = checkpoint_within(at, dispatched_at=dispatched, now=now)
    if at is None or at != at or at in (float("inf"), float("-inf")):
        assert held == 0.0
        return
    assert dispatched <= held <= now
    since = max(dispatched, held)
    # The runtime its eviction loses: never more than with no checkpoint, never negative.
    assert 0 <= now - since <= now - dispatched


# -- the notice's deadline, written in the condition and read back -------------------------------


def test_the_deadline_is_written_and_read_back() -> None:
    message = with_notice("preempted by ns/high, priority 10", NOW.replace(second=50), 30)
    assert message == (
        "preempted by ns/high, priority 10; its objects are removed at"
        " 2023-11-14T22:13:50.000000Z (30s notice: checkpoint before then)"
    )
    assert removal_time(message, T0) == T0 + 30
    assert removal_time("preempted by ns/high, priority 10", T0) == T0  # no notice


@pytest.mark.parametrize(
    ("message", "want"),
    [
        pytest.param("x; its objects are removed at 2999-01-01T00:00:00Z (", T0 + 3600, id="far"),
        pytest.param("x; its objects are removed at 2000-01-01T00:00:00Z (", T0, id="before"),
        pytest.param("x; its objects are removed at tomorrow (", T0, id="garbage"),
        pytest.param("x; its objects are removed at ", T0, id="cut"),
        pytest.param(
            "its objects are removed at 2023-11-14T22:13:25Z ("
            "; its objects are removed at 2023-11-14T22:13:40Z (",
            T0 + 20,
            id="last-wins",
        ),
    ],
)
def test_a_deadline_read_back_is_bounded(message: str, want: float) -> None:
    assert removal_time(message, T0) == want
    assert T0 <= removal_time(message, T0) <= T0 + MAX_NOTICE_SECONDS


# -- the victim search ----------------------------------------------------------------------------

ONE_NODE = cluster("c", node("n1", gpu=8))
URGENT = workload("ns/urgent", pods(1, gpu=4), priority=5)


def guarded(
    key: str, *, until: float = 0.0, checkpoint: float = 0.0, **kw: Any
) -> DispatchedWorkload:
    return replace(running(key, **kw), protected_until=until, checkpointed_at=checkpoint)


SEARCH: list[Any] = [
    pytest.param(
        (
            guarded("ns/young", dispatched_at=90, until=150, usage={"n1": res(gpu=4)}),
            guarded("ns/old", dispatched_at=10, until=70, usage={"n1": res(gpu=4)}),
        ),
        ("ns/old",),
        {},
        id="protected-skipped",
    ),
    pytest.param(
        (
            guarded("ns/a", dispatched_at=90, until=130, usage={"n1": res(gpu=4)}),
            guarded("ns/b", dispatched_at=80, until=120, usage={"n1": res(gpu=4)}),
        ),
        None,
        {"ns/urgent": 120.0},
        id="all-protected-noted-earliest",
    ),
    pytest.param(
        (
            guarded("ns/a", dispatched_at=90, until=130, usage={"n1": res(gpu=2)}),
            guarded("ns/b", dispatched_at=80, until=120, usage={"n1": res(gpu=2)}),
            guarded("ns/c", priority=9, dispatched_at=0, usage={"n1": res(gpu=4)}),
        ),
        None,
        {"ns/urgent": 130.0},
        id="needs-both-noted-latest",
    ),
    pytest.param(
        (
            guarded("ns/a", dispatched_at=90, until=130, usage={"n1": res(gpu=4)}),
            guarded("ns/high", priority=9, dispatched_at=0, usage={"n1": res(gpu=4)}),
        ),
        None,
        {"ns/urgent": 130.0},
        id="protected-and-higher",
    ),
    pytest.param(
        (guarded("ns/high", priority=9, usage={"n1": res(gpu=8)}),),
        None,
        {},
        id="not-protection-no-note",
    ),
    pytest.param(
        (
            guarded("ns/a", dispatched_at=50, checkpoint=95, usage={"n1": res(gpu=4)}),
            guarded("ns/b", dispatched_at=60, usage={"n1": res(gpu=4)}),
        ),
        ("ns/a",),
        {},
        id="least-runtime-lost",
    ),
    pytest.param(
        (
            guarded("ns/a", priority=1, dispatched_at=50, checkpoint=99, usage={"n1": res(gpu=4)}),
            guarded("ns/b", priority=0, dispatched_at=10, usage={"n1": res(gpu=4)}),
        ),
        ("ns/b",),
        {},
        id="priority-before-runtime-lost",
    ),
    pytest.param(
        (
            guarded("ns/a", dispatched_at=50, usage={"n1": res(gpu=4)}),
            guarded("ns/b", dispatched_at=60, usage={"n1": res(gpu=4)}),
        ),
        ("ns/b",),
        {},
        id="then-most-recent",
    ),
    pytest.param(
        (guarded("ns/a", dispatched_at=40, until=100, usage={"n1": res(gpu=8)}),),
        ("ns/a",),
        {},
        id="protection-ends-at-now",
    ),
]


@pytest.mark.parametrize(("admitted", "want", "want_noted"), SEARCH)
def test_protected_work_is_no_victim(
    admitted: tuple[DispatchedWorkload, ...],
    want: tuple[str, ...] | None,
    want_noted: dict[str, float],
) -> None:
    noted: dict[str, float] = {}
    policy = LowestPriorityFirst(now=100.0, protected=noted)
    assert policy.choose_victims(URGENT, with_running(ONE_NODE, *admitted)) == want
    assert noted == want_noted


def test_without_a_time_protection_is_not_looked_at() -> None:
    snapshot = with_running(ONE_NODE, guarded("ns/a", until=1e12, usage={"n1": res(gpu=8)}))
    assert LowestPriorityFirst().choose_victims(URGENT, snapshot) == ("ns/a",)


# -- the admission webhook --------------------------------------------------------------------


def _review(operation: str, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "uid": "r1",
        "operation": operation,
        "namespace": "team",
        "userInfo": {"username": "alice", "uid": "u1", "groups": ["team"]},
        "object": obj,
        "oldObject": old,
    }


def _annotated(**annotations: str) -> dict[str, Any]:
    obj = appwrapper("a", deployment("a", 1, {"cpu": "1"}))
    obj["metadata"].update(namespace="team", annotations=annotations)
    return obj


async def test_the_webhook_answers_with_the_annotation_named() -> None:
    hub = FakeKube(name="hub")
    admission = Gatekeeper(
        config=Config(unattributed="allow"), hub=hub, discovery=[hub], signing_keys=lambda: []
    )

    async def nothing_refused(*_: Any) -> str:
        return ""  # the fake answers no access reviews: every right is granted here

    admission.reviews.refused = nothing_refused  # type: ignore[method-assign, assignment]
    huge = _annotated(**{MINIMUM_RUNTIME: "9" * 10_000 + "h"})
    answer = await admission.validate(_review("CREATE", huge, None))
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert f"metadata.annotations[{MINIMUM_RUNTIME}]: a value of 10001 characters" in message
    assert len(message) < 1000
    fine = _annotated(**{MINIMUM_RUNTIME: "10m", CHECKPOINTED_AT: "2025-01-31T12:00:00Z"})
    assert (await admission.validate(_review("CREATE", fine, None)))["allowed"] is True
    # A metadata-only update: a bad value set is refused, one stored before is let through.
    bad = _annotated(**{CHECKPOINTED_AT: "soon"})
    assert (await admission.validate(_review("UPDATE", bad, fine)))["allowed"] is False
    relabelled = _annotated(**{CHECKPOINTED_AT: "soon"})
    relabelled["metadata"]["labels"] = {"x": "y"}
    assert (await admission.validate(_review("UPDATE", relabelled, bad)))["allowed"] is True


@pytest.mark.parametrize(
    ("checkpoint", "want"),
    [
        pytest.param(None, 100.0, id="no-checkpoint-since-dispatch"),
        pytest.param(1080.0, 20.0, id="since-the-checkpoint"),
        pytest.param(900.0, 100.0, id="a-checkpoint-before-this-attempt-saved-nothing-of-it"),
        pytest.param(5000.0, 0.0, id="a-future-checkpoint-counts-as-now"),
        pytest.param(float("nan"), 100.0, id="unreadable-is-none"),
    ],
)
def test_runtime_lost(checkpoint: float | None, want: float) -> None:
    lost = protection.runtime_lost(dispatched_at=1000.0, checkpointed_at=checkpoint, at=1100.0)
    assert lost == want
