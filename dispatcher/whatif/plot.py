"""A what-if run drawn: queue depth per ClusterQueue and utilisation per cluster over time (matplotlib).

matplotlib is an optional dependency (the ``plot`` extra: ``pip install 'mkd[plot]'``); :func:`png` raises
:class:`PlotUnavailable` naming it when it is missing. With a second run (``--compare``) the figure has
two columns with the same scales, one per configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from dispatcher.whatif.sim import Run
from federation.errors import Permanent


class PlotUnavailable(Permanent):
    pass


def _resource(runs: Sequence[Run]) -> str | None:
    """The resource drawn: the one most used over the run, as a share of what the clusters have."""
    used: dict[str, Decimal] = {}
    have: dict[str, Decimal] = {}
    for run in runs:
        for name, alloc in run.allocatable.items():
            for r, v in alloc.items():
                if v > 0 and r != "pods":
                    have[r] = have.get(r, Decimal(0)) + v
                    used[r] = used.get(r, Decimal(0)) + run.busy.get(name, {}).get(r, Decimal(0))
    return max(sorted(have), key=lambda r: used.get(r, Decimal(0)) / have[r], default=None)


def _depth_by_cq(run: Run) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for lq, series in run.depth.items():
        cq = run.cq_of_lq.get(lq)
        acc = out.setdefault("(open mode)" if cq == "" else cq or "(no ClusterQueue)", [0] * len(series))
        for i, v in enumerate(series):
            acc[i] += v
    return out


def png(path: str, runs: Sequence[Run], titles: Sequence[str]) -> None:
    """Draw one column per run: pending Workloads per ClusterQueue, then utilisation per cluster."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'mkd[plot]' (or pip install matplotlib)") from None
    res = _resource(runs)
    peak = 1.0
    if res is not None:
        for run in runs:
            for name, used in run.used.items():
                alloc = run.allocatable[name].get(res, Decimal(0))
                if alloc > 0:
                    peak = max(peak, *(float(u.get(res, Decimal(0)) / alloc) * 100 for u in used), 0.0)
    fig, axes = plt.subplots(2, len(runs), figsize=(7 * len(runs), 7), squeeze=False, sharex=True, sharey="row")
    hours = max((run.end for run in runs), default=0.0) >= 3 * 3600
    scale, unit = (3600.0, "hours") if hours else (60.0, "minutes")
    for col, (run, title) in enumerate(zip(runs, titles, strict=True)):
        x = [t / scale for t in run.sample_times]
        top, bottom = axes[0][col], axes[1][col]
        for cq, depth in sorted(_depth_by_cq(run).items()):
            top.step(x, depth, where="post", label=cq)
        top.set_title(f"{title}: pending Workloads per ClusterQueue")
        top.set_ylabel("pending")
        top.legend(loc="upper right", fontsize="small")
        if res is not None:
            clusters = sorted(run.used)
            for name in clusters[:12]:
                alloc = run.allocatable[name].get(res, Decimal(0))
                if alloc <= 0:
                    continue
                bottom.step(x, [float(u.get(res, Decimal(0)) / alloc) * 100 for u in run.used[name]], where="post",
                            label=name)
            if len(clusters) > 12:
                total = [sum(float(run.used[n][i].get(res, Decimal(0))) for n in clusters) for i in range(len(x))]
                cap = float(sum((run.allocatable[n].get(res, Decimal(0)) for n in clusters), Decimal(0))) or 1.0
                bottom.step(x, [v / cap * 100 for v in total], where="post", label="all clusters", color="black")
            bottom.set_title(f"{title}: {res} in use per cluster")
            bottom.set_ylabel("% of allocatable")
            bottom.set_ylim(0, min(peak * 1.15, 105))
            bottom.legend(loc="upper right", fontsize="small")
        bottom.set_xlabel(f"{unit} from the first arrival")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
