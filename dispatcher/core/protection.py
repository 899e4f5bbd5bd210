"""Protection from preemption: the minimum runtime a dispatched AppWrapper runs before it may be
a victim, the last checkpoint it declares, and the notice a victim gets before its objects are
removed. Pure, no I/O.

Two annotations on the AppWrapper, written by its owner (hostile input: bounded, never
trusted):

| annotation                              | value                                            |
|-----------------------------------------|--------------------------------------------------|
| `workload.codeflare.dev/minimum-runtime` | a Go duration (`90s`, `10m`, `1h30m`): asked     |
|                                         | protection, capped by its queue or the setting   |
| `workload.codeflare.dev/checkpointed-at` | RFC 3339 time of its last checkpoint: a victim   |
|                                         | loses the runtime since (ordering victims)       |

The admission webhook refuses a bad value when it is set or changed (`annotation_problems`,
through `core.validation`). A bad value stored all the same (the webhook absent or bypassed)
is read as no ask: the annotations are about protection, not the spec, so they never fail an
AppWrapper. What a tenant writes can only lower what preempting its own work costs others:
an ask is capped (`effective_minimum_runtime`) and a checkpoint is clamped to the current
attempt's runtime (`checkpoint_within`), so claiming an old or future checkpoint makes its
work no costlier to preempt than declaring none.

The notice is recorded where a restarted dispatcher reads it back: the victim's `Preempted`
condition says when its objects are removed (`with_notice`), and `removal_time` reads that
time again, bounded by `MAX_NOTICE_SECONDS` after the condition's transition.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, Final, Protocol

from dispatcher.api.constants import GROUP
from dispatcher.api.models import format_micro_time
from dispatcher.core.faulttolerance import parse_duration
from dispatcher.core.quota.model import QueueSpec

__all__ = [
    "CHECKPOINTED_AT",
    "MAX_MINIMUM_RUNTIME_SECONDS",
    "MAX_NOTICE_SECONDS",
    "MINIMUM_RUNTIME",
    "Asked",
    "Defaults",
    "Unset",
    "annotation_problems",
    "asked",
    "checkpoint_within",
    "clock_time",
    "effective_minimum_runtime",
    "notice_seconds",
    "removal_time",
    "with_notice",
]

MINIMUM_RUNTIME: Final = f"{GROUP}/minimum-runtime"
CHECKPOINTED_AT: Final = f"{GROUP}/checkpointed-at"
MAX_VALUE_CHARS: Final = 64
"""Longest value read: a duration or a time is far shorter; a longer one is not parsed."""
MAX_MINIMUM_RUNTIME_SECONDS: Final = 7 * 24 * 3600.0
"""No queue (`minimumRuntimeSeconds`) nor setting (`protection`) grants more: an ask above it
is refused at apply, since it could never be honoured."""
MAX_NOTICE_SECONDS: Final = 3600.0
"""No queue (`noticeSeconds`) nor setting grants a longer notice: a deadline read back from a
status is held to it (`removal_time`)."""

_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(?:([Zz])|([+-])(\d{2}):(\d{2}))",
    re.ASCII,
)
_NOTICE = " its objects are removed at "
_NOTICE_TIME = re.compile(re.escape(_NOTICE) + r"(\S+)", re.ASCII)


class Defaults(Protocol):
    """What protects work where no queue says (settings `protection`)."""

    @property
    def minimum_runtime_seconds(self) -> float: ...

    @property
    def max_minimum_runtime_seconds(self) -> float: ...

    @property
    def notice_seconds(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Unset:
    """`Defaults` as the settings give them when `protection` is not set (the defaults of
    dispatcher/config.py `ProtectionConfig`): no minimum runtime, asks capped at an hour,
    no notice."""

    minimum_runtime_seconds: float = 0.0
    max_minimum_runtime_seconds: float = 3600.0
    notice_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Asked:
    """What an AppWrapper's annotations ask, read leniently (`asked`)."""

    minimum_runtime: float | None = None
    """Seconds; None: none asked, or a value that does not read (`problems` says why)."""
    checkpointed_at: float | None = None
    """Seconds since the epoch; None: none declared, or one that does not read."""
    problems: tuple[str, ...] = ()


def _duration(value: str) -> float:
    if len(value) > MAX_VALUE_CHARS:
        raise ValueError(f"a value of {len(value)} characters (at most {MAX_VALUE_CHARS})")
    seconds = parse_duration(value)
    if not math.isfinite(seconds) or seconds > MAX_MINIMUM_RUNTIME_SECONDS:
        raise ValueError(f"{value!r} is more than 168h, the most any queue or setting grants")
    return seconds


def _time(value: str) -> float:
    if len(value) > MAX_VALUE_CHARS:
        raise ValueError(f"a value of {len(value)} characters (at most {MAX_VALUE_CHARS})")
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not an RFC 3339 time like 2025-01-31T12:00:00Z")
    year, month, day, hour, minute, second, fraction, z, sign, oh, om = match.groups()
    zone = UTC
    if not z:
        offset = timedelta(hours=int(oh), minutes=int(om))
        if offset >= timedelta(hours=24):
            raise ValueError(f"{value!r} has an offset of 24 hours or more")
        zone = timezone(offset if sign == "+" else -offset)
    try:
        moment = datetime(
            int(year),
            int(month),
            int(day),
            int(hour),
            int(minute),
            int(second),
            int((fraction or "0")[:6].ljust(6, "0")),
            tzinfo=zone,
        )
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a valid time ({exc})") from None
    return moment.timestamp()


