"""`make conformance SUITE=appwrapper`: the AppWrapper project's own e2e suite, run against this
dispatcher (or against the AppWrapper controller with Kueue, the reference).

The suite (`test/e2e` of github.com/project-codeflare/appwrapper v1.1.2, from the Go module
proxy) is compiled once with `go test -c` into the cache directory beside the controller that
`make peers` built. Its specs are listed by a Ginkgo dry run (full names and labels); those its
CI runs (labels Kueue, Webhook or Metrics) each run alone, with a time cap and a clean-up
between them, on a local control plane whose KWOK nodes are sized as its CI's kind cluster.

Both systems see the same cluster: Kueue's CRDs installed (the suite creates a ResourceFlavor,
a ClusterQueue of 2 CPUs and a LocalQueue), KubeRay's operator, the PyTorchJob and JobSet CRDs
(their operators are not here). SYSTEM=appwrapper: Kueue v0.15.0 and the controller v1.1.2
(`make peers`), the controller's webhooks on and registered by URL. SYSTEM=ours: no Kueue
controller; the dispatcher with its admission webhook and conversion endpoint on (the systems:
benchmarks/conformance_appwrapper_systems.py). `--our-queues`: the suite's Kueue objects also
written as this dispatcher's quota kinds. `python -m benchmarks.conformance_appwrapper compare
CAUSES.json RUN...` prints saved runs side by side (docs/appwrapper-compatibility.md).

Side effects: `go` builds into the cache; a local control plane and the system under test run
for the duration (the controller's webhook listens on port 9443, fixed in its code); results
under benchmarks/results/conformance-appwrapper-$SYSTEM.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import conformance, peers, report
from benchmarks.conformance import Outcome, cell
from benchmarks.conformance_appwrapper_systems import (
    NAMESPACE,
    SYSTEM_NAMESPACE,
    WEBHOOK_PORT,
    install_our_queues,
    start_ours,
    start_reference,
)
from testenv.localcluster import DEFAULT_CACHE, LocalCluster, ensure_binaries

VERSION = peers.APPWRAPPER_VERSION
SUITE = f"{peers.APPWRAPPER_MODULE}@{VERSION} test/e2e"
RESULTS = conformance.RESULTS
LABEL_FILTER = "Kueue || Webhook || Metrics"
"""What its CI runs (hack/run-tests-on-cluster.sh: LABEL_FILTER=Kueue,Webhook,Metrics)."""

# Its CI cluster: kind (one control plane, two workers) on a GitHub ubuntu-latest runner (4
# CPUs, 16 GiB, each node sees all of it), 8 virtual GPUs patched onto every node; the control
# plane carries kind's NoSchedule taint.
_NODE = {"cpu": "4", "memory": "16Gi", "gpu": 8, "pods": 110}
_CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
NODES: dict[str, dict[str, Any]] = {
    "test-control-plane": {**_NODE, "taints": [_CONTROL_PLANE_TAINT]},
    "test-worker": _NODE,
    "test-worker2": _NODE,
}

DEFAULT_CAP = 300.0
CAPS = {
    # Its one check waits up to 3600 s for `kubectl exec` into a curl pod reaching a Service:
    # no kubelet and no Service network here, so it can only end at the cap.
    "Metrics should ensure the metrics endpoint is serving metrics": 60.0,
}

# Operators the suite's CI installs whose CRDs are all that is here (the objects can be
# created; nothing makes their pods): CI's versions, from the Go module proxy.
CRD_MODULES = {
    "github.com/kubeflow/training-operator@v1.8.1": (
        "manifests/base/crds/kubeflow.org_pytorchjobs.yaml"
    ),
    "sigs.k8s.io/jobset@v0.7.3": "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",
}


@dataclass(frozen=True)
class Spec:
    """One spec of the suite: its full name (containers and leaf), and its labels."""

    name: str
    labels: tuple[str, ...]


# -- the suite: build, list ------------------------------------------------------------------


def build(cache: Path) -> tuple[Path, Path]:
    """(source, e2e test binary): the module copy `make peers` made (downloaded here when
    missing), and the suite compiled in it, unless already there."""
    home = cache / "appwrapper"
    source = peers.appwrapper(cache, build=False).source
    binary = home / f"appwrapper-e2e-{VERSION}.test"
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conformance.module_source(peers.APPWRAPPER_MODULE, VERSION, source)
        if not binary.exists():
            partial = binary.with_name(binary.name + ".partial")
            subprocess.run(
                ["go", "test", "-c", "-o", str(partial), "./test/e2e"], check=True, cwd=source
            )
            partial.rename(binary)
    return source, binary


def parse_report(report_json: str) -> list[Spec]:
    """The `It` specs of a Ginkgo JSON report (a dry run lists them all), in source order
    (file, then line: Ginkgo shuffles top-level containers by its random seed)."""
    found = []
    for suite in json.loads(report_json):
        for spec in suite.get("SpecReports") or []:
            if spec.get("LeafNodeType") != "It":
                continue
            texts = [*(spec.get("ContainerHierarchyTexts") or []), spec["LeafNodeText"]]
            labels: list[str] = []
            groups = [*(spec.get("ContainerHierarchyLabels") or []), spec.get("LeafNodeLabels")]
            for group in groups:
                labels += [label for label in group or [] if label not in labels]
            where = spec.get("LeafNodeLocation") or {}
            place = (where.get("FileName", ""), where.get("LineNumber", 0))
            found.append((place, Spec(" ".join(texts), tuple(labels))))
    return [spec for _, spec in sorted(found, key=lambda pair: pair[0])]


def list_specs(binary: Path, source: Path, work: Path) -> list[Spec]:
    """Every spec CI's label filter selects, by a dry run (nothing runs, no cluster needed)."""
    out = work / "dry-run.json"
    subprocess.run(
        [
            str(binary),
            "-ginkgo.dry-run",
            f"-ginkgo.label-filter={LABEL_FILTER}",
            f"-ginkgo.json-report={out}",
        ],
        check=True,
        capture_output=True,
        cwd=source / "test" / "e2e",
    )
    return parse_report(out.read_text())


