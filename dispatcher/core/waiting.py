"""When "why it waits" is worth a status write. Pure, no I/O.

Every cycle gives every waiting AppWrapper a message with numbers ("needs cpu 4, free 2 of
8"). With capacity churning, those numbers move on every cycle, and writing them for 10k
queued AppWrappers would cost the API server a thousand status writes a second. So: the
head of the line's message is kept current (it is the one users watch); behind it a new
kind of reason is written within REWRITE_SECONDS, numbers that merely moved only every
REFRESH_SECONDS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REWRITE_SECONDS = 10.0
REFRESH_SECONDS = 300.0
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True, slots=True)
class Written:
    """The last waiting message written for one AppWrapper, and when."""

    message: str
    at: float


def kind_of_reason(message: str) -> str:
    """A message without its numbers: "needs cpu 2, free 1 of 8" -> "needs cpu #, free # of #"."""
    return _NUMBER.sub("#", message)


def worth_writing(last: Written | None, message: str, *, head: bool, now: float) -> bool:
    """Whether `message` should be written now, given the `last` one written."""
    if last is None:
        return True
    if last.message == message:
        return False
    if head:
        return True
    if kind_of_reason(last.message) == kind_of_reason(message):
        return now - last.at >= REFRESH_SECONDS
    return now - last.at >= REWRITE_SECONDS
