"""When a member is given up on: one decision (`Member.lost`), read by the reconciler (a
stranded AppWrapper, an eviction's cleanup) and by upkeep alike."""

from __future__ import annotations

from typing import cast

import pytest

from dispatcher.clock import ManualClock
from dispatcher.cluster.capacity import CapacityCache
from dispatcher.cluster.member import Member
from dispatcher.kube.api import KubeApi

TIMEOUT = 60.0


class _Client:
    """Never called: the test reads the member's silence alone."""

    name = "m1"


def member(*, is_hub: bool, silent: float) -> Member:
    clock = ManualClock()
    found = Member(
        name="hub" if is_hub else "m1",
        client=cast(KubeApi, _Client()),
        is_hub=is_hub,
        capacity=CapacityCache(cluster="m1"),
        clock=clock,
    )
    found.nodes.synced.set()
    found.pods.synced.set()
    found.last_answer = clock.monotonic()
    clock.advance(silent)
    return found


@pytest.mark.parametrize(
    ("is_hub", "silent", "lost"),
    [
        (False, 0.0, False),
        (False, TIMEOUT - 1, False),
        (False, TIMEOUT + 1, True),
        (True, TIMEOUT + 1, False),  # the hub: nothing is decided while it is silent
        (True, 10 * TIMEOUT, False),
    ],
)
def test_a_member_is_lost_past_the_timeout_and_the_hub_never(
    is_hub: bool, silent: float, lost: bool
) -> None:
    assert member(is_hub=is_hub, silent=silent).lost(TIMEOUT) is lost
