"""Fixtures for the admin surface: a migrated SQLite database holding a small federation's history."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dispatcher import db
from tests.dispatcher.conftest import db_url, kube, manager  # noqa: F401  (the running-dispatcher tests)


async def fill(url: str) -> None:
    """Four Workloads (two claimed in one batch, so they share a creation time), placements, events,
    three clusters. Uids are chosen so uid order differs from creation and name order."""
    from dispatcher.db.models import clusters, events, placements, workloads

    engine = db.make_engine(url)
    now = datetime.now(UTC)
    batch = now - timedelta(minutes=5)
    try:
        async with engine.begin() as conn:
            base = {"api_version": "kubeflow.org/v1", "queue": "default", "requests": {"cpu": "4"}, "podsets": [],
                    "excluded": [], "updated_at": now, "labels": {}, "kind": "PyTorchJob", "reason": ""}
            await conn.execute(workloads.insert(), [
                {**base, "uid": "a-uid", "namespace": "team-a", "name": "zeta", "state": "running", "attempt": 1,
                 "cluster": "worker-2", "created_at": batch, "labels": {"team": "nlp", "kueue.x-k8s.io/queue-name":
                                                                        "research"}, "queue": "research"},
                {**base, "uid": "b-uid", "namespace": "team-a", "name": "alpha", "state": "pending", "attempt": 0,
                 "cluster": None, "created_at": batch, "requests": {"nvidia.com/gpu": "64"},
                 "reason": "needs 64 nvidia.com/gpu in one cluster; most free: worker-3 has 8"},
                {**base, "uid": "c-uid", "namespace": "default", "name": "old", "state": "finished", "attempt": 1,
                 "cluster": "worker-1", "created_at": now - timedelta(hours=1), "kind": "JobSet",
                 "api_version": "jobset.x-k8s.io/v1alpha2", "labels": {"team": "vision"}},
                {**base, "uid": "0-uid", "namespace": "default", "name": "newest", "state": "placed", "attempt": 1,
                 "cluster": "worker-1", "created_at": now - timedelta(seconds=30), "labels": {"team": "nlp"}},
            ])
            pbase = {"accepted_at": None, "finished_at": None}
            await conn.execute(placements.insert(), [pbase | p for p in [
                {"workload_uid": "a-uid", "attempt": 1, "cluster": "worker-2", "epoch": 7, "state": "running",
                 "created_at": batch, "accepted_at": batch},
                {"workload_uid": "c-uid", "attempt": 1, "cluster": "worker-1", "epoch": 7, "state": "finished",
                 "created_at": now - timedelta(hours=1), "finished_at": now - timedelta(minutes=50)},
                {"workload_uid": "0-uid", "attempt": 1, "cluster": "worker-1", "epoch": 7, "state": "sent",
                 "created_at": now - timedelta(seconds=30)},
            ]])
            ebase = {"cluster": None, "reason": ""}
            await conn.execute(events.insert(), [ebase | e for e in [
                {"workload_uid": "a-uid", "at": batch, "type": "claimed", "message": "PyTorchJob team-a/zeta claimed"},
                {"workload_uid": "a-uid", "at": batch, "type": "placed", "cluster": "worker-2", "reason": "",
                 "message": "attempt 1 on worker-2: most room"},
                {"workload_uid": "b-uid", "at": batch, "type": "pending", "reason": "NoFittingCluster",
                 "message": "needs 64 nvidia.com/gpu in one cluster; most free: worker-3 has 8"},
                {"workload_uid": None, "at": now, "type": "cluster_lost", "cluster": "worker-3",
                 "reason": "HeartbeatTimeout", "message": "no heartbeat for 30s"},
            ]])
            cbase = {"cordoned": False}
            await conn.execute(clusters.insert(), [cbase | c for c in [
                {"name": "worker-1", "labels": {"zone": "a"}, "online": True, "interval_seconds": 10.0,
                 "capacity": {"allocatable": {"cpu": "8"}, "free": {"cpu": "8"}}, "kinds": [],
                 "last_heartbeat": now - timedelta(minutes=2), "updated_at": now},
                {"name": "worker-2", "labels": {}, "online": True, "interval_seconds": 10.0, "kinds": [],
                 "capacity": {"allocatable": {"cpu": "64", "nvidia.com/gpu": "0"},
                              "free": {"cpu": "60", "nvidia.com/gpu": "0"}},
                 "last_heartbeat": now, "updated_at": now, "cordoned": True},
                {"name": "worker-3", "labels": {}, "capacity": {}, "kinds": [], "online": False,
                 "interval_seconds": 10.0, "last_heartbeat": now - timedelta(hours=1), "updated_at": now},
            ]])
    finally:
        await engine.dispose()


@pytest.fixture
def admin_db(tmp_path: Path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'mkd.db'}"
    asyncio.run(db.upgrade_async(url))
    asyncio.run(fill(url))
    return url
