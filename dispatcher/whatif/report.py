"""A what-if run summed up: per queue waits and admissions, preemptions, borrowing, shares, utilisation.

:func:`summarize` turns a :class:`~dispatcher.whatif.sim.Run` into a plain dict (the ``-o json`` form and
the API's answer): per ClusterQueue and LocalQueue the wait from arrival to first start (p50, p95, max),
Jobs admitted and preempted; who preempted whom and why; per ClusterQueue the quota borrowed (peak and
time average per resource) and the fair-share value over time; per cluster the time-averaged utilisation
of each resource; the makespan; the Jobs that never ran with the reason the scheduler gave; and the series
behind the averages, sampled at about 400 instants (``overTime``).
:func:`text` prints it as tables, :func:`compare` sets two side by side and :func:`compare_text` marks
what changed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from dispatcher.whatif.sim import Run
from federation.podset import format_quantity

NEVER_LISTED = 50
"""Jobs that never ran listed by name in the text report (all are in the JSON form)."""


def _pct(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def _waits(values: list[float]) -> dict[str, Any]:
    return {"p50": _pct(values, 50), "p95": _pct(values, 95), "max": max(values) if values else None}


def _q(v: Decimal, res: str) -> str:
    """A quantity as Kubernetes writes it, an average rounded to what a reader compares (3 digits)."""
    if v != v.to_integral_value():
        v = v.quantize(Decimal(1)) if v >= 100 else v.quantize(Decimal("0.01")) if v >= 1 else v.quantize(
            Decimal("0.001"))
    return format_quantity(v, res)


def summarize(run: Run) -> dict[str, Any]:
    jobs = run.jobs.values()
    by_cq: dict[str, list[Any]] = {}
    by_lq: dict[str, list[Any]] = {}
    for j in jobs:
        by_cq.setdefault(j.cluster_queue or "(none)", []).append(j)
        by_lq.setdefault(f"{j.job.namespace}/{j.job.queue}", []).append(j)

    def group(items: list[Any]) -> dict[str, Any]:
        waits = [j.first_start - (j.job.arrival - run.start) for j in items if j.first_start is not None]
        return {"jobs": len(items), "admitted": sum(1 for j in items if j.first_start is not None),
                "neverRan": sum(1 for j in items if j.first_start is None),
                "preempted": sum(j.evictions for j in items), "waitSeconds": _waits(waits)}

    span = max(run.end, 1e-9)
    samples = run.sample_times
    weights = [(samples[i + 1] if i + 1 < len(samples) else run.end) - t for i, t in enumerate(samples)]
    total_w = sum(weights) or 1.0
    cluster_queues: dict[str, Any] = {}
    for name in sorted(set(by_cq) | set(run.borrowed)):
        entry = group(by_cq.get(name, []))
        series = run.borrowed.get(name)
        if series is not None:
            resources = sorted({r for point in series for r in point})
            entry["borrowed"] = {r: {"peak": _q(max((p.get(r, Decimal(0)) for p in series), default=Decimal(0)), r),
                                     "average": _q(sum((p.get(r, Decimal(0)) * Decimal(str(w))
                                                        for p, w in zip(series, weights, strict=True)), Decimal(0))
                                                   / Decimal(str(total_w)), r)} for r in resources}
            shares = run.shares.get(name, [])
            entry["fairShare"] = {"peak": max(shares, default=0.0),
                                  "average": sum(s * w for s, w in zip(shares, weights, strict=True)) / total_w}
        cluster_queues[name] = entry
    local_queues = {name: {**group(items), "clusterQueue": run.cq_of_lq.get(name)}
                    for name, items in sorted(by_lq.items())}
    clusters = {}
    for name, alloc in sorted(run.allocatable.items()):
        busy = run.busy.get(name, {})
        clusters[name] = {
            "admissions": sum(1 for _, _, c in run.admissions if c == name),
            "utilisation": {r: float(busy.get(r, Decimal(0)) / (a * Decimal(str(span)))) if a > 0 else 0.0
                            for r, a in sorted(alloc.items()) if r != "pods"}}
    pairs: Counter[tuple[str, str, str]] = Counter()
    for p in run.preemptions:
        pairs[(p.preemptor_cq or "(open)", p.victim_cq or "(open)", p.reason)] += 1
    never = sorted((j for j in jobs if j.first_start is None), key=lambda j: (j.job.arrival, j.job.key))
    ends = [j.end for j in jobs if j.end is not None]
    return {
        "jobs": len(run.jobs), "admitted": sum(1 for j in jobs if j.first_start is not None),
        "finished": len(ends), "passes": run.passes,
        "makespanSeconds": max(ends) if ends else None,
        "clusterQueues": cluster_queues, "localQueues": local_queues, "clusters": clusters,
        "preemptions": {"total": len(run.preemptions),
                        "byPair": [{"preemptorClusterQueue": a, "victimClusterQueue": b, "reason": r, "count": n}
                                   for (a, b, r), n in sorted(pairs.items())],
                        "list": [{"at": p.at, "preemptor": p.preemptor, "victim": p.victim, "reason": p.reason}
                                 for p in run.preemptions]},
        "neverRan": [{"job": j.job.key, "clusterQueue": j.cluster_queue, "step": j.step, "reason": j.reason}
                     for j in never],
        "admissionOrder": [{"at": t, "job": k, "cluster": c} for t, k, c in run.admissions],
        "overTime": {
            "seconds": samples,
            "pendingByLocalQueue": run.depth,
            "borrowedByClusterQueue": {cq: [{r: _q(v, r) for r, v in p.items()} for p in points]
                                       for cq, points in run.borrowed.items()},
            "fairShareByClusterQueue": run.shares,
            "inUseByCluster": {c: [{r: _q(v, r) for r, v in p.items() if r != "pods"} for p in points]
                               for c, points in run.used.items()}},
        "settings": run.settings,
    }


def _s(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 3600:
        return f"{v / 3600:.1f}h"
    if v >= 60:
        return f"{v / 60:.1f}m"
    return f"{v:.0f}s"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return out


def text(report: Mapping[str, Any]) -> str:
    lines = [f"{report['jobs']} Jobs, {report['admitted']} admitted, {report['finished']} finished, "
             f"makespan {_s(report['makespanSeconds'])}, {report['preemptions']['total']} preemptions", ""]
    rows = []
    for name, q in report["clusterQueues"].items():
        w = q["waitSeconds"]
        borrowed = ", ".join(f"{r} {b['peak']} (avg {b['average']})" for r, b in q.get("borrowed", {}).items()) or "-"
        share = q.get("fairShare")
        rows.append([name, str(q["jobs"]), str(q["admitted"]), _s(w["p50"]), _s(w["p95"]), _s(w["max"]),
                     str(q["preempted"]), borrowed, f"{share['peak']:.2f} / {share['average']:.2f}" if share else "-"])
    lines += [*_table(["CLUSTERQUEUE", "JOBS", "ADMITTED", "WAIT P50", "P95", "MAX", "PREEMPTED", "BORROWED PEAK (AVG)", "SHARE PEAK/AVG"], rows), ""]
    rows = [[name, q["clusterQueue"] or "-", str(q["jobs"]), str(q["admitted"]), _s(q["waitSeconds"]["p50"]),
             _s(q["waitSeconds"]["p95"]), _s(q["waitSeconds"]["max"])] for name, q in report["localQueues"].items()]
    lines += [*_table(["LOCALQUEUE", "CLUSTERQUEUE", "JOBS", "ADMITTED", "WAIT P50", "P95", "MAX"], rows), ""]
    rows = [[name, str(c["admissions"]), ", ".join(f"{r} {u:.0%}" for r, u in c["utilisation"].items())]
            for name, c in report["clusters"].items()]
    lines += [*_table(["CLUSTER", "ADMISSIONS", "UTILISATION"], rows), ""]
    if report["preemptions"]["byPair"]:
        rows = [[p["preemptorClusterQueue"], p["victimClusterQueue"], p["reason"], str(p["count"])]
                for p in report["preemptions"]["byPair"]]
        lines += [*_table(["PREEMPTOR CQ", "VICTIM CQ", "REASON", "COUNT"], rows), ""]
    never = report["neverRan"]
    if never:
        lines.append(f"{len(never)} Jobs never ran:")
        lines += [f"  {n['job']}: {n['reason']}" for n in never[:NEVER_LISTED]]
        if len(never) > NEVER_LISTED:
            lines.append(f"  ... and {len(never) - NEVER_LISTED} more (-o json lists them all)")
    return "\n".join(lines).rstrip() + "\n"


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two reports on the same trace: per queue the waits and counts of each and the change (b - a)."""
    def delta(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else y - x

    queues: dict[str, dict[str, Any]] = {}
    for kind in ("clusterQueues", "localQueues"):
        queues[kind] = {}
        for name in sorted(set(a[kind]) | set(b[kind])):
            qa, qb = a[kind].get(name), b[kind].get(name)
            row: dict[str, Any] = {"a": qa, "b": qb}
            if qa and qb:
                row["change"] = {"admitted": qb["admitted"] - qa["admitted"],
                                 "preempted": qb["preempted"] - qa["preempted"],
                                 **{f"wait{k.upper()}": delta(qa["waitSeconds"][k], qb["waitSeconds"][k])
                                    for k in ("p50", "p95", "max")}}
            queues[kind][name] = row
    first_a, first_b = _first_admissions(a), _first_admissions(b)
    rank_a = {job: i for i, job in enumerate(first_a)}
    moved = sum(1 for i, job in enumerate(first_b) if rank_a.get(job) != i)
    return {"a": {k: a[k] for k in ("jobs", "admitted", "finished", "makespanSeconds")} | {
                "preemptions": a["preemptions"]["total"], "neverRan": len(a["neverRan"])},
            "b": {k: b[k] for k in ("jobs", "admitted", "finished", "makespanSeconds")} | {
                "preemptions": b["preemptions"]["total"], "neverRan": len(b["neverRan"])},
            "makespanChange": delta(a["makespanSeconds"], b["makespanSeconds"]),
            "admissionsMoved": moved, **queues,
            "clusters": {name: {"a": a["clusters"].get(name), "b": b["clusters"].get(name)}
                         for name in sorted(set(a["clusters"]) | set(b["clusters"]))}}


def _first_admissions(rep: Mapping[str, Any]) -> list[str]:
    """Jobs in the order of their first admission (a preempted Job is admitted again later)."""
    seen: dict[str, None] = {}
    for x in rep["admissionOrder"]:
        seen.setdefault(x["job"], None)
    return list(seen)


def _mark(change: float | None, unit: str = "s") -> str:
    """A change, marked: ``+`` waits longer (worse), ``-`` waits less (better)."""
    if change is None or abs(change) < 0.5:
        return "="
    text = _s(abs(change)) if unit == "s" else f"{abs(change):.0f}"
    return f"▲ +{text}" if change > 0 else f"▼ -{text}"


def compare_text(c: Mapping[str, Any], names: tuple[str, str] = ("A", "B")) -> str:
    a, b = c["a"], c["b"]
    lines = [f"{names[0]}: {a['admitted']}/{a['jobs']} admitted, makespan {_s(a['makespanSeconds'])}, "
             f"{a['preemptions']} preemptions, {a['neverRan']} never ran",
             f"{names[1]}: {b['admitted']}/{b['jobs']} admitted, makespan {_s(b['makespanSeconds'])}, "
             f"{b['preemptions']} preemptions, {b['neverRan']} never ran",
             f"makespan {_mark(c['makespanChange'])}; {c['admissionsMoved']} Jobs first admitted at another place in "
             "the order", "", f"▲ waits longer in the second ({names[1]}), ▼ less; = no change", ""]
    for kind, title in (("clusterQueues", "CLUSTERQUEUE"), ("localQueues", "LOCALQUEUE")):
        rows = []
        for name, row in c[kind].items():
            qa, qb = row["a"], row["b"]
            if not qa or not qb:
                rows.append([name, "only in " + (names[0] if qa else names[1]), "", "", "", ""])
                continue
            ch = row["change"]
            rows.append([name, f"{_s(qa['waitSeconds']['p50'])} → {_s(qb['waitSeconds']['p50'])}", _mark(ch["waitP50"]),
                         f"{_s(qa['waitSeconds']['p95'])} → {_s(qb['waitSeconds']['p95'])}", _mark(ch["waitP95"]),
                         f"{qa['admitted']} → {qb['admitted']}, preempted {qa['preempted']} → {qb['preempted']}"])
        lines += [*_table([title, "WAIT P50", "", "WAIT P95", "", "ADMITTED, PREEMPTED"], rows), ""]
    rows = []
    for name, row in c["clusters"].items():
        ua = (row["a"] or {}).get("utilisation", {})
        ub = (row["b"] or {}).get("utilisation", {})
        rows.append([name, ", ".join(f"{r} {ua.get(r, 0):.0%} → {ub.get(r, 0):.0%}" for r in sorted({*ua, *ub}))])
    lines += _table(["CLUSTER", "UTILISATION"], rows)
    return "\n".join(lines).rstrip() + "\n"
