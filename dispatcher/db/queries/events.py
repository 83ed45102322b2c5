"""The ``events`` table: the append-only history rows of each batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import events
from dispatcher.db.queries.sql import insert_rows

_INSERT_EVENTS = sa.insert(events)


async def add_events(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append history rows: workload_uid, at, type, cluster, reason, message (missing keys default)."""
    if rows:
        full = [{"workload_uid": None, "cluster": None, "reason": "", "message": "", **r} for r in rows]
        await insert_rows(session, events, full, _INSERT_EVENTS)
