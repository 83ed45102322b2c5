"""Answers from agents: Accepted, Rejected, Status and Inventory Reports, and Places left unanswered.

Each Report is checked against the current placement (an older attempt, a placement on another
cluster or a sequence number already seen is dropped), then moves the placement and the Workload
on: accepted, running, finished, requeued after a rejection or a vanished worker Job. An Inventory
is answered with a Resync and the Places the agent lacks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.queries import placements as placement_q
from dispatcher.engine import transitions
from dispatcher.engine.batch import Batch, PlacementRow, ReportIn, WorkloadRow, job_key
from dispatcher.engine.core import EngineCore
from dispatcher.mirror import conditions as jc
from dispatcher.states import P, W
from federation import messages
from federation.kinds.registry import by_name

log = logging.getLogger("dispatcher.engine")  # the engine's parts log as the engine (one logger to tune)
_GIVEN_UP = ("deleted", "rejected", "lost")
"""Placement states whose worker copy mkd gave up on: its Reports are not mirrored any more."""


class Answers(EngineCore):
    """The engine's part that handles Reports (see the module docstring)."""

    async def _reports(self, s: AsyncSession, b: Batch, reports: list[ReportIn]) -> None:
        if not reports:
            return
        keys = [(r.report.placement.workload_uid, r.report.placement.attempt) for r in reports
                if not isinstance(r.report, messages.Inventory | messages.Heartbeat)]
        await self._load(s, b, [uid for uid, _ in keys])
        for item in reports:
            r = item.report
            if isinstance(r, messages.Inventory):
                await self._inventory(s, b, r)
                continue
            assert not isinstance(r, messages.Heartbeat)
            key = (r.placement.workload_uid, r.placement.attempt)
            self.unanswered.pop(key, None)
            row = b.w.get(key[0])
            p = b.p.get(key)
            if row is None or p is None or p["cluster"] != r.cluster:
                log.debug("report %s for an unknown or old placement %s from %s dropped", r.type, key, r.cluster)
                continue
            self._resent.pop(key, None)  # answered: nothing to pace any more (not kept for 100,000 Jobs)
            current = row["attempt"] == key[1] and row["state"] != W.DELETED
            if isinstance(r, messages.Accepted):
                self._accepted(b, row, p, r, current)
            elif isinstance(r, messages.Rejected):
                self._rejected(b, row, p, r, current)
            else:
                self._status(b, row, p, r, current)

    def _accepted(self, b: Batch, row: WorkloadRow, p: PlacementRow, r: messages.Accepted,
                  current: bool) -> None:
        if not current or p["state"] != P.SENT:
            return
        self._mark_accepted(b, row, p, r.cluster)

    def _rejected(self, b: Batch, row: WorkloadRow, p: PlacementRow, r: messages.Rejected,
                  current: bool) -> None:
        if not current or p["state"] not in placement_q.ACTIVE_PLACEMENT:
            return
        uid = row["uid"]
        text = f"{r.reason}: {r.message}"
        if r.reason == "Stale":
            # the agent holds something newer for this Workload (a later epoch or attempt): its copy
            # stands, and placing the Workload again would run it twice
            log.info("stale Place for %s attempt %d refused by %s: %s", uid, p["attempt"], r.cluster, r.message)
            return
        if p["state"] == P.SENT and r.reason == messages.REJECTED_LEASE_EXPIRED and not r.permanent:
            # The agent is fenced until a lease renewal reaches it, then takes this very Place: it stays
            # sent and goes again (unanswered re-send, or the Inventory the agent sends once renewed).
            # Requeueing spent an attempt per refusal and failed Jobs on a cluster fencing on and off. A
            # cluster that stays silent is lost and its unanswered Places move (clusters.py).
            log.info("Place of %s attempt %d refused by %s while its lease is out; sent again later",
                     uid, p["attempt"], r.cluster)
            b.set_w(uid, reason=f"{r.cluster} refused the Place while fenced (no lease): {r.message}; "
                                "sent again once its lease is renewed"[:1000], updated_at=b.now)
            return
        if p["state"] != P.SENT and r.reason != messages.REJECTED_TWO_CONTROLLERS:
            self._command_refused(b, row, p, r, text)
            return  # (TwoControllers: the agent deleted even an accepted copy, so it is placed elsewhere)
        b.set_p((uid, p["attempt"]), state=P.REJECTED, reason=text, finished_at=b.now)
        b.event(uid, "rejected", cluster=r.cluster, reason=r.reason, message=r.message)
        # Whatever the agent half-made before it refused must not outlive the refusal, and a late
        # repeat of this Place must not create it: the Delete fences the attempt on the agent.
        self._send_delete(b, row, f"rejected by {r.cluster}: {text}")
        excluded = list(row["excluded"]) + ([r.cluster] if r.permanent and r.cluster not in row["excluded"] else [])
        self._requeue(b, row, f"rejected by {r.cluster}: {text}", excluded=excluded)

    def _command_refused(self, b: Batch, row: WorkloadRow, p: PlacementRow, r: messages.Rejected,
                         text: str) -> None:
        """The agent accepted this placement earlier, so a copy exists and runs: a Rejected now is about
        a later Command (a suspend, a resume, an edit it could not apply). Placing the Workload again
        would run it twice; instead the refusal is recorded (reason, history row, Warning Event) and,
        when temporary, the current spec is sent again after ``place_resend_seconds``."""
        uid = row["uid"]
        message = (f"{r.cluster} could not apply spec version {r.spec_version} ({text}); its copy keeps "
                   f"running the version it had" + ("" if r.permanent else "; sent again shortly"))
        b.set_w(uid, reason=message[:1000], updated_at=b.now)
        b.event(uid, "rejected", cluster=r.cluster, reason=r.reason, message=message)
        key = job_key(row)
        b.after.append(lambda: self.writer.event(key, "Warning", "UpdateRefused", message))
        if not r.permanent:
            due = self.clock.monotonic() + self.settings.place_resend_seconds
            pkey = (uid, p["attempt"])
            b.after.append(lambda: self._edit_retry.__setitem__(pkey, due))

    def _status(self, b: Batch, row: WorkloadRow, p: PlacementRow, r: messages.Status, current: bool) -> None:
        uid = row["uid"]
        if not current or r.seq <= p["last_status_seq"] or p["state"] in _GIVEN_UP:
            self.stale_dropped += 1  # a copy mkd gave up on no longer speaks for the Job
            return
        pkey = (uid, p["attempt"])
        b.set_p(pkey, last_status_seq=r.seq)
        if r.gone and r.finished is None:
            # A Job that vanished without an outcome (deleted on the worker): placed again. One that
            # finished and then went (TTL) is recorded as finished below.
            if p["state"] in placement_q.ACTIVE_PLACEMENT:
                self._lose(b, row, p["attempt"], "the worker Job disappeared", fence=False,
                           requeue_reason=f"the Job disappeared from {r.cluster}")
            return
        if p["state"] == P.SENT:  # Status before Accepted (lost or reordered): it evidently runs
            self._mark_accepted(b, row, p, r.cluster)
        conds: jc.Conditions = []
        if r.finished is not None and p["state"] not in (P.FINISHED, P.FAILED):
            succeeded = r.finished == "Succeeded"
            outcome = "finished" if succeeded else "failed"  # the history row's type
            b.set_p(pkey, state=P.FINISHED if succeeded else P.FAILED, finished_at=b.now)
            transitions.ended(b, uid, r.finished)
            b.event(uid, outcome, cluster=r.cluster, reason=r.finished, message=_last_condition(r.status))
            b.after.append(lambda: self.book.release(uid))
            b.placement_due = True
            if self.settings.admission_check.enabled:  # Kueue mode: the copy goes once the Job ends, as
                self._send_delete(b, row, f"the Job {outcome}")  # MultiKueue's do with their finished Workload
            if row.get("cluster_queue"):  # Kueue's Finished, where its conditions are written (not open mode)
                done = by_name(row["kind"]).finished({"status": r.status})
                conds = jc.finished(r.finished, done.message if done else "", b.now)
        elif r.finished is None and p["state"] in (P.SENT, P.ACCEPTED) and r.status.get("startTime"):
            b.set_p(pkey, state=P.RUNNING)
            b.event(uid, "running", cluster=r.cluster, message=f"started on {r.cluster}")
        if r.gone and not r.status:
            return  # nothing to mirror: keep the last status the manager Job shows
        key = job_key(row)
        status = r.status
        finished = r.finished is not None or r.gone  # never held back (KubeWriter.mirror)

        def write() -> None:  # the Finished condition shares the terminal status's write
            self._write(key, conds)
            self.writer.mirror(key, status, finished=finished)
        b.after.append(write)

    async def _inventory(self, s: AsyncSession, b: Batch, r: messages.Inventory) -> None:
        have = {(i.placement.workload_uid, i.placement.attempt): i for i in r.items}
        b.resync.add(r.cluster)  # the answer to an Inventory is a Resync, sent at the end of the batch
        expected = await placement_q.expected_on(s, r.cluster)
        resent = 0
        for e in expected:
            item = have.get((e.workload_uid, e.attempt))
            if e.state not in placement_q.ACTIVE_PLACEMENT or (item is not None and item.spec_version >= e.spec_version):
                continue
            obj = self.cache.get(e.workload_uid)
            if obj is None:
                log.warning("cannot re-send placement %s/%s: the manager Job is not in the cache",
                            e.namespace, e.name)
                continue
            try:
                self._send_place(b, dict(e._mapping, uid=e.workload_uid), by_name(e.kind), obj, attempt=e.attempt,
                                 cluster=r.cluster, spec_version=e.spec_version)
            except messages.MessageRefused as exc:  # edited beyond the limit since: recorded on the Job then
                log.warning("cannot re-send placement %s/%s to %s: %s", e.namespace, e.name, r.cluster, exc)
                continue
            resent += 1
        log.info("inventory from %s: %d items, %d expected, %d Place re-sent", r.cluster, len(r.items),
                 len(expected), resent)

    async def _resend_unanswered(self, s: AsyncSession, b: Batch) -> None:
        wait = self.settings.place_resend_seconds
        now = self.clock.monotonic()
        resent = 0
        due = [k for k, t in self._edit_retry.items() if t <= now]
        if due:
            await self._load(s, b, [uid for uid, _ in due])
        for uid, attempt in due:
            row, obj = b.w.get(uid), self.cache.get(uid)
            if row is None or obj is None or row["attempt"] != attempt or not row["cluster"]:
                b.after.append(lambda k=(uid, attempt): self._edit_retry.pop(k, None))  # type: ignore[misc]
                continue
            try:
                self._send_place(b, row, by_name(row["kind"]), obj, attempt=attempt, cluster=row["cluster"],
                                 spec_version=row["spec_version"])
            except messages.MessageRefused:
                pass
            b.after.append(lambda k=(uid, attempt): self._edit_retry.pop(k, None))  # type: ignore[misc]
        if self.listening_since is None:
            return  # no answer can arrive before the Report subscription: nothing is unanswered yet
        floor = self.listening_since  # a predecessor's Places were answered while nobody listened
        per_cluster = self.settings.place_resend_batch
        recent = sum(1 for t in self._resent.values() if now - t < wait)
        limit = recent + per_cluster * max(1, len(self.book.received))  # enough to reach past the recent ones
        taken: dict[str, int] = {}
        waiting = 0
        held: set[tuple[str, int]] | None = None
        for r in await placement_q.unanswered(s, b.now - timedelta(seconds=wait), limit):  # oldest first
            key = (r.workload_uid, r.attempt)
            obj = self.cache.get(r.workload_uid)
            last = max(floor, self._resent.get(key, floor), self.unanswered.get(key, floor))
            if obj is None or now - last < wait:
                continue
            if held is None:
                held = self.fresh.place_keys()
            if key in held:
                continue  # still waiting to be published (the unanswered-Place budget): not unanswered
            if taken.get(r.cluster, 0) >= per_cluster:
                waiting += 1  # still `sent` in the database: a later tick sends it
                continue
            try:
                self._send_place(b, {"uid": r.workload_uid}, by_name(r.kind), obj, attempt=r.attempt,
                                 cluster=r.cluster, spec_version=r.spec_version)
            except messages.MessageRefused as exc:
                log.warning("cannot re-send placement %s to %s: %s", key, r.cluster, exc)
                continue
            b.after.append(lambda key=key: self._resent.__setitem__(key, now))  # type: ignore[misc]
            taken[r.cluster] = taken.get(r.cluster, 0) + 1
            resent += 1
        if resent:
            log.warning("re-sent %d Place commands not answered within %gs (at most %d per cluster at a time%s)",
                        resent, wait, per_cluster, f"; {waiting} more at the next ticks" if waiting else "")
        if len(self._resent) > 1_000:  # an entry older than ``wait`` no longer holds a re-send back
            self._resent = {k: t for k, t in self._resent.items() if now - t < wait}


def _last_condition(status: Mapping[str, Any]) -> str:
    conds = [c for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("status") == "True"]
    if not conds:
        return ""
    last = conds[-1]
    return f"{last.get('type')}: {last.get('reason', '')} {last.get('message', '')}".strip()
