"""Read-only query functions for the admin views: ``mkctl`` (reading the database) and the HTTP API.

Both ask the same questions, so both call these: Workloads with their current placement (filtered by
namespace, kind, queue, cluster, state and Job labels, in creation order, paged), the history rows
across every Workload (``mkctl events``), placements holding each Cluster. Each function takes a
session and never commits. The filters are checked here too (:func:`parse_state`, :func:`parse_kind`,
:func:`parse_labels`), so a bad ``--state`` is refused the same way on the command line and in the API,
naming the field and the values it takes, instead of quietly matching nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import WORKLOAD_STATES, clusters, events, placements, workloads
from federation.errors import Invalid

HOLDING = ("accepted", "running")
"""Placement states whose Job holds its Cluster's capacity now."""


def workload_states() -> tuple[str, ...]:
    """The one vocabulary of Workload states (``dispatcher.states.WorkloadState``): the database's,
    mkctl's ``--state``, the API's ``state``."""
    return tuple(WORKLOAD_STATES)


def parse_state(value: str | None, *, field_name: str = "--state") -> str | None:
    """A state as users type it (``Pending``, ``pending``) to the database's word; refuses unknown ones."""
    if value is None or value == "":
        return None
    from dispatcher.states import WorkloadState, parse

    try:
        return parse(WorkloadState, value).value
    except ValueError:
        raise Invalid(field_name, f"{value!r} is not a Workload state",
                      fix=f"use one of: {', '.join(workload_states())}") from None


def parse_kind(value: str | None, *, field_name: str = "--kind") -> str | None:
    """A JobKind name in any case (``pytorchjob``) to the registry's spelling; refuses unknown kinds."""
    if value is None or value == "":
        return None
    from federation.kinds import registry

    names = {k.name.lower(): k.name for k in registry.kinds()}
    found = names.get(value.strip().lower())
    if found is None:
        raise Invalid(field_name, f"{value!r} is not a job kind mkd manages",
                      fix=f"use one of: {', '.join(sorted(names.values()))} (or a kind the dispatcher's kinds_file "
                          "declares: MKD_DISPATCHER_KINDS_FILE names it for mkctl)")
    return found


def parse_labels(value: str | None, *, field_name: str = "--label") -> dict[str, str]:
    """``key=value[,key2=value2]`` (equality selectors, all must match) to a dict."""
    out: dict[str, str] = {}
    if not value:
        return out
    for part in value.split(","):
        key, sep, val = part.strip().partition("=")
        if sep and val.startswith("="):  # k==v, as kubectl allows
            val = val[1:]
        if not sep or not key.strip() or key.endswith("!"):
            raise Invalid(field_name, f"{part.strip()!r} is not a key=value selector",
                          fix="write key=value, several separated by commas (all must match)")
        out[key.strip()] = val.strip()
    return out


@dataclass(frozen=True)
class WorkloadFilter:
    """What a Workload list asks for; empty fields match everything. ``labels`` must all match."""

    namespace: str | None = None
    kind: str | None = None
    queue: str | None = None
    cluster: str | None = None
    state: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None


_CURRENT = sa.and_(placements.c.workload_uid == workloads.c.uid, placements.c.attempt == workloads.c.attempt)
_CLUSTER = sa.func.coalesce(placements.c.cluster, workloads.c.cluster)


def _where(stmt: Any, f: WorkloadFilter) -> Any:
    if f.namespace:
        stmt = stmt.where(workloads.c.namespace == f.namespace)
    if f.name:
        stmt = stmt.where(workloads.c.name == f.name)
    if f.kind:
        stmt = stmt.where(workloads.c.kind == f.kind)
    if f.queue:
        stmt = stmt.where(workloads.c.queue == f.queue)
    if f.state:
        stmt = stmt.where(workloads.c.state == f.state)
    if f.cluster:
        # every Workload whose current placement (or, without one, whose row) names the cluster has a
        # placement there: that narrows 1,000,000 rows to a cluster's through the placements' index
        on = placements.alias("on_cluster")
        stmt = stmt.where(_CLUSTER == f.cluster,
                          workloads.c.uid.in_(sa.select(on.c.workload_uid).where(on.c.cluster == f.cluster)))
    for key, value in f.labels.items():
        stmt = stmt.where(workloads.c.labels[key].as_string() == value)
    return stmt


