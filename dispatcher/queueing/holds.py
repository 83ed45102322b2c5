"""Starving heads' holds: the room a Workload that waited too long keeps for itself, and when it lets go.

A head set aside longer than ``starvation_seconds`` holds either the cluster that comes closest to
fitting it (nothing queued after it is placed there) or, when quota is what it lacks, its
ClusterQueue (nothing behind it is admitted: the queue turns strict). A hold is bounded: it is kept
while the room it waits for keeps growing — on the held cluster, the least free share of what it asks
for; in the ClusterQueue, the least share of it the quota still allows — and let go after
``hold_seconds`` without growth (as things stand it would not fit there: long-running Workloads, nodes
too small for its pods, quota lent for good). Room only grows while nothing new takes it, up to what
the cluster or the quota has, so no hold lasts longer than the time to drain plus ``hold_seconds``.
The Workload then waits like any other, its starvation clock starting over, and its reason says why
it let go (``mkctl why``).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal


@dataclass
class Hold:
    uid: str
    cluster: str | None     # None: its ClusterQueue's quota
    since: float
    room: Decimal           # the most room seen for it
    grew: float             # when that room last grew


class Holds:
    """Every hold, by the Workload holding it (see the module docstring)."""

    def __init__(self, hold_seconds: float) -> None:
        self.seconds = hold_seconds
        self.by_uid: dict[str, Hold] = {}

    def clusters(self) -> dict[str, str]:
        """Held cluster -> the uid holding it."""
        return {h.cluster: uid for uid, h in self.by_uid.items() if h.cluster is not None}

    def held_by_others(self, uid: str) -> set[str]:
        return {h.cluster for other, h in self.by_uid.items() if h.cluster is not None and other != uid}

    def add(self, uid: str, cluster: str | None, room: Decimal, stamp: float) -> None:
        if uid not in self.by_uid:
            self.by_uid[uid] = Hold(uid, cluster, stamp, room, stamp)

    def drop(self, uid: str) -> Hold | None:
        return self.by_uid.pop(uid, None)

    def drop_cluster(self, cluster: str) -> None:
        for uid, h in list(self.by_uid.items()):
            if h.cluster == cluster:
                del self.by_uid[uid]

    def clear(self) -> None:
        self.by_uid.clear()

    def observe(self, uid: str, room: Decimal, stamp: float) -> Hold | None:
        """Record the room seen for a holder now; the hold, when it is let go (no growth for too long)."""
        h = self.by_uid[uid]
        if room > h.room:
            h.room, h.grew = room, stamp
            return None
        if stamp - h.grew >= self.seconds:
            return self.by_uid.pop(uid)
        return None
