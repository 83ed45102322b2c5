"""What-if inputs from the live system: a trace from the dispatcher's database, the configuration in use.

:func:`trace_from_history` reads the Workloads claimed since a time (arrival: queue time; PodSets; the
WorkloadPriorityClass label; an admin's pin) and their run time from the placements (from the admission to
the end of the last attempt that finished, the time it held its quota and room; a Job still running counts what it ran so far, one never started the median
of the others, both marked ``runEstimated``). :func:`live_clusters` reads the clusters the agents reported
(labels, nodes with their allocatable, cordoned); :func:`live_queue_objects` lists the Kueue objects,
PriorityClasses and Namespaces from the manager cluster. Query functions take a session and never commit.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db import models as m
from dispatcher.placement import _parse
from dispatcher.queueing import api
from dispatcher.whatif.config import Cluster, NodeGroup, Settings
from dispatcher.whatif.trace import TraceJob
from dispatcher.workload import need_of

ENDED = ("finished", "failed")
DEFAULT_RUN_SECONDS = 60.0
"""Run time of a Job never started when no Job of the history has a known run time either."""


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


async def trace_from_history(s: AsyncSession, since: datetime | None = None, *,
                             now: datetime | None = None) -> list[TraceJob]:
    """The Workloads claimed since ``since`` (all when None), in the order the dispatcher queued them."""
    w, p = m.workloads, m.placements
    now = now or datetime.now(UTC)
    query = sa.select(w.c.uid, w.c.namespace, w.c.name, w.c.kind, w.c.queue, w.c.podsets, w.c.labels, w.c.pinned,
                      w.c.queued_at, w.c.created_at, w.c.queue_seq, w.c.state)
    if since is not None:
        query = query.where(sa.func.coalesce(w.c.queued_at, w.c.created_at) >= since)
    rows = (await s.execute(query.order_by(sa.func.coalesce(w.c.queued_at, w.c.created_at), w.c.queue_seq))).all()
    uids = [r.uid for r in rows]
    runs: dict[str, tuple[float, bool]] = {}   # uid -> (seconds, estimated)
    for chunk in range(0, len(uids), 500):
        part = uids[chunk:chunk + 500]
        placed = await s.execute(sa.select(p.c.workload_uid, p.c.state, p.c.created_at, p.c.accepted_at,
                                           p.c.finished_at, p.c.attempt)
                                 .where(p.c.workload_uid.in_(part)).order_by(p.c.workload_uid, p.c.attempt))
        for pr in placed:
            began = _utc(pr.created_at)   # admitted: from then on it held its quota and its room
            ended = _utc(pr.finished_at)
            if began is None:
                continue
            if pr.state in ENDED and ended is not None:
                runs[pr.workload_uid] = ((ended - began).total_seconds(), False)
            elif ended is None and pr.state in ("sent", "accepted", "running", "suspended"):
                runs[pr.workload_uid] = ((now - began).total_seconds(), True)
    known = [v for v, est in runs.values() if not est]
    fallback = statistics.median(known) if known else DEFAULT_RUN_SECONDS
    out = []
    for r in rows:
        if not r.podsets:
            continue   # refused at claim (no PodSets to run): nothing the scheduler would see
        seconds, estimated = runs.get(r.uid, (fallback, True))
        labels: Mapping[str, Any] = r.labels or {}
        arrival = _utc(r.queued_at) or _utc(r.created_at)
        assert arrival is not None
        out.append(TraceJob(name=r.name, namespace=r.namespace, kind=r.kind, queue=r.queue,
                            arrival=arrival.timestamp(), run_seconds=max(seconds, 0.0), podsets=list(r.podsets),
                            need=need_of(r.kind, list(r.podsets)),
                            priority_class=str(labels.get(api.PRIORITY_CLASS_LABEL) or ""),
                            cluster=r.pinned or None, run_estimated=estimated))
    return out


def cluster_from_row(row: Mapping[str, Any]) -> Cluster:
    """A cluster as its agent last reported it: its nodes by allocatable (one node of the cluster's totals when
    the agent sent no per-node figures)."""
    cap = row.get("capacity") or {}
    groups = []
    for n in cap.get("nodes") or []:
        alloc = _parse(n.get("allocatable") or n.get("free") or {}, "nodes.allocatable")
        taints = tuple((str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or "NoSchedule"))
                       for t in n.get("taints") or [])
        groups.append(NodeGroup(str(n.get("name") or ""), 1, alloc, dict(n.get("labels") or {}), taints))
    if not groups:
        total = _parse(cap.get("allocatable") or {}, "allocatable")
        groups.append(NodeGroup(f"{row['name']}-all", 1, total))
    kinds = row.get("kinds")
    kind_set: frozenset[str] | None = None
    if isinstance(kinds, list) and kinds:
        kind_set = frozenset(str(k) for k in kinds)
    elif isinstance(kinds, Mapping):
        kind_set = frozenset(kinds.get("reconciled") or []) | frozenset((kinds.get("delegated") or {}).keys()) or None
    return Cluster(str(row["name"]), groups, dict(row.get("labels") or {}), kind_set, bool(row.get("cordoned")))


async def live_clusters(s: AsyncSession) -> dict[str, Cluster]:
    c = m.clusters
    rows = (await s.execute(sa.select(c.c.name, c.c.labels, c.c.capacity, c.c.kinds, c.c.cordoned)
                            .order_by(c.c.name))).all()
    return {r.name: cluster_from_row(dict(r._mapping)) for r in rows if (r.capacity or {}).get("allocatable")}


async def live_queue_objects(kube: Any) -> list[dict[str, Any]]:
    """The queue objects the dispatcher's watcher reads, listed once from the manager (the first served version)."""
    from dispatcher.queueing.watcher import KUEUE_KINDS, PRIORITY_CLASSES, kueue_resource
    from federation.kube import NAMESPACES

    out: list[dict[str, Any]] = []
    candidates = [(kind, [kueue_resource(plural, kind, ns, v) for v in api.VERSIONS])
                  for plural, kind, ns in KUEUE_KINDS]
    candidates += [("PriorityClass", [PRIORITY_CLASSES]), ("Namespace", [NAMESPACES])]
    for kind, resources in candidates:
        for res in resources:
            if await kube.served(res):
                for obj in (await kube.list(res)).items:
                    out.append({**obj, "kind": kind})
                break
    return out


def live_settings() -> Settings:
    """The decision settings of a dispatcher started here (environment variables and defaults)."""
    from dispatcher.settings import DispatcherSettings

    d = DispatcherSettings()
    return Settings(fair_sharing=d.fair_sharing.enable, preemption_strategies=tuple(d.fair_sharing.preemption_strategies),
                    starvation_seconds=d.starvation_seconds, starvation_hold_seconds=d.starvation_hold_seconds,
                    max_admissions_per_pass=d.max_admissions_per_pass,
                    prioritize_preemptors=d.preemption.prioritize_preemptors,
                    retry_seconds=d.placement_retry_seconds)

