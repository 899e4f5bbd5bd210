"""How much of its declared limit work uses: what a reservation's start is estimated with.
Pure, no I/O.

Work declares a limit (`dispatchDuration.limit`) it may not run past, and most of it ends
earlier. The controller records, for the work that ended with a limit, the share of its
limit it ran; `LimitUse` holds the recent record, sorted. Work still running that has run a
share f of its limit is expected to end at the median of the recorded shares above f (the
record, given what it has run already), or at its limit when no recorded work ran that long.
With nothing recorded, every end is the limit: the bound the snapshot alone gives.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["LimitUse"]


@dataclass(frozen=True, slots=True)
class LimitUse:
    """The shares of their limits recent work ran, sorted, each in (0, 1]."""

    shares: tuple[float, ...] = ()

    @classmethod
    def of(cls, shares: Iterable[float]) -> LimitUse:
        """From shares as recorded (work run past its limit counts as its limit; none or a
        negative one is no record)."""
        return cls(tuple(sorted(min(share, 1.0) for share in shares if share > 0)))

    def expected_end(self, started: float, limit: float, now: float) -> float:
        """When work started at `started` with `limit` is expected to end, seen at `now`:
        never before `now` (while it is known to still run), never after its limit."""
        if limit <= 0:
            return started
        ran = (now - started) / limit
        shares = self.shares
        low = bisect_right(shares, ran)
        if low == len(shares):
            return started + limit
        high = len(shares) - 1
        middle = (shares[(low + high) // 2] + shares[(low + high + 1) // 2]) / 2
        return started + limit * middle

    def typical(self) -> float | None:
        """The median share recorded (None: none is)."""
        if not self.shares:
            return None
        return self.expected_end(0.0, 1.0, 0.0)
