"""A what-if request as the API and the dashboard answer it: trace and configuration as text, the report back.

:func:`answer` takes the trace as JSON Lines text (or the history since a time), the configuration and the
comparison as YAML text (each part not given comes from the live system: the clusters from the database, the
queue objects from the manager cluster, the settings of this process's environment), replays them in a worker
thread (the event loop keeps serving) and returns the report of ``mkctl whatif -o json``, with the plot as a
base64 PNG when asked. Bad input raises :class:`~federation.errors.Invalid` naming the line or object and field.
"""

from __future__ import annotations

import asyncio
import base64
import re
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.whatif import config, history, report, sim, trace
from federation.errors import Invalid

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_JOBS = 200_000
"""The most Jobs one request replays (about two minutes of one core)."""


def parse_since(text: str | None, now: datetime | None = None, *, field: str = "--since") -> datetime | None:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` ago, or an RFC 3339 time; None for none or ``all``."""
    if not text or text.strip() == "all":
        return None
    m = _DURATION.match(text.strip())
    if m:
        return (now or datetime.now(UTC)) - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise Invalid(field, f"{text!r} is neither a duration nor a time",
                      fix="write 7d, 12h, 30m, 2026-01-01T00:00:00Z or all") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _documents(text: str, source: str) -> list[tuple[str, int, Any]]:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise Invalid(source, f"is not YAML: {str(exc).replace(chr(10), ' ')}") from None
    return [(source, i + 1 if len(docs) > 1 else 0, d) for i, d in enumerate(docs)]


async def _live(s: AsyncSession, kube: Any, *, need_queues: bool, need_clusters: bool) -> config.Config:
    out = config.Config(settings=history.live_settings(), sources=["the dispatcher's settings"])
    if need_clusters:
        out.clusters = await history.live_clusters(s)
        out.sources.append("the clusters in the database")
        if not out.clusters:
            raise Invalid("configuration", "no cluster is given and the database knows none",
                          fix="add WorkerCluster objects to the configuration")
    if need_queues:
        if kube is None:
            raise Invalid("configuration", "no ClusterQueue is given and the manager cluster is not readable here",
                          fix="add the Kueue objects to the configuration")
        out.objects = await history.live_queue_objects(kube)
        out.sources.append("the queue objects of the manager cluster")
    return out


async def answer(s: AsyncSession, kube: Any, *, trace_text: str | None = None, since: datetime | None = None,
                 configuration: str | None = None, compare: str | None = None, plot: bool = False) -> dict[str, Any]:
    if trace_text:
        jobs = trace.parse(trace_text.splitlines())
        where = "the trace given"
    else:
        jobs = await history.trace_from_history(s, since)
        where = "the dispatcher's history" + (f" since {since.isoformat()}" if since else "")
    if not jobs:
        raise Invalid("trace", f"{where} holds no Job: nothing to replay")
    if len(jobs) > MAX_JOBS:
        raise Invalid("trace", f"{len(jobs)} Jobs is more than {MAX_JOBS} for one request",
                      fix="use mkctl whatif for larger traces, or a shorter --since")
    given = config.load_documents(_documents(configuration, "configuration")) if configuration else config.Config()
    need_queues = not {o["kind"] for o in given.objects} & set(config.KUEUE_KINDS)
    base = await _live(s, kube, need_queues=need_queues, need_clusters=not given.clusters)
    cfg = config.load_documents(_documents(configuration, "configuration"), base) if configuration else base
    other = config.load_documents(_documents(compare, "compare"), cfg, overlay=True) if compare else None
    return await asyncio.to_thread(_replay, jobs, where, cfg, other, plot)


def _replay(jobs: list[trace.TraceJob], where: str, cfg: config.Config, other: config.Config | None,
            plot: bool) -> dict[str, Any]:
    runs = [sim.simulate(jobs, cfg)]
    reports = [report.summarize(runs[0])]
    reports[0]["sources"] = {"trace": where, "configuration": cfg.sources}
    if other is not None:
        runs.append(sim.simulate(jobs, other))
        reports.append(report.summarize(runs[1]))
        reports[1]["sources"] = {"trace": where, "configuration": other.sources}
    out: dict[str, Any] = (reports[0] if other is None else
                           {"a": reports[0], "b": reports[1], "comparison": report.compare(reports[0], reports[1]),
                            "text": report.compare_text(report.compare(reports[0], reports[1]),
                                                        ("as configured", "with the change"))})
    if plot:
        from dispatcher.whatif import plot as wplot

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "whatif.png"
            wplot.png(str(path), runs, ["as configured", "with the change"][:len(runs)])
            out["plot"] = base64.b64encode(path.read_bytes()).decode()
    return out
