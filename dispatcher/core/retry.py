"""How long to wait before trying again: one doubling rule for every retry the dispatcher
makes (a key in the work queue, objects that met an error of the dispatcher's own, an
admission check's next round, MCAD's exponential requeuing). Pure."""

from __future__ import annotations

MAX_DOUBLINGS = 30
"""More doublings than any cap needs; bounds the power so a huge count cannot overflow."""


def retry_delay(first: float, failures: int, most: float | None = None) -> float:
    """`first` doubled once per failure before this one (`failures` of them), at most `most`."""
    delay = first * float(2 ** min(max(failures, 0), MAX_DOUBLINGS))
    return delay if most is None else min(delay, most)


__all__ = ["retry_delay"]
