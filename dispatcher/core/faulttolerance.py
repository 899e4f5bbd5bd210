"""The AppWrapper controller's fault-tolerance annotations, read and mapped onto this
dispatcher's requeuing. Pure, no I/O.

| annotation (workload.codeflare.dev.appwrapper/...) | here                                |
|----------------------------------------------------|-------------------------------------|
| warmupGracePeriodDuration                          | requeuing.timeInSeconds (no growth) |
| retryPausePeriodDuration                           | requeuing.pauseTimeInSeconds; and   |
|                                                    | the pause of a reset (`Retry`)      |
| retryLimit                                         | requeuing.maxNumRequeuings (0 -> 1);|
|                                                    | and resets allowed (`Retry`)        |
| failureGracePeriodDuration                         | the wait before a reset (`Retry`)   |
| admissionGracePeriodDuration,                      | validated, bounded; not acted on    |
| forcefulDeletionGracePeriodDuration,               | (docs/appwrapper-compatibility.md)  |
| deletionOnFailureGracePeriodDuration,              |                                     |
| successTTLDuration                                 |                                     |
| terminalExitCodes, retryableExitCodes              | validated; not acted on             |

`retry_policy` says whether an AppWrapper's failures are reset and retried, as the
AppWrapper controller does (core/lifecycle.py decides, the reconciler acts): only when it
carries one of `RESET_ANNOTATIONS`, so an AppWrapper without them (every MCAD one) keeps
MCAD's rule of failing at its first failure. The ones it does not carry take the
controller's defaults (`DEFAULT_FAILURE_GRACE_SECONDS`...).

Durations are Go's (`90s`, `5m`, `1h30m`, `500ms`), as the AppWrapper controller parses
them. A malformed one fails the AppWrapper naming the annotation (`problems`); one above the
operator's bound (`FaultToleranceBounds`, settings `fault_tolerance`) is cut to the bound,
as the AppWrapper controller cuts grace periods to its GracePeriodMaximum.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from dispatcher.api.models import Requeuing

PREFIX: Final = "workload.codeflare.dev.appwrapper/"
ADMISSION_GRACE: Final = PREFIX + "admissionGracePeriodDuration"
WARMUP_GRACE: Final = PREFIX + "warmupGracePeriodDuration"
FAILURE_GRACE: Final = PREFIX + "failureGracePeriodDuration"
RETRY_PAUSE: Final = PREFIX + "retryPausePeriodDuration"
RETRY_LIMIT: Final = PREFIX + "retryLimit"
FORCEFUL_DELETION_GRACE: Final = PREFIX + "forcefulDeletionGracePeriodDuration"
DELETION_ON_FAILURE_GRACE: Final = PREFIX + "deletionOnFailureGracePeriodDuration"
SUCCESS_TTL: Final = PREFIX + "successTTLDuration"
TERMINAL_EXIT_CODES: Final = PREFIX + "terminalExitCodes"
RETRYABLE_EXIT_CODES: Final = PREFIX + "retryableExitCodes"

DURATIONS: Final = (
    ADMISSION_GRACE,
    WARMUP_GRACE,
    FAILURE_GRACE,
    RETRY_PAUSE,
    FORCEFUL_DELETION_GRACE,
    DELETION_ON_FAILURE_GRACE,
    SUCCESS_TTL,
)
EXIT_CODES: Final = (TERMINAL_EXIT_CODES, RETRYABLE_EXIT_CODES)
RESET_ANNOTATIONS: Final = (FAILURE_GRACE, RETRY_LIMIT, RETRY_PAUSE)
"""Any of these turns resets on (`retry_policy`)."""
DEFAULT_FAILURE_GRACE_SECONDS: Final = 60.0
DEFAULT_RETRY_LIMIT: Final = 3
DEFAULT_RETRY_PAUSE_SECONDS: Final = 90.0
"""The AppWrapper controller's defaults (v1.1.2, site/_pages/arch-fault-tolerance.md)."""

_UNITS: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0}
_UNITS.update({"m": 60.0, "h": 3600.0})
_PART = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|s|m|h)")


@dataclass(frozen=True, slots=True)
class FaultToleranceBounds:
    """The operator's ceilings (settings `fault_tolerance`, dispatcher/config.py)."""

    grace_period_maximum_seconds: float = 24 * 3600.0
    success_ttl_maximum_seconds: float = 7 * 24 * 3600.0
    retry_limit_maximum: int = 100


