"""Worker-side causes on the manager Job: why a placed Job's pods do not run (``ImagePullBackOff``,
``CrashLoopBackOff``, ``OOMKilled``, ``Unschedulable`` with the scheduler's message), as Warning Events on the
manager Job, so ``kubectl describe`` there shows what only the worker knew. Every ``worker_causes_seconds`` the
task asks the agents (an Ask ``pods``, through the log-stream broker) about up to ``MAX_PER_ROUND`` placed or
running Workloads, in turn; a pod's reason becomes one Event per distinct reason per Job (``Worker<reason>``,
the message naming the pod and cluster), at most one Event per Job per ``RATE_SECONDS``. Side work: an agent
that does not answer, or an Event that cannot be written, is skipped and tried at a later round.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from dispatcher.db import models
from dispatcher.wire.podstreams import PodStreams, StreamError
from federation.clock import Clock
from federation.messages import JobRef, PlacementKey

log = logging.getLogger(__name__)

MAX_PER_ROUND = 20
"""Workloads asked about per round (a federation of thousands is covered over several rounds)."""
RATE_SECONDS = 60.0
"""At most one worker-cause Event per Job in this many seconds (a Job whose pods flap cannot flood Events)."""
ASK_SECONDS = 5.0
USER = "mkd:worker-causes"
COMPONENT = "mkd-dispatcher"


class WorkerCauses:
    """The ``worker-causes`` task (side work)."""

    def __init__(self, every: float, sessions: Any, kube: Any, streams: PodStreams, clock: Clock, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.sessions = sessions
        self.kube = kube
        self.streams = streams
        self.clock = clock
        self.monotonic = monotonic
        self.seen: dict[str, set[str]] = {}
        """Workload uid -> the reasons already told on its manager Job."""
        self.last_event: dict[str, float] = {}
        self.turn = 0
        self.events = 0

    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.every)
            try:
                await self.round()
            except Exception:  # side work: a failed round is logged and the next one tries again
                log.exception("worker causes: round failed")

    async def _candidates(self) -> list[dict[str, Any]]:
        w, p = models.workloads, models.placements
        stmt = (sa.select(w.c.uid, w.c.namespace, w.c.name, w.c.kind, w.c.api_version, p.c.cluster, p.c.attempt,
                          p.c.epoch)
                .join(p, sa.and_(p.c.workload_uid == w.c.uid, p.c.attempt == w.c.attempt, p.c.cluster == w.c.cluster))
                .where(w.c.state.in_(("placed", "running")), p.c.state.in_(("accepted", "running")))
                .order_by(w.c.uid))
        async with self.sessions() as s:
            return [dict(r) for r in (await s.execute(stmt)).mappings().all()]

    async def round(self) -> int:
        """Ask about the next Workloads in turn; returns the Events written."""
        rows = await self._candidates()
        live = {r["uid"] for r in rows}
        for uid in [u for u in self.seen if u not in live]:
            self.seen.pop(uid, None)
            self.last_event.pop(uid, None)
        if not rows:
            return 0
        start = self.turn % len(rows)
        chosen = (rows[start:] + rows[:start])[:MAX_PER_ROUND]
        self.turn = start + len(chosen)
        written = 0
        for row in chosen:
            written += await self._one(row)
        self.events += written
        return written

    async def _one(self, row: dict[str, Any]) -> int:
        uid = row["uid"]
        last = self.last_event.get(uid)
        if last is not None and self.monotonic() - last < RATE_SECONDS:
            return 0
        ask = self.streams.new_ask(what="pods", placement=PlacementKey(workload_uid=uid, attempt=row["attempt"],
                                                                       epoch=row["epoch"]),
                                   job=JobRef(kind=row["kind"], api_version=row["api_version"],
                                              namespace=row["namespace"], name=row["name"]))

        async def listed() -> list[dict[str, Any]]:
            async for frame in self.streams.ask(row["cluster"], USER, ask):
                if frame.kind == "pods":
                    return list(frame.fields.get("pods") or [])
            return []
        try:
            pods = await asyncio.wait_for(listed(), ASK_SECONDS)
        except (StreamError, TimeoutError) as exc:
            log.debug("worker causes: %s/%s not asked: %s", row["namespace"], row["name"], exc)
            return 0
        told = self.seen.setdefault(uid, set())
        for pod in pods:
            reason = str(pod.get("reason") or "")
            if not reason or reason in told:
                continue
            message = f"pod {pod.get('name')} on {row['cluster']}: {reason}"
            if pod.get("message"):
                message += f": {pod['message']}"
            involved = {"apiVersion": row["api_version"], "kind": row["kind"],
                        "metadata": {"name": row["name"], "namespace": row["namespace"], "uid": uid}}
            await self.kube.event(involved, type="Warning", reason=f"Worker{reason}", message=message,
                                  component=COMPONENT)
            told.add(reason)
            self.last_event[uid] = self.monotonic()
            return 1  # one per round and Job: the rate limit holds the next
        return 0
