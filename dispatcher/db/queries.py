"""Query functions over the dispatcher's tables. Each takes an ``AsyncSession`` and never commits:
the caller owns the transaction, so one batch of Job changes and Reports is one commit.

State changes that two dispatcher replicas could race on are compare-and-set: ``claim`` is an ``INSERT ... ON
CONFLICT DO NOTHING RETURNING`` keyed by the Job uid, ``mark_placed`` an ``UPDATE ... WHERE state = 'pending'
RETURNING``, ``advance_status_seq`` an ``UPDATE ... WHERE last_status_seq < :seq``; the loser of a race sees
no row and does nothing. The read-only functions at the end serve ``mkctl`` (``list_placements``,
``show_workload``, ``list_clusters``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import states
from dispatcher.db import json_dumps
from dispatcher.db.models import (
    cluster_refusals,
    clusters,
    dispatcher_epochs,
    events,
    outbox,
    placements,
    workloads,
)

ACTIVE_PLACEMENT = tuple(s.value for s in states.PLACEMENT_ACTIVE)
"""A placement in one of these states is current and not ended: its worker copy exists (or is about to)."""
CAPACITY_PLACEMENT = tuple(s.value for s in states.PLACEMENT_HOLDS_CAPACITY)
"""A placement in one of these states holds (or is about to hold) room on its Cluster."""
KEPT_PLACEMENT = tuple(s.value for s in states.PLACEMENT_KEPT)
"""States whose worker copy still exists (finished copies stay until the manager Job is deleted)."""
LIVE_WORKLOAD = tuple(s.value for s in states.WORKLOAD_LIVE)


def _insert(session: AsyncSession, table: sa.Table) -> Any:
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"database dialect {name!r} is not supported (use SQLite or PostgreSQL)")


def _pg(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _in(session: AsyncSession, col: sa.ColumnElement[Any], values: Sequence[Any]) -> sa.ColumnElement[bool]:
    """``col IN values``; on PostgreSQL ``col = ANY(:array)`` so the statement text (and its prepared
    statement) is the same whatever the number of values: one round trip instead of prepare + execute."""
    if _pg(session):
        return col == sa.any_(sa.bindparam(None, list(values), type_=postgresql.ARRAY(col.type)))
    return col.in_(list(values))


_BUILT: dict[tuple[Any, ...], Any] = {}


def _built(session: AsyncSession, key: tuple[Any, ...], build: Callable[[bool], Any]) -> Any:
    """The statement ``build(pg)`` made once per dialect and ``key``: executing the same statement object
    again reuses its memoized cache key and compiled form; values travel as bound parameters.

    The statements the engine runs for every batch are built once per dialect (``_built``) and take
    their values as bound parameters: building a statement and computing its cache key cost more of the
    dispatcher's CPU than running it.
    """
    pg = _pg(session)
    full = (pg, *key)
    stmt = _BUILT.get(full)
    if stmt is None:
        if len(_BUILT) >= 1024:  # the column sets of bulk updates are few; never grow without bound
            _BUILT.clear()
        stmt = _BUILT[full] = build(pg)
    return stmt


def _in_param(pg: bool, col: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool]:
    """``col IN :name`` with a list bound at execution: ``= ANY(:array)`` on PostgreSQL (one statement
    text whatever the number of values), an expanding IN elsewhere."""
    if pg:
        return col == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(col.type)))
    return col.in_(sa.bindparam(name, expanding=True))


_CHUNK = 1000  # SQLite's bound-parameter limit is far above this; PostgreSQL takes one array anyway


def _chunks(session: AsyncSession, values: Sequence[Any]) -> list[Sequence[Any]]:
    if _pg(session):
        return [values] if values else []
    return [values[i:i + _CHUNK] for i in range(0, len(values), _CHUNK)]


def _pg_type(col: sa.Column[Any]) -> str:
    """The PostgreSQL type of ``col`` as ``json_to_recordset`` reads it."""
    t = col.type
    if isinstance(t, sa.JSON):
        return "json"
    if isinstance(t, sa.TypeDecorator):
        t = t.impl_instance
    for base, name in ((sa.DateTime, "timestamptz"), (sa.Boolean, "boolean"), (sa.BigInteger, "bigint"),
                       (sa.Integer, "integer"), (sa.Float, "float8"), (sa.Text, "text"), (sa.String, "varchar")):
        if isinstance(t, base):
            return name
    raise NotImplementedError(f"no JSON record type for {col.table.name}.{col.name} ({col.type!r})")


def _recordset(table: sa.Table, names: Sequence[str]) -> tuple[str, list[str]]:
    """``json_to_recordset(:rows) AS v(name type, ...)`` for these columns (a name ``b_x`` is column ``x``
    as a key), and each column's value (JSON None as the JSON type stores it: ``null``, not NULL)."""
    cols = [(n, table.c[n[2:]] if n.startswith("b_") else table.c[n]) for n in names]
    source = "json_to_recordset(CAST(:rows AS json)) AS v(" + ", ".join(f"{n} {_pg_type(c)}" for n, c in cols) + ")"
    values = [f"COALESCE(v.{n}, 'null'::json)" if isinstance(c.type, sa.JSON) else f"v.{n}" for n, c in cols]
    return source, values


