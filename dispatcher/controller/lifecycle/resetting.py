"""Resets of a dispatched AppWrapper (the v1beta2 fault-tolerance annotations, decided by
`core.lifecycle.assess` as `Verdict.RESET`): its objects are removed, the retry pause runs,
and its objects are made again, all while it stays Dispatched, so its room and its quota
stay its own as the AppWrapper controller keeps them through a reset
(`conditions.mark_resetting` / `end_reset`).

Also the failure grace period's start: when the current attempt was first seen with failed
pods. Kept in memory: after a restart the grace period starts again (a reset comes later,
never sooner).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from dispatcher.api.models import AppWrapper, AppWrapperStatus
from dispatcher.cluster.member import Member
from dispatcher.controller.lifecycle.making import Maker
from dispatcher.controller.lifecycle.progress import seconds_since
from dispatcher.core import conditions as cond
from dispatcher.core.conditions import Transition

C = cond.C
REMOVAL_POLL_SECONDS = 1.0
"""While a reset's objects are being deleted, look again this often."""


@dataclass(frozen=True, slots=True)
class ResetStep:
    """What one look at a resetting AppWrapper came to: `transition` to write (the pause is
    over), else look again after `wait` seconds."""

    transition: Transition | None = None
    wait: float = 0.0


@dataclass(slots=True)
class Resets:
    maker: Maker
    _failing_since: dict[str, tuple[str, float]] = field(default_factory=dict)
    """key -> (lastDispatchedAt of the attempt, when it was first seen with failed pods)."""

    def seconds_failing(
        self, key: str, status: AppWrapperStatus, *, failing: bool, now: float
    ) -> float:
        """Seconds the current attempt has been seen failing (0 when it is not)."""
        attempt = status.lastDispatchedAt or ""
        if not failing:
            self._failing_since.pop(key, None)
            return 0.0
        seen = self._failing_since.get(key)
        if seen is None or seen[0] != attempt:
            seen = self._failing_since[key] = (attempt, now)
        return now - seen[1]

    def forget(self, key: str) -> None:
        self._failing_since.pop(key, None)

    async def step(
        self,
        aw: AppWrapper,
        status: AppWrapperStatus,
        member: Member,
        *,
        now: float,
        moment: datetime,
        pause: float,
    ) -> ResetStep:
        """Remove its objects; once they are gone and `pause` seconds have passed since the
        reset, end it (`end_reset`: its objects are made again by the next look)."""
        self.forget(aw.key)
        remaining = await self.maker.remove(aw, member)
        if remaining:
            return ResetStep(wait=REMOVAL_POLL_SECONDS)
        backoff = status.condition(C.BACKOFF)
        waited = seconds_since(backoff.lastTransitionMicroTime if backoff else None, now)
        if waited < pause:
            return ResetStep(wait=pause - waited)
        return ResetStep(transition=cond.end_reset(status, now=moment))
