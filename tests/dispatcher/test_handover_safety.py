"""Handover safety on the manager: mkd never takes over a Job another controller started.

Where the admission policy is not installed (or an old operator ignores managedBy), a Job that another
controller already runs can carry ``kueue.x-k8s.io/multikueue``. Claiming it would run it a second time
and overwrite its status; mkd refuses it with a condition and an Event instead, and sends nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from dispatcher.handover.safety import started_elsewhere
from federation import labels
from federation.kube import EVENTS, Kube
from tests.dispatcher.harness import PYTORCHJOBS, FakeAgent, eventually, pytorchjob, running, settings
from tests.dispatcher.test_flow import cond

RUNNING = {"startTime": "2026-11-24T03:00:00Z",
           "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning",
                           "message": "started by the training-operator",
                           "lastTransitionTime": "2026-11-24T03:00:00Z"}],
           "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}}}


async def test_a_started_job_flipped_to_multikueue_is_refused_not_run_twice(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    job = await kube.create(PYTORCHJOBS, pytorchjob("started", managed_by=labels.TRAINING_OPERATOR), "default")
    await kube.replace(PYTORCHJOBS, {**job, "status": RUNNING}, "default", subresource="status")
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.patch(PYTORCHJOBS, "started", {"spec": {"runPolicy": {"managedBy": labels.MULTIKUEUE}}},
                         "default")
        # a fresh Job next to it is placed: the dispatcher is at work, not merely slow
        await kube.create(PYTORCHJOBS, pytorchjob("fresh"), "default")
        await eventually(lambda: [p for p in agent.places() if p.job.name == "fresh"], what="fresh Job placed")

        async def refused() -> Any:
            c = cond(await kube.get(PYTORCHJOBS, "started", "default"), labels.CONDITION_REJECTED)
            return c if c and c["status"] == "True" else None
        c = await eventually(refused, what="MultiClusterRejected on the started Job")
        assert c["reason"] == "StartedByAnotherController"
        assert "status.startTime" in c["message"]
        await asyncio.sleep(0.5)  # real time: a Place, had one been sent, lands now
        assert not [p for p in agent.places() if p.job.name == "started"], "a started Job was sent to a worker"
        status = (await kube.get(PYTORCHJOBS, "started", "default"))["status"]
        assert status["startTime"] == RUNNING["startTime"]
        assert status["replicaStatuses"] == RUNNING["replicaStatuses"]
        assert {"Running": "True"}.items() <= {x["type"]: x["status"] for x in status["conditions"]}.items()
        events = (await kube.list(EVENTS, "default")).items
        assert any(e.get("reason") == "StartedByAnotherController" and e["involvedObject"]["name"] == "started"
                   and e["type"] == "Warning" for e in events)


def test_what_counts_as_started() -> None:
    assert started_elsewhere({}) is None
    assert started_elsewhere({"status": {}}) is None
    assert started_elsewhere({"status": {"replicaStatuses": {"Worker": {"active": 0}}}}) is None
    for status in ({"startTime": "t"}, {"conditions": [{"type": "Created", "status": "True"}]},
                   {"active": 2}, {"replicatedJobsStatus": [{"name": "w", "active": 1}]}):
        problem = started_elsewhere({"status": status})
        assert problem is not None and problem.field == "status", status


async def test_narrowing_namespaces_keeps_following_what_mkd_holds(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        caplog: Any) -> None:
    from federation.kube import NAMESPACES
    for ns in ("q-a", "q-b"):
        await kube.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        async with running(settings(manager, db_url, mqtt_url, topic_root, namespaces=["q-a", "q-b"])):
            await kube.create(PYTORCHJOBS, pytorchjob("held", namespace="q-b"), "q-b")
            await eventually(lambda: [p for p in agent.places() if p.job.name == "held"], what="held Job placed",
                             within=30)
        caplog.set_level("INFO", logger="dispatcher.intake")
        async with running(settings(manager, db_url, mqtt_url, topic_root, namespaces=["q-a"])):
            # a new Job in q-b is no longer mkd's to claim ...
            await kube.create(PYTORCHJOBS, pytorchjob("new-in-b", namespace="q-b"), "q-b")
            # ... but deleting the Job mkd already placed there still reaches its worker copy
            await kube.delete(PYTORCHJOBS, "held", "q-b")
            held = agent.places()[0].placement.workload_uid
            await eventually(lambda: [d for d in agent.deletes() if d.placement.workload_uid == held],
                             what="Delete of the held Job after --namespaces narrowed", within=30)
            assert not [p for p in agent.places() if p.job.name == "new-in-b"]
        assert any("following 1 Jobs mkd already claimed outside --namespaces" in r.getMessage() and "q-b (1)"
                   in r.getMessage() for r in caplog.records)


async def test_a_managedby_no_controller_claims_gets_one_warning(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    from dispatcher.handover.book import POLICIES
    from dispatcher.handover.crds import load_crd
    from federation.kube import CRDS

    await kube.create(CRDS, load_crd())
    await eventually(lambda: kube.served(POLICIES), what="HandoverPolicy served")
    await kube.create(POLICIES, {"apiVersion": "handover.mkd.dev/v1alpha1", "kind": "HandoverPolicy",
                                 "metadata": {"name": "everything"}, "spec": {"mode": "Shadow"}})
    s = settings(manager, db_url, mqtt_url, topic_root, handover={"flush_seconds": 0.2})

    async def warnings() -> list[dict[str, Any]]:
        return [e for e in (await kube.list(EVENTS, "default")).items
                if e.get("reason") == "UnknownController" and e["involvedObject"]["name"] == "orphan"]
    async with running(s):
        await kube.create(PYTORCHJOBS, pytorchjob("orphan", managed_by="example.com/other"), "default")
        await kube.create(PYTORCHJOBS, pytorchjob("theirs", managed_by=labels.TRAINING_OPERATOR), "default")
        found = await eventually(warnings, what="the UnknownController warning")
        assert "example.com/other" in found[0]["message"] and found[0]["type"] == "Warning"
        await asyncio.sleep(1.0)  # real time: a repeat of the warning, had one been written, lands now
    async with running(s):  # a restart does not say it again
        await asyncio.sleep(1.5)  # real time: the restarted dispatcher's first passes
    assert len(await warnings()) == 1
    theirs = [e for e in (await kube.list(EVENTS, "default")).items if e["involvedObject"]["name"] == "theirs"]
    assert theirs == []  # a known controller's Job hears nothing from mkd
    job = await kube.get(PYTORCHJOBS, "orphan", "default")
    assert not (job.get("status") or {}).get("conditions")  # mkd wrote nothing to the Job itself