def _rows_json(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The rows as one JSON array (orjson: datetimes as RFC 3339 with their offset), or None when a value
    is not JSON (the caller then executes the statement many times, as SQLAlchemy does)."""
    try:
        return orjson.dumps(list(rows), option=orjson.OPT_NON_STR_KEYS | orjson.OPT_NAIVE_UTC).decode()
    except TypeError:  # orjson.JSONEncodeError
        return None


def _json_insert_pg(table: sa.Table, names: tuple[str, ...]) -> Any:
    """``INSERT INTO table (names) SELECT ... FROM json_to_recordset(:rows)``: the rows as one JSON text
    parameter. SQLAlchemy's executemany (and asyncpg's arrays) convert every value of every row in
    Python, ~2-4 us each: most of what a batch's statements cost the dispatcher."""
    source, values = _recordset(table, names)
    return sa.text(f"INSERT INTO {table.name} ({', '.join(names)}) SELECT {', '.join(values)} FROM {source}")


def _json_update_pg(table: sa.Table, keys: tuple[str, ...], names: tuple[str, ...]) -> Any:
    """``UPDATE table SET c = v.c ... FROM json_to_recordset(:rows) AS v WHERE table.k = v.b_k ...
    AND table.k0 = ANY(:keys)``, ``:keys`` the rows' first key values.

    The planner cannot see how many rows a JSON parameter holds and plans for 100: joined by the keys
    alone, it hashed them and read the whole table on every statement (every batch read every placement
    ever made, tests/dispatcher/test_bulk_plans.py). ``= ANY`` over an array it counts sends it to the index
    on the first key."""
    source, values = _recordset(table, (*keys, *names))
    sets = ", ".join(f"{n} = {v}" for n, v in zip(names, values[len(keys):], strict=True))
    where = " AND ".join(f"{table.name}.{k[2:]} = v.{k}" for k in keys)
    first = table.c[keys[0][2:]]
    return sa.text(f"UPDATE {table.name} SET {sets} FROM {source} WHERE {where} "
                   f"AND {table.name}.{first.name} = ANY(CAST(:keys AS {_pg_type(first)}[]))")


async def _insert_rows(session: AsyncSession, table: sa.Table, rows: Sequence[Mapping[str, Any]],
                       fallback: Any) -> None:
    """Insert ``rows`` (each with the same keys): one statement over a JSON text on PostgreSQL, else
    ``fallback`` executed many."""
    names = tuple(rows[0])
    text = _rows_json(rows) if _pg(session) and all(tuple(r) == names for r in rows) else None
    if text is not None:
        stmt = _built(session, ("json_insert", table.name, *names), lambda pg: _json_insert_pg(table, names))
        await session.execute(stmt, {"rows": text})
        return
    await session.execute(fallback, list(rows))


