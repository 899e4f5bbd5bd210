"""`make conformance`: MCAD's own end-to-end suite, run against this dispatcher (or MCAD).

MCAD v1.40.0's Go e2e suite (`test/e2e` of its module, from the Go module proxy) is built once
into the cache directory, never into the repository. A local control plane gets KWOK nodes
sized like MCAD's CI cluster; the system under test runs against it; then every active test of
the suite runs alone (`-ginkgo.focus`), with a time cap and a clean-up between tests, and the
outcome of each is written as JSON and as a Markdown table. `--suite appwrapper` runs the
AppWrapper project's suite instead (benchmarks/conformance_appwrapper.py, which reuses the
module download and the one-test run here).

Side effects: `go` downloads and builds into the cache; a local control plane and the system
under test run for the duration; results under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import report
from testenv.converter import install_appwrapper_crd
from testenv.localcluster import (
    DEFAULT_CACHE,
    LocalCluster,
    ensure_binaries,
    free_port,
)

MODULE = "github.com/project-codeflare/multi-cluster-app-dispatcher"
VERSION = "v1.40.0"
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

# MCAD's CI cluster (kind): what its tests' sizes assume.
NODES = {
    "test-control-plane": {"cpu": "1050m", "memory": "6Gi", "gpu": 8, "pods": 110},
    "test-worker": {"cpu": "900m", "memory": "6Gi", "gpu": 8, "pods": 110},
}

DEFAULT_CAP = 300.0
"""Seconds one test may run, unless CAPS says otherwise."""
CAPS = {
    # MCAD's requeue windows grow 1, 2, then 4 minutes: about 390 s against this dispatcher,
    # 645 s against MCAD itself on this machine.
    "MCAD CPU Requeuing - Completion After Enough Requeuing Times Test": 900.0,
    # Waits for MCAD's dispatch-duration timeout and its requeue: 360 s against MCAD.
    "MCAD app wrapper timeout Test": 600.0,
}
"""Tests that need more than DEFAULT_CAP by their own design (measured with a 900 s cap)."""

_IT = re.compile(r'^\s*It\("((?:[^"\\]|\\.)*)"', re.MULTILINE)
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_LINE_COMMENT = re.compile(r"^\s*//.*$", re.MULTILINE)
_RE2_SPECIAL = set(r"\.+*?()|[]{}^$")


@dataclass(frozen=True)
class Outcome:
    test: str
    result: str
    """pass, fail, timeout (the cap was reached) or missing (the focus matched nothing)."""
    seconds: float
    detail: str
    """The suite's own failure message, cut short."""
    cap: float = DEFAULT_CAP
    """The seconds it was allowed."""


def mcad_dir(cache: Path) -> Path:
    return cache / "mcad"