SUITE_DESCRIPTION = "AppWrapper Test Suite"
"""Its RunSpecs description, which Ginkgo puts before every spec's name when it focuses."""


def focus(name: str) -> str:
    """A Go (RE2) regular expression matching exactly this full spec name."""
    return "^" + conformance.focus_on(f"{SUITE_DESCRIPTION} {name}")


# -- the cluster -----------------------------------------------------------------------------

# The suite's containers are `sh -c "sleep N[; exit C]"`: KWOK's stages stand for them. Pods of
# Jobs complete only where the command says when (10 s, then 0 or 1); the rest keep running.
# A pod with init containers (the suite's one is stuck for good) never becomes Ready.
_DONE_AFTER = {"sleep 10; exit 0": ("Succeeded", 0), "sleep 10; exit 1": ("Failed", 1)}


def _command_is(command: str) -> str:
    return f"""    - key: '.spec.containers.[].command.[]'
      operator: 'In'
      values:
      - '{command}'
"""


def kwok_stages(work: Path) -> list[Path]:
    stages = []
    for path in ensure_binaries().kwok_stages:
        is_pod = path.parent.parent.name == "pod"
        if not is_pod or path.name not in ("pod-complete.yaml", "pod-ready.yaml"):
            stages.append(path)
            continue
        text = path.read_text()
        if path.name == "pod-ready.yaml":
            variants = {"": conformance._with(text, conformance._NO_INIT)}
        else:
            variants = {}
            for command, (phase, code) in _DONE_AFTER.items():
                done = conformance._with(text, _command_is(command))
                done = done.replace(
                    "  next:\n", "  delay:\n    durationMilliseconds: 10000\n  next:\n", 1
                )
                done = done.replace("exitCode: 0", f"exitCode: {code}").replace(
                    "phase: Succeeded", f"phase: {phase}"
                )
                if code:
                    done = done.replace("reason: Completed", "reason: Error")
                variants[f"-exit-{code}"] = done.replace(
                    "name: pod-complete\n", f"name: pod-complete-exit-{code}\n"
                )
        for suffix, content in variants.items():
            stage = work / f"stage-{path.stem}{suffix}.yaml"
            stage.write_text(content)
            stages.append(stage)
    return stages


