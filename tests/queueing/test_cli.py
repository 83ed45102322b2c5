"""``mkctl queues``, ``mkctl workloads pending`` and ``mkctl why`` read what the dispatcher recorded."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from typer.testing import CliRunner

from dispatcher import db
from dispatcher.db import models as m
from mkctl.main import app

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _row(name: str, *, state: str = "pending", cq: str | None = "team-a", queue: str = "q", priority: int = 0,
         at: int = 0, seq: int = 0, reason: str = "", usage: dict[str, str] | None = None) -> dict[str, object]:
    return {"uid": f"uid-{name}", "namespace": "team", "name": name, "kind": "PyTorchJob",
            "api_version": "kubeflow.org/v1", "queue": queue, "priority": priority, "state": state, "reason": reason,
            "requests": {}, "podsets": [], "excluded": [], "created_at": T0, "updated_at": T0,
            "queued_at": T0 + timedelta(seconds=at), "queue_seq": seq, "cluster_queue": cq, "usage": usage,
            "cluster": "worker-1" if state == "running" else None}


async def _fill(url: str) -> None:
    await db.upgrade_async(url)
    engine = db.make_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.insert(m.workloads), [
                _row("late", at=10, seq=1, reason="couldn't assign flavors to pod set worker: insufficient unused "
                     "quota for cpu in flavor default, 4 more needed"),
                _row("urgent", at=20, seq=2, priority=100, queue="other"),
                _row("early", at=5, seq=3),
                _row("runs", state="running", usage={"default/cpu": "8"}),
            ])
            await conn.execute(sa.insert(m.events), [{"workload_uid": "uid-late", "at": T0, "type": "pending",
                                                      "reason": "QuotaNotReserved", "message": "quota"}])
    finally:
        await engine.dispose()


def test_pending_positions_queues_and_why(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'mkd.db'}"
    asyncio.run(_fill(url))
    runner = CliRunner()
    out = runner.invoke(app, ["workloads", "pending", "--cluster-queue", "team-a", "--database-url", url, "-o", "json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)["items"]
    assert [(r["name"], r["position_in_cluster_queue"], r["position_in_local_queue"]) for r in rows] == [
        ("urgent", 1, 1), ("early", 2, 1), ("late", 3, 2)]
    # a LocalQueue's list keeps the positions counted over the whole ClusterQueue
    out = runner.invoke(app, ["workloads", "pending", "--queue", "q", "-n", "team", "--database-url", url, "-o", "json"])
    assert out.exit_code == 0, out.output
    assert [(r["name"], r["position_in_cluster_queue"], r["position_in_local_queue"])
            for r in json.loads(out.output)["items"]] == [("early", 2, 1), ("late", 3, 2)]
    out = runner.invoke(app, ["queues", "list", "--database-url", url])
    assert out.exit_code == 0, out.output
    assert "team-a" in out.output and "default/cpu=8" in out.output
    out = runner.invoke(app, ["why", "team/late", "--database-url", url])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0] == ("team/late: quota: couldn't assign flavors to pod set worker: insufficient "
                                          "unused quota for cpu in flavor default, 4 more needed")
    assert "position 3 in ClusterQueue team-a, 2 in LocalQueue q" in out.output
    out = runner.invoke(app, ["why", "team/nope", "--database-url", url])
    assert out.exit_code != 0 and "no workload 'team/nope'" in out.output
