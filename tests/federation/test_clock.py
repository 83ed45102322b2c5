"""The clocks' timers (``call_later``): the system clock's run on the event loop; a FakeClock's run as
``advance`` passes them, in the order due, and never before."""

from __future__ import annotations

import asyncio

from federation.clock import FakeClock, SystemClock


def test_a_fake_timer_runs_when_time_passes_it_in_order_and_not_before() -> None:
    clock = FakeClock()
    ran: list[str] = []
    clock.call_later(2.0, ran.append, "late")
    clock.call_later(1.0, ran.append, "early")
    cancelled = clock.call_later(1.5, ran.append, "cancelled")
    cancelled.cancel()
    assert clock.timers == 2
    clock.advance(0.999)
    assert ran == []
    clock.advance(1.5)
    assert ran == ["early", "late"] and clock.timers == 0


def test_a_fake_timer_set_by_a_timer_runs_in_the_same_advance_when_due() -> None:
    clock = FakeClock()
    ran: list[float] = []

    def again() -> None:
        ran.append(clock.monotonic())
        if len(ran) < 3:
            clock.call_later(0.5, again)
    clock.call_later(0.5, again)
    clock.advance(1.2)
    assert ran == [0.5, 1.0]  # each ran at its own due time; the third, due at 1.5, waits
    assert clock.monotonic() == 1.2
    clock.advance(0.3)
    assert ran == [0.5, 1.0, 1.5]


async def test_a_system_timer_runs_on_the_loop() -> None:
    done = asyncio.Event()
    SystemClock().call_later(0.01, done.set)
    await asyncio.wait_for(done.wait(), 5)
