"""What a queued AppWrapper's status says about why it waits, and when that is written.
Pure, no I/O.

Each cycle says, for every queued AppWrapper, why it did not start, with the numbers of the
moment ("needs cpu 4, free 2 of 8", "held for acc/w226, queued longer than 300s"). Most of
that moves with everyone else's churn: who is ahead, what is free, who is being preempted.
Written into every queued AppWrapper, it would cost a status write per AppWrapper each time
anything in the cluster moved: with 30k queued, the API server's whole budget.

So a queued AppWrapper's status tells its own *situation* only, and is written when that
changes, never because another AppWrapper's did. Its situation is:

- the reason kind (`Reason`: capacity, quota, its queue unusable);
- whether it is the head of its queue (the head's message stays live: it is one object,
  and the one users watch);
- its message in its own terms (`own_terms`): what it asks for, which of its resources are
  short, the limits of its queue, the rule that holds it back; never another AppWrapper's
  name, never an amount that moves with others' work (free room, usage, who is ahead).

What moves with everyone's order (position, who it waits behind, the free numbers) is
served from the leader's state (the pending list), not written into each object.

A change of situation is written at once, except that one written less than
REWRITE_SECONDS ago waits for the rest of that time (a situation flapping between two
kinds costs one write per REWRITE_SECONDS, not one per cycle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dispatcher.api.models import Reason
from dispatcher.core.mentions import OTHER

REWRITE_SECONDS = 10.0
HEAD_REFRESH_SECONDS = 10.0
"""The head's live message, when only its numbers moved, is rewritten at most this often."""

_NAME = rf"(?:[a-z0-9][-a-z0-9.]*/[a-z0-9][-a-z0-9.]*|{re.escape(OTHER)})"
"""Another AppWrapper as the cycle's messages name it (`core.mentions`)."""
# (pattern, replacement): the parts of the cycle's messages that name other AppWrappers or
# carry amounts that move with others' work, and what each says in its owner's terms.
# The cycle's wording is checked against these by tests/unit/test_waiting.py, which runs
# real cycles: a new message that names another AppWrapper fails there.
_OTHERS: tuple[tuple[re.Pattern[str], str], ...] = (
    # capacity: "needs cpu 4, free 2 of 8" -> "needs cpu 4, more than is free"
    (re.compile(r", free [^;,()]+? of [^;,()]+?(?=$|;| on the | \(|\))"), ", more than is free"),
    # per node: the roomiest node now, and how far its pods got before it
    (re.compile(r"(\)) after placing \d+ of \d+ pods"), r"\1"),
    (re.compile(r": largest free on a node is [^;]*?\([^()]*\)"), ""),
    # room held for another
    (
        re.compile(rf"held for {_NAME}, which is preempting"),
        "room held for an AppWrapper ahead of it that is preempting",
    ),
    (
        re.compile(rf"held for {_NAME}, queued longer than"),
        "room held for an AppWrapper ahead of it, queued longer than",
    ),
    # StrictFIFO: behind the head
    (re.compile(rf"waiting behind {_NAME} \(head of line\)"), "waiting behind the head of line"),
    (
        re.compile(rf"waiting behind {_NAME} \(head of queue ([^)]+)\)"),
        r"waiting behind the head of queue \1",
    ),
    # its own preemption: the victims are others
    (re.compile(r"; preempting [^;]*$"), "; preempting lower-priority work"),
    # its reservation: from when, and whose declared limits end first, move with others
    (
        re.compile(
            r"; reserved (\d+ nodes?) in cluster (\S+) from \S+"
            r"(?: \(fits when [^;]*?: declared limits\))?"
        ),
        r"; \1 reserved for it in cluster \2",
    ),
    # the victims it needs are protected: until when moves with theirs
    (re.compile(r"protected until [^;(]+ \(minimum runtime\)"), "protected (minimum runtime)"),
    # quota: what others use and lend
    (re.compile(r", in use [^,;]+"), ""),
    (re.compile(r", cohort can lend [^,;]+"), ""),
    (re.compile(r", [^,;]+ of its own lent out"), ""),
)


def own_terms(message: str) -> str:
    """`message` without what moves with other AppWrappers: names and shared amounts.

    "needs cpu 4, free 2 of 8" -> "needs cpu 4, more than is free";
    "held for acc/w226, queued longer than 300s (starvation guard)" -> "room held for an
    AppWrapper ahead of it, queued longer than 300s (starvation guard)".
    """
    for pattern, replacement in _OTHERS:
        message = pattern.sub(replacement, message)
    return message


@dataclass(frozen=True, slots=True)
class Situation:
    """One queued AppWrapper's own situation: what its status says while it waits."""

    reason: Reason
    head: bool
    message: str
    """For the head, the cycle's live message; for the others, `own_terms` of it."""

    @staticmethod
    def of(message: str, reason: Reason, *, head: bool) -> Situation:
        return Situation(reason, head, message if head else own_terms(message))

    @property
    def kind(self) -> tuple[Reason, bool, str]:
        """What changes only with its own situation: the head's numbers stripped too."""
        return (self.reason, self.head, own_terms(self.message))


@dataclass(frozen=True, slots=True)
class Written:
    """The last situation written for one AppWrapper, and when."""

    situation: Situation
    at: float


def due(last: Written | None, now_situation: Situation, *, now: float) -> float | None:
    """When `now_situation` should be written, given the `last` one written: `now` (at once),
    a later time (a change too soon after the last write), or None (nothing to write)."""
    if last is None:
        return now
    if last.situation == now_situation:
        return None
    if last.situation.kind == now_situation.kind:
        # Only the head's live numbers moved: kept current, but not every cycle.
        return max(now, last.at + HEAD_REFRESH_SECONDS)
    return max(now, last.at + REWRITE_SECONDS)
