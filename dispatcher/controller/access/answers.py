"""Answers from the API server kept for a short time, with one question in flight shared.

Side effects: none here; `get` awaits the question it is given (a SubjectAccessReview or
a TokenReview, on whichever client the owner chose).

Used by `gatekeeper.AccessReviews` (may this user do X) and `metrics_access.MetricsAccess`
(whose token is this): a burst of the same question costs one request, an answer is believed
for `keep_seconds` (so a right taken away, or a token revoked, counts within that time), and
at most `limit` answers are held (a bound on memory, whatever the keys' variety).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class KeptAnswers(Generic[K, V]):
    """Answers by key, each kept `keep_seconds` from when it was asked. Questions asked
    while the same one is in flight wait for its answer instead of asking again (a burst
    arrives in parallel, before any answer is kept). An error is not kept."""

    def __init__(
        self,
        *,
        keep_seconds: float,
        limit: int,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keep = keep_seconds
        self._limit = limit
        self._now = now
        self._answers: dict[K, tuple[float, V]] = {}
        self._asking: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._answers)

    async def get(self, key: K, ask: Callable[[], Awaitable[V]]) -> V:
        """The kept answer for `key`, else the one in flight, else `ask()`'s. The key says
        what is asked (a token's digest need not be the token: `ask` carries it)."""
        cached = self._answers.get(key)
        if cached is not None and self._now() - cached[0] < self._keep:
            return cached[1]
        asking = self._asking.get(key)
        if asking is None:
            asking = asyncio.ensure_future(self._asked(key, ask))
            self._asking[key] = asking
            asking.add_done_callback(lambda done: self._forget(key, done))
        # Shielded: one caller cancelled (its request timed out) leaves the others their
        # answer; an error reaches every caller and is not kept.
        return await asyncio.shield(asking)

    def _forget(self, key: K, done: asyncio.Future[V]) -> None:
        self._asking.pop(key, None)
        if not done.cancelled():
            done.exception()  # retrieved here too: every caller may have gone before it ended

    async def _asked(self, key: K, ask: Callable[[], Awaitable[V]]) -> V:
        asked = self._now()
        answer = await ask()
        if len(self._answers) >= self._limit:
            self._answers.clear()  # a bound, not a policy: answers are cheap to ask again
        self._answers[key] = (asked, answer)
        return answer
