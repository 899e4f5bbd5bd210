"""What `kubectl aw queues` shows of each queue beside its counts: usage and borrowing per
flavor, what is left of its budget, and its heaviest users by use over time. Pure: tables
from the objects the API server returned (dispatcher/plugin/main.py prints them)."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["USERS_SHOWN", "budget_left", "heaviest_users", "usage"]

Obj = dict[str, Any]


def usage(status: Obj) -> tuple[str, str]:
    used, borrowed = [], []
    for flavor in status.get("flavorsUsage") or []:
        for r in flavor.get("resources") or []:
            used.append(f"{flavor.get('name')}/{r.get('name')}={r.get('total')}")
            if r.get("borrowed") not in (None, "0"):
                borrowed.append(f"{flavor.get('name')}/{r.get('name')}={r.get('borrowed')}")
    return ",".join(used) or "-", ",".join(borrowed) or "-"


def budget_left(queue: Obj) -> str:
    """A cluster queue's budget as `left/amount resource-hours per period` ("-": none)."""
    budget = (queue.get("spec") or {}).get("budget")
    if not isinstance(budget, dict):
        return "-"
    remaining = ((queue.get("status") or {}).get("budget") or {}).get("remainingHours")
    left = f"{remaining:g}" if isinstance(remaining, int | float) else "?"
    period = budget.get("period") or "Week"
    return f"{left}/{budget.get('amountHours')}h-{budget.get('resource')}/{period}"


USERS_SHOWN = 5
"""Users listed per cluster queue (its heaviest by use over time)."""


def heaviest_users(queues: list[Obj]) -> list[list[str]]:
    """`Usage` fair sharing: each cluster queue's heaviest users by use over time, as its
    status records it: average use per resource (decayed with the half-life)."""
    table = [["CLUSTERAPPQUEUE", "USER", "AVERAGE USE"]]
    for q in queues:
        history = (q.get("status") or {}).get("usageHistory")
        if not isinstance(history, dict):
            continue
        half_life = history.get("halfLifeSeconds")
        listed = history.get("users")
        if not isinstance(half_life, int | float) or half_life <= 0 or not isinstance(listed, list):
            continue
        rows = []
        for entry in listed:
            resources = entry.get("resources") if isinstance(entry, dict) else None
            if not isinstance(resources, dict):
                continue
            rates = {
                str(r): float(v) * math.log(2) / half_life / 1000
                for r, v in resources.items()
                if isinstance(v, int | float)
            }
            rows.append((sum(rates.values()), str(entry.get("name")), rates))
        rows.sort(key=lambda row: (-row[0], row[1]))
        for _, user, rates in rows[:USERS_SHOWN]:
            use = ",".join(f"{r}={v:.3g}" for r, v in sorted(rates.items())) or "-"
            table.append([q["metadata"]["name"], user, use])
    return table
