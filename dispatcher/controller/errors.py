"""Whose fault is an error, and what to do about it: one exception type for "the user's
input is at fault" (`TerminalError`, as controller-runtime's `reconcile.TerminalError` and
kopf's `PermanentError`) and one policy (`decide`) that maps any exception to an `Action`.
The reconciler acts on it where it can say so in an AppWrapper's status (the errors met
making its objects), the work queue's workers (`workqueue.serve`) everywhere else.

Pure, no I/O. The rule it keeps: errors about the user's input fail the user's AppWrapper;
errors of the dispatcher's own (its bugs, an API server's refusals of its own requests,
an unreachable member) never do: they are retried, logged and, where there is a status to
say it in, said there.

| Error                                   | Action  | What happens                              |
|-----------------------------------------|---------|-------------------------------------------|
| `TerminalError`                         | FAIL    | Failed with its reason and message        |
| `UserInputError` (cluster/objects.py)   | FAIL    | Failed, `DispatchFailed`                  |
| other `DispatchError`                   | REQUEUE | objects removed, queued after a pause     |
| `Conflict` (and `AlreadyExists`)        | RERUN   | re-read and run at once, then backing off |
| `NotFound`                              | FORGET  | it went: the watch says the rest          |
| other `KubeError`                       | RETRY   | backing off, logged, said in the status   |
| any other exception (a bug)             | RETRY   | the same, logged with its traceback       |
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from dispatcher.api.models import Reason
from dispatcher.cluster.objects import DispatchError, UserInputError
from dispatcher.kube.errors import Conflict, KubeError, NotFound


class TerminalError(Exception):
    """The user's input is at fault and trying again cannot help: the AppWrapper is failed
    with `reason` and `message` (which names what to change)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Action(Enum):
    FAIL = "fail"
    """The user's input: the AppWrapper ends Failed (`Decision.reason`, `.message`); the
    key is not retried (the same input meets the same error)."""
    REQUEUE = "requeue"
    """One dispatch attempt failed for a reason that may pass: its objects removed, its room
    given back, queued again after a pause."""
    RERUN = "rerun"
    """Someone (often our own earlier write) changed it: re-read and run again at once, then
    with backoff should it keep losing."""
    FORGET = "forget"
    """It went: nothing to do (its deletion is the watch's to tell)."""
    RETRY = "retry"
    """The dispatcher's own, or an answer of an API server to it: tried again with growing
    pauses, logged, and said in the status where there is one (never Failed)."""


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: Reason | None = None
    """FAIL and REQUEUE: the reason to write; else None (the caller knows what it did)."""
    message: str = ""
    """For the status (and the log): what went wrong, whose it is."""
    own: bool = False
    """A bug of the dispatcher's (not an API's answer): logged with its traceback."""


def decide(exc: Exception, *, doing: str = "reconciling") -> Decision:
    """What to do about `exc`, met while `doing` (words for the message: "creating the
    wrapped objects"). The one place that tells the user's errors from the dispatcher's."""
    if isinstance(exc, TerminalError):
        return Decision(Action.FAIL, exc.reason, exc.message)
    if isinstance(exc, UserInputError):
        return Decision(Action.FAIL, Reason.DISPATCH_FAILED, f"{doing} failed: {exc}")
    if isinstance(exc, DispatchError):
        return Decision(Action.REQUEUE, Reason.DISPATCH_FAILED, f"{doing} failed: {exc}")
    if isinstance(exc, Conflict):
        return Decision(Action.RERUN, message=str(exc)[:300])
    if isinstance(exc, NotFound):
        return Decision(Action.FORGET, message=str(exc)[:300])
    what = f"{type(exc).__name__}: {str(exc)[:200]}"
    if isinstance(exc, KubeError):
        return Decision(
            Action.RETRY,
            message=f"{doing} met an API error, not an error of this AppWrapper; retrying: {what}",
        )
    return Decision(
        Action.RETRY,
        message=(
            f"{doing} met an error of the dispatcher's own, not of this AppWrapper; "
            f"retrying: {what}"
        ),
        own=True,
    )


__all__ = ["Action", "Decision", "TerminalError", "decide"]
