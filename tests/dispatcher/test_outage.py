"""Database and manager-API outages: the dispatcher holds what it has, loses nothing, and catches up.

The database fault is injected at the session seam (every session the engine and the publisher
open fails with the error a dead server gives) so the test runs on SQLite too; a private
PostgreSQL stopped and started for real is in ``test_outage_postgres.py``. An item that can never
succeed is recorded as an error on its Workload and Job, never dropped.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy.exc

from dispatcher import app
from dispatcher.db import models as m
from federation import messages
from federation.kube import Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import cond, rows


class Outage:
    """Wraps the dispatcher's session factory: while ``down``, opening a session fails like a dead server."""

    def __init__(self) -> None:
        self.down = False
        self.refused = 0

    def wrap(self, real: Any) -> Any:
        outage = self

        class Sessions:
            def _check(self) -> None:
                if outage.down:
                    outage.refused += 1
                    raise sqlalchemy.exc.OperationalError("BEGIN", {}, ConnectionRefusedError(111, "Connection refused"))

            def __call__(self) -> Any:
                self._check()
                return real()

            def begin(self) -> Any:
                self._check()
                return real.begin()
        return Sessions()


@pytest.fixture
def outage(monkeypatch: pytest.MonkeyPatch) -> Iterator[Outage]:
    o = Outage()
    real = app.db.sessionmaker
    monkeypatch.setattr(app.db, "sessionmaker", lambda engine: o.wrap(real(engine)))
    yield o


async def states(db_url: str) -> collections.Counter[str]:
    return collections.Counter(w.state for w in await rows(db_url, m.workloads))


async def test_a_database_outage_holds_everything_and_catches_up_within_seconds(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str, outage: Outage,
        caplog: pytest.LogCaptureFixture) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, outage_retry_max_seconds=0.5)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        before = await kube.create(PYTORCHJOBS, pytorchjob("before"), "default")
        await eventually(lambda: len(agent.places()) == 1, what="the first Job placed")
        outage.down = True
        # during the outage: new Jobs, a finished Job's Status, a deletion. The engine holds the batch it was
        # deciding when the outage began and retries that very batch; what comes later waits in its inbox, where a
        # deletion supersedes its Job's creation. So the first Job must be held before the rest come: on a loaded
        # machine the engine's first batch could otherwise gather everything up to the doomed Job's creation.
        assert d.engine is not None
        engine = d.engine
        during = [await kube.create(PYTORCHJOBS, pytorchjob("during-0"), "default")]
        await eventually(lambda: engine.outage_since is not None, what="the first batch of the outage held")
        during += [await kube.create(PYTORCHJOBS, pytorchjob(f"during-{i}"), "default") for i in range(1, 6)]
        await agent.status(agent.places()[0], {"startTime": "2026-01-01T00:00:00Z", "conditions": [
            {"type": "Succeeded", "status": "True", "reason": "Done"}]}, finished="Succeeded")
        doomed = await kube.create(PYTORCHJOBS, pytorchjob("doomed"), "default")
        await asyncio.sleep(0.3)  # real time: the doomed Job is seen (as held) before it goes
        await kube.delete(PYTORCHJOBS, "doomed", "default")
        await eventually(lambda: outage.refused >= 8, what="several refused retries")
        refused = outage.refused
        await asyncio.sleep(1.5)  # an outage longer than the whole retry ladder of the old code
        assert d.engine is not None and d.engine.outage_since is not None
        # still trying at least every 0.5 s (the cap): the recovery is noticed within that
        assert outage.refused - refused >= 3
        outage.down = False
        t0 = asyncio.get_running_loop().time()

        async def caught_up() -> bool:
            st = await states(db_url)
            return st == {"running": 6, "finished": 1} and len(agent.places()) == 7
        await eventually(caught_up, within=15, what="every Job decided after the outage")
        print(f"caught up {asyncio.get_running_loop().time() - t0:.1f}s after the database came back")
        assert d.supervisor is not None and d.supervisor.tasks["engine"].restarts == 0
        assert d.supervisor.tasks["outbox"].restarts == 0

        async def mirrored() -> bool:
            c = cond(await kube.get(PYTORCHJOBS, "before", "default"), "Succeeded")
            return c is not None and c["status"] == "True"
        await eventually(mirrored, what="the Status sent during the outage mirrored on the manager Job")
    places = collections.Counter(p.placement.workload_uid for p in agent.places())
    assert set(places.values()) == {1}  # none placed twice
    assert set(places) == {before["metadata"]["uid"], *(j["metadata"]["uid"] for j in during)}
    assert doomed["metadata"]["uid"] not in places
    assert not [r for r in caplog.records if "dropping" in r.getMessage()]
    tracebacks = [r for r in caplog.records if r.name == "dispatcher.engine" and r.exc_info]
    assert tracebacks == []  # one warning for the outage, no traceback per attempt


