"""RayJob, RayCluster and RayService end to end: claimed, queued by their PodSets as Kueue counts them, placed, created on
a worker without managedBy (the worker's KubeRay, kubesim's stand-in here, runs them), their status mirrored
onto the manager object, and the copy deleted from the worker when the manager's object is deleted."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from federation import labels
from federation.kinds.raycluster import RAYCLUSTER
from federation.kinds.rayjob import RAYJOB
from federation.kinds.rayservice import RAYSERVICE
from federation.kube import resource_for
from mkctl import jobs
from mkctl.demo import read_job, submit
from mkctl.main import app
from mkctl.topology import Topology
from tests.e2e.conftest import NotYet, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.needs_running_pods("the RayJob's submitter must complete: KubeRay's stand-in runs in kubesim")]


def workload_json(database_url: str, job: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["workloads", "show", job, "-o", "json", "--database-url", database_url])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


async def test_a_rayjob_is_queued_placed_run_by_kuberay_mirrored_and_deleted(federation: Topology) -> None:
    examples = jobs.load_examples()
    sample = next(s for s in examples.samples if s.kind == "RayJob")
    await submit(federation, jobs.Examples(samples=[sample], namespaces={sample.namespace}))
    res = resource_for(RAYJOB)

    async def finished() -> dict[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        done = RAYJOB.finished(job) if job else None
        return job if job and done else NotYet(str((job or {}).get("status")))

    job = await wait_for(finished, "the RayJob finished on its worker, mirrored", within=90, top=federation)
    status = job["status"]
    assert (status["jobDeploymentStatus"], status["jobStatus"]) == ("Complete", "SUCCEEDED"), status
    assert status["rayClusterName"].startswith(f"{sample.name}-") and status["startTime"] and status["endTime"]
    dispatched = jobs.condition(job, labels.CONDITION_DISPATCHED)
    assert dispatched is not None and dispatched["status"] == "True"
    cluster = jobs.cluster_from(dispatched)
    worker = federation.kubes[cluster]

    copy = await worker.get(res, sample.name, sample.namespace)
    assert "managedBy" not in copy["spec"]  # the worker's KubeRay runs it, once
    assert copy["metadata"]["labels"][labels.ORIGIN] == federation.options.origin
    others = [w for w in federation.worker_names if w != cluster]
    for other in others:
        assert [j for j in (await federation.kubes[other].list(res, sample.namespace)).items
                if j["metadata"]["name"] == sample.name] == []

    shown = await asyncio.to_thread(workload_json, federation.database_url, sample.key)
    # Kueue's PodSets, the quota the RayJob was queued with
    assert [(p["name"], p["count"]) for p in shown["podsets"]] == [("head", 1), ("workers", 2), ("submitter", 1)]

    await federation.manager.delete(res, sample.name, sample.namespace)

    async def copy_removed() -> bool | NotYet:
        names = [j["metadata"]["name"] for j in (await worker.list(res, sample.namespace)).items]
        return True if sample.name not in names else NotYet(f"still on {cluster}: {names}")

    await wait_for(copy_removed, f"the RayJob's copy removed from {cluster}", top=federation)


async def test_a_raycluster_is_placed_its_readiness_mirrored_and_its_copy_deleted(federation: Topology) -> None:
    """A RayCluster never finishes (it holds its quota until deleted): mkd places it, KubeRay's status (state
    ready, the worker counts) shows on the manager's object, and deleting it there removes the copy."""
    pod = {"metadata": {"annotations": {"kubesim.mkd.dev/run-forever": "true"}},
           "spec": {"containers": [{"name": "ray", "image": "docker.io/rayproject/ray:2.46.0",
                                    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}}}]}}
    manifest = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": "ray-serve", "namespace": "team-a"},
                "spec": {"managedBy": labels.MULTIKUEUE, "headGroupSpec": {"rayStartParams": {}, "template": pod},
                         "workerGroupSpecs": [{"groupName": "gpu-less", "replicas": 1, "numOfHosts": 2,
                                               "template": pod}]}}
    sample = jobs.Sample(manifest, Path(__file__), "Succeeded")
    await submit(federation, jobs.Examples(samples=[sample], namespaces={sample.namespace}))
    res = resource_for(RAYCLUSTER)

    async def ready() -> dict[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        status = (job or {}).get("status") or {}
        return job if job and status.get("state") == "ready" else NotYet(str(status))

    job = await wait_for(ready, "the RayCluster ready on its worker, mirrored", within=90, top=federation)
    assert (job["status"]["desiredWorkerReplicas"], job["status"]["availableWorkerReplicas"]) == (2, 2)
    assert RAYCLUSTER.finished(job) is None
    cluster = jobs.cluster_from(jobs.condition(job, labels.CONDITION_DISPATCHED))
    shown = await asyncio.to_thread(workload_json, federation.database_url, sample.key)
    assert [(p["name"], p["count"]) for p in shown["podsets"]] == [("head", 1), ("gpu-less", 2)]
    await federation.manager.delete(res, sample.name, sample.namespace)
    worker = federation.kubes[cluster]

    async def copy_removed() -> bool | NotYet:
        names = [j["metadata"]["name"] for j in (await worker.list(res, sample.namespace)).items]
        return True if sample.name not in names else NotYet(f"still on {cluster}: {names}")

    await wait_for(copy_removed, f"the RayCluster's copy removed from {cluster}", top=federation)


async def test_a_rayservice_is_placed_served_mirrored_updated_and_its_copy_deleted(federation: Topology) -> None:
    """A RayService never finishes: mkd queues it by its RayCluster's PodSets, the worker's KubeRay serves it
    (Ready, serviceStatus Running, the applications) and that shows on the manager's object; a new
    serveConfigV2 reaches the copy; deleting it on the manager removes the copy."""
    examples = jobs.load_examples()
    sample = next(s for s in examples.samples if s.kind == "RayService")
    assert sample.expect == "Ready"
    await submit(federation, jobs.Examples(samples=[sample], namespaces={sample.namespace}))
    res = resource_for(RAYSERVICE)

    async def ready() -> dict[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        seen = jobs.observe(sample, job)
        return job if job and jobs.reached(sample, seen) else NotYet(f"{seen.state}: {(job or {}).get('status')}")

    job = await wait_for(ready, "the RayService Ready on its worker, mirrored", within=90, top=federation)
    status = job["status"]
    # what kubectl get rayservices prints on the manager: service status, num serve endpoints
    assert (status["serviceStatus"], status["numServeEndpoints"]) == ("Running", 2), status
    assert status["activeServiceStatus"]["applicationStatuses"]["fruit_app"]["status"] == "RUNNING"
    assert RAYSERVICE.finished(job) is None
    cluster = jobs.cluster_from(jobs.condition(job, labels.CONDITION_DISPATCHED))
    worker = federation.kubes[cluster]
    copy = await worker.get(res, sample.name, sample.namespace)
    assert "managedBy" not in copy["spec"]  # the worker's KubeRay (any version) runs it, once
    shown = await asyncio.to_thread(workload_json, federation.database_url, sample.key)
    assert [(p["name"], p["count"]) for p in shown["podsets"]] == [("head", 1), ("workers", 1)]

    # a new Serve config on the manager reaches the copy (as MultiKueue syncs serveConfigV2)
    config = job["spec"]["serveConfigV2"].replace("num_replicas: 1", "num_replicas: 2")
    await federation.manager.patch(res, sample.name, {"spec": {"serveConfigV2": config}}, sample.namespace)

    async def edited() -> bool | NotYet:
        now = await worker.get(res, sample.name, sample.namespace)
        return True if now["spec"]["serveConfigV2"] == config else NotYet("the copy has the old serveConfigV2")

    await wait_for(edited, f"the new serveConfigV2 on {cluster}", top=federation)
    await federation.manager.delete(res, sample.name, sample.namespace)

    async def copy_removed() -> bool | NotYet:
        names = [j["metadata"]["name"] for j in (await worker.list(res, sample.namespace)).items]
        return True if sample.name not in names else NotYet(f"still on {cluster}: {names}")

    await wait_for(copy_removed, f"the RayService's copy removed from {cluster}", top=federation)