# --- epochs ----------------------------------------------------------------------------------


async def new_epoch(session: AsyncSession, *, origin: str, host: str, now: datetime) -> int:
    """A fresh fencing epoch for a starting dispatcher (strictly greater than every earlier one)."""
    result = await session.execute(
        sa.insert(dispatcher_epochs).values(origin=origin, host=host[:253], started_at=now)
        .returning(dispatcher_epochs.c.epoch))
    return int(result.scalar_one())


# --- workloads -------------------------------------------------------------------------------


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
    if _pg(session):  # one statement, one round trip, same text every time: INSERT ... SELECT FROM the rows' JSON
        names = tuple(c for c, _ in _CLAIM_COLUMNS)
        text = _rows_json([{c: r[c] for c in names} for r in rows])
        if text is not None:
            stmt = _built(session, ("json_claim",), lambda pg: sa.text(
                str(_json_insert_pg(workloads, names)) + " ON CONFLICT (uid) DO NOTHING RETURNING uid"))
            result = await session.execute(stmt, {"rows": text})
            return {r[0] for r in result.all()}
        params = {c: [json_dumps(r[c]) if t == "JSON" else r[c] for r in rows] for c, t in _CLAIM_COLUMNS}
        result = await session.execute(_CLAIM_PG, params)
        return {r[0] for r in result.all()}
    stmt = _built(session, ("claim",), lambda pg: _insert(session, workloads).on_conflict_do_nothing(
        index_elements=["uid"]).returning(workloads.c.uid))
    result = await session.execute(stmt, list(rows))
    return {r[0] for r in result.all()}


async def load_workloads(session: AsyncSession, uids: Iterable[str]) -> dict[str, sa.Row[Any]]:
    keys = list(set(uids))
    out: dict[str, sa.Row[Any]] = {}
    for chunk in _chunks(session, keys):
        result = await session.execute(sa.select(workloads).where(_in(session, workloads.c.uid, chunk)))
        out.update({r.uid: r for r in result})
    return out


_LIGHT = [c for c in workloads.c if c.name not in ("requests", "podsets")]
"""Workload columns without the PodSet JSON: what decisions on Reports and Job changes read."""
LIGHT_NAMES = tuple(c.name for c in _LIGHT)
"""The names of ``_LIGHT``: the first columns of each row ``load_current`` returns, in this order."""
_P_NAMES = tuple(c.name for c in placements.c)
_P_LABELLED = [c.label(f"p__{c.name}") for c in placements.c]
assert _P_NAMES[0] == "id"


async def load_current(session: AsyncSession, uids: Iterable[str]
                       ) -> tuple[dict[str, sa.Row[Any]], dict[tuple[str, int], dict[str, Any]]]:
    """Workloads by uid (without ``requests`` / ``podsets``) and their current placement (if any) by
    (uid, attempt), in one round trip."""
    keys = list(set(uids))
    rows: dict[str, sa.Row[Any]] = {}
    current: dict[tuple[str, int], dict[str, Any]] = {}
    stmt = _built(session, ("load_current",), lambda pg: sa.select(*_LIGHT, *_P_LABELLED)
                  .outerjoin(placements, sa.and_(placements.c.workload_uid == workloads.c.uid,
                                                 placements.c.attempt == workloads.c.attempt))
                  .where(_in_param(pg, workloads.c.uid, "uids")))
    width = len(_LIGHT)
    for chunk in _chunks(session, keys):
        for r in await session.execute(stmt, {"uids": list(chunk)}):
            rows[r.uid] = r
            if r[width] is not None:  # p__id: the current placement exists
                current[(r.uid, r.attempt)] = dict(zip(_P_NAMES, r[width:], strict=True))
    return rows, current


