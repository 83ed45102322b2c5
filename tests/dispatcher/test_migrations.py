"""Migrations: one head, upgrade → downgrade → upgrade with data in the tables, schema equals models."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from dispatcher import db
from dispatcher.db import models as m
from federation.errors import Invalid, Permanent


def test_one_head() -> None:
    heads = ScriptDirectory.from_config(db.alembic_config()).get_heads()
    assert len(heads) == 1, heads
    assert db.migration_heads() == heads and db.head() == heads[0]  # read without alembic, the same


def test_a_dispatcher_never_imports_alembic() -> None:
    """alembic is for migrating; the dispatcher only reads the head and the version table (~11 MB)."""
    import subprocess
    import sys

    code = "import sys, dispatcher.app; print('alembic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


async def _fill(url: str) -> None:
    engine = db.make_engine(url)
    now = datetime.now(UTC)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.insert(m.workloads).values(
                uid="u1", namespace="ns", name="j", kind="PyTorchJob", api_version="kubeflow.org/v1",
                queue="default", state="pending", requests={}, podsets=[], excluded=[],
                created_at=now, updated_at=now))
            await conn.execute(sa.insert(m.placements).values(
                workload_uid="u1", attempt=1, cluster="w1", epoch=1, state="sent", created_at=now))
            await conn.execute(sa.insert(m.events).values(workload_uid="u1", at=now, type="claimed"))
            await conn.execute(sa.insert(m.outbox).values(
                cluster="w1", topic="t", payload=b"x", created_at=now))
            await conn.execute(sa.insert(m.clusters).values(
                name="w1", labels={}, capacity={}, kinds=[], online=True, updated_at=now))
            await conn.execute(sa.insert(m.dispatcher_epochs).values(origin="mkd", started_at=now))
    finally:
        await engine.dispose()


async def _diff(url: str) -> list[object]:
    engine = db.make_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c, opts={"compare_type": False}),
                                           m.metadata))
    finally:
        await engine.dispose()


async def _cycle(url: str) -> None:
    with pytest.raises(Permanent, match="mkctl db upgrade"):
        await db.check_current(url)
    await db.upgrade_async(url)
    assert await db.check_current(url) == db.head()
    assert await _diff(url) == []
    await _fill(url)
    await db.downgrade_async(url, "base")
    assert await db.current_revision(url) is None
    with pytest.raises(Permanent, match="empty"):
        await db.check_current(url)
    await db.upgrade_async(url)
    await _fill(url)
    engine = db.make_engine(url)
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(sa.select(sa.func.count()).select_from(m.workloads))).scalar() == 1
            row = (await conn.execute(sa.select(m.workloads.c.created_at))).one()
            assert row.created_at.tzinfo is not None
    finally:
        await engine.dispose()


async def test_cycle_sqlite(sqlite_url: str) -> None:
    await _cycle(sqlite_url)


async def test_cycle_database(database_url: str) -> None:
    """PostgreSQL when reachable (the fixture falls back to SQLite and says so in the header)."""
    await _cycle(database_url)


def test_sync_upgrade_refuses_inside_a_loop(sqlite_url: str) -> None:
    db.upgrade(sqlite_url)  # no loop running here: works
    assert db.head()


def test_database_urls_as_people_write_them_get_the_async_driver() -> None:
    assert db.async_url("sqlite:///state/mkd.db") == "sqlite+aiosqlite:///state/mkd.db"
    assert db.async_url("postgresql://postgres@db/mkd") == "postgresql+asyncpg://postgres@db/mkd"
    assert db.async_url("postgres://u@h/d") == "postgresql+asyncpg://u@h/d"
    assert db.async_url("postgresql+asyncpg://u@h/d") == "postgresql+asyncpg://u@h/d"
    with pytest.raises(Invalid) as err:
        db.async_url("mysql+pymysql://u@h/d")
    assert err.value.field == "database_url" and "postgresql+asyncpg" in err.value.fix
    with pytest.raises(Invalid):
        db.async_url("state/mkd.db")


async def test_outbox_payload_is_stored_uncompressed_on_postgresql(database_url: str) -> None:
    """A sealed Place is ciphertext: PostgreSQL's default storage tried to compress every one (pglz, ~a quarter
    of the outbox's cost in the server); ``EXTERNAL`` keeps it out of line without trying."""
    if not database_url.startswith("postgresql"):
        pytest.skip("storage modes are PostgreSQL's (SQLite stores the bytes as they are)")
    await db.upgrade_async(database_url)
    engine = db.make_engine(database_url)
    try:
        async with engine.connect() as conn:
            storage = (await conn.execute(sa.text(
                "SELECT attstorage::text FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'payload'"
            ))).scalar()
    finally:
        await engine.dispose()
    assert storage == "e"


async def _cluster_totals_backfilled(url: str) -> None:
    await db.upgrade_async(url, "0009")
    engine = db.make_engine(url)
    cap = {"allocatable": {"cpu": "64"}, "free": {"cpu": "60"}, "nodes": [{"name": "n1"}]}
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text(
                "INSERT INTO clusters (name, labels, capacity, kinds, online, updated_at) "
                "VALUES ('w1', '{}', :cap, '[]', true, :now), ('w2', '{}', '{}', '[]', false, :now)"),
                {"cap": json.dumps(cap), "now": datetime.now(UTC)})
    finally:
        await engine.dispose()
    await db.upgrade_async(url)
    engine = db.make_engine(url)
    try:
        async with engine.connect() as conn:
            rows = {r.name: (r.allocatable, r.free) for r in await conn.execute(
                sa.select(m.clusters.c.name, m.clusters.c.allocatable, m.clusters.c.free))}
    finally:
        await engine.dispose()
    assert rows == {"w1": ({"cpu": "64"}, {"cpu": "60"}), "w2": ({}, {})}
    await db.downgrade_async(url, "0009")
    await db.upgrade_async(url)


async def test_cluster_totals_are_filled_from_the_capacity_already_there(sqlite_url: str, database_url: str) -> None:
    """Lists of clusters read the totals' columns: the migration that adds them fills them for every row."""
    await _cluster_totals_backfilled(sqlite_url)
    await _cluster_totals_backfilled(database_url)  # PostgreSQL when reachable
