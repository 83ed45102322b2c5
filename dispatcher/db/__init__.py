"""The dispatcher's database: engines, sessions and the alembic migrations run from code.

``upgrade(url)`` / ``downgrade(url, rev)`` are what ``mkctl db upgrade`` calls (synchronous; from
async code use ``upgrade_async``); ``check_current(url)`` is what the dispatcher runs before it
starts, and raises :class:`~federation.errors.Permanent` naming ``mkctl db upgrade`` when the
schema is behind. SQLite (aiosqlite) and PostgreSQL (asyncpg) are both supported; SQLite gets
WAL mode and a busy timeout so a reader never blocks the single writer. ``database_error(exc)`` is the
one place that maps SQLAlchemy's and the drivers' errors onto ``federation.errors``: an outage (retry,
however long it lasts) becomes :class:`~federation.errors.DatabaseUnavailable`, a statement that can
never succeed stays what it is; a retrying loop wraps its work in ``mapped()`` and catches that.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from federation.errors import DatabaseUnavailable, Invalid, Permanent

if TYPE_CHECKING:  # alembic is imported only to migrate: a dispatcher never needs it (~11 MB)
    from alembic.config import Config

UPGRADE_HINT = "mkctl db upgrade --database-url <url>"
_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg",
                  "postgres": "postgresql+asyncpg"}


def async_url(url: str) -> str:
    """The URL with the async driver mkd uses: ``sqlite://`` and ``postgresql://`` (as people write
    them) become ``sqlite+aiosqlite://`` and ``postgresql+asyncpg://``; other drivers are refused."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise Invalid("database_url", f"{url!r} is not a database URL",
                      fix="write sqlite+aiosqlite:///path/to/mkd.db or postgresql+asyncpg://user@host/db")
    if scheme in _ASYNC_DRIVERS.values():
        return url
    if scheme in _ASYNC_DRIVERS:
        return f"{_ASYNC_DRIVERS[scheme]}://{rest}"
    raise Invalid("database_url", f"the driver {scheme!r} is not supported",
                  fix="use sqlite+aiosqlite:// (SQLite) or postgresql+asyncpg:// (PostgreSQL)")


def json_dumps(value: Any) -> str:
    """The JSON columns' serializer: orjson (the stdlib's ``json.dumps`` was 5 % of the dispatcher's CPU),
    the same values as ``json.dumps`` wrote (compact text, non-ASCII as UTF-8 rather than escaped);
    what orjson refuses (an integer above 64 bits) still goes through ``json.dumps``."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value)


def json_loads(text: str | bytes) -> Any:
    """The JSON columns' deserializer: orjson, and the stdlib for what only it reads (NaN, huge numbers)."""
    try:
        return orjson.loads(text)
    except ValueError:  # orjson.JSONDecodeError
        return json.loads(text)


