"""The ``placements`` table (one row per attempt): inserts, updates, and the placements current on a Cluster.

``advance_status_seq`` is an ``UPDATE ... WHERE last_status_seq < :seq``, so a Status Report older than one already
applied changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import states
from dispatcher.db.models import placements, workloads
from dispatcher.db.queries.sql import (
    NO_SYNC,
    built,
    chunks,
    in_values,
    insert_rows,
    is_pg,
    json_update_pg,
    rows_json,
)

ACTIVE_PLACEMENT = tuple(s.value for s in states.PLACEMENT_ACTIVE)
"""A placement in one of these states is current and not ended: its worker copy exists (or is about to)."""


CAPACITY_PLACEMENT = tuple(s.value for s in states.PLACEMENT_HOLDS_CAPACITY)
"""A placement in one of these states holds (or is about to hold) room on its Cluster."""


KEPT_PLACEMENT = tuple(s.value for s in states.PLACEMENT_KEPT)
"""States whose worker copy still exists (finished copies stay until the manager Job is deleted)."""


P_NAMES = tuple(c.name for c in placements.c)


P_LABELLED = [c.label(f"p__{c.name}") for c in placements.c]
assert P_NAMES[0] == "id"


_INSERT_PLACEMENTS = sa.insert(placements)


async def add_placements(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    if rows:
        await insert_rows(session, placements, rows, _INSERT_PLACEMENTS)


async def load_placements(session: AsyncSession, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], sa.Row[Any]]:
    """Placements by (workload uid, attempt)."""
    wanted = set(keys)
    uids = list({uid for uid, _ in wanted})
    out: dict[tuple[str, int], sa.Row[Any]] = {}
    for chunk in chunks(session, uids):
        result = await session.execute(sa.select(placements).where(in_values(session, placements.c.workload_uid, chunk)))
        for r in result:
            if (r.workload_uid, r.attempt) in wanted:
                out[(r.workload_uid, r.attempt)] = r
    return out


async def update_placement(session: AsyncSession, uid: str, attempt: int, *, only_states: Sequence[str] = (),
                           **values: Any) -> bool:
    """Update one placement; with ``only_states`` only if it is in one of them. True if a row changed."""
    stmt = sa.update(placements).where(placements.c.workload_uid == uid, placements.c.attempt == attempt)
    if only_states:
        stmt = stmt.where(placements.c.state.in_(only_states))
    result = await session.execute(stmt.values(**values).returning(placements.c.id))
    return result.first() is not None


async def update_placements(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Bulk update by (``b_uid``, ``b_attempt``); every row sets the same columns."""
    if not rows:
        return
    cols = tuple(k for k in rows[0] if k not in ("b_uid", "b_attempt"))
    text = rows_json([{"b_workload_uid": r["b_uid"], **r} for r in rows]) if is_pg(session) else None
    if text is not None:  # one UPDATE over a JSON text (see json_insert_pg)
        stmt = built(session, ("json_update", "placements", *cols),
                      lambda pg: json_update_pg(placements, ("b_workload_uid", "b_attempt"), cols))
        await session.execute(stmt, {"rows": text, "keys": [r["b_uid"] for r in rows]})
        return
    stmt = built(session, ("update_placements", *cols), lambda pg: sa.update(placements)
                  .where(placements.c.workload_uid == sa.bindparam("b_uid"),
                         placements.c.attempt == sa.bindparam("b_attempt"))
                  .values({c: sa.bindparam(c) for c in cols}))
    await session.execute(stmt, list(rows), execution_options=NO_SYNC)


async def advance_status_seq(session: AsyncSession, uid: str, attempt: int, seq: int) -> bool:
    """Store ``seq`` as the placement's newest Status; False when it is not newer (a stale Report)."""
    result = await session.execute(
        sa.update(placements)
        .where(placements.c.workload_uid == uid, placements.c.attempt == attempt,
               placements.c.last_status_seq < seq)
        .values(last_status_seq=seq).returning(placements.c.id))
    return result.first() is not None


async def active_placements(session: AsyncSession) -> list[Any]:
    """Placements holding capacity now, with their Workload's requests (rebuilds the capacity book)."""
    result = await session.execute(
        sa.select(placements.c.workload_uid, placements.c.cluster, placements.c.accepted_at,
                  workloads.c.requests)
        .join(workloads, sa.and_(workloads.c.uid == placements.c.workload_uid,
                                 workloads.c.attempt == placements.c.attempt))
        .where(placements.c.state.in_(CAPACITY_PLACEMENT)))
    return list(result.all())


async def expected_on(session: AsyncSession, cluster: str) -> list[Any]:
    """The current placements whose worker copy should exist on ``cluster`` (the Resync list)."""
    result = await session.execute(
        sa.select(placements.c.workload_uid, placements.c.attempt, placements.c.epoch, placements.c.state,
                  workloads.c.spec_version, workloads.c.namespace, workloads.c.name, workloads.c.kind,
                  workloads.c.api_version)
        .join(workloads, sa.and_(workloads.c.uid == placements.c.workload_uid,
                                 workloads.c.attempt == placements.c.attempt))
        .where(placements.c.cluster == cluster, placements.c.state.in_(KEPT_PLACEMENT),
               workloads.c.state != states.W.DELETED))
    return list(result.all())


async def unanswered(session: AsyncSession, before: datetime, limit: int) -> list[Any]:
    """Current placements still ``sent`` (no Accepted / Rejected) that were created before ``before``."""
    result = await session.execute(
        sa.select(placements.c.workload_uid, placements.c.attempt, placements.c.cluster, workloads.c.kind,
                  workloads.c.spec_version)
        .join(workloads, sa.and_(workloads.c.uid == placements.c.workload_uid,
                                 workloads.c.attempt == placements.c.attempt))
        .where(placements.c.state == states.P.SENT, placements.c.created_at < before, workloads.c.state == states.W.PLACED)
        .order_by(placements.c.created_at).limit(limit))
    return list(result.all())


async def placements_on(session: AsyncSession, cluster: str, states: Sequence[str]) -> list[Any]:
    result = await session.execute(
        sa.select(placements).where(placements.c.cluster == cluster, placements.c.state.in_(states)))
    return list(result.all())
