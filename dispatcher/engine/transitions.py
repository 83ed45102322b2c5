"""Every change of a Workload's state, one function per transition: the only place the engine writes
``workloads.state``. Each writes the state (through the batch, so it passes the table in
:mod:`dispatcher.states`) together with the columns that change with it (reason, cluster); what follows
from the change (Commands, history rows, conditions, the capacity book) stays with the part that decides
it. It imports the batch and the states only; the core and the engine's parts call it.
"""

from __future__ import annotations

from typing import Any, cast

from dispatcher.engine.batch import Batch, WorkloadRow
from dispatcher.states import W, initial, transition

SUSPENDED_REASON = "suspended on the manager cluster; placed once resumed"
SUSPENDED_PLACED = "suspended on the manager cluster"
"""The reason of a placed Workload whose Job was suspended: its worker copy is suspended too."""


def claimed(cols: dict[str, Any], problem_text: str | None) -> None:
    """A new Workload's first state, in its insert's columns: ``rejected`` with ``problem_text`` when
    the Job is invalid, ``suspended`` when the Job is, else ``pending``."""
    if problem_text is not None:
        cols.update(state=initial(W.REJECTED), reason=problem_text)
    elif cols["suspended"]:
        cols.update(state=initial(W.SUSPENDED), reason=SUSPENDED_REASON)
    else:
        cols["state"] = initial(W.PENDING)


def placed(b: Batch, row: WorkloadRow, *, attempt: int, cluster: str, held: dict[str, Any]) -> None:
    """Admitted by a round and sent to ``cluster`` as ``attempt``: ``placed``, in the row only (the
    round's claim query writes it to SQL with the quota ``held``)."""
    row.update(cast(WorkloadRow, {"state": transition(row["state"], W.PLACED), "attempt": attempt, "cluster": cluster,
                                  "reason": "", **held, "reserved_at": b.now}))


def accepted(b: Batch, row: WorkloadRow) -> None:
    """An agent answered the Place (Accepted, or a Status first): a ``placed`` Workload is ``running``."""
    if row["state"] == W.PLACED:
        b.set_w(row["uid"], state=W.RUNNING, reason="", updated_at=b.now)


def suspended(b: Batch, uid: str) -> None:
    """A placed Job was suspended on the manager: ``suspended``, its cluster kept (the copy is suspended)."""
    b.set_w(uid, state=W.SUSPENDED, reason=SUSPENDED_PLACED, updated_at=b.now)


def resumed(b: Batch, uid: str, *, answered: bool) -> None:
    """A placed, suspended Job was resumed: ``running`` if its agent had answered the Place, else ``placed``."""
    b.set_w(uid, state=W.RUNNING if answered else W.PLACED, reason="", updated_at=b.now)


def quota_released(b: Batch, uid: str, reason: str) -> None:
    """Kueue mode: Kueue took a placed Workload's quota back: ``suspended``, off its cluster (the copy is
    deleted), placed again once Kueue reserves quota for it again."""
    b.set_w(uid, state=W.SUSPENDED, reason=reason, cluster=None, updated_at=b.now)


def described(b: Batch, uid: str, *, suspended: bool, requests: Any, podsets: Any) -> None:
    """An unplaced Job's spec changed and is valid: ``suspended`` or ``pending`` with its new needs."""
    b.set_w(uid, state=W.SUSPENDED if suspended else W.PENDING, requests=requests, podsets=podsets,
            reason=SUSPENDED_REASON if suspended else "")


def requeued(b: Batch, row: WorkloadRow, reason: str) -> None:
    """Off its cluster and queued again (lost, refused by its agent, unsendable): ``pending``, or
    ``suspended`` when its Job is (placed once resumed)."""
    if row["suspended"]:
        b.set_w(row["uid"], state=W.SUSPENDED, reason=f"{reason}; {SUSPENDED_REASON}", cluster=None, updated_at=b.now)
    else:
        b.set_w(row["uid"], state=W.PENDING, reason=reason, cluster=None, updated_at=b.now)


def taken_off(b: Batch, row: WorkloadRow, reason: str, *, usage_cleared: bool = False) -> None:
    """Taken off its cluster on purpose (drained, evicted or requeued by an admin, preempted): ``pending``,
    in the row too; ``usage_cleared``: its recorded usage is dropped as well (a preempted Workload)."""
    extra: dict[str, Any] = {"usage": None} if usage_cleared else {}
    b.set_w(row["uid"], state=W.PENDING, reason=reason, cluster=None, **extra, updated_at=b.now)
    row.update({"state": W.PENDING, "cluster": None})


def gave_up(b: Batch, uid: str, text: str) -> None:
    """No placement attempt left: ``failed`` with ``text``."""
    b.set_w(uid, state=W.FAILED, reason=text, cluster=None, updated_at=b.now)


def ended(b: Batch, uid: str, outcome: str) -> None:
    """Its worker Job ended: ``finished`` if ``outcome`` is ``Succeeded``, else ``failed``."""
    state = W.FINISHED if outcome == "Succeeded" else W.FAILED
    b.set_w(uid, state=state, reason=outcome, updated_at=b.now)


def rejected(b: Batch, uid: str, reason: str, *, off_cluster: bool = False) -> None:
    """mkd cannot run it as it is: ``rejected`` with ``reason``; ``off_cluster``: its copy was deleted too."""
    extra: dict[str, Any] = {"cluster": None} if off_cluster else {}
    b.set_w(uid, state=W.REJECTED, reason=reason, **extra, updated_at=b.now)


def deleted(b: Batch, uid: str, reason: str) -> None:
    """Its manager Job is gone: ``deleted`` (terminal)."""
    b.set_w(uid, state=W.DELETED, reason=reason, updated_at=b.now)
