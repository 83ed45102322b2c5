"""LeaderWorkerSet end to end: handed to mkd by its queue label (LWS has no managedBy), queued with Kueue's PodSets
for all its groups, placed on one worker whose LWS controller (kubesim's stand-in) runs it while the manager's
runs none, its status mirrored onto the manager's LWS (what ``kubectl get lws`` prints there), and its copy
deleted from the worker when the manager's is deleted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from federation import labels
from federation.kinds.leaderworkerset import LEADERWORKERSET
from federation.kube import PODS, resource_for
from mkctl import jobs
from mkctl.demo import read_job, submit
from mkctl.main import app
from mkctl.topology import Topology
from tests.e2e.conftest import NotYet, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.needs_running_pods("the LWS must become Available: LWS's stand-in runs in kubesim")]


def workload_json(database_url: str, job: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["workloads", "show", job, "-o", "json", "--database-url", database_url])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


async def test_an_lws_is_queued_by_its_groups_placed_mirrored_and_deleted(federation: Topology) -> None:
    examples = jobs.load_examples()
    sample = next(s for s in examples.samples if s.kind == "LeaderWorkerSet")
    assert sample.expect == "Available"
    await submit(federation, jobs.Examples(samples=[sample], namespaces={sample.namespace}))
    res = resource_for(LEADERWORKERSET)

    async def available() -> dict[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        seen = jobs.observe(sample, job)
        return job if job and jobs.reached(sample, seen) else NotYet(f"{seen.state}: {(job or {}).get('status')}")

    job = await wait_for(available, "the LWS Available on its worker, mirrored", within=90, top=federation)
    status = job["status"]
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 2, 2), status
    assert status["hpaPodSelector"] == "leaderworkerset.sigs.k8s.io/name=lws-serve,leaderworkerset.sigs.k8s.io/worker-index=0"
    assert LEADERWORKERSET.finished(job) is None
    cluster = jobs.cluster_from(jobs.condition(job, labels.CONDITION_DISPATCHED))
    worker = federation.kubes[cluster]

    copy = await worker.get(res, sample.name, sample.namespace)
    assert copy["metadata"]["labels"][labels.ORIGIN] == federation.options.origin
    assert copy["spec"]["replicas"] == 2
    pods = (await worker.list(PODS, sample.namespace,
                              label_selector=f"leaderworkerset.sigs.k8s.io/name={sample.name}")).items
    assert sorted(p["metadata"]["name"] for p in pods) == [
        "lws-serve-0", "lws-serve-0-1", "lws-serve-0-2", "lws-serve-1", "lws-serve-1-1", "lws-serve-1-2"]
    # the manager runs no LWS controller: nothing of it runs there, nor on the other workers
    assert (await federation.manager.list(PODS, sample.namespace,
                                          label_selector=f"leaderworkerset.sigs.k8s.io/name={sample.name}")).items == []
    for other in (w for w in federation.worker_names if w != cluster):
        assert sample.name not in [j["metadata"]["name"]
                                   for j in (await federation.kubes[other].list(res, sample.namespace)).items]

    shown = await asyncio.to_thread(workload_json, federation.database_url, sample.key)
    # Kueue's PodSets per group (leader × 1, worker × size − 1) for both groups
    assert [(p["name"], p["count"]) for p in shown["podsets"]] == [("leader", 2), ("worker", 4)]

    # what kubectl get lws prints on the manager (LWS's printer columns: tests/kubesim/test_sim_lws.py)
    assert (job["spec"]["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 2, 2)

    await federation.manager.delete(res, sample.name, sample.namespace)

    async def copy_removed() -> bool | NotYet:
        names = [j["metadata"]["name"] for j in (await worker.list(res, sample.namespace)).items]
        return True if sample.name not in names else NotYet(f"still on {cluster}: {names}")

    await wait_for(copy_removed, f"the LWS's copy removed from {cluster}", top=federation)
