"""The ``dispatcher_epochs`` table: each start of a dispatcher takes the next fencing epoch."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import dispatcher_epochs


async def new_epoch(session: AsyncSession, *, origin: str, host: str, now: datetime) -> int:
    """A fresh fencing epoch for a starting dispatcher (strictly greater than every earlier one)."""
    result = await session.execute(
        sa.insert(dispatcher_epochs).values(origin=origin, host=host[:253], started_at=now)
        .returning(dispatcher_epochs.c.epoch))
    return int(result.scalar_one())
