"""The SQL helpers every query module shares: dialect checks, IN lists and arrays, statements built once per dialect.

A statement the engine runs every batch is built once per dialect and session kind (``built``) and takes its values
as bound parameters; on PostgreSQL a list of values is one array parameter (``in_values``, ``in_param``), and bulk
inserts and updates of rows with JSON columns go as one JSON document (``json_insert_pg``, ``json_update_pg``,
``insert_rows``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession


def insert_for(session: AsyncSession, table: sa.Table) -> Any:
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"database dialect {name!r} is not supported (use SQLite or PostgreSQL)")


def is_pg(session: AsyncSession) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def in_values(session: AsyncSession, col: sa.ColumnElement[Any], values: Sequence[Any]) -> sa.ColumnElement[bool]:
    """``col IN values``; on PostgreSQL ``col = ANY(:array)`` so the statement text (and its prepared
    statement) is the same whatever the number of values: one round trip instead of prepare + execute."""
    if is_pg(session):
        return col == sa.any_(sa.bindparam(None, list(values), type_=postgresql.ARRAY(col.type)))
    return col.in_(list(values))


_BUILT: dict[tuple[Any, ...], Any] = {}


def built(session: AsyncSession, key: tuple[Any, ...], build: Callable[[bool], Any]) -> Any:
    """The statement ``build(pg)`` made once per dialect and ``key``: executing the same statement object
    again reuses its memoized cache key and compiled form; values travel as bound parameters.

    The statements the engine runs for every batch are built once per dialect (``built``) and take
    their values as bound parameters: building a statement and computing its cache key cost more of the
    dispatcher's CPU than running it.
    """
    pg = is_pg(session)
    full = (pg, *key)
    stmt = _BUILT.get(full)
    if stmt is None:
        if len(_BUILT) >= 1024:  # the column sets of bulk updates are few; never grow without bound
            _BUILT.clear()
        stmt = _BUILT[full] = build(pg)
    return stmt


def in_param(pg: bool, col: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool]:
    """``col IN :name`` with a list bound at execution: ``= ANY(:array)`` on PostgreSQL (one statement
    text whatever the number of values), an expanding IN elsewhere."""
    if pg:
        return col == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(col.type)))
    return col.in_(sa.bindparam(name, expanding=True))


CHUNK = 1000  # SQLite's bound-parameter limit is far above this; PostgreSQL takes one array anyway


def chunks(session: AsyncSession, values: Sequence[Any]) -> list[Sequence[Any]]:
    if is_pg(session):
        return [values] if values else []
    return [values[i:i + CHUNK] for i in range(0, len(values), CHUNK)]


def pg_type(col: sa.Column[Any]) -> str:
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


def recordset(table: sa.Table, names: Sequence[str]) -> tuple[str, list[str]]:
    """``json_to_recordset(:rows) AS v(name type, ...)`` for these columns (a name ``b_x`` is column ``x``
    as a key), and each column's value (JSON None as the JSON type stores it: ``null``, not NULL)."""
    cols = [(n, table.c[n[2:]] if n.startswith("b_") else table.c[n]) for n in names]
    source = "json_to_recordset(CAST(:rows AS json)) AS v(" + ", ".join(f"{n} {pg_type(c)}" for n, c in cols) + ")"
    values = [f"COALESCE(v.{n}, 'null'::json)" if isinstance(c.type, sa.JSON) else f"v.{n}" for n, c in cols]
    return source, values


def rows_json(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The rows as one JSON array (orjson: datetimes as RFC 3339 with their offset), or None when a value
    is not JSON (the caller then executes the statement many times, as SQLAlchemy does)."""
    try:
        return orjson.dumps(list(rows), option=orjson.OPT_NON_STR_KEYS | orjson.OPT_NAIVE_UTC).decode()
    except TypeError:  # orjson.JSONEncodeError
        return None


def json_insert_pg(table: sa.Table, names: tuple[str, ...]) -> Any:
    """``INSERT INTO table (names) SELECT ... FROM json_to_recordset(:rows)``: the rows as one JSON text
    parameter. SQLAlchemy's executemany (and asyncpg's arrays) convert every value of every row in
    Python, ~2-4 us each: most of what a batch's statements cost the dispatcher."""
    source, values = recordset(table, names)
    return sa.text(f"INSERT INTO {table.name} ({', '.join(names)}) SELECT {', '.join(values)} FROM {source}")


def json_update_pg(table: sa.Table, keys: tuple[str, ...], names: tuple[str, ...]) -> Any:
    """``UPDATE table SET c = v.c ... FROM json_to_recordset(:rows) AS v WHERE table.k = v.b_k ...
    AND table.k0 = ANY(:keys)``, ``:keys`` the rows' first key values.

    The planner cannot see how many rows a JSON parameter holds and plans for 100: joined by the keys
    alone, it hashed them and read the whole table on every statement (every batch read every placement
    ever made, tests/dispatcher/test_bulk_plans.py). ``= ANY`` over an array it counts sends it to the index
    on the first key."""
    source, values = recordset(table, (*keys, *names))
    sets = ", ".join(f"{n} = {v}" for n, v in zip(names, values[len(keys):], strict=True))
    where = " AND ".join(f"{table.name}.{k[2:]} = v.{k}" for k in keys)
    first = table.c[keys[0][2:]]
    return sa.text(f"UPDATE {table.name} SET {sets} FROM {source} WHERE {where} "
                   f"AND {table.name}.{first.name} = ANY(CAST(:keys AS {pg_type(first)}[]))")


async def insert_rows(session: AsyncSession, table: sa.Table, rows: Sequence[Mapping[str, Any]],
                       fallback: Any) -> None:
    """Insert ``rows`` (each with the same keys): one statement over a JSON text on PostgreSQL, else
    ``fallback`` executed many."""
    names = tuple(rows[0])
    text = rows_json(rows) if is_pg(session) and all(tuple(r) == names for r in rows) else None
    if text is not None:
        stmt = built(session, ("json_insert", table.name, *names), lambda pg: json_insert_pg(table, names))
        await session.execute(stmt, {"rows": text})
        return
    await session.execute(fallback, list(rows))


NO_SYNC = {"synchronize_session": False}
