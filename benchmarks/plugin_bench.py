"""The `kubectl aw` plugin's commands beside `kubectl get`, on the local control plane.

    python -m benchmarks.plugin_bench [--pending 100] [--repeat 15] [--out FILE.json]

One KWOK node of 1 CPU runs one AppWrapper of 1 CPU (priority 100, so nothing preempts it);
`--pending` AppWrappers of 1 CPU each wait behind it. The dispatcher runs as its own process
serving the visibility API, registered with the API server as the e2e tests register it
(`testenv.manifests.visibility_registration`). Once the pending list shows them
all, each command below runs `--repeat` times as its own process, all of them in every
round, the order rotated each round so that the machine's load falls on all alike (one
warm-up round first, not counted; it also fills kubectl's discovery cache):

- `python -c pass` with the plugin's interpreter and `kubectl version --client`: the fixed
  start-up costs;
- `kubectl get appwrappers -n NS`;
- `kubectl-aw list -n NS` run directly, and `kubectl aw list -n NS` found by kubectl's
  plugin lookup on PATH;
- `kubectl-aw queues` and `kubectl-aw why NAME`.

Per command: the median and p90 of wall time, and the median CPU the process used (its
user + system time, from the children's rusage): on a loaded machine, wall above CPU is time
other processes took. Then where `kubectl-aw list`'s own time goes: its imports, reading the
kubeconfig, each request (timed with perf_counter in a child that runs the plugin's `main`),
and `python -X importtime`'s largest imports. Side effects: a control plane and a dispatcher
in a temporary directory; prints a table; writes the JSON file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import report
from benchmarks.e2e_bench import percentile, start_dispatcher, wait_ready
from benchmarks.report import save
from dispatcher.controller.visibility.api import BASE
from testenv.converter import install_appwrapper_crd
from testenv.localcluster import REPO_ROOT, LocalCluster, ensure_binaries, free_port
from testenv.manifests import appwrapper, pod_template, visibility_registration
from testenv.waits import wait_until

NAMESPACE = "plugin-bench"
BIN = Path(sys.executable).parent  # the virtualenv's bin, where kubectl-aw is installed

# Run in a child: the plugin's `list` with each phase timed (printed as JSON on stderr).
PHASES = """
import io, json, sys, time
started = time.perf_counter()
from dispatcher.plugin import kubeconfig, main
imported = time.perf_counter()
phases = {"imports_ms": (imported - started) * 1000, "requests": []}
plain_connect, plain_request = main.connect, kubeconfig.Connection.request
def connect(**kwargs):
    begun = time.perf_counter()
    try:
        return plain_connect(**kwargs)
    finally:
        phases["kubeconfig_ms"] = (time.perf_counter() - begun) * 1000
def request(self, method, path, **kwargs):
    begun = time.perf_counter()
    try:
        return plain_request(self, method, path, **kwargs)
    finally:
        phases["requests"].append([path, (time.perf_counter() - begun) * 1000])
main.connect, kubeconfig.Connection.request = connect, request
sys.stdout = io.StringIO()
code = main.main(sys.argv[1:])
phases["main_ms"] = (time.perf_counter() - imported) * 1000
phases["total_ms"] = (time.perf_counter() - started) * 1000
print(json.dumps(phases), file=sys.stderr)
sys.exit(code)
"""


def pod(name: str, cpu: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        **pod_template({"cpu": cpu}),
    }


def commands(cluster: LocalCluster, why: str) -> dict[str, list[str]]:
    kubectl, plugin = str(cluster.kubectl_path), str(BIN / "kubectl-aw")
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "kubectl version --client": [kubectl, "version", "--client"],
        "kubectl get appwrappers": [kubectl, "get", "appwrappers", "-n", NAMESPACE],
        "kubectl-aw list": [plugin, "list", "-n", NAMESPACE],
        "kubectl aw list": [kubectl, "aw", "list", "-n", NAMESPACE],
        "kubectl-aw queues": [plugin, "queues"],
        "kubectl-aw why": [plugin, "why", why, "-n", NAMESPACE],
    }


def environment(cluster: LocalCluster, workdir: Path) -> dict[str, str]:
    kubectl_dir = str(Path(cluster.kubectl_path).parent)
    return {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PATH": os.pathsep.join([str(BIN), kubectl_dir, os.environ.get("PATH", "")]),
        "KUBECACHEDIR": str(workdir / "kube-cache"),  # kubectl's discovery cache, not ~/.kube
    }


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run; a failure or anything on stderr stops the benchmark
    (a plugin that warns has not done the work being timed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode or done.stderr:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.decode()}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu


def time_side_by_side(
    argvs: dict[str, list[str]], env: dict[str, str], repeat: int
) -> dict[str, dict[str, float]]:
    names = list(argvs)
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for name in names:  # warm-up: kubectl's discovery cache, the page cache
        run_once(argvs[name], env)
    for round_ in range(repeat):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = run_once(argvs[name], env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    return {
        name: {
            "median_ms": round(statistics.median(walls[name]) * 1000, 1),
            "p90_ms": round(percentile(walls[name], 0.9) * 1000, 1),
            "cpu_median_ms": round(statistics.median(cpus[name]) * 1000, 1),
            "runs": len(walls[name]),
        }
        for name in names
    }


def phases(env: dict[str, str], repeat: int) -> dict[str, Any]:
    """Medians of `kubectl-aw list`'s phases over `repeat` runs."""
    runs = []
    for _ in range(repeat):
        done = subprocess.run(
            [sys.executable, "-c", PHASES, "list", "-n", NAMESPACE],
            env=env,
            capture_output=True,
            timeout=120,
            check=True,
        )
        runs.append(json.loads(done.stderr.decode().strip().splitlines()[-1]))
    paths = [path for path, _ in runs[0]["requests"]]
    keys = ("imports_ms", "kubeconfig_ms", "main_ms", "total_ms")
    median = {k: round(statistics.median(r[k] for r in runs), 1) for k in keys}
    median["requests_ms"] = {
        path: round(statistics.median(r["requests"][i][1] for r in runs), 1)
        for i, path in enumerate(paths)
    }
    return median


