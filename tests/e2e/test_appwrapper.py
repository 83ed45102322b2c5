"""AppWrapper end to end: claimed, queued by its PodSets as Kueue computes them (``<name>-<index>``), placed,
created on a worker without managedBy (the worker's AppWrapper operator, kubesim's stand-in here, deploys its
components), its phase and conditions mirrored onto the manager object, and the copy deleted from the worker
when the manager's object is deleted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from federation import labels
from federation.kinds.appwrapper import APPWRAPPER
from federation.kube import resource_for
from mkctl import jobs
from mkctl.demo import read_job, submit
from mkctl.main import app
from mkctl.topology import Topology
from tests.e2e.conftest import NotYet, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.needs_running_pods("the wrapped Job must complete: the AppWrapper operator's stand-in "
                                             "runs in kubesim")]


def workload_json(database_url: str, job: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["workloads", "show", job, "-o", "json", "--database-url", database_url])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


async def test_an_appwrapper_is_queued_placed_run_by_its_operator_mirrored_and_deleted(federation: Topology) -> None:
    examples = jobs.load_examples()
    sample = next(s for s in examples.samples if s.kind == "AppWrapper")
    await submit(federation, jobs.Examples(samples=[sample], namespaces={sample.namespace}))
    res = resource_for(APPWRAPPER)

    async def finished() -> dict[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        done = APPWRAPPER.finished(job) if job else None
        return job if job and done else NotYet(str((job or {}).get("status")))

    job = await wait_for(finished, "the AppWrapper finished on its worker, mirrored", within=90, top=federation)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    deployed = jobs.condition(job, "ResourcesDeployed")
    assert deployed is not None and deployed["reason"] == "Succeeded"
    dispatched = jobs.condition(job, labels.CONDITION_DISPATCHED)
    assert dispatched is not None and dispatched["status"] == "True"
    cluster = jobs.cluster_from(dispatched)
    worker = federation.kubes[cluster]

    copy = await worker.get(res, sample.name, sample.namespace)
    assert "managedBy" not in copy["spec"]  # the worker's operator runs it, once
    assert copy["metadata"]["labels"][labels.ORIGIN] == federation.options.origin
    for other in (w for w in federation.worker_names if w != cluster):
        assert [j for j in (await federation.kubes[other].list(res, sample.namespace)).items
                if j["metadata"]["name"] == sample.name] == []

    shown = await asyncio.to_thread(workload_json, federation.database_url, sample.key)
    assert [(p["name"], p["count"]) for p in shown["podsets"]] == [(f"{sample.name}-0", 2)]

    await federation.manager.delete(res, sample.name, sample.namespace)

    async def copy_removed() -> bool | NotYet:
        names = [j["metadata"]["name"] for j in (await worker.list(res, sample.namespace)).items]
        return True if sample.name not in names else NotYet(f"still on {cluster}: {names}")

    await wait_for(copy_removed, f"the AppWrapper's copy removed from {cluster}", top=federation)
