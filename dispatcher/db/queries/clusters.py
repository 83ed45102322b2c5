"""The ``clusters`` and ``cluster_refusals`` tables: heartbeats, leases, lost clusters, registered keys, refused
senders.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import cluster_refusals, clusters
from dispatcher.db.queries.sql import built, insert_for


async def upsert_cluster(session: AsyncSession, row: Mapping[str, Any]) -> None:
    """Insert or update a cluster row (from heartbeats); ``lease_until`` is never shortened."""
    cols = tuple(row)

    def build(pg: bool) -> Any:
        stmt = insert_for(session, clusters).values({k: sa.bindparam(k, type_=clusters.c[k].type) for k in cols})
        set_ = {k: stmt.excluded[k] for k in cols if k != "name"}
        if "lease_until" in cols:  # the lease desk (dispatcher/clusters/leases.py) may have written a later end
            new, old = stmt.excluded.lease_until, clusters.c.lease_until
            set_["lease_until"] = sa.case((old.is_(None), new), (new.is_(None), old), (old < new, new), else_=old)
        return stmt.on_conflict_do_update(index_elements=["name"], set_=set_)
    await session.execute(built(session, ("upsert_cluster", *cols), build), dict(row))


async def extend_lease(session: AsyncSession, name: str, until: datetime) -> bool:
    """Move ``name``'s ``lease_until`` out to ``until`` (never back); False when no such cluster row exists."""
    def build(pg: bool) -> Any:
        old, new = clusters.c.lease_until, sa.bindparam("until", type_=clusters.c.lease_until.type)
        return sa.update(clusters).where(clusters.c.name == sa.bindparam("b_name")).values(
            lease_until=sa.case((old.is_(None), new), (old < new, new), else_=old))
    result = await session.execute(built(session, ("extend_lease",), build), {"b_name": name, "until": until})
    return bool(getattr(result, "rowcount", 0))


async def mark_cluster_lost(session: AsyncSession, name: str, since: datetime) -> None:
    await session.execute(sa.update(clusters).where(clusters.c.name == name)
                          .values(lost_since=since, updated_at=since))


async def register_cluster(session: AsyncSession, name: str, public_key: str, now: datetime) -> bool:
    """Record ``name``'s public key (a new cluster, or a new key for a known one); True when it was new."""
    existed = (await session.execute(sa.select(clusters.c.name).where(clusters.c.name == name))).first()
    if existed:
        await session.execute(sa.update(clusters).where(clusters.c.name == name)
                              .values(public_key=public_key, registered_at=now, updated_at=now))
    else:
        await session.execute(sa.insert(clusters).values(
            name=name, labels={}, capacity={}, kinds=[], online=False, public_key=public_key,
            registered_at=now, updated_at=now))
    await session.execute(sa.delete(cluster_refusals).where(cluster_refusals.c.name == name))
    return existed is None


async def unregister_cluster(session: AsyncSession, name: str, now: datetime) -> bool:
    """Forget ``name``'s key: its messages are refused from then on. False when it had none."""
    result = await session.execute(sa.update(clusters).where(clusters.c.name == name, clusters.c.public_key.is_not(None))
                                   .values(public_key=None, registered_at=None, online=False, updated_at=now))
    return bool(getattr(result, "rowcount", 0))


async def cluster_keys(session: AsyncSession) -> dict[str, str]:
    """Registered clusters and their public keys (text)."""
    rows = await session.execute(sa.select(clusters.c.name, clusters.c.public_key)
                                 .where(clusters.c.public_key.is_not(None)))
    return {r.name: r.public_key for r in rows}


async def record_refusals(session: AsyncSession, refusals: Mapping[str, tuple[str, str, int, datetime]]) -> None:
    """Add to each refused sender's count: name -> (reason, message, how many, when last)."""
    for name, (reason, message, n, at) in refusals.items():
        stmt = insert_for(session, cluster_refusals).values(name=name, reason=reason[:64], message=message[:1000],
                                                         count=n, first_at=at, last_at=at)
        stmt = stmt.on_conflict_do_update(index_elements=["name"], set_={
            "reason": stmt.excluded.reason, "message": stmt.excluded.message, "last_at": stmt.excluded.last_at,
            "count": cluster_refusals.c.count + stmt.excluded.count})
        await session.execute(stmt)


async def load_clusters(session: AsyncSession) -> list[Any]:
    return list((await session.execute(sa.select(clusters).order_by(clusters.c.name))).all())
