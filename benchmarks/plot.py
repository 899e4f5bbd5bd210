"""Plots of the benchmark results: `python -m benchmarks.plot benchmarks/results`.

Reads e2e.json (and core.json when present) and writes benchmarks/results/e2e.png:
create->Dispatched latency (CDF), throughput (raw creates versus dispatches) and, when the
churn phase ran, its drain curve with the dispatcher's memory.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use(): the backend is chosen first


def main(folder: Path) -> None:
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


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"))
