"""History pruning (``history_retention_seconds``): a deleted Job's Workload, its placements and events go once
older than the retention, chunk by chunk; a Workload whose Job still exists, one deleted recently, and one a
cluster may still run are kept, and so are recent cluster events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from dispatcher.db import history
from dispatcher.db import models as m
from dispatcher.settings import DispatcherSettings
from federation.clock import FakeClock

NOW = datetime(2026, 3, 1, tzinfo=UTC)
DAY = timedelta(days=1)


def workload(uid: str, state: str, updated: datetime) -> dict[str, Any]:
    return {"uid": uid, "namespace": "ns", "name": uid, "kind": "PyTorchJob", "api_version": "kubeflow.org/v1",
            "queue": "", "state": state, "requests": {}, "podsets": [], "excluded": [], "created_at": updated,
            "updated_at": updated}


async def test_deleted_workloads_past_the_retention_go_with_their_history(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(history, "PRUNE_CHUNK", 2)  # several chunks, each its own transaction
    engine = create_async_engine(db_url)
    sessions = async_sessionmaker(engine)
    rows = [workload(f"old-{i}", "deleted", NOW - 40 * DAY) for i in range(5)] + [
        workload("recent", "deleted", NOW - 2 * DAY),  # deleted within the retention
        workload("finished", "finished", NOW - 90 * DAY),  # its Job is still on the manager
        workload("held", "deleted", NOW - 40 * DAY),  # a cluster may still run it
    ]
    try:
        async with sessions.begin() as s:
            await s.execute(sa.insert(m.workloads), rows)
            await s.execute(sa.insert(m.placements), [
                {"workload_uid": r["uid"], "attempt": 1, "cluster": "w1", "epoch": 1,
                 "state": "running" if r["uid"] == "held" else "deleted", "created_at": r["created_at"]}
                for r in rows])
            await s.execute(sa.insert(m.events), [
                *({"workload_uid": r["uid"], "at": r["updated_at"], "type": "claimed"} for r in rows),
                {"workload_uid": None, "at": NOW - 40 * DAY, "type": "cluster_lost", "cluster": "w1"},
                {"workload_uid": None, "at": NOW - DAY, "type": "cluster_online", "cluster": "w1"}])
        pruner = history.HistoryPruner(sessions, FakeClock(NOW), DispatcherSettings.model_fields[
            "history_retention_seconds"].default)
        assert pruner.retention == 30 * 86_400
        assert await pruner.turn() == 5
        async with sessions() as s:
            left = sorted(r[0] for r in await s.execute(sa.select(m.workloads.c.uid)))
            placed = sorted(r[0] for r in await s.execute(sa.select(m.placements.c.workload_uid)))
            told = sorted(str(r[0]) for r in await s.execute(sa.select(m.events.c.workload_uid)))
            kinds = sorted(r[0] for r in await s.execute(sa.select(m.events.c.type)
                                                         .where(m.events.c.workload_uid.is_(None))))
        assert left == placed == ["finished", "held", "recent"]
        assert told == ["None", "finished", "held", "recent"]
        assert kinds == ["cluster_online"]
        assert await pruner.turn() == 0
    finally:
        await engine.dispose()


async def test_no_retention_keeps_everything(db_url: str) -> None:
    engine = create_async_engine(db_url)
    sessions = async_sessionmaker(engine)
    try:
        async with sessions.begin() as s:
            await s.execute(sa.insert(m.workloads), [workload("old", "deleted", NOW - 400 * DAY)])
        pruner = history.HistoryPruner(sessions, FakeClock(NOW), None)
        await pruner.run()  # returns at once: nothing to do, ever
        async with sessions() as s:
            assert [r[0] for r in await s.execute(sa.select(m.workloads.c.uid))] == ["old"]
    finally:
        await engine.dispose()
