"""Side by side: this dispatcher, MCAD, Kueue, and Kueue with the AppWrapper v1beta2 controller,
the same work on the same local control plane.

    python -m benchmarks.peer_bench [--systems ours,mcad,kueue,appwrapper] [--scenarios LIST]
        [--pairs 3] [--count 1000] [--contention 2000/100] [--hold 2] [--gangs 200/20]
        [--gang-hold 5] [--fill 20] [--cap 300] [--cap mcad=60]
        [--out benchmarks/results/peers.json] [--workdir DIR [--profile]]
    python -m benchmarks.peer_bench --report FILE

Needs the peers built (`make peers`). Scenarios (benchmarks.peer_scenarios): backlog, burst,
contention, gangs, priority. For each scenario, the systems run alternated A B C A B C ...
(`--pairs` rounds), each alone on a fresh local control plane with the same KWOK nodes, and each
with the work in its own terms (benchmarks.peer_systems):

- ours: AppWrappers wrapping the Job or RayCluster; admitted = Dispatched True;
- mcad (v1.40.0): the same AppWrappers under MCAD's own CRD, with MCAD's pod label in each
  pod template as its samples write it; admitted = the Dispatched condition MCAD adds once it
  has created the wrapped items;
- kueue (v0.15.0): the Jobs and RayClusters themselves, created suspended with the label
  `kueue.x-k8s.io/queue-name` (no webhook here), a ClusterQueue with quota for the whole
  cluster; admitted = `spec.suspend` false. `kueue:QPS` runs Kueue at that client QPS (burst
  twice that) instead of its default 50/100; ours runs at 200/400, MCAD at its fixed 100/200;
- appwrapper (v1.1.2, MCAD's successor, beside Kueue v0.15.0 and its AppWrapper integration):
  v1beta2 AppWrappers wrapping the Job or RayCluster, created suspended with the queue-name
  label (its webhooks are off); admitted = phase Running (Kueue admitted it and the controller
  created what it wraps). Its controller's client is fixed at 20/30; `appwrapper:QPS` sets
  Kueue's. CPU, memory and requests are those of both processes.

Every wait is capped (`--cap SECONDS` for all, `--cap SYSTEM=SECONDS` for one): past it, the run
records how far the system got. Per run: throughput, create->admitted percentiles, controller
and API-server CPU seconds per workload, the controller's API requests per workload by verb
(from the API server's audit log, for the ServiceAccount the controller runs as), its peak RSS,
overcommitted pods and partially placed gangs. Per scenario: each system's medians over the
pairs and the ratios ours/peer (above 1: ours ahead) with min/median/max.

Side effects: starts and stops local control planes and controllers; writes the JSON results
(after every run, so a stopped run keeps what was measured); Kueue's start may write its
metrics certificate under /etc/kueue (see benchmarks.peers).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import peers
from benchmarks.peer_measure import compare, medians, over_admitted
from benchmarks.peer_run import run_one
from benchmarks.peer_scenarios import Sizes, scenarios
from benchmarks.peer_systems import System, parse_systems
from benchmarks.report import save
from benchmarks.report import workdir as kept_or_temporary
from testenv.localcluster import DEFAULT_CACHE, REPO_ROOT, ensure_binaries

Obj = dict[str, Any]

SCENARIOS = ("backlog", "burst", "contention", "gangs", "priority")
RAW_BASELINE = REPO_ROOT / "benchmarks" / "results" / "e2e.json"


def parse_caps(values: Sequence[str]) -> dict[str, float]:
    """["300", "mcad=60"] -> {"*": 300, "mcad": 60}; the last of each wins; "*" is 600 unless
    given."""
    caps = {"*": 600.0}
    for value in values:
        name, _, seconds = value.rpartition("=")
        caps[name or "*"] = float(seconds)
    return caps


def cap_for(caps: Mapping[str, float], system: System) -> float:
    return caps.get(system.label, caps.get(system.kind, caps["*"]))


def parse_scenarios(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}: {', '.join(SCENARIOS)}")
    return names


def parse_share(text: str) -> tuple[int, int]:
    """ "2000/100" -> (2000, 100): how many, and how many fit at once."""
    count, _, slots = text.partition("/")
    return int(count), int(slots)


def raw_baseline(path: Path = RAW_BASELINE) -> Obj | None:
    """The raw-client figures of benchmarks.e2e_bench, when it has run (same machine)."""
    if not path.exists():
        return None
    e2e = json.loads(path.read_text())
    raw = e2e.get("raw") or {}
    return {
        "source": str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path),
        "count": e2e.get("count"),
        "objects_per_second": raw.get("objects_per_second"),
        "deployment_service_pairs_per_second": raw.get("pairs_per_second"),
        "seconds_to_all_running": raw.get("seconds_to_all_running"),
    }


def summarize(runs: Mapping[str, Sequence[Obj]]) -> Obj:
    """One scenario's medians per system and ratios against each peer."""
    ok = {system: [r for r in rs if "error" not in r] for system, rs in runs.items()}
    return {
        "medians": {system: medians(rs) for system, rs in ok.items()},
        "ratios": compare(runs),
    }


