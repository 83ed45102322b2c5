"""Kubernetes Events on the manager Job for what mkd decided: placed, pending, requeued, evicted, ...

``kubectl describe`` on a manager Job shows where mkd put it and why it waits. After each batch's
commit the engine hands its history rows here; the ones users act on become Events through the
:class:`~dispatcher.mirror.kubewriter.KubeWriter` (serial per Job, after the conditions). ``pending`` rows
are written by the placement round only when the reason's story changes (not once per pass), so each
becomes one Event; the same holds for the others, which happen once per decision. Rejections and
give-ups already get their Warning Events where they are decided (``dispatcher.engine.core``), and so does a
preemption its Normal ``Preempted`` (as Kueue's; ``dispatcher.engine.rounds``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from dispatcher.engine.batch import job_key

EVENTS: Mapping[str, tuple[Literal["Normal", "Warning"], str]] = {
    "placed": ("Normal", "Placed"),
    "pending": ("Normal", "Pending"),
    "requeued": ("Normal", "Requeued"),
    "evicted": ("Warning", "Evicted"),
    "drained": ("Warning", "Drained"),
    "pinned": ("Normal", "Pinned"),
}
"""History event type → (Event type, Event reason) on the manager Job."""


def _row_of(uid: str, rows: Mapping[str, Mapping[str, Any]],
            jobs: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Job's address from the batch's row, or from the engine's Job cache (a waiting Workload's
    new reason is written without loading its row)."""
    row = rows.get(uid)
    if row is not None and row.get("name"):
        return row
    job = jobs.get(uid)
    meta = job.get("metadata") if job else None
    if not job or not isinstance(meta, Mapping) or not meta.get("name"):
        return None
    return {"uid": uid, "kind": job.get("kind"), "namespace": meta.get("namespace", ""), "name": meta["name"]}


def announce(writer: Any, rows: Mapping[str, Mapping[str, Any]], history: Iterable[Mapping[str, Any]],
             jobs: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """Queue an Event for each history row worth one; ``rows`` are the batch's Workloads by uid,
    ``jobs`` the engine's cache of manager Jobs by uid."""
    queued = 0
    for h in history:
        what = EVENTS.get(str(h.get("type")))
        uid = h.get("workload_uid")
        row = _row_of(str(uid), rows, jobs or {}) if uid and what is not None else None
        if what is None or row is None or (h.get("type") == "evicted" and h.get("reason") == "Preempted"):
            continue  # a preemption has its Normal "Preempted" Event where it is decided (dispatcher.engine.rounds)
        type_, reason = what
        if h.get("type") == "pending" and h.get("reason"):
            reason = str(h["reason"])  # why it waits: NoFittingCluster, ...
        writer.event(job_key(row), type_, reason, str(h.get("message") or ""))
        queued += 1
    return queued
