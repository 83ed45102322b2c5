"""The one retry helper: capped exponential backoff with jitter, reset after a success.

Every loop in mkd that retries something — the Supervisor restarting a task, the MQTT reconnect
loops, the Kubernetes informer, the dispatcher's engine riding out a database outage, the kube
writer and the agent's apply queue — keeps one :class:`Backoff` and asks it how long to wait.
``failed()`` counts a failure and returns the next delay: ``initial × 2^(failures-1)`` capped at
``cap``, less up to ``jitter`` of it (so peers that lost the same server do not come back in step),
and never below a server's own hint (``Retry-After``). ``succeeded()`` resets it, so a failure
after a long healthy stretch waits ``initial`` again rather than the cap. Time is the caller's
injected :class:`~federation.clock.Clock`, so tests drive it without sleeping.
"""

from __future__ import annotations

import random

from federation.clock import Clock


def capped(failures: int, initial: float, cap: float, hint: float = 0.0) -> float:
    """The un-jittered delay after ``failures`` failures (0 before any), at least ``hint``, at most ``cap``:
    for loops that count failures per item themselves (a queue of Jobs, a Command retried in place)."""
    if failures <= 0:
        return min(hint, cap) if hint > 0 else 0.0
    return float(max(min(cap, initial * 2 ** min(failures - 1, 62)), min(hint, cap)))


class Backoff:
    """Delay policy for one retrying loop (see the module docstring)."""

    def __init__(self, initial: float, cap: float, *, jitter: float = 0.2, rng: random.Random | None = None) -> None:
        if initial <= 0 or cap < initial:
            raise ValueError(f"Backoff needs 0 < initial <= cap, got initial={initial}, cap={cap}")
        if not 0 <= jitter < 1:
            raise ValueError(f"Backoff jitter must be in [0, 1), got {jitter}")
        self.initial = initial
        self.cap = cap
        self.jitter = jitter
        self.failures = 0
        self._rng = rng or random.Random()

    def base_delay(self) -> float:
        """``initial × 2^(failures-1)``, capped; 0 before any failure."""
        return capped(self.failures, self.initial, self.cap)

    def next_delay(self, hint: float = 0.0) -> float:
        """The current delay less up to ``jitter`` of it, but at least ``hint`` (capped)."""
        delay = self.base_delay() * (1.0 - self.jitter * self._rng.random())
        return max(delay, min(hint, self.cap))

    def failed(self, hint: float = 0.0) -> float:
        """Count one failure; returns how long to wait before the next try."""
        self.failures += 1
        return self.next_delay(hint)

    def succeeded(self) -> None:
        """The operation worked: the next failure starts from ``initial`` again."""
        self.failures = 0

    async def wait(self, clock: Clock, hint: float = 0.0) -> float:
        """Count one failure and sleep the delay on ``clock``; returns the delay slept."""
        delay = self.failed(hint)
        await clock.sleep(delay)
        return delay
