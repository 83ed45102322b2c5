"""Active / standby: one dispatcher of a federation decides, the others wait to take over.

On PostgreSQL the active one holds a session-level advisory lock (key derived from ``origin``) on a connection
of its own; the lock is the lease. A standby tries to take it every ``leader_poll_seconds``. The lock goes
with the active's session: at once when its process dies (the socket closes), within
``leader_idle_timeout_seconds`` when it hangs (``idle_session_timeout`` ends a session that stopped sending
its checks), after TCP keepalive when the network to it is cut. The active checks its session every
``leader_poll_seconds``; when the session is gone it takes the lock again on a new one, and only if another
replica holds it by then does it step down (:class:`LeadershipLost`, the process exits and restarts as a
standby). While the database is unreachable nobody can decide anything, so the active keeps trying rather than
stepping down.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from dispatcher.db import mapped
from dispatcher.settings import DispatcherSettings
from federation.clock import Clock
from federation.errors import DatabaseUnavailable, Permanent

log = logging.getLogger(__name__)


class LeadershipLost(Permanent):
    """Another replica holds the lock now: this one must stop deciding."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="LeadershipLost")


def lock_key(origin: str) -> int:
    """A stable signed 64-bit advisory-lock key for one federation (origin)."""
    return int.from_bytes(hashlib.sha256(f"mkd-dispatcher-leader/{origin}".encode()).digest()[:8], "big", signed=True)


class Leadership:
    """See the module docstring. ``acquire`` waits until active; ``hold`` runs while active.

    Exactly-once does not rest on the lock: claims and placements are compare-and-set in SQL, every
    Command carries the sender's epoch (a new dispatcher takes a higher one, agents refuse older ones),
    so the brief overlap when a hung active wakes up is harmless. SQLite allows one process: there the
    dispatcher is always active.
    """

    def __init__(self, settings: DispatcherSettings, engine: AsyncEngine, clock: Clock) -> None:
        self.settings = settings
        self.engine = engine
        self.clock = clock
        self.key = lock_key(settings.origin)
        self.enabled = engine.dialect.name == "postgresql"
        self.active = not self.enabled
        self._conn: AsyncConnection | None = None
        self.takeovers = 0
        self.standing_by = False
        """True while another replica holds the lock (said once per stretch; the readiness probe reads it)."""

    async def _try(self) -> bool:
        if self._conn is None:
            self._conn = await self.engine.connect()
            timeout = int(self.settings.leader_idle_timeout_seconds * 1000)
            try:
                with mapped():
                    await self._conn.execute(sa.text(f"SET idle_session_timeout = {timeout}"))
                    await self._conn.commit()
            except DatabaseUnavailable:
                raise
            except Exception as exc:  # PostgreSQL < 14: a hung active is noticed by TCP keepalive only
                await self._conn.rollback()
                log.warning("idle_session_timeout not supported (%s); a hung active dispatcher is only "
                            "replaced once its connection times out", exc)
        got = (await self._conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key})).scalar()
        await self._conn.commit()  # no transaction left open: the session stays idle between checks
        return bool(got)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.invalidate()
            except Exception:  # the session is gone already
                pass

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait as a standby until this replica holds the lock (True) or ``stop`` is set (False).
        A database outage is raised (after dropping the session): the caller waits it out
        (:mod:`dispatcher.replica.startup`) and calls again."""
        if not self.enabled:
            return True
        while not stop.is_set():
            try:
                got = await self._try()
            except BaseException:
                await self._drop()
                self.standing_by = False  # not known while the database is away (readiness says so)
                raise
            if got:
                took_over = self.standing_by or self.takeovers > 0  # another replica (or this one) was active
                self.active = True
                self.standing_by = False
                self.takeovers += 1
                if took_over:
                    log.warning("this dispatcher took over: it is the active one for origin %r", self.settings.origin)
                else:  # the normal start of the only (or the first) replica
                    log.info("this dispatcher is the active one for origin %r", self.settings.origin)
                return True
            if not self.standing_by:
                log.info("standing by: another dispatcher of origin %r is active", self.settings.origin)
                self.standing_by = True
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.settings.leader_poll_seconds)
            except TimeoutError:
                pass
        return False

    async def hold(self) -> None:
        """While active: check the session; take the lock again on a new one if it broke; raise
        :class:`LeadershipLost` when another replica has it."""
        if not self.enabled:
            await asyncio.Event().wait()
        while True:
            await self.clock.sleep(self.settings.leader_poll_seconds)
            try:
                assert self._conn is not None
                with mapped():
                    await self._conn.execute(sa.text("SELECT 1"))
                    await self._conn.commit()
                continue
            except (DatabaseUnavailable, AssertionError) as exc:
                log.warning("the leader session broke (%s); taking the lock again", exc or type(exc).__name__)
                await self._drop()
            while True:
                try:
                    with mapped():
                        got = await self._try()
                    if got:
                        log.info("still the active dispatcher (lock taken again on a new session)")
                        break
                    raise LeadershipLost("another dispatcher took over while this one's session was gone; "
                                         "stepping down (the process restarts as a standby)")
                except DatabaseUnavailable:
                    await self._drop()  # the database is away: nobody can decide; keep trying
                    await self.clock.sleep(self.settings.leader_poll_seconds)

    async def release(self) -> None:
        if self._conn is not None:
            try:
                await self._conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
                await self._conn.commit()
                await self._conn.close()
            except Exception:
                await self._drop()
            self._conn = None