async def load_podsets(session: AsyncSession, uids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """uid -> ``podsets`` of these Workloads (the column ``load_current`` leaves out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    stmt = _built(session, ("load_podsets",), lambda pg: sa.select(workloads.c.uid, workloads.c.podsets)
                  .where(_in_param(pg, workloads.c.uid, "uids")))
    for chunk in _chunks(session, list(set(uids))):
        out.update({r.uid: r.podsets for r in await session.execute(stmt, {"uids": list(chunk)})})
    return out


async def known_uids(session: AsyncSession) -> dict[str, str]:
    """uid → kind of every Workload whose Job may still exist on the manager."""
    result = await session.execute(
        sa.select(workloads.c.uid, workloads.c.kind).where(workloads.c.state.in_(LIVE_WORKLOAD)))
    return {r.uid: r.kind for r in result}


async def known_namespaces(session: AsyncSession) -> dict[str, str]:
    """uid → namespace of every Workload whose Job may still exist on the manager."""
    result = await session.execute(
        sa.select(workloads.c.uid, workloads.c.namespace).where(workloads.c.state.in_(LIVE_WORKLOAD)))
    return {r.uid: r.namespace for r in result}


async def live_of_kind(session: AsyncSession, kind: str) -> list[Any]:
    result = await session.execute(
        sa.select(workloads.c.uid, workloads.c.namespace, workloads.c.name)
        .where(workloads.c.kind == kind, workloads.c.state.in_(LIVE_WORKLOAD)))
    return list(result.all())


async def update_workload(session: AsyncSession, uid: str, **values: Any) -> None:
    await session.execute(sa.update(workloads).where(workloads.c.uid == uid).values(**values))


_NO_SYNC = {"synchronize_session": False}


async def update_workloads(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Bulk update by primary key: each row holds ``b_uid`` plus the columns to set (same keys in all)."""
    if not rows:
        return
    cols = tuple(k for k in rows[0] if k != "b_uid")
    text = _rows_json(rows) if _pg(session) else None
    if text is not None:  # one UPDATE over a JSON text (see _json_insert_pg)
        stmt = _built(session, ("json_update", "workloads", *cols),
                      lambda pg: _json_update_pg(workloads, ("b_uid",), cols))
        await session.execute(stmt, {"rows": text, "keys": [r["b_uid"] for r in rows]})
        return
    stmt = _built(session, ("update_workloads", *cols), lambda pg: sa.update(workloads).where(
        workloads.c.uid == sa.bindparam("b_uid")).values({c: sa.bindparam(c) for c in cols}))
    await session.execute(stmt, list(rows), execution_options=_NO_SYNC)


async def pending_workloads(session: AsyncSession, limit: int) -> list[Any]:
    """Pending, not suspended Workloads in placement order: priority first, then age."""
    result = await session.execute(
        sa.select(workloads).where(workloads.c.state == "pending", workloads.c.suspended.is_(False))
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
    if _pg(session):  # one statement for every cluster: UPDATE ... FROM unnest(uids, clusters, ...)
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
    stmt = _built(session, ("mark_placed",), lambda pg: sa.update(workloads)
                  .where(_in_param(pg, workloads.c.uid, "uids"), workloads.c.state == "pending")
                  .values(state="placed", attempt=workloads.c.attempt + 1, cluster=sa.bindparam("cluster"),
                          reason="", updated_at=sa.bindparam("now", type_=workloads.c.updated_at.type))
                  .returning(workloads.c.uid, workloads.c.attempt))
    for cluster, members in by_cluster.items():
        for chunk in _chunks(session, members):
            result = await session.execute(stmt, {"uids": list(chunk), "cluster": cluster, "now": now})
            won.update({r.uid: r.attempt for r in result})
    if won:
        await update_workloads(session, [{"b_uid": u, **{c: held[u][c] for c in HELD_COLUMNS}, "reserved_at": now}
                                         for u in won])
    return won


# --- placements ------------------------------------------------------------------------------


_INSERT_PLACEMENTS = sa.insert(placements)
_INSERT_EVENTS = sa.insert(events)
_INSERT_OUTBOX = sa.insert(outbox)


async def add_placements(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    if rows:
        await _insert_rows(session, placements, rows, _INSERT_PLACEMENTS)


async def load_placements(session: AsyncSession, keys: Iterable[tuple[str, int]]) -> dict[tuple[str, int], sa.Row[Any]]:
    """Placements by (workload uid, attempt)."""
    wanted = set(keys)
    uids = list({uid for uid, _ in wanted})
    out: dict[tuple[str, int], sa.Row[Any]] = {}
    for chunk in _chunks(session, uids):
        result = await session.execute(sa.select(placements).where(_in(session, placements.c.workload_uid, chunk)))
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
    text = _rows_json([{"b_workload_uid": r["b_uid"], **r} for r in rows]) if _pg(session) else None
    if text is not None:  # one UPDATE over a JSON text (see _json_insert_pg)
        stmt = _built(session, ("json_update", "placements", *cols),
                      lambda pg: _json_update_pg(placements, ("b_workload_uid", "b_attempt"), cols))
        await session.execute(stmt, {"rows": text, "keys": [r["b_uid"] for r in rows]})
        return
    stmt = _built(session, ("update_placements", *cols), lambda pg: sa.update(placements)
                  .where(placements.c.workload_uid == sa.bindparam("b_uid"),
                         placements.c.attempt == sa.bindparam("b_attempt"))
                  .values({c: sa.bindparam(c) for c in cols}))
    await session.execute(stmt, list(rows), execution_options=_NO_SYNC)


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
        .where(workloads.c.state.in_(("placed", "running", "finished", "failed"))))
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


async def expected_on(session: AsyncSession, cluster: str) -> list[Any]:
    """The current placements whose worker copy should exist on ``cluster`` (the Resync list)."""
    result = await session.execute(
        sa.select(placements.c.workload_uid, placements.c.attempt, placements.c.epoch, placements.c.state,
                  workloads.c.spec_version, workloads.c.namespace, workloads.c.name, workloads.c.kind,
                  workloads.c.api_version)
        .join(workloads, sa.and_(workloads.c.uid == placements.c.workload_uid,
                                 workloads.c.attempt == placements.c.attempt))
        .where(placements.c.cluster == cluster, placements.c.state.in_(KEPT_PLACEMENT),
               workloads.c.state != "deleted"))
    return list(result.all())


async def unanswered(session: AsyncSession, before: datetime, limit: int) -> list[Any]:
    """Current placements still ``sent`` (no Accepted / Rejected) that were created before ``before``."""
    result = await session.execute(
        sa.select(placements.c.workload_uid, placements.c.attempt, placements.c.cluster, workloads.c.kind,
                  workloads.c.spec_version)
        .join(workloads, sa.and_(workloads.c.uid == placements.c.workload_uid,
                                 workloads.c.attempt == placements.c.attempt))
        .where(placements.c.state == "sent", placements.c.created_at < before, workloads.c.state == "placed")
        .order_by(placements.c.created_at).limit(limit))
    return list(result.all())


async def placements_on(session: AsyncSession, cluster: str, states: Sequence[str]) -> list[Any]:
    result = await session.execute(
        sa.select(placements).where(placements.c.cluster == cluster, placements.c.state.in_(states)))
    return list(result.all())


# --- events and outbox -----------------------------------------------------------------------


async def add_events(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Append history rows: workload_uid, at, type, cluster, reason, message (missing keys default)."""
    if rows:
        full = [{"workload_uid": None, "cluster": None, "reason": "", "message": "", **r} for r in rows]
        await _insert_rows(session, events, full, _INSERT_EVENTS)


async def add_outbox(session: AsyncSession, rows: Sequence[Mapping[str, Any]]) -> None:
    """Queue Commands: id, cluster, topic, payload, workload_uid, created_at.

    The caller assigns ids (see :class:`OutboxIds`), so the insert needs no RETURNING round trip, and
    the publisher can mark in-memory rows sent by id. On PostgreSQL it is one statement over one array
    per column (the payloads are bytes, which a JSON text cannot carry): an executemany built every
    row's parameters in Python, most of what queuing a Command cost the database code.
    """
    if not rows:
        return
    if _pg(session):
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
    stmt = _built(session, ("outbox_payloads",),
                  lambda pg: sa.select(outbox.c.id, outbox.c.payload).where(_in_param(pg, outbox.c.id, "ids")))
    out: dict[int, bytes] = {}
    for chunk in _chunks(session, ids):
        out.update((row.id, row.payload) for row in await session.execute(stmt, {"ids": list(chunk)}))
    return out


async def mark_sent(session: AsyncSession, ids: Sequence[int], now: datetime) -> None:
    stmt = _built(session, ("mark_sent",), lambda pg: sa.update(outbox).where(_in_param(pg, outbox.c.id, "ids"))
                  .values(sent_at=sa.bindparam("now", type_=outbox.c.sent_at.type), attempts=outbox.c.attempts + 1))
    for chunk in _chunks(session, ids):
        await session.execute(stmt, {"ids": list(chunk), "now": now})


async def purge_sent(session: AsyncSession, before: datetime) -> int:
    result = await session.execute(sa.delete(outbox).where(outbox.c.sent_at < before))
    return int(getattr(result, "rowcount", 0) or 0)


# --- clusters --------------------------------------------------------------------------------


async def upsert_cluster(session: AsyncSession, row: Mapping[str, Any]) -> None:
    """Insert or update a cluster row (every heartbeat); ``lease_until`` is never shortened."""
    cols = tuple(row)

    def build(pg: bool) -> Any:
        stmt = _insert(session, clusters).values({k: sa.bindparam(k, type_=clusters.c[k].type) for k in cols})
        set_ = {k: stmt.excluded[k] for k in cols if k != "name"}
        if "lease_until" in cols:  # the lease desk (dispatcher/clusters/leases.py) may have written a later end
            new, old = stmt.excluded.lease_until, clusters.c.lease_until
            set_["lease_until"] = sa.case((old.is_(None), new), (new.is_(None), old), (old < new, new), else_=old)
        return stmt.on_conflict_do_update(index_elements=["name"], set_=set_)
    await session.execute(_built(session, ("upsert_cluster", *cols), build), dict(row))


async def extend_lease(session: AsyncSession, name: str, until: datetime) -> bool:
    """Move ``name``'s ``lease_until`` out to ``until`` (never back); False when no such cluster row exists."""
    def build(pg: bool) -> Any:
        old, new = clusters.c.lease_until, sa.bindparam("until", type_=clusters.c.lease_until.type)
        return sa.update(clusters).where(clusters.c.name == sa.bindparam("b_name")).values(
            lease_until=sa.case((old.is_(None), new), (old < new, new), else_=old))
    result = await session.execute(_built(session, ("extend_lease",), build), {"b_name": name, "until": until})
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
        stmt = _insert(session, cluster_refusals).values(name=name, reason=reason[:64], message=message[:1000],
                                                         count=n, first_at=at, last_at=at)
        stmt = stmt.on_conflict_do_update(index_elements=["name"], set_={
            "reason": stmt.excluded.reason, "message": stmt.excluded.message, "last_at": stmt.excluded.last_at,
            "count": cluster_refusals.c.count + stmt.excluded.count})
        await session.execute(stmt)


async def list_refusals(session: AsyncSession) -> list[Any]:
    """Senders refused for not being registered clusters, newest first."""
    return list((await session.execute(sa.select(cluster_refusals).order_by(cluster_refusals.c.last_at.desc()))).all())


async def load_clusters(session: AsyncSession) -> list[Any]:
    return list((await session.execute(sa.select(clusters).order_by(clusters.c.name))).all())


# --- read-only, for mkctl --------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadHistory:
    workload: sa.Row[Any]
    placements: list[sa.Row[Any]]
    events: list[sa.Row[Any]]


async def list_clusters(session: AsyncSession) -> list[Any]:
    """Every Cluster ever heard of, by name: labels, capacity, online, last heartbeat, agent version."""
    return await load_clusters(session)


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
