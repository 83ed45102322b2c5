"""Events on the manager Job (``kubectl describe`` showed ``Events: <none>``): placed, pending with its
reason once per change (not per placement pass), requeued and evicted by an admin."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from federation.kube import EVENTS
from tests.dispatcher.harness import (
    PYTORCHJOBS,
    FakeAgent,
    capacity,
    eventually,
    pytorchjob,
    running,
    settings,
)

TOKEN = "t"


async def job_events(kube: Any, name: str) -> list[tuple[str, str, str]]:
    found = await kube.list(EVENTS, "default")
    return [(e["type"], e["reason"], e["message"]) for e in found.items
            if e["involvedObject"]["name"] == name]


async def test_manager_job_gets_events(manager: Path, kube: Any, db_url: str, mqtt_url: str,
                                       topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, api_port=0, api_host="127.0.0.1", api_token=TOKEN,
                 placement_retry_seconds=0.2)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="16")) as w1, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(cpu="8")) as w2, running(s) as d:
        await kube.create(PYTORCHJOBS, pytorchjob("huge", cpu="100"), "default")
        await kube.create(PYTORCHJOBS, pytorchjob("small"), "default")
        await eventually(lambda: w1.places(), what="small placed")
        await eventually(lambda: _has(kube, "small", "Placed"), what="a Placed Event on small")
        placed = [e for e in await job_events(kube, "small") if e[1] == "Placed"]
        assert placed[0][0] == "Normal" and "on worker-1" in placed[0][2]
        await eventually(lambda: _has_message(kube, "huge", "cpu"), what="pending Event")
        before = await job_events(kube, "huge")
        await asyncio.sleep(1.0)  # five more placement passes: the reason did not change, no new Event
        pending = await job_events(kube, "huge")
        assert pending == before and len({m for _, _, m in pending}) == len(pending), pending
        assert {r for _, r, _ in pending} == {"NoFittingCluster"}

        await asyncio.wait_for(d.http.started.wait(), 10)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{d.http.port}",
                                     headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
            assert (await api.post("/api/v1/workloads/default/small/evict")).status_code == 200
            await eventually(lambda: w2.places(), what="small placed on worker-2 after the eviction")
            await eventually(lambda: _has(kube, "small", "Evicted"), what="Evicted Event")
            assert (await api.post("/api/v1/workloads/default/small/requeue")).status_code == 200
            await eventually(lambda: _has(kube, "small", "Requeued"), what="Requeued Event")
            await eventually(lambda: len(w2.places()) == 2, what="small placed again after the requeue")
            await eventually(lambda: _count(kube, "small", "Placed", 3), what="third Placed Event")
        kinds = sorted((t, r) for t, r, _ in await job_events(kube, "small") if r != "NoFittingCluster")
        # placed, evicted, placed again on worker-2, requeued, placed again: one Event each
        assert kinds == [("Normal", "Placed")] * 3 + [("Normal", "Requeued"), ("Warning", "Evicted")], kinds


async def _has(kube: Any, name: str, reason: str) -> bool:
    return reason in [r for _, r, _ in await job_events(kube, name)]


async def _has_message(kube: Any, name: str, text: str) -> bool:
    return any(text in m for _, _, m in await job_events(kube, name))


async def _count(kube: Any, name: str, reason: str, n: int) -> bool:
    return [r for _, r, _ in await job_events(kube, name)].count(reason) == n
