"""A heartbeat that changes nothing but its time is not written to the cluster's row every time: with 1,000
clusters beating every 10 s that was 100 row writes a second of idle work; the lease desk still writes
every grant, and the row is written again when anything in it changes or half the timeout passed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.db import models as m
from dispatcher.db.queries import clusters as cluster_q
from federation.kube import Kube
from tests.dispatcher.harness import FakeAgent, capacity, eventually, running, settings
from tests.dispatcher.test_flow import rows


async def test_unchanged_heartbeats_renew_the_lease_without_rewriting_the_cluster_row(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[dict[str, Any]] = []
    upsert = cluster_q.upsert_cluster

    async def upserting(session: Any, row: dict[str, Any]) -> None:
        written.append(dict(row))
        await upsert(session, row)
    monkeypatch.setattr(cluster_q, "upsert_cluster", upserting)
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=30.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="64")) as agent, running(s):
        for _ in range(6):
            n = len(agent.leases)
            await agent.heartbeat()
            await eventually(lambda n=n: len(agent.leases) > n, what="a Lease for every heartbeat")  # type: ignore[misc]
        assert len(written) == 1, "only the first of six identical heartbeats is written"
        agent.cap = capacity(cpu="32")  # room changed: written at once
        n = len(agent.leases)
        await agent.heartbeat()
        await eventually(lambda: len(agent.leases) > n, what="a Lease")

        async def shows_32() -> bool:
            return [r.capacity["free"]["cpu"] for r in await rows(db_url, m.clusters)] == ["32"]
        await eventually(shows_32, what="the changed capacity in the row")
        assert len(written) == 2


async def test_a_cluster_back_from_lost_has_its_row_written_again(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=1.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await agent.heartbeat()
        await eventually(lambda: agent.leases, what="a Lease")

        async def lost() -> bool:
            return [r.lost_since is not None for r in await rows(db_url, m.clusters)] == [True]
        await eventually(lost, within=10, what="the silent cluster marked lost in its row")
        await agent.heartbeat()  # the same content as before it was lost

        async def back() -> bool:
            return [(r.lost_since, r.online) for r in await rows(db_url, m.clusters)] == [(None, True)]
        await eventually(back, within=10, what="the row says online again")
