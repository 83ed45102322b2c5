"""A batch held through a database outage, decided when the database is back: nothing it decided may be
lost or left ahead of the database.

These tests drive the engine's ``handle`` directly with a :class:`~federation.clock.FakeClock` against the
real database and a kubesim manager: the fault is injected at the exact point (the batch's commit fails as a
dead server's does), and time passes only when the test moves it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy.exc

from dispatcher.app import Dispatcher
from dispatcher.db import models as m
from dispatcher.engine.batch import JobChange, ReportIn, Tick
from dispatcher.engine.loop import Engine
from dispatcher.settings import DispatcherSettings
from federation import messages
from federation.clock import FakeClock
from federation.kinds.registry import by_name
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, capacity, pytorchjob, settings
from tests.dispatcher.test_flow import rows

PYTORCH = by_name("PyTorchJob")
TIMEOUT = 6.0  # the chaos suite's heartbeat_timeout_seconds


class FailingCommit:
    """Wraps the engine's session factory: while ``armed``, a batch's transaction fails at its commit as
    it does when PostgreSQL goes away during the batch (everything before the commit has run)."""

    def __init__(self, engine: Engine) -> None:
        self.real = engine.sessions
        self.armed = False
        self.failed = 0
        engine.sessions = self  # type: ignore[assignment]

    def __call__(self) -> Any:
        return self.real()

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[Any]:
        async with self.real.begin() as s:
            yield s
            if self.armed:
                self.failed += 1
                raise sqlalchemy.exc.OperationalError(
                    "COMMIT", {}, ConnectionResetError(104, "Connection reset by peer"))


@contextlib.asynccontextmanager
async def engine_of(s: DispatcherSettings, clock: FakeClock) -> AsyncIterator[Engine]:
    """A dispatcher's engine as its start leaves it (epoch taken, view rebuilt before intake's first list);
    no task runs: the test hands it its batches. Open mode (no Kueue objects), listed."""
    async with Dispatcher(s, clock=clock) as d:
        assert d.engine is not None
        await d.engine.identity.refresh(d._sessions, clock.now())
        await d.engine.start()
        d.engine.queueing.catalog.ready = True
        yield d.engine


def heartbeat(clock: FakeClock, cluster: str = "worker-1", online: bool = True) -> ReportIn:
    hb = messages.Heartbeat(cluster=cluster, online=online, capacity=capacity(), agent_version="fake",
                            interval_seconds=2.0, sent_at=clock.now())
    return ReportIn(hb, clock.now())


async def held(engine: Engine, fault: FailingCommit, clock: FakeClock, items: list[Any], seconds: float) -> None:
    """``engine`` decides ``items``; the commit fails for ``seconds`` (an outage), then succeeds."""
    fault.armed = True
    task = asyncio.create_task(engine.handle(items))
    down = 0.0
    while down < seconds:
        await clock.wait_for_sleepers()  # the batch is held: riding the outage out
        clock.advance(0.5)
        down += 0.5
    assert fault.failed >= 2 and not task.done()
    fault.armed = False  # the database is back: the next try (running now, or after its backoff) commits
    while not task.done():
        sleeping = asyncio.ensure_future(clock.wait_for_sleepers())
        await asyncio.wait({task, sleeping}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        sleeping.cancel()
        clock.advance(engine.settings.outage_retry_max_seconds)
    await task


async def states(db_url: str, prefix: str) -> dict[str, tuple[str, int]]:
    return {w.name: (w.state, w.attempt) for w in await rows(db_url, m.workloads) if w.name.startswith(prefix)}


async def test_claims_held_through_an_outage_at_start_up_are_placed_once_the_clusters_beat_again(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """PostgreSQL goes down during a restarted dispatcher's first batch (intake's first list: every known Job
    and the claims, behind the agents' heartbeats) and the batch is held longer than the heartbeat timeout.
    Decided with the heartbeats it held, every cluster would look silent and the claims be set aside "for
    capacity"; the agents' next heartbeats bring the same figures, the capacity book sees no change, and a
    Workload set aside is only tried again on a change, so the Jobs would stay pending (attempt 0, no Place).
    They are placed once the clusters beat again.
    """
    clock = FakeClock(datetime.now(UTC))
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=TIMEOUT, placement_retry_seconds=2.0)
    old = [await kube.create(PYTORCHJOBS, pytorchjob(f"old-{i}", workers=0), "default") for i in range(20)]
    async with engine_of(s, clock) as first:  # an earlier dispatcher placed these
        await first.handle([heartbeat(clock), *(JobChange(PYTORCH, j) for j in old)])
    assert set((await states(db_url, "old-")).values()) == {("placed", 1)}
    new = [await kube.create(PYTORCHJOBS, pytorchjob(f"new-{i}", workers=0), "default") for i in range(24)]
    clock.advance(30)
    async with engine_of(s, clock) as engine:  # restarted: its first batch is intake's first list
        fault = FailingCommit(engine)
        first_batch = [heartbeat(clock), *(JobChange(PYTORCH, j) for j in old + new)]
        await held(engine, fault, clock, first_batch, seconds=TIMEOUT + 0.6)  # PostgreSQL down 6.6 s
        # the heartbeats that waited meanwhile (the same figures), and the ticker, a few times
        for _ in range(3):
            clock.advance(s.placement_retry_seconds)
            await engine.handle([heartbeat(clock), Tick()])
        got = await states(db_url, "new-")
    assert got == {f"new-{i}": ("placed", 1) for i in range(24)}, got


async def test_a_cluster_silent_past_the_timeout_takes_what_waited_for_it_when_it_beats_again(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """No outage: the one cluster went silent; a Job claimed then waits ("no worker cluster is online");
    the cluster beats again with the same figures and the Job is placed there."""
    clock = FakeClock(datetime.now(UTC))
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=TIMEOUT, placement_retry_seconds=2.0)
    async with engine_of(s, clock) as engine:
        await engine.handle([heartbeat(clock)])
        clock.advance(TIMEOUT + 1)
        job = await kube.create(PYTORCHJOBS, pytorchjob("waits", workers=0), "default")
        await engine.handle([JobChange(PYTORCH, job), Tick()])
        (w,) = await rows(db_url, m.workloads)
        assert (w.state, w.attempt) == ("pending", 0) and "no worker cluster is online" in w.reason, w.reason
        clock.advance(s.placement_retry_seconds)
        await engine.handle([heartbeat(clock), Tick()])
        clock.advance(s.placement_retry_seconds)
        await engine.handle([heartbeat(clock), Tick()])
    (w,) = await rows(db_url, m.workloads)
    assert (w.state, w.attempt, w.cluster) == ("placed", 1, "worker-1"), w.reason



# --- what a batch that failed must not leave ahead of the database -----------------------------------------


async def test_a_cluster_found_silent_by_a_held_batch_is_recorded_lost_when_the_batch_is_decided(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """The failed try marked the cluster lost in memory only; the try that commits must write it (the
    admin views, ``mkctl clusters``, a standby that takes over read ``lost_since``) and its history row."""
    clock = FakeClock(datetime.now(UTC))
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=TIMEOUT)
    async with engine_of(s, clock) as engine:
        await engine.handle([heartbeat(clock)])
        clock.advance(TIMEOUT + 1)
        await held(engine, FailingCommit(engine), clock, [Tick()], seconds=2.0)
    (c,) = await rows(db_url, m.clusters)
    assert c.lost_since is not None
    assert [e.reason for e in await rows(db_url, m.events) if e.type == "cluster_lost"] == ["HeartbeatTimeout"]


async def test_a_will_message_in_a_held_batch_is_recorded_as_in_a_batch_that_never_failed(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """The failed try recorded the heartbeat in the capacity book; the try that commits must still see
    the change it brings (the cluster went offline: lost since then, a history row)."""
    clock = FakeClock(datetime.now(UTC))
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=TIMEOUT)
    async with engine_of(s, clock) as engine:
        fault = FailingCommit(engine)
        await held(engine, fault, clock, [heartbeat(clock)], seconds=1.0)  # the cluster's first heartbeat
        clock.advance(1)
        await held(engine, fault, clock, [heartbeat(clock, online=False)], seconds=1.0)
    (c,) = await rows(db_url, m.clusters)
    assert c.online is False and c.lost_since is not None
    assert [(e.type, e.reason) for e in await rows(db_url, m.events) if e.type.startswith("cluster_")] == [
        ("cluster_online", ""), ("cluster_lost", "Offline")]


async def test_why_a_workload_waits_is_written_by_the_batch_that_is_decided(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """The failed try's pass noted the reason as shown; the try that commits must write it (the
    Workload's reason, its history row, and the Job's condition)."""
    clock = FakeClock(datetime.now(UTC))
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with engine_of(s, clock) as engine:  # no cluster yet: the Job waits
        job = await kube.create(PYTORCHJOBS, pytorchjob("waits", workers=0), "default")
        await held(engine, FailingCommit(engine), clock, [JobChange(PYTORCH, job)], seconds=1.0)
    (w,) = await rows(db_url, m.workloads)
    assert w.state == "pending" and "no worker cluster is known yet" in w.reason, w.reason
    assert [e.type for e in await rows(db_url, m.events, workload_uid=w.uid)] == ["claimed", "pending"]