async def test_a_spec_edit_over_the_size_limit_is_an_error_on_the_job_not_a_drop(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        caplog: pytest.LogCaptureFixture) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, batch_linger_seconds=0.3)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        big = await kube.create(PYTORCHJOBS, pytorchjob("big"), "default")
        await eventually(lambda: len(agent.places()) == 1, what="placed")

        async def running_() -> bool:
            return [w.state for w in await rows(db_url, m.workloads, name="big")] == ["running"]
        await eventually(running_, what="accepted")
        job = await kube.get(PYTORCHJOBS, "big", "default")
        env = [{"name": f"V{i}", "value": "x" * 1000} for i in range(1100)]  # ~1.1 MB: over the Command limit
        job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"] = env
        await kube.replace(PYTORCHJOBS, job, "default")
        other = await kube.create(PYTORCHJOBS, pytorchjob("neighbour"), "default")  # same batch: must not suffer

        async def flagged() -> dict[str, Any] | None:
            obj = await kube.get(PYTORCHJOBS, "big", "default")
            c = cond(obj, "MultiClusterRejected")
            return c if c and c["status"] == "True" else None
        c = await eventually(flagged, within=15, what="the refused edit reported on the Job")
        await eventually(lambda: any(p.placement.workload_uid == other["metadata"]["uid"] for p in agent.places()),
                         what="the neighbour placed")
    assert "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].env" in c["message"]
    assert "byte" in c["message"]
    (w,) = await rows(db_url, m.workloads, name="big")
    assert w.state == "running" and w.spec_version == 1  # the worker keeps the last spec it could be sent
    assert "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].env" in w.reason
    events = [e.type for e in await rows(db_url, m.events, workload_uid=big["metadata"]["uid"])]
    assert "invalid" in events
    assert not [r for r in caplog.records if "dropping" in r.getMessage()]
    assert [p.spec_version for p in agent.places() if p.placement.workload_uid == big["metadata"]["uid"]] == [1]


async def test_an_oversize_job_is_rejected_naming_its_field_and_leaves_no_placement_behind(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        job = pytorchjob("huge")
        job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"] = [
            {"name": f"V{i}", "value": "y" * 1000} for i in range(1100)]
        await kube.create(PYTORCHJOBS, job, "default")

        async def rejected() -> dict[str, Any] | None:
            c = cond(await kube.get(PYTORCHJOBS, "huge", "default"), "MultiClusterRejected")
            return c if c and c["status"] == "True" else None
        c = await eventually(rejected, within=15, what="the oversize Job rejected")
        field = "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].env"
        assert c["message"].startswith(f"{field}:"), c["message"]
        assert await rows(db_url, m.placements) == []  # no `sent` row expected on the cluster forever
        (w,) = await rows(db_url, m.workloads)
        assert (w.state, w.attempt, w.cluster) == ("rejected", 0, None)
        # the cluster's Inventories are still answered (they failed for good before)
        await agent.report(messages.Inventory(cluster="worker-1", items=[]))
        await eventually(lambda: [c for c in agent.commands if isinstance(c, messages.Resync)], what="a Resync")
        fine = await kube.create(PYTORCHJOBS, pytorchjob("fine"), "default")
        await eventually(lambda: [p for p in agent.places() if p.placement.workload_uid == fine["metadata"]["uid"]],
                         what="the next Job placed")
    assert agent.places()[0].placement.workload_uid == fine["metadata"]["uid"]


async def test_a_job_created_and_deleted_before_its_claim_is_decided_is_never_placed(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    # a long linger: the claim is still in the engine's inbox when the deletion arrives (as behind a burst)
    s = settings(manager, db_url, mqtt_url, topic_root, batch_linger_seconds=1.0)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        await eventually(lambda: d.intake is not None and "PyTorchJob" in d.intake.watching, what="intake watching")
        ghost = await kube.create(PYTORCHJOBS, pytorchjob("ghost"), "default")
        await kube.delete(PYTORCHJOBS, "ghost", "default")
        later = await kube.create(PYTORCHJOBS, pytorchjob("later"), "default")
        await eventually(lambda: agent.places(), what="the later Job placed")
        await asyncio.sleep(0.5)  # real time: a Place for the ghost, had one been sent, lands now
    assert [p.placement.workload_uid for p in agent.places()] == [later["metadata"]["uid"]]
    assert ghost["metadata"]["uid"] not in {w.uid for w in await rows(db_url, m.workloads) if w.state != "deleted"}