@dataclass(frozen=True, slots=True)
class Retry:
    """How an AppWrapper's failures are reset and retried (`retry_policy`)."""

    failure_grace_seconds: float = DEFAULT_FAILURE_GRACE_SECONDS
    """Failed pods are given this long to recover before a reset (a failed object, none)."""
    retry_limit: int = DEFAULT_RETRY_LIMIT
    """Resets allowed (status.requeueCount, v1beta2 resettingCount); past them, Failed."""
    pause_seconds: float = DEFAULT_RETRY_PAUSE_SECONDS
    """Between its objects gone and their making again."""


def parse_duration(text: str) -> float:
    """Seconds in a Go duration ("1h30m", "90s", "0"). Raises ValueError; negative refused."""
    if text == "0":
        return 0.0
    if not text or text.startswith(("-", "+")):
        raise ValueError(f"{text!r} is not a duration like 90s, 5m or 1h30m")
    position, total = 0, 0.0
    while position < len(text):
        match = _PART.match(text, position)
        if not match or match.group(1) in ("", "."):
            raise ValueError(f"{text!r} is not a duration like 90s, 5m or 1h30m")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    return total


def problems(annotations: Mapping[str, str]) -> list[str]:
    """What is wrong with the fault-tolerance annotations, each naming its annotation."""
    found = []
    for name in DURATIONS:
        if name in annotations:
            try:
                parse_duration(annotations[name])
            except ValueError as exc:
                found.append(f"metadata.annotations[{name}]: {exc}")
    if RETRY_LIMIT in annotations and not re.fullmatch(r"[0-9]{1,9}", annotations[RETRY_LIMIT]):
        found.append(
            f"metadata.annotations[{RETRY_LIMIT}]: {annotations[RETRY_LIMIT]!r} is not a "
            "number of retries (0 or more)"
        )
    for name in EXIT_CODES:
        if name in annotations and not re.fullmatch(
            r"\s*[0-9]{1,3}(\s*,\s*[0-9]{1,3})*\s*", annotations[name]
        ):
            found.append(
                f"metadata.annotations[{name}]: {annotations[name]!r} is not a comma list of "
                "exit codes"
            )
    return found


def effective_requeuing(
    requeuing: Requeuing, annotations: Mapping[str, str], bounds: FaultToleranceBounds
) -> Requeuing:
    """`requeuing` with the annotations that map onto it applied (bounded); malformed ones
    are left out here (`problems` fails the AppWrapper for them)."""
    update: dict[str, object] = {}
    ceiling = bounds.grace_period_maximum_seconds
    warmup = _seconds(annotations, WARMUP_GRACE, ceiling)
    if warmup is not None:
        # The AppWrapper controller's grace period does not grow with each retry.
        update |= {"timeInSeconds": max(1, round(warmup)), "growthType": "none"}
    pause = _seconds(annotations, RETRY_PAUSE, ceiling)
    if pause is not None:
        update["pauseTimeInSeconds"] = round(pause)
    limit = annotations.get(RETRY_LIMIT, "")
    if re.fullmatch(r"[0-9]{1,9}", limit):
        # 0 is "no retry" there and "unlimited" here: the nearest is one.
        update["maxNumRequeuings"] = min(max(int(limit), 1), bounds.retry_limit_maximum)
    return requeuing.model_copy(update=update) if update else requeuing


def retry_policy(annotations: Mapping[str, str], bounds: FaultToleranceBounds) -> Retry | None:
    """The reset rule of an AppWrapper with these annotations; None when it carries none of
    `RESET_ANNOTATIONS` (its failures fail it). Malformed values take the default (`problems`
    fails the AppWrapper for them); values past the operator's bounds are cut to them."""
    if not any(name in annotations for name in RESET_ANNOTATIONS):
        return None
    ceiling = bounds.grace_period_maximum_seconds
    grace = _seconds(annotations, FAILURE_GRACE, ceiling)
    pause = _seconds(annotations, RETRY_PAUSE, ceiling)
    limit = annotations.get(RETRY_LIMIT, "")
    return Retry(
        failure_grace_seconds=min(DEFAULT_FAILURE_GRACE_SECONDS, ceiling)
        if grace is None
        else grace,
        # Unlike requeuing's maxNumRequeuings, 0 here is the controller's "no retry".
        retry_limit=min(int(limit), bounds.retry_limit_maximum)
        if re.fullmatch(r"[0-9]{1,9}", limit)
        else min(DEFAULT_RETRY_LIMIT, bounds.retry_limit_maximum),
        pause_seconds=min(DEFAULT_RETRY_PAUSE_SECONDS, ceiling) if pause is None else pause,
    )


def _seconds(annotations: Mapping[str, str], name: str, ceiling: float) -> float | None:
    if name not in annotations:
        return None
    try:
        return min(parse_duration(annotations[name]), ceiling)
    except ValueError:
        return None
