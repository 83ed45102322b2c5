"""Job changes: claims, spec edits, suspend / resume, managedBy changes and deletions on the manager.

Intake hands the engine every relevant change of a manager Job; this part validates new and
corrected Jobs (fetching a TrainJob's runtime from the manager cluster), claims them with one
compare-and-set insert, re-sends a Place with a new spec version when a placed Job changes, and
turns deletions into a Delete Command for the worker copy.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import workload as wl
from dispatcher.db.queries import workloads as workload_q
from dispatcher.engine import transitions
from dispatcher.engine.batch import Batch, JobChange, WorkloadRow, job_key
from dispatcher.engine.core import EDIT_REFUSED, EngineCore, unsendable_problem
from dispatcher.handover.safety import REASON as STARTED_ELSEWHERE
from dispatcher.handover.safety import started_elsewhere
from dispatcher.mirror import conditions as jc
from dispatcher.states import P, W
from federation import labels, messages
from federation.errors import Invalid, NotFound
from federation.sealing import NoKey


class JobChanges(EngineCore):
    """The engine's part that decides Job changes (see the module docstring)."""

    @staticmethod
    def _needs_description(row: Mapping[str, Any] | None, ch: JobChange) -> bool:
        """Validate and compute PodSets only for a claim, or a new generation of a Job not yet placed."""
        if ch.deleted or wl.being_deleted(ch.obj) or ch.kind.managed_by(ch.obj) != labels.MULTIKUEUE:
            return False
        if row is None:
            return True
        return _unplaced(row) and wl.generation_of(ch.obj) > row["generation"]

    def _resumes(self, row: Mapping[str, Any] | None, ch: JobChange) -> bool:
        """A placed Workload resumed whose need is not known (``_suspension`` reserves it again)."""
        return (row is not None and row["suspended"] and bool(row.get("cluster")) and "podsets" not in row
                and row["uid"] not in self.needs and not ch.deleted and not ch.kind.is_suspended(ch.obj))

    async def _describe(self, ch: JobChange) -> wl.Described:
        runtime = None
        problem = None
        ref = ch.kind.runtime_ref(ch.obj)
        if ref is not None:
            from federation.kube import Resource

            group, _, version = ref.api_version.rpartition("/")
            res = Resource(group, version, ref.plural, ref.kind, namespaced=ref.namespace is not None)
            try:
                runtime = await self.kube.get(res, ref.name, ref.namespace)
            except NotFound:
                where = f"namespace {ref.namespace}" if ref.namespace else "the manager cluster"
                problem = Invalid("spec.runtimeRef.name", f"{ref.kind} {ref.name!r} does not exist in {where}",
                                  fix=f"create the {ref.kind} on the manager cluster or name an existing one")
        return wl.describe(ch.kind, ch.obj, runtime, problem)

    async def _jobs(self, s: AsyncSession, b: Batch, jobs: dict[str, JobChange],
                    described: dict[str, wl.Described]) -> None:
        if not jobs:
            return
        claims: list[dict[str, Any]] = []
        started: set[str] = set()
        for uid, ch in jobs.items():
            if uid in b.w:
                self._change(b, b.w[uid], ch, described.get(uid))
                continue
            d = described.get(uid)
            if d is None or not uid:
                continue
            foreign = started_elsewhere(ch.obj)  # never take over a Job another controller started
            if foreign is not None:
                d = described[uid] = wl.Described(d.columns, None, [foreign])
                started.add(uid)
            cols = {**d.columns, "created_at": b.now, "updated_at": b.now}
            transitions.claimed(cols, wl.problem_text(d.problems) if d.problems else None)
            cols.update(self.queueing.claim_columns(ch.obj, cols, b.now))
            claims.append(cols)
        won = await workload_q.claim(s, claims)
        for cols in claims:
            uid = sys.intern(cols["uid"])  # one string per uid across the engine's maps
            if uid not in won:
                continue  # another dispatcher claimed it first
            ch = jobs[uid]
            d = described[uid]
            self.known[uid] = ch.kind.name
            self.namespace_of[uid] = sys.intern(cols["namespace"])
            self.cache.put(uid, ch.obj, ch.packed)
            b.jobs[uid] = ch.obj  # queued and placed in this batch: not decoded from the cache again
            b.w[uid] = cast(WorkloadRow, cols)
            b.event(uid, "claimed", message=f"{ch.kind.name} {cols['namespace']}/{cols['name']} claimed")
            if d.problems:
                self._reject(b, b.w[uid], d.problems, record=False,
                             reason=STARTED_ELSEWHERE if uid in started else "InvalidJob")
            else:
                assert d.need is not None
                self.needs[uid] = d.need
                b.placement_due = True

    def _change(self, b: Batch, row: WorkloadRow, ch: JobChange, d: wl.Described | None) -> None:
        uid = row["uid"]
        if row["state"] == W.DELETED:
            return
        if ch.deleted or wl.being_deleted(ch.obj):
            self._delete(b, row, "the Job was deleted on the manager cluster")
            return
        self.cache.put(uid, ch.obj, ch.packed)
        b.jobs[uid] = ch.obj
        managed_by = ch.kind.managed_by(ch.obj)
        if managed_by != labels.MULTIKUEUE:
            if row["state"] == W.REJECTED and row["reason"].startswith("managedBy"):
                return
            field_path = ch.kind.managed_by_field
            problem = Invalid(field_path, f"managedBy changed from {labels.MULTIKUEUE!r} to {managed_by!r} after "
                              "mkd claimed the Job; mkd stopped managing it",
                              fix="managedBy is immutable: delete the Job and create it again")
            self._send_delete(b, row, "managedBy changed on the manager cluster")
            transitions.rejected(b, uid, f"managedBy changed to {managed_by!r}", off_cluster=True)
            b.event(uid, "rejected", reason="ManagedByChanged", message=problem.message)
            key = job_key(row)
            conds = jc.refused("ManagedByChanged", problem.message, b.now)
            # the worker copy's status (Running=True, ...) is no longer true of this Job
            b.after.append(lambda: self._write(key, conds, clear=True))
            b.after.append(lambda: self.writer.event(key, "Warning", "ManagedByChanged", problem.message))
            return
        generation = wl.generation_of(ch.obj)
        if generation <= row["generation"]:
            return
        suspended = ch.kind.is_suspended(ch.obj)
        was = row["suspended"]
        b.set_w(uid, generation=generation, suspended=suspended, updated_at=b.now)
        what = "suspended" if suspended and not was else "resumed" if was and not suspended else "updated"
        if _unplaced(row) and d is not None:
            if d.problems:
                if row["state"] != W.REJECTED or row["reason"] != wl.problem_text(d.problems):
                    self._reject(b, row, d.problems)
                return
            transitions.described(b, uid, suspended=suspended, requests=d.columns["requests"],
                                  podsets=d.columns["podsets"])
            if row["state"] == W.REJECTED:
                key = job_key(row)
                cond = wl.condition(labels.CONDITION_REJECTED, False, "Corrected", "the Job is valid now", b.now)
                b.after.append(lambda: self.writer.condition(key, cond))
            assert d.need is not None
            self.needs[uid] = d.need
            b.event(uid, what, message=f"generation {generation}")
            b.placement_due = b.placement_due or not suspended
        elif row["state"] in (W.PLACED, W.RUNNING, W.SUSPENDED) and row["cluster"]:
            if suspended and not was and self.settings.admission_check.enabled:
                self._quota_released(b, row)
                return
            version = row["spec_version"] + 1
            try:
                self._send_place(b, row, ch.kind, ch.obj, attempt=row["attempt"], cluster=row["cluster"],
                                 spec_version=version)
            except messages.MessageRefused as exc:  # the edit cannot travel: say so, keep the copy running
                self._edit_refused(b, row, unsendable_problem(ch.obj, exc), was,
                                   reason="NoClusterKey" if isinstance(exc, NoKey) else "SpecTooLarge")
                return
            b.set_w(uid, spec_version=version)
            if suspended != was:
                self._suspension(b, row, suspended)
            b.event(uid, what, cluster=row["cluster"],
                    message=f"generation {generation}: spec version {version} sent to {row['cluster']}")
            if row["reason"].startswith(EDIT_REFUSED):
                b.set_w(uid, reason="")
                key = job_key(row)
                cond = wl.condition(labels.CONDITION_REJECTED, False, "Corrected", "the edit was sent", b.now)
                b.after.append(lambda: self.writer.condition(key, cond))

    def _edit_refused(self, b: Batch, row: WorkloadRow, problem: Invalid, was_suspended: bool, *,
                      reason: str = "SpecTooLarge") -> None:
        """A placed Job's edit cannot be sent (too large): the worker keeps the last spec it got; the
        Workload's reason, a history row, a condition and a Warning Event say why and how to fix it."""
        uid = row["uid"]
        text = f"{EDIT_REFUSED} to {row['cluster']}; it keeps spec version {row['spec_version']}: {problem.message}"
        b.set_w(uid, suspended=was_suspended, reason=text[:1000])
        b.event(uid, "invalid", cluster=row["cluster"], reason=reason, message=text)
        key = job_key(row)
        cond = wl.condition(labels.CONDITION_REJECTED, True, reason, text, b.now)
        b.after.append(lambda: self.writer.condition(key, cond))
        b.after.append(lambda: self.writer.event(key, "Warning", reason, text))

    def _suspension(self, b: Batch, row: WorkloadRow, suspended: bool) -> None:
        """A placed Job was suspended or resumed: its Workload and current placement say so, and a
        suspended copy (no pods) holds no capacity (see ``dispatcher.states``)."""
        uid, cluster = row["uid"], cast(str, row["cluster"])  # called for a placed Job: it has a cluster
        key = (uid, row["attempt"])
        p = b.p.get(key)
        if suspended:
            transitions.suspended(b, uid)
            if p is not None and p["state"] in (P.ACCEPTED, P.RUNNING):
                b.set_p(key, state=P.SUSPENDED)
            b.after.append(lambda: self.book.release(uid))
            return
        answered = p is not None and p["state"] != P.SENT
        transitions.resumed(b, uid, answered=answered)
        if p is not None and p["state"] == P.SUSPENDED:
            b.set_p(key, state=P.ACCEPTED)
        need = self.needs.get(uid) or wl.need_of(row["kind"], row["podsets"])
        now = b.now

        def reserve() -> None:
            self.book.reserve(uid, cluster, need.total)
            if answered:
                self.book.accepted(uid, now)
        b.after.append(reserve)

    def _quota_released(self, b: Batch, row: WorkloadRow) -> None:
        """Kueue mode: Kueue took its Workload's quota back (evicted, preempted, deactivated; the Job is suspended
        on the manager): the worker copy is deleted, as MultiKueue removes its remote objects, and the Workload
        waits, suspended, until Kueue reserves quota again (then it is placed afresh)."""
        uid, cluster = row["uid"], row.get("cluster")
        reason = "Kueue released its Workload's quota (evicted)"
        self._send_delete(b, row, reason)
        transitions.quota_released(b, uid, reason)
        b.event(uid, "evicted", cluster=cluster, reason="QuotaReleased", message=f"{reason}; its copy on {cluster} "
                "is deleted")
        key = job_key(row)
        conds = jc.requeued("QuotaReleased", reason, b.now)
        b.after.append(lambda: self._write(key, conds, clear=True))

    def _delete(self, b: Batch, row: WorkloadRow, reason: str) -> None:
        uid = row["uid"]
        self._send_delete(b, row, reason)
        transitions.deleted(b, uid, reason)
        b.event(uid, "deleted", cluster=row.get("cluster"), message=reason)

        def forget() -> None:
            self.known.pop(uid, None)
            self.namespace_of.pop(uid, None)
            self.cache.pop(uid, None)
            self.needs.pop(uid, None)
            if self.book.release(uid):
                pass
            self.writer.forget(uid)
        b.after.append(forget)
        b.placement_due = True


def _unplaced(row: Mapping[str, Any]) -> bool:
    """No worker copy: a spec change is a new description, not a Place to a cluster."""
    return row["state"] in (W.PENDING, W.REJECTED) or (row["state"] == W.SUSPENDED and not row["cluster"])
