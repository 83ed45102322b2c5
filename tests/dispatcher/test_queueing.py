"""Queueing through the running dispatcher: order, the pending cap, priority classes, quota, restart.

The first three tests are order within a claim batch (never by uid), every pending Workload
considered (no cap) and priority classes.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncSession

from dispatcher import db, readmodel
from dispatcher.db import models as m
from dispatcher.queueing import views
from federation import labels
from federation.kinds.crds import load_crds
from federation.kube import CRDS, EVENTS, Kube, Resource
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

KUEUE = "kueue.x-k8s.io"
FLAVORS = Resource(KUEUE, "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False)
CQS = Resource(KUEUE, "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
LQS = Resource(KUEUE, "v1beta2", "localqueues", "LocalQueue")
WPCS = Resource(KUEUE, "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass", namespaced=False)
PCS = Resource("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False)


async def install_kueue(kube: Kube) -> None:
    for crd in load_crds():
        if crd["spec"]["group"] == KUEUE:
            await kube.create(CRDS, copy.deepcopy(crd))
    await eventually(lambda: kube.served(LQS), what="Kueue CRDs served", within=30)


def labelled(job: dict[str, Any], **extra: str) -> dict[str, Any]:
    job["metadata"].setdefault("labels", {}).update(extra)
    return job


async def placed_names(url: str) -> set[str]:
    return {r.name for r in await rows(url, m.workloads) if r.state in ("placed", "running")}


async def test_same_batch_claims_are_placed_in_creation_order(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    names = [f"job-{i}" for i in range(10, 30)]
    for name in names:  # all there before the dispatcher starts: claimed in one batch
        await kube.create(PYTORCHJOBS, pytorchjob(name, workers=0), "default")
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="5")), running(s):
        await eventually(lambda: _count(db_url, 5), what="five placed", within=30)
        await asyncio.sleep(0.3)
        assert await placed_names(db_url) == set(names[:5])


async def _count(url: str, n: int) -> bool:
    return len(await placed_names(url)) >= n


async def test_every_pending_workload_is_considered_not_only_the_first_batch(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    s = settings(manager, db_url, mqtt_url, topic_root, batch_size=5)   # the old round read 4 * 5 rows
    for i in range(25):
        await kube.create(PYTORCHJOBS, pytorchjob(f"gpu-{i:02d}", workers=0, gpu=1), "default")
    await kube.create(PYTORCHJOBS, pytorchjob("small", workers=0), "default")
    async with FakeAgent("worker-1", mqtt_url, topic_root), running(s):   # no GPUs anywhere
        await eventually(lambda: _has(db_url, "small"), what="the CPU job placed behind 25 GPU jobs", within=30)


async def _has(url: str, name: str) -> bool:
    return name in await placed_names(url)


async def test_priority_from_workload_priority_class_then_pod_priority_class(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    await install_kueue(kube)
    await kube.create(WPCS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "WorkloadPriorityClass",
                             "metadata": {"name": "urgent"}, "value": 1000})
    await kube.create(PCS, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                            "metadata": {"name": "high"}, "value": 100})
    plain = pytorchjob("plain", workers=0)
    high = pytorchjob("high", workers=0)
    high["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["priorityClassName"] = "high"
    urgent = labelled(pytorchjob("urgent", workers=0), **{"kueue.x-k8s.io/priority-class": "urgent"})
    for job in (plain, high, urgent):
        await kube.create(PYTORCHJOBS, job, "default")
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="1")), running(s):
        await eventually(lambda: _count(db_url, 1), what="one placed", within=30)
        by_name = {r.name: r for r in await rows(db_url, m.workloads)}
        assert {n: r.priority for n, r in by_name.items()} == {"plain": 0, "high": 100, "urgent": 1000}
        assert by_name["urgent"].priority_source == "WorkloadPriorityClass urgent"
        assert await placed_names(db_url) == {"urgent"}   # created last, placed first


def _cq(name: str, cpu: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{KUEUE}/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                {"name": "default", "resources": [{"name": "cpu", "nominalQuota": cpu},
                                                  {"name": "memory", "nominalQuota": "100Gi"}]}]}], **spec}}


async def test_quota_holds_a_team_and_frees_when_a_job_finishes_and_survives_a_restart(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    await install_kueue(kube)
    await kube.create(FLAVORS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "ResourceFlavor",
                                "metadata": {"name": "default"},
                                "spec": {"nodeLabels": {"pool": "general"},
                                         "tolerations": [{"key": "team", "operator": "Exists"}]}})
    await kube.create(CQS, _cq("team-a", "2"))
    await kube.create(LQS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "LocalQueue",
                            "metadata": {"name": "team-a", "namespace": "default"}, "spec": {"clusterQueue": "team-a"}},
                      "default")
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent:
        async with running(s):
            for i in range(3):
                await kube.create(PYTORCHJOBS, labelled(pytorchjob(f"a{i}", workers=0), **{labels.QUEUE_NAME: "team-a"}),
                                  "default")
            await kube.create(PYTORCHJOBS, pytorchjob("unqueued", workers=0), "default")
            await eventually(lambda: _count(db_url, 2), what="two placed", within=30)

            async def pending_reason(name: str, type_: str) -> Any:
                c = cond(await kube.get(PYTORCHJOBS, name, "default"), type_)
                return c if c and c["status"] == "False" else None
            c = await eventually(lambda: pending_reason("a2", labels.CONDITION_QUOTA_RESERVED), what="a2 waits for quota", within=30)
            assert c["message"] == ("couldn't assign flavors to pod set master: insufficient unused quota for cpu in "
                                    "flavor default, 1 more needed")
            c = await eventually(lambda: pending_reason("unqueued", labels.CONDITION_QUOTA_RESERVED),
                                 what="no LocalQueue", within=30)
            assert c["message"] == "LocalQueue default/default does not exist"
            place = next(p for p in agent.places() if p.job.name == "a0")
            assert {k: v.model_dump() for k, v in place.pod_scheduling.items()} == {"master": {
                "node_selector": {"pool": "general"}, "tolerations": [{"key": "team", "operator": "Exists"}]}}
            a0 = await kube.get(PYTORCHJOBS, "a0", "default")
            reserved = cond(a0, labels.CONDITION_QUOTA_RESERVED)
            assert reserved is not None and reserved["status"] == "True"
            assert reserved["message"] == "Quota reserved in ClusterQueue team-a (master: cpu=default, memory=default)"
            rs = {r.name: r for r in await rows(db_url, m.workloads)}
            assert rs["a0"].cluster_queue == "team-a" and rs["a0"].usage == {"default/cpu": "1", "default/memory": "1Gi"}

            # kubectl get clusterqueues / localqueues show real figures
            async def cq_status() -> Any:
                st = (await kube.get(CQS, "team-a")).get("status") or {}
                return st if st.get("admittedWorkloads") == 2 and st.get("pendingWorkloads") == 1 else None
            st = await eventually(cq_status, what="ClusterQueue status written", within=30)
            assert st["flavorsUsage"] == [{"name": "default", "resources": [
                {"name": "cpu", "total": "2", "borrowed": "0"}, {"name": "memory", "total": "2Gi", "borrowed": "0"}]}]
            assert [(c["type"], c["status"], c["reason"]) for c in st["conditions"]] == [("Active", "True", "Ready")]
            lq = (await kube.get(LQS, "team-a", "default")).get("status") or {}
            assert lq["pendingWorkloads"] == 1 and lq["admittedWorkloads"] == 2

            # the one answer to "why is a2 not running", and its position
            answer = await _why(db_url, "default/a2")
            assert answer["step"] == "quota" and "1 more needed" in answer["answer"]
            assert answer["position_in_cluster_queue"] == 1 and answer["cluster_queue"] == "team-a"
            assert (await _why(db_url, "default/unqueued"))["step"] == "queue"
            assert (await _why(db_url, "default/a0"))["step"] == "admitted"
            pending = await _pending(db_url, "team-a")
            assert [(p["name"], p["position_in_cluster_queue"], p["position_in_local_queue"]) for p in pending] == [
                ("a2", 1, 1)]
        # a restarted dispatcher reads the quota held back from SQL: a2 still waits
        async with running(s):
            await asyncio.sleep(1.0)
            assert await placed_names(db_url) == {"a0", "a1"}
            place = next(p for p in agent.places() if p.job.name == "a0")
            await agent.status(place, {"conditions": [{"type": "Succeeded", "status": "True"}]}, finished="Succeeded")
            await eventually(lambda: _has(db_url, "a2"), what="a2 placed once a0 finished", within=30)


async def _why(url: str, ref: str) -> dict[str, Any]:
    engine = db.make_engine(url)
    try:
        async with AsyncSession(engine) as session:
            answer = await readmodel.why(session, ref)
            assert answer is not None
            return answer
    finally:
        await engine.dispose()


async def _pending(url: str, cq: str) -> list[dict[str, Any]]:
    engine = db.make_engine(url)
    try:
        async with AsyncSession(engine) as session:
            return await views.pending_from_db(session, cluster_queue=cq)
    finally:
        await engine.dispose()


async def test_a_higher_priority_job_preempts_and_the_victim_is_requeued_with_its_history(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    await install_kueue(kube)
    await kube.create(FLAVORS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "ResourceFlavor",
                                "metadata": {"name": "default"}})
    await kube.create(CQS, _cq("team-a", "1", preemption={"withinClusterQueue": "LowerPriority"}))
    await kube.create(LQS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "LocalQueue",
                            "metadata": {"name": "team-a", "namespace": "default"}, "spec": {"clusterQueue": "team-a"}},
                      "default")
    await kube.create(WPCS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "WorkloadPriorityClass",
                             "metadata": {"name": "urgent"}, "value": 1000})
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root) as agent, running(s):
        await kube.create(PYTORCHJOBS, labelled(pytorchjob("low", workers=0), **{labels.QUEUE_NAME: "team-a"}),
                          "default")
        await eventually(lambda: _has(db_url, "low"), what="low placed", within=30)
        await agent.status(agent.places()[0], {"startTime": "2026-01-01T00:00:00Z", "conditions": [
            {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}]})

        async def low_runs() -> Any:
            return ((await kube.get(PYTORCHJOBS, "low", "default")).get("status") or {}).get("startTime")
        await eventually(low_runs, what="low's worker status mirrored", within=30)
        await kube.create(PYTORCHJOBS, labelled(pytorchjob("high", workers=0), **{
            labels.QUEUE_NAME: "team-a", "kueue.x-k8s.io/priority-class": "urgent"}), "default")
        await eventually(lambda: _has(db_url, "high"), what="high placed after preempting low", within=30)
        assert any(d.job.name == "low" for d in agent.deletes())     # the worker copy is deleted by its agent

        async def preempted() -> Any:
            c = cond(await kube.get(PYTORCHJOBS, "low", "default"), labels.CONDITION_PREEMPTED)
            return c if c and c["status"] == "True" else None
        c = await eventually(preempted, what="Preempted on the victim", within=30)
        assert c["reason"] == "InClusterQueue" and "default/high" in c["message"]
        low = {r.name: r for r in await rows(db_url, m.workloads)}["low"]
        assert low.state == "pending" and low.queued_at <= low.created_at   # back in its queue at its old place
        history = await rows(db_url, m.events, workload_uid=low.uid)
        types = [e.type for e in history]
        assert types[:1] == ["claimed"] and "placed" in types and "evicted" in types   # its history kept
        assert [e.cluster for e in history if e.type == "evicted"] == ["worker-1"]     # and where it was evicted from

        # what Kueue writes on an evicted Workload (scheduler, then the job reconciler's eviction step):
        # Evicted and Preempted, Requeued=True with the eviction's reason and message, the quota given back
        why = c["message"]
        st = (await kube.get(PYTORCHJOBS, "low", "default"))["status"]
        got = _conds(st)
        # (QuotaReserved=False says the eviction until the next scheduling pass says what it waits for, as in Kueue)
        assert {t: v[:2] for t, v in got.items() if t in ("QuotaReserved", labels.CONDITION_PENDING)} == {
            "QuotaReserved": ("False", "Pending"),
            labels.CONDITION_PENDING: ("True", "Preempted" if got["QuotaReserved"][2] == why else "QuotaNotReserved")}
        assert {t: v for t, v in got.items() if t not in ("QuotaReserved", labels.CONDITION_PENDING)} == {
            "Evicted": ("True", "Preempted", why), "Preempted": ("True", "InClusterQueue", why),
            "Requeued": ("True", "Preempted", why),
            "Admitted": ("False", "NoReservation", "The workload has no reservation"),
            labels.CONDITION_DISPATCHED: ("False", "Preempted", why)}
        # its copy is gone, so is the copy's status: kubectl get does not show the evicted Job Running
        assert "startTime" not in st and _state(st) == labels.CONDITION_PENDING
        # one Event for the preemption, Normal as Kueue's "Preempted" (not a second, Warning "Evicted")
        found = (await kube.list(EVENTS, "default")).items
        assert [(e["type"], e["reason"]) for e in found if e["involvedObject"]["name"] == "low"
                and e["reason"] in ("Preempted", "Evicted")] == [("Normal", "Preempted")]
        requeued_at = cond({"status": st}, "Requeued")["lastTransitionTime"]  # type: ignore[index]

        high_place = next(p for p in agent.places() if p.job.name == "high")
        await agent.status(high_place, {
            "startTime": "2026-01-01T00:01:00Z", "completionTime": "2026-01-01T00:02:00Z", "conditions": [
                {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded",
                 "message": "PyTorchJob high is successfully completed.",
                 "lastTransitionTime": "2026-01-01T00:02:00Z"}]}, finished="Succeeded")

        async def readmitted() -> Any:
            c = cond(await kube.get(PYTORCHJOBS, "low", "default"), labels.CONDITION_QUOTA_RESERVED)
            return c if c and c["status"] == "True" else None
        await eventually(readmitted, what="low admitted again once high finished", within=30)
        # Kueue's SetQuotaReservation: Evicted and Preempted flip to False ("Previously: ..."), Requeued stays
        st = (await kube.get(PYTORCHJOBS, "low", "default"))["status"]
        got = _conds(st)
        assert got["Evicted"] == ("False", "QuotaReserved", f"Previously: {why}")
        assert got["Preempted"] == ("False", "QuotaReserved", f"Previously: {why}")
        assert got["Requeued"] == ("True", "Preempted", why)
        assert cond({"status": st}, "Requeued")["lastTransitionTime"] == requeued_at  # type: ignore[index]
        assert got["Admitted"][0] == "True" and labels.CONDITION_PENDING not in got
        assert st["conditions"][-1]["status"] == "True"  # STATE: what holds now, not what was undone

        # a finished Workload: Finished=True with the Job's own words; its quota is released, while
        # QuotaReserved and Admitted stay True as on Kueue's Workload; the Job's own condition stays last
        async def finished() -> Any:
            st = (await kube.get(PYTORCHJOBS, "high", "default")).get("status") or {}
            return st if st.get("completionTime") else None
        st = await eventually(finished, what="high's end mirrored", within=30)
        got = _conds(st)
        assert got["Finished"] == ("True", "Succeeded", "PyTorchJob high is successfully completed.")
        assert got["QuotaReserved"][0] == "True" and got["Admitted"][0] == "True"
        assert _state(st) == "Succeeded"


def _conds(st: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c.get("reason", ""), c.get("message", "")) for c in st.get("conditions") or []}


def _state(st: dict[str, Any]) -> str:
    """The STATE column of ``kubectl get pytorchjobs``: the CRD prints ``.status.conditions[-1:].type``."""
    conds = st.get("conditions") or []
    return str(conds[-1]["type"]) if conds else ""


async def test_a_starving_job_that_fits_nowhere_lets_go_of_its_hold_and_why_says_so(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """Open mode; a gang of 16-CPU pods on a cluster of 8-CPU nodes (64 in all): starving after 1 s, it
    holds worker-1; with no more room there for 2 s it lets go, and ``why`` says so."""
    s = settings(manager, db_url, mqtt_url, topic_root, starvation_seconds=1.0, starvation_hold_seconds=2.0,
                 placement_retry_seconds=0.5)
    async with FakeAgent("worker-1", mqtt_url, topic_root, cap=capacity(cpu="64", node_cpu="8"), beat_every=0.5):
        async with running(s):
            await kube.create(PYTORCHJOBS, pytorchjob("gang", workers=3, cpu="16"), "default")

            async def let_go() -> Any:
                if not any(r.name == "gang" for r in await rows(db_url, m.workloads)):
                    return None  # not claimed yet
                answer = await _why(db_url, "default/gang")
                said = " ".join([answer["answer"], *answer["details"]])
                return said if "let go of cluster worker-1" in said else None
            said = await eventually(let_go, what="the hold let go, in why", within=30)
            assert "no more room for it there in 2s" in said, said
            assert (await _why(db_url, "default/gang"))["step"] == "placement"
            c = cond(await kube.get(PYTORCHJOBS, "gang", "default"), labels.CONDITION_DISPATCHED)
            assert c is not None and c["status"] == "False"


async def test_a_restarted_dispatcher_queues_its_pending_workloads_without_a_failed_batch(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str,
        caplog: pytest.LogCaptureFixture) -> None:
    """The start-up rebuild runs before intake's first list, so the pending Workloads' Jobs
    arrive in a batch whose rows are loaded without their PodSets; their need must be read from SQL
    (it failed the batch with ``KeyError: 'podsets'`` and cost a rebuild)."""
    s = settings(manager, db_url, mqtt_url, topic_root)
    names = [f"wait-{i}" for i in range(3)]
    async with running(s):   # no cluster: they stay pending
        for name in names:
            await kube.create(PYTORCHJOBS, pytorchjob(name, workers=0), "default")

        async def pending() -> bool:
            return sorted(r.name for r in await rows(db_url, m.workloads) if r.state == "pending") == names
        await eventually(pending, what="three pending Workloads")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dispatcher"):
        async with running(s) as again:
            assert again.engine is not None
            engine = again.engine
            # still no cluster: they wait in their queue (with one online a batch could queue and place them at
            # once, and open-mode placements hold no quota: the count would never be seen at 3)
            await eventually(lambda: len(engine.queueing.queues.entries) + len(engine.queueing.queues.admitted) == 3,
                             what="the pending Workloads queued again", within=30)
            async with FakeAgent("worker-1", mqtt_url, topic_root):
                await eventually(lambda: _count(db_url, 3), what="all three placed", within=30)
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed == []


async def test_a_workload_sent_back_to_its_queue_gives_its_quota_back_on_the_job_too(
        manager: Path, kube: Kube, db_url: str, mqtt_url: str, topic_root: str) -> None:
    """A placement refused for good puts the Workload back in its queue and frees its quota: the Job must
    not keep saying QuotaReserved=True / Admitted=True (Kueue's UnsetQuotaReservationWithCondition and
    SyncAdmittedCondition), and kubectl get reads it as pending."""
    from federation import messages
    await install_kueue(kube)
    await kube.create(FLAVORS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "ResourceFlavor",
                                "metadata": {"name": "default"}})
    await kube.create(CQS, _cq("team-a", "2"))
    await kube.create(LQS, {"apiVersion": f"{KUEUE}/v1beta2", "kind": "LocalQueue",
                            "metadata": {"name": "team-a", "namespace": "default"}, "spec": {"clusterQueue": "team-a"}},
                      "default")
    s = settings(manager, db_url, mqtt_url, topic_root)
    async with FakeAgent("worker-1", mqtt_url, topic_root, auto_accept=False) as picky, running(s):
        await kube.create(PYTORCHJOBS, labelled(pytorchjob("picky", workers=0), **{labels.QUEUE_NAME: "team-a"}),
                          "default")
        await eventually(lambda: picky.places(), what="placed", within=30)

        async def reserved(value: str) -> Any:
            c = cond(await kube.get(PYTORCHJOBS, "picky", "default"), labels.CONDITION_QUOTA_RESERVED)
            return c if c and c["status"] == value else None
        await eventually(lambda: reserved("True"), what="QuotaReserved=True", within=30)
        await picky.report(messages.Rejected(cluster="worker-1", placement=picky.places()[0].placement,
                                             spec_version=1, seq=1, reason="KindNotSupported",
                                             message="no operator here", permanent=True))
        c = await eventually(lambda: reserved("False"), what="QuotaReserved=False once requeued", within=30)
        assert c["reason"] == "Pending" and "rejected by worker-1" in c["message"]
        st = (await kube.get(PYTORCHJOBS, "picky", "default"))["status"]
        assert _conds(st)["Admitted"] == ("False", "NoReservation", "The workload has no reservation")
        assert _state(st) == labels.CONDITION_PENDING
