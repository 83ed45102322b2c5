"""The ``outbox`` table: Command rows the engine writes and the publisher sends, marks sent and purges."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import outbox
from dispatcher.db.queries.sql import built, chunks, in_param, is_pg

_INSERT_OUTBOX = sa.insert(outbox)


async def add_outbox(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Queue Commands: id, cluster, topic, payload, workload_uid, created_at.

    The caller assigns ids (see :class:`OutboxIds`), so the insert needs no RETURNING round trip, and
    the publisher can mark in-memory rows sent by id. On PostgreSQL it is one statement over one array
    per column (the payloads are bytes, which a JSON text cannot carry): an executemany built every
    row's parameters in Python, most of what queuing a Command cost the database code.
    """
    if not rows:
        return
    if is_pg(session):
        await session.execute(_OUTBOX_PG, {c: [r[c] for r in rows] for c, _ in _OUTBOX_COLUMNS})
        return
    await session.execute(_INSERT_OUTBOX, list(rows))


_OUTBOX_COLUMNS = (("id", "BIGINT"), ("cluster", "VARCHAR"), ("topic", "TEXT"), ("payload", "BYTEA"),
                   ("workload_uid", "VARCHAR"), ("created_at", "TIMESTAMPTZ"))


_OUTBOX_PG = sa.text(
    "INSERT INTO outbox (" + ", ".join(c for c, _ in _OUTBOX_COLUMNS) + ") SELECT * FROM unnest("
    + ", ".join(f"CAST(:{c} AS {t}[])" for c, t in _OUTBOX_COLUMNS) + ")"
).bindparams(sa.bindparam("created_at", type_=postgresql.ARRAY(sa.DateTime(timezone=True))))


class OutboxIds:
    """Outbox ids made by the dispatcher: ``epoch << 32 | n``. Epochs only grow, so ids keep the order
    in which Commands were queued across restarts, and two replicas (two epochs) never collide."""

    def __init__(self, epoch: int) -> None:
        self.base = epoch << 32
        self.n = 0

    def next(self) -> int:
        self.n += 1
        if self.n >= 1 << 32:
            raise OverflowError("2^32 Commands in one epoch; restart the dispatcher")
        return self.base | self.n


async def unsent(session: AsyncSession, limit: int, *, before: datetime | None = None,
                 below: int | None = None) -> list[Any]:
    """Unsent outbox rows in id order; with ``before`` only rows created earlier than that, with ``below``
    only ids lower than that."""
    stmt = (sa.select(outbox.c.id, outbox.c.topic, outbox.c.payload, outbox.c.attempts)
            .where(outbox.c.sent_at.is_(None)).order_by(outbox.c.id).limit(limit))
    if before is not None:
        stmt = stmt.where(outbox.c.created_at < before)
    if below is not None:
        stmt = stmt.where(outbox.c.id < below)
    result = await session.execute(stmt)
    return list(result.all())


async def payloads(session: AsyncSession, ids: Sequence[int]) -> dict[int, bytes]:
    """The Command bytes of outbox rows by id (rows the engine queued for the publisher without them)."""
    stmt = built(session, ("outbox_payloads",),
                  lambda pg: sa.select(outbox.c.id, outbox.c.payload).where(in_param(pg, outbox.c.id, "ids")))
    out: dict[int, bytes] = {}
    for chunk in chunks(session, ids):
        out.update((row.id, row.payload) for row in await session.execute(stmt, {"ids": list(chunk)}))
    return out


async def mark_sent(session: AsyncSession, ids: Sequence[int], now: datetime) -> None:
    stmt = built(session, ("mark_sent",), lambda pg: sa.update(outbox).where(in_param(pg, outbox.c.id, "ids"))
                  .values(sent_at=sa.bindparam("now", type_=outbox.c.sent_at.type), attempts=outbox.c.attempts + 1))
    for chunk in chunks(session, ids):
        await session.execute(stmt, {"ids": list(chunk), "now": now})


async def purge_sent(session: AsyncSession, before: datetime) -> int:
    result = await session.execute(sa.delete(outbox).where(outbox.c.sent_at < before))
    return int(getattr(result, "rowcount", 0) or 0)
