"""Cluster health: heartbeats in, lost clusters out, and what happens to a lost cluster's Workloads.

Every heartbeat upserts the ``clusters`` row and feeds the capacity book. A cluster whose heartbeat
is older than ``heartbeat_timeout_seconds`` (or that sent its will, ``online=False``) is lost: nothing
new is placed there, and after ``worker_lost_timeout_seconds`` (when set) its placements become
``lost`` and their Workloads are placed again.
"""

from __future__ import annotations

from datetime import datetime, timedelta

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
        if hb.online:  # fencing: every heartbeat handled renews the agent's lease (worker_agent.lease)
            self._queue(b, hb.cluster, "", messages.Lease(cluster=hb.cluster, epoch=self.epoch,
                                                          heartbeat_sent_at=hb.sent_at,
                                                          seconds=self.settings.lease_seconds, sent_at=b.now))
            end = item.received_at + timedelta(seconds=self.settings.lease_seconds)
            earlier = self.lease_until.get(hb.cluster)
            self.lease_until[hb.cluster] = max(end, earlier) if earlier is not None else end
        if hb.online and (old is None or not old.online or lost):
            self.lost.pop(hb.cluster, None)
            b.event(None, "cluster_online", cluster=hb.cluster, message=f"agent {hb.agent_version} online")
            if lost:
                b.resync.add(hb.cluster)  # a returning cluster: delete what went elsewhere, report the rest
        elif not hb.online and (old is None or old.online):
            self.lost.setdefault(hb.cluster, item.received_at)
            b.event(None, "cluster_lost", cluster=hb.cluster, reason="Offline", message="the agent went offline")
        await q.upsert_cluster(s, {
            "name": hb.cluster, "labels": dict(hb.labels), "capacity": hb.capacity.model_dump(),
            "kinds": sorted({*hb.kinds_reconciled, *hb.kinds_delegated}), "online": hb.online,
            "agent_version": hb.agent_version[:64], "interval_seconds": hb.interval_seconds,
            "last_heartbeat": item.received_at, "lost_since": self.lost.get(hb.cluster), "updated_at": b.now,
            "lease_until": self.lease_until.get(hb.cluster)})

    async def _check_clusters(self, s: AsyncSession, b: Batch) -> None:
        timeout = timedelta(seconds=self.settings.heartbeat_timeout_seconds)
        # clusters heard since this dispatcher started, and those only the database knows (silent since)
        last = {**self.last_heartbeat, **self.book.received}
        for name, received in last.items():
            if name not in self.lost and b.now - received > timeout:
                self.lost[name] = b.now
                b.event(None, "cluster_lost", cluster=name, reason="HeartbeatTimeout",
                        message=f"no heartbeat for {self.settings.heartbeat_timeout_seconds:g}s")
                await q.mark_cluster_lost(s, name, b.now)
        for name, since in list(self.lost.items()):
            unaccepted = b.now - since >= timedelta(seconds=self.settings.unaccepted_replace_seconds)
            accepted = self._lease_over(name, since, b)
            if not unaccepted and not accepted:
                continue
            states = q.ACTIVE_PLACEMENT if accepted else ("sent",)
            for p in await q.placements_on(s, name, states):
                key = (p.workload_uid, p.attempt)
                rows = await q.load_workloads(s, [p.workload_uid])
                if p.workload_uid not in rows or rows[p.workload_uid].attempt != p.attempt:
                    continue
                row = b.w.setdefault(p.workload_uid, dict(rows[p.workload_uid]._mapping))
                b.p.setdefault(key, dict(p._mapping))
                if b.p[key]["state"] not in states:
                    continue
                why = (f"cluster {name} was lost and its lease is over" if p.state != "sent"
                       else f"cluster {name} was lost before it answered the Place")
                b.set_p(key, state="lost", finished_at=b.now, reason=why)
                # fences the attempt on the agent: applied before anything else when it comes back
                self._send_delete(b, row, why)
                self._requeue(b, row, why)

    def _lease_over(self, name: str, since: datetime, b: Batch) -> bool:
        """Whether the lost cluster's agent has surely stopped its copies: lost for the re-place
        toleration, and the lease granted with its last heartbeat (plus the margin) is over."""
        limit = self.settings.worker_lost_timeout_seconds
        if limit is None or b.now - since < timedelta(seconds=limit):
            return False
        known = [d for d in (self.book.received.get(name), self.last_heartbeat.get(name)) if d is not None]
        granted = max(known) if known else b.now
        ends = [granted + timedelta(seconds=self.settings.lease_seconds)]
        if name in self.lease_until:  # a longer lease granted earlier (by a dispatcher set up differently)
            ends.append(self.lease_until[name])
        over = max(ends) + timedelta(seconds=self.settings.lease_margin_seconds)
        return b.now >= over
