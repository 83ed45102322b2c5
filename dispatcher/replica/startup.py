"""Starting against a database that may not be there yet: every start-up step waits for it.

A dispatcher is started by a Deployment, often together with its database (a restart of both, a
node that came back, a failover of PostgreSQL). Each step of the start that reads the database —
the schema check, the cluster keys, the metrics' starting point, the leader election, the fencing
epoch and the rebuild of the in-memory view — is run by :meth:`Startup.step`: an outage
(:class:`~federation.errors.DatabaseUnavailable`, mapped by :func:`dispatcher.db.mapped`) is waited out with the one :class:`~federation.retry.Backoff`
(capped at ``outage_retry_max_seconds``), for as long as it lasts, and logged at a sane rate: one
WARNING when it starts, one a minute while it lasts, one when it ends. Anything else (a schema that
is behind, a role or database that does not exist) ends the start with that error, in one line.
Meanwhile :meth:`Startup.problem` answers the readiness probe with what the start waits for.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy import exc as sa_exc

from dispatcher.db import mapped, missing_database_fix
from federation.clock import Clock
from federation.errors import DatabaseUnavailable, Invalid
from federation.retry import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

REMIND_SECONDS = 60.0
"""While the database stays away, one line this often says the start still waits for it."""


class Stopped(Exception):
    """``stop`` was set while the start waited."""


class Startup:
    """The start-up steps' retry loop and their state for the readiness probe (module docstring)."""

    def __init__(self, clock: Clock, retry_max_seconds: float) -> None:
        self.clock = clock
        self.backoff = Backoff(min(0.2, retry_max_seconds), retry_max_seconds)
        self.doing = "starting"
        self.done = False
        self.down_since: float | None = None
        self.last_error = ""

    def problem(self) -> str | None:
        """None once started; else what the start waits for (the readiness probe's answer)."""
        if self.done:
            return None
        if self.down_since is not None:
            return (f"waiting for the database ({self.doing}) for {self.clock.monotonic() - self.down_since:.0f}s: "
                    f"{self.last_error}")
        return self.doing

    async def step(self, doing: str, fn: Callable[[], Awaitable[T]], stop: asyncio.Event) -> T:
        """Run ``fn`` until it succeeds, waiting out database outages; raises :class:`Stopped` when
        ``stop`` is set meanwhile, and any error that is not an outage."""
        self.doing = doing
        reminded = 0.0
        while True:
            if stop.is_set():
                raise Stopped(doing)
            try:
                with mapped():
                    result = await fn()
            except DatabaseUnavailable as exc:
                now = self.clock.monotonic()
                self.last_error = str(exc)
                if self.down_since is None:
                    self.down_since = reminded = now
                    log.warning("database unreachable (%s): %s; waiting for it",
                                doing, self.last_error)
                elif now - reminded >= REMIND_SECONDS:
                    reminded = now
                    log.warning("still waiting for the database after %.0fs (%s): %s", now - self.down_since, doing,
                                self.last_error)
                waits = [asyncio.ensure_future(stop.wait()),
                         asyncio.ensure_future(self.clock.sleep(self.backoff.failed()))]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                continue
            except Exception as exc:
                final = permanent(exc)
                if final is exc:
                    raise
                raise final from exc
            self.backoff.succeeded()
            if self.down_since is not None:
                log.warning("database reachable after %.1fs; carrying on with the start (%s)",
                            self.clock.monotonic() - self.down_since, doing)
                self.down_since = None
            return result


def permanent(exc: Exception) -> Exception:
    """A database error at start-up that waiting cannot fix, as the one-line error the CLI prints:
    mkd's own errors as they are; a refused login, a missing database or role names the setting."""
    missing = missing_database_fix(exc)
    if missing is not None:
        return Invalid("database_url", missing)
    if isinstance(exc, sa_exc.DBAPIError):
        orig = exc.orig if exc.orig is not None else exc
        first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
        return Invalid("database_url", f"the database refused the dispatcher: {first}",
                       fix="check --database-url / MKD_DISPATCHER_DATABASE_URL (host, database, user, password)")
    return exc


TRIM_SECONDS = 30.0
"""How often the ``memory`` task gives the C allocator's free memory back (:func:`trim_memory`)."""
BURST_ITEMS = 1000
"""Work waiting in memory (``trim_memory``'s ``waiting``) that makes a burst: once it has drained, trim."""
DRAINED_ITEMS = 200
"""Work still waiting when a burst counts as over: a quiet dispatcher's inbox, kube writer and outbox hold a few
dozen items each (heartbeats, late answers, the last Places within the agents' unanswered budget)."""
POLL_SECONDS = 2.0
"""How often the ``memory`` task looks at the work waiting and the RSS."""
GROWN_BYTES = 16 * 1024 * 1024
"""RSS grown since the last trim that is trimmed at once while little waits (``trim_memory``)."""
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    return trim


def resident_bytes() -> int:
    """This process's resident set size (0 where ``/proc`` is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return 0


async def trim_memory(clock: Clock, every: float = TRIM_SECONDS, *, waiting: Callable[[], int] | None = None,
                      poll: float = POLL_SECONDS, rss: Callable[[], int] = resident_bytes) -> None:
    """Every ``every`` seconds, glibc's ``malloc_trim(0)``: return the free pages of its heap to the system;
    and, when ``waiting`` is given, within ``poll`` seconds of a burst's end or of the RSS growing by
    ``GROWN_BYTES`` while little waits.

    glibc keeps what Python frees of its larger blocks (over 512 bytes: sealed Commands of 2 KiB, list
    pages, dict tables) for reuse and never shrinks the heap below the highest block still in use, so a
    dispatcher's RSS stays at the peak of a burst of claims long after (165 -> 147 MB at 20,000
    Workloads once the Places were published). A trim takes milliseconds; a no-op on other C libraries.

    ``waiting`` counts the work a burst leaves in memory (the engine's inbox, the kube writer's backlog, the
    committed Commands not yet published): once it held ``BURST_ITEMS`` and has drained to ``DRAINED_ITEMS``,
    the burst's garbage is free and the trim comes at once, not up to ``every`` seconds later (100,000
    claims leave ~20-30 MB in glibc's heap). During a burst nothing is trimmed that the burst would
    take back from the system moments later. A dispatcher that knows 100,000 Workloads and has little to do
    still grew by ~35 MB of glibc's free memory within seconds at times (its periodic work; what allocated
    it was not found): that is given back as soon as it is seen (``rss``), not at the next period."""
    trim = _malloc_trim()
    if trim is None:
        return
    last, peak, base = clock.monotonic(), 0, rss()
    while True:
        await clock.sleep(every if waiting is None else min(poll, every))
        now = waiting() if waiting is not None else 0
        peak = max(peak, now)
        quiet = now <= DRAINED_ITEMS
        grown = False
        if waiting is not None:
            resident = rss()
            base = min(base, resident)  # (Python gives its emptied arenas back itself)
            grown = quiet and resident - base >= GROWN_BYTES
        if (peak >= BURST_ITEMS and quiet) or grown or clock.monotonic() - last >= every:
            trim(0)
            last, peak, base = clock.monotonic(), now, rss()
