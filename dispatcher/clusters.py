"""Cluster health: heartbeats in, lost clusters out, and what happens to a lost cluster's Workloads.

Every heartbeat upserts the ``clusters`` row and feeds the capacity book. A cluster whose heartbeat
is older than ``heartbeat_timeout_seconds`` (or that sent its will, ``online=False``) is lost: nothing
new is placed there, and after ``worker_lost_timeout_seconds`` (when set) its placements become
``lost`` and their Workloads are placed again.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.batch import Batch, ReportIn
from dispatcher.core import EngineCore
from dispatcher.db import queries as q
from federation import messages


class ClusterHealth(EngineCore):
    """The engine's part that follows clusters (see the module docstring)."""

    async def _heartbeat(self, s: AsyncSession, b: Batch, item: ReportIn) -> None:
        hb = item.report
        assert isinstance(hb, messages.Heartbeat)
        old = self.book.heartbeats.get(hb.cluster)
        if self.book.heartbeat(hb, item.received_at):
            b.placement_due = True
        lost = hb.cluster in self.lost
        if hb.online and (old is None or not old.online or lost):
            self.lost.pop(hb.cluster, None)
            b.event(None, "cluster_online", cluster=hb.cluster, message=f"agent {hb.agent_version} online")
        elif not hb.online and (old is None or old.online):
            self.lost.setdefault(hb.cluster, item.received_at)
            b.event(None, "cluster_lost", cluster=hb.cluster, reason="Offline", message="the agent went offline")
        await q.upsert_cluster(s, {
            "name": hb.cluster, "labels": dict(hb.labels), "capacity": hb.capacity.model_dump(),
            "kinds": sorted({*hb.kinds_reconciled, *hb.kinds_delegated}), "online": hb.online,
            "agent_version": hb.agent_version[:64], "interval_seconds": hb.interval_seconds,
            "last_heartbeat": item.received_at, "lost_since": self.lost.get(hb.cluster), "updated_at": b.now})

    async def _check_clusters(self, s: AsyncSession, b: Batch) -> None:
        timeout = timedelta(seconds=self.settings.heartbeat_timeout_seconds)
        for name, received in list(self.book.received.items()):
            if name not in self.lost and b.now - received > timeout:
                self.lost[name] = b.now
                b.event(None, "cluster_lost", cluster=name, reason="HeartbeatTimeout",
                        message=f"no heartbeat for {self.settings.heartbeat_timeout_seconds:g}s")
                hb = self.book.heartbeats[name]
                await q.upsert_cluster(s, {"name": name, "labels": dict(hb.labels),
                                           "capacity": hb.capacity.model_dump(), "kinds": [], "online": hb.online,
                                           "lost_since": b.now, "updated_at": b.now})
        limit = self.settings.worker_lost_timeout_seconds
        if limit is None:
            return
        for name, since in list(self.lost.items()):
            if b.now - since < timedelta(seconds=limit):
                continue
            for p in await q.placements_on(s, name, q.ACTIVE_PLACEMENT):
                key = (p.workload_uid, p.attempt)
                rows = await q.load_workloads(s, [p.workload_uid])
                if p.workload_uid not in rows or rows[p.workload_uid].attempt != p.attempt:
                    continue
                b.w.setdefault(p.workload_uid, dict(rows[p.workload_uid]._mapping))
                b.p.setdefault(key, dict(p._mapping))
                b.set_p(key, state="lost", finished_at=b.now, reason=f"cluster {name} lost")
                self._requeue(b, b.w[p.workload_uid], f"cluster {name} was lost for more than {limit:g}s")
