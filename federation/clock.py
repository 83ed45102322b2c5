"""Time, injected: ``SystemClock`` in services, ``FakeClock`` in tests so backoff and timeouts are
checked without sleeping. Anything that waits or timestamps takes a ``Clock``.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol


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

    def call_later(self, seconds: float, callback: Callable[..., Any], *args: Any) -> Timer:
        """Call ``callback(*args)`` once ``seconds`` have passed on this clock (a timer, not a task: cheap
        enough for one per Job in a burst); on the event loop's thread."""
        ...


class Timer(Protocol):
    def cancel(self) -> None: ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def call_later(self, seconds: float, callback: Callable[..., Any], *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, seconds), callback, *args)


class FakeClock:
    """A clock that moves only when told: ``advance()`` moves time, wakes the sleepers it passed and runs
    the timers (``call_later``) that came due, in order, before it returns.

    ``sleep(0)`` (or negative) only yields to the loop, like asyncio's.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._start = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._watchers: list[asyncio.Future[None]] = []
        self._timers: list[tuple[float, int, _FakeTimer]] = []

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

    def call_later(self, seconds: float, callback: Callable[..., Any], *args: Any) -> Timer:
        timer = _FakeTimer(callback, args)
        heapq.heappush(self._timers, (self._elapsed + max(0.0, seconds), next(self._order), timer))
        return timer

    @property
    def timers(self) -> int:
        """How many timers (``call_later``) wait to come due."""
        return sum(1 for _, _, t in self._timers if not t.cancelled)

    def advance(self, seconds: float) -> None:
        """Move time forward, wake every sleeper whose deadline has passed (they run at the next yield) and
        run every timer that came due, in the order due, each with the clock at its own due time (so one a
        timer sets runs too when it is due within the advance)."""
        if seconds < 0:
            raise ValueError("a clock never goes back")
        target = self._elapsed + seconds
        while self._timers and self._timers[0][0] <= target:
            due, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._elapsed = max(self._elapsed, due)
            self._wake_sleepers()
            timer.cancelled = True
            timer.callback(*timer.args)
        self._elapsed = target
        self._wake_sleepers()

    def _wake_sleepers(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._elapsed:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)


class _FakeTimer:
    __slots__ = ("args", "callback", "cancelled")

    def __init__(self, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
