"""What flows through the engine: inbox items and the per-batch scratchpad.

Intake puts :class:`JobChange`, the report subscriber :class:`ReportIn` and :class:`ResyncDue`, the
ticker :class:`Tick` into the engine's inbox. A :class:`Batch` collects one transaction's row
updates, history events, outbox rows and the after-commit actions (condition, status and Event
writes to the manager cluster), so nothing leaves the process before the commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict, cast

from dispatcher.intake.jobcache import pack, unpack
from dispatcher.mirror.kubewriter import JobKey
from dispatcher.states import PlacementState, WorkloadState, member, transition
from federation import messages
from federation.kinds.base import JobKind


class JobChange:
    """A manager Job was added / changed (``deleted`` False) or is gone (True).

    The Job waits in the inbox packed (compressed JSON, dispatcher/intake/jobcache.py) and is decoded when
    the engine first reads ``obj``: a restarted dispatcher's first list puts every Job of the manager
    in the inbox at once, 10 KiB of Python objects each when whole."""

    __slots__ = ("_obj", "_raw", "deleted", "kind")

    def __init__(self, kind: JobKind, obj: Mapping[str, Any], deleted: bool = False) -> None:
        self.kind = kind
        self.deleted = deleted
        self._raw: bytes | None = pack(obj)
        self._obj: dict[str, Any] | None = None

    @property
    def obj(self) -> dict[str, Any]:
        if self._obj is None:
            assert self._raw is not None
            self._obj = unpack(self._raw)
        return self._obj

    @property
    def packed(self) -> bytes | None:
        """The Job as :func:`~dispatcher.intake.jobcache.pack` packed it, as intake saw it: what the Job cache
        stores (``JobCache.put``), without packing it again."""
        return self._raw

    def __repr__(self) -> str:
        return f"JobChange({self.kind.name}, {self.obj.get('metadata', {}).get('uid')!r}, deleted={self.deleted})"


@dataclass(frozen=True)
class ReportIn:
    report: messages.Accepted | messages.Rejected | messages.Status | messages.Inventory | messages.Heartbeat
    received_at: datetime


@dataclass(frozen=True)
class Tick:
    """Time passed: retry pending Workloads, check heartbeat ages, look for lost Reports."""


@dataclass(frozen=True)
class ResyncDue:
    """Reports from ``cluster`` may have been lost: send it a Resync (see ``dispatcher.wire.streams``).

    ``lost`` False: only a stream met part-way (routine when this dispatcher starts or reconnects)."""

    cluster: str
    lost: bool = True


@dataclass(frozen=True)
class Heal:
    """Intake listed every kind after a start: write mkd's conditions the listed Jobs lack (dispatcher/engine/heal.py)."""


Item = JobChange | ReportIn | Tick | ResyncDue | Heal


class _Inbox(asyncio.Queue[Item]):
    """FIFO, except that heartbeats go ahead of every other item waiting, in their own order. Each
    heartbeat is answered with a Lease running from when the agent sent it (``worker_agent.lease``):
    behind a backlog of Reports (10-14 s in the chaos partitions at load 15-30) every short lease was
    spent before its renewal arrived, and healthy agents fenced their Jobs again and again."""

    _beats = 0
    """How many heartbeats lead the queue (they are always its first items)."""

    def _put(self, item: Item) -> None:
        if isinstance(item, ReportIn) and isinstance(item.report, messages.Heartbeat):
            self._queue.insert(self._beats, item)  # type: ignore[attr-defined]
            self._beats += 1
        else:
            self._queue.append(item)  # type: ignore[attr-defined]

    def _get(self) -> Item:
        item: Item = self._queue.popleft()  # type: ignore[attr-defined]
        if self._beats:
            self._beats -= 1
        return item


def engine_inbox() -> asyncio.Queue[Item]:
    """The engine's inbox (see ``_Inbox``)."""
    return _Inbox()


