"""Committed Commands beyond ``outbox_memory_bytes`` wait in the database, not in memory, and still go out in order."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dispatcher.wire.freshrows import FreshRows
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings


def test_rows_past_the_byte_budget_are_queued_without_their_bytes() -> None:
    fresh = FreshRows(max_bytes=10)
    fresh.add(1, "t", b"12345", ("u1", 1))
    fresh.add(2, "t", b"123456", ("u2", 1))  # 11 bytes would be over: kept as its id alone
    fresh.add(3, "t", b"12345", None)
    assert [(r[0], r[2]) for r in fresh] == [(1, b"12345"), (2, None), (3, b"12345")]
    assert fresh.held == 10 and fresh.spilled == 1
    fresh.drop(2)
    assert [r[0] for r in fresh] == [3] and fresh.held == 5
    fresh.add(4, "t", b"12345", None)  # room again once the front was taken
    assert fresh.held == 10 and fresh.spilled == 1 and len(fresh) == 2


async def test_places_past_the_memory_budget_are_read_back_and_all_published(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    # no bytes in memory at all, and at most 3 unanswered Places: every Place waits, spilled, then is read back
    s = settings(manager, db_url, mqtt_url, topic_root, outbox_memory_bytes=0, max_unanswered_places=3)
    names = [f"spill-{i}" for i in range(12)]
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        for name in names:
            await kube.create(PYTORCHJOBS, pytorchjob(name), "default")
        await eventually(lambda: len({p.placement.workload_uid for p in agent.places()}) == len(names),
                         what="a Place for every Job", within=30)
        assert d.engine is not None
        assert d.engine.fresh.spilled >= len(names) and d.engine.fresh.held == 0
        placed = [p.manifest["metadata"]["name"] for p in agent.places()]
        assert sorted(set(placed)) == sorted(names)


class Link:
    """Stands in for the outbox's MQTT link: every publish is acknowledged at once, in order."""

    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, topic: str, payload: bytes) -> None:
        self.published.append(topic)


async def test_a_restarted_publisher_sends_its_predecessors_rows_before_its_own(db_url: str) -> None:
    """Outbox ids grow with the epoch: what the dispatcher before this one left unsent (a Place of epoch 1)
    goes before this one's fresh rows (a Delete of epoch 2 for the same attempt), never after."""
    from datetime import UTC, datetime

    from dispatcher import db
    from dispatcher.db.queries import outbox as outbox_q
    from dispatcher.settings import DispatcherSettings
    from dispatcher.wire.outbox import Publisher
    from federation.clock import SystemClock
    from tests.dispatcher.test_command_batches import W1, Recording, delete

    engine = db.make_engine(db_url)
    sessions = db.sessionmaker(engine)
    old, new = outbox_q.OutboxIds(1), outbox_q.OutboxIds(2)
    left = [old.next() for _ in range(3)]
    mine = [new.next() for _ in range(2)]
    now = datetime.now(UTC)
    try:
        async with sessions.begin() as s:
            await outbox_q.add_outbox(s, [{"id": i, "cluster": "worker-1", "topic": W1, "payload": delete(f"u{i}"),
                                    "workload_uid": f"u{i}", "created_at": now} for i in left + mine])
        fresh = FreshRows(1 << 20)
        for i in mine:
            fresh.add(i, W1, delete(f"u{i}"), None)
        seal = Recording()
        pub = Publisher(DispatcherSettings(), sessions, SystemClock(), asyncio.Event(), client_id="t", seal=seal,
                        fresh=fresh)
        link = Link()
        pub._link = link  # type: ignore[assignment]
        pub._last_mark = 0.0
        for _ in range(50):
            await pub.drain_once(link)  # type: ignore[arg-type]
            await asyncio.sleep(0.01)
            if not fresh and not pub._inflight and not pub._acked and not pub._startup:
                break
        assert [i for _, ids in seal.signed for i in ids] == left + mine
        async with sessions() as s:
            assert await outbox_q.unsent(s, 10) == []
    finally:
        await engine.dispose()


