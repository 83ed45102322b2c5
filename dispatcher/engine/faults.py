"""What the engine does when deciding a batch fails: hold everything through an outage, isolate the rest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dispatcher import workload as wl
from dispatcher.db.queries import events as event_q
from dispatcher.db.queries import workloads as workload_q
from dispatcher.engine.batch import Item, JobChange, ReportIn, job_key
from dispatcher.engine.core import EngineCore
from federation import labels, messages
from federation.retry import Backoff

log = logging.getLogger("dispatcher.engine")


@dataclass
class Parked:
    """An item that failed on its own; tried again at ``due`` (monotonic seconds)."""

    item: Item
    due: float
    backoff: Backoff


def subject(item: Item) -> str | None:
    """The Workload uid an item is about, if any."""
    if isinstance(item, JobChange):
        return wl.uid_of(item.obj) or None
    if isinstance(item, ReportIn) and not isinstance(item.report, messages.Inventory | messages.Heartbeat):
        return item.report.placement.workload_uid
    return None


def describe(item: Item) -> str:
    if isinstance(item, JobChange):
        meta = item.obj.get("metadata") or {}
        what = "deletion" if item.deleted else "change"
        return f"{item.kind.name} {meta.get('namespace', '')}/{meta.get('name', meta.get('uid', ''))} {what}"
    if isinstance(item, ReportIn):
        return f"{item.report.type} Report from {item.report.cluster}"
    return type(item).__name__


class FaultHandling(EngineCore):
    """The engine's part that parks failing items and records why.

    Two kinds of failure, told apart by the error tree: :class:`~federation.errors.Temporary` (the database's
    outages mapped onto it as :class:`~federation.errors.DatabaseUnavailable` by :func:`dispatcher.db.mapped`,
    the manager cluster's API by ``federation.kube``):

    - **An outage** (the database or the manager's API server is down, restarting, failing over): the
      batch is held and tried again, with the one :class:`~federation.retry.Backoff` (capped at
      ``outage_retry_max_seconds``, reset after the first success), for as long as the outage lasts.
      Nothing is dropped; items that arrive meanwhile wait in the inbox, and the first batch after
      recovery starts from the database's state (the in-memory view is rebuilt).
    - **A failure of the items themselves** (a bug, a row the code cannot handle): the batch is tried
      once more, then split in halves until the one failing item is found; the others are decided. That
      item gets a permanent error recorded where a user looks — an ``error`` history row, the
      Workload's reason, a ``MultiClusterDispatched=False`` condition with reason ``InternalError`` and
      a Warning Event on the manager Job — and is **parked**, not dropped: it is tried again with a
      backoff capped at ``parked_retry_max_seconds``, and superseded by any newer change of its Job.
    """

    parked: list[Parked]

    def _park(self, item: Item, backoff: Backoff | None = None) -> None:
        backoff = backoff or Backoff(self.settings.outage_retry_max_seconds, self.settings.parked_retry_max_seconds)
        self.parked.append(Parked(item, self.clock.monotonic() + backoff.failed(), backoff))

    def _supersede(self, items: list[Item]) -> None:
        """A newer change of a Job replaces its parked one (the newer carries the whole object)."""
        fresh = {wl.uid_of(i.obj) for i in items if isinstance(i, JobChange)}
        if fresh and self.parked:
            self.parked = [p for p in self.parked if not (isinstance(p.item, JobChange) and subject(p.item) in fresh)]

    def _due_parked(self) -> list[Item]:
        now = self.clock.monotonic()
        due = [p for p in self.parked if p.due <= now]
        if not due:
            return []
        self.parked = [p for p in self.parked if p.due > now]
        self._retrying.extend(due)
        return [p.item for p in due]

    async def _give_up(self, item: Item, exc: BaseException) -> None:
        """``item`` fails on its own, again and again: record a permanent error, park it for later."""
        again = next((p for p in self._retrying if p.item is item), None)
        if again is not None:
            self._retrying.remove(again)
        self._park(item, again.backoff if again is not None else None)
        text = f"internal error deciding the {describe(item)}: {type(exc).__name__}: {exc}"[:1000]
        if again is not None:
            log.error("%s (failed again; next try in %.0fs)", text, self.parked[-1].due - self.clock.monotonic())
            return
        log.error("%s; the item is kept and tried again later", text, exc_info=exc)
        uid = subject(item)
        try:
            async with self.sessions.begin() as s:
                rows = await workload_q.load_workloads(s, [uid]) if uid else {}
                row = rows.get(uid) if uid else None
                if row is not None:
                    await workload_q.update_workloads(s, [{"b_uid": uid, "reason": text[:1000], "updated_at": self.clock.now()}])
                await event_q.add_events(s, [{"workload_uid": uid if row is not None else None, "at": self.clock.now(),
                                        "type": "error", "cluster": None, "reason": "InternalError",
                                        "message": text}])
        except Exception as record_exc:  # recording is best effort; the item is parked either way
            log.warning("could not record the error in the database: %r", record_exc)
            return
        if row is not None:
            key = job_key(dict(row._mapping))
            cond = wl.condition(labels.CONDITION_DISPATCHED, False, "InternalError", text, self.clock.now())
            self.writer.condition(key, cond)
            self.writer.event(key, "Warning", "InternalError", text)