def make_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``url`` with the per-backend settings mkd relies on (JSON through orjson)."""
    url = async_url(url)
    kwargs.setdefault("json_serializer", json_dumps)
    kwargs.setdefault("json_deserializer", json_loads)
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 10)
    engine = create_async_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        ping_when_idle(engine)
    return engine


IDLE_PING_SECONDS = 1.0
"""A pooled connection unused for this long is tested as it is checked out (see ``ping_when_idle``)."""


def ping_when_idle(engine: AsyncEngine, idle_seconds: float | None = None) -> None:
    """Test a pooled connection as it is checked out only when it lay unused for ``idle_seconds``
    (default :data:`IDLE_PING_SECONDS`).

    After a PostgreSQL restart every pooled connection is dead. SQLAlchemy's ``pool_pre_ping`` tests each
    one at every checkout (asyncpg's ping is a BEGIN and a ROLLBACK: two round trips per batch, a third
    of the engine's statements when batches are small). A connection used within the last
    second is taken as alive; if the server went away since, the statement fails as a disconnect, which
    SQLAlchemy answers by replacing every connection of the pool made before it, and the engine holds
    and retries its batch as in any outage (:func:`database_error`). One that lay idle longer (the server
    may have restarted meanwhile, between batches) is tested first and, when dead, replaced before
    anything runs on it.
    """
    pool = engine.sync_engine.pool
    dialect = engine.sync_engine.dialect

    @event.listens_for(pool, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info["mkd_idle_since"] = time.monotonic()

    @event.listens_for(pool, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop("mkd_idle_since", None)
        if since is None or time.monotonic() - since < (IDLE_PING_SECONDS if idle_seconds is None else idle_seconds):
            return
        try:
            dialect.do_ping(dbapi_conn)
        except Exception as exc:  # dead, and so is the rest of the pool: all replaced, a fresh one checked out
            raise sa_exc.InvalidatePoolError(f"pooled connection failed its ping: {exc!r}") from exc


def database_error(exc: BaseException) -> DatabaseUnavailable | None:
    """``exc`` (raised by SQLAlchemy or a driver) on mkd's error tree: :class:`DatabaseUnavailable` when
    the database is unreachable or busy (an outage, a restart, a failover, a lock timeout: retrying later
    will work); None for a statement that fails on its own (a bug, a constraint), which stays as raised."""
    if isinstance(exc, DatabaseUnavailable):
        return exc
    if not _unavailable(exc):
        return None
    first = str(exc).splitlines()[0] if str(exc) else ""
    return DatabaseUnavailable(f"{type(exc).__name__}: {first}"[:300])


@contextlib.contextmanager
def mapped() -> Iterator[None]:
    """Raise a database outage inside the block as :class:`DatabaseUnavailable` (from the original);
    any other error passes unchanged. Wraps async work too (``with mapped(): await ...``)."""
    try:
        yield
    except DatabaseUnavailable:
        raise
    except Exception as exc:
        mapped_error = database_error(exc)
        if mapped_error is None:
            raise
        raise mapped_error from exc


def _unavailable(exc: BaseException) -> bool:
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated or isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
            return True
        return exc.orig is not None and exc.orig is not exc and _unavailable(exc.orig)
    # SQLAlchemy's asyncpg adapter raises its own exception with the driver's as the cause
    # ("the database system is starting up" is asyncpg's CannotConnectNowError behind it).
    cause = exc.__cause__
    if cause is not None and cause is not exc and _unavailable(cause):
        return True
    if isinstance(exc, sa_exc.DisconnectionError | sa_exc.TimeoutError | OSError | TimeoutError | ConnectionError):
        return True
    # asyncpg's own errors for a lost connection and a server shutting down or starting; imported here,
    # on an error only: a dispatcher on SQLite never loads the PostgreSQL driver
    import asyncpg

    return isinstance(exc, asyncpg.PostgresConnectionError | asyncpg.InterfaceError
                      | asyncpg.exceptions.OperatorInterventionError)


MISSING_DATABASE = "3D000"
"""PostgreSQL's SQLSTATE for a database that does not exist (``invalid_catalog_name``)."""


def missing_database_fix(exc: BaseException) -> str | None:
    """For "database X does not exist" (PostgreSQL creates no database on connect): how to create it, in
    one line; None for any other error."""
    orig = exc.orig if isinstance(exc, sa_exc.DBAPIError) and exc.orig is not None else exc
    if getattr(orig, "sqlstate", None) != MISSING_DATABASE:
        return None
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else "the database does not exist"
    name = first.split('"')[1] if first.count('"') >= 2 else "<name>"
    return (f"{first}; mkd creates its tables, not the database: create it once (createdb -h HOST -U USER {name}, "
            f"or CREATE DATABASE \"{name}\"; in psql), then run `{UPGRADE_HINT}`")


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def alembic_config() -> Config:
    from alembic.config import Config

    from migrations import DIRECTORY, INI

    cfg = Config(str(INI))
    cfg.set_main_option("script_location", str(DIRECTORY))
    return cfg


def migration_heads() -> list[str]:
    """The revisions no other migration builds on, read from the migration files' ``revision`` and
    ``down_revision`` (what alembic's ScriptDirectory finds, without importing alembic)."""
    from migrations import DIRECTORY

    revisions: set[str] = set()
    below: set[str] = set()
    for path in sorted((DIRECTORY / "versions").glob("*.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if not isinstance(target, ast.Name):
                continue
            if target.id == "revision":
                revisions.add(ast.literal_eval(value))
            elif target.id == "down_revision":
                down = ast.literal_eval(value)
                below.update([down] if isinstance(down, str) else down or ())
    return sorted(revisions - below)


def head() -> str:
    heads = migration_heads()
    if len(heads) != 1:
        raise Permanent(f"migrations have {len(heads)} heads ({heads}); merge them", reason="SchemaHeads")
    return heads[0]


async def _run(url: str, fn: Any, *args: Any) -> None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            def go(sync_conn: Connection) -> None:
                cfg = alembic_config()
                cfg.attributes["connection"] = sync_conn
                fn(cfg, *args)
            await conn.run_sync(go)
            await conn.commit()
    finally:
        await engine.dispose()


async def upgrade_async(url: str, revision: str = "head") -> None:
    from alembic import command

    await _run(url, command.upgrade, revision)


async def downgrade_async(url: str, revision: str) -> None:
    from alembic import command

    await _run(url, command.downgrade, revision)


def _sync(coro: Any) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(coro)
        return
    coro.close()
    raise RuntimeError("called from a running event loop; use upgrade_async / downgrade_async")


def upgrade(url: str, revision: str = "head") -> None:
    """Run the migrations up to ``revision`` (``mkctl db upgrade``)."""
    _sync(upgrade_async(url, revision))


def downgrade(url: str, revision: str) -> None:
    """Run the migrations down to ``revision`` (``"base"`` empties the database)."""
    _sync(downgrade_async(url, revision))


async def current_revision(url: str) -> str | None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(_current_revision)
    finally:
        await engine.dispose()


def _current_revision(conn: Connection) -> str | None:
    """alembic's version table as its MigrationContext reads it (None: no table or no row)."""
    if not sa.inspect(conn).has_table("alembic_version"):
        return None
    rows = list(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars())
    if len(rows) > 1:
        raise Permanent(f"the database's alembic_version table has {len(rows)} heads ({rows}); merge them",
                        reason="SchemaHeads")
    return str(rows[0]) if rows else None


async def check_current(url: str) -> str:
    """Return the revision if the schema is at head; else raise Permanent saying how to fix it."""
    want = head()
    have = await current_revision(url)
    if have != want:
        state = "empty (no tables)" if have is None else f"at revision {have}"
        raise Permanent(
            f"the database schema is {state}, this dispatcher needs revision {want}; "
            f"run `{UPGRADE_HINT}` first",
            reason="SchemaBehind",
        )
    return want
