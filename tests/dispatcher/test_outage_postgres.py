"""A real PostgreSQL outage: a PRIVATE server (never the shared one) crashed and started again.

The dispatcher runs against it while it is down for longer than any fixed retry ladder; every Job
created meanwhile is claimed and placed exactly once after it returns, without a restart of the
engine. The errors asyncpg raises for a crashed server and a refused connection are what
:func:`dispatcher.db.database_error` must map to an outage; this test is where that is proven.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from bench.chaos.procs import PrivatePostgres, missing_binaries
from dispatcher import db
from dispatcher.db import models as m
from federation.errors import DatabaseUnavailable
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import rows

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(missing_binaries(postgres=True) is not None,
                                 reason=str(missing_binaries(postgres=True)))]


async def test_a_crashed_private_postgres_loses_nothing(manager: Path, kube: Kube, mqtt_url: str, topic_root: str,
                                                        tmp_path: Path) -> None:
    pg = PrivatePostgres(tmp_path, tmp_path)
    pg.init()
    await pg.start()
    try:
        await db.upgrade_async(pg.url)
        s = settings(manager, pg.url, mqtt_url, topic_root, outage_retry_max_seconds=0.5)
        async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
            await kube.create(PYTORCHJOBS, pytorchjob("before"), "default")
            await eventually(lambda: len(agent.places()) == 1, what="placed before the outage")
            await pg.crash()
            for i in range(5):
                await kube.create(PYTORCHJOBS, pytorchjob(f"during-{i}"), "default")
            await asyncio.sleep(5)  # intake passes the Jobs on; the engine meets the dead server
            assert len(agent.places()) == 1
            await pg.start()
            await eventually(lambda: len(agent.places()) == 6, within=30, what="every Job placed after the outage")
            assert d.supervisor is not None and d.supervisor.tasks["engine"].restarts == 0
        ws = await rows(pg.url, m.workloads)
        assert len(ws) == 6 and {w.attempt for w in ws} == {1}
        assert set(collections.Counter(p.placement.workload_uid for p in agent.places()).values()) == {1}
    finally:
        pg.service.terminate()
        if pg.own_root is not None:
            import shutil
            shutil.rmtree(pg.own_root, ignore_errors=True)


async def test_pooled_connections_after_a_restart_are_replaced_without_a_ping_per_checkout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ping at every checkout (two round trips per batch): a connection idle for a while is
    tested as it is checked out and replaced when dead, so the first statement after a restart between
    batches succeeds; a connection in use when the server went away fails its statement once, as an outage
    (``database_error``), and every older connection of the pool is replaced with it."""
    import sqlalchemy as sa

    pg = PrivatePostgres(tmp_path, tmp_path)
    pg.init()
    await pg.start()
    engine = db.make_engine(pg.url, pool_size=3)
    try:
        assert not engine.sync_engine.pool._pre_ping
        monkeypatch.setattr(db, "IDLE_PING_SECONDS", 0.5)
        async with engine.connect() as a, engine.connect() as b:  # two pooled connections
            await a.execute(sa.text("SELECT 1"))
            await b.execute(sa.text("SELECT 1"))
        await pg.crash()
        await pg.start()
        await asyncio.sleep(db.IDLE_PING_SECONDS + 0.1)  # real time: the pool's idle check reads time.monotonic, as a server restart is real
        async with engine.connect() as c:  # idle past the threshold: tested, found dead, replaced
            assert (await c.execute(sa.text("SELECT 2"))).scalar() == 2

        monkeypatch.setattr(db, "IDLE_PING_SECONDS", 3600.0)  # whatever the restart takes: "just used"
        async with engine.connect() as c:
            await c.execute(sa.text("SELECT 1"))
        await pg.crash()
        await pg.start()
        with pytest.raises(Exception) as caught:
            async with engine.connect() as c:
                await c.execute(sa.text("SELECT 3"))
        assert isinstance(db.database_error(caught.value), DatabaseUnavailable)
        async with engine.connect() as c, engine.connect() as d:  # the whole pool was replaced
            assert (await c.execute(sa.text("SELECT 4"))).scalar() == 4
            assert (await d.execute(sa.text("SELECT 5"))).scalar() == 5
    finally:
        await engine.dispose()
        pg.service.terminate()
        if pg.own_root is not None:
            import shutil
            shutil.rmtree(pg.own_root, ignore_errors=True)
