"""`kubectl aw`'s terminal output: tenant strings cannot drive the terminal.

Names, RayCluster worker group names, node-selector values and the messages that repeat them
are written by tenants; every text line the plugin prints has its control characters
escaped, while `-o json` / `-o yaml` give the data back exactly.
"""

from __future__ import annotations

import io
import json
import math
import re
from argparse import Namespace
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from functools import partial
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatcher.plugin import main as plugin
from dispatcher.plugin.errors import ApiError, PluginError
from dispatcher.plugin.main import (
    cmd_list,
    cmd_queues,
    cmd_why,
    main,
    terminal_safe,
)
from dispatcher.plugin.queuetables import budget_left, heaviest_users

CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
"""What no printed line may hold (a line is what lies between two newlines)."""

ESC = "\x1b"
CLEAR = f"{ESC}[2J{ESC}[H"  # clear the screen, cursor home
TITLE = f"{ESC}]0;pwned\x07"  # set the window title (OSC ... BEL)
RED = f"{ESC}[31m"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("worker-gpu", "worker-gpu", id="plain"),
        pytest.param(f"{RED}gpu{ESC}[0m", "\\x1b[31mgpu\\x1b[0m", id="ansi-colour"),
        pytest.param(TITLE, "\\x1b]0;pwned\\x07", id="osc-title"),
        pytest.param("\x9b2J", "\\x9b2J", id="c1-csi"),
        pytest.param("a\x7fb\x00c", "a\\x7fb\\x00c", id="del-and-nul"),
        pytest.param("one\ntwo\rthree\tfour", "one\\x0atwo\\x0dthree\\x09four", id="line-breaks"),
        pytest.param("file\u202egpj.exe", "file\\u202egpj.exe", id="bidi-override"),
        pytest.param("a\u2028b", "a\\u2028b", id="line-separator"),
        pytest.param("café 東京 🚀", "café 東京 🚀", id="printable-unicode-kept"),
        pytest.param("C:\\x1b", "C:\\x1b", id="backslash-kept"),
    ],
)
def test_terminal_safe(text: str, want: str) -> None:
    assert terminal_safe(text) == want
    assert terminal_safe(want) == want  # escaping twice changes nothing


class Canned:
    """The reads `kubectl aw` makes, answered from canned objects."""

    namespace = "team-a"

    def __init__(
        self,
        appwrappers: list[dict[str, Any]],
        pending: list[dict[str, Any]],
        queues: list[dict[str, Any]] | None = None,
        local_queues: list[dict[str, Any]] | None = None,
    ) -> None:
        self.appwrappers = appwrappers
        self.pending = pending
        self.queues = queues or []
        self.local_queues = local_queues or []

    def get(self, path: str, **query: str) -> dict[str, Any]:
        if "/pendingappwrappers/" in path:
            name = path.rsplit("/", 1)[1]
            found = [p for p in self.pending if p["metadata"]["name"] == name]
            if not found:
                raise ApiError(404, "not found")
            return found[0]
        if path.endswith("/pendingappwrappers"):
            return {"items": self.pending}
        if "/appwrappers/" in path:
            return self.appwrappers[0]
        if path.endswith("/appwrappers"):
            return {"items": self.appwrappers}
        if path.endswith("/clusterappqueues"):
            return {"items": self.queues}
        return {"items": self.local_queues}


def appwrapper(name: str, *, state: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "team-a",
            "name": name,
            "labels": {"workload.codeflare.dev/queue": "team"},
        },
        "spec": {"priority": 0},
        "status": {
            "state": state,
            "clusterName": "local",
            "conditions": [
                {
                    "type": "Queueing",
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionMicroTime": "2027-01-15T08:00:00.000000Z",
                }
            ],
        },
    }


def pending(name: str, *, queue: str, reason: str, message: str, basis: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "team-a", "name": name},
        "position": 1,
        "positionInClusterQueue": 1,
        "positionInAppQueue": 1,
        "clusterQueue": queue,
        "appQueue": "team",
        "priority": 0,
        "waitingSeconds": 30,
        "reason": reason,
        "message": message,
        "eta": {"at": "2027-01-15T08:01:00Z", "latest": False, "basis": basis},
    }


def test_ansi_in_a_group_name_a_node_selector_and_a_message_is_shown_as_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As the dispatcher writes them: the pod set's name carries the RayCluster's worker
    # groupName, the flavor message the pods' node-selector value.
    no_node = (
        f"no schedulable node matches pod RayCluster/rc worker {CLEAR}gpu (nodeSelector/taints)"
    )
    flavor = f"RayCluster/rc worker gpu select accelerator={TITLE}a100; flavor f has h100"
    api = Canned(
        [appwrapper("rc", state="Pending", reason="InsufficientResources", message=no_node)],
        [pending("rc", queue="cq", reason="FlavorMismatch", message=flavor, basis=f"{RED}soon")],
    )
    cmd_why(api, Namespace(name="rc", output=None))  # type: ignore[arg-type]
    cmd_list(api, Namespace(all_namespaces=False, selector=None, output="wide"))  # type: ignore[arg-type]
    out, err = capsys.readouterr()
    assert err == ""
    assert ESC not in out
    assert "\x07" not in out
    assert "worker \\x1b[2J\\x1b[Hgpu (nodeSelector/taints)" in out
    assert "select accelerator=\\x1b]0;pwned\\x07a100; flavor f has h100" in out
    assert "\\x1b[31msoon" in out
    # The data stays exact where a program reads it.
    cmd_why(api, Namespace(name="rc", output="json"))  # type: ignore[arg-type]
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"]["conditions"][0]["message"] == no_node
    assert printed["pending"]["message"] == flavor


