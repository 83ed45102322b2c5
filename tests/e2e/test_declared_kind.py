"""A kind from configuration end to end (examples/trainingrun: the TrainingRun CRD and its declaration): the
services read the declarations file and run under deploy/'s roles plus the ones ``mkctl kinds --manifests``
writes for it; a TrainingRun is claimed, queued against a ClusterQueue's quota by its declared PodSets (launcher
× 1, workers × 2: 750m CPU, so two of them do not fit 1 CPU at once), placed, created on a worker without
managedBy for its own operator (kubesim's generic stand-in, configured with the same declarations), its status
mirrored onto the manager object, and its copy deleted from the worker when the manager's object is deleted."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from federation import labels
from federation.kube import PODS, resource_for
from mkctl import jobs
from mkctl.demo import read_job, submit
from mkctl.main import app
from mkctl.topology import Topology, TopologyOptions
from tests.e2e.conftest import NotYet, check_not_forbidden, wait_for

pytestmark = [pytest.mark.slow,
              pytest.mark.needs_running_pods("the TrainingRun's pods must complete: kubesim's generic operator "
                                             "runs them")]

QUEUES: list[dict[str, Any]] = [
    {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "default"}},
    {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "runs"},
     "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
         {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "1"},
                                           {"name": "memory", "nominalQuota": "4Gi"}]}]}]}},
    {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "runs", "namespace": "team-a"},
     "spec": {"clusterQueue": "runs"}},
]


@pytest.fixture
async def declared(tmp_path: Path, mqtt_url: str, database_url: str, topic_root: str) -> AsyncIterator[Topology]:
    examples = jobs.load_examples(declared=True)
    [kinds_file] = examples.kinds_files
    options = TopologyOptions(
        state_dir=tmp_path / "state", mqtt_url=mqtt_url, database_url=database_url, topic_root=topic_root,
        heartbeat_seconds=1.0, heartbeat_timeout_seconds=3.0, origin="mkd-e2e", kinds_file=kinds_file,
        crds=examples.crds, agent_overrides={"policy": {"allowed_namespaces": ["team-a"]}}, fencers=True)
    async with Topology(options) as top:
        yield top
        top.check_running()
        await check_not_forbidden(top)


def workload_json(database_url: str, job: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["workloads", "show", job, "-o", "json", "--database-url", database_url])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.output)
    return shown


def status_of(job: dict[str, Any] | None, ctype: str) -> str | None:
    found = jobs.condition(job or {}, ctype)
    return None if found is None else str(found.get("status"))


async def test_a_declared_kind_is_queued_placed_run_by_its_operator_mirrored_and_deleted(declared: Topology) -> None:
    federation = declared
    examples = jobs.load_examples(declared=True)
    first = next(s for s in examples.samples if s.kind == "TrainingRun")
    kind = examples.declared[0]
    samples = []
    for name in ("run-one", "run-two"):
        manifest = copy.deepcopy(first.manifest)
        manifest["metadata"]["name"] = name
        manifest["metadata"]["labels"] = {labels.QUEUE_NAME: "runs"}
        samples.append(jobs.Sample(manifest, first.source, "Succeeded"))
    await submit(federation, jobs.Examples(samples=samples, namespaces={"team-a"}, queue_objects=QUEUES))
    res = resource_for(kind)

    async def one_admitted_one_waiting() -> tuple[jobs.Sample, jobs.Sample] | NotYet:
        read = [await read_job(federation.manager, s) for s in samples]
        reserved = [status_of(j, "QuotaReserved") for j in read]
        if sorted(map(str, reserved)) != ["False", "True"]:
            return NotYet(str(reserved))
        waiting = read[reserved.index("False")]
        message = str((jobs.condition(waiting or {}, "QuotaReserved") or {}).get("message"))
        if "insufficient unused quota for cpu" not in message:
            return NotYet(message)
        return samples[reserved.index("True")], samples[reserved.index("False")]

    admitted, waiting = await wait_for(one_admitted_one_waiting, "one TrainingRun admitted, the other waiting "
                                       "for the ClusterQueue's quota", top=federation)
    shown = await asyncio.to_thread(workload_json, federation.database_url, admitted.key)
    assert [(p["name"], p["count"]) for p in shown["podsets"]] == [("launcher", 1), ("workers", 2)]

    async def finished(sample: jobs.Sample) -> dict[str, Any] | NotYet:
        job = await read_job(federation.manager, sample)
        done = kind.finished(job) if job else None
        return job if job and done else NotYet(str((job or {}).get("status")))

    job = await wait_for(lambda: finished(admitted), "the first TrainingRun finished on its worker, mirrored",
                         within=90, top=federation)
    assert kind.finished(job).outcome == "Succeeded"
    succeeded = jobs.condition(job, "Succeeded")
    assert succeeded is not None and succeeded["reason"] == "PodsSucceeded"  # the worker operator's, mirrored
    dispatched = jobs.condition(job, labels.CONDITION_DISPATCHED)
    assert dispatched is not None and dispatched["status"] == "True"
    cluster = jobs.cluster_from(dispatched)
    worker = federation.kubes[cluster]
    copy_ = await worker.get(res, admitted.name, admitted.namespace)
    assert "managedBy" not in copy_["spec"]  # its own operator runs it there, once
    assert copy_["metadata"]["labels"][labels.ORIGIN] == federation.options.origin
    pods = (await worker.list(PODS, admitted.namespace,
                              label_selector=f"kubesim.mkd.dev/generic-owner={admitted.name}")).items
    assert sorted(p["metadata"]["name"] for p in pods) == [f"{admitted.name}-launcher-0",
                                                           f"{admitted.name}-workers-0", f"{admitted.name}-workers-1"]
    for other in (w for w in federation.worker_names if w != cluster):
        assert admitted.name not in [j["metadata"]["name"]
                                     for j in (await federation.kubes[other].list(res, admitted.namespace)).items]

    await wait_for(lambda: finished(waiting), "the second TrainingRun admitted once the quota was free, and run",
                   within=90, top=federation)

    await federation.manager.delete(res, admitted.name, admitted.namespace)

    async def copy_removed() -> bool | NotYet:
        names = [j["metadata"]["name"] for j in (await worker.list(res, admitted.namespace)).items]
        return True if admitted.name not in names else NotYet(f"still on {cluster}: {names}")

    await wait_for(copy_removed, f"the TrainingRun's copy removed from {cluster}", top=federation)