def install_common(cluster: LocalCluster, cache: Path) -> None:
    """What both systems see: Kueue's CRDs (no controller), the PyTorchJob and JobSet CRDs,
    the namespaces."""
    peers.install_kueue(cluster, peers.kueue(cache, build=False))
    for module, path in CRD_MODULES.items():
        found = subprocess.run(
            ["go", "mod", "download", "-json", module],
            check=True,
            capture_output=True,
            text=True,
            cwd=tempfile.gettempdir(),
        )
        crd = Path(json.loads(found.stdout)["Dir"]) / path
        cluster.kubectl("apply", "--server-side", "-f", str(crd), timeout=120)
    for namespace in (NAMESPACE, SYSTEM_NAMESPACE):
        cluster.kubectl("create", "namespace", namespace, check=False)


# -- running ---------------------------------------------------------------------------------


def run_one(binary: Path, source: Path, home: Path, name: str, cap: float, log: Path) -> Outcome:
    return conformance.run_one(
        binary,
        source,
        home,
        name,
        cap,
        log,
        focus=focus(name),
        extra=[f"-ginkgo.label-filter={LABEL_FILTER}"],
    )


_LEFT_BEHIND = (
    "appwrappers",
    "deployments",
    "statefulsets",
    "jobs",
    "services",
    "pytorchjobs",
    "jobsets",
    "rayjobs",
    "rayclusters",
    "pods",
)


def clean(cluster: LocalCluster) -> None:
    """Between tests: nothing of the last one left in the suite's namespace (it cleans up
    after itself, but not after a test stopped at the cap)."""
    for kind in _LEFT_BEHIND:
        cluster.kubectl(
            "delete",
            kind,
            "--all",
            "-n",
            NAMESPACE,
            "--grace-period=0",
            "--timeout=90s",
            check=False,
            timeout=120,
        )


def table(system: str, outcomes: Sequence[Outcome]) -> str:
    return conformance.table(system, outcomes, suite=f"AppWrapper {VERSION}")


def comparison(runs: Sequence[tuple[str, Sequence[Outcome]]], causes: Mapping[str, str]) -> str:
    """Runs side by side (the first is the reference), in the reference's order, with the
    cause of each difference from it ('-': not in that run)."""
    results = [{o.test: o.result for o in outcomes} for _, outcomes in runs]
    names = [o.test for o in runs[0][1]] if runs else []
    for _, outcomes in runs[1:]:
        names += [o.test for o in outcomes if o.test not in names]
    lines = [
        "| Test | " + " | ".join(title for title, _ in runs) + " | Cause of the difference |",
        "|---|" + "---|" * len(runs) + "---|",
    ]
    for name in names:
        cells = [result.get(name, "-") for result in results]
        cause = causes.get(name, "") if len(set(cells)) > 1 else ""
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {cell(cause)} |")
    return "\n".join(lines) + "\n"


def compare_main(argv: Sequence[str]) -> int:
    """`compare CAUSES.json RUN...`: the comparison table of saved runs (results names such as
    appwrapper, ours, ours-our-queues; the first is the reference), for the docs."""
    causes = json.loads(Path(argv[0]).read_text())
    runs = []
    for run in argv[1:]:
        saved = json.loads((RESULTS / f"conformance-appwrapper-{run}.json").read_text())
        runs.append((run, [Outcome(**row) for row in saved["tests"]]))
    print(comparison(runs, causes), end="")
    return 0


def _start(
    system: str, cluster: LocalCluster, cache: Path, work: Path, kueue_quotas: str | None
) -> tuple[subprocess.Popen[bytes], int]:
    """The system, and the port its admission webhook listens on."""
    if system == "appwrapper":
        return start_reference(cluster, cache, work), WEBHOOK_PORT
    return start_ours(cluster, work, kueue_quotas)


