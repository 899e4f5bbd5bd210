"""The one error policy (controller/errors.py `decide`): each kind of error met, what is
done about it; and the work queue's workers (`serve`) acting on it. Errors about the user's
input fail the user's AppWrapper; errors of the dispatcher's own never do."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from structlog.testing import capture_logs

from dispatcher.api.models import Reason
from dispatcher.clock import ManualClock
from dispatcher.cluster.objects import DispatchError, UserInputError
from dispatcher.controller.errors import Action, TerminalError, decide
from dispatcher.controller.status import Fenced
from dispatcher.controller.workqueue import Result, WorkQueue, serve
from dispatcher.kube.errors import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    ServerError,
    TooManyRequests,
    Unreachable,
)

DOING = "creating the wrapped objects"


@dataclass(frozen=True)
class Case:
    error: Exception
    want_action: Action
    want_reason: Reason | None = None
    want_own: bool = False
    want_message: str = ""
    """A part of the decision's message."""


CASES = [
    pytest.param(
        Case(
            TerminalError(Reason.FORBIDDEN, "alice may not create jobs"),
            Action.FAIL,
            Reason.FORBIDDEN,
            want_message="alice may not create jobs",
        ),
        id="terminal-error-fails-with-its-reason",
    ),
    pytest.param(
        Case(
            UserInputError("Job/a: kind Job is cluster-scoped"),
            Action.FAIL,
            Reason.DISPATCH_FAILED,
            want_message=f"{DOING} failed: Job/a: kind Job is cluster-scoped",
        ),
        id="user-input-error-fails",
    ),
    pytest.param(
        Case(
            DispatchError("Job/a: server unavailable"),
            Action.REQUEUE,
            Reason.DISPATCH_FAILED,
            want_message=f"{DOING} failed: Job/a: server unavailable",
        ),
        id="dispatch-error-requeues",
    ),
    pytest.param(Case(Conflict("changed", status=409), Action.RERUN), id="conflict-reruns"),
    pytest.param(
        Case(AlreadyExists("exists", status=409), Action.RERUN), id="already-exists-reruns"
    ),
    pytest.param(Case(NotFound("gone", status=404), Action.FORGET), id="not-found-forgets"),
    *(
        pytest.param(
            Case(error, Action.RETRY, want_message="met an API error, not an error of this"),
            id=f"api-{name}-retries",
        )
        for name, error in [
            ("server-error", ServerError("boom", status=500)),
            ("429", TooManyRequests("slow down", status=429)),
            ("unreachable", Unreachable("no route")),
            # Refusals of the dispatcher's own requests (a status write, a list): not the
            # user's input, which only the cluster layer names (UserInputError).
            ("forbidden", Forbidden("no rbac", status=403)),
            ("invalid", Invalid("bad status", status=422)),
            ("bad-request", BadRequest("bad", status=400)),
            ("unknown-status", KubeError("teapot", status=418)),
            ("fenced", Fenced("not the leader any more")),
        ]
    ),
    *(
        pytest.param(
            Case(
                error,
                Action.RETRY,
                want_own=True,
                want_message=f"error of the dispatcher's own, not of this AppWrapper; "
                f"retrying: {type(error).__name__}",
            ),
            id=f"bug-{type(error).__name__}-retries-never-fails",
        )
        for error in [KeyError("x"), ValueError("y"), AssertionError(), RecursionError()]
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_each_error_kind_has_one_decision(case: Case) -> None:
    decision = decide(case.error, doing=DOING)
    assert decision.action is case.want_action
    assert decision.reason == case.want_reason
    assert decision.own is case.want_own
    assert case.want_message in decision.message


def test_only_the_users_errors_fail() -> None:
    failing = [c.values[0] for c in CASES if c.values[0].want_action is Action.FAIL]
    assert {type(c.error) for c in failing} == {TerminalError, UserInputError}


# -- the workers ----------------------------------------------------------------------


@dataclass(frozen=True)
class Worker:
    calls: int
    """Runs of the handler (raising the first time, done after)."""
    failures: int
    """The key's failures the queue counts (its backoff)."""
    waiting: bool
    """A delayed add is pending (backing off)."""
    logged: list[str]


async def _serve_one(error: Exception) -> Worker:
    clock = ManualClock()
    queue = WorkQueue(clock=clock)
    calls = 0

    async def handle(key: str) -> Result:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise error
        return Result.done()

    with capture_logs() as logs:
        worker = asyncio.create_task(serve(queue, handle))
        queue.add("ns/a")
        for _ in range(20):
            await asyncio.sleep(0)
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker
    return Worker(
        calls=calls,
        failures=queue.failures("ns/a"),
        waiting="ns/a" in queue._timers,
        logged=[entry["event"] for entry in logs],
    )


@pytest.mark.parametrize(
    ("error", "want"),
    [
        pytest.param(
            Conflict("changed", status=409),
            Worker(calls=2, failures=0, waiting=False, logged=[]),
            id="conflict-runs-again-at-once",
        ),
        pytest.param(
            NotFound("gone", status=404),
            Worker(calls=1, failures=0, waiting=False, logged=[]),
            id="not-found-is-dropped",
        ),
        pytest.param(
            TerminalError(Reason.INVALID_SPEC, "bad"),
            Worker(calls=1, failures=0, waiting=False, logged=["reconcile_terminal"]),
            id="terminal-is-not-retried",
        ),
        pytest.param(
            ServerError("boom", status=500),
            Worker(calls=1, failures=1, waiting=True, logged=["reconcile_failed"]),
            id="api-error-backs-off",
        ),
        pytest.param(
            DispatchError("server unavailable"),
            Worker(calls=1, failures=1, waiting=True, logged=["reconcile_failed"]),
            id="dispatch-error-backs-off",
        ),
        pytest.param(
            KeyError("bug"),
            Worker(calls=1, failures=1, waiting=True, logged=["reconcile_crashed"]),
            id="bug-backs-off-with-traceback",
        ),
    ],
)
async def test_the_workers_act_on_the_decision(error: Exception, want: Worker) -> None:
    assert await _serve_one(error) == want
