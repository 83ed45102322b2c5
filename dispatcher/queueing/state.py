"""The engine's queueing state: the catalog, the in-memory queues, and their link to Workload rows.

This is the thin layer between the engine (rows, batches, SQL) and the pure scheduler. The engine
calls it at four points: ``claim_columns`` when it claims a Job (priority, queue time, claim
order), ``sync`` whenever a batch's rows are flushed (a pending, not suspended row is queued; a
placed or running one holds its quota; anything else leaves both), ``rebuild`` at start-up and
after a failed batch (quota held and the queues read back from SQL, so a restarted dispatcher
resumes with the same order and usage), and ``schedule`` in the placement round.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import workload as wl
from dispatcher.db import models as m
from dispatcher.placement import ClusterView, Need
from dispatcher.queueing import api
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.fairshare import STRATEGIES
from dispatcher.queueing.quota import FR
from dispatcher.queueing.scheduler import Admitted, Entry, PassResult, Queues
from federation import messages
from federation.errors import Invalid
from federation.podset import format_quantity, parse_quantity

log = logging.getLogger("dispatcher.queueing")
HOLDING = ("placed", "running")
UNRESOLVED = "?"
NEEDS_REMEMBERED = 1024
"""priority_source of a Workload claimed before the priority classes were listed."""


def usage_to_json(usage: Mapping[FR, Decimal]) -> dict[str, str]:
    return {f"{f}/{r}": format_quantity(v, r) for (f, r), v in sorted(usage.items())}


def usage_from_json(data: Mapping[str, str] | None) -> dict[FR, Decimal]:
    out: dict[FR, Decimal] = {}
    for key, text in (data or {}).items():
        flavor, _, res = key.partition("/")  # flavor names have no "/"; resource names may (vendor.com/gpu)
        out[(flavor, res)] = parse_quantity(text, f"usage.{key}")
    return out


def _ts(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


def creation_time(obj: Mapping[str, Any]) -> datetime | None:
    text = wl.meta(obj).get("creationTimestamp")
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def with_scheduling(need: Need, scheduling: Mapping[str, messages.PodScheduling]) -> Need:
    """``need`` with each PodSet's pods also bound by ``scheduling`` (a flavor's nodeSelector and tolerations)."""
    podsets = []
    for ps in need.podsets:
        add = scheduling.get(ps.name)
        if add is None:
            podsets.append(ps)
            continue
        selector = {**dict(ps.node_selector), **add.node_selector}
        tolerations = ps.tolerations + tuple((t.get("key", ""), t.get("operator", "Equal"), t.get("value", ""),
                                             t.get("effect", "")) for t in add.tolerations)
        podsets.append(dataclasses.replace(ps, node_selector=tuple(sorted(selector.items())), tolerations=tolerations))
    return dataclasses.replace(need, podsets=tuple(podsets))


class QueueingState:
    """See the module docstring."""

    def __init__(self, *, starvation_seconds: float, max_attempts_per_pass: int, fair_sharing: bool = False,
                 preemption_strategies: tuple[str, ...] = STRATEGIES, hold_seconds: float = 60.0,
                 prioritize_preemptors: bool = True) -> None:
        self.catalog = Catalog()
        self.queues = Queues(self.catalog, starvation_seconds=starvation_seconds,
                             max_attempts_per_pass=max_attempts_per_pass, fair_sharing=fair_sharing,
                             preemption_strategies=preemption_strategies, hold_seconds=hold_seconds,
                             prioritize_preemptors=prioritize_preemptors)
        self.seq = 0
        self.capacity_version = -1
        """The capacity book's version at the last pass (see ``CapacityBook.version``)."""
        self.cordoned: frozenset[str] = frozenset()
        self.live: frozenset[str] = frozenset()
        """The clusters the last pass could place on (heard from within the heartbeat timeout). One that
        was silent and beats again is room that came back, even when its figures did not change."""
        self.shown: dict[str, tuple[str, datetime]] = {}
        self._needs: dict[tuple[str, bytes], Need] = {}
        """uid -> (reason, when) last written to the Job for a waiting Workload."""
        self.assigned: dict[str, dict[str, messages.PodScheduling]] = {}
        """uid -> per PodSet, what the flavors Kueue assigned add to its pods (Kueue mode, set by
        ``dispatcher.admissioncheck``): its node fit and its Place honour them as they do mkd's own flavors."""

    # --- claim --------------------------------------------------------------------------------

    def claim_columns(self, obj: Mapping[str, Any], cols: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Priority (Kueue's rule), queue time (creationTimestamp) and claim order of a new Workload."""
        self.seq += 1
        job_labels = wl.meta(obj).get("labels") or {}
        classes = [str(p["priorityClassName"]) for p in cols.get("podsets") or [] if p.get("priorityClassName")]
        if not self.catalog.ready:  # the priority classes are not listed yet: resolved by the first pass
            return {"priority": 0, "priority_source": UNRESOLVED, "queue_seq": self.seq,
                    "queued_at": creation_time(obj) or now}
        priority, source = self.catalog.priority(job_labels if isinstance(job_labels, Mapping) else {}, classes)
        return {"priority": priority, "priority_source": source[:253], "queue_seq": self.seq,
                "queued_at": creation_time(obj) or now}

    # --- rows <-> queues ----------------------------------------------------------------------

    def entry(self, row: Mapping[str, Any], obj: Mapping[str, Any], need: Need) -> Entry:
        try:
            placement = api.placement_of(wl.meta(obj).get("annotations"))
        except Invalid as exc:
            log.warning("%s/%s: %s; its cluster annotations are ignored", row["namespace"], row["name"], exc)
            placement = api.ANYWHERE
        excluded = tuple(row.get("excluded") or ())
        if row.get("pinned"):
            placement = api.Placement(frozenset({row["pinned"]}), placement.exclude, placement.selector)
        queued = row.get("queued_at") or row["created_at"]
        stored = row.get("cluster_queue")
        inputs = None
        if row.get("priority_source") == UNRESOLVED:
            label = (wl.meta(obj).get("labels") or {}).get(api.PRIORITY_CLASS_LABEL)
            inputs = (str(label or ""), tuple(str(p["priorityClassName"]) for p in row.get("podsets") or []
                                              if p.get("priorityClassName")))
        assigned = self.assigned.get(row["uid"])
        if assigned:
            need = with_scheduling(need, assigned)
        # uids, namespaces and queue names shared with the engine's other maps (100,000 entries)
        return Entry(priority_inputs=inputs, uid=sys.intern(row["uid"]), namespace=sys.intern(row["namespace"]),
                     name=row["name"], queue=sys.intern(row["queue"]), priority=int(row["priority"]),
                     queued_at=queued.timestamp(), seq=int(row.get("queue_seq") or 0), need=need, placement=placement,
                     excluded=excluded, pinned=row.get("pinned"), stored_cq=sys.intern(stored) if stored else stored)

    def _queues_anew(self, row: Mapping[str, Any], cache: Mapping[str, Mapping[str, Any]]) -> bool:
        """Whether ``sync`` (re)builds the queue entry of this pending, not suspended row."""
        if row["uid"] not in cache:
            return False  # intake has not listed it since start-up; it will come with its Job
        old = self.queues.entries.get(row["uid"])
        return not (old is not None and old.priority == row["priority"] and old.queue == row["queue"]
                    and old.excluded == tuple(row.get("excluded") or ()) and old.pinned == row.get("pinned"))

    def lacking_podsets(self, rows: Iterable[Mapping[str, Any]], cache: Mapping[str, Mapping[str, Any]],
                        needs: Mapping[str, Need]) -> list[str]:
        """uids of these rows that ``sync`` needs the PodSets of and that were loaded without them
        (a batch loads rows light, see ``queries.load_current``): the caller reads them from SQL first.
        That is a pending Workload whose need is not known yet (its Job was not in the cache when
        ``rebuild`` ran, e.g. at start-up before intake's first list) or whose priority is unresolved."""
        return [row["uid"] for row in rows
                if row["state"] == "pending" and not row["suspended"] and "podsets" not in row
                and (row["uid"] not in needs or row.get("priority_source") == UNRESOLVED)
                and self._queues_anew(row, cache)]

    def sync(self, rows: Iterable[Mapping[str, Any]], cache: Mapping[str, Mapping[str, Any]],
             needs: dict[str, Need]) -> None:
        """Bring queue membership and quota in line with these (just written) rows."""
        for row in rows:
            uid = sys.intern(row["uid"])
            state = row["state"]
            if state == "pending" and not row["suspended"]:
                self.queues.release(uid)
                if not self._queues_anew(row, cache):
                    continue
                need = needs.get(uid)
                if need is None:
                    need = needs[uid] = self._need(row["kind"], row["podsets"])
                self.queues.add(self.entry(row, cache[uid], need))  # decoded only here: the cache is compressed
            elif state in HOLDING:
                self.queues.discard(uid)
                if uid not in self.queues.admitted and row.get("cluster_queue") and row.get("usage"):
                    self.queues.hold_quota(Admitted(uid, row["cluster_queue"], usage_from_json(row["usage"]),
                                                    int(row["priority"]), row.get("flavors") or {},
                                                    row["namespace"], row["queue"], _ts(row.get("queued_at")),
                                                    _ts(row.get("reserved_at")), row.get("cluster")))
            else:
                self.queues.discard(uid)
                self.queues.release(uid)
                self.shown.pop(uid, None)

    def _need(self, kind: str, podsets: list[dict[str, Any]]) -> Need:
        """The need of a row read back from SQL, one object for every row of the same PodSets (a restarted
        dispatcher reads 100,000 of them; a claim shares them the same way, ``workload._podsets``)."""
        key = (kind, orjson.dumps(podsets, option=orjson.OPT_SORT_KEYS))
        need = self._needs.get(key)
        if need is None:
            if len(self._needs) >= NEEDS_REMEMBERED:
                self._needs.clear()
            need = self._needs[key] = wl.need_of(kind, podsets)
        return need

    async def rebuild(self, s: AsyncSession, cache: Mapping[str, Mapping[str, Any]], needs: dict[str, Need]) -> None:
        """Quota held and pending Workloads read back from SQL (start-up, or after a failed batch)."""
        w = m.workloads
        self.queues.entries.clear()
        self.queues.admitted.clear()
        self.queues.refresh()
        self.seq = int((await s.execute(sa.select(sa.func.max(w.c.queue_seq)))).scalar() or 0)
        held = await s.execute(sa.select(w.c.uid, w.c.cluster_queue, w.c.usage, w.c.priority, w.c.flavors,
                                         w.c.namespace, w.c.queue, w.c.queued_at, w.c.reserved_at, w.c.cluster)
                               .where(w.c.state.in_(HOLDING), w.c.cluster_queue.is_not(None)))
        for r in held:
            if r.usage:
                self.queues.hold_quota(Admitted(r.uid, r.cluster_queue, usage_from_json(r.usage), r.priority,
                                                r.flavors or {}, r.namespace, r.queue, _ts(r.queued_at),
                                                _ts(r.reserved_at), r.cluster))
        if cache:
            pending = await s.execute(sa.select(w).where(w.c.state == "pending", w.c.suspended.is_(False)))
            self.sync([dict(r._mapping) for r in pending], cache, needs)

    def schedule(self, views: list[ClusterView], *, now: datetime, timeout: float) -> PassResult:
        return self.queues.schedule(views, now=now, timeout=timeout)

    def pod_scheduling(self, uid: str) -> dict[str, messages.PodScheduling]:
        """Per PodSet, what its reserved flavors add to the pods (sent in every Place of this Workload)."""
        assigned = self.assigned.get(uid)
        if assigned is not None:
            return assigned
        held = self.queues.admitted.get(uid)
        if held is None or not held.flavors:
            return {}
        out = {}
        for podset, by_resource in held.flavors.items():
            selector: dict[str, str] = {}
            tolerations: list[dict[str, str]] = []
            for name in sorted(set(by_resource.values())):
                flavor = self.catalog.flavors.get(name)
                if flavor is None:
                    continue
                selector.update(flavor.node_labels)
                tolerations += [t.as_dict() for t in flavor.tolerations if t.as_dict() not in tolerations]
            if selector or tolerations:
                out[podset] = messages.PodScheduling(node_selector=selector, tolerations=tolerations)
        return out

    def reprice(self) -> list[tuple[str, int, str]]:
        """Priorities of Workloads claimed before the catalog was ready, now that it is: (uid, value,
        source) to write to their rows; their queue order changes accordingly."""
        if not self.catalog.ready:
            return []
        out = []
        for e in [e for e in self.queues.entries.values() if e.priority_inputs is not None]:
            label, classes = e.priority_inputs or ("", ())
            value, source = self.catalog.priority({api.PRIORITY_CLASS_LABEL: label} if label else {}, classes)
            e.priority_inputs = None
            if value != e.priority:
                e.priority = value
                self.queues.add(e)   # re-routed at its new place in the order
            out.append((e.uid, value, source))
        return out

    def routed(self) -> list[tuple[str, str | None]]:
        """(uid, ClusterQueue) of pending Workloads whose row names another ClusterQueue (or none):
        written by the placement round so positions can be read from SQL (``mkctl workloads pending``)."""
        out = []
        for e in self.queues.entries.values():
            cq = e.cq or None
            if cq != e.stored_cq:
                e.stored_cq = cq
                out.append((e.uid, cq))
        return out
