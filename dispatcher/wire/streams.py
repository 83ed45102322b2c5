"""Loss detection on the agents' report streams: which clusters need a Resync because Reports vanished.

QoS 1 is at least once only while the broker keeps what it queued: Mosquitto drops messages for a
subscriber that falls more than ``max_queued_messages`` behind, and says so only in its log. Each
agent numbers its Reports per link (``federation.messages.ReportBase``: a stream id and ``n`` from
1). ``StreamBook`` keeps, per cluster, the current stream, the lowest number not yet seen and the
numbers seen above it. Concurrent publishers may reorder a few Reports, so a hole is a loss only
once it has stayed open for ``grace`` seconds. The caller answers a loss with a Resync, which makes
the agent report every expected placement again, and the book forgives the hole. A stream first
met part-way (``n`` > 1) is also a reason to resync: what came before it is unknown (the
dispatcher started, or reconnected and its session dropped messages while it was away); that is
routine, so the engine logs it at INFO, and only a hole given up as lost at WARNING.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Stream:
    id: str
    next_n: int
    """The lowest number not seen yet."""
    above: set[int] = field(default_factory=set)
    """Numbers seen beyond a hole."""
    hole_since: float | None = None
    """When ``next_n`` became a hole (monotonic seconds)."""


class StreamBook:
    """Per cluster, the report stream being followed and its holes. Not thread-safe; one engine owns it."""

    def __init__(self, *, grace: float = 5.0) -> None:
        self.grace = grace
        self._streams: dict[str, _Stream] = {}
        self.lost_holes = 0
        """How many holes were given up as lost (a figure for logs and benchmarks)."""

    def seen(self, cluster: str, stream: str, n: int, now: float) -> bool:
        """Record one numbered Report; True when the cluster needs a Resync at once (stream met part-way).

        Unnumbered Reports (``n`` 0: a will message, a retained heartbeat replayed on subscribe) are
        not tracked.
        """
        if n <= 0 or not stream:
            return False
        current = self._streams.get(cluster)
        if current is None or current.id != stream:
            self._streams[cluster] = _Stream(stream, next_n=n + 1)
            return n > 1
        if n < current.next_n or n in current.above:
            return False  # a repeat: QoS 1 redelivery
        if n > current.next_n:
            current.above.add(n)
            if current.hole_since is None:
                current.hole_since = now
            return False
        current.next_n += 1
        while current.next_n in current.above:
            current.above.discard(current.next_n)
            current.next_n += 1
        current.hole_since = now if current.above else None
        return False

    def overdue(self, now: float) -> list[str]:
        """Clusters with a hole open for ``grace`` seconds or more; those holes are forgiven here."""
        lost: list[str] = []
        for cluster, stream in self._streams.items():
            if stream.hole_since is not None and now - stream.hole_since >= self.grace:
                lost.append(cluster)
                self.lost_holes += 1
                stream.next_n = max(stream.above) + 1
                stream.above.clear()
                stream.hole_since = None
        return lost

    def forget(self) -> None:
        """Drop every stream (the dispatcher's own link was lost): the next Report of each counts as new."""
        self._streams.clear()