def wait_listening(process: subprocess.Popen[bytes], port: int, timeout: float = 120) -> None:
    """Until the webhook answers (the suite's first create needs it), or the system exits."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the system exited ({process.returncode}): see its log")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {port} after {timeout:.0f} s: see the log")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=["ours", "appwrapper"], default="ours")
    parser.add_argument("--only", default="", help="run only tests whose name matches this")
    parser.add_argument("--cap", type=float, default=None, help="seconds per test, for every test")
    parser.add_argument(
        "--kueue-quotas",
        default=None,
        help="ours: the dispatcher's Kueue quota setting (beside|instead); unset: not passed",
    )
    parser.add_argument(
        "--our-queues",
        action="store_true",
        help="ours: the suite's Kueue objects also written as this dispatcher's quota kinds "
        "(results as SYSTEM-our-queues)",
    )
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    if args.our_queues and args.system != "ours":
        parser.error("--our-queues is for --system ours")
    run = f"{args.system}-our-queues" if args.our_queues else args.system
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    source, binary = build(args.cache)
    with tempfile.TemporaryDirectory(prefix="aw-conformance-") as tmp:
        work = Path(tmp)
        specs = [s for s in list_specs(binary, source, work) if re.search(args.only, s.name)]
        cluster = LocalCluster.start(
            "conformance-aw", work, kwok_stages=kwok_stages(work), kuberay=True
        )
        system = None
        outcomes = []
        logs = args.cache / "appwrapper" / "logs" / run
        logs.mkdir(parents=True, exist_ok=True)
        try:
            for node, size in NODES.items():
                cluster.add_node(node, **size)
            cluster.wait_nodes_ready(list(NODES))
            install_common(cluster, args.cache)
            home = work / "home"
            (home / ".kube").mkdir(parents=True)
            shutil.copy(cluster.kubeconfig, home / ".kube" / "config")
            if args.our_queues:
                install_our_queues(cluster)
            system, port = _start(args.system, cluster, args.cache, work, args.kueue_quotas)
            wait_listening(system, port)
            cluster.kubectl("wait", "--for=condition=Established", peers.APPWRAPPER_CRD)
            for number, spec in enumerate(specs):
                cap = args.cap or CAPS.get(spec.name, DEFAULT_CAP)
                outcome = run_one(binary, source, home, spec.name, cap, logs / f"{number:02d}.log")
                print(f"{outcome.result:8} {outcome.seconds:7.1f}s  {spec.name}", flush=True)
                outcomes.append(outcome)
                clean(cluster)
        finally:
            if system is not None:
                system.terminate()
                system.wait(30)
            for name in ("ours.log", "kueue.log", "appwrapper.log"):
                if (work / name).exists():
                    shutil.copy(work / name, logs / name)
            cluster.stop()
    write_results(run, args.only, args.cap, outcomes)
    return 0


def write_results(system: str, only: str, cap: float | None, outcomes: list[Outcome]) -> None:
    out = RESULTS / f"conformance-appwrapper-{system}.json"
    if only and out.exists():
        # A re-run of some tests replaces their rows in the last full table, in suite order.
        again = {o.test: o for o in outcomes}
        earlier = [Outcome(**row) for row in json.loads(out.read_text())["tests"]]
        outcomes = [again.pop(o.test, o) for o in earlier] + list(again.values())
    result = {
        "suite": SUITE,
        "label_filter": LABEL_FILTER,
        "system": system,
        "nodes": NODES,
        "cap_seconds": cap or {"default": DEFAULT_CAP, **CAPS},
        "passed": sum(o.result == "pass" for o in outcomes),
        "tests": [asdict(o) for o in outcomes],
    }
    report.save(result, out)
    (RESULTS / f"conformance-appwrapper-{system}.md").write_text(table(system, outcomes))
    print(table(system, outcomes))


if __name__ == "__main__":
    if sys.argv[1:2] == ["compare"]:
        sys.exit(compare_main(sys.argv[2:]))
    sys.exit(main())
