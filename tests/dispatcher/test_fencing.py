"""Fencing on the dispatcher: each heartbeat renews the agent's lease; a lost cluster's accepted Jobs
are placed elsewhere only once that lease (plus a margin) is surely over, and so are its unanswered
Places (their Accepted may have been lost); every moved attempt gets a Delete, and a returning cluster
a Resync."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from dispatcher.db import models as m
from dispatcher.engine.batch import Tick
from federation import messages
from federation.kube import Kube
from tests import keys
from tests.dispatcher.harness import (
    PYTORCHJOBS,
    FakeAgent,
    capacity,
    eventually,
    pytorchjob,
    running,
    settings,
)
from tests.dispatcher.test_flow import rows


async def test_every_heartbeat_renews_the_lease_it_names(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                        topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, lease_seconds=42.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        await agent.heartbeat()
        await eventually(lambda: agent.leases, what="a Lease for the heartbeat")
    lease = agent.leases[0]
    assert lease.seconds == 42.0 and lease.cluster == "worker-1"
    assert d.engine is not None and lease.epoch == d.engine.epoch


async def test_a_lost_cluster_keeps_its_jobs_until_its_lease_is_over_then_they_move_once(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=1.0, worker_lost_timeout_seconds=0.5,
                 lease_seconds=3.0, lease_margin_seconds=1.0, unaccepted_replace_seconds=1.0,
                 placement_retry_seconds=0.3)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="64"), beat_every=0.2) as cut, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(cpu="8"), beat_every=0.2) as other, \
            running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("accepted"), "default")
        await eventually(lambda: cut.places(), what="placed on the roomiest cluster")

        async def accepted() -> bool:
            return [p.state for p in await rows(db_url, m.placements)] == ["accepted"]
        await eventually(accepted, what="accepted")
        cut.auto_accept = False
        await kube.create(PYTORCHJOBS, pytorchjob("unanswered"), "default")
        await eventually(lambda: len(cut.places()) == 2, what="a second Place, never answered")
        cut.stop_beating()  # cut off: no heartbeat, so no renewal either
        t0 = asyncio.get_running_loop().time()
        # both wait for lease + margin after the last heartbeat (3 + 1 s), far past the worker-lost
        # timeout (0.5 s) and the unanswered one's timeout (1 s): the agent may run either
        await eventually(lambda: len(other.places()) == 2, within=15, what="both Jobs moved")
        moved = asyncio.get_running_loop().time() - t0
        assert moved >= 4.0 - 0.3, f"moved {moved:.1f}s after the last heartbeat"
        assert sorted(p.placement.attempt for p in other.places()) == [2, 2]
        # both attempts left on the cut-off cluster are fenced by a Delete it finds when it returns
        await eventually(lambda: len(cut.deletes()) == 2, what="Deletes for both moved attempts")
        n = len(cut.commands)
        await cut.heartbeat()  # the cluster returns
        await eventually(lambda: [c for c in cut.commands[n:] if isinstance(c, messages.Resync)],
                         what="a Resync for the returning cluster")
        resync = next(c for c in cut.commands[n:] if isinstance(c, messages.Resync))
        assert resync.expected == []  # both went elsewhere: the agent deletes its copies

        async def both_accepted_there() -> bool:
            return len([p for p in await rows(db_url, m.placements)
                        if p.cluster == "worker-2" and p.state == "accepted"]) == 2
        await eventually(both_accepted_there, what="both accepted on worker-2")
    ps = sorted(await rows(db_url, m.placements), key=lambda p: (p.workload_uid, p.attempt))
    assert sorted((p.cluster, p.state) for p in ps) == [("worker-1", "lost"), ("worker-1", "lost"),
                                                         ("worker-2", "accepted"), ("worker-2", "accepted")]


@pytest.mark.slow  # waits 6 s on purpose: nothing may move in that time
async def test_a_dispatcher_restarted_with_a_shorter_lease_waits_for_the_longer_one_it_granted_before(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    long = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=1.0,
                    worker_lost_timeout_seconds=0.5, lease_seconds=60.0, lease_margin_seconds=1.0,
                    placement_retry_seconds=0.3)
    short = long.model_copy(update={"lease_seconds": 1.0})
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="64"), beat_every=0.2) as cut, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(cpu="8"), beat_every=0.2) as other:
        async with running(long):
            await kube.create(PYTORCHJOBS, pytorchjob("held"), "default")

            async def accepted() -> bool:
                return [p.state for p in await rows(db_url, m.placements)] == ["accepted"]
            await eventually(accepted, what="accepted under the 60 s lease")
        cut.stop_beating()  # cut off right as the dispatcher restarts with a 1 s lease
        async with running(short):
            await asyncio.sleep(6)  # far past 1 s + margin, well inside the 60 s the agent was granted
            assert other.places() == []
    (p,) = await rows(db_url, m.placements)
    assert p.state == "accepted"


@pytest.mark.slow  # waits 5 s on purpose: nothing may move in that time
async def test_an_unanswered_place_on_a_silent_cluster_waits_for_the_lease_like_its_other_jobs(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """The lost-Accepted window: the agent applied the Place and its Accepted was lost as its
    cluster was cut off. Silence says nothing about whether it runs that copy, so the Place moves only
    once the lease is over, not after ``unaccepted_replace_seconds``; a cluster that answers is asked again."""
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=1.0, worker_lost_timeout_seconds=0.5,
                 lease_seconds=60.0, lease_margin_seconds=1.0, unaccepted_replace_seconds=1.0,
                 placement_retry_seconds=0.3)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="64"), beat_every=0.2,
                         auto_accept=False) as cut, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(cpu="8"), beat_every=0.2) as other, \
            running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("accepted-but-lost"), "default")
        await eventually(lambda: cut.places(), what="placed on the roomiest cluster")
        cut.stop_beating()  # cut off just as it applied the Place: its Accepted never arrives
        await asyncio.sleep(5)  # lost after 1 s; the old rule moved the Place 1 s later
        assert other.places() == [], "re-placed while the cut-off agent may run it (lease of 60 s)"
        (p,) = await rows(db_url, m.placements)
        assert (p.cluster, p.state) == ("worker-1", "sent")
        # the cluster speaks again and says it does not hold the job: asked again, not placed elsewhere
        n = len(cut.places())
        await cut.heartbeat()
        await cut.report(messages.Inventory(cluster="worker-1", items=[]))
        await eventually(lambda: len(cut.places()) > n, what="the Place sent again to the cluster that lacks it")
        assert other.places() == []


async def test_a_heartbeat_is_answered_while_the_engine_is_stuck_in_a_batch_and_persisted_first(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """The Lease must not wait behind a Place batch (7.5-24 s round trips at load 18-29 fenced
    healthy agents), and its end must be in ``clusters.lease_until`` before the agent can hold it."""
    s = settings(manager, db_url, mqtt_url, topic_root, lease_seconds=42.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        await agent.heartbeat()
        await eventually(lambda: agent.leases, what="the first Lease (the engine records the cluster)")
        engine = d.engine
        assert engine is not None
        stuck, release = asyncio.Event(), asyncio.Event()
        handle = engine._handle

        async def blocked(items: list[object]) -> None:  # a large Place batch that does not end
            stuck.set()
            await release.wait()
            await handle(items)  # type: ignore[arg-type]
        engine._handle = blocked  # type: ignore[method-assign,assignment]
        engine.inbox.put_nowait(Tick())
        await eventually(stuck.is_set, what="the engine inside its batch")
        desk, at_publish = d.leases, []
        assert desk is not None
        publish = desk.publish

        async def checking(topic: str, payload: bytes) -> None:  # what a standby would read at this instant
            async with engine.sessions() as sess:
                at_publish.append((await sess.execute(sa.select(m.clusters.c.lease_until)
                                                      .where(m.clusters.c.name == "worker-1"))).scalar_one())
            await publish(topic, payload)
        desk.publish = checking  # type: ignore[method-assign]
        before = len(agent.leases)
        await agent.heartbeat()
        await eventually(lambda: len(agent.leases) > before, what="a Lease while the engine is stuck")
        lease = agent.leases[-1]
        assert at_publish and at_publish[-1] is not None
        assert at_publish[-1] >= lease.heartbeat_sent_at + timedelta(seconds=lease.seconds)
        release.set()


async def test_a_heartbeat_is_answered_with_one_lease_even_when_the_engine_handles_it_first(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """The lease desk and the engine both saw every heartbeat; the engine granted unless the desk had
    already *published* its Lease, so an engine quicker than the desk's write and publish queued a second,
    identical Lease (one more outbox row and signed message per heartbeat and cluster)."""
    s = settings(manager, db_url, mqtt_url, topic_root, lease_seconds=42.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        await eventually(lambda: agent.leases, what="the first Lease (the engine records the cluster)")
        engine, desk = d.engine, d.leases
        assert engine is not None and desk is not None
        seen = engine.book.heartbeats.get("worker-1")
        publish = desk.publish
        by_desk: list[messages.Lease] = []

        async def engine_committed() -> None:
            await eventually(lambda: engine.book.heartbeats.get("worker-1") is not seen,
                             what="the engine handling the heartbeat")
            done = engine.batches
            engine.inbox.put_nowait(Tick())  # the batch holding the heartbeat has ended once one more has
            await eventually(lambda: engine.batches > done, what="the engine's batch committed")

        async def after_the_engine(topic: str, payload: bytes) -> None:  # a desk slower than the engine
            await engine_committed()
            lease = messages.decode_command(keys.unseal(payload, topic))
            assert isinstance(lease, messages.Lease)
            by_desk.append(lease)
            await publish(topic, payload)
        desk.publish = after_the_engine  # type: ignore[method-assign]
        await agent.heartbeat()
        await engine_committed()
        beat = engine.book.heartbeats["worker-1"]
        await eventually(lambda: any(lease.heartbeat_sent_at == beat.sent_at for lease in agent.leases),
                         what="a Lease for the heartbeat")
        async with engine.sessions() as sess:
            rows = (await sess.execute(sa.select(m.outbox.c.topic, m.outbox.c.payload))).all()
    queued = [messages.decode_command(keys.unseal(row.payload, row.topic)) for row in rows]
    by_engine = [c for c in queued if isinstance(c, messages.Lease) and c.heartbeat_sent_at == beat.sent_at]
    assert len(by_engine) + sum(lease.heartbeat_sent_at == beat.sent_at for lease in by_desk) == 1


@pytest.mark.parametrize("writer", ["lease desk", "engine"])
async def test_the_engine_and_the_lease_desk_lock_cluster_rows_in_one_order(db_url: str, writer: str) -> None:
    """Both write ``clusters`` rows for the heartbeats they take, each in its own transaction and one
    statement for all of them; in arrival order, one could lock worker-2 then worker-1 while the other
    locked worker-1 then worker-2, and PostgreSQL broke the deadlock by failing one of them (seen at
    start-up, when every agent beats at once). Both go by the cluster's name: while another transaction
    holds worker-1, a write of (worker-2, worker-1) waits for it holding nothing, so worker-2 stays free."""
    from datetime import UTC, datetime

    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    from dispatcher.db.queries import clusters as cluster_q

    if not db_url.startswith("postgresql"):
        pytest.skip("row locks: PostgreSQL (SQLite locks the whole database)")
    engine = create_async_engine(db_url)
    sessions = async_sessionmaker(engine)
    now = datetime.now(UTC)
    try:
        async with sessions.begin() as s:
            for name in ("worker-1", "worker-2"):
                await cluster_q.register_cluster(s, name, "key", now)
        async with sessions() as holder:
            await holder.begin()
            await holder.execute(sa.text("SELECT name FROM clusters WHERE name = 'worker-1' FOR UPDATE"))

            async def write() -> None:
                async with sessions.begin() as s:
                    if writer == "lease desk":
                        await cluster_q.extend_leases(s, {"worker-2": (now, now), "worker-1": (now, now)})
                    else:
                        await cluster_q.upsert_clusters(s, [
                            {"name": n, "labels": {}, "capacity": {}, "kinds": [], "online": True,
                             "updated_at": now, "lease_until": now} for n in ("worker-2", "worker-1")])
            task = asyncio.create_task(write())
            await asyncio.sleep(0.5)
            assert not task.done(), "the write waits for worker-1"
            await holder.execute(sa.text("SET LOCAL lock_timeout = '1s'"))
            await holder.execute(sa.text("SELECT name FROM clusters WHERE name = 'worker-2' FOR UPDATE"))
            await holder.commit()
        await asyncio.wait_for(task, 10)
        async with sessions() as s:
            leases = (await s.execute(sa.select(m.clusters.c.name, m.clusters.c.lease_until))).all()
        assert sorted(n for n, until in leases if until is not None) == ["worker-1", "worker-2"]
    finally:
        await engine.dispose()
