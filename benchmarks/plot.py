"""Plots of the benchmark results: `python -m benchmarks.plot benchmarks/results`.

Reads e2e.json (and core.json when present) and writes benchmarks/results/e2e.png:
create->Dispatched latency (CDF), throughput (raw creates versus dispatches) and, when the
churn phase ran, its drain curve with the dispatcher's memory. For each peers*.json there
(benchmarks.peer_bench), also writes the .png of the same name: per scenario, each system's
headline figure (median over the pairs, the bar; min to max, the whisker) and its progress in
the first pair.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use(): the backend is chosen first


def main(folder: Path) -> None:
    if (folder / "e2e.json").exists():
        e2e_figure(folder)
    for results in sorted(folder.glob("peers*.json")):
        peers_figure(results)


def e2e_figure(folder: Path) -> None:
    e2e = json.loads((folder / "e2e.json").read_text())
    latencies = e2e["dispatcher"]["latencies"]
    churn = e2e.get("churn") or {}
    progress = churn.get("progress") or []
    panels = 3 if progress else 2
    figure, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    left, right = axes[0], axes[1]
    fractions = [(i + 1) / len(latencies) for i in range(len(latencies))]
    left.plot(latencies, fractions)
    left.set_xlabel("create -> Dispatched (s)")
    left.set_ylabel("fraction of AppWrappers")
    left.set_title(f"Latency, burst of {e2e['count']} AppWrappers")
    for q in ("p50", "p95", "p99"):
        value = e2e["dispatcher"]["latency_seconds"][q]
        left.axvline(value, linestyle=":", color="grey")
        left.annotate(q, (value, 0.05), rotation=90)
    labels = ["raw creates\n(Deployment+Service pairs/s)", "dispatcher\n(AppWrappers/s)"]
    values = [e2e["raw"]["pairs_per_second"], e2e["dispatcher"]["dispatches_per_second"]]
    right.bar(labels, values, color=["#999999", "#3b75af"])
    right.set_title(f"Throughput (ratio {e2e['ratio_dispatch_to_raw']:.2f})")
    for index, value in enumerate(values):
        right.annotate(f"{value:.1f}", (index, value), ha="center", va="bottom")
    if progress:
        drain = axes[2]
        seconds = [p[0] for p in progress]
        drain.plot(seconds, [p[1] for p in progress], label="Dispatched")
        drain.plot(seconds, [p[2] for p in progress], label="Completed")
        drain.set_xlabel("seconds since the first create")
        drain.set_ylabel("AppWrappers")
        drain.set_title(f"Churn: {churn['count']} Job AppWrappers")
        memory = drain.twinx()
        memory.plot(seconds, [p[3] for p in progress], color="grey", linestyle=":")
        memory.set_ylabel("dispatcher RSS (MB, dotted)")
        drain.legend(loc="upper left")
    figure.tight_layout()
    out = folder / "e2e.png"
    figure.savefig(out, dpi=110)
    print(out)


PEER_COLOURS = {"ours": "#3b75af", "mcad": "#c44e52", "kueue": "#55a868", "appwrapper": "#8172b2"}


def headline(scenario: str, run: dict[str, Any]) -> float | None:
    """The figure a scenario's bar shows: seconds until the high-priority pods run, or the
    rate (finished per second when the scenario finishes work, else admitted per second)."""
    if "error" in run:
        return None
    if scenario == "priority":
        value = (run.get("high_priority") or {}).get("seconds_to_running")
    else:
        value = run.get("completed_per_second") or run.get("admitted_per_second")
    return float(value) if value is not None else None


def peers_figure(results: Path) -> None:
    peers = json.loads(results.read_text())
    scenarios = peers.get("scenarios") or {}
    if not scenarios:
        return
    figure, axes = plt.subplots(2, len(scenarios), figsize=(4.2 * len(scenarios), 7), squeeze=False)
    for column, (name, scenario) in enumerate(scenarios.items()):
        bars, curves = axes[0][column], axes[1][column]
        labels, middles, lows, highs, colours = [], [], [], [], []
        for system, runs in scenario["runs"].items():
            values = [v for v in (headline(name, r) for r in runs) if v is not None]
            labels.append(system)
            colours.append(PEER_COLOURS.get(system.split(":")[0], "#999999"))
            if not values:
                middles.append(0.0)
                lows.append(0.0)
                highs.append(0.0)
                continue
            middle = statistics.median(values)
            middles.append(middle)
            lows.append(middle - min(values))
            highs.append(max(values) - middle)
            capped = any(r.get("capped") for r in runs)
            bars.annotate(
                f"{middle:.2g}" + ("*" if capped else ""),
                (len(labels) - 1, middle),
                ha="center",
                va="bottom",
            )
        bars.bar(labels, middles, yerr=[lows, highs], color=colours, capsize=4)
        bars.set_yscale("log")
        bars.set_title(name)
        bars.set_ylabel(
            "high priority: s to Running (lower is better)"
            if name == "priority"
            else "per second (higher is better)"
        )
        if name == "priority":
            curves.axis("off")  # one workload: its bar says it all
            continue
        for system, runs in scenario["runs"].items():
            first = next((r for r in runs if r.get("progress")), None)
            if first is None:
                continue
            column_index = 2 if name == "contention" else 1
            points = first["progress"]
            curves.step(
                [p[0] for p in points],
                [p[column_index] for p in points],
                where="post",
                label=system,
                color=PEER_COLOURS.get(system.split(":")[0], "#999999"),
            )
        curves.set_xlabel("seconds into the measured window")
        curves.set_ylabel("finished" if name == "contention" else "admitted")
        curves.legend(loc="lower right")
    figure.suptitle(
        f"Peers, {peers.get('pairs')} pair(s); * = capped before it finished"
        f" (caps {peers.get('caps_seconds')})"
    )
    figure.tight_layout()
    out = results.with_suffix(".png")
    figure.savefig(out, dpi=100)
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"))