def test_an_error_message_is_one_escaped_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(**_: Any) -> None:
        raise PluginError(f'admission webhook denied: name "x{CLEAR}"\nerror: forged line')

    monkeypatch.setattr(plugin, "connect", refused)
    assert main(["list"]) == 1
    err = capsys.readouterr().err
    assert err == (
        'error: admission webhook denied: name "x\\x1b[2J\\x1b[H"\\x0aerror: forged line\n'
    )


# Any string a tenant might have stored (surrogates excepted: JSON from the API server
# never holds one), control characters and escape sequences favoured.
hostile = st.text(
    st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from([ESC, "\x9b", "\x07", "\x7f", "\n", "\r", "\u202e", "\u2028"]),
    ),
    max_size=12,
) | st.sampled_from([CLEAR, TITLE, RED])


@st.composite
def worlds(draw: st.DrawFn) -> Canned:
    s = partial(draw, hostile)  # one draw per field
    name = s()
    aw = appwrapper(name, state=s(), reason=s(), message=s())
    aw["metadata"]["namespace"] = s()
    aw["metadata"]["labels"] = {"workload.codeflare.dev/queue": s()}
    aw["status"]["clusterName"] = s()
    aw["status"]["admission"] = {"clusterQueue": s(), "flavors": {s(): s()}}
    item = pending(name, queue=s(), reason=s(), message=s(), basis=s())
    item["metadata"]["namespace"] = aw["metadata"]["namespace"]
    item["appQueue"] = s()
    item["eta"]["at"] = s()
    usage = [{"name": s(), "resources": [{"name": s(), "total": s(), "borrowed": s()}]}]
    queue = {
        "metadata": {"name": s()},
        "spec": {"stopPolicy": s()},
        "status": {
            "flavorsUsage": usage,
            "conditions": [{"type": "Active", "status": s()}],
            "admittedWorkloads": s(),
        },
    }
    local = {
        "metadata": {"namespace": s(), "name": s()},
        "spec": {"clusterQueue": s(), "stopPolicy": s()},
        "status": {"flavorsUsage": usage},
    }
    return Canned([aw], [item] if draw(st.booleans()) else [], [queue], [local])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=worlds())
def test_no_output_line_holds_a_control_character(world: Canned) -> None:
    api: Any = world
    name = world.appwrappers[0]["metadata"]["name"]
    runs: list[Callable[[], None]] = [
        partial(cmd_list, api, Namespace(all_namespaces=False, selector=None, output=None)),
        partial(cmd_list, api, Namespace(all_namespaces=True, selector=None, output="wide")),
        partial(cmd_why, api, Namespace(name=name, output=None)),
        partial(
            cmd_queues,
            api,
            Namespace(namespace=None, all_namespaces=False, selector=None, output=None),
        ),
    ]
    for output in ("json", "yaml"):
        runs.append(
            partial(cmd_list, api, Namespace(all_namespaces=True, selector=None, output=output))
        )
        runs.append(partial(cmd_why, api, Namespace(name=name, output=output)))
    for run in runs:
        out, err = captured(run)
        for line in [*out.split("\n"), *err.split("\n")]:
            assert CONTROL.search(line) is None, (run, line)
    # json and yaml give every string back exactly.
    for output, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        out, _ = captured(partial(cmd_why, api, Namespace(name=name, output=output)))
        assert load(out)["status"] == world.appwrappers[0]["status"]


def captured(run: Callable[[], None]) -> tuple[str, str]:
    """stdout and stderr of one command (capsys spans a whole hypothesis test, not one
    example)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        run()
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("queue", "want"),
    [
        ({"spec": {}}, "-"),
        (
            {
                "spec": {"budget": {"resource": "nvidia.com/gpu", "amountHours": 500}},
                "status": {"budget": {"remainingHours": 12.5}},
            },
            "12.5/500h-nvidia.com/gpu/Week",
        ),
        (
            {"spec": {"budget": {"resource": "cpu", "amountHours": "3", "period": "Day"}}},
            "?/3h-cpu/Day",
        ),
        (
            {
                "spec": {"budget": {"resource": "cpu", "amountHours": 3}},
                "status": {"budget": {"remainingHours": "lots"}},
            },
            "?/3h-cpu/Week",
        ),
    ],
)
def test_a_queues_budget_column(queue: dict[str, object], want: str) -> None:
    assert budget_left(queue) == want


def test_the_heaviest_users_of_each_queue_by_use_over_time() -> None:
    tau = 3600.0 / math.log(2)  # a half-life of an hour: value / tau is the rate
    history = {
        "halfLifeSeconds": 3600.0,
        "users": [
            {"name": "light", "resources": {"cpu": 1000 * tau}},
            {"name": "heavy", "resources": {"cpu": 4000 * tau, "nvidia.com/gpu": 2000 * tau}},
            "not an entry",
            {"name": "odd", "resources": "many"},
        ],
    }
    queues = [
        {"metadata": {"name": "team"}, "status": {"usageHistory": history}},
        {"metadata": {"name": "instant"}, "status": {}},
        {"metadata": {"name": "bad"}, "status": {"usageHistory": {"halfLifeSeconds": "x"}}},
    ]
    assert heaviest_users(queues) == [
        ["CLUSTERAPPQUEUE", "USER", "AVERAGE USE"],
        ["team", "heavy", "cpu=4,nvidia.com/gpu=2"],
        ["team", "light", "cpu=1"],
    ]