def module_source(module: str, version: str, dest: Path) -> Path:
    """A writable copy of `module@version` at `dest` (from the Go module proxy), unless there."""
    if dest.exists():
        return dest
    found = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(json.loads(found.stdout)["Dir"], partial)
    for path in [partial, *partial.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    partial.rename(dest)
    return dest


def build(cache: Path, *, controller_too: bool) -> tuple[Path, Path, Path]:
    """(source, e2e test binary, kar-controllers): downloaded and built when missing (the
    controller only when asked: MCAD itself is the system under test)."""
    home = mcad_dir(cache)
    source = home / f"src-{VERSION}"
    tests, controller = home / f"mcad-e2e-{VERSION}.test", home / f"kar-controllers-{VERSION}"
    home.mkdir(parents=True, exist_ok=True)
    # One build at a time: test processes running side by side each ask for the suite.
    with (home / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # A writable copy: its own go.mod must be the main module (it has replaces).
        module_source(MODULE, VERSION, source)
        if not tests.exists():
            subprocess.run(
                ["go", "test", "-c", "-o", str(tests), "./test/e2e"], check=True, cwd=source
            )
        if controller_too and not controller.exists():
            subprocess.run(
                ["go", "build", "-o", str(controller), "./cmd/kar-controllers"],
                check=True,
                cwd=source,
            )
    return source, tests, controller


def active_tests(source: Path) -> list[str]:
    """The names of the suite's tests that are not commented out, in file order."""
    names = []
    for path in sorted((source / "test" / "e2e").glob("*.go")):
        text = _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", path.read_text()))
        names += [m.group(1).replace('\\"', '"') for m in _IT.finditer(text)]
    return names


def focus_on(name: str) -> str:
    """A Go (RE2) regular expression matching exactly this test's name at the end."""
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in name) + "$"


# The suite's pods stand for real programs: KWOK's fast stages would finish them at once. Two
# of them matter to its tests: a container that runs `sleep infinity` never ends, and a pod
# with init containers (the suite's take 200 s) is Ready only 200 s after it is bound.
_NEVER_ENDS = """    - key: '.spec.containers.[].args.[]'
      operator: 'NotIn'
      values:
      - 'sleep infinity'
"""
_NO_INIT = """    - key: '.spec.initContainers'
      operator: 'DoesNotExist'
"""


_AFTER_INIT = """    - key: '.spec.initContainers'
      operator: 'Exists'
"""
_INIT_DELAY = """  delay:
    durationMilliseconds: 200000
  next:
"""


def _with(text: str, selector: str) -> str:
    return text.replace("    matchExpressions:\n", "    matchExpressions:\n" + selector, 1)


def kwok_stages(work: Path) -> list[Path]:
    """KWOK's fast stages, with the two exceptions above."""
    stages = []
    for path in ensure_binaries().kwok_stages:
        if path.parent.parent.name != "pod" or path.name not in (
            "pod-complete.yaml",
            "pod-ready.yaml",
        ):
            stages.append(path)
            continue
        text = path.read_text()
        variants = {"": _with(text, _NEVER_ENDS)}
        if path.name == "pod-ready.yaml":
            delayed = _with(text, _AFTER_INIT).replace("  next:\n", _INIT_DELAY, 1)
            variants = {
                "": _with(text, _NO_INIT),
                "-after-init": delayed.replace("name: pod-ready\n", "name: pod-ready-after-init\n"),
            }
        for suffix, content in variants.items():
            stage = work / f"stage-{path.stem}{suffix}.yaml"
            stage.write_text(content)
            stages.append(stage)
    return stages


def start_system(
    system: str, cluster: LocalCluster, controller: Path, source: Path, work: Path
) -> subprocess.Popen[bytes]:
    """The system under test, running against `cluster`, with its CRDs installed."""
    log = (work / f"{system}.log").open("ab")
    if system == "ours":
        install_appwrapper_crd(cluster, server_side=True)
        config = work / "dispatcher.yaml"
        config.write_text(
            json.dumps(
                # MCAD's suite creates AppWrappers with no admission webhook in front.
                {"kubeconfig": str(cluster.kubeconfig), "health_port": 0, "unattributed": "allow"}
            )
        )
        command = [sys.executable, "-m", "dispatcher", "run", "--config", str(config)]
    else:
        for crd in sorted((source / "config" / "crd" / "bases").glob("*.yaml")):
            cluster.kubectl("apply", "--server-side", "-f", str(crd))
        command = [
            str(controller),
            "--kubeconfig",
            str(cluster.kubeconfig),
            f"--healthProbeListenAddr=127.0.0.1:{free_port()}",
        ]
    cluster.kubectl("wait", "--for=condition=Established", "crd/appwrappers.workload.codeflare.dev")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def run_one(
    binary: Path,
    source: Path,
    home: Path,
    name: str,
    cap: float,
    log: Path,
    *,
    focus: str | None = None,
    extra: Sequence[str] = (),
) -> Outcome:
    """One test alone (`focus`: the expression that selects it, by default its name at the
    end; `extra`: more flags for the suite); its whole output kept in `log`."""
    started = time.monotonic()
    command = [
        str(binary),
        f"-ginkgo.focus={focus or focus_on(name)}",
        "-ginkgo.noColor",
        f"-test.timeout={int(cap) + 30}s",
        *extra,
    ]
    try:
        done = subprocess.run(
            command,
            cwd=source / "test" / "e2e",
            env={**os.environ, "HOME": str(home)},  # the suite reads ~/.kube/config
            capture_output=True,
            text=True,
            timeout=cap,
        )
    except subprocess.TimeoutExpired as exc:
        log.write_text(str(exc.stdout or "") + str(exc.stderr or ""))
        return Outcome(
            name, "timeout", round(time.monotonic() - started, 1), f"over {cap:.0f}s", cap
        )
    seconds = round(time.monotonic() - started, 1)
    output = done.stdout + done.stderr
    log.write_text(output)
    ran = re.search(r"Ran (\d+) of \d+ Specs", output)
    if ran is None or ran.group(1) != "1":
        found = ran.group(0) if ran else output.strip().splitlines()[-1:]
        return Outcome(name, "missing", seconds, f"not run alone: {found}", cap)
    if done.returncode == 0:
        return Outcome(name, "pass", seconds, "", cap)
    return Outcome(name, "fail", seconds, _failure(output), cap)


def _failure(output: str) -> str:
    """The first assertion message the suite printed, on one line."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if line.strip().startswith("[Fail]") or "Expected" in line:
            return " ".join(s.strip() for s in lines[index : index + 4])[:300]
    # Ginkgo v2's other failures ("Unexpected error:", a message of the suite's own).
    for index, line in enumerate(lines):
        if line.strip().startswith("[FAILED]") and not line.strip().startswith("[FAILED] in"):
            return " ".join(s.strip() for s in lines[index : index + 4])[:300]
    return " ".join(lines[-3:])[:300]


def clean(cluster: LocalCluster) -> None:
    """Between tests: no AppWrapper, and nothing left in the suite's namespace."""
    cluster.kubectl(
        "delete", "appwrappers", "--all", "-A", "--timeout=120s", check=False, timeout=150
    )
    for kind in ("deployments", "statefulsets", "jobs", "services", "pods", "podtemplates"):
        cluster.kubectl(
            "delete",
            kind,
            "--all",
            "-n",
            "test",
            "--grace-period=0",
            "--timeout=60s",
            check=False,
            timeout=90,
        )


def table(system: str, outcomes: Sequence[Outcome], *, suite: str = f"MCAD {VERSION}") -> str:
    """The results as Markdown: how many of `suite`'s tests passed against `system`, then
    one row per test (a detail's `|` and line breaks kept out of the table's cells)."""
    passed = sum(o.result == "pass" for o in outcomes)
    lines = [
        f"{suite} e2e suite against {system}: {passed} of {len(outcomes)} pass",
        "",
        "| Test | Result | Seconds | Cap | Detail |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {o.test} | {o.result} | {o.seconds} | {o.cap:.0f} | {cell(o.detail)} |"
        for o in outcomes
    ]
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    """`text` as one Markdown table cell."""
    return text.replace("|", "/").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    suite, rest = argparse.ArgumentParser(add_help=False), None
    suite.add_argument("--suite", choices=["mcad", "appwrapper"], default="mcad")
    chosen, rest = suite.parse_known_args(argv)
    if chosen.suite == "appwrapper":
        # Imported here: it imports this module (and benchmarks.peers, which does too).
        from benchmarks import conformance_appwrapper

        return conformance_appwrapper.main(rest)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["ours", "mcad"], default="ours")
    parser.add_argument("--only", default="", help="run only tests whose name matches this")
    parser.add_argument(
        "--cap",
        type=float,
        default=None,
        help=f"seconds per test, for every test (default: {DEFAULT_CAP:.0f}, more where CAPS says)",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(rest)
    # Stopped (timeout, kill): the clean-up below still runs, nothing is left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    source, binary, controller = build(args.cache, controller_too=args.system == "mcad")
    names = [n for n in active_tests(source) if re.search(args.only, n)]
    with tempfile.TemporaryDirectory(prefix="aw-conformance-") as tmp:
        work = Path(tmp)
        cluster = LocalCluster.start("conformance", work, kwok_stages=kwok_stages(work))
        system = None
        try:
            for node, size in NODES.items():
                cluster.add_node(node, **size)
            cluster.wait_nodes_ready(list(NODES))
            home = work / "home"
            (home / ".kube").mkdir(parents=True)
            shutil.copy(cluster.kubeconfig, home / ".kube" / "config")
            system = start_system(args.system, cluster, controller, source, work)
            outcomes = []
            logs = mcad_dir(args.cache) / "logs" / args.system
            logs.mkdir(parents=True, exist_ok=True)
            for number, name in enumerate(names):
                log = logs / f"{number:02d}.log"
                cap = args.cap or CAPS.get(name, DEFAULT_CAP)
                outcome = run_one(binary, source, home, name, cap, log)
                print(f"{outcome.result:8} {outcome.seconds:7.1f}s  {name}", flush=True)
                outcomes.append(outcome)
                clean(cluster)
        finally:
            if system is not None:
                system.terminate()
                system.wait(30)
            cluster.stop()
    out = RESULTS / f"conformance-{args.system}.json"
    if args.only and out.exists():
        # A re-run of some tests replaces their rows in the last full table, in suite order.
        again = {o.test: o for o in outcomes}
        earlier = [Outcome(**row) for row in json.loads(out.read_text())["tests"]]
        outcomes = [again.pop(o.test, o) for o in earlier] + list(again.values())
    result = {
        "suite": f"{MODULE}@{VERSION} test/e2e",
        "system": args.system,
        "nodes": NODES,
        "cap_seconds": args.cap or {"default": DEFAULT_CAP, **CAPS},
        "passed": sum(o.result == "pass" for o in outcomes),
        "tests": [asdict(o) for o in outcomes],
    }
    report.save(result, out)
    (RESULTS / f"conformance-{args.system}.md").write_text(table(args.system, outcomes))
    print(table(args.system, outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