class WorkloadRow(TypedDict, total=False):
    """A ``workloads`` row as the engine holds it in a batch (the light columns; ``requests`` and ``podsets``
    only when a decision needs them). ``state`` is a :class:`~dispatcher.states.WorkloadState` value, changed
    only through :meth:`Batch.set_w`."""

    uid: str
    namespace: str
    name: str
    kind: str
    api_version: str
    queue: str
    priority: int
    state: str
    reason: str
    spec_version: int
    generation: int
    suspended: bool
    requests: dict[str, str]
    podsets: list[dict[str, Any]]
    attempt: int
    cluster: str | None
    excluded: list[str]
    created_at: datetime
    updated_at: datetime
    labels: dict[str, str]
    pinned: str | None
    queued_at: datetime | None
    queue_seq: int
    priority_source: str
    cluster_queue: str | None
    flavors: dict[str, Any] | None
    usage: dict[str, str] | None
    reserved_at: datetime | None


class PlacementRow(TypedDict, total=False):
    """A ``placements`` row (one attempt) as the engine holds it in a batch. ``state`` is a
    :class:`~dispatcher.states.PlacementState` value, changed only through :meth:`Batch.set_p`."""

    id: int
    workload_uid: str
    attempt: int
    cluster: str
    epoch: int
    state: str
    reason: str
    spec_version: int
    last_status_seq: int
    created_at: datetime
    accepted_at: datetime | None
    finished_at: datetime | None


@dataclass
class Batch:
    now: datetime
    w: dict[str, WorkloadRow] = field(default_factory=dict)           # workload rows, mutable copies
    w_updates: dict[str, dict[str, Any]] = field(default_factory=dict)
    p: dict[tuple[str, int], PlacementRow] = field(default_factory=dict)
    p_updates: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    after: list[Callable[[], object]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)            # (event type, uid) for observers
    placement_due: bool = False
    resync: set[str] = field(default_factory=set)                        # clusters sent a Resync this batch
    place_keys: dict[int, tuple[str, int]] = field(default_factory=dict)  # outbox id -> Place's placement
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Manager Jobs claimed or changed in this batch, decoded: read here, not decoded from the cache again
    (queued and placed in the same batch). Read only."""

    def set_w(self, uid: str, **values: Any) -> None:
        if "state" in values:  # every state change passes the one table (dispatcher.states)
            values["state"] = transition(self.w[uid]["state"], member(WorkloadState, values["state"])).value
        self.w[uid].update(cast(WorkloadRow, values))
        self.w_updates.setdefault(uid, {}).update(values)

    def set_p(self, key: tuple[str, int], **values: Any) -> None:
        if "state" in values:
            values["state"] = transition(self.p[key]["state"], member(PlacementState, values["state"])).value
        self.p[key].update(cast(PlacementRow, values))
        self.p_updates.setdefault(key, {}).update(values)

    def event(self, uid: str | None, type_: str, *, cluster: str | None = None, reason: str = "",
              message: str = "") -> None:
        self.events.append({"workload_uid": uid, "at": self.now, "type": type_, "cluster": cluster,
                            "reason": reason[:128], "message": message})
        if uid is not None:
            self.notes.append((type_, uid))


class JobsOf(Mapping[str, dict[str, Any]]):
    """The Job cache as a batch reads it: a Job decoded in the batch (``Batch.jobs``) as it is, others from
    the cache (decoded each time)."""

    def __init__(self, batch: Batch, cache: Mapping[str, dict[str, Any]]) -> None:
        self.batch = batch
        self.cache = cache

    def __getitem__(self, uid: str) -> dict[str, Any]:
        job = self.batch.jobs.get(uid)
        return job if job is not None else self.cache[uid]

    def __contains__(self, uid: object) -> bool:
        return uid in self.batch.jobs or uid in self.cache

    def __iter__(self) -> Iterator[str]:
        return iter(self.cache)

    def __len__(self) -> int:
        return len(self.cache)


def job_key(row: Mapping[str, Any]) -> JobKey:
    return JobKey(row["uid"], row["kind"], row["namespace"], row["name"])