def brief(run: Obj) -> Obj:
    """A run's figures without the long ones (progress, requests by resource)."""
    long = ("progress", "requests_per_workload_by_resource", "control_plane_cpu_seconds")
    return {k: v for k, v in run.items() if k not in long}


def verbs(run: Obj) -> str:
    by_verb = run.get("requests_per_workload_by_verb") or {}
    return " ".join(f"{v}={n:g}" for v, n in sorted(by_verb.items(), key=lambda kv: -kv[1]))


def table(results: Obj) -> str:
    """A Markdown table: one row per scenario and system, medians over its pairs."""
    header = (
        "| Scenario | System | Done | Per s | create->adm p50 / p99 (s) | To done (s) "
        "| Ctl CPU ms/wl | API CPU ms/wl | Requests/wl (by verb) | Ctl peak RSS (MB) "
        "| Overcommits | Partial gangs |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for name, scenario in results.get("scenarios", {}).items():
        for system, runs in scenario["runs"].items():
            good = [r for r in runs if "error" not in r]
            if not good:
                error = runs[0].get("error", "no run") if runs else "no run"
                lines.append(f"| {name} | {system} | error: {error[:80]} |" + " |" * 9)
                continue
            lines.append(row(name, system, good))
    return "\n".join(lines) + "\n"


def row(name: str, system: str, runs: Sequence[Obj]) -> str:
    """One table row: the run with the median rate stands for the system (its figures are
    shown together); counts of overcommits and partial gangs are the worst over the pairs."""

    def rate(r: Obj) -> float:
        return float(r.get("completed_per_second") or r.get("admitted_per_second") or 0)

    ordered = sorted(runs, key=rate)
    mid = ordered[len(ordered) // 2]
    latency = mid.get("create_to_admitted_seconds") or {}
    high = mid.get("high_priority") or {}
    if name == "priority":
        shown = high.get("seconds_to_running")
        done = "yes" if shown is not None else "no"
        latency_text = f"{high.get('seconds_to_admitted') or '-'} / -"
    else:
        shown = mid.get("seconds_to_done")
        finished = mid.get("finished", mid.get("gangs_fully_placed", mid.get("admitted")))
        done = f"{finished}/{mid.get('count')}"
        latency_text = f"{latency['p50']:.2f} / {latency['p99']:.2f}" if latency else "-"
    to_done = f"{shown:.1f}" if shown is not None else f"> {mid.get('cap_seconds', 0):g} (cap)"
    per_second = "-" if name == "priority" else f"{rate(mid):.2f}"
    return (
        f"| {name} | {system} | {done} | {per_second} | {latency_text} | {to_done} "
        f"| {1000 * (mid.get('controller_cpu_seconds_per_workload') or 0):.1f} "
        f"| {1000 * (mid.get('apiserver_cpu_seconds_per_workload') or 0):.1f} "
        f"| {mid.get('requests_per_workload', 0):g} ({verbs(mid)}) "
        f"| {mid.get('controller_peak_rss_mb', 0):.0f} "
        f"| {max(r.get('overcommitted_pods', 0) for r in runs)} "
        f"| {max(r.get('partial_gangs', 0) for r in runs)} |"
    )


def ratio_table(results: Obj) -> str:
    """Ratios ours/peer (above 1: ours ahead), median (min-max) over the pairs."""
    keys = (
        ("completed_per_second", "drain rate"),
        ("admitted_per_second", "admission rate"),
        ("create_to_admitted_p50", "p50 latency"),
        ("create_to_admitted_p99", "p99 latency"),
        ("high_priority_seconds_to_running", "high priority to Running"),
        ("controller_cpu_seconds_per_workload", "CPU per workload"),
    )
    lines = ["| Scenario | Peer | " + " | ".join(k[1] for k in keys) + " |"]
    lines.append("|" + "---|" * (len(keys) + 2))
    for name, scenario in results.get("scenarios", {}).items():
        for peer, figures in scenario.get("summary", {}).get("ratios", {}).items():
            cells = []
            for key, _ in keys:
                f = figures.get(key)
                cells.append(
                    f"{f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f})"
                    + ("*" if f["capped_pairs"] else "")
                    if f
                    else "-"
                )
            lines.append(f"| {name} | {peer} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--systems", default="ours,mcad,kueue,appwrapper", type=parse_systems)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), type=parse_scenarios)
    parser.add_argument("--pairs", type=int, default=3, help="rounds of A B C (default 3)")
    parser.add_argument("--count", type=int, default=1000, help="backlog and burst workloads")
    parser.add_argument("--contention", type=parse_share, default=(2000, 100), metavar="N/K")
    parser.add_argument("--hold", type=float, default=2.0, help="contention: seconds per pod")
    parser.add_argument("--gangs", type=parse_share, default=(200, 20), metavar="N/K")
    parser.add_argument("--gang-hold", type=float, default=5.0, help="gangs: seconds per gang")
    parser.add_argument("--fill", type=int, default=20, help="priority: low-priority Jobs")
    parser.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="[SYSTEM=]SECONDS",
        help="longest wait of a run (default 600), or of one system's runs",
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/peers.json")
    parser.add_argument("--workdir", type=Path, help="keep the clusters' and controllers' logs")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="run nothing: re-derive a results file's figures, write it back, print its tables",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample ours with py-spy: dispatcher.folded in each run's directory (with"
        " --workdir); benchmarks.profile_report sums it up",
    )
    args = parser.parse_args(argv)
    if args.report:
        return report(args.report)
    if args.profile and not args.workdir:
        parser.error("--profile keeps its stats in the runs' directories: give --workdir")
    caps = parse_caps(args.cap)
    sizes = Sizes(
        count=args.count,
        contention=args.contention[0],
        slots=args.contention[1],
        hold=args.hold,
        gangs=args.gangs[0],
        gang_slots=args.gangs[1],
        gang_hold=args.gang_hold,
        fill=args.fill,
    )
    # Stopped (timeout, kill): the clean-up of the run under way still runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    needed = {s.kind for s in args.systems} - {"ours"}
    if "appwrapper" in needed:
        needed.add("kueue")  # it runs beside Kueue
    for kind in sorted(needed):
        peer = peers.BUILDERS[kind](args.cache, build=False)
        if not peer.binary.exists():
            parser.error(f"{kind} is not built: run `make peers` first ({peer.binary})")
    binaries = ensure_binaries(args.cache)
    every = scenarios(sizes)
    result: Obj = {
        "pairs": args.pairs,
        "sizes": vars(sizes),
        "caps_seconds": caps,
        "versions": {
            "mcad": peers.MCAD_VERSION,
            "kueue": peers.KUEUE_VERSION,
            "appwrapper": peers.APPWRAPPER_VERSION,
        },
        "systems": {s.label: s.client_qps for s in args.systems},
        "raw_client_baseline": raw_baseline(),
        "scenarios": {},
    }
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = kept_or_temporary(stack, args.workdir, "aw-peers-")
        for name in args.scenarios:
            scenario = every[name]
            runs: dict[str, list[Obj]] = {s.label: [] for s in args.systems}
            entry: Obj = {"nodes": list(scenario.nodes.cpus), "runs": runs}
            result["scenarios"][name] = entry
            for pair in range(args.pairs):
                for system in args.systems:
                    label = system.label
                    print(f"[{time.monotonic() - started:.0f}s] {name} pair {pair + 1}: {label}")
                    home = workdir / f"{name}-{pair + 1}-{label.replace(':', '-')}"
                    try:
                        figures = run_one(
                            system,
                            scenario,
                            home=home,
                            binaries=binaries,
                            cache=args.cache,
                            cap=cap_for(caps, system),
                            profile=args.profile,
                        )
                    except Exception as exc:  # one failed run must not lose the others
                        figures = {"system": label, "error": f"{type(exc).__name__}: {exc}"[:500]}
                    figures["pair"] = pair + 1
                    runs[label].append(figures)
                    print(json.dumps(brief(figures)), flush=True)
                    entry["summary"] = summarize(runs)
                    result["seconds"] = round(time.monotonic() - started, 1)
                    save(result, args.out)
    print_tables(result)
    return 0


def print_tables(result: Obj) -> None:
    print(table(result))
    print(ratio_table(result))
    raw = result.get("raw_client_baseline")
    if raw and raw.get("deployment_service_pairs_per_second") is not None:
        print(
            f"raw client ({raw['source']}): {raw['deployment_service_pairs_per_second']:.1f} "
            "Deployment+Service pairs created per second"
        )


def report(path: Path) -> int:
    """A results file again: per-workload costs over the workloads admitted (files written
    before that was so are re-derived from their totals), summaries and ratios recomputed,
    written back, and its tables printed."""
    result = json.loads(path.read_text())
    for entry in result.get("scenarios", {}).values():
        runs = {label: [over_admitted(r) for r in rs] for label, rs in entry["runs"].items()}
        entry["runs"] = runs
        entry["summary"] = summarize(runs)
    path.write_text(json.dumps(result, indent=2))  # as measured: machine and date kept
    print_tables(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
