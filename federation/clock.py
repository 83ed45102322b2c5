"""Time, injected: ``SystemClock`` in services, ``FakeClock`` in tests so backoff and timeouts are
checked without sleeping. Anything that waits or timestamps takes a ``Clock``.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


def rfc3339(at: datetime) -> str:
    """metav1.Time's wire form: seconds precision, ``Z``. The last few are remembered: a reconcile pass or a
    dispatcher batch stamps one ``now`` on many conditions."""
    return _rfc3339(at, at.utcoffset())


@functools.lru_cache(maxsize=16)
def _rfc3339(at: datetime, offset: object) -> str:
    # ``offset`` keeps apart equal instants in other zones, which format differently
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


class Clock(Protocol):
    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin, never going backwards; for durations."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told: ``advance()`` moves time and wakes the sleepers it passed.

    ``sleep(0)`` (or negative) only yields to the loop, like asyncio's.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._start = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._watchers: list[asyncio.Future[None]] = []

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def monotonic(self) -> float:
        return self._elapsed

    @property
    def sleepers(self) -> int:
        """How many coroutines are waiting in ``sleep`` now (lets a test wait until one is parked)."""
        return sum(1 for _, _, fut in self._sleepers if not fut.done())

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._elapsed + seconds, next(self._order), fut))
        watchers, self._watchers = self._watchers, []
        for w in watchers:
            if not w.done():
                w.set_result(None)
        await fut

    async def wait_for_sleepers(self, count: int = 1) -> None:
        """Return once at least ``count`` coroutines are parked in ``sleep`` (tests: "it is waiting now")."""
        while self.sleepers < count:
            watcher: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._watchers.append(watcher)
            await watcher

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed (they run at the next yield)."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        self._elapsed += seconds
        while self._sleepers and self._sleepers[0][0] <= self._elapsed:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
