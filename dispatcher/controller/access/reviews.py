"""The visibility API's SubjectAccessReviews, on a budget of their own.

Side effects: none here; `create` passes each review to the client it was given (the
visibility API's own connection to the hub, see visibility_service.py).

Any authenticated user may call the visibility API, and each namespace it asks about is
one SubjectAccessReview until the answer is kept (`gatekeeper.AccessReviews`: a short
time, a bounded number of answers, one question in flight shared). A flood of requests
naming new namespaces would otherwise cost the API server one review each, as fast as
they come. `ReviewBudget` lets through at most `burst` reviews at once and `qps` a second
after that; a review beyond it fails at once with TooManyRequests (the request is answered
429 with Retry-After): nothing waits in a queue, so a flood holds neither memory nor the
controller's loop, and the controller's own client (its rate limiter, its connections) is
never the one asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dispatcher.controller.access.gatekeeper import Creates
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import TooManyRequests


class ReviewBudget:
    """A token bucket in front of `client.create` that refuses instead of waiting."""

    def __init__(
        self,
        client: Creates,
        *,
        qps: float,
        burst: int,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._qps = qps
        self._burst = max(1, burst)
        self._now = now
        self._tokens = float(self._burst)
        self._updated = now()
        self.asked = 0
        self.refused = 0

    def _take(self) -> float:
        """0 when a review may go now (a token taken), else seconds until one may."""
        now = self._now()
        self._tokens = min(self._burst, self._tokens + (now - self._updated) * self._qps)
        self._updated = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self._qps if self._qps > 0 else 60.0

    async def create(
        self, info: ResourceInfo, namespace: str | None, body: Any, *, field_manager: str = ""
    ) -> dict[str, Any]:
        wait = self._take()
        if wait:
            self.refused += 1
            raise TooManyRequests(
                "too many access checks for the visibility API right now: ask again shortly",
                retry_after=max(1.0, wait),
            )
        self.asked += 1
        return await self._client.create(info, namespace, body, field_manager=field_manager)
