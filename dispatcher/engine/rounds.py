"""The placement round: a scheduling pass over the queues, compare-and-set, Place Commands queued.

A round runs one pass of the pure scheduler (:mod:`dispatcher.queueing.scheduler`) over every
pending Workload held in memory by :class:`dispatcher.queueing.state.QueueingState`: quota is
reserved in the Workload's ClusterQueue and a cluster where all its pods fit is chosen in one step.
The winners are marked placed in one compare-and-set update (a second dispatcher cannot place the
same Workload) with the ClusterQueue, flavors and quota they hold, and one Place is queued per
placement. A Workload that waits keeps its reason (which step holds it), written to the manager
Job's condition — ``QuotaReserved=False`` for the queue and quota steps, ``MultiClusterDispatched=False``
for placement — when the story changes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.clusters.policycheck import reason as policy_reason
from dispatcher.db.queries import placements as placement_q
from dispatcher.db.queries import workloads as workload_q
from dispatcher.engine import transitions
from dispatcher.engine.batch import Batch, WorkloadRow, job_key
from dispatcher.engine.core import EngineCore, oversize_problem
from dispatcher.mirror import conditions as jc
from dispatcher.placement import eligible
from dispatcher.queueing.scheduler import Admission, Entry, Eviction
from dispatcher.queueing.state import usage_to_json
from dispatcher.states import P, W, initial
from federation import messages
from federation.kinds.registry import by_name
from federation.sealing import NoKey

_DIGITS = re.compile(r"(?<![-\w])[0-9.]+[a-zA-Z]*")  # figures, not the digits in cluster names


SHARED_CONDITIONS = 64
"""Condition lists remembered for sharing (``PlacementRound._shared``): a batch's few distinct steps."""


