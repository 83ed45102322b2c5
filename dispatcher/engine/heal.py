"""After a start, mkd's conditions on the manager Jobs are made to agree with the Workloads' states.

The KubeWriter holds condition writes in memory, some on purpose for a moment (dispatcher/mirror/kubewriter.py); a
dispatcher that is killed, crashes or loses its node loses them, and nothing would write them again until the
Job's next change (for a Job whose status never changes again: never). So a started dispatcher is
level-triggered for its own conditions: while intake's first list fills the Job cache,
:meth:`Healing.note_listed` records which of mkd's conditions each claimed Job shows True (a small bit mask);
once every kind is listed, intake queues one :class:`~dispatcher.engine.batch.Heal` and the engine, in that batch's
transaction, reads the placed / running / finished / failed Workloads with their current placement (one query)
and, for each Job lacking what its state implies, queues that step's conditions again
(:mod:`dispatcher.mirror.conditions`, as at the transition), with the messages and times SQL holds. A second query
reads the Workloads mkd refused for good (rejected: an invalid Job, one started elsewhere, managedBy changed;
failed: placement attempts used up) with the event rows that recorded the refusal: a Job not showing
MultiClusterRejected=True gets the latest refusal's conditions and one Warning Event again, with that row's
reason, message and time (the writer writes a Job's Events after its status, so a Job lacking the condition
never got them either; an invalid Job's several problems come back as one Event with their joined text, as SQL
holds it). Only Jobs that disagree are written; pending Workloads need nothing here (the first placement pass
writes their reason, ``shown`` being empty), nor do suspended ones (left as they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import workload as wl
from dispatcher.db.queries import workloads as workload_q
from dispatcher.engine.batch import Batch, job_key
from dispatcher.engine.core import EXHAUSTED, GAVE_UP, EngineCore, log
from dispatcher.handover.safety import REASON as STARTED_ELSEWHERE
from dispatcher.mirror import conditions as jc
from dispatcher.states import P, W
from federation import labels
from federation.kinds.registry import by_name

DISPATCHED, RESERVED, ADMITTED, FINISHED, PENDING, REJECTED = 1, 2, 4, 8, 16, 32
_BITS = {labels.CONDITION_DISPATCHED: DISPATCHED, labels.CONDITION_QUOTA_RESERVED: RESERVED,
         labels.CONDITION_ADMITTED: ADMITTED, labels.CONDITION_FINISHED: FINISHED, labels.CONDITION_PENDING: PENDING,
         labels.CONDITION_REJECTED: REJECTED}
REFUSALS = {"rejected": ("", ("InvalidJob", STARTED_ELSEWHERE, "ManagedByChanged")),
            "failed": (GAVE_UP, (EXHAUSTED,))}
"""Final Workload state -> how mkd's refusal text begins and the event reasons of the refusals that put a
Workload there (dispatcher/engine/core.py ``_reject`` and ``_requeue``, dispatcher/engine/jobchanges.py); a Workload
failed by its worker Job (reason Failed) is not read."""


def shows(obj: Mapping[str, Any]) -> int:
    """The bit mask of mkd's conditions ``obj`` has True."""
    mask = 0
    for c in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("status") == "True":
            mask |= _BITS.get(c.get("type"), 0)  # type: ignore[arg-type]
    return mask


class Healing(EngineCore):
    """The engine's part that writes again what a killed dispatcher lost (see the module docstring).

    The worker status mirrored onto the Job is not SQL's to give (only its sequence number is stored): a
    status lost this way comes again from the agent, which a started dispatcher sends a Resync as soon as it
    meets that agent's report stream part-way (``dispatcher.wire.streams``), and which then reports every
    expected Job again (``force``), mirrored as at first.
    """

    def note_listed(self, obj: Mapping[str, Any]) -> None:
        """Intake's first list saw ``obj``: remember what it shows, if mkd claimed it."""
        uid = wl.uid_of(obj)
        if uid in self.known:
            self.listed_shows[uid] = shows(obj)

    async def _heal(self, s: AsyncSession, b: Batch) -> None:
        listed = self.listed_shows
        if not listed:
            return
        b.after.append(lambda: setattr(self, "listed_shows", {}))  # once committed (a retried batch reads it again)
        written = 0
        for r in await workload_q.settled(s):
            mask = listed.get(r.uid)
            if mask is None:
                continue
            conds = self._implied(r, mask, b)
            if conds:
                written += 1
                key = job_key({"uid": r.uid, "kind": r.kind, "namespace": r.namespace, "name": r.name})
                b.after.append(lambda key=key, conds=conds: self._write(key, conds))  # type: ignore[misc]
        refused = {r.uid: r for r in await workload_q.refusals(s, REFUSALS)}  # the latest refusal of each
        for r in refused.values():
            mask = listed.get(r.uid)
            if mask is None or mask & REJECTED:
                continue
            written += 1
            key = job_key({"uid": r.uid, "kind": r.kind, "namespace": r.namespace, "name": r.name})
            b.after.append(lambda key=key, r=r: self._refuse(key, r.reason, r.message, r.at))  # type: ignore[misc]
        if written:
            log.warning("%d manager Jobs lacked the conditions of their Workload's state (writes lost when the "
                        "last dispatcher stopped): writing them again", written)

    def _refuse(self, key: Any, reason: str, message: str, at: Any) -> None:
        """A refusal's conditions and Warning Event, as at the time (core ``_reject`` / ``_requeue``)."""
        if reason == EXHAUSTED:
            self._write_gave_up(key, message, at)
            return
        # (managedBy changed: not cleared, the Job's status may be its new controller's by now)
        self._write(key, jc.refused(reason, message, at))
        self.writer.event(key, "Warning", reason, message)

    def _implied(self, r: Any, mask: int, b: Batch) -> jc.Conditions:
        """The conditions ``r``'s state implies, if the Job (``mask``) lacks any of them; else none."""
        accepted = r.accepted_at is not None and r.state != W.PLACED
        ended = r.state in (W.FINISHED, W.FAILED) and r.p_state in (P.FINISHED, P.FAILED)
        if r.state in (W.FINISHED, W.FAILED) and not ended:
            return []  # mkd gave up on it (refused, attempts exhausted): not this pass's to say
        need = (DISPATCHED if accepted else 0) | (RESERVED | ADMITTED if r.cluster_queue else 0)
        need |= FINISHED if ended and r.cluster_queue else 0
        if mask & need == need and not (mask & PENDING and need):
            return []
        conds: jc.Conditions = []
        if r.cluster_queue:
            conds += jc.admitted(jc.quota_text(r.cluster_queue, r.flavors), jc.admitted_text(r.cluster),
                                 r.created_at or b.now)
        if accepted:
            conds += jc.accepted(jc.accepted_text(r.cluster, r.attempt), r.accepted_at)
        if ended and r.cluster_queue:
            job = self.cache.get(r.uid)
            done = by_name(r.kind).finished(job) if job is not None else None
            outcome: Literal["Succeeded", "Failed"] = "Succeeded" if r.p_state == P.FINISHED else "Failed"
            conds += jc.finished(outcome, done.message if done else "", r.finished_at or b.now)
        return conds
