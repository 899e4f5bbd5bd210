"""Who may scrape /metrics (`metrics.auth: kubernetes`), decided as Kubernetes' own
components decide it: the bearer token reviewed by the API server (TokenReview), then the
user it names asked about `get` on the non-resource URL /metrics (SubjectAccessReview).

Side effects: none here; reviews go to the client it was given (health.py's own connection
to the hub, made in app.py: never the controller's, whose rate limiter a flood would fill).

Both answers are kept `access_review_cache_seconds`, at most `TOKENS_LIMIT` tokens (by a
digest: the tokens themselves are not kept) and `gatekeeper.ANSWERS_LIMIT` rights, with one
review in flight shared per question (`answers.KeptAnswers`). Only accepted tokens are
kept: a flood of made-up ones never pushes the scraper's answer out. Every review passes a
`ReviewBudget` first: such a flood costs the API server at most the budget's reviews a
second, and the scrapes beyond it are answered 429 at once.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from dispatcher.controller.access.answers import KeptAnswers
from dispatcher.controller.access.gatekeeper import AccessReviews, Creates
from dispatcher.controller.access.reviews import ReviewBudget
from dispatcher.core.gatekeeping import Creator, PathAccess
from dispatcher.kube.client import ResourceInfo
from dispatcher.kube.errors import KubeError, TooManyRequests

TOKEN_REVIEWS = ResourceInfo(
    "authentication.k8s.io/v1", "TokenReview", "tokenreviews", namespaced=False
)
TOKENS_LIMIT = 1024
TOKEN_LENGTH_LIMIT = 8000
"""Longer is refused before any review (aiohttp itself refuses a header line over 8190)."""


@dataclass(frozen=True)
class Refusal:
    """Why a scrape is not served: its HTTP status, a message and, for 429, when to retry."""

    status: int
    message: str
    retry_after: float = 0.0


UNAUTHENTICATED = Refusal(401, "Unauthorized: a bearer token the API server accepts is needed")


class MetricsAccess:
    """`refusal(header, path=...)`: None when the page may be served, else why not."""

    def __init__(
        self,
        client: Creates,
        *,
        qps: float,
        burst: int,
        keep_seconds: float,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = ReviewBudget(client, qps=qps, burst=burst, now=now)
        self._tokens: KeptAnswers[bytes, Creator] = KeptAnswers(
            keep_seconds=keep_seconds, limit=TOKENS_LIMIT, now=now
        )
        self._rights = AccessReviews(self.budget, keep_seconds=keep_seconds, now=now)
        self._log = structlog.get_logger("metrics")

    async def refusal(self, authorization: str | None, *, path: str) -> Refusal | None:
        """For a request of `path` (/metrics) with this Authorization header."""
        token = bearer_token(authorization)
        if token is None:
            return UNAUTHENTICATED
        try:
            user = await self._tokens.get(
                hashlib.sha256(token.encode()).digest(), lambda: self._review(token)
            )
        except _Unauthenticated:
            return UNAUTHENTICATED
        except KubeError as exc:
            return self._failed(exc)
        try:
            if await self._rights.allowed(user, PathAccess("get", path)):
                return None
            return Refusal(403, f"Forbidden: {user.username} may not get {path}")
        except KubeError as exc:
            return self._failed(exc)

    def _failed(self, exc: KubeError) -> Refusal:
        """No answer: not the caller's fault, and not kept (the next scrape asks again)."""
        if isinstance(exc, TooManyRequests):
            return Refusal(429, "Too many reviews right now", retry_after=exc.retry_after)
        self._log.warning("metrics_review_failed", error=str(exc)[:200])
        return Refusal(503, "The API server could not review the request")

    async def _review(self, token: str) -> Creator:
        """The user the token names; _Unauthenticated (not kept) when it names none."""
        review: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        answer = await self.budget.create(TOKEN_REVIEWS, None, review)
        status = answer.get("status") or {}
        user = Creator.from_user_info(status.get("user") or {})
        if not status.get("authenticated") or not user.username:
            raise _Unauthenticated
        return user


class _Unauthenticated(Exception):
    """The API server did not accept the token: an error, so that the answer is not kept."""


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None for anything else."""
    if not authorization or len(authorization) > TOKEN_LENGTH_LIMIT:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token
