"""Plot ``bench/fleet_bench.py``'s figures against N (one JSON line per run in bench/fleet_results.jsonl).

    .venv/bin/python bench/fleet_plot.py bench/fleet_results.jsonl docs/fleet-scaling.png

Four panels over the number of clusters: idle dispatcher CPU (% of one core), dispatcher RSS (MB),
PostgreSQL rows written per second when idle, and Mosquitto connections; a dotted line (RSS excepted) through the
origin and the smallest N's figure shows what linear growth from there would be. Runs that name the
``revision`` they measured are drawn apart from the unnamed ones before them, each N's figure the median
of its runs (the machine's load moves a single run).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [json.loads(line) for line in Path(argv[0]).read_text().splitlines() if line.strip()]
    named = [r["revision"] for r in runs if r.get("revision")]
    series: dict[str, dict[int, list[dict[str, float]]]] = {}
    for r in runs:  # the first named revision labels the series of every named run
        label = f"from {named[0]} on" if r.get("revision") else ("before" if named else "measured")
        series.setdefault(label, {}).setdefault(int(r["n"]), []).append(r)
    panels = [("idle_cpu_pct", "idle dispatcher CPU, % of one core", 10.0),
              ("idle_rss_mb", "dispatcher RSS when idle, MB", 500.0),
              ("idle_pg_rows_s", "PostgreSQL rows written/s, idle", None),
              ("connections", "Mosquitto TCP connections", None)]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title, goal) in zip(axes.flat, panels, strict=True):
        for label, by_n in series.items():
            xs = [n for n in sorted(by_n) if any(key in r and r[key] == r[key] for r in by_n[n])]
            ys = [statistics.median(r[key] for r in by_n[n] if key in r and r[key] == r[key]) for n in xs]
            line = ax.plot(xs, ys, "o-", label=label)[0]
            if xs and key != "idle_rss_mb":  # RSS starts from the interpreter's own, not from 0
                ax.plot([0, xs[-1]], [0, ys[0] / xs[0] * xs[-1]], ":", color=line.get_color(),
                        label=f"linear from N={xs[0]} ({label})")
        if goal is not None:
            ax.axhline(goal, color="red", lw=0.8, label="goal at N=1,000")
        ax.set_title(title)
        ax.set_xlabel("worker clusters (N)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=90)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
