"""A dispatcher started while its database is unreachable waits for it (it exited 1 with
``ConnectionRefusedError``, the chaos suite's postgres-at-start). Meanwhile it serves its probes
(alive, not ready, saying why) and logs the outage a few times, not once per attempt; when the
database comes, it checks the schema, is elected (PostgreSQL), takes its epoch and places Jobs. A
permanent configuration error still ends the start with one line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

from dispatcher import db
from dispatcher.app import Dispatcher
from dispatcher.settings import DispatcherSettings
from federation.clock import FakeClock
from federation.errors import Invalid
from federation.kube import Kube
from mkctl.errors import EXIT_USAGE, describe
from tests.conftest import postgres_available
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, settings


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def relay(port: int, to: tuple[str, int]) -> AsyncIterator[None]:
    """A TCP relay on ``port`` to ``to``: the database "comes up" when it starts listening."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*to)
        for t in (pipe(reader, up_writer), pipe(up_reader, writer)):
            task = asyncio.create_task(t)
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()


@contextlib.asynccontextmanager
async def started(s: DispatcherSettings) -> AsyncIterator[tuple[Dispatcher, asyncio.Task[None]]]:
    """A dispatcher whose ``run`` task the test watches (it must not end by itself)."""
    stop = asyncio.Event()
    async with Dispatcher(s) as d:
        task = asyncio.create_task(d.run(stop))
        try:
            yield d, task
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)


async def _ready(d: Dispatcher) -> httpx.Response:
    assert d.http is not None
    await eventually(lambda: d.http.started.is_set(), within=20, what="the HTTP server to listen")
    async with httpx.AsyncClient() as client:
        return await client.get(f"http://127.0.0.1:{d.http.port}/readyz")


def _outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("dispatcher") and r.levelno >= logging.WARNING and "database" in r.getMessage()]


async def _waits(d: Dispatcher, task: asyncio.Task[None], caplog: pytest.LogCaptureFixture) -> None:
    # several backoff rounds against the missing database (counted, not slept through)
    await eventually(lambda: d.startup.backoff.failures >= 3, within=30, what="three failed tries of the start")
    assert not task.done(), task.exception() if task.done() and not task.cancelled() else "stopped"
    not_ready = await _ready(d)
    assert not_ready.status_code == 503 and "database" in not_ready.text, not_ready.text
    assert 1 <= len(_outage_lines(caplog)) <= 3, _outage_lines(caplog)  # said, not once per attempt