class PlacementRound(EngineCore):
    """The engine's part that places pending Workloads (see the module docstring)."""

    def _retry_due(self) -> bool:
        return self.clock.monotonic() - self._last_place >= self.settings.placement_retry_seconds

    @staticmethod
    def _same_story(new: str, old: str, since: datetime, now: datetime) -> bool:
        """Only the figures changed ("most free: worker-3 has 6" → "has 4"), and recently: not worth a
        new event row and condition write on every heartbeat; refreshed at least once a minute."""
        return (_DIGITS.sub("#", new) == _DIGITS.sub("#", old)
                and (now - since).total_seconds() < 60)

    async def _place(self, s: AsyncSession, b: Batch) -> None:
        self._last_place = self.clock.monotonic()
        qs = self.queueing
        if not qs.queues.entries:
            return
        cordoned = frozenset(getattr(self, "cordoned", ()))  # admin cordons (dispatcher.engine.adminactions)
        # and clusters heard but no longer registered: a Place is sealed to its cluster's key (federation.sealing)
        cordoned |= frozenset(name for name in self.book.heartbeats if name not in self.identity.keys)
        views = [v for v in self.book.views() if v.name not in cordoned]
        # A cluster silent past the timeout at the last pass and heard again is room that came back with the
        # same figures (the book's version does not move): after an outage that held the batch past the timeout,
        # every Workload it decided was set aside as if no cluster were online, and stayed there.
        live = frozenset(v.name for v in views
                         if eligible(v, now=b.now, timeout=self.settings.heartbeat_timeout_seconds))
        if self.book.version != qs.capacity_version or cordoned != qs.cordoned or not live <= qs.live:
            qs.queues.capacity_changed()  # room may have grown: set-aside Workloads try again
        qs.capacity_version, qs.cordoned, qs.live = self.book.version, cordoned, live
        for uid, priority, source in qs.reprice():  # claimed before the priority classes were listed
            b.w_updates.setdefault(uid, {}).update(priority=priority, priority_source=source[:253])
            if uid in b.w:
                b.w[uid].update({"priority": priority, "priority_source": source[:253]})
        # clusters that would refuse (the batch's Jobs as decoded already)
        self.policies.apply(qs.queues.entries, self.cache, self.book.heartbeats, b.jobs)
        result = qs.schedule(views, now=b.now, timeout=self.settings.heartbeat_timeout_seconds)
        if result.admitted or result.evicted:
            await self._load(s, b, [a.entry.uid for a in result.admitted] + [v.uid for v in result.evicted])
        for v in result.evicted:
            self._evict(b, v)
        chosen = [a for a in result.admitted if a.entry.uid in b.w and b.w[a.entry.uid]["state"] == W.PENDING]
        by_cluster: dict[str, list[str]] = {}
        held_by: dict[str, dict[str, Any]] = {}  # written with the placement (one UPDATE, not two)
        for a in chosen:
            by_cluster.setdefault(a.cluster, []).append(a.entry.uid)
            held = qs.queues.admitted.get(a.entry.uid)
            held_by[a.entry.uid] = {"cluster_queue": held.cq if held is not None else None,
                                    "flavors": a.flavors or None,
                                    "usage": usage_to_json(a.usage) if held is not None else None}
        won = await workload_q.mark_placed(s, by_cluster, b.now, held_by)
        for a in result.admitted:
            if a.entry.uid not in won:  # claimed by another dispatcher, or changed meanwhile
                qs.queues.release(a.entry.uid)
        placements = []
        for n, a in enumerate(chosen):
            uid = a.entry.uid
            if uid not in won:
                continue
            if n % 100 == 99:
                await asyncio.sleep(0)
            row = b.w[uid]
            attempt = won[uid]
            before = {c: row.get(c) for c in (*workload_q.HELD_COLUMNS, "reserved_at")}
            transitions.placed(b, row, attempt=attempt, cluster=a.cluster, held=held_by[uid])
            kind = by_name(row["kind"])
            job = b.jobs.get(uid)  # claimed in this batch: decoded already
            try:
                self._send_place(b, row, kind, job if job is not None else self.cache[uid], attempt=attempt,
                                 cluster=a.cluster, spec_version=row["spec_version"])
            except messages.MessageRefused as exc:  # e.g. above the payload limit: cannot be sent anywhere
                # No placement row (a `sent` one would be expected on the cluster forever) and the
                # attempt is given back: nothing was placed, and no quota is held.
                row.update({"attempt": attempt - 1, "cluster": None})
                b.set_w(uid, cluster=None, attempt=attempt - 1, **before)  # what it held before (mark_placed wrote it)
                qs.queues.release(uid)
                if isinstance(exc, NoKey):  # unregistered while the round ran: another cluster next round
                    self._requeue(b, row, exc.message)
                    continue
                self._reject(b, row, [oversize_problem(self.cache[uid], exc)])
                continue
            held = qs.queues.admitted.get(uid)
            placements.append({"workload_uid": uid, "attempt": attempt, "cluster": a.cluster, "epoch": self.epoch,
                               "state": initial(P.SENT), "spec_version": row["spec_version"], "created_at": b.now,
                               "reason": a.why})
            self._admitted(b, row, a, held.cq if held is not None else None)
            b.event(uid, "placed", cluster=a.cluster, message=f"attempt {attempt} on {a.cluster}: {a.why}")
            self.book.reserve(uid, a.cluster, a.need.total)
        await placement_q.add_placements(s, placements)
        for e in result.waiting:
            self._waiting(b, e)
        for uid, cq in qs.routed():  # the ClusterQueue of each pending row: positions readable from SQL
            if uid in b.w:
                if b.w[uid].get("state") == W.PENDING:
                    b.set_w(uid, cluster_queue=cq)
            else:
                b.w_updates.setdefault(uid, {})["cluster_queue"] = cq

    def _evict(self, b: Batch, v: Eviction) -> None:
        """A preempted Workload: its worker copy deleted by its agent, back to its queue at its old place (its
        creationTimestamp, as Kueue orders it), ``Evicted`` / ``Preempted`` on the Job naming the preemptor,
        history kept."""
        row = b.w.get(v.uid)
        if row is None or row["state"] not in (W.PLACED, W.RUNNING):
            return
        uid = row["uid"]
        cluster = row.get("cluster")  # the history row names the cluster it leaves (_send_delete clears it)
        self._send_delete(b, row, f"preempted: {v.message}")
        # its queue time stays its creationTimestamp: Kueue orders a preempted Workload where it was
        transitions.taken_off(b, row, v.message, usage_cleared=True)
        b.event(uid, "evicted", cluster=cluster, reason="Preempted", message=v.message)
        key = job_key(row)
        conds = jc.preempted(v.reason, v.message, b.now)

        def write() -> None:
            self._write(key, conds, clear=True)
            self.writer.event(key, "Normal", "Preempted", v.message)
        b.after.append(write)
        b.placement_due = True

    def _admitted(self, b: Batch, row: WorkloadRow, a: Admission, cq: str | None) -> None:
        """QuotaReserved and Admitted on the Job, and the admission decision in the history."""
        if cq is None:
            return  # open mode: no quota, MultiClusterDispatched says it all
        text = jc.quota_text(cq, a.flavors, borrows=a.borrows)
        b.event(row["uid"], "quota_reserved", reason="QuotaReserved", message=text)
        key = job_key(row)
        conds = self._shared(("admitted", text, a.cluster, b.now),
                             lambda: jc.admitted(text, jc.admitted_text(a.cluster), b.now))

        def write() -> None:
            self._write(key, conds)
            self.writer.event(key, "Normal", "QuotaReserved", text)
        b.after.append(write)

    def _shared(self, key: tuple[Any, ...], make: Callable[[], jc.Conditions]) -> jc.Conditions:
        """One list of the same condition dicts for every Workload of a pass that gets the same conditions at
        the same time (``key``: the step, its texts and the batch's time), not a list each: the kube writer
        never changes a condition it is given, and after a burst of claims ~50,000 Jobs' conditions wait in
        its backlog for minutes (the claimed dispatcher's RSS). A few keys are remembered."""
        memo = self.shared_conditions
        conds = memo.get(key)
        if conds is None:
            if len(memo) >= SHARED_CONDITIONS:
                memo.clear()
            conds = memo[key] = make()
        return conds

    def _waiting(self, b: Batch, e: Entry) -> None:
        """A Workload still waits, for a new reason: the reason on the row, in the history, on the Job."""
        refused = self.policies.why(e.uid) if e.step == "placement" else {}
        reason = policy_reason(refused, e.reason) if refused else e.reason
        old = self.queueing.shown.get(e.uid)
        if old is not None and (old[0] == reason or self._same_story(reason, old[0], old[1], b.now)):
            return
        shown = (reason, b.now)  # once committed: a batch that fails and is tried again writes it all again
        b.after.append(lambda uid=e.uid: self.queueing.shown.__setitem__(uid, shown))  # type: ignore[misc]
        if e.uid in b.w:
            b.set_w(e.uid, reason=reason, updated_at=b.now)
        else:  # not loaded: only the columns written (the row's state is not this pass's to know)
            b.w_updates.setdefault(e.uid, {}).update(reason=reason, updated_at=b.now)
        row = {"uid": e.uid, "namespace": e.namespace, "name": e.name, "kind": e.need.kind}
        key = job_key(row)
        if refused:  # no cluster left but those whose policy refuses it: say which and why, on the Job
            b.event(e.uid, "pending", reason="PolicyViolation", message=reason)
            conds = self._shared(("PolicyViolation", reason, b.now),
                                 lambda: jc.waiting("PolicyViolation", reason, b.now, step="placement"))
            b.after.append(lambda key=key, reason=reason: self.writer.event(  # type: ignore[misc]
                key, "Warning", "PolicyViolation", reason))
        elif e.step == "placement":
            b.event(e.uid, "pending", reason=e.word, message=e.reason)
            conds = self._shared(("NoFittingCluster", e.reason, b.now),
                                 lambda: jc.waiting("NoFittingCluster", e.reason, b.now, step="placement"))
        else:
            b.event(e.uid, "pending", reason=e.word, message=e.reason)
            word = e.word or "Pending"
            conds = self._shared(("queue", word, e.reason, b.now),
                                 lambda: jc.waiting(word, e.reason, b.now, step="queue"))
        b.after.append(lambda key=key, conds=conds: self._write(key, conds))  # type: ignore[misc]
