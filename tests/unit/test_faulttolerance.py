"""The AppWrapper controller's fault-tolerance annotations (dispatcher/core/faulttolerance.py):
Go durations, what is refused naming the annotation, and the mapping onto requeuing."""

from __future__ import annotations

import pytest

from dispatcher.api.models import Requeuing
from dispatcher.config import FaultToleranceConfig
from dispatcher.core.faulttolerance import (
    FAILURE_GRACE,
    RETRY_LIMIT,
    RETRY_PAUSE,
    SUCCESS_TTL,
    TERMINAL_EXIT_CODES,
    WARMUP_GRACE,
    FaultToleranceBounds,
    effective_requeuing,
    parse_duration,
    problems,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5h", 5400.0), ("500ms", 0.5)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "-5s", "5 m", "five minutes", "1d", "s", "1h-5m"])
def test_malformed_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param({FAILURE_GRACE: "1m"}, [], id="fine"),
        pytest.param(
            {FAILURE_GRACE: "soon"}, [f"metadata.annotations[{FAILURE_GRACE}]"], id="duration"
        ),
        pytest.param({SUCCESS_TTL: "7d"}, [f"metadata.annotations[{SUCCESS_TTL}]"], id="days"),
        pytest.param({RETRY_LIMIT: "-1"}, [f"metadata.annotations[{RETRY_LIMIT}]"], id="retries"),
        pytest.param(
            {TERMINAL_EXIT_CODES: "1,x"},
            [f"metadata.annotations[{TERMINAL_EXIT_CODES}]"],
            id="exit-codes",
        ),
        pytest.param({"other.example.com/x": "soon"}, [], id="not-ours"),
    ],
)
def test_problems_name_the_annotation(annotations: dict[str, str], want: list[str]) -> None:
    assert [p.split(":", 1)[0] for p in problems(annotations)] == want


BOUNDS = FaultToleranceBounds(grace_period_maximum_seconds=600, retry_limit_maximum=5)


@pytest.mark.parametrize(
    ("annotations", "want"),
    [
        pytest.param({}, {}, id="none: the spec's own"),
        pytest.param(
            {WARMUP_GRACE: "2m"}, {"timeInSeconds": 120, "growthType": "none"}, id="warmup"
        ),
        pytest.param(
            {WARMUP_GRACE: "5h"}, {"timeInSeconds": 600, "growthType": "none"}, id="cut-to-bound"
        ),
        pytest.param({RETRY_PAUSE: "90s"}, {"pauseTimeInSeconds": 90}, id="pause"),
        pytest.param({RETRY_LIMIT: "3"}, {"maxNumRequeuings": 3}, id="limit"),
        pytest.param({RETRY_LIMIT: "0"}, {"maxNumRequeuings": 1}, id="no-retry-is-one"),
        pytest.param({RETRY_LIMIT: "50"}, {"maxNumRequeuings": 5}, id="limit-cut-to-bound"),
        pytest.param({WARMUP_GRACE: "soon"}, {}, id="malformed-left-out"),
    ],
)
def test_mapping_onto_requeuing(annotations: dict[str, str], want: dict[str, object]) -> None:
    spec = Requeuing(timeInSeconds=300, maxNumRequeuings=0)
    got = effective_requeuing(spec, annotations, BOUNDS)
    assert got == spec.model_copy(update=want)


def test_settings_give_the_bounds() -> None:
    settings = FaultToleranceConfig(grace_period_maximum_seconds=60, retry_limit_maximum=2)
    bounds = settings.bounds()
    assert (bounds.grace_period_maximum_seconds, bounds.retry_limit_maximum) == (60, 2)
