"""Waiting in tests for something that happens on its own time (a watch event, a controller, a broker):
``eventually`` polls a condition until it holds, or fails naming it; ``settled`` lets in-memory work run
to rest without real time. Where the code under test takes a clock, tests drive a ``FakeClock`` instead."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


async def eventually(predicate: Callable[[], Any], within: float = 10.0, what: str = "condition") -> Any:
    """Poll ``predicate`` (sync or async) until truthy and return its value; fail after ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.02)


async def settled(rounds: int = 100) -> None:
    """Let every task that can run without a timer or I/O run as far as it goes (``rounds`` turns of the event
    loop): in-memory work a test starts is then done, and what it must not do has had every chance to."""
    for _ in range(rounds):
        await asyncio.sleep(0)
