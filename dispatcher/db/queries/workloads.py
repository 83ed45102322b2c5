"""The ``workloads`` table: claims, the rows a batch loads and writes back, the compare-and-set that places.

``claim`` is an ``INSERT ... ON CONFLICT (uid) DO NOTHING RETURNING`` keyed by the Job's uid and ``mark_placed`` an
``UPDATE ... WHERE state = 'pending' RETURNING``: of two dispatchers racing, the loser sees no row and does
nothing. ``settled`` and ``refusals`` are what a restarted dispatcher checks its manager Jobs' conditions against.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import states
from dispatcher.db import json_dumps
from dispatcher.db.models import events, placements, workloads
from dispatcher.db.queries.placements import P_LABELLED, P_NAMES
from dispatcher.db.queries.sql import (
    NO_SYNC,
    built,
    chunks,
    in_param,
    in_values,
    insert_for,
    is_pg,
    json_insert_pg,
    json_update_pg,
    rows_json,
)

LIVE_WORKLOAD = tuple(s.value for s in states.WORKLOAD_LIVE)


_CLAIM_COLUMNS: tuple[tuple[str, str], ...] = (
    ("uid", "VARCHAR"), ("namespace", "VARCHAR"), ("name", "VARCHAR"), ("kind", "VARCHAR"),
    ("api_version", "VARCHAR"), ("queue", "VARCHAR"), ("priority", "INTEGER"), ("state", "VARCHAR"),
    ("reason", "TEXT"), ("spec_version", "INTEGER"), ("generation", "BIGINT"), ("suspended", "BOOLEAN"),
    ("requests", "JSON"), ("podsets", "JSON"), ("attempt", "INTEGER"), ("cluster", "VARCHAR"),
    ("excluded", "JSON"), ("created_at", "TIMESTAMPTZ"), ("updated_at", "TIMESTAMPTZ"), ("labels", "JSON"),
    ("queued_at", "TIMESTAMPTZ"), ("queue_seq", "BIGINT"), ("priority_source", "VARCHAR"),
)


_CLAIM_PG = sa.text(
    "INSERT INTO workloads (" + ", ".join(c for c, _ in _CLAIM_COLUMNS) + ") SELECT "
    + ", ".join(f"{c}::json" if t == "JSON" else c for c, t in _CLAIM_COLUMNS)
    + " FROM unnest(" + ", ".join(f"CAST(:{c} AS {'TEXT' if t == 'JSON' else t}[])" for c, t in _CLAIM_COLUMNS)
    + ") AS t(" + ", ".join(c for c, _ in _CLAIM_COLUMNS) + ") ON CONFLICT (uid) DO NOTHING RETURNING uid"
).bindparams(*[sa.bindparam(c, type_=postgresql.ARRAY(sa.DateTime(timezone=True)))
               for c, t in _CLAIM_COLUMNS if t == "TIMESTAMPTZ"])


async def claim(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> set[str]:
    """Insert Workload rows; return the uids this call inserted (others were claimed before)."""
    if not rows:
        return set()
    if is_pg(session):  # one statement, one round trip, same text every time: INSERT ... SELECT FROM the rows' JSON
        names = tuple(c for c, _ in _CLAIM_COLUMNS)
        text = rows_json([{c: r[c] for c in names} for r in rows])
        if text is not None:
            stmt = built(session, ("json_claim",), lambda pg: sa.text(
                str(json_insert_pg(workloads, names)) + " ON CONFLICT (uid) DO NOTHING RETURNING uid"))
            result = await session.execute(stmt, {"rows": text})
            return {r[0] for r in result.all()}
        params = {c: [json_dumps(r[c]) if t == "JSON" else r[c] for r in rows] for c, t in _CLAIM_COLUMNS}
        result = await session.execute(_CLAIM_PG, params)
        return {r[0] for r in result.all()}
    stmt = built(session, ("claim",), lambda pg: insert_for(session, workloads).on_conflict_do_nothing(
        index_elements=["uid"]).returning(workloads.c.uid))
    result = await session.execute(stmt, list(rows))
    return {r[0] for r in result.all()}


async def load_workloads(session: AsyncSession, uids: Iterable[str]) -> dict[str, sa.Row[Any]]:
    keys = list(set(uids))
    out: dict[str, sa.Row[Any]] = {}
    for chunk in chunks(session, keys):
        result = await session.execute(sa.select(workloads).where(in_values(session, workloads.c.uid, chunk)))
        out.update({r.uid: r for r in result})
    return out


_LIGHT = [c for c in workloads.c if c.name not in ("requests", "podsets")]
"""Workload columns without the PodSet JSON: what decisions on Reports and Job changes read."""


LIGHT_NAMES = tuple(c.name for c in _LIGHT)
"""The names of ``_LIGHT``: the first columns of each row ``load_current`` returns, in this order."""


async def load_current(session: AsyncSession, uids: Iterable[str]
                       ) -> tuple[dict[str, sa.Row[Any]], dict[tuple[str, int], dict[str, Any]]]:
    """Workloads by uid (without ``requests`` / ``podsets``) and their current placement (if any) by
    (uid, attempt), in one round trip."""
    keys = list(set(uids))
    rows: dict[str, sa.Row[Any]] = {}
    current: dict[tuple[str, int], dict[str, Any]] = {}
    stmt = built(session, ("load_current",), lambda pg: sa.select(*_LIGHT, *P_LABELLED)
                  .outerjoin(placements, sa.and_(placements.c.workload_uid == workloads.c.uid,
                                                 placements.c.attempt == workloads.c.attempt))
                  .where(in_param(pg, workloads.c.uid, "uids")))
    width = len(_LIGHT)
    for chunk in chunks(session, keys):
        for r in await session.execute(stmt, {"uids": list(chunk)}):
            rows[r.uid] = r
            if r[width] is not None:  # p__id: the current placement exists
                current[(r.uid, r.attempt)] = dict(zip(P_NAMES, r[width:], strict=True))
    return rows, current


async def load_podsets(session: AsyncSession, uids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """uid -> ``podsets`` of these Workloads (the column ``load_current`` leaves out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    stmt = built(session, ("load_podsets",), lambda pg: sa.select(workloads.c.uid, workloads.c.podsets)
                  .where(in_param(pg, workloads.c.uid, "uids")))
    for chunk in chunks(session, list(set(uids))):
        out.update({r.uid: r.podsets for r in await session.execute(stmt, {"uids": list(chunk)})})
    return out


async def known_workloads(session: AsyncSession) -> list[tuple[str, str, str]]:
    """(uid, kind, namespace) of every Workload whose Job may still exist on the manager: one read of
    what a starting dispatcher must know (hundreds of thousands of rows when finished Jobs are kept)."""
    result = await session.execute(
        sa.select(workloads.c.uid, workloads.c.kind, workloads.c.namespace)
        .where(workloads.c.state.in_(LIVE_WORKLOAD)))
    return [(r.uid, r.kind, r.namespace) for r in result]


async def live_of_kind(session: AsyncSession, kind: str) -> list[Any]:
    result = await session.execute(
        sa.select(workloads.c.uid, workloads.c.namespace, workloads.c.name)
        .where(workloads.c.kind == kind, workloads.c.state.in_(LIVE_WORKLOAD)))
    return list(result.all())


async def update_workload(session: AsyncSession, uid: str, **values: Any) -> None:
    await session.execute(sa.update(workloads).where(workloads.c.uid == uid).values(**values))


async def update_workloads(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Bulk update by primary key: each row holds ``b_uid`` plus the columns to set (same keys in all)."""
    if not rows:
        return
    cols = tuple(k for k in rows[0] if k != "b_uid")
    text = rows_json(rows) if is_pg(session) else None
    if text is not None:  # one UPDATE over a JSON text (see json_insert_pg)
        stmt = built(session, ("json_update", "workloads", *cols),
                      lambda pg: json_update_pg(workloads, ("b_uid",), cols))
        await session.execute(stmt, {"rows": text, "keys": [r["b_uid"] for r in rows]})
        return
    stmt = built(session, ("update_workloads", *cols), lambda pg: sa.update(workloads).where(
        workloads.c.uid == sa.bindparam("b_uid")).values({c: sa.bindparam(c) for c in cols}))
    await session.execute(stmt, list(rows), execution_options=NO_SYNC)


async def pending_workloads(session: AsyncSession, limit: int) -> list[Any]:
    """Pending, not suspended Workloads in placement order: priority first, then age."""
    result = await session.execute(
        sa.select(workloads).where(workloads.c.state == states.W.PENDING, workloads.c.suspended.is_(False))
        .order_by(workloads.c.priority.desc(), workloads.c.queued_at, workloads.c.queue_seq).limit(limit))
    return list(result.all())


_MARK_PLACED_PG = sa.text(
    "UPDATE workloads SET state = 'placed', attempt = workloads.attempt + 1, cluster = v.cluster, "
    "reason = '', updated_at = :now, cluster_queue = v.cluster_queue, flavors = CAST(v.flavors AS json), "
    "usage = CAST(v.usage AS json), reserved_at = :now FROM unnest(CAST(:uids AS VARCHAR[]), "
    "CAST(:clusters AS VARCHAR[]), CAST(:cluster_queues AS VARCHAR[]), CAST(:flavors AS TEXT[]), "
    "CAST(:usages AS TEXT[])) AS v(uid, cluster, cluster_queue, flavors, usage) "
    "WHERE workloads.uid = v.uid AND workloads.state = 'pending' "
    "RETURNING workloads.uid, workloads.attempt"
).bindparams(sa.bindparam("now", type_=sa.DateTime(timezone=True)))


HELD_COLUMNS = ("cluster_queue", "flavors", "usage")
"""What a placed Workload holds, written by ``mark_placed`` with the placement (with ``reserved_at``)."""


async def mark_placed(session: AsyncSession, by_cluster: Mapping[str, Sequence[str]], now: datetime,
                      held: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Compare-and-set pending → placed on the given cluster with the next attempt number, and what each
    Workload holds: ``held[uid]`` gives its ``HELD_COLUMNS`` (``reserved_at`` is ``now``).

    Returns uid → attempt for the Workloads this call won (a row another dispatcher placed first,
    or that changed state meanwhile, is not returned).
    """
    won: dict[str, int] = {}
    if is_pg(session):  # one statement for every cluster: UPDATE ... FROM unnest(uids, clusters, ...)
        uids = [u for c in by_cluster for u in by_cluster[c]]
        names = [c for c in by_cluster for _ in by_cluster[c]]
        if uids:
            result = await session.execute(_MARK_PLACED_PG, {
                "uids": uids, "clusters": names, "now": now,
                "cluster_queues": [held[u]["cluster_queue"] for u in uids],
                "flavors": [json_dumps(held[u]["flavors"]) for u in uids],  # None as the JSON type stores it: null
                "usages": [json_dumps(held[u]["usage"]) for u in uids]})
            won.update({r.uid: r.attempt for r in result})
        return won
    stmt = built(session, ("mark_placed",), lambda pg: sa.update(workloads)
                  .where(in_param(pg, workloads.c.uid, "uids"), workloads.c.state == states.W.PENDING)
                  .values(state=states.W.PLACED, attempt=workloads.c.attempt + 1, cluster=sa.bindparam("cluster"),
                          reason="", updated_at=sa.bindparam("now", type_=workloads.c.updated_at.type))
                  .returning(workloads.c.uid, workloads.c.attempt))
    for cluster, members in by_cluster.items():
        for chunk in chunks(session, members):
            result = await session.execute(stmt, {"uids": list(chunk), "cluster": cluster, "now": now})
            won.update({r.uid: r.attempt for r in result})
    if won:
        await update_workloads(session, [{"b_uid": u, **{c: held[u][c] for c in HELD_COLUMNS}, "reserved_at": now}
                                         for u in won])
    return won


async def settled(session: AsyncSession) -> list[Any]:
    """Workloads placed, running or ended by their worker Job, with their current placement: what a
    restarted dispatcher checks its manager Jobs' conditions against (dispatcher/engine/heal.py)."""
    result = await session.execute(
        sa.select(workloads.c.uid, workloads.c.kind, workloads.c.namespace, workloads.c.name, workloads.c.state,
                  workloads.c.cluster_queue, workloads.c.flavors,
                  placements.c.attempt, placements.c.cluster, placements.c.state.label("p_state"),
                  placements.c.created_at, placements.c.accepted_at, placements.c.finished_at)
        .join(placements, sa.and_(placements.c.workload_uid == workloads.c.uid,
                                  placements.c.attempt == workloads.c.attempt))
        .where(workloads.c.state.in_((states.W.PLACED, states.W.RUNNING, states.W.FINISHED, states.W.FAILED))))
    return list(result.all())


async def refusals(session: AsyncSession, reasons: Mapping[str, tuple[str, Sequence[str]]]) -> list[Any]:
    """Workloads mkd refused with the events recording the refusal, oldest first: ``reasons`` maps a final
    Workload state (rejected, failed) to how its ``reason`` column begins when mkd put it there and the
    event reasons of that refusal; what a restarted dispatcher checks its manager Jobs'
    MultiClusterRejected against (dispatcher/engine/heal.py). (A Workload failed by its worker Job is not read.)"""
    result = await session.execute(
        sa.select(workloads.c.uid, workloads.c.kind, workloads.c.namespace, workloads.c.name, workloads.c.state,
                  events.c.reason, events.c.message, events.c.at)
        .join(events, events.c.workload_uid == workloads.c.uid)
        .where(sa.or_(*(sa.and_(workloads.c.state == state, workloads.c.reason.startswith(begins, autoescape=True),
                                events.c.reason.in_(why))
                        for state, (begins, why) in reasons.items())))
        .order_by(events.c.id))
    return list(result.all())
