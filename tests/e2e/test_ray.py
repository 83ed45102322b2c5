"""A RayJob end to end: claimed, queued by its PodSets as Kueue counts them, placed, created on a worker
without managedBy (the worker's KubeRay, kubesim's stand-in here, runs it), its status mirrored onto the
manager object, and the copy deleted from the worker when the manager's RayJob is deleted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from federation import labels
from federation.kinds.rayjob import RAYJOB
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
