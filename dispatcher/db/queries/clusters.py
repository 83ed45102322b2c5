"""The ``clusters`` and ``cluster_refusals`` tables: heartbeats, leases, lost clusters, registered keys, refused
senders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import capacity_totals, cluster_refusals, clusters
from dispatcher.db.queries.sql import built, insert_for, is_pg, recordset, rows_json


async def upsert_clusters(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert or update cluster rows (from heartbeats), locked in the order of their names (the lease desk
    locks them in that order too: two transactions locking the same rows in two orders deadlock);
    ``lease_until`` and ``last_heartbeat`` never move back; a row's ``capacity`` brings its ``allocatable`` and
    ``free`` columns with it. On PostgreSQL one statement over the rows as one JSON text."""
    # the totals columns go with every capacity written (the lists of clusters read them, not the node lists)
    rows = sorted(({**r, **capacity_totals(r["capacity"])} if "capacity" in r else r for r in rows),
                  key=lambda r: str(r["name"]))
    if not rows:
        return
    cols = tuple(rows[0])
    text = rows_json(rows) if is_pg(session) and all(tuple(r) == cols for r in rows) else None
    if text is None:
        for row in rows:
            await _upsert_one(session, row)
        return

    def build(pg: bool) -> Any:
        source, values = recordset(clusters, cols)
        sets = [f"{c} = EXCLUDED.{c}" for c in cols if c not in ("name", "lease_until", "last_heartbeat")]
        for c in ("lease_until", "last_heartbeat"):  # the lease desk may have written later ones (GREATEST skips NULLs)
            if c in cols:
                sets.append(f"{c} = GREATEST(clusters.{c}, EXCLUDED.{c})")
        return sa.text(f"INSERT INTO clusters ({', '.join(cols)}) SELECT {', '.join(values)} FROM {source} "
                       f"ORDER BY v.name ON CONFLICT (name) DO UPDATE SET {', '.join(sets)}")
    await session.execute(built(session, ("upsert_clusters_pg", *cols), build), {"rows": text})


async def _upsert_one(session: AsyncSession, row: Mapping[str, Any]) -> None:
    cols = tuple(row)

    def build(pg: bool) -> Any:
        stmt = insert_for(session, clusters).values({k: sa.bindparam(k, type_=clusters.c[k].type) for k in cols})
        set_ = {k: stmt.excluded[k] for k in cols if k != "name"}
        for c in ("lease_until", "last_heartbeat"):  # the lease desk (dispatcher/clusters/leases.py) may have written later ones
            if c in cols:
                new, old = stmt.excluded[c], clusters.c[c]
                set_[c] = sa.case((old.is_(None), new), (new.is_(None), old), (old < new, new), else_=old)
        return stmt.on_conflict_do_update(index_elements=["name"], set_=set_)
    await session.execute(built(session, ("upsert_cluster", *cols), build), dict(row))


async def extend_leases(session: AsyncSession, leases: Mapping[str, tuple[datetime, datetime]]) -> set[str]:
    """For each cluster, (lease end, heartbeat received): move its ``lease_until`` out to the end and its
    ``last_heartbeat`` to the time received (neither ever moves back), rows locked in the order of their
    names; returns the names that have a row. On PostgreSQL one statement for all of them."""
    if not leases:
        return set()
    if not is_pg(session):
        return {name for name, (until, heard) in sorted(leases.items())
                if await _extend_one(session, name, until, heard)}

    def build(pg: bool) -> Any:
        # the CTE locks the rows sorted by name; the UPDATE then takes rows it already holds
        return sa.text(
            "WITH locked AS (SELECT name FROM clusters WHERE name = ANY(CAST(:names AS varchar[])) "
            "ORDER BY name FOR UPDATE) "
            "UPDATE clusters SET lease_until = GREATEST(clusters.lease_until, v.until), "
            "last_heartbeat = GREATEST(clusters.last_heartbeat, v.heard) "
            "FROM locked, json_to_recordset(CAST(:rows AS json)) AS v(name varchar, until timestamptz, "
            "heard timestamptz) WHERE clusters.name = locked.name AND v.name = locked.name RETURNING clusters.name")
    names = sorted(leases)
    rows = rows_json([{"name": n, "until": leases[n][0], "heard": leases[n][1]} for n in names])
    result = await session.execute(built(session, ("extend_leases_pg",), build), {"names": names, "rows": rows})
    return {r[0] for r in result}


async def _extend_one(session: AsyncSession, name: str, until: datetime, heard: datetime) -> bool:
    def build(pg: bool) -> Any:
        old, new = clusters.c.lease_until, sa.bindparam("until", type_=clusters.c.lease_until.type)
        last, now = clusters.c.last_heartbeat, sa.bindparam("heard", type_=clusters.c.last_heartbeat.type)
        return sa.update(clusters).where(clusters.c.name == sa.bindparam("b_name")).values(
            lease_until=sa.case((old.is_(None), new), (old < new, new), else_=old),
            last_heartbeat=sa.case((last.is_(None), now), (last < now, now), else_=last))
    result = await session.execute(built(session, ("extend_lease",), build),
                                   {"b_name": name, "until": until, "heard": heard})
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
    """Every cluster row, whole: the capacity with every node (a heartbeat's worth of JSON each)."""
    return list((await session.execute(sa.select(clusters).order_by(clusters.c.name))).all())


async def cluster_summaries(session: AsyncSession) -> list[Any]:
    """Every cluster row without ``capacity``: its totals are the ``allocatable`` and ``free`` columns. What lists of clusters show; the node lists of 1,000 clusters are megabytes of JSON to decode."""
    cols = [c for c in clusters.c if c.name != "capacity"]  # the totals have columns of their own
    return list((await session.execute(sa.select(*cols).order_by(clusters.c.name))).all())


async def cluster_times(session: AsyncSession) -> list[Any]:
    """Each cluster's name, ``lost_since``, ``last_heartbeat`` and ``lease_until``: what a dispatcher that
    starts reads of them."""
    return list((await session.execute(sa.select(clusters.c.name, clusters.c.lost_since, clusters.c.last_heartbeat,
                                                 clusters.c.lease_until))).all())
