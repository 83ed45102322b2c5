"""A restarted dispatcher writes again mkd's conditions that a killed one never wrote.

The KubeWriter holds condition writes in memory (some wait to share a write, dispatcher/kubewriter.py);
a dispatcher killed (SIGKILL, a crash, a lost node) loses them, and nothing would write them again until
the Job's next change: the manager Job went on showing e.g. MultiClusterPending while its Workload ran.
A restarted dispatcher compares each listed Job with its Workload's state in SQL and writes the
conditions that state implies where they are missing (dispatcher/heal.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher import heal
from dispatcher.db import models as m
from federation import labels
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import cond, rows
from tests.dispatcher.test_queueing import CQS, FLAVORS, KUEUE, LQS, _cq, install_kueue, labelled


@pytest.mark.parametrize("queued", [False, True], ids=["open", "queue"])
async def test_a_restarted_dispatcher_writes_the_conditions_a_killed_one_lost(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str, queued: bool) -> None:
    job = pytorchjob("lost", workers=0)
    if queued:
        await install_kueue(kube)
        await kube.create(FLAVORS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "ResourceFlavor",
                                    "metadata": {"name": "default"}})
        await kube.create(CQS, _cq("team-a", "2"))
        await kube.create(LQS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "LocalQueue",
                                "metadata": {"name": "team-a", "namespace": "default"},
                                "spec": {"clusterQueue": "team-a"}}, "default")
        job = labelled(job, **{labels.QUEUE_NAME: "team-a"})
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        async with running(s) as d:
            assert d.writer is not None
            d.writer.condition_linger = d.writer.status_linger = 600.0  # every condition waits
            await kube.create(PYTORCHJOBS, job, "default")
            await eventually(lambda: agent.places(), what="a Place", within=30)

            async def accepted() -> bool:
                placed = await rows(db_url, m.placements)
                return bool(placed) and placed[0].accepted_at is not None
            await eventually(accepted, what="the Accepted recorded")
            assert d.writer.backlog >= 1
            d.writer._todo.clear()  # killed: what waited in memory is lost (no flush)
            d.writer._idle.set()
        got: dict[str, Any] = await kube.get(PYTORCHJOBS, "lost", "default")
        before = cond(got, labels.CONDITION_DISPATCHED)
        assert before is None or before["status"] != "True", before  # lost, as after a SIGKILL

        async with running(s):
            async def healed() -> Any:
                obj = await kube.get(PYTORCHJOBS, "lost", "default")
                c = cond(obj, labels.CONDITION_DISPATCHED)
                return obj if c is not None and c["status"] == "True" else None
            obj = await eventually(healed, what="MultiClusterDispatched=True written again", within=15)
        c = cond(obj, labels.CONDITION_DISPATCHED)
        assert c is not None and c["reason"] == "Placed" and "worker-1" in c["message"], c
        pending = cond(obj, labels.CONDITION_PENDING)
        assert pending is None or pending["status"] != "True", obj["status"]["conditions"]
        if queued:
            for type_ in (labels.CONDITION_QUOTA_RESERVED, labels.CONDITION_ADMITTED):
                c = cond(obj, type_)
                assert c is not None and c["status"] == "True", (type_, obj["status"]["conditions"])


def _row(state: str, p_state: str, *, cq: str | None = None, accepted: bool = True) -> Any:
    from datetime import UTC, datetime
    from types import SimpleNamespace
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return SimpleNamespace(uid="u", kind="PyTorchJob", namespace="default", name="j", state=state, cluster_queue=cq,
                           flavors=None, attempt=2, cluster="worker-1", p_state=p_state, created_at=at,
                           accepted_at=at if accepted else None, finished_at=at)


@pytest.mark.parametrize(("row", "mask", "want"), [
    (_row("placed", "sent", accepted=False), heal.PENDING, []),  # open mode: nothing says it waits no more yet
    (_row("placed", "sent", cq="q", accepted=False), heal.PENDING,
     [labels.CONDITION_QUOTA_RESERVED, labels.CONDITION_ADMITTED]),
    (_row("running", "running"), heal.PENDING, [labels.CONDITION_DISPATCHED]),
    (_row("running", "running"), heal.DISPATCHED, []),  # agrees: not written
    (_row("running", "running", cq="q"), heal.DISPATCHED | heal.RESERVED | heal.ADMITTED, []),
    (_row("running", "running", cq="q"), heal.DISPATCHED,
     [labels.CONDITION_QUOTA_RESERVED, labels.CONDITION_ADMITTED, labels.CONDITION_DISPATCHED]),
    (_row("finished", "finished", cq="q"), heal.DISPATCHED | heal.RESERVED | heal.ADMITTED,
     [labels.CONDITION_QUOTA_RESERVED, labels.CONDITION_ADMITTED, labels.CONDITION_DISPATCHED,
      labels.CONDITION_FINISHED]),
    (_row("failed", "rejected", accepted=False), 0, []),  # mkd gave up: its refusal is not this pass's
])
def test_only_a_job_that_lacks_what_its_state_implies_is_written(row: Any, mask: int, want: list[str]) -> None:
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from dispatcher.batch import Batch
    from dispatcher.jobcache import JobCache
    engine = SimpleNamespace(cache=JobCache())
    conds = heal.Healing._implied(engine, row, mask, Batch(now=datetime(2026, 1, 2, tzinfo=UTC)))  # type: ignore[arg-type]
    assert [c["type"] for c in conds if c.get("status") == "True"] == want
