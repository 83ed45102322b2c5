"""``settles_after``: for the Kubeflow v1 family, a render right after a pass's own creates and status write
plans nothing more (unless that status finished the job), so the apply loop may let the watch echoes of those
writes go without a pass (worker_agent.apply).

Checked on many states (seeded random pod phases, exit codes, suspend and resume, time passing), every member of
the family: whenever a pass created or wrote a status it says it settles after, and deleted nothing (deletes
bring events of their own), the pass right after it, with nothing else changed, plans nothing. A finished status
is the exception the check found: the pass after it moves active replicas to succeeded. Then at the loop's seam:
a settling job's echoes queue no pass, another reconciler's still do.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from federation.clock import SystemClock
from federation.kube import PODS, Resource
from tests.agent.render_harness import MemCluster, example
from worker_agent.apply import ApplyLoop, JobKey, StatusEcho, settles
from worker_agent.cache import ObjectCache, Stored
from worker_agent.reconcilers.base import Plan
from worker_agent.reconcilers.family import (
    JAXJobReconciler,
    PaddleJobReconciler,
    TFJobReconciler,
    XGBoostJobReconciler,
)
from worker_agent.reconcilers.kubeflow import KubeflowV1Reconciler
from worker_agent.reconcilers.pytorch import PyTorchJobReconciler
from worker_agent.reconcilers.registry import reconcilers


def member_job(kind: str, field: str, container: str, specs: dict[str, int], policy: str) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": kind,
            "metadata": {"name": "demo", "namespace": "ns", "uid": "u1"},
            "spec": {field: {rt: {"replicas": n, "restartPolicy": policy, "template": {"spec": {"containers": [
                {"name": container, "image": "img"}]}}} for rt, n in specs.items()}}}


def cases() -> list[tuple[KubeflowV1Reconciler, dict[str, Any]]]:
    out: list[tuple[KubeflowV1Reconciler, dict[str, Any]]] = [
        (PyTorchJobReconciler(), example(name)) for name in
        ("pytorch-simple.yaml", "pytorch-sendrecv.yaml", "pytorch-elastic-echo.yaml", "pytorch-cpu-demo.yaml")]
    for policy in ("Never", "OnFailure", "ExitCode"):
        out += [
            (TFJobReconciler(), member_job("TFJob", "tfReplicaSpecs", "tensorflow",
                                           {"Chief": 1, "PS": 1, "Worker": 2}, policy)),
            (XGBoostJobReconciler(), member_job("XGBoostJob", "xgbReplicaSpecs", "xgboost",
                                                {"Master": 1, "Worker": 2}, policy)),
            (PaddleJobReconciler(), member_job("PaddleJob", "paddleReplicaSpecs", "paddle",
                                               {"Master": 1, "Worker": 1}, policy)),
            (JAXJobReconciler(), member_job("JAXJob", "jaxReplicaSpecs", "jax", {"Worker": 2}, policy)),
        ]
    return out


def quiet(plan: Plan) -> bool:
    return not (plan.creates or plan.updates or plan.deletes or plan.status is not None or plan.delete_job)


def own_writes_only(plan: Plan) -> bool:
    """A pass whose writes echo back as nothing new: creates and the status, no delete."""
    return bool(plan.creates or plan.updates or plan.status is not None) and not (plan.deletes or plan.delete_job)


def external_change(c: MemCluster, rng: random.Random) -> None:
    assert c.job is not None
    pods = sorted(c.objects["pods"])
    roll = rng.random()
    if pods and roll < 0.7:
        phase = rng.choice(["Pending", "Running", "Running", "Succeeded", "Failed"])
        code = rng.choice([0, 1, 137]) if phase in ("Succeeded", "Failed") else None
        c.set_phase(rng.choice(pods), phase, code, container=c.pod(pods[0])["spec"]["containers"][0]["name"])
    elif roll < 0.8:
        run_policy = c.job["spec"].setdefault("runPolicy", {})
        run_policy["suspend"] = not run_policy.get("suspend", False)
    elif roll < 0.9:
        c.job["spec"].setdefault("runPolicy", {})["activeDeadlineSeconds"] = rng.choice([30, 600])
    else:
        c.advance(rng.choice([1, 45, 700]))


@pytest.mark.parametrize("seed", range(6))
def test_a_render_right_after_its_own_writes_plans_nothing(seed: int) -> None:
    rng = random.Random(seed)
    checked = 0
    for reconciler, manifest in cases():
        assert settles(reconciler)
        c = MemCluster(reconciler, manifest)
        for _ in range(25):
            for _ in range(8):  # the passes an external change causes, until one plans nothing
                if c.job is None:
                    break
                plan = c.step()
                if own_writes_only(plan) and c.job is not None and reconciler.settles_after(plan.status):
                    after = c.step()
                    assert quiet(after), (c.job["kind"], seed, plan, after)
                    checked += 1
                    break
                if quiet(plan):
                    break
            if c.job is None:
                break
            external_change(c, rng)
    assert checked > 20


def test_a_finished_status_does_not_settle() -> None:
    c = MemCluster(PyTorchJobReconciler(), example("pytorch-simple.yaml"))
    c.settle()
    c.all_phase("Running")
    c.step()
    c.set_phase("pytorch-simple-master-0", "Succeeded", 0)
    finished = c.step().status
    assert finished is not None and not PyTorchJobReconciler.settles_after(finished)
    assert c.step().status is not None  # the Worker's active replica counted as succeeded


def test_only_the_v1_family_settles() -> None:
    assert {name for name, r in reconcilers().items() if settles(r)} == {
        "PyTorchJob", "TFJob", "XGBoostJob", "PaddleJob", "JAXJob"}


class Recording(ApplyLoop):
    def __init__(self) -> None:
        res = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
        caches = {"pytorchjobs": ObjectCache("pytorchjobs"), "pods": ObjectCache("pods")}
        super().__init__(None, {"PyTorchJob": PyTorchJobReconciler(), "MPIJob": reconcilers()["MPIJob"]},  # type: ignore[arg-type]
                         {"PyTorchJob": res}, caches, SystemClock())
        self.queued: list[JobKey] = []

    def enqueue(self, key: JobKey) -> None:
        self.queued.append(key)


def pod(rv: int, owner_uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "demo-master-0", "namespace": "ns", "resourceVersion": str(rv),
        "ownerReferences": [{"uid": owner_uid, "controller": True}]}, "status": {"phase": "Pending"}}


async def test_echoes_of_own_writes_queue_no_pass_for_a_settling_job_only() -> None:
    loop = Recording()
    by_uid: dict[str, JobKey] = {"u1": ("PyTorchJob", "ns", "demo"), "u2": ("MPIJob", "ns", "other")}
    cache = loop.caches["pods"]
    cache.upsert(pod(5, "u1"))  # the create's answer
    echo = pod(5, "u1")
    stored = cache.upsert(echo, watched=True)
    assert stored is Stored.HELD and loop.own_echo(PODS.plural, ("ns", "demo-master-0"), stored, added=True)
    loop.enqueue_owner(echo, by_uid, echo=True)
    assert loop.queued == []
    loop.enqueue_owner(pod(6, "u2"), by_uid, echo=True)  # MPIJob does not settle: its echo still costs a pass
    assert loop.queued == [("MPIJob", "ns", "other")]
    # an echo that comes before the create's answer, while the pass is creating it; but not the pod's next
    # change, which may come as early (scheduled and running before the pass's other creates are answered)
    loop._creating.add(("pods", "ns", "demo-worker-0"))
    assert loop.own_echo(PODS.plural, ("ns", "demo-worker-0"), Stored.CHANGED, added=True)
    assert not loop.own_echo(PODS.plural, ("ns", "demo-worker-0"), Stored.CHANGED, added=False)
    assert not loop.own_echo(PODS.plural, ("ns", "demo-worker-1"), Stored.CHANGED, added=True)
    await asyncio.sleep(0)


def test_status_echo_settles_only_when_nothing_but_the_status_changed() -> None:
    loop = Recording()
    key: JobKey = ("PyTorchJob", "ns", "demo")
    job: dict[str, Any] = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {
        "name": "demo", "namespace": "ns", "uid": "u1", "resourceVersion": "7"}, "spec": {"x": 1}}
    written: dict[str, Any] = {**job, "metadata": {**job["metadata"], "resourceVersion": "8", "managedFields": []},
               "status": {"conditions": []}}
    loop._status_written[key] = (8, True)
    assert loop.status_echo(key, {"metadata": {"resourceVersion": "9"}}) is StatusEcho.NOT_OURS
    assert loop.status_echo(key, written) is StatusEcho.SETTLED
    assert loop.status_echo(key, written) is StatusEcho.NOT_OURS  # once
    from worker_agent.apply import _same_but_status
    assert _same_but_status(job, written)
    assert not _same_but_status(job, {**written, "spec": {"x": 2}})
    assert not _same_but_status(job, {**written, "metadata": {**written["metadata"], "labels": {"a": "b"}}})


def test_same_but_status_reads_the_spec_through_its_generation_when_both_carry_one() -> None:
    """The API server moves ``metadata.generation`` on every change of a custom resource's spec (not on a status
    write): two versions with one generation have one spec, whose comparison (the whole pod templates) is then
    skipped; without a generation on both, the specs are compared."""
    from worker_agent.apply import _same_but_status

    meta = {"name": "demo", "namespace": "ns", "uid": "u1", "resourceVersion": "7", "generation": 2}
    job: dict[str, Any] = {"metadata": meta, "spec": {"x": 1}}
    written: dict[str, Any] = {"metadata": {**meta, "resourceVersion": "8"}, "spec": {"x": 1}, "status": {}}
    assert _same_but_status(job, written)
    assert not _same_but_status(job, {**written, "metadata": {**written["metadata"], "generation": 3}})
    # one generation: the spec is not read (a server that kept it would have moved the generation)
    assert _same_but_status(job, {**written, "spec": {"x": 2}})
    no_generation = {k: v for k, v in meta.items() if k != "generation"}
    assert not _same_but_status({**job, "metadata": no_generation},
                                {**written, "metadata": {**no_generation, "resourceVersion": "8"}, "spec": {"x": 2}})
    assert not _same_but_status({**job, "metadata": no_generation}, {**written, "spec": {"x": 2}})


def test_starting_is_running_with_replicas_still_to_start_and_none_finished() -> None:
    """``starting`` (the apply loop holds such a status as it holds Created): Running the latest condition, fewer
    active than the spec asks for of some type, no replica succeeded or failed."""
    from worker_agent.reconcilers.pytorch import PyTorchJobReconciler

    rec = PyTorchJobReconciler()
    job = example("pytorch-simple.yaml")  # Master 1, Worker 1

    def status(latest: str, **entries: dict[str, int]) -> dict[str, Any]:
        conds = [{"type": "Created", "status": "True"}, {"type": latest, "status": "True"}]
        return {"conditions": conds, "replicaStatuses": entries}

    assert rec.starting(job, status("Running", Master={"active": 1}, Worker={}))
    assert rec.starting(job, status("Running", Master={"active": 1}))
    assert not rec.starting(job, status("Running", Master={"active": 1}, Worker={"active": 1}))
    assert not rec.starting(job, status("Running", Master={"active": 1}, Worker={"failed": 1}))
    assert not rec.starting(job, status("Running", Master={"succeeded": 1}, Worker={}))
    assert not rec.starting(job, status("Restarting", Master={"active": 1}, Worker={}))
    assert not rec.starting(job, {"conditions": [{"type": "Created", "status": "True"}]})
    assert not rec.starting({"spec": {}}, status("Running", Master={"active": 1}))  # no replica specs: not ours to hold
