"""The dispatcher end to end against kubesim, a real broker and a real database, with fake agents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from dispatcher import db
from dispatcher.db import models as m
from dispatcher.db.queries import listing
from federation import labels
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings


def cond(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


async def rows(url: str, table: sa.Table, **where: Any) -> list[Any]:
    engine = db.make_engine(url)
    try:
        async with engine.connect() as conn:
            stmt = sa.select(table)
            for k, v in where.items():
                stmt = stmt.where(table.c[k] == v)
            return list((await conn.execute(stmt)).all())
    finally:
        await engine.dispose()


async def test_claims_only_multikueue_jobs_places_and_mirrors(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        ours = await kube.create(PYTORCHJOBS, pytorchjob("ours"), "default")
        other = await kube.create(PYTORCHJOBS, pytorchjob("theirs", managed_by=labels.TRAINING_OPERATOR), "default")
        bare = await kube.create(PYTORCHJOBS, pytorchjob("bare", managed_by=None), "default")
        await eventually(lambda: agent.places(), what="a Place command")
        place = agent.places()[0]
        assert place.placement.workload_uid == ours["metadata"]["uid"]
        stamp = place.manifest["metadata"]["labels"]
        assert stamp[labels.ORIGIN] == "mkd" and stamp[labels.WORKLOAD_UID] == ours["metadata"]["uid"]
        assert stamp[labels.PLACEMENT_ATTEMPT] == "1" and stamp[labels.JOB_KIND] == "PyTorchJob"
        assert "managedBy" not in place.manifest["spec"]["runPolicy"]

        async def dispatched() -> Any:
            obj = await kube.get(PYTORCHJOBS, "ours", "default")
            c = cond(obj, labels.CONDITION_DISPATCHED)
            return c if c and c["status"] == "True" else None
        c = await eventually(dispatched, what="MultiClusterDispatched=True")
        assert "worker-1" in c["message"]

        # the worker's status is copied whole, mkd's condition kept on top
        worker_status = {"conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                                         "message": "running", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                         "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}},
                         "startTime": "2026-01-01T00:00:00Z"}
        await agent.status(place, worker_status)

        async def mirrored() -> Any:
            obj = await kube.get(PYTORCHJOBS, "ours", "default")
            st = obj.get("status") or {}
            return st if st.get("replicaStatuses") else None
        st = await eventually(mirrored, what="mirrored status")
        assert st["startTime"] == "2026-01-01T00:00:00Z"
        assert {c["type"] for c in st["conditions"]} == {"Running", labels.CONDITION_DISPATCHED}

        # a stale Status (same seq) is dropped, a newer one wins
        await agent.status(place, {"conditions": [], "replicaStatuses": {"Master": {"failed": 9}}}, seq=agent.seq)
        assert d.engine is not None
        await eventually(lambda: d.engine.stale_dropped >= 1, what="stale status dropped")
        obj = await kube.get(PYTORCHJOBS, "ours", "default")
        assert obj["status"]["replicaStatuses"]["Master"] == {"active": 1}

        done = {**worker_status, "conditions": [*worker_status["conditions"], {
            "type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "done",
            "lastTransitionTime": "2026-01-01T00:10:00Z"}], "completionTime": "2026-01-01T00:10:00Z"}
        await agent.status(place, done, finished="Succeeded")

        async def finished() -> Any:
            r = await rows(db_url, m.workloads, uid=ours["metadata"]["uid"])
            return r and r[0].state == "finished"
        await eventually(finished, what="workload finished")
        obj = await eventually(lambda: _completed(kube), what="completionTime mirrored")

        # never written to: the other two Jobs
        for name, created in (("theirs", other), ("bare", bare)):
            now = await kube.get(PYTORCHJOBS, name, "default")
            assert now["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
        assert len(await rows(db_url, m.workloads)) == 1

        # deletion on the manager → Delete to the worker, placement history kept
        await kube.delete(PYTORCHJOBS, "ours", "default")
        await eventually(lambda: agent.deletes(), what="a Delete command")
        assert agent.deletes()[0].placement.workload_uid == ours["metadata"]["uid"]
    engine = db.make_engine(db_url)
    try:
        async with engine.connect() as conn:
            from sqlalchemy.ext.asyncio import AsyncSession
            async with AsyncSession(conn) as session:
                hist = await listing.show_workload(session, "default/ours")
    finally:
        await engine.dispose()
    assert hist is not None and hist.workload.state == "deleted"
    assert [p.state for p in hist.placements] == ["finished"]
    types = [e.type for e in hist.events]
    assert types[0] == "claimed" and types[-1] == "deleted"
    assert [t for t in types if t in ("placed", "accepted", "finished")] == ["placed", "accepted", "finished"]


async def _completed(kube: Kube) -> Any:
    obj = await kube.get(PYTORCHJOBS, "ours", "default")
    return (obj.get("status") or {}).get("completionTime")
