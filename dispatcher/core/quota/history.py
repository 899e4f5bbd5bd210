"""Usage over time: what each cluster queue, and each user in it, used of its resources,
decayed with a half-life. Pure, no I/O.

A `Decayed` holds, per resource, the integral of use over time with older use weighted
down: use u held for a moment dt at time s counts u * dt * 2^-((now - s) / half_life). Held
at a constant rate for ever, it tends to rate * TAU (TAU = half_life / ln 2), so
`Decayed.rate` (the value over TAU) is an average rate of use in the resource's own units,
recent use counting most. `advance` brings it to a later time, adding what was held
meanwhile (constant between two samples: the controller samples at each status write).

`UsageHistory` is one cluster queue's: its own `Decayed` and its users' (the user from the
AppWrapper's signed creator record), at most `MAX_USERS` of them (the largest kept: a user
dropped had the least weight left, and would have decayed to nothing). It is written to the
queue's status and read back (`to_status` / `from_status`), so a restart or a new leader
goes on from it; a value that does not read is dropped, never trusted (only the dispatcher
writes status, but a record must not be able to break a queue).

Fair sharing in `Usage` mode (`usage_share`) compares queues of a cohort, and users within a
queue, by their average rate of use plus what they hold now, over what their cohort could
give, divided by their weight: the lowest goes first. The current holding is counted so
that admissions in one cycle move the share at once (history alone moves only with time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MAX_USERS", "Decayed", "UsageHistory", "usage_share"]

MAX_USERS = 64
"""Users kept per queue's history: bounded, whatever the number of users."""

MAX_RESOURCES = 32
"""Resources kept per record read back: more is not a record this dispatcher wrote."""


@dataclass(frozen=True, slots=True)
class Decayed:
    """Decayed use per resource (units x seconds, milli-units for the quota's resources) as
    of `at` (seconds since the epoch)."""

    at: float = 0.0
    values: Mapping[str, float] = field(default_factory=dict)

    def advance(self, now: float, held: Mapping[str, float], half_life: float) -> Decayed:
        """As of `now`, `held` (per resource, a rate: what was in use) having been held since
        `at`. A `now` before `at` changes nothing (a clock that stepped back)."""
        elapsed = now - self.at
        if elapsed <= 0 or half_life <= 0:
            return self
        exponent = -elapsed * math.log(2) / half_life
        keep = math.exp(exponent)
        # The integral of the weight over the interval; expm1 keeps it exact for short ones.
        gained = -math.expm1(exponent) * half_life / math.log(2)
        values = {r: v * keep for r, v in self.values.items()}
        for resource, rate in held.items():
            if rate > 0:
                values[resource] = values.get(resource, 0.0) + rate * gained
        return Decayed(now, {r: v for r, v in values.items() if v > 0})

    def rate(self, resource: str, half_life: float) -> float:
        """The average rate of use of `resource` (recent use counting most)."""
        if half_life <= 0:
            return 0.0
        return self.values.get(resource, 0.0) * math.log(2) / half_life

    def total(self) -> float:
        return sum(self.values.values())


@dataclass(frozen=True, slots=True)
class UsageHistory:
    """One cluster queue's decayed use, and its users'."""

    queue: Decayed = field(default_factory=Decayed)
    users: Mapping[str, Decayed] = field(default_factory=dict)

    def advance(
        self,
        now: float,
        held: Mapping[str, float],
        held_by_user: Mapping[str, Mapping[str, float]],
        half_life: float,
    ) -> UsageHistory:
        """As of `now`, the queue having held `held` and each user `held_by_user` since the
        last sample; users beyond `MAX_USERS` dropped, the least used first."""
        users = dict(self.users)
        for user in set(users) | set(held_by_user):
            before = users.get(user) or Decayed(self.queue.at)
            users[user] = before.advance(now, held_by_user.get(user, {}), half_life)
        kept = sorted(users.items(), key=lambda item: (-item[1].total(), item[0]))
        live = {user: d for user, d in kept[:MAX_USERS] if d.values or user in held_by_user}
        return UsageHistory(self.queue.advance(now, held, half_life), live)

    def not_after(self, now: float) -> UsageHistory:
        """Itself, but sampled at `now` at the latest: a record written by a dispatcher whose
        clock ran ahead would otherwise stop counting until this clock caught up."""
        if self.queue.at <= now:
            return self
        users = {u: Decayed(min(d.at, now), d.values) for u, d in self.users.items()}
        return UsageHistory(Decayed(now, self.queue.values), users)

    def to_status(self) -> dict[str, Any]:
        """The status form: times in seconds since the epoch, values rounded."""
        return {
            "sampledAt": round(self.queue.at, 3),
            "resources": _rounded(self.queue.values),
            "users": [
                {"name": user, "resources": _rounded(d.values)}
                for user, d in sorted(self.users.items())
            ],
        }

    @classmethod
    def from_status(cls, found: object) -> UsageHistory:
        """Read back from status; whatever does not read is left out."""
        if not isinstance(found, Mapping):
            return cls()
        at = found.get("sampledAt")
        if not isinstance(at, int | float) or isinstance(at, bool) or not math.isfinite(at):
            return cls()
        queue = Decayed(float(at), _read_values(found.get("resources")))
        users: dict[str, Decayed] = {}
        listed = found.get("users")
        for entry in listed[:MAX_USERS] if isinstance(listed, list) else ():
            if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                values = _read_values(entry.get("resources"))
                if values:
                    users[entry["name"][:256]] = Decayed(float(at), values)
        return cls(queue, users)


def _rounded(values: Mapping[str, float]) -> dict[str, float]:
    return {r: round(v, 3) for r, v in sorted(values.items())}


def _read_values(found: object) -> dict[str, float]:
    if not isinstance(found, Mapping):
        return {}
    values: dict[str, float] = {}
    for resource, value in list(found.items())[:MAX_RESOURCES]:
        if not isinstance(resource, str) or isinstance(value, bool):
            continue
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            values[resource] = float(value)
    return values


def usage_share(
    history: Decayed | None,
    holding: Mapping[str, float],
    capacity: Mapping[str, float],
    *,
    half_life: float,
    weight: float = 1.0,
) -> float:
    """The `Usage`-mode share: over the resources `capacity` names (what the cohort could
    give, per resource), the largest (average rate + held now) / capacity, over `weight`."""
    best = 0.0
    for resource, total in capacity.items():
        if total <= 0:
            continue
        rate = history.rate(resource, half_life) if history is not None else 0.0
        best = max(best, (rate + holding.get(resource, 0.0)) / total)
    return best / weight if weight > 0 else math.inf
