"""A dispatcher told to stop writes what was waiting to share a write before it exits.

The KubeWriter holds a condition or a passing worker status for a moment so that it shares one status
write with what follows (dispatcher/mirror/kubewriter.py). A graceful stop (an upgrade, a failover) must not
drop what waits: nothing would write it again until the Job's next change, and the manager Job would
go on showing an older state.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dispatcher.db import models as m
from dispatcher.workload import condition
from federation import labels
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import cond, rows
from tests.dispatcher.test_kubewriter import job_and_writer


async def test_flush_writes_what_lingers_at_once(kube: Kube) -> None:
    key, writer, task = await job_and_writer(kube, "w", workers=1, condition_linger=600.0)
    try:
        writer.condition(key, condition(labels.CONDITION_DISPATCHED, True, "Placed", "placed on worker-1",
                                        datetime(2026, 1, 1, tzinfo=UTC)))
        assert await writer.flush(within=10.0)
        got = await kube.get(PYTORCHJOBS, "w", "default")
        assert cond(got, labels.CONDITION_DISPATCHED) is not None
    finally:
        task.cancel()


async def test_a_stopping_dispatcher_writes_the_accepted_condition_that_waited(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        async with running(s) as d:
            assert d.writer is not None and d.engine is not None
            d.writer.status_linger = 600.0  # the Accepted's condition waits for a status that never comes
            await kube.create(PYTORCHJOBS, pytorchjob("waits"), "default")
            await eventually(lambda: agent.places(), what="a Place")

            async def accepted() -> bool:
                placed = await rows(db_url, m.placements)
                return bool(placed) and placed[0].accepted_at is not None
            await eventually(accepted, what="the Accepted recorded")
            assert d.writer.backlog >= 1  # its condition waits to share a write
        got: dict[str, Any] = await kube.get(PYTORCHJOBS, "waits", "default")
        c = cond(got, labels.CONDITION_DISPATCHED)
        assert c is not None and c["status"] == "True", (got.get("status") or {}).get("conditions")
