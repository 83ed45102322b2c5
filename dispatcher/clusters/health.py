"""Cluster health: heartbeats in, lost clusters out, and what happens to a lost cluster's Workloads.

Every heartbeat feeds the capacity book and upserts the ``clusters`` row when anything but its time
changed (the lease desk writes every grant's ``lease_until`` and ``last_heartbeat``); a batch writes the
rows of all its heartbeats in one statement. A cluster whose heartbeat
is older than ``heartbeat_timeout_seconds`` (or that sent its will, ``online=False``) is lost: nothing
new is placed there. Its placements become ``lost`` and their Workloads are placed again only once
the agent has surely stopped every copy it holds (the lease granted with its last heartbeat, or a
longer one granted earlier, plus ``lease_margin_seconds``), and then: the accepted ones after
``worker_lost_timeout_seconds`` (when set), the Places it never answered after
``unaccepted_replace_seconds``. A silent cluster's unanswered Place is no different from its other
Jobs: the agent may have applied it and its Accepted been lost as the link broke, so moving it
before the lease is over could run it twice. A cluster that answers tells: a Rejected or a ``gone``
Status (also the answer to a Delete) moves the Workload at once (:mod:`dispatcher.engine.answers`), and an
Inventory without the Job brings the Place again, to the cluster that was chosen.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.queries import clusters as cluster_q
from dispatcher.db.queries import placements as placement_q
from dispatcher.db.queries import workloads as workload_q
from dispatcher.engine.batch import Batch, PlacementRow, ReportIn, WorkloadRow
from dispatcher.engine.core import EngineCore
from dispatcher.states import P
from federation import messages


class ClusterHealth(EngineCore):
    """The engine's part that follows clusters (see the module docstring)."""

    def _heartbeat(self, b: Batch, item: ReportIn) -> dict[str, Any] | None:
        """Take a heartbeat into the book; returns its cluster row when that is to be written (the batch
        writes the rows of all its heartbeats in one statement, ``clusters.upsert_clusters``)."""
        hb = item.report
        assert isinstance(hb, messages.Heartbeat)
        old = self.book.heartbeats.get(hb.cluster)
        if self.book.heartbeat(hb, item.received_at):
            b.placement_due = True
        lost = hb.cluster in self.lost
        granted = self.leases_granted.get(hb.cluster)
        grants = hb.online and (granted is None or granted < hb.sent_at)
        if grants:
            # fencing: every heartbeat renews the agent's lease (worker_agent.lease); the lease desk
            # (dispatcher/clusters/leases.py) claimed it when it came in unless the cluster has no lease yet
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
        # A heartbeat that changes nothing but its time is not written: the lease desk writes every grant's
        # lease_until and last_heartbeat itself (dispatcher/clusters/leases.py). The capacity compares by
        # identity: the book keeps one object while it is equal (CapacityBook.capacities).
        capacity = self.book.capacities.get(hb.cluster, hb.capacity)
        kinds = sorted({*hb.kinds_reconciled, *hb.kinds_delegated})
        content = (hb.labels, kinds, hb.online, hb.agent_version[:64], hb.interval_seconds,
                   self.lost.get(hb.cluster))
        written = self.cluster_rows.get(hb.cluster)
        if not grants and written is not None and written[0] is capacity and written[1] == content:
            return None
        row = {
            "name": hb.cluster, "labels": dict(hb.labels), "capacity": capacity.model_dump(), "kinds": kinds,
            "online": hb.online, "agent_version": hb.agent_version[:64], "interval_seconds": hb.interval_seconds,
            "last_heartbeat": item.received_at, "lost_since": self.lost.get(hb.cluster), "updated_at": b.now,
            "lease_until": self.lease_until.get(hb.cluster)}
        # remembered only once the batch commits: a held batch's retry must write it again
        b.after.append(lambda: self.cluster_rows.__setitem__(hb.cluster, (capacity, content)))
        return row

    async def _check_clusters(self, s: AsyncSession, b: Batch) -> None:
        timeout = timedelta(seconds=self.settings.heartbeat_timeout_seconds)
        # clusters heard since this dispatcher started, and those only the database knows (silent since)
        last = {**self.last_heartbeat, **self.book.received}
        for name, received in sorted(last.items()):  # rows locked by name (see dispatcher/clusters/leases.py)
            if name not in self.lost and b.now - received > timeout:
                self.lost[name] = b.now
                b.event(None, "cluster_lost", cluster=name, reason="HeartbeatTimeout",
                        message=f"no heartbeat for {self.settings.heartbeat_timeout_seconds:g}s")
                await cluster_q.mark_cluster_lost(s, name, b.now)
                self.cluster_rows.pop(name, None)  # its row changed: the next heartbeat writes it whole
        for name, since in list(self.lost.items()):
            if b.now < self._lease_end(name, b):
                continue  # its agent may still run anything it got, answered or not
            lost_for = b.now - since
            accepted = (self.settings.worker_lost_timeout_seconds is not None
                        and lost_for >= timedelta(seconds=self.settings.worker_lost_timeout_seconds))
            if not accepted and lost_for < timedelta(seconds=self.settings.unaccepted_replace_seconds):
                continue
            states = placement_q.ACTIVE_PLACEMENT if accepted else ("sent",)
            for p in await placement_q.placements_on(s, name, states):
                key = (p.workload_uid, p.attempt)
                rows = await workload_q.load_workloads(s, [p.workload_uid])
                if p.workload_uid not in rows or rows[p.workload_uid].attempt != p.attempt:
                    continue
                row = b.w.setdefault(p.workload_uid, cast(WorkloadRow, dict(rows[p.workload_uid]._mapping)))
                b.p.setdefault(key, cast(PlacementRow, dict(p._mapping)))
                if b.p[key]["state"] not in states:
                    continue
                why = (f"cluster {name} was lost and its lease is over" if p.state != P.SENT
                       else f"cluster {name} was lost before it answered the Place, and its lease is over")
                self._lose(b, row, p.attempt, why, fence=True)

    def _lease_end(self, name: str, b: Batch) -> datetime:
        """When the lost cluster's agent has surely stopped every copy it holds, answered or not: the
        lease granted with its last heartbeat, or a longer one granted earlier (also by a dispatcher set
        up differently), plus the margin."""
        known = [d for d in (self.book.received.get(name), self.last_heartbeat.get(name)) if d is not None]
        granted = max(known) if known else b.now
        ends = [granted + timedelta(seconds=self.settings.lease_seconds)]
        if name in self.lease_until:
            ends.append(self.lease_until[name])
        return max(ends) + timedelta(seconds=self.settings.lease_margin_seconds)
