"""A restarted dispatcher writes again mkd's conditions that a killed one never wrote.

The KubeWriter holds condition writes in memory (some wait to share a write, dispatcher/mirror/kubewriter.py);
a dispatcher killed (SIGKILL, a crash, a lost node) loses them, and nothing would write them again until
the Job's next change: the manager Job went on showing e.g. MultiClusterPending while its Workload ran.
A restarted dispatcher compares each listed Job with its Workload's state in SQL and writes the
conditions that state implies where they are missing (dispatcher/engine/heal.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.db import models as m
from dispatcher.engine import heal
from federation import labels, messages
from federation.kube import EVENTS, Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import cond, rows
from tests.dispatcher.test_queueing import CQS, FLAVORS, KUEUE, LQS, _cq, install_kueue, labelled
from tests.dispatcher.test_report_loss import numbered, resyncs


async def shown(kube: Kube, name: str, ctype: str) -> Any:
    """The PyTorchJob ``name`` once it shows ``ctype`` True, else None."""
    obj = await kube.get(PYTORCHJOBS, name, "default")
    c = cond(obj, ctype)
    return obj if c is not None and c["status"] == "True" else None


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
            obj = await eventually(lambda: shown(kube, "lost", labels.CONDITION_DISPATCHED),
                                   what="MultiClusterDispatched=True written again", within=15)
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

    from dispatcher.engine.batch import Batch
    from dispatcher.intake.jobcache import JobCache
    engine = SimpleNamespace(cache=JobCache())
    conds = heal.Healing._implied(engine, row, mask, Batch(now=datetime(2026, 1, 2, tzinfo=UTC)))  # type: ignore[arg-type]
    assert [c["type"] for c in conds if c.get("status") == "True"] == want


@pytest.mark.parametrize("why", ["invalid", "exhausted"])
async def test_a_restarted_dispatcher_writes_the_refusal_a_killed_one_lost(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str, why: str) -> None:
    """A refused Workload (an invalid Job, or placement attempts used up) is final: nothing would ever write
    its MultiClusterRejected=True and Warning Event again if the dispatcher died before writing them."""
    job = pytorchjob("refused", workers=0)
    if why == "invalid":
        job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    reason = "InvalidJob" if why == "invalid" else "PlacementAttemptsExhausted"
    warned = "InvalidJob" if why == "invalid" else "PlacementFailed"  # the Warning Event's reason at the time
    s = settings(manager, db_url, mqtt_url, topic_root, max_placement_attempts=1)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False) as agent:
        async with running(s) as d:
            assert d.writer is not None
            for lost in ("condition", "mirror", "event"):  # killed before any of its writes reached the Job
                setattr(d.writer, lost, lambda *_, **__: None)
            await kube.create(PYTORCHJOBS, job, "default")
            if why == "exhausted":
                await eventually(lambda: agent.places(), what="a Place", within=15)
                p = agent.places()[0]
                await agent.report(messages.Rejected(
                    cluster="worker-1", placement=p.placement, spec_version=p.spec_version, seq=1,
                    reason="AgentError", message="the worker cluster kept failing", permanent=False))

            async def refused() -> bool:
                return [w.state for w in await rows(db_url, m.workloads)] == [
                    "rejected" if why == "invalid" else "failed"]
            await eventually(refused, what="the refusal recorded", within=15)
        got = await kube.get(PYTORCHJOBS, "refused", "default")
        assert cond(got, labels.CONDITION_REJECTED) is None, got.get("status")  # lost, as after a SIGKILL

        async with running(s):
            obj = await eventually(lambda: shown(kube, "refused", labels.CONDITION_REJECTED),
                                   what="MultiClusterRejected=True written again", within=15)

            async def warning() -> Any:
                evs = (await kube.list(EVENTS, "default")).items
                return [e for e in evs if e.get("type") == "Warning" and e.get("reason") == warned]
            (ev,) = await eventually(warning, what="the Warning Event written again", within=15)
        c = cond(obj, labels.CONDITION_REJECTED)
        assert c is not None and c["reason"] == reason, c
        if why == "invalid":
            assert "Master.replicas" in c["message"] and "Master.replicas" in ev["message"], (c, ev)
        else:
            assert "1 placement attempts" in c["message"], c
            d_ = cond(obj, labels.CONDITION_DISPATCHED)
            assert d_ is not None and d_["status"] == "False" and d_["reason"] == "PlacementFailed", d_


async def test_a_worker_status_a_killed_dispatcher_did_not_mirror_comes_again_from_the_agent(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """SQL keeps no worker status (only its sequence number), so the heal pass cannot write a lost mirror
    itself: a started dispatcher meets each agent's report stream part-way and sends it a Resync, the agent
    reports every expected Job again (worker_agent.inbox ``resync``: ``force``, a new seq), and that status
    is mirrored against what the listed Job shows, not against what the killed dispatcher meant to write."""
    s = settings(manager, db_url, mqtt_url, topic_root)
    running_status = {"startTime": "2026-11-24T00:00:00Z", "replicaStatuses": {"Master": {"active": 1}},
                      "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                                      "message": "running", "lastTransitionTime": "2026-11-24T00:00:00Z"}]}

    async def report(place: messages.Place, n: int) -> None:
        await numbered(agent, messages.Status(cluster="worker-1", placement=place.placement, seq=n,
                                              status=running_status), "s1", n)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        async with running(s) as d:
            assert d.writer is not None
            d.writer.condition_linger = d.writer.status_linger = 600.0
            await kube.create(PYTORCHJOBS, pytorchjob("mirror", workers=0), "default")
            (place,) = await eventually(lambda: agent.places(), what="a Place", within=30)
            d.writer.mirror = lambda *_, **__: None  # type: ignore[method-assign]  # killed before it wrote
            await report(place, 1)

            async def started() -> bool:
                return [p.state for p in await rows(db_url, m.placements)] == ["running"]
            await eventually(started, what="the Job recorded running")
        assert "startTime" not in ((await kube.get(PYTORCHJOBS, "mirror", "default")).get("status") or {})

        async with running(s):
            await numbered(agent, messages.Heartbeat(cluster="worker-1", online=True, capacity=agent.cap,
                                                     agent_version="fake"), "s1", 2)
            await eventually(lambda: resyncs(agent), what="a Resync for the stream met part-way", within=15)
            await report(place, 3)  # the agent's answer to a Resync: every expected Job reported again

            async def mirrored() -> Any:
                obj = await kube.get(PYTORCHJOBS, "mirror", "default")
                return obj if (obj.get("status") or {}).get("startTime") else None
            obj = await eventually(mirrored, what="the worker status mirrored again", within=15)
        assert cond(obj, "Running") is not None and obj["status"]["replicaStatuses"] == {"Master": {"active": 1}}
