"""Plot ``bench/fleet_bench.py``'s figures against N (one JSON line per run in bench/fleet_results.jsonl).

    .venv/bin/python bench/fleet_plot.py bench/fleet_results.jsonl docs/fleet-scaling.png

Four panels over the number of clusters: idle dispatcher CPU (% of one core), dispatcher RSS (MB),
PostgreSQL rows written per second when idle, and Mosquitto connections; a dotted line (RSS excepted) through the
origin and the smallest N's figure shows what linear growth from there would be.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line.strip()]
    latest: dict[int, dict[str, float]] = {}
    for r in runs:  # the last run of each N (and kind) counts
        latest[int(r["n"])] = {**latest.get(int(r["n"]), {}), **{k: v for k, v in r.items() if v == v}}
    ns = sorted(latest)
    panels = [("idle_cpu_pct", "idle dispatcher CPU, % of one core", 10.0),
              ("idle_rss_mb", "dispatcher RSS when idle, MB", 500.0),
              ("idle_pg_rows_s", "PostgreSQL rows written/s, idle", None),
              ("connections", "Mosquitto TCP connections", None)]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title, goal) in zip(axes.flat, panels, strict=True):
        xs = [n for n in ns if key in latest[n]]
        ys = [latest[n][key] for n in xs]
        ax.plot(xs, ys, "o-", label="measured")
        if xs and key != "idle_rss_mb":  # RSS starts from the interpreter's own, not from 0
            ax.plot([0, xs[-1]], [0, ys[0] / xs[0] * xs[-1]], ":", label=f"linear from N={xs[0]}")
        if goal is not None:
            ax.axhline(goal, color="red", lw=0.8, label="goal at N=1,000")
        ax.set_title(title)
        ax.set_xlabel("worker clusters (N)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=90)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
