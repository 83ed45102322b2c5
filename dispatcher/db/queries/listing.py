"""What mkctl and the HTTP API list: Clusters, refused senders, placements, one Workload's history, counts per state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import cluster_refusals, events, placements, workloads
from dispatcher.db.queries.clusters import cluster_summaries, load_clusters


async def list_refusals(session: AsyncSession) -> list[Any]:
    """Senders refused for not being registered clusters, newest first."""
    return list((await session.execute(sa.select(cluster_refusals).order_by(cluster_refusals.c.last_at.desc()))).all())


@dataclass(frozen=True)
class WorkloadHistory:
    workload: sa.Row[Any]
    placements: list[sa.Row[Any]]
    events: list[sa.Row[Any]]


async def list_clusters(session: AsyncSession) -> list[Any]:
    """Every Cluster ever heard of, by name: labels, capacity, online, last heartbeat, agent version."""
    return await load_clusters(session)


async def list_cluster_summaries(session: AsyncSession) -> list[dict[str, Any]]:
    """Every Cluster ever heard of, by name, as :func:`list_clusters` but with only the cluster's totals in
    ``capacity`` (``allocatable`` and ``free``, no node list)."""
    out = []
    for r in await cluster_summaries(session):
        row = dict(r._mapping)
        row["capacity"] = {"allocatable": row.pop("allocatable") or {}, "free": row.pop("free") or {}}
        out.append(row)
    return out


async def list_placements(session: AsyncSession, *, cluster: str | None = None, state: str | None = None,
                          namespace: str | None = None, limit: int = 500) -> list[Any]:
    """Newest placements first, joined with their Workload's namespace, name and kind."""
    stmt = (sa.select(placements, workloads.c.namespace, workloads.c.name, workloads.c.kind,
                      workloads.c.state.label("workload_state"))
            .join(workloads, workloads.c.uid == placements.c.workload_uid)
            .order_by(placements.c.created_at.desc(), placements.c.id.desc()).limit(limit))
    if cluster:
        stmt = stmt.where(placements.c.cluster == cluster)
    if state:
        stmt = stmt.where(placements.c.state == state)
    if namespace:
        stmt = stmt.where(workloads.c.namespace == namespace)
    return list((await session.execute(stmt)).all())


async def show_workload(session: AsyncSession, ref: str) -> WorkloadHistory | None:
    """A Workload by uid or ``namespace/name`` (the newest of that name), with its placements and events."""
    stmt = sa.select(workloads)
    if "/" in ref:
        namespace, name = ref.split("/", 1)
        stmt = stmt.where(workloads.c.namespace == namespace, workloads.c.name == name)
    else:
        stmt = stmt.where(workloads.c.uid == ref)
    row = (await session.execute(stmt.order_by(workloads.c.created_at.desc()).limit(1))).first()
    if row is None:
        return None
    ps = await session.execute(sa.select(placements).where(placements.c.workload_uid == row.uid)
                               .order_by(placements.c.attempt))
    es = await session.execute(sa.select(events).where(events.c.workload_uid == row.uid).order_by(events.c.id))
    return WorkloadHistory(row, list(ps.all()), list(es.all()))


async def workload_counts(session: AsyncSession) -> dict[str, int]:
    """How many Workloads are in each state."""
    result = await session.execute(sa.select(workloads.c.state, sa.func.count()).group_by(workloads.c.state))
    return {r[0]: int(r[1]) for r in result}