@pytest.mark.skipif(not postgres_available(), reason="needs a PostgreSQL (a fresh database on the shared one)")
async def test_postgres_down_at_start_is_waited_for(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                    topic_root: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    real = make_url(db_url)
    port = _free_port()  # nothing listens here yet: connection refused, as for a database that is down
    s = settings(manager, real.set(host="127.0.0.1", port=port).render_as_string(hide_password=False),
                 mqtt_url, topic_root, api_port=0, api_host="127.0.0.1", leader_poll_seconds=0.2)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, started(s) as (d, task):
        await _waits(d, task, caplog)
        async with relay(port, (real.host or "127.0.0.1", real.port or 5432)):
            await kube.create(PYTORCHJOBS, pytorchjob("after-the-outage"), "default")
            await eventually(lambda: len(agent.places()) == 1, within=60, what="the Job placed once the database is up")
            assert d.leadership is not None and d.leadership.active
            await eventually(lambda: _ready(d), within=30, what="ready")
            assert (await _ready(d)).status_code == 200


async def test_sqlite_unreachable_at_start_is_waited_for(manager: Path, kube: Kube, mqtt_url: str, topic_root: str,
                                                         tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    path = tmp_path / "volume" / "mkd.db"
    path.mkdir(parents=True)  # the database file cannot be opened (a volume not there yet)
    url = f"sqlite+aiosqlite:///{path}"
    s = settings(manager, url, mqtt_url, topic_root, api_port=0, api_host="127.0.0.1")
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, started(s) as (d, task):
        await _waits(d, task, caplog)
        ready = tmp_path / "ready.db"  # made aside and moved in at once: no half-made file is ever seen
        await db.upgrade_async(f"sqlite+aiosqlite:///{ready}")
        path.rmdir()
        ready.rename(path)
        await kube.create(PYTORCHJOBS, pytorchjob("after-the-outage"), "default")
        await eventually(lambda: len(agent.places()) == 1, within=60, what="the Job placed once the database is up")
        assert (await _ready(d)).status_code == 200


@pytest.mark.skipif(not postgres_available(), reason="needs a PostgreSQL (the shared one, read only)")
async def test_a_refused_login_at_start_names_the_setting(manager: Path, mqtt_url: str, topic_root: str) -> None:
    """A role that does not exist is a configuration error: one line naming database_url (``mkctl``
    exits 2 on it, a usage error), not an outage waited out forever."""
    s = settings(manager, "postgresql+asyncpg://mkd-no-such-role@127.0.0.1:5432/test", mqtt_url, topic_root)
    async with Dispatcher(s) as d:
        with pytest.raises(Invalid, match=r"database_url: the database refused the dispatcher: .*mkd-no-such-role") as err:
            await asyncio.wait_for(d.run(asyncio.Event()), 30)
    assert describe(err.value) == (str(err.value), EXIT_USAGE) and "\n" not in str(err.value)


@pytest.mark.skipif(not postgres_available(), reason="needs a PostgreSQL (the shared one, read only)")
async def test_a_missing_database_at_start_says_how_to_create_it(manager: Path, mqtt_url: str,
                                                                 topic_root: str) -> None:
    """PostgreSQL creates no database on connect: the one line names the database and how to create it."""
    s = settings(manager, "postgresql+asyncpg://postgres@127.0.0.1:5432/mkd_no_such_database", mqtt_url, topic_root)
    async with Dispatcher(s) as d:
        with pytest.raises(Invalid, match=r'database_url: database "mkd_no_such_database" does not exist') as err:
            await asyncio.wait_for(d.run(asyncio.Event()), 30)
    assert "createdb" in str(err.value) and "mkctl db upgrade" in str(err.value)


async def test_the_memory_task_returns_the_c_heaps_free_pages_every_period(monkeypatch: Any) -> None:
    """After a burst of claims glibc keeps the freed heap; the ``memory`` task trims it periodically."""
    from dispatcher.replica import startup

    assert startup._malloc_trim() is not None  # this is a glibc system: the real one is found
    calls: list[int] = []
    monkeypatch.setattr(startup, "_malloc_trim", lambda: calls.append)
    clock = FakeClock()
    task = asyncio.ensure_future(startup.trim_memory(clock, every=30.0))
    await clock.wait_for_sleepers()
    assert calls == []
    clock.advance(30.0)
    await clock.wait_for_sleepers()
    clock.advance(29.0)
    await asyncio.sleep(0)
    assert calls == [0]  # once per period, not before
    clock.advance(1.0)
    await clock.wait_for_sleepers()
    assert calls == [0, 0]
    task.cancel()
    monkeypatch.setattr(startup, "_malloc_trim", lambda: None)  # not glibc: the task has nothing to do
    await asyncio.wait_for(startup.trim_memory(clock), 5)


async def test_the_memory_task_trims_once_a_burst_has_drained(monkeypatch: Any) -> None:
    """A burst of claims leaves its garbage in glibc's heap once the work it queued in memory (inbox,
    kube writer, unpublished Commands) has drained: trimmed within a poll of that, not up to 30 s later; not
    while the burst lasts, nor again while nothing happens."""
    from dispatcher.replica import startup

    calls: list[int] = []
    monkeypatch.setattr(startup, "_malloc_trim", lambda: calls.append)
    clock, waiting = FakeClock(), [0]
    task = asyncio.ensure_future(startup.trim_memory(clock, every=30.0, waiting=lambda: waiting[0], poll=2.0,
                                                     rss=lambda: 100 << 20))

    async def step(seconds: float = 2.0) -> None:
        await clock.wait_for_sleepers()
        clock.advance(seconds)
        await asyncio.sleep(0)

    waiting[0] = 40_000  # the burst: nothing trimmed while it lasts
    for _ in range(5):
        await step()
    waiting[0] = startup.DRAINED_ITEMS + 1
    await step()
    assert calls == []
    waiting[0] = startup.DRAINED_ITEMS  # drained: trimmed at the next look
    await step()
    assert calls == [0]
    await step()
    assert calls == [0]  # once per burst
    waiting[0] = startup.BURST_ITEMS - 1  # not a burst: only the period trims
    await step()
    waiting[0] = 0
    for _ in range(12):
        await step()
    assert calls == [0]  # 28 s since the last trim
    await step()
    assert calls == [0, 0]  # the period
    task.cancel()
    monkeypatch.setattr(startup, "_malloc_trim", lambda: None)  # not glibc: the task has nothing to do
    await asyncio.wait_for(startup.trim_memory(clock), 5)


async def test_the_memory_task_trims_when_the_rss_grew_while_little_waits(monkeypatch: Any) -> None:
    """A quiet dispatcher that knows 100,000 Workloads grew by ~35 MB of glibc's free memory within
    seconds at times; trimmed at the next look, not at the next period, and not while a burst's work waits."""
    from dispatcher.replica import startup

    calls: list[int] = []
    clock, waiting, rss = FakeClock(), [0], [200 << 20]

    def trim(pad: int) -> int:
        calls.append(pad)
        rss[0] -= 20 << 20  # what the trim gives back: the RSS after it is where growth counts from
        return 1
    monkeypatch.setattr(startup, "_malloc_trim", lambda: trim)
    task = asyncio.ensure_future(startup.trim_memory(clock, every=30.0, waiting=lambda: waiting[0], poll=2.0,
                                                     rss=lambda: rss[0]))

    async def step() -> None:
        await clock.wait_for_sleepers()
        clock.advance(2.0)
        await clock.wait_for_sleepers()  # it looked, and sleeps again

    await step()
    rss[0] += startup.GROWN_BYTES - 1
    await step()
    assert calls == []  # not grown enough
    rss[0] += 1
    waiting[0] = startup.DRAINED_ITEMS + 1  # grown, but work waits (a burst: its memory is in use)
    await step()
    assert calls == []
    waiting[0] = 0
    await step()
    assert calls == [0]
    rss[0] -= 10 << 20  # Python gave arenas back: growth counts from the lowest RSS seen
    await step()
    rss[0] += startup.GROWN_BYTES - 1
    await step()
    assert calls == [0]
    rss[0] += 1
    await step()
    assert calls == [0, 0]
    task.cancel()