async def list_workloads(session: AsyncSession, f: WorkloadFilter = WorkloadFilter(), *, limit: int = 5000,
                         offset: int = 0) -> list[Any]:
    """Workloads (pending ones too) with their current placement, in creation order.

    Oldest first, as ``kubectl get --sort-by=.metadata.creationTimestamp`` lists; Workloads claimed in
    the same batch share a creation time and follow by namespace and name (never by uid, which reads
    as random). Never commits.
    """
    stmt = (sa.select(workloads.c.uid, workloads.c.namespace, workloads.c.name, workloads.c.kind,
                      workloads.c.queue, workloads.c.priority, workloads.c.state, workloads.c.attempt,
                      _CLUSTER.label("cluster"),
                      sa.case((workloads.c.reason != "", workloads.c.reason), else_=placements.c.reason
                              ).label("reason"),
                      placements.c.state.label("placement_state"), placements.c.epoch,
                      workloads.c.suspended, workloads.c.labels, workloads.c.pinned, workloads.c.requests,
                      workloads.c.created_at, workloads.c.updated_at, placements.c.accepted_at,
                      placements.c.finished_at)
            .select_from(workloads.outerjoin(placements, _CURRENT))
            .order_by(workloads.c.created_at, workloads.c.namespace, workloads.c.name, workloads.c.uid)
            .limit(limit).offset(offset))
    return list(await session.execute(_where(stmt, f)))


async def count_workloads(session: AsyncSession, f: WorkloadFilter = WorkloadFilter()) -> int:
    # the placement joined only when it filters (by cluster): a count of 1,000,000 rows joined costs seconds
    source = workloads.outerjoin(placements, _CURRENT) if f.cluster else workloads
    stmt = sa.select(sa.func.count()).select_from(source)
    return int((await session.execute(_where(stmt, f))).scalar_one())


async def estimated_workloads(session: AsyncSession) -> int | None:
    """PostgreSQL's estimate of the Workload rows (``pg_class.reltuples``, which autovacuum and ANALYZE keep);
    None on SQLite or before the table was first analyzed."""
    from dispatcher.db.queries.sql import is_pg

    if not is_pg(session):
        return None
    found = (await session.execute(sa.text(
        "SELECT reltuples FROM pg_class WHERE oid = CAST('workloads' AS regclass)"))).scalar()
    return None if found is None or found < 0 else int(found)


async def list_events(session: AsyncSession, *, workload_uid: str | None = None, cluster: str | None = None,
                      type_: str | None = None, after_id: int = 0, limit: int = 500) -> list[Any]:
    """History rows across every Workload (and Cluster events), oldest first, with the Job's name."""
    stmt = (sa.select(events.c.id, events.c.at, events.c.type, events.c.cluster, events.c.reason,
                      events.c.message, events.c.workload_uid, workloads.c.namespace, workloads.c.name,
                      workloads.c.kind)
            .select_from(events.outerjoin(workloads, workloads.c.uid == events.c.workload_uid))
            .where(events.c.id > after_id))
    if workload_uid:
        stmt = stmt.where(events.c.workload_uid == workload_uid)
    if cluster:
        stmt = stmt.where(events.c.cluster == cluster)
    if type_:
        stmt = stmt.where(events.c.type == type_)
    if after_id:  # following: the next rows after the last one seen
        stmt = stmt.order_by(events.c.id).limit(limit)
        return list(await session.execute(stmt))
    newest = (await session.execute(stmt.order_by(events.c.id.desc()).limit(limit))).all()
    return list(reversed(newest))


async def holding_per_cluster(session: AsyncSession) -> dict[str, int]:
    """Placements holding a Cluster now (accepted or running), per Cluster. Never commits."""
    result = await session.execute(
        sa.select(placements.c.cluster, sa.func.count()).where(placements.c.state.in_(HOLDING))
        .group_by(placements.c.cluster))
    return {str(r[0]): int(r[1]) for r in result}


async def find_workload_uid(session: AsyncSession, ref: str) -> str | None:
    """A Workload's uid from ``namespace/name`` (newest of that name), ``name`` (namespace default) or uid."""
    wheres: list[sa.ColumnElement[bool]]
    if "/" in ref:
        namespace, name = ref.split("/", 1)
        wheres = [(workloads.c.namespace == namespace) & (workloads.c.name == name)]
    else:
        wheres = [workloads.c.uid == ref, (workloads.c.namespace == "default") & (workloads.c.name == ref)]
    for where in wheres:
        row = (await session.execute(sa.select(workloads.c.uid).where(where)
                                     .order_by(workloads.c.created_at.desc()).limit(1))).first()
        if row is not None:
            return str(row.uid)
    return None


async def cluster_names(session: AsyncSession) -> list[str]:
    return [str(r[0]) for r in await session.execute(sa.select(clusters.c.name).order_by(clusters.c.name))]


__all__: Sequence[str] = (
    "HOLDING", "WorkloadFilter", "cluster_names", "count_workloads", "estimated_workloads", "find_workload_uid", "holding_per_cluster",
    "list_events", "list_workloads", "parse_kind", "parse_labels", "parse_state", "workload_states",
)
