"""The one retry helper: capped exponential backoff, jitter below the base, a hint as a floor, reset."""

from __future__ import annotations

import asyncio
import random

import pytest

from federation.clock import FakeClock
from federation.retry import Backoff, capped


def test_backoff_doubles_to_its_cap_with_jitter_below_the_base_and_resets_after_success() -> None:
    b = Backoff(0.5, 4.0, jitter=0.2, rng=random.Random(7))
    delays = [b.failed() for _ in range(6)]
    bases = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert all(0.8 * base <= d <= base for d, base in zip(delays, bases, strict=True))
    b.succeeded()
    assert b.base_delay() == 0.0 and 0.4 <= b.failed() <= 0.5  # a new outage starts small again
    assert b.failed(hint=3.0) >= 3.0 and b.failed(hint=60.0) <= 4.0  # a server's hint, capped


def test_capped_counts_failures_kept_by_the_caller() -> None:
    assert [capped(n, 0.2, 5.0) for n in range(7)] == [0.0, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0]
    assert capped(1, 0.2, 5.0, hint=2.0) == 2.0 and capped(1, 0.2, 5.0, hint=30.0) == 5.0
    with pytest.raises(ValueError):
        Backoff(0, 1)


async def test_wait_sleeps_on_the_injected_clock() -> None:
    clock = FakeClock()
    b = Backoff(1.0, 8.0, jitter=0)
    waiting = asyncio.ensure_future(b.wait(clock))
    await clock.wait_for_sleepers(1)
    clock.advance(1.0)
    assert await waiting == 1.0
