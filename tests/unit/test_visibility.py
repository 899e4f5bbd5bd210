"""Positions and start estimates (core/visibility.py), and that positions follow the
scheduler's own order (a property over random cycles)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.models import Reason
from dispatcher.controller.visibility.pending import (
    NOT_JUDGED,
    Found,
    Visibility,
    in_line_order,
    kind_and_limit,
)
from dispatcher.core.model import QueueMode
from dispatcher.core.queues import QueueManager, take
from dispatcher.core.quota.resolve import Queued, QueueProblem
from dispatcher.core.scheduling import Wait, schedule
from dispatcher.core.visibility import (
    Durations,
    Occupant,
    Reserved,
    Waiting,
    clock,
    pending_view,
    rfc3339,
)
from tests.unit.builders import cluster, node, pods, workload

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC


def w(
    key: str,
    queue: str = "",
    local: str = "",
    *,
    reason: str = "",
    message: str = "",
    kind: str = "",
) -> Waiting:
    return Waiting(
        key=key,
        priority=0,
        queued_since=NOW - 60,
        cluster_queue=queue,
        local_queue=local,
        reason=reason,
        message=message,
        kind=kind,
    )


@dataclass(frozen=True)
class EtaCase:
    id: str
    order: tuple[Waiting, ...]
    active: tuple[Occupant, ...] = ()
    observed: tuple[tuple[str, str, float], ...] = ()  # (queue, kind, seconds)
    want_at: dict[str, float | None] = field(default_factory=dict)
    want_basis: dict[str, str] = field(default_factory=dict)


ETA_CASES = [
    EtaCase(
        "limit gives a bound after the one running",
        order=(w("a/one", "q"),),
        active=(Occupant("a/glue-1", NOW - 100, "q", "Job", 400.0),),
        want_at={"a/one": NOW + 300},
        want_basis={"a/one": f"after a/glue-1 ends, at the latest {clock(NOW + 300)}"},
    ),
    EtaCase(
        "second in line waits for the second end; the first's own end is unknown",
        order=(w("a/one", "q"), w("a/two", "q"), w("a/three", "q")),
        active=(
            Occupant("a/r1", NOW - 10, "q", "Job", 100.0),
            Occupant("a/r2", NOW - 10, "q", "Job", 50.0),
        ),
        want_at={"a/one": NOW + 40, "a/two": NOW + 90, "a/three": None},
        want_basis={
            "a/three": "unknown: nothing ahead has a known end (a/one next)",
        },
    ),
    EtaCase(
        "observed durations give an expected time, per queue and kind",
        order=(w("a/one", "q", kind="RayCluster"),),
        active=(Occupant("a/r1", NOW - 10, "q", "RayCluster"),),
        observed=(("q", "RayCluster", 70.0), ("q", "RayCluster", 50.0), ("q", "Job", 1.0)),
        want_at={"a/one": NOW + 50},
        want_basis={"a/one": f"after a/r1 ends, expected {clock(NOW + 50)}"},
    ),
    EtaCase(
        "observed durations come before a limit, which still caps them",
        order=(w("a/one", "q", kind="Job"), w("a/two", "q", kind="Job")),
        active=(
            Occupant("a/r1", NOW - 10, "q", "Job", 600.0),
            Occupant("a/r2", NOW - 10, "q", "Job", 20.0),
        ),
        observed=(("q", "Job", 40.0),),
        want_at={"a/one": NOW + 10, "a/two": NOW + 30},
        want_basis={
            "a/one": f"after a/r2 ends, at the latest {clock(NOW + 10)}",
            "a/two": f"after a/r1 ends, expected {clock(NOW + 30)}",
        },
    ),
    EtaCase(
        "an end already past starts it now",
        order=(w("a/one", "q"),),
        active=(Occupant("a/r1", NOW - 1000, "q", limit=10.0),),
        want_at={"a/one": NOW},
    ),
    EtaCase(
        "nothing known runs: unknown, saying so",
        order=(w("a/one", "q"),),
        active=(Occupant("a/r1", NOW - 10, "q"),),
        want_at={"a/one": None},
        want_basis={"a/one": "unknown: nothing ahead has a known end (a/r1 next)"},
    ),
    EtaCase(
        "nothing runs in its queue",
        order=(w("a/one", "q"), w("a/two")),
        active=(Occupant("a/r1", NOW - 10, "other", limit=5.0),),
        want_at={"a/one": None, "a/two": None},
        want_basis={
            "a/one": "unknown: nothing runs in q whose end would free room",
            "a/two": "unknown: nothing runs in capacity-only work whose end would free room",
        },
    ),
    EtaCase(
        "a stopped queue: unknown, with the queue's message",
        order=(
            w("a/one", "q", reason=str(Reason.QUEUE_NOT_READY), message="AppQueue a/q is stopped"),
        ),
        active=(Occupant("a/r1", NOW - 10, "q", limit=5.0),),
        want_at={"a/one": None},
        want_basis={"a/one": "unknown: AppQueue a/q is stopped"},
    ),
]


@pytest.mark.parametrize("case", ETA_CASES, ids=lambda c: c.id)
def test_eta(case: EtaCase) -> None:
    durations = Durations()
    for queue, kind, seconds in case.observed:
        durations.observe(queue, kind, seconds)
    view = pending_view(case.order, case.active, durations, NOW)
    for key, want in case.want_at.items():
        assert view.by_key[key].eta.at == want, key
    for key, want_basis in case.want_basis.items():
        assert view.by_key[key].eta.basis == want_basis, key


def test_positions_per_queue_local_and_overall() -> None:
    order = (
        w("a/one", "q1", "a/l"),
        w("b/two", "q2", "b/l"),
        w("a/three", "q1", "a/m"),
        w("c/four"),
        w("a/five", "q1", "a/l"),
    )
    view = pending_view(order, (), Durations(), NOW)
    got = {p.key: (p.position, p.queue_position, p.local_position) for p in view.items}
    assert got == {
        "a/one": (1, 1, 1),
        "b/two": (2, 1, 1),
        "a/three": (3, 2, 1),
        "c/four": (4, 1, 0),
        "a/five": (5, 3, 2),
    }
    assert [p.key for p in view.by_namespace["a"]] == ["a/one", "a/three", "a/five"]
    assert [p.key for p in view.by_local["a/l"]] == ["a/one", "a/five"]
    assert [p.key for p in view.by_queue[""]] == ["c/four"]


def test_durations_fall_back_to_queue_then_kind() -> None:
    durations = Durations(size=2)
    durations.observe("q", "Job", 10.0)
    durations.observe("q", "Job", 20.0)
    durations.observe("q", "Job", 30.0)  # the first leaves the record
    assert durations.expected("q", "Job") == 25.0
    assert durations.expected("q", "Pod") == 25.0  # same queue, any kind
    assert durations.expected("other", "Job") == 25.0  # same kind, any queue
    assert durations.expected("other", "Pod") is None


def test_kind_and_limit_read_as_written() -> None:
    obj = {
        "spec": {
            "resources": {"GenericItems": [{"generictemplate": {"kind": "RayCluster"}}]},
            "schedulingSpec": {"dispatchDuration": {"limit": 600}},
        }
    }
    assert kind_and_limit(obj) == ("RayCluster", 600.0)
    assert kind_and_limit({"spec": {"resources": "bad"}}) == ("", None)
    assert kind_and_limit(None) == ("", None)


@settings(max_examples=60, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(1, 6)), min_size=1, max_size=25
    ),
    mode=st.sampled_from(list(QueueMode)),
)
def test_positions_follow_the_cycles_order(
    specs: list[tuple[int, int, int]], mode: QueueMode
) -> None:
    """Every AppWrapper the cycle left waiting is listed, in the order the cycle took them
    (priority, then age, then name), numbered from 1 without gaps."""
    pending = [
        workload(f"ns/w{i}", pods(1, cpu=cpu), priority=priority, created_at=float(age))
        for i, (priority, age, cpu) in enumerate(specs)
    ]
    members = [cluster("c", node("n", cpu=8))]
    result = schedule(pending, members, mode=mode, now=NOW, starvation_after=1e9, preemption=None)
    held: list[tuple[str, float, str]] = []
    state = Visibility(
        running=lambda: iter(held), current=lambda key: None, finished=lambda k: False
    )
    state.observe(result, pending, NOW)
    view = state.view()
    waiting = {wait.key for wait in result.waits}
    assert [p.key for p in view.items] == [k for k in result.order if k in waiting]
    assert [p.position for p in view.items] == list(range(1, len(waiting) + 1))
    expected = sorted(pending, key=lambda x: (-x.priority, x.created_at, x.key))
    assert list(result.order) == [x.key for x in expected]


def test_finished_durations_are_recorded_between_cycles() -> None:
    held = [("ns/r", NOW - 100, "q")]
    finished: set[str] = set()
    state = Visibility(
        running=lambda: iter(list(held)), current=lambda key: None, finished=lambda k: k in finished
    )
    state.observe(None, [], NOW)
    assert [a.key for a in state.active()] == ["ns/r"]
    held.clear()
    finished.add("ns/r")
    state.observe(None, [], NOW + 50)
    assert state.durations.expected("q", "") == 150.0
    assert state.active() == []


@given(at=st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False))
def test_time_formats_agree_with_strftime(at: float) -> None:
    moment = datetime.fromtimestamp(at, UTC)
    assert rfc3339(at) == moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert clock(at) == moment.strftime("%H:%M UTC")


# One step between views: ("add", cpu, priority), ("cycle",), ("free",) capacity freed,
# ("drop", index) one pending removed (deleted or admitted elsewhere).
_step = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 6), st.integers(0, 3)),
    st.tuples(st.just("cycle")),
    st.tuples(st.just("free")),
    st.tuples(st.just("drop"), st.integers(0, 40)),
)


@settings(max_examples=80, deadline=None)
@given(steps=st.lists(_step, min_size=1, max_size=30), mode=st.sampled_from(list(QueueMode)))
def test_every_pending_one_is_listed_once_whatever_happened_since_the_cycle(
    steps: list[tuple[object, ...]], mode: QueueMode
) -> None:
    """Between cycles work arrives, leaves and is woken; the list asked for at any moment
    shows each AppWrapper pending then exactly once (never one that left), numbered from 1,
    and those no cycle judged yet say so."""
    queues = QueueManager()
    waits: dict[str, Wait] = {}
    resolved: dict[str, Queued | QueueProblem | None] = {}
    state = Visibility(
        running=lambda: iter(()),
        current=lambda key: None,
        finished=lambda k: False,
        changes=lambda: queues.changes,
    )
    members = [cluster("c", node("n", cpu=8))]

    def pending_now() -> Iterator[Found]:
        return in_line_order(queues, waits, resolved, lambda workload: None)

    for i, step in enumerate(steps):
        if step[0] == "add":
            cpu, priority = int(step[1]), int(step[2])  # type: ignore[call-overload]
            queues.upsert(workload(f"ns/w{i}", pods(1, cpu=cpu), priority=priority), "")
        elif step[0] == "free":
            queues.capacity_freed()
        elif step[0] == "drop" and len(queues):
            key = sorted(queues.workloads())[int(step[1]) % len(queues)]  # type: ignore[call-overload]
            queues.remove(key)
        elif step[0] == "cycle":
            judged = queues.active()
            result = take(
                queues, members, mode=mode, now=NOW, starvation_after=1e9, preemption=None
            )
            for admit in result.admits:
                waits.pop(admit.key, None)
            waits.update({wait.key: wait for wait in result.waits})
            state.observe(result, judged, NOW, pending_now)
        view = state.view() if state.cycles else None
        if view is None:
            continue
        listed = [p.key for p in view.items]
        assert sorted(listed) == sorted(queues.workloads())
        assert [p.position for p in view.items] == list(range(1, len(listed) + 1))
        for item in view.items:
            if item.key not in waits:
                assert item.reason == Reason.QUEUED
                assert item.message == NOT_JUDGED


def test_a_reserved_gang_starts_when_its_reservation_does() -> None:
    """Its estimate is the reservation's start, a bound, whatever runs ahead of it; the next
    one in line is estimated by the slot model as before."""
    active = [Occupant("a/long", NOW - 10, "q", "Job", None)]
    order = [
        Waiting("a/hero", 5, NOW - 5, "q", reserved=Reserved("c", ("n1",), NOW + 52, NOW + 52)),
        Waiting("a/next", 0, NOW - 1, "q"),
    ]
    view = pending_view(order, active, Durations(), NOW)
    hero = view.by_key["a/hero"].eta
    assert (hero.at, hero.latest) == (NOW + 52, True)
    assert "reserved" in hero.basis
    assert view.by_key["a/next"].eta.at is None  # nothing ahead has a known end


def test_a_reserved_gang_expected_before_its_latest_says_both_and_why() -> None:
    durations = Durations()
    for seconds in (30.0, 40.0, 50.0):  # of limits of 100 s: 40% as the median
        durations.observe("q", "Job", seconds, 100.0)
    durations.observe("q", "Job", 70.0)  # no limit: no share
    reserved = Reserved("c", ("n1", "n2"), NOW + 20, NOW + 600)
    order = [Waiting("a/hero", 5, NOW - 5, "q", reserved=reserved)]
    pending = pending_view(order, [], durations, NOW).by_key["a/hero"]
    assert pending.reserved == reserved
    hero = pending.eta
    assert (hero.at, hero.latest) == (NOW + 20, False)
    assert hero.basis == (
        "nodes reserved for it, expected from 08:00 UTC (declared limits: recent work ran"
        " 40% of its limit (median)), at the latest 08:10 UTC"
    )


def test_the_web_views_page_of_a_reserved_gang_names_its_nodes_escaped() -> None:
    from dispatcher.controller.visibility.webview import appwrapper_page

    reserved = Reserved("c<1>", ("n1", "n<2>"), NOW + 20, NOW + 60)
    order = [Waiting("a/hero", 5, NOW - 5, "q", reserved=reserved), Waiting("a/next", 0, NOW, "q")]
    view = pending_view(order, [], Durations(), NOW)
    obj = {"metadata": {"namespace": "a", "name": "hero"}, "status": {}}
    page = appwrapper_page(obj, view.by_key["a/hero"], NOW)
    assert "<p class='reserved'>reserved in cluster c&lt;1&gt;: n1, n&lt;2&gt;</p>" in page
    plain = appwrapper_page(obj, view.by_key["a/next"], NOW)
    assert "class='reserved'" not in plain