def _read(
    annotations: Mapping[str, Any], name: str, parse: Callable[[str], float]
) -> tuple[float | None, str]:
    if name not in annotations:
        return None, ""
    value = annotations[name]
    if not isinstance(value, str):
        return None, f"metadata.annotations[{name}]: not a string"
    try:
        return float(parse(value)), ""
    except ValueError as exc:
        return None, f"metadata.annotations[{name}]: {exc}"


def asked(annotations: Mapping[str, Any] | None) -> Asked:
    """What the annotations ask; a value that does not read is no ask (with why)."""
    found = annotations or {}
    runtime, bad_runtime = _read(found, MINIMUM_RUNTIME, _duration)
    checkpoint, bad_checkpoint = _read(found, CHECKPOINTED_AT, _time)
    problems = tuple(p for p in (bad_runtime, bad_checkpoint) if p)
    return Asked(runtime, checkpoint, problems)


def annotation_problems(
    annotations: Mapping[str, Any] | None, before: Mapping[str, Any] | None = None
) -> list[str]:
    """What the webhook refuses: a protection annotation set or changed to a value that does
    not read. One stored before (`before` holds the same) passes, so that an AppWrapper
    stored with a bad value can still have its finalizer or labels changed."""
    now, old = annotations or {}, before or {}
    changed = {
        name: now[name]
        for name in (MINIMUM_RUNTIME, CHECKPOINTED_AT)
        if name in now and (name not in old or now[name] != old[name])
    }
    return list(asked(changed).problems)


def effective_minimum_runtime(
    ask: float | None, queue: QueueSpec | None, defaults: Defaults
) -> float:
    """Seconds a dispatched AppWrapper runs before it may be preempted. A queue with a minimum
    runtime M gives M to those asking none and caps asks at M; without one (or with no
    queue) the setting's default and cap do. An ask of 0 is none asked."""
    wanted = ask if ask is not None and math.isfinite(ask) and ask > 0 else None
    if queue is not None and queue.minimum_runtime > 0:
        ceiling = queue.minimum_runtime
        return min(ceiling if wanted is None else wanted, ceiling)
    default = defaults.minimum_runtime_seconds
    return max(
        0.0, min(default if wanted is None else wanted, defaults.max_minimum_runtime_seconds)
    )


def checkpoint_within(at: float | None, *, dispatched_at: float, now: float) -> float:
    """A declared checkpoint held to the current attempt, [dispatched_at, now]: one from before
    the dispatch saved nothing of this attempt, and one in the future has not happened. 0.0
    for none (`DispatchedWorkload.checkpointed_at`)."""
    if at is None or not math.isfinite(at):
        return 0.0
    return min(max(at, dispatched_at), max(now, dispatched_at))


def runtime_lost(*, dispatched_at: float, checkpointed_at: float | None, at: float) -> float:
    """The runtime a victim whose objects are removed at `at` loses: since its last declared
    checkpoint (held to this attempt, `checkpoint_within`), else since its dispatch. One
    that checkpoints within its notice loses only what it ran after that checkpoint."""
    since = checkpoint_within(checkpointed_at, dispatched_at=dispatched_at, now=at)
    return max(0.0, at - (since or dispatched_at))


def with_loss(message: str, lost: float, *, checkpointed: bool) -> str:
    """A victim's requeue message, saying what the eviction cost it."""
    since = "its last checkpoint" if checkpointed else "its dispatch (no checkpoint declared)"
    return f"{message}; {lost:.0f}s of runtime lost, since {since}"


def notice_seconds(queue: QueueSpec | None, defaults: Defaults) -> float:
    """Seconds a victim of this queue (None: of none) is told before its objects go."""
    seconds = queue.notice_seconds if queue is not None else defaults.notice_seconds
    return min(max(seconds, 0.0), MAX_NOTICE_SECONDS)


def with_notice(message: str, removes_at: datetime, seconds: float) -> str:
    """A victim's `Preempted` message that tells it when its objects are removed."""
    return (
        f"{message};{_NOTICE}{format_micro_time(removes_at)} ({seconds:g}s notice:"
        " checkpoint before then)"
    )


def removal_time(message: str, chosen_at: float) -> float:
    """When a victim chosen at `chosen_at` (its `Preempted` transition) has its objects
    removed, as its message says; held to [chosen_at, chosen_at + MAX_NOTICE_SECONDS].
    `chosen_at` itself when the message gives no time (no notice: removed at once)."""
    found = _NOTICE_TIME.findall(message)
    if not found:
        return chosen_at
    try:
        at = _time(found[-1])
    except ValueError:
        return chosen_at
    return min(max(at, chosen_at), chosen_at + MAX_NOTICE_SECONDS)


def clock_time(at: float) -> str:
    """`at` as a wait message gives it: HH:MM:SS UTC."""
    try:
        return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "a time past reading"