async def test_a_stopping_publisher_marks_what_the_broker_acknowledged_and_starts_nothing_more(db_url: str) -> None:
    from datetime import UTC, datetime

    from dispatcher import db
    from dispatcher.db.queries import outbox as outbox_q
    from dispatcher.settings import DispatcherSettings
    from dispatcher.wire.outbox import Publisher
    from federation.clock import SystemClock
    from tests.dispatcher.test_command_batches import W1, Recording, delete

    engine = db.make_engine(db_url)
    sessions = db.sessionmaker(engine)
    ids = outbox_q.OutboxIds(1)
    rows = [ids.next() for _ in range(3)]
    try:
        async with sessions.begin() as s:
            await outbox_q.add_outbox(s, [{"id": i, "cluster": "worker-1", "topic": W1, "payload": delete(f"u{i}"),
                                    "workload_uid": f"u{i}", "created_at": datetime.now(UTC)} for i in rows])
        fresh = FreshRows(1 << 20)
        for i in rows[:2]:
            fresh.add(i, W1, delete(f"u{i}"), None)
        pub = Publisher(DispatcherSettings(), sessions, SystemClock(), asyncio.Event(), client_id="t",
                        seal=Recording(), fresh=fresh)
        link = Link()
        pub._link = link  # type: ignore[assignment]
        pub._startup, pub._last_mark = False, 0.0
        assert await pub.drain_once(link) == 2  # type: ignore[arg-type]
        await pub.settle(5.0)  # the two publishes are acknowledged: marked sent before the process goes
        fresh.add(rows[2], W1, delete("late"), None)
        assert await pub.drain_once(link) == 0  # type: ignore[arg-type]
        async with sessions() as s:
            assert [r.id for r in await outbox_q.unsent(s, 10)] == [rows[2]]
    finally:
        await engine.dispose()


async def test_a_busy_publisher_looks_for_unsent_rows_in_the_database_once_per_poll_interval(db_url: str) -> None:
    """Each time the publisher has marked what it sent and has nothing fresh, it may look in the database
    for rows left unsent (a crash, another dispatcher's) -- rows only eligible once ``outbox_poll_seconds`` old. At
    100 Commands a second that look came ~30 times a second, a transaction each; it comes at most once per
    interval, and such a row still goes out once the interval has passed."""
    from datetime import UTC, datetime, timedelta

    from dispatcher import db
    from dispatcher.db.queries import outbox as outbox_q
    from dispatcher.settings import DispatcherSettings
    from dispatcher.wire.outbox import Publisher
    from federation.clock import FakeClock
    from tests.dispatcher.test_command_batches import W1, Recording, delete

    engine = db.make_engine(db_url)
    sessions = db.sessionmaker(engine)
    clock = FakeClock(datetime.now(UTC))
    ids = outbox_q.OutboxIds(1)
    try:
        fresh = FreshRows(1 << 20)
        seal = Recording()
        pub = Publisher(DispatcherSettings(outbox_batch_size=2), sessions, clock, asyncio.Event(), client_id="t",
                        seal=seal, fresh=fresh)
        link = Link()
        pub._link = link  # type: ignore[assignment]
        pub._startup, pub._last_mark = False, 0.0
        scans = 0
        scan = pub._scan

        async def counted(*args: object, **kwargs: object) -> list[tuple[int, str, bytes]]:
            nonlocal scans
            scans += 1
            return await scan(*args, **kwargs)  # type: ignore[arg-type]

        pub._scan = counted  # type: ignore[method-assign]

        async def one_round() -> None:  # a fresh Command committed, published, acknowledged, marked
            row = ids.next()
            async with sessions.begin() as s:
                await outbox_q.add_outbox(s, [{"id": row, "cluster": "worker-1", "topic": W1, "payload": delete(f"u{row}"),
                                        "workload_uid": f"u{row}", "created_at": clock.now()}])
            fresh.add(row, W1, delete(f"u{row}"), None)
            for _ in range(20):
                await pub.drain_once(link)  # type: ignore[arg-type]
                await asyncio.sleep(0)
                if not fresh and not pub._inflight and not pub._acked:
                    break
            await pub.drain_once(link)  # type: ignore[arg-type]  # idle: nothing fresh, nothing in flight

        for _ in range(20):
            await one_round()
            clock.advance(0.01)
        assert len(seal.signed) == 20
        assert scans <= 1
        # rows another dispatcher left, old enough: found by the next look once the interval has passed, and more
        # than a page of them (2 rows here) all go without waiting an interval per page
        others = outbox_q.OutboxIds(0)
        left = [others.next() for _ in range(5)]
        async with sessions.begin() as s:
            await outbox_q.add_outbox(s, [{"id": i, "cluster": "worker-1", "topic": W1, "payload": delete(f"left{i}"),
                                    "workload_uid": f"left{i}", "created_at": clock.now() - timedelta(seconds=60)}
                                   for i in left])
        clock.advance(DispatcherSettings().outbox_poll_seconds)
        for _ in range(30):
            await pub.drain_once(link)  # type: ignore[arg-type]
            await asyncio.sleep(0)
        assert set(left) <= {i for _, sent in seal.signed for i in sent}
        async with sessions() as s:
            assert await outbox_q.unsent(s, 10) == []
    finally:
        await engine.dispose()
