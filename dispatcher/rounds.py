"""The placement round: pending Workloads matched to clusters, compare-and-set, Place Commands queued.

A round reads the oldest pending Workloads, asks the pure :func:`dispatcher.placement.choose` for a
cluster for each against the capacity book, marks the winners placed in one compare-and-set update
(a second dispatcher cannot place the same Workload) and queues one Place per placement. A Workload
that fits nowhere keeps its reason, written to the manager Job's condition when the story changes.
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import workload as wl
from dispatcher.batch import Batch, job_key
from dispatcher.core import EngineCore, oversize_problem
from dispatcher.db import queries as q
from dispatcher.placement import Need, choose
from federation import labels, messages
from federation.kinds.registry import by_name

_DIGITS = re.compile(r"(?<![-\w])[0-9.]+[a-zA-Z]*")  # figures, not the digits in cluster names


class PlacementRound(EngineCore):
    """The engine's part that places pending Workloads (see the module docstring)."""

    def _retry_due(self) -> bool:
        return self.clock.monotonic() - self._last_place >= self.settings.placement_retry_seconds

    @staticmethod
    def _same_story(new: str, old: str, since: datetime, now: datetime) -> bool:
        """Only the figures changed ("most free: worker-3 has 6" → "has 4"), and recently: not worth a
        new event row and condition write on every heartbeat; refreshed at least once a minute."""
        return (_DIGITS.sub("#", new) == _DIGITS.sub("#", old)
                and (now - since).total_seconds() < 60)

    async def _place(self, s: AsyncSession, b: Batch) -> None:
        self._last_place = self.clock.monotonic()
        rows = await q.pending_workloads(s, self.settings.batch_size * 4)
        if not rows:
            return
        views = {v.name: v for v in self.book.views()}
        chosen: list[tuple[dict[str, Any], str, Need, str]] = []
        waiting: list[tuple[dict[str, Any], str]] = []
        for r in rows:
            row = b.w.setdefault(r.uid, dict(r._mapping))
            if r.uid not in self.cache:
                continue  # intake has not listed it since start-up: next round
            need = self.needs.get(r.uid)
            if need is None:
                need = self.needs[r.uid] = wl.need_of(r.kind, r.podsets)
            decision = choose(need, views.values(), now=b.now, timeout=self.settings.heartbeat_timeout_seconds,
                              exclude=self.excluded_for(row))  # type: ignore[attr-defined]
            if decision.cluster is None:
                if decision.reason != r.reason and not self._same_story(decision.reason, r.reason, r.updated_at, b.now):
                    waiting.append((row, decision.reason))
                continue
            self.book.take(views[decision.cluster], need)
            chosen.append((row, decision.cluster, need, decision.reason))
        by_cluster: dict[str, list[str]] = {}
        for row, cluster, _, _ in chosen:
            by_cluster.setdefault(cluster, []).append(row["uid"])
        won = await q.mark_placed(s, by_cluster, b.now)
        placements = []
        for n, (row, cluster, need, why) in enumerate(chosen):
            uid = row["uid"]
            if uid not in won:
                continue
            if n % 100 == 99:
                await asyncio.sleep(0)
            attempt = won[uid]
            row.update(state="placed", attempt=attempt, cluster=cluster, reason="")
            kind = by_name(row["kind"])
            try:
                self._send_place(b, row, kind, self.cache[uid], attempt=attempt, cluster=cluster,
                                 spec_version=row["spec_version"])
            except messages.MessageRefused as exc:  # e.g. above the payload limit: cannot be sent anywhere
                # No placement row (a `sent` one would be expected on the cluster forever) and the
                # attempt is given back: nothing was placed.
                row.update(attempt=attempt - 1, cluster=None)
                b.set_w(uid, cluster=None, attempt=attempt - 1)
                self._reject(b, row, [oversize_problem(self.cache[uid], exc)])
                continue
            placements.append({"workload_uid": uid, "attempt": attempt, "cluster": cluster, "epoch": self.epoch,
                               "state": "sent", "spec_version": row["spec_version"], "created_at": b.now,
                               "reason": why})
            b.event(uid, "placed", cluster=cluster, message=f"attempt {attempt} on {cluster}: {why}")
            self.book.reserve(uid, cluster, need.total)
        await q.add_placements(s, placements)
        for row, reason in waiting:
            b.set_w(row["uid"], reason=reason, updated_at=b.now)
            b.event(row["uid"], "pending", reason="NoFittingCluster", message=reason)
            key = job_key(row)
            cond = wl.condition(labels.CONDITION_DISPATCHED, False, "NoFittingCluster", reason, b.now)
            b.after.append(lambda key=key, cond=cond: self.writer.condition(key, cond))  # type: ignore[misc]