def largest_imports(env: dict[str, str], count: int = 8) -> list[list[Any]]:
    """`python -X importtime`: the plugin's direct and second-level imports with the largest
    cumulative time (microseconds), one run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import dispatcher.plugin.main"],
        env=env,
        capture_output=True,
        timeout=60,
        check=True,
    )
    rows: list[tuple[str, int, int]] = []
    for line in done.stderr.decode().splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|")
        if cumulative.strip().isdigit():
            depth = (len(name) - len(name.lstrip())) // 2
            rows.append((name.strip(), int(cumulative), depth))
    return [[n, us] for n, us, depth in sorted(rows, key=lambda r: -r[1]) if depth <= 2][:count]


def set_up(cluster: LocalCluster, workdir: Path, pending: int) -> Any:
    cluster.add_node("pb-node", cpu="1", memory="64Gi", pods=110)
    cluster.wait_nodes_ready(["pb-node"], timeout=120)
    install_appwrapper_crd(cluster)  # v1beta2 is served by conversion, as e2e_bench does
    cluster.kubectl("apply", "-f", str(REPO_ROOT / "crds" / "queues.yaml"))
    cluster.kubectl("create", "namespace", NAMESPACE)
    port = free_port()
    for manifest in visibility_registration(port, namespace=NAMESPACE):
        cluster.apply(manifest)
    health = free_port()
    visibility = {"enabled": True, "host": "127.0.0.1", "port": port, "extra_names": ["127.0.0.1"]}
    process = start_dispatcher(cluster, workdir, {}, health, settings={"visibility": visibility})
    wait_ready(health, timeout=120)
    running = appwrapper("running", pod("running", "1"), priority=100)
    running["metadata"]["namespace"] = NAMESPACE
    cluster.apply(running)
    dispatched = '{.status.conditions[?(@.type=="Dispatched")].status}'

    def is_dispatched() -> bool:
        got = cluster.kubectl(
            "get", "appwrapper", "running", "-n", NAMESPACE, "-o", f"jsonpath={dispatched}"
        )
        return got.stdout == "True"

    wait_until(is_dispatched, timeout=120, what="the running AppWrapper dispatched")
    items = []
    for index in range(pending):
        name = f"wait-{index:04d}"
        item = appwrapper(name, pod(name, "1"), priority=10)
        item["metadata"]["namespace"] = NAMESPACE
        items.append(item)
    cluster.apply({"apiVersion": "v1", "kind": "List", "items": items})

    def all_listed() -> bool:
        path = f"{BASE}/namespaces/{NAMESPACE}/pendingappwrappers"
        got = cluster.kubectl("get", "--raw", path, check=False)
        return got.returncode == 0 and len(json.loads(got.stdout)["items"]) == pending

    wait_until(all_listed, timeout=300, interval=1.0, what=f"{pending} pending listed")
    return process


def measure(args: Any, workdir: Path) -> dict[str, Any]:
    cluster = LocalCluster.start("pluginbench", workdir, binaries=ensure_binaries())
    try:
        process = set_up(cluster, workdir, args.pending)
        try:
            env = environment(cluster, workdir)
            load_before = os.getloadavg()
            timings = time_side_by_side(commands(cluster, "wait-0000"), env, args.repeat)
            list_phases = phases(env, args.repeat)
            imports = largest_imports(env)
            load_after = os.getloadavg()
        finally:
            process.terminate()
            process.wait(60)
    finally:
        cluster.stop()
    return {
        "pending": args.pending,
        "repeat": args.repeat,
        "load_average_1m": {"before": load_before[0], "after": load_after[0]},
        "commands": timings,
        "kubectl_aw_list_phases": list_phases,
        "largest_imports_us": imports,
    }


def table(result: dict[str, Any]) -> str:
    rows = [["command", "median ms", "p90 ms", "CPU ms"]]
    for name, figures in result["commands"].items():
        rows.append(
            [name, *(f"{figures[k]:.1f}" for k in ("median_ms", "p90_ms", "cpu_median_ms"))]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    load = result["load_average_1m"]
    lines.append(f"load average (1 min): {load['before']:.2f} before, {load['after']:.2f} after")
    lines.append(
        f"kubectl-aw list, phases (median ms): {json.dumps(result['kubectl_aw_list_phases'])}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pending", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/plugin.json"))
    parser.add_argument("--workdir", type=Path, help="keep the cluster's and dispatcher's logs")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        workdir = report.workdir(stack, args.workdir, "aw-plugin-")
        result = measure(args, workdir)
    save(result, args.out)
    print(table(result))


if __name__ == "__main__":
    main()
