"""HTTP failures from an API server, mapped once to typed errors. No I/O."""

from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """An API request failed. `status` is the HTTP status (0 when no answer came)."""

    status = 0

    def __init__(self, message: str, *, status: int = 0, reason: str = "", body: Any = None):
        super().__init__(message)
        self.status = status or self.status
        self.reason = reason
        self.body = body


class Undecodable(KubeError):
    """An answer was not JSON the client could decode."""


class BadRequest(KubeError):
    status = 400


class Forbidden(KubeError):
    status = 403


class NotFound(KubeError):
    status = 404


class Conflict(KubeError):
    """409: the object changed under us (resourceVersion) or already exists. Re-read and retry."""

    status = 409


class AlreadyExists(Conflict):
    """409 with reason AlreadyExists, on create."""


class Gone(KubeError):
    """410: the resourceVersion a watch started from is too old; relist."""

    status = 410


class Invalid(KubeError):
    """422: the server rejected the object; the message says which field and why."""

    status = 422


class TooManyRequests(KubeError):
    status = 429

    def __init__(self, message: str, *, retry_after: float = 1.0, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class ServerError(KubeError):
    status = 500


class Unreachable(KubeError):
    """No answer at all: connection refused, timed out, TLS failure."""


class UnknownKind(KubeError):
    """The server does not serve this apiVersion/kind (its CRD is missing)."""


_BY_STATUS: dict[int, type[KubeError]] = {
    400: BadRequest,
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_from_response(status: int, body: bytes, headers: dict[str, str]) -> KubeError:
    """Build the typed error for a non-2xx answer, keeping the server's own message."""
    parsed: Any = None
    message = body.decode(errors="replace")[:2000]
    reason = ""
    try:
        parsed = json.loads(body)
        if isinstance(parsed, dict):
            message = str(parsed.get("message", message))
            reason = str(parsed.get("reason", ""))
    except ValueError:
        pass
    if status == 409 and reason == "AlreadyExists":
        return AlreadyExists(message, status=status, reason=reason, body=parsed)
    if status == 429:
        try:
            retry_after = float(headers.get("Retry-After", "1"))
        except ValueError:
            retry_after = 1.0
        return TooManyRequests(
            message, status=status, reason=reason, body=parsed, retry_after=retry_after
        )
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else KubeError)
    return cls(message, status=status, reason=reason, body=parsed)
