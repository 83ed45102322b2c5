"""Suspend, invalid Jobs, managedBy changes, oversize Jobs, rejection, Inventory — against kubesim and a broker."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from dispatcher.db import models as m
from federation import labels, messages
from federation.kube import EVENTS, Kube
from tests.dispatcher.harness import (
    PYTORCHJOBS,
    FakeAgent,
    capacity,
    eventually,
    pytorchjob,
    running,
    settings,
)
from tests.dispatcher.test_flow import cond, rows


async def condition(kube: Kube, name: str, type_: str, status: str) -> dict[str, Any] | None:
    obj = await kube.get(PYTORCHJOBS, name, "default")
    c = cond(obj, type_)
    return c if c and c["status"] == status else None


async def test_suspend_and_resume_are_forwarded(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("sus"), "default")
        await eventually(lambda: agent.places(), what="first Place")
        await eventually(lambda: condition(kube, "sus", labels.CONDITION_DISPATCHED, "True"))
        await kube.patch(PYTORCHJOBS, "sus", {"spec": {"runPolicy": {"suspend": True}}}, "default")
        await eventually(lambda: len(agent.places()) >= 2, what="Place with the suspended spec")
        second = agent.places()[1]
        assert second.spec_version == 2 and second.placement.attempt == 1
        assert second.manifest["spec"]["runPolicy"]["suspend"] is True
        await kube.patch(PYTORCHJOBS, "sus", {"spec": {"runPolicy": {"suspend": False}}}, "default")
        await eventually(lambda: len(agent.places()) >= 3, what="Place with the resumed spec")
        third = agent.places()[2]
        assert third.spec_version == 3 and third.manifest["spec"]["runPolicy"]["suspend"] is False
    types = [e.type for e in await rows(db_url, m.events) if e.workload_uid]
    assert "suspended" in types and "resumed" in types
    assert len(await rows(db_url, m.placements)) == 1


async def test_created_suspended_waits_until_resumed(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                     topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("later", suspend=True), "default")
        await eventually(lambda: rows(db_url, m.workloads), what="claim")
        assert (await rows(db_url, m.workloads))[0].reason.startswith("suspended")
        assert agent.places() == []
        await kube.patch(PYTORCHJOBS, "later", {"spec": {"runPolicy": {"suspend": False}}}, "default")
        await eventually(lambda: agent.places(), what="Place after resume")
        assert agent.places()[0].spec_version == 1


async def test_invalid_job_gets_condition_event_and_history(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                            topic_root: str) -> None:
    bad = pytorchjob("bad")
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, bad, "default")
        c = await eventually(lambda: condition(kube, "bad", labels.CONDITION_REJECTED, "True"))
        assert "spec.pytorchReplicaSpecs.Master.replicas" in c["message"] and "set replicas: 1" in c["message"]

        async def warning() -> Any:
            evs = (await kube.list(EVENTS, "default")).items
            return [e for e in evs if e.get("type") == "Warning" and e.get("reason") == "InvalidJob"]
        ev = (await eventually(warning, what="Warning Event"))[0]
        assert ev["involvedObject"]["name"] == "bad" and "Master.replicas" in ev["message"]
        assert agent.places() == []
    (w,) = await rows(db_url, m.workloads)
    assert w.state == "rejected"
    assert [e.type for e in await rows(db_url, m.events) if e.workload_uid] == ["claimed", "invalid"]


async def test_managed_by_changed_after_claim_is_rejected_and_worker_copy_deleted(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("moved"), "default")
        await eventually(lambda: condition(kube, "moved", labels.CONDITION_DISPATCHED, "True"))
        await kube.patch(PYTORCHJOBS, "moved", {"spec": {"runPolicy": {"managedBy": labels.TRAINING_OPERATOR}}},
                         "default")
        c = await eventually(lambda: condition(kube, "moved", labels.CONDITION_REJECTED, "True"))
        assert "spec.runPolicy.managedBy" in c["message"]
        await eventually(lambda: agent.deletes(), what="Delete to the worker")
    (w,) = await rows(db_url, m.workloads)
    assert w.state == "rejected"


async def test_oversize_job_stays_pending_with_the_reason(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                          topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(gpu=4)) as agent, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(gpu=2)), running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("huge", workers=3, gpu=2), "default")  # 4 pods x 2 GPUs
        want = "needs 8 nvidia.com/gpu in one cluster; most free: worker-1 has 4"

        async def explained() -> Any:
            c = await condition(kube, "huge", labels.CONDITION_DISPATCHED, "False")
            return c if c and c["message"] == want else None
        c = await eventually(explained, within=15, what="the reason once both heartbeats are in")
        assert c["reason"] == "NoFittingCluster"
        assert agent.places() == []
        (w,) = await rows(db_url, m.workloads)
        assert w.state == "pending" and w.reason == c["message"]


async def test_rejected_placement_goes_elsewhere(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                 topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    big, small = capacity(cpu="64"), capacity(cpu="32")
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=big, auto_accept=False) as picky, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=small) as other, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("picky"), "default")
        await eventually(lambda: picky.places(), what="first choice is the roomiest cluster")
        first = picky.places()[0]
        await picky.report(messages.Rejected(cluster="worker-1", placement=first.placement, spec_version=1,
                                             seq=1, reason="KindNotSupported", message="no operator here"))
        await eventually(lambda: other.places(), what="second attempt elsewhere")
        assert other.places()[0].placement.attempt == 2
        await eventually(lambda: condition(kube, "picky", labels.CONDITION_DISPATCHED, "True"))
    ps = sorted(await rows(db_url, m.placements), key=lambda p: p.attempt)
    assert [(p.cluster, p.state) for p in ps] == [("worker-1", "rejected"), ("worker-2", "accepted")]
    assert "KindNotSupported" in ps[0].reason


async def test_inventory_gets_resync_and_missing_places(manager: Path, kube: Kube, db_url: str, mqtt_url: str,
                                                        topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        job = await kube.create(PYTORCHJOBS, pytorchjob("inv"), "default")
        await eventually(lambda: condition(kube, "inv", labels.CONDITION_DISPATCHED, "True"))
        before = len(agent.places())
        await agent.report(messages.Inventory(cluster="worker-1", items=[]))  # the agent lost everything
        await eventually(lambda: [c for c in agent.commands if isinstance(c, messages.Resync)], what="Resync")
        resync = next(c for c in agent.commands if isinstance(c, messages.Resync))
        assert [k.workload_uid for k in resync.expected] == [job["metadata"]["uid"]]
        await eventually(lambda: len(agent.places()) > before, what="missing Place re-sent")
        again = agent.places()[-1]
        assert again.placement.attempt == 1 and again.spec_version == 1
    assert len(await rows(db_url, m.placements)) == 1


async def test_lost_cluster_gets_nothing_new_and_worker_lost_timeout_moves_its_workloads(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, heartbeat_timeout_seconds=1.0,
                 worker_lost_timeout_seconds=1.0, placement_retry_seconds=0.3, lease_seconds=1.0,
                 lease_margin_seconds=0.5)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="64"), beat_every=0.2) as first, \
            FakeAgent("worker-2", mqtt_url, topic_root, cap=capacity(cpu="8"), beat_every=0.2) as second, \
            running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("moving"), "default")
        await eventually(lambda: first.places(), what="placed on the roomiest cluster")
        await eventually(lambda: condition(kube, "moving", labels.CONDITION_DISPATCHED, "True"))
        first.stop_beating()
        await eventually(lambda: second.places(), within=15, what="re-placed after the worker-lost timeout")
        assert second.places()[0].placement.attempt == 2

        async def accepted_there() -> bool:
            return any(p.cluster == "worker-2" and p.state == "accepted" for p in await rows(db_url, m.placements))
        await eventually(accepted_there, what="accepted on worker-2")
    ps = sorted(await rows(db_url, m.placements), key=lambda p: p.attempt)
    assert [(p.cluster, p.state) for p in ps] == [("worker-1", "lost"), ("worker-2", "accepted")]
    evs = await rows(db_url, m.events)
    assert any(e.type == "cluster_lost" and e.cluster == "worker-1" for e in evs)
    assert any(e.type == "requeued" for e in evs)


TRAINJOB_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "trainjobs.trainer.kubeflow.org"},
    "spec": {"group": "trainer.kubeflow.org", "scope": "Namespaced",
             "names": {"plural": "trainjobs", "singular": "trainjob", "kind": "TrainJob"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "subresources": {"status": {}},
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}


async def test_trainjob_with_an_unknown_runtime_is_rejected_and_a_kind_installed_later_is_picked_up(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    from federation.kube import CRDS, Resource
    trainjobs = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
    s = settings(manager, db_url, mqtt_url, topic_root, kind_recheck_seconds=0.2)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s) as d:
        assert d.intake is not None
        await eventually(lambda: "PyTorchJob" in d.intake.watching, what="intake running")
        assert "TrainJob" not in d.intake.watching
        await kube.create(CRDS, TRAINJOB_CRD)
        # discovery answers are cached for 10 s in federation.kube
        await eventually(lambda: "TrainJob" in d.intake.watching, within=25, what="TrainJob picked up once its CRD exists")
        await kube.create(trainjobs, {
            "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": "default"},
            "spec": {"managedBy": labels.MULTIKUEUE,
                     "runtimeRef": {"name": "torch-missing", "apiGroup": "trainer.kubeflow.org",
                                    "kind": "ClusterTrainingRuntime"}}}, "default")

        async def rejected() -> Any:
            obj = await kube.get(trainjobs, "tj", "default")
            c = cond(obj, labels.CONDITION_REJECTED)
            return c if c and c["status"] == "True" else None
        c = await eventually(rejected, what="MultiClusterRejected on the TrainJob")
        assert "spec.runtimeRef.name" in c["message"] and "torch-missing" in c["message"]
        assert agent.places() == []


async def test_refuses_to_start_on_a_schema_that_is_behind(manager: Path, database_url: str, mqtt_url: str,
                                                           topic_root: str) -> None:
    import asyncio

    import pytest

    from dispatcher.app import Dispatcher
    from federation.errors import Permanent
    async with Dispatcher(settings(manager, database_url, mqtt_url, topic_root)) as d:
        with pytest.raises(Permanent, match="mkctl db upgrade"):
            await asyncio.wait_for(d.run(asyncio.Event()), 30)  # the start ends on it, without waiting


async def test_a_place_refused_by_a_fenced_agent_waits_for_its_lease_and_never_fails_the_job(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """An agent whose lease ran out refuses Places as LeaseExpired (temporary) until a renewal reaches
    it. Each refusal used to requeue the Workload at the next attempt, so a cluster fencing on and off
    (short leases on a loaded machine; chaos partition) used up max_placement_attempts and the Job ended
    'failed' in SQL without ever running anywhere. The Place is sent again instead; no attempt is spent."""
    s = settings(manager, db_url, mqtt_url, topic_root, max_placement_attempts=2, place_resend_seconds=0.5)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False) as fenced, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("waits"), "default")
        for n in range(3):
            await eventually(lambda: len(fenced.places()) > n, within=15, what=f"Place #{n + 1}")  # noqa: B023
            p = fenced.places()[n]
            assert p.placement.attempt == 1
            await fenced.report(messages.Rejected(
                cluster="worker-1", placement=p.placement, spec_version=p.spec_version, seq=n + 1,
                reason=messages.REJECTED_LEASE_EXPIRED, message="fenced", permanent=False))
        await eventually(lambda: len(fenced.places()) > 3, within=15, what="the Place once more")
        last = fenced.places()[-1]
        assert last.placement.attempt == 1
        await fenced.report(messages.Accepted(cluster="worker-1", placement=last.placement,
                                              spec_version=last.spec_version, seq=10))
        await eventually(lambda: condition(kube, "waits", labels.CONDITION_DISPATCHED, "True"))
    (w,) = await rows(db_url, m.workloads)
    assert w.state == "running" and w.attempt == 1
    ps = await rows(db_url, m.placements)
    assert [(p.cluster, p.attempt, p.state) for p in ps] == [("worker-1", 1, "accepted")]


async def test_a_workload_that_used_up_its_attempts_says_so_on_the_manager_job(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """The database and the manager Job never disagree: a Workload 'failed' in SQL after
    max_placement_attempts must not look like one still waiting on the manager (Dispatched=False is what a
    pending Job shows); it carries MultiClusterRejected=True with the reason, as mkd's other final refusals."""
    s = settings(manager, db_url, mqtt_url, topic_root, max_placement_attempts=2)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False) as agent, running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("gives-up"), "default")
        for n in range(2):
            await eventually(lambda: len(agent.places()) > n, within=15, what=f"Place #{n + 1}")  # noqa: B023
            p = agent.places()[n]
            await agent.report(messages.Rejected(
                cluster="worker-1", placement=p.placement, spec_version=p.spec_version, seq=n + 1,
                reason="AgentError", message="the worker cluster kept failing", permanent=False))
        c = await eventually(lambda: condition(kube, "gives-up", labels.CONDITION_REJECTED, "True"), within=15,
                             what="the final refusal on the manager Job")
        assert c["reason"] == "PlacementAttemptsExhausted" and "2 placement attempts" in c["message"]
    (w,) = await rows(db_url, m.workloads)
    assert w.state == "failed"


async def test_a_placed_job_suspended_then_resumed_across_a_restart_is_resumed_without_a_failed_batch(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """A restarted dispatcher knows no need for a placed Workload; resuming it reserves its
    capacity again, so its PodSets must be read from SQL (the light row failed the batch with
    ``KeyError: 'podsets'``)."""
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        async with running(s):
            await kube.create(PYTORCHJOBS, pytorchjob("sus"), "default")
            await eventually(lambda: condition(kube, "sus", labels.CONDITION_DISPATCHED, "True"))
            await kube.patch(PYTORCHJOBS, "sus", {"spec": {"runPolicy": {"suspend": True}}}, "default")
            await eventually(lambda: len(agent.places()) >= 2, what="Place with the suspended spec")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dispatcher"):
            async with running(s):
                await kube.patch(PYTORCHJOBS, "sus", {"spec": {"runPolicy": {"suspend": False}}}, "default")
                await eventually(lambda: [p for p in agent.places() if p.spec_version == 3],
                                 what="Place with the resumed spec")
    resumed = [p for p in agent.places() if p.spec_version == 3]   # spec version 2 may be sent again on restart
    assert [p.manifest["spec"]["runPolicy"]["suspend"] for p in resumed] == [False]
    assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == []
