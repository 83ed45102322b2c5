"""A heartbeat that changes nothing but its time is not written to the cluster's row every time: with 1,000
clusters beating every 10 s that was 100 row writes a second of idle work; the lease desk still writes
every grant, and the row is written again when anything in it changes or half the timeout passed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.db import models as m
from dispatcher.db.queries import clusters as cluster_q
from federation.kube import Kube
from tests.dispatcher.harness import FakeAgent, capacity, eventually, running, settings
from tests.dispatcher.test_flow import rows


async def test_unchanged_heartbeats_renew_the_lease_without_rewriting_the_cluster_row(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[dict[str, Any]] = []
    upsert = cluster_q.upsert_clusters

    async def upserting(session: Any, rows: list[dict[str, Any]]) -> None:
        written.extend(dict(row) for row in rows)
        await upsert(session, rows)
    monkeypatch.setattr(cluster_q, "upsert_clusters", upserting)
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=30.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="64")) as agent, running(s):
        for _ in range(6):
            n = len(agent.leases)
            await agent.heartbeat()
            await eventually(lambda n=n: len(agent.leases) > n, what="a Lease for every heartbeat")  # type: ignore[misc]
        assert len(written) == 1, "only the first of six identical heartbeats is written"
        agent.cap = capacity(cpu="32")  # room changed: written at once
        n = len(agent.leases)
        await agent.heartbeat()
        await eventually(lambda: len(agent.leases) > n, what="a Lease")

        async def shows_32() -> bool:
            return [r.capacity["free"]["cpu"] for r in await rows(db_url, m.clusters)] == ["32"]
        await eventually(shows_32, what="the changed capacity in the row")
        assert len(written) == 2


async def test_a_cluster_back_from_lost_has_its_row_written_again(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=1.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await agent.heartbeat()
        await eventually(lambda: agent.leases, what="a Lease")

        async def lost() -> bool:
            return [r.lost_since is not None for r in await rows(db_url, m.clusters)] == [True]
        await eventually(lost, within=10, what="the silent cluster marked lost in its row")
        await agent.heartbeat()  # the same content as before it was lost

        async def back() -> bool:
            return [(r.lost_since, r.online) for r in await rows(db_url, m.clusters)] == [(None, True)]
        await eventually(back, within=10, what="the row says online again")


@pytest.mark.parametrize("backend", ["default", "sqlite"])
async def test_leases_and_rows_of_many_clusters_are_written_together_and_never_shortened(
        db_url: str, sqlite_url: str, backend: str) -> None:
    """The lease desk writes a turn's leases, and the engine a batch's cluster rows, in one statement each
    (on PostgreSQL; SQLite row by row): a lease end and the last heartbeat only ever move forward, and a
    cluster without a row is not granted one."""
    from datetime import UTC, datetime, timedelta

    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    from dispatcher import db

    url = db_url
    if backend == "sqlite":
        url = sqlite_url
        await db.upgrade_async(url)
    engine = create_async_engine(url)
    sessions = async_sessionmaker(engine)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    later, earlier = t0 + timedelta(seconds=40), t0 + timedelta(seconds=10)
    try:
        async with sessions.begin() as s:
            for name in ("c1", "c2", "c3"):
                await cluster_q.register_cluster(s, name, "key", t0)
        async with sessions.begin() as s:
            known = await cluster_q.extend_leases(s, {"c3": (later, t0), "c1": (later, t0), "gone": (later, t0)})
        assert known == {"c1", "c3"}
        async with sessions.begin() as s:
            heard = t0 - timedelta(seconds=5)  # an older heartbeat's grant, written late
            assert await cluster_q.extend_leases(s, {"c1": (earlier, heard), "c2": (earlier, heard)}) == {"c1", "c2"}
            row = {"labels": {"zone": "a"}, "capacity": {"free": {"cpu": "8"}}, "kinds": ["Job"], "online": True,
                   "updated_at": t0, "lost_since": None, "last_heartbeat": heard}
            await cluster_q.upsert_clusters(s, [
                {"name": "c3", **row, "lease_until": earlier}, {"name": "c2", **row, "lease_until": later},
                {"name": "c4", **row, "lease_until": None}])
        async with sessions() as s:
            got = {r.name: (r.lease_until, r.last_heartbeat, r.labels, r.capacity)
                   for r in await cluster_q.load_clusters(s)}
        assert {n: v[0] for n, v in got.items()} == {"c1": later, "c2": later, "c3": later, "c4": None}
        assert {n: v[1] for n, v in got.items()} == {"c1": t0, "c2": heard, "c3": t0, "c4": heard}
        assert got["c4"][2:] == ({"zone": "a"}, {"free": {"cpu": "8"}})
        async with sessions() as s:  # the totals the lists of clusters read, written with the capacity
            totals = {r.name: (r.allocatable, r.free) for r in await cluster_q.load_clusters(s)}
        assert totals == {"c1": ({}, {}), "c2": ({}, {"cpu": "8"}), "c3": ({}, {"cpu": "8"}), "c4": ({}, {"cpu": "8"})}
    finally:
        await engine.dispose()
