"""What an admin asks of the engine: cordon / uncordon / drain a Cluster, requeue / evict / pin a Workload.

The HTTP API puts an :class:`AdminAction` into the engine's inbox and awaits its ``done`` future; the engine
decides it in the batch like every other item (so it is serial with Reports and Job changes of the same
Workload) and resolves the future only after the commit; the verbs are :class:`AdminActions`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher.db.models import clusters, workloads
from dispatcher.db.queries import placements as placement_q
from dispatcher.engine import transitions
from dispatcher.engine.batch import Batch, WorkloadRow, job_key
from dispatcher.engine.core import EngineCore
from dispatcher.mirror import conditions as jc
from dispatcher.states import W

log = logging.getLogger("dispatcher.engine")

Verb = Literal["cordon", "uncordon", "drain", "requeue", "evict", "pin"]
CLUSTER_VERBS = ("cordon", "uncordon", "drain")
WORKLOAD_VERBS = ("requeue", "evict", "pin")


class ActionRefused(Exception):
    """The action cannot be done (unknown target, wrong state); the message says why and what to do."""

    def __init__(self, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class AdminAction:
    """One admin request; ``target`` is a Cluster name or a Workload uid; ``cluster`` only for pin."""

    verb: Verb
    target: str
    cluster: str | None = None
    actor: str = ""
    done: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future(),
                                      compare=False)


def _settle(action: AdminAction, result: str | BaseException) -> None:
    if action.done.done():
        return
    if isinstance(result, BaseException):
        action.done.set_exception(result)
    else:
        action.done.set_result(result)


class AdminActions(EngineCore):
    """The engine part that carries out :class:`AdminAction` items, in the batch like any other item:

    - **cordon**: no new placements on the Cluster (``clusters.cordoned``); what runs there keeps running.
    - **uncordon**: placements allowed again.
    - **drain**: cordon, then every Workload whose current placement on that Cluster is active (sent,
      accepted, running) is taken off it the normal way: a Delete Command for that attempt and the
      Workload back to pending, placed again elsewhere. The placement is marked ``deleted`` in the same
      transaction, so a second drain finds nothing left to move (never run twice).
    - **requeue**: a placed / running Workload is taken off its Cluster (Delete) and placed again,
      wherever it fits now (maybe the same Cluster).
    - **evict**: like requeue, and the Cluster is added to the Workload's ``excluded`` list: it is placed
      on another Cluster, never back on this one.
    - **pin**: only this Cluster may be chosen for the Workload from now on (``workloads.pinned``; ``None``
      removes the pin). A Workload already running elsewhere stays until requeued.
    """

    @property
    def cordoned(self) -> set[str]:
        """Clusters nothing new is placed on (loaded at start, kept by cordon / uncordon)."""
        found: set[str] = self.__dict__.setdefault("_cordoned", set())
        return found

    async def load_cordons(self) -> None:
        async with self.sessions() as s:
            rows = await s.execute(sa.select(clusters.c.name).where(clusters.c.cordoned.is_(True)))
            self.cordoned.clear()
            self.cordoned.update(str(r[0]) for r in rows)

    def excluded_for(self, row: Mapping[str, Any]) -> list[str]:
        """The Clusters a Workload may not be placed on: its own exclusions, cordoned Clusters, and
        every other Cluster when it is pinned."""
        out = list(row.get("excluded") or []) + sorted(self.cordoned)
        pinned = row.get("pinned")
        if pinned:
            out += [name for name in self.book.heartbeats if name != pinned]
        return out

    async def _admin(self, s: AsyncSession, b: Batch, actions: list[AdminAction]) -> None:
        for action in actions:
            try:
                if action.verb in CLUSTER_VERBS:
                    message = await self._cluster_action(s, b, action)
                else:
                    message = await self._workload_action(s, b, action)
            except ActionRefused as exc:
                b.after.append(lambda a=action, e=exc: _settle(a, e))  # type: ignore[misc]
                continue
            log.info("admin %s: %s", action.actor or "-", message)
            b.after.append(lambda a=action, m=message: _settle(a, m))  # type: ignore[misc]

    async def _cluster_action(self, s: AsyncSession, b: Batch, action: AdminAction) -> str:
        name = action.target
        found = (await s.execute(sa.select(clusters.c.cordoned).where(clusters.c.name == name))).first()
        if found is None:
            raise ActionRefused(f"cluster {name!r} is unknown (no heartbeat ever); `mkctl clusters list` shows "
                                "the known ones", status=404)
        by = f" by {action.actor}" if action.actor else ""
        if action.verb == "uncordon":
            await s.execute(sa.update(clusters).where(clusters.c.name == name).values(cordoned=False))
            b.event(None, "uncordoned", cluster=name, reason="Uncordoned", message=f"uncordoned{by}")
            b.after.append(lambda: self.cordoned.discard(name))
            b.placement_due = True
            return f"cluster {name} uncordoned: new placements allowed"
        await s.execute(sa.update(clusters).where(clusters.c.name == name).values(cordoned=True))
        self.cordoned.add(name)  # this batch's placement round already honours it
        if not found.cordoned:
            b.event(None, "cordoned", cluster=name, reason="Cordoned", message=f"cordoned{by}")
        if action.verb == "cordon":
            return f"cluster {name} cordoned: no new placements; what runs there keeps running"
        moved = 0
        for p in await placement_q.placements_on(s, name, placement_q.ACTIVE_PLACEMENT):
            await self._load(s, b, [p.workload_uid])
            row = b.w.get(p.workload_uid)
            if row is None or row["attempt"] != p.attempt:
                continue
            if row["state"] == W.SUSPENDED:  # a suspended copy has no pods: deleted, placed once resumed
                self._send_delete(b, row, f"cluster {name} drained{by}")
                b.event(row["uid"], "drained", cluster=name, reason="Drained", message=f"cluster {name} drained{by}")
                moved += 1
            elif row["state"] in (W.PLACED, W.RUNNING):
                self._take_off(b, row, f"cluster {name} drained{by}", "drained")
                moved += 1
        b.event(None, "drained", cluster=name, reason="Drained", message=f"drained{by}: {moved} Workload(s) moved")
        return f"cluster {name} cordoned and drained: {moved} Workload(s) taken off and queued again"

    async def _workload_action(self, s: AsyncSession, b: Batch, action: AdminAction) -> str:
        uid = action.target
        await self._load(s, b, [uid])
        row = b.w.get(uid)
        if row is None:
            raise ActionRefused(f"workload {uid!r} is unknown", status=404)
        name = f"{row['namespace']}/{row['name']}"
        by = f" by {action.actor}" if action.actor else ""
        if action.verb == "pin":
            target = action.cluster
            if target is not None:
                known = (await s.execute(sa.select(clusters.c.name).where(clusters.c.name == target))).first()
                if known is None:
                    raise ActionRefused(f"cluster {target!r} is unknown; `mkctl clusters list` shows the known ones",
                                        status=404)
            await s.execute(sa.update(workloads).where(workloads.c.uid == uid).values(pinned=target))
            row["pinned"] = target
            b.event(uid, "pinned", cluster=target, reason="Pinned" if target else "Unpinned",
                    message=(f"pinned to {target}{by}" if target else f"unpinned{by}"))
            b.placement_due = True
            if target is None:
                return f"{name} unpinned"
            where = row.get("cluster")
            moved = "" if not where or where == target else f"; it runs on {where} until requeued"
            return f"{name} pinned to {target}{moved}"
        if row["state"] == W.SUSPENDED:
            raise ActionRefused(f"{name} is suspended on the manager cluster: resume it there first")
        if row["state"] not in (W.PLACED, W.RUNNING, W.PENDING):
            raise ActionRefused(f"{name} is {row['state']}: only pending, placed or running Workloads can be "
                                f"{action.verb}d" if action.verb != "evict" else
                                f"{name} is {row['state']}: only placed or running Workloads can be evicted")
        if row["state"] == W.PENDING:
            if action.verb == "evict":
                raise ActionRefused(f"{name} is pending: it runs nowhere, so there is nothing to evict")
            b.placement_due = True
            return f"{name} is pending already; placement tried again now"
        cluster = str(row.get("cluster") or "")
        if action.verb == "evict":
            excluded = list(row["excluded"]) + ([cluster] if cluster and cluster not in row["excluded"] else [])
            b.set_w(uid, excluded=excluded)
            row["excluded"] = excluded
            self._take_off(b, row, f"evicted from {cluster}{by}", "evicted")
            return f"{name} evicted from {cluster}: it is placed again on another cluster"
        self._take_off(b, row, f"requeued from {cluster}{by}", "requeued")
        return f"{name} taken off {cluster} and queued again"

    def _take_off(self, b: Batch, row: WorkloadRow, reason: str, type_: str) -> None:
        """The normal way off a Cluster: Delete for the current attempt, placement ``deleted``, back to
        pending (an admin's move does not count against ``max_placement_attempts``)."""
        uid = row["uid"]
        cluster = row.get("cluster")
        self._send_delete(b, row, reason)
        transitions.taken_off(b, row, reason)
        b.event(uid, type_, cluster=cluster, reason=type_.capitalize(), message=reason)
        key = job_key(row)
        conds = jc.requeued(type_.capitalize(), reason, b.now)
        b.after.append(lambda: self._write(key, conds, clear=True))
        b.placement_due = True
