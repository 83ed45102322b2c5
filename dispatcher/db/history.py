"""History pruning: the rows of Workloads whose manager Job is gone, removed once they are old enough.

Every Job mkd dispatches leaves a ``workloads`` row, its ``placements`` and its ``events``. A Workload whose
Job was deleted on the manager (state ``deleted``) is never decided again, so after
``history_retention_seconds`` its rows go, with the cluster history (``events`` naming no Workload: clusters
lost and back) older than that; the database of a busy fleet then stays the size of what it has run within
the retention. A Workload that still has a Job on the manager (finished, failed, rejected: its history is
what ``mkctl get`` and the API show for that Job) is kept as long as its Job is, and a Workload with a
placement a cluster may still hold (sent, accepted, running, suspended) is kept whatever its age. The
pruner deletes in chunks of ``PRUNE_CHUNK`` Workloads, each in its own short transaction, so pruning a
large backlog never holds locks the engine waits for. It is side work: a failure is logged and tried
again at the next turn.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.db import mapped
from dispatcher.db.models import events, placements, workloads
from dispatcher.db.queries.sql import in_values
from federation.clock import Clock
from federation.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

PRUNE_CHUNK = 2000
"""Workloads removed per transaction."""
PRUNE_EVERY_SECONDS = 300.0
"""How often the pruner looks for history past the retention."""
ACTIVE_PLACEMENTS = ("sent", "accepted", "running", "suspended")


async def prune_workloads(session: AsyncSession, before: datetime, limit: int = PRUNE_CHUNK) -> int:
    """Delete up to ``limit`` ``deleted`` Workloads last changed before ``before`` (and none with a placement
    a cluster may still hold), with their placements and events; returns how many."""
    active = sa.select(placements.c.workload_uid).where(
        placements.c.workload_uid == workloads.c.uid, placements.c.state.in_(ACTIVE_PLACEMENTS))
    uids = [r[0] for r in await session.execute(
        sa.select(workloads.c.uid).where(workloads.c.state == "deleted", workloads.c.updated_at < before,
                                         ~sa.exists(active)).limit(limit))]
    if not uids:
        return 0
    await session.execute(sa.delete(events).where(in_values(session, events.c.workload_uid, uids)))
    await session.execute(sa.delete(placements).where(in_values(session, placements.c.workload_uid, uids)))
    await session.execute(sa.delete(workloads).where(in_values(session, workloads.c.uid, uids)))
    return len(uids)


async def prune_cluster_events(session: AsyncSession, before: datetime, limit: int = PRUNE_CHUNK * 10) -> int:
    """Delete up to ``limit`` events that name no Workload (a cluster's) from before ``before``."""
    old = sa.select(events.c.id).where(events.c.workload_uid.is_(None), events.c.at < before).limit(limit)
    ids = [r[0] for r in await session.execute(old)]
    if ids:
        await session.execute(sa.delete(events).where(in_values(session, events.c.id, ids)))
    return len(ids)


class HistoryPruner:
    """Runs the pruning every ``PRUNE_EVERY_SECONDS`` (see the module docstring); ``retention`` None keeps
    everything."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], clock: Clock, retention: float | None,
                 active: Any = lambda: True) -> None:
        self.sessions = sessions
        self.clock = clock
        self.retention = retention
        self.active = active
        self.pruned = 0

    async def run(self) -> None:
        if self.retention is None:
            return
        while True:
            if self.active():
                await self.turn()
            await self.clock.sleep(PRUNE_EVERY_SECONDS)

    async def turn(self) -> int:
        """Prune everything past the retention, a chunk per transaction; returns the Workloads removed."""
        assert self.retention is not None
        before = self.clock.now() - timedelta(seconds=self.retention)
        removed = 0
        try:
            with mapped():
                while True:
                    async with self.sessions.begin() as s:
                        n = await prune_workloads(s, before)
                    removed += n
                    if n < PRUNE_CHUNK:
                        break
                    await self.clock.sleep(0)  # the engine's transactions go between chunks
                async with self.sessions.begin() as s:
                    cluster_events = await prune_cluster_events(s, before)
        except DatabaseUnavailable as exc:
            log.warning("history pruning: database unreachable (%s); trying again in %.0fs", exc,
                        PRUNE_EVERY_SECONDS)
            return removed
        self.pruned += removed
        if removed or cluster_events:
            log.info("history pruning: removed %d deleted Workloads and %d cluster events older than %.0fs",
                     removed, cluster_events, self.retention)
        return removed
