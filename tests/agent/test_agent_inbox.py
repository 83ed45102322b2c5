"""The inbox: repeats, out-of-order and stale Commands, Delete, Resync GC, restarts, heartbeats, delegation."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

import federation.kube
from federation import labels
from federation.kinds.crds import load_crds
from federation.kube import CRDS, JOBS, PODS, Resource
from federation.messages import Delete, Heartbeat, PlacementKey, Resync
from tests.agent.conftest import CLUSTER, PYTORCHJOBS, AgentHarness, conditions, place
from tests.agent.render_harness import example
from tests.agent.test_agent_pytorch import FOREVER, RUN, has, with_annotations
from tests.waiting import eventually

TFJOBS = Resource("kubeflow.org", "v1", "tfjobs", "TFJob")


def forever(name: str = "pytorch-simple.yaml") -> dict[str, Any]:
    return with_annotations(example(name), **{FOREVER: "true"})


async def test_repeats_and_stale_commands_are_harmless(harness: AgentHarness) -> None:
    cmd = place(forever(), epoch=2)
    await harness.send(cmd)
    first = await harness.wait_report(lambda r: r.type == "accepted")
    await harness.send(cmd)  # at-least-once delivery: the same Place again
    n = len(harness.reports)
    repeat = await harness.wait_report(lambda r: r.type == "accepted", after=n)
    assert repeat.seq > first.seq and repeat.spec_version == 1
    older_epoch = place(forever(), epoch=1)
    await harness.send(older_epoch)
    refused = await harness.wait_report(lambda r: r.type == "rejected")
    assert refused.reason == "Stale" and "epoch 1" in refused.message
    older_attempt = place(forever(), attempt=0, epoch=3)
    await harness.send(older_attempt)
    refused = await harness.wait_report(lambda r: r.type == "rejected" and r.placement.attempt == 0)
    assert refused.reason == "Stale"
    older_spec = copy.deepcopy(forever())
    older_spec["spec"]["runPolicy"] = {"suspend": True}
    await harness.send(place(older_spec, epoch=2, spec_version=0))  # an older spec version: no-op
    await harness.wait_report(lambda r: r.type == "accepted" and r.spec_version == 1, after=n + 1)
    stored = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert stored is not None and not stored["spec"].get("runPolicy", {}).get("suspend")
    assert stored["metadata"]["annotations"][labels.SPEC_VERSION_ANNOTATION] == "1"
    assert stored["metadata"]["labels"][labels.EPOCH] == "2"
    jobs = (await harness.kube.list(PYTORCHJOBS, "team-a")).items
    assert len(jobs) == 1


async def test_delete_then_late_place_is_refused(harness: AgentHarness) -> None:
    cmd = place(forever())
    await harness.send(cmd)
    await harness.wait_report(has(("Running", "True", "PyTorchJobRunning")))
    await harness.send(Delete(placement=cmd.placement, job=cmd.job, reason="done"))
    gone = await harness.wait_report(lambda r: r.type == "status" and r.gone)
    assert gone.placement == cmd.placement
    assert await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a") is None
    await harness.send(cmd)  # a late duplicate of the Place
    refused = await harness.wait_report(lambda r: r.type == "rejected")
    assert refused.reason == "Deleted"
    await harness.send(Delete(placement=cmd.placement, job=cmd.job))  # repeat delete: gone again
    n = len([r for r in harness.reports if r.type == "status" and r.gone])
    await harness.wait_report(lambda r: r.type == "status" and r.gone and
                              len([x for x in harness.reports if x.type == "status" and x.gone]) > n)


async def test_new_attempt_replaces_old_copy(harness: AgentHarness) -> None:
    await harness.send(place(forever(), attempt=1))
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement.attempt == 1)
    await harness.send(place(forever(), attempt=2))
    acc = await harness.wait_report(lambda r: r.type == "accepted" and r.placement.attempt == 2)
    assert acc.spec_version == 1
    stored = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert stored is not None and stored["metadata"]["labels"][labels.PLACEMENT_ATTEMPT] == "2"


async def test_invalid_manifest_and_unknown_kind_rejected(harness: AgentHarness) -> None:
    bad = forever()
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2
    await harness.send(place(bad))
    refused = await harness.wait_report(lambda r: r.type == "rejected")
    assert refused.reason == "Invalid" and "Master" in refused.message and refused.permanent
    odd = place(forever(), uid="wl-odd")
    odd = odd.model_copy(update={"job": odd.job.model_copy(update={"kind": "SparkJob"})})
    await harness.send(odd)
    refused = await harness.wait_report(lambda r: r.type == "rejected" and r.placement.workload_uid == "wl-odd")
    assert refused.reason == "UnsupportedKind"


async def test_namespace_not_created_when_configured(harness: AgentHarness) -> None:
    await harness.stop_agent()
    await harness.start_agent(create_namespaces=False)
    await harness.send(place(forever(), namespace="nowhere"))
    refused = await harness.wait_report(lambda r: r.type == "rejected")
    assert refused.reason == "NamespaceMissing" and "nowhere" in refused.message and not refused.permanent


async def test_resync_deletes_garbage_of_own_origin_only(harness: AgentHarness) -> None:
    keep = place(forever(), uid="wl-keep")
    garbage_job = forever()
    garbage_job["metadata"]["name"] = "garbage"
    garbage = place(garbage_job, uid="wl-garbage")
    for cmd in (keep, garbage):
        await harness.send(cmd)
        wanted = cmd.placement
        await harness.wait_report(lambda r: r.type == "accepted" and r.placement == wanted)  # noqa: B023
    foreign = forever()
    foreign["metadata"] = {"name": "users-own", "namespace": "team-a",
                           "labels": {labels.ORIGIN: "other-federation", labels.WORKLOAD_UID: "x"}}
    await harness.kube.create(PYTORCHJOBS, foreign, "team-a")
    await harness.send(Resync(cluster=CLUSTER, epoch=1, expected=[keep.placement]))
    gone = await harness.wait_report(lambda r: r.type == "status" and r.gone)
    assert gone.placement.workload_uid == "wl-garbage"
    assert await harness.get(PYTORCHJOBS, "garbage", "team-a") is None
    assert await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a") is not None
    assert await harness.get(PYTORCHJOBS, "users-own", "team-a") is not None


async def test_agent_restart_mid_job_loses_nothing(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-simple.yaml"), **{RUN: "2.0"})
    cmd = place(job)
    await harness.send(cmd)
    running = await harness.wait_report(has(("Running", "True", "PyTorchJobRunning")))
    await harness.stop_agent()
    await harness.start_agent()
    (item,) = harness.inventory.items
    assert item.placement == cmd.placement and item.spec_version == 1
    await harness.send(cmd)  # the dispatcher re-sends after the Inventory: a no-op
    n = len(harness.reports)
    await harness.wait_report(lambda r: r.type == "accepted", after=n)
    done = await harness.wait_report(lambda r: r.type == "status" and r.finished == "Succeeded", within=20)
    assert done.seq > running.seq
    assert conditions(done.status)[-1] == ("Succeeded", "True", "PyTorchJobSucceeded")
    pods = (await harness.kube.list(PODS, "team-a")).items
    assert sorted(p["metadata"]["name"] for p in pods) == ["pytorch-simple-master-0", "pytorch-simple-worker-0"]


async def test_heartbeat_capacity_and_kinds(harness: AgentHarness) -> None:
    beat: Heartbeat = await harness.wait_report(lambda r: r.type == "heartbeat" and r.capacity.allocatable)
    assert beat.online and beat.cluster == CLUSTER
    assert beat.capacity.allocatable["cpu"] == "24"
    assert beat.capacity.largest_node_free["cpu"] == "16"
    assert "PyTorchJob" in beat.kinds_reconciled and "MPIJob" in beat.kinds_reconciled
    job = with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true"})
    for rs in job["spec"]["pytorchReplicaSpecs"].values():
        rs["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2", "memory": "1Gi"}}
    await harness.send(place(job))
    lower = await harness.wait_report(lambda r: r.type == "heartbeat" and r.capacity.free.get("cpu") == "20")
    assert lower.running == 1


async def test_delegated_kind_gets_operator_managed_by(harness: AgentHarness) -> None:
    await harness.stop_agent()
    await harness.start_agent(delegate={"PyTorchJob": labels.TRAINING_OPERATOR})
    beat = await harness.wait_report(lambda r: r.type == "heartbeat" and r.kinds_delegated)
    assert beat.kinds_delegated == {"PyTorchJob": labels.TRAINING_OPERATOR}
    assert "PyTorchJob" not in beat.kinds_reconciled
    cmd = place(forever())
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted")
    stored = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert stored is not None and stored["spec"]["runPolicy"]["managedBy"] == labels.TRAINING_OPERATOR
    assert await harness.get(PODS, "pytorch-simple-master-0", "team-a") is None  # mirrored only
    stored["status"] = {"conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated",
                                        "message": "by the operator"}]}
    await harness.kube.replace(PYTORCHJOBS, stored, "team-a", subresource="status")
    mirrored = await harness.wait_report(lambda r: r.type == "status" and r.status.get("conditions"))
    assert mirrored.status["conditions"][0]["message"] == "by the operator"
    assert mirrored.placement == PlacementKey(workload_uid="wl-pytorch-simple", attempt=1, epoch=1)


async def test_kind_without_crd_is_rejected_not_lost(harness: AgentHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(federation.kube, "DISCOVERY_TTL", 0.1)  # the test need not wait out the cache
    await harness.kube.delete(CRDS, "tfjobs.kubeflow.org")
    async def tfjobs_gone() -> bool:
        return not await harness.kube.served(TFJOBS)
    await eventually(tfjobs_gone, what="TFJobs to be served no more")
    await harness.stop_agent()
    await harness.start_agent(discovery_interval_seconds=0.2)
    restarted = len(harness.reports)
    tf = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "tf"},
          "spec": {"tfReplicaSpecs": {"Worker": {"replicas": 1, "template": {"spec": {"containers": [
              {"name": "tensorflow", "image": "tf"}]}}}}}}
    await harness.send(place(tf))
    refused = await harness.wait_report(lambda r: r.type == "rejected")
    assert refused.reason == "KindNotServed" and not refused.permanent
    beat = await harness.wait_report(lambda r: r.type == "heartbeat" and r.kinds_reconciled, after=restarted)
    assert "TFJob" not in beat.kinds_reconciled and "PyTorchJob" in beat.kinds_reconciled
    (crd,) = [c for c in load_crds() if c["metadata"]["name"] == "tfjobs.kubeflow.org"]
    await harness.kube.create(CRDS, crd)  # installed later: picked up without a restart
    await harness.wait_report(lambda r: r.type == "heartbeat" and "TFJob" in r.kinds_reconciled, after=restarted)
    await harness.send(place(tf, uid="wl-tf-2"))
    accepted = await harness.wait_report(lambda r: r.type == "accepted")
    assert accepted.placement.workload_uid == "wl-tf-2"
    await harness.wait_report(lambda r: r.type == "status" and r.placement.workload_uid == "wl-tf-2"
                              and any(c["type"] == "Created" for c in r.status.get("conditions", [])))


async def test_resync_keeps_a_job_whose_place_arrived_after_it(harness: AgentHarness) -> None:
    """A Resync lists what the dispatcher expected when it built it; a later Place is newer, not garbage."""
    cmd = place(forever(), uid="wl-late")
    await harness.send(cmd)
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement == cmd.placement)
    assert harness.agent is not None and harness.agent.inbox is not None
    inbox = harness.agent.inbox
    placed_at = inbox.place_arrival["wl-late"]

    await inbox.resync(Resync(cluster=CLUSTER, epoch=1, expected=[]), arrival=placed_at - 1)
    assert await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a") is not None

    await inbox.resync(Resync(cluster=CLUSTER, epoch=1, expected=[]), arrival=placed_at)
    gone = await harness.wait_report(lambda r: r.type == "status" and r.gone)
    assert gone.placement.workload_uid == "wl-late"


async def test_a_resync_in_parts_is_acted_on_only_whole(harness: AgentHarness) -> None:
    from federation import chunks

    keep = place(forever(), uid="wl-keep")
    garbage_job = forever()
    garbage_job["metadata"]["name"] = "garbage"
    garbage = place(garbage_job, uid="wl-garbage")
    for cmd in (keep, garbage):
        await harness.send(cmd)
        wanted = cmd.placement
        await harness.wait_report(lambda r: r.type == "accepted" and r.placement == wanted)  # noqa: B023
    others = [PlacementKey(workload_uid=f"wl-elsewhere-{i}", attempt=1, epoch=1) for i in range(300)]
    parts = chunks.split(Resync(cluster=CLUSTER, epoch=1, expected=[*others, keep.placement]), budget=6_000)
    assert len(parts) >= 3
    for p in parts[:-1]:  # the part listing wl-keep is last: acting early would delete it
        await harness.send(p)
    await asyncio.sleep(0.5)  # real time: nothing to wait for (the partial Resync must not act); the agent runs on the system clock
    assert await harness.get(PYTORCHJOBS, "garbage", "team-a") is not None  # nothing done on a partial list
    await harness.send(parts[-1])
    gone = await harness.wait_report(lambda r: r.type == "status" and r.gone)
    assert gone.placement.workload_uid == "wl-garbage"
    assert await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a") is not None


async def test_a_place_retried_after_a_failed_create_is_checked_as_it_was_sent(harness: AgentHarness) -> None:
    """A retry of a Place is checked as the dispatcher sent it, not as the worker copy its first try made: a batch
    Job delegated to a managedBy that a Job may not carry on the manager (the worker's API server takes any
    domain-prefixed path) is still created, with that managedBy, after a failed create. (What an inbox that
    prepared the manifest in place, to save its copy, would have to keep: bench/RESULTS.md.)"""
    from tests.agent.test_agent_edits import batch_job

    await harness.stop_agent()
    await harness.start_agent(delegate={"Job": "example.com/elsewhere"})
    await harness.wait_report(lambda r: r.type == "heartbeat" and r.kinds_delegated)
    assert harness.agent is not None and harness.agent.inbox is not None
    kube = harness.agent.inbox.kube
    real_create = kube.create
    failed: list[str] = []

    async def create_failing_once(res: Resource, body: Any, namespace: str | None = None) -> dict[str, Any]:
        if res.plural == JOBS.plural and not failed:
            failed.append(body["spec"]["managedBy"])
            raise federation.kube.Transport("injected: the API server did not answer")
        return await real_create(res, body, namespace)

    kube.create = create_failing_once  # type: ignore[method-assign]
    try:
        await harness.send(place(batch_job(), uid="wl-batch-pi"))
        answer = await harness.wait_report(lambda r: r.type in ("accepted", "rejected"))
    finally:
        kube.create = real_create  # type: ignore[method-assign]
    assert answer.type == "accepted", (getattr(answer, "reason", ""), getattr(answer, "message", ""))
    assert failed == ["example.com/elsewhere"]  # the first try sent the worker copy, then failed
    stored = await harness.get(JOBS, "batch-pi", "team-a")
    assert stored is not None and stored["spec"]["managedBy"] == "example.com/elsewhere"


def test_a_created_copy_is_remembered_for_its_echo_only_when_the_echo_tells_nothing_new() -> None:
    """``inbox.new_copy``: a copy with no status and not fenced is remembered by its version (its echo needs no
    decoding); one with a status, fenced, or with no version or placement labels is not."""
    from worker_agent.inbox import Applied, new_copy

    def copy_(**extra: Any) -> dict[str, Any]:
        obj: dict[str, Any] = {"metadata": {"name": "j", "namespace": "ns", "resourceVersion": "41", "labels": {
            labels.ORIGIN: "o", labels.WORKLOAD_UID: "u1", labels.PLACEMENT_ATTEMPT: "2", labels.EPOCH: "3"},
            "annotations": {labels.SPEC_VERSION_ANNOTATION: "4"}}}
        obj.update(extra)
        return obj

    made = new_copy("PyTorchJob", copy_())
    assert made is not None and made[0] == 41
    assert made[1].applied == Applied("PyTorchJob", "ns", "j", 2, 3, 4)
    assert made[1].placement == PlacementKey(workload_uid="u1", attempt=2, epoch=3)
    assert new_copy("PyTorchJob", copy_(status={})) is not None  # an empty status tells nothing either
    assert new_copy("PyTorchJob", copy_(status={"conditions": []})) is None
    fenced = copy_()
    fenced["metadata"]["annotations"][labels.FENCED_ANNOTATION] = "true"
    assert new_copy("PyTorchJob", fenced) is None
    unversioned = copy_()
    del unversioned["metadata"]["resourceVersion"]
    assert new_copy("PyTorchJob", unversioned) is None
    assert new_copy("PyTorchJob", {"metadata": {"name": "j", "resourceVersion": "41"}}) is None
