"""Active / standby on one PostgreSQL: one replica decides, the other takes over within seconds when it
goes, and across the failover no Job is lost or placed twice; replicas never share an MQTT client id."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from dispatcher.app import Dispatcher
from dispatcher.db import models as m
from federation.kube import Kube
from tests.conftest import postgres_available
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, settings
from tests.dispatcher.test_durability import accepted
from tests.dispatcher.test_flow import rows

pytestmark = pytest.mark.skipif(not postgres_available(), reason="active/standby needs PostgreSQL "
                                "(127.0.0.1:5432 not reachable); SQLite allows one dispatcher process")


async def test_the_standby_takes_over_within_seconds_and_nothing_is_lost_or_placed_twice(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    a = settings(manager, db_url, mqtt_url, topic_root, replica_id="a", leader_poll_seconds=0.2)
    b = a.model_copy(update={"replica_id": "b"})
    stop_a, stop_b = asyncio.Event(), asyncio.Event()
    async with FakeAgent("worker-1", mqtt_url, topic_root, beat_every=0.5) as agent, \
            Dispatcher(a) as first, Dispatcher(b) as second:
        assert first.publisher is not None and second.publisher is not None
        assert first.publisher.client_id != second.publisher.client_id  # never knock each other off
        run_a = asyncio.create_task(first.run(stop_a))
        await eventually(lambda: first.engine is not None and first.engine.epoch > 0, what="a active")
        run_b = asyncio.create_task(second.run(stop_b))
        for i in range(10):
            await kube.create(PYTORCHJOBS, pytorchjob(f"before-{i}"), "default")
        await eventually(lambda: accepted(db_url, 10), within=20, what="10 accepted by a")
        assert second.engine is not None and second.engine.epoch == 0  # b stood by: decided nothing
        stop_a.set()  # a goes away (a crash closes its session the same way)
        await asyncio.wait_for(run_a, 20)
        t0 = asyncio.get_running_loop().time()
        await eventually(lambda: second.engine is not None and second.engine.epoch > first.engine.epoch,  # type: ignore[union-attr]
                         within=10, what="b takes over")
        takeover = asyncio.get_running_loop().time() - t0
        for i in range(10):
            await kube.create(PYTORCHJOBS, pytorchjob(f"after-{i}"), "default")
        await eventually(lambda: accepted(db_url, 20), within=30, what="20 accepted across the failover")
        await asyncio.sleep(0.3)  # real time: late duplicates, had there been any, land now
        stop_b.set()
        await asyncio.wait_for(run_b, 20)
    print(f"takeover {takeover:.2f}s after the active stopped")
    ws = await rows(db_url, m.workloads)
    assert len(ws) == 20 and {w.attempt for w in ws} == {1} and {w.state for w in ws} == {"running"}
    assert len(await rows(db_url, m.placements)) == 20
    places = collections.Counter((p.placement.workload_uid, p.placement.attempt) for p in agent.places())
    assert len(places) == 20  # a Place may arrive twice (at least once); never a second attempt
    assert len({p.placement.epoch for p in agent.places()}) == 2
