"""The demo's queue panel: one line per ClusterQueue and the queueing events worth seeing.

Read from the manager cluster only, as a user with ``kubectl`` sees them. A :class:`QueueLine` is a
ClusterQueue's ``status`` as the dispatcher writes it (pending, admitted, usage per resource and the
part of it borrowed from the cohort) next to its spec (cohort, nominal quota). A :class:`QueueEvent`
is read from a Job's conditions: ``Preempted`` (True, or False with "Previously: " once admitted
again; its message names the preemptor) or ``QuotaReserved=True`` with "borrowing from its cohort".
:class:`QueuePanel` keeps every event the first time it is seen, so a preemption stays in the table
after the victim runs again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from federation import labels
from federation.podset import format_quantity, parse_quantity

log = logging.getLogger(__name__)

PREEMPTED = "preempted"
BORROWS = "borrows"
PREVIOUSLY = "Previously: "


@dataclass(frozen=True)
class QueueLine:
    """One ClusterQueue as the demo shows it."""

    name: str
    cohort: str
    pending: int
    admitted: int
    usage: str      # "cpu 3 of 1, memory 3Gi of 4Gi"
    borrowed: str   # "cpu 2, memory ..." or "" when it borrows nothing

    def plain(self) -> str:
        return (f"clusterqueue {self.name:<8} cohort={self.cohort or '-':<5} pending={self.pending} "
                f"admitted={self.admitted}  using {self.usage or 'nothing'}"
                + (f"  BORROWED {self.borrowed}" if self.borrowed else ""))


@dataclass(frozen=True)
class QueueEvent:
    what: str       # PREEMPTED or BORROWS
    job: str        # namespace/name
    message: str
    at: float = 0.0  # seconds since the demo's start, when first seen

    def plain(self) -> str:
        word = "PREEMPTED" if self.what == PREEMPTED else "BORROWS"
        return f"{word} {self.job}: {self.message}"


def _quantity(value: Any, resource: str) -> Decimal:
    try:
        return parse_quantity(value if value is not None else 0, resource)
    except Exception:  # a status the panel cannot read is shown as zero, never fails the demo
        return Decimal(0)


def queue_line(obj: Mapping[str, Any]) -> QueueLine:
    """A ClusterQueue object (spec and the status mkd writes) as one line of the panel."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    nominal: dict[str, Decimal] = {}
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for res in flavor.get("resources") or []:
                name = str(res.get("name") or "")
                nominal[name] = nominal.get(name, Decimal(0)) + _quantity(res.get("nominalQuota"), name)
    used: dict[str, Decimal] = {}
    borrowed: dict[str, Decimal] = {}
    for flavor in status.get("flavorsUsage") or []:
        for res in flavor.get("resources") or []:
            name = str(res.get("name") or "")
            used[name] = used.get(name, Decimal(0)) + _quantity(res.get("total"), name)
            borrowed[name] = borrowed.get(name, Decimal(0)) + _quantity(res.get("borrowed"), name)
    usage = ", ".join(f"{r} {format_quantity(used.get(r, Decimal(0)), r)} of {format_quantity(q, r)}"
                      for r, q in nominal.items() if used.get(r) or r == "cpu")
    return QueueLine(str((obj.get("metadata") or {}).get("name") or ""),
                     str(spec.get("cohortName") or spec.get("cohort") or ""),
                     int(status.get("pendingWorkloads") or 0), int(status.get("admittedWorkloads") or 0), usage,
                     ", ".join(f"{r} {format_quantity(v, r)}" for r, v in borrowed.items() if v > 0))


def job_events(key: str, job: Mapping[str, Any] | None) -> list[QueueEvent]:
    """The queueing events a manager Job's conditions tell: preempted (by whom), admitted borrowing."""
    out = []
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        message = str(cond.get("message") or "")
        if cond.get("status") != "True":
            # admitted again since: Kueue turns Preempted False, its message "Previously: <the preemption>"
            if cond.get("type") == labels.CONDITION_PREEMPTED and message.startswith(PREVIOUSLY):
                out.append(QueueEvent(PREEMPTED, key, message.removeprefix(PREVIOUSLY)))
            continue
        if cond.get("type") == labels.CONDITION_PREEMPTED:
            out.append(QueueEvent(PREEMPTED, key, message))
        elif cond.get("type") == labels.CONDITION_QUOTA_RESERVED and "borrowing" in message:
            out.append(QueueEvent(BORROWS, key, message))
    return out


@dataclass
class QueuePanel:
    """What the demo shows of its queues: the latest lines and every event seen so far."""

    lines: list[QueueLine] = field(default_factory=list)
    events: list[QueueEvent] = field(default_factory=list)
    borrowed: dict[str, str] = field(default_factory=dict)
    """ClusterQueue -> the most it was seen borrowing (a borrow ends with the borrowing Job)."""
    _printed: dict[str, QueueLine] = field(default_factory=dict)
    _events_printed: int = 0

    def update(self, cluster_queues: Sequence[Mapping[str, Any]], jobs: Mapping[str, Mapping[str, Any] | None],
               elapsed: float) -> None:
        self.lines = sorted((queue_line(o) for o in cluster_queues), key=lambda q: (q.cohort == "", q.cohort, q.name))
        for q in self.lines:
            if q.borrowed:
                self.borrowed[q.name] = q.borrowed
        seen = {(e.what, e.job, e.message) for e in self.events}
        for key, job in jobs.items():
            for e in job_events(key, job):
                if (e.what, e.job, e.message) not in seen:
                    seen.add((e.what, e.job, e.message))
                    self.events.append(QueueEvent(e.what, e.job, e.message, elapsed))

    def shown(self, what: str) -> bool:
        """Has the panel shown this: a Job admitted borrowing and its ClusterQueue's borrowed figure,
        or a preemption."""
        if what == BORROWS:
            return bool(self.borrowed) and any(e.what == BORROWS for e in self.events)
        return any(e.what == what for e in self.events)

    def changes(self) -> tuple[list[QueueLine], list[QueueEvent]]:
        """Lines that changed and events that are new since the last call (the plain view prints them)."""
        lines = [q for q in self.lines if self._printed.get(q.name) != q]
        for q in lines:
            self._printed[q.name] = q
        events = self.events[self._events_printed:]
        self._events_printed = len(self.events)
        return lines, events


async def read_cluster_queues(kube: Any) -> list[dict[str, Any]]:
    """Every ClusterQueue on the manager (none when Kueue's CRDs are not served)."""
    from dispatcher.queueing.watcher import kueue_resource

    try:
        found = await kube.list(kueue_resource("clusterqueues", "ClusterQueue", False))
    except Exception as exc:  # the jobs table works without the panel
        log.debug("ClusterQueues not read: %s", exc)
        return []
    return list(found.items)
