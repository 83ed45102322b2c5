"""federation.tasks: named tasks, failure logging, restart with backoff, staged shutdown; FakeClock."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from datetime import UTC, datetime

import pytest

from federation.clock import FakeClock, SystemClock
from federation.tasks import Supervisor, install_signal_handlers

TIMEOUT = 5.0


class Boom(Exception):
    pass


async def test_stop_event_cancels_tasks_and_returns() -> None:
    stop = asyncio.Event()
    cancelled: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.append(name)

    async with Supervisor(grace=1) as sup:
        sup.start("a", lambda: forever("a"))
        sup.start("b", lambda: forever("b"))
        assert set(sup.tasks) == {"a", "b"}
        stop.set()
        await asyncio.wait_for(sup.run_until_stopped(stop), TIMEOUT)
    assert sorted(cancelled) == ["a", "b"]
    assert all(i.task.done() for i in sup.tasks.values())


async def test_failing_root_task_is_logged_at_once_and_reraised() -> None:
    stop = asyncio.Event()
    other_cancelled = asyncio.Event()
    failing_now = asyncio.Event()

    async def fails() -> None:
        await failing_now.wait()
        raise Boom("disk on fire")

    async def other() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            other_cancelled.set()

    logged = asyncio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == "task fails failed":
                assert not other_cancelled.is_set()  # logged when it fails, before shutdown starts
                logged.set()

    handler = Seen()
    logging.getLogger("federation.tasks").addHandler(handler)
    try:
        with pytest.raises(Boom, match="disk on fire"):
            async with Supervisor(grace=1) as sup:
                sup.start("fails", fails)
                sup.start("other", other)
                runner = asyncio.ensure_future(sup.run_until_stopped(stop))
                failing_now.set()
                await asyncio.wait_for(logged.wait(), TIMEOUT)
                await asyncio.wait_for(runner, TIMEOUT)
    finally:
        logging.getLogger("federation.tasks").removeHandler(handler)
    assert other_cancelled.is_set() and sup.failed
    assert not stop.is_set()


async def test_straggler_gets_grace_then_is_abandoned(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    cleanup_started = asyncio.Event()

    async def slow_cleanup() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cleanup_started.set()
            await asyncio.Event().wait()  # never finishes its cleanup on its own

    caplog.set_level(logging.ERROR, "federation.tasks")
    async with Supervisor(grace=0.05) as sup:
        sup.start("slow", slow_cleanup)
        stop.set()
        await asyncio.wait_for(sup.run_until_stopped(stop), TIMEOUT)
    assert cleanup_started.is_set()
    assert "abandoning: slow" in caplog.text


async def test_clean_cleanup_within_grace_is_not_a_straggler(caplog: pytest.LogCaptureFixture) -> None:
    finished = asyncio.Event()

    async def tidy() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # a short cleanup
            finished.set()
            raise

    caplog.set_level(logging.ERROR, "federation.tasks")
    async with Supervisor(grace=2) as sup:
        sup.start("tidy", tidy)
        await asyncio.sleep(0)
    assert finished.is_set() and "abandoning" not in caplog.text


async def test_restart_with_backoff_on_fake_clock() -> None:
    clock = FakeClock()
    runs: list[float] = []
    healthy = asyncio.Event()

    async def flaky() -> None:
        runs.append(clock.monotonic())
        if len(runs) <= 3:
            raise Boom(f"run {len(runs)}")
        healthy.set()
        await asyncio.Event().wait()

    async with Supervisor(clock=clock, restart_initial=1, restart_max=30) as sup:
        sup.start("flaky", flaky, restart=True)
        for delay in (1, 2, 4):
            await asyncio.wait_for(clock.wait_for_sleepers(), TIMEOUT)
            clock.advance(delay)
        await asyncio.wait_for(healthy.wait(), TIMEOUT)
        assert sup.tasks["flaky"].restarts == 3
        assert isinstance(sup.tasks["flaky"].last_error, Boom)
        assert not sup.failed
    assert runs == [0, 1, 3, 7]


async def test_body_error_wins_over_task_error() -> None:
    async def fails() -> None:
        raise Boom("task")

    with pytest.raises(KeyError):
        async with Supervisor(grace=1) as sup:
            sup.start("fails", fails)
            await asyncio.sleep(0)
            raise KeyError("body")


async def test_start_rules() -> None:
    sup = Supervisor()
    with pytest.raises(RuntimeError, match="before"):
        sup.start("x", asyncio.sleep)  # type: ignore[arg-type]
    async with sup:
        sup.start("x", lambda: asyncio.Event().wait())  # type: ignore[arg-type,return-value]
        with pytest.raises(RuntimeError, match="already running"):
            sup.start("x", lambda: asyncio.Event().wait())  # type: ignore[arg-type,return-value]
    with pytest.raises(RuntimeError, match="shutting down"):
        sup.start("y", lambda: asyncio.Event().wait())  # type: ignore[arg-type,return-value]


async def test_sigterm_sets_stop() -> None:
    stop = asyncio.Event()
    remove = install_signal_handlers(stop)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), TIMEOUT)
    finally:
        remove()
    assert stop.is_set()


async def test_fake_clock_sleep_wakes_only_on_advance() -> None:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    woke: list[str] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper("short", 1)), asyncio.create_task(sleeper("long", 10))]
    await asyncio.wait_for(clock.wait_for_sleepers(2), TIMEOUT)
    clock.advance(0.5)
    await asyncio.sleep(0)
    assert woke == []
    clock.advance(0.5)
    await asyncio.wait_for(tasks[0], TIMEOUT)
    assert woke == ["short"] and clock.now() == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    clock.advance(100)
    await asyncio.wait_for(tasks[1], TIMEOUT)
    assert woke == ["short", "long"] and clock.monotonic() == 101
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert SystemClock().now().tzinfo is UTC


async def test_a_permanent_error_stops_the_service_in_one_line_instead_of_restarting_forever(
        caplog: pytest.LogCaptureFixture) -> None:
    from federation.errors import Permanent

    runs = 0

    async def misconfigured() -> None:
        nonlocal runs
        runs += 1
        raise Permanent("MQTT url 'ftp://h': the scheme must be mqtt:// or mqtts://", reason="BadSettings")
    with pytest.raises(Permanent, match="scheme"):
        async with Supervisor() as sup:
            sup.start("mqtt", misconfigured, restart=True)
            await sup.run_until_stopped(asyncio.Event())
    assert runs == 1  # not retried
    lines = [r for r in caplog.records if r.name == "federation.tasks" and "scheme" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None  # one line, no traceback


async def test_a_failing_short_lived_task_is_logged_counted_and_handed_to_its_owner(
        caplog: pytest.LogCaptureFixture) -> None:
    """Per-item tasks (a Command applied, a publish in flight) are made by a TaskSet: a crash is never
    dropped silently (a bare create_task only says "exception was never retrieved", if ever)."""
    caplog.set_level(logging.ERROR, logger="federation.tasks")
    handed: list[tuple[str, BaseException]] = []

    async def boom() -> None:
        raise ValueError("bad item")

    async def fine() -> int:
        return 7

    async with Supervisor() as sup:
        sup.start("owner", lambda: asyncio.Event().wait())
        items = sup.task_set("owner", on_error=lambda name, exc: handed.append((name, exc)))
        assert await items.spawn(fine(), name="ok") == 7
        with pytest.raises(ValueError):
            await items.spawn(boom(), name="item-1")
        await asyncio.sleep(0)  # the done callback runs
        assert items.failures == 1 and sup.tasks["owner"].child_failures == 1
        assert [(n, str(e)) for n, e in handed] == [("owner/item-1", "bad item")]
        assert any("task owner/item-1 failed" in r.getMessage() and r.exc_info for r in caplog.records)
        # without on_error the owner's loop finds it with check()
        plain = sup.task_set("owner")
        plain.spawn(boom(), name="item-2")
        await plain.wait()
        with pytest.raises(ValueError, match="bad item"):
            plain.check()
        plain.check()  # raised once
        slow = plain.spawn(asyncio.sleep(60), name="slow")
        await plain.cancel_all()
        assert slow.cancelled() and len(plain) == 0 and plain.failures == 1  # a cancel is not a failure


async def test_wake_first_sets_the_first_waiter_still_waiting_and_says_when_none_was() -> None:
    import collections

    from federation.tasks import wake_first

    loop = asyncio.get_running_loop()
    cancelled, first, second = loop.create_future(), loop.create_future(), loop.create_future()
    cancelled.cancel()
    waiters = collections.deque([cancelled, first, second])
    assert wake_first(waiters)
    assert first.done() and not second.done() and list(waiters) == [second]
    assert wake_first(waiters) and second.done()
    assert not wake_first(waiters)


async def test_side_work_that_is_forbidden_degrades_says_so_once_and_retries_with_backoff(
        caplog: pytest.LogCaptureFixture) -> None:
    from federation.errors import Forbidden

    clock = FakeClock()
    runs: list[float] = []
    allowed = asyncio.Event()
    healthy = asyncio.Event()

    async def write_status() -> None:
        runs.append(clock.monotonic())
        if not allowed.is_set():
            raise Forbidden('clusterqueues.kueue.x-k8s.io "a" is forbidden', verb="patch", group="kueue.x-k8s.io",
                            resource="clusterqueues/status")
        sup.side.ok("queues/status")
        healthy.set()
        await asyncio.Event().wait()

    async with Supervisor(clock=clock, restart_initial=1, restart_max=30) as sup:
        sup.start("queues/status", write_status, side=True)
        for delay in (1, 2, 4):
            await asyncio.wait_for(clock.wait_for_sleepers(), TIMEOUT)
            clock.advance(delay)
        await asyncio.wait_for(clock.wait_for_sleepers(), TIMEOUT)
        assert not sup.failed  # a 403 in side work never stops the service
        [fault] = sup.side.of("queues/status")
        assert fault.cause == "forbidden: patch clusterqueues/status in API group kueue.x-k8s.io"
        assert fault.failures == 4 and sup.side.failures[("queues/status", fault.cause)] == 4
        assert 'resources: ["clusterqueues/status"], verbs: ["patch"]' in sup.side.problems()[0]
        allowed.set()
        clock.advance(8)
        await asyncio.wait_for(healthy.wait(), TIMEOUT)
        assert sup.side.problems() == []
    assert runs == [0, 1, 3, 7, 15]
    said = [r for r in caplog.records if "is degraded" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is None


async def test_side_work_restarted_and_clean_for_its_restart_window_is_no_longer_degraded(
        caplog: pytest.LogCaptureFixture) -> None:
    """Side work that failed, was restarted and has run without failing for ``restart_max`` (the window after
    which a run counts as a fresh start) is healthy again, whether or not it says so itself: /readyz and the
    ``mkd_side_work_degraded`` gauge read ``SideWork``, so a fault left there would say degraded for ever."""
    clock = FakeClock()
    runs: list[float] = []
    running = asyncio.Event()

    async def work() -> None:
        runs.append(clock.monotonic())
        if len(runs) == 1:
            raise Boom("once")
        running.set()
        await asyncio.Event().wait()

    async with Supervisor(clock=clock, restart_initial=1, restart_max=30) as sup:
        sup.start("events", work, side=True)
        await asyncio.wait_for(clock.wait_for_sleepers(), TIMEOUT)
        assert [f.cause for f in sup.side.of("events")] == ["Boom"]
        clock.advance(1)
        await asyncio.wait_for(running.wait(), TIMEOUT)
        clock.advance(29)
        assert sup.side.problems() != []  # not yet a whole window
        clock.advance(1)
        assert sup.side.problems() == []
        assert [m.samples for m in sup.side.collect() if m.name == "mkd_side_work_degraded"] == [[]]
        assert sup.side.failures[("events", "Boom")] == 1  # the count of failures stays
    assert runs == [0, 1]
    assert [r for r in caplog.records if "recovered" in r.getMessage()]


async def test_side_work_that_fails_again_within_its_window_stays_degraded() -> None:
    clock = FakeClock()
    runs: list[float] = []

    async def work() -> None:
        runs.append(clock.monotonic())
        await clock.sleep(10)
        raise Boom(f"run {len(runs)}")

    async with Supervisor(clock=clock, restart_initial=1, restart_max=30) as sup:
        sup.start("events", work, side=True)
        for _ in range(6):
            await asyncio.wait_for(clock.wait_for_sleepers(), TIMEOUT)
            clock.advance(10)
            await asyncio.wait_for(clock.wait_for_sleepers(), TIMEOUT)
            assert sup.side.of("events")  # every run fails within 30 s of its start
            clock.advance(max(1.0, min(30.0, 2.0 ** (len(runs) - 1))))
    assert sup.side.failures[("events", "Boom")] >= 5
