"""Plain Pods and pod groups end to end, as MultiKueue runs them: the manager's Pods stay gated by Kueue's
admission gate and never run there; mkd queues the group once its total count of pods exists, as one Workload
with a PodSet per role, places it on one worker, where the agent creates the group's Pods (ungated, stamped);
their status is mirrored onto the manager's Pods; deleting the Pods on the manager deletes them on the worker."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from federation import labels
from federation.kinds import pod as pods
from federation.kube import PODS
from mkctl import jobs
from mkctl.demo import submit
from mkctl.main import app
from mkctl.topology import Topology
from tests.e2e.conftest import NotYet, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.needs_running_pods("the group's pods must run and end on a worker")]


def workload_json(database_url: str, job: str) -> dict[str, Any] | None:
    result = CliRunner().invoke(app, ["workloads", "show", job, "-o", "json", "--database-url", database_url])
    if result.exit_code != 0:
        return None
    shown: dict[str, Any] = json.loads(result.output)
    return shown


def group_samples() -> list[jobs.Sample]:
    examples = jobs.load_examples()
    return [s for s in examples.samples if s.kind == "Pod"]


async def manager_pods(top: Topology, names: list[str], ns: str) -> dict[str, dict[str, Any]]:
    listed = await top.manager.list(PODS, ns)
    return {p["metadata"]["name"]: p for p in listed.items if p["metadata"]["name"] in names}


async def test_a_pod_group_waits_for_its_pods_then_runs_on_one_worker_mirrored_and_deleted(
        federation: Topology) -> None:
    samples = group_samples()
    names = [s.name for s in samples]
    assert len(samples) == 3
    ns = samples[0].namespace
    # two of the three pods: Kueue (and mkd) waits for the group's total count before queueing it
    await submit(federation, jobs.Examples(samples=samples[:2], namespaces={ns}))
    await asyncio.sleep(3)
    shown = await asyncio.to_thread(workload_json, federation.database_url, f"{ns}/{names[0]}")
    assert shown is None, "a pod group is queued only once all its pods exist"
    await submit(federation, jobs.Examples(samples=samples[2:], namespaces={ns}))

    async def finished() -> dict[str, dict[str, Any]] | NotYet:
        now = await manager_pods(federation, names, ns)
        phases = {n: (p.get("status") or {}).get("phase") for n, p in now.items()}
        return now if set(phases.values()) == {"Succeeded"} and len(now) == 3 else NotYet(str(phases))

    now = await wait_for(finished, "the group's three pods succeeded on a worker, mirrored", within=90,
                         top=federation)
    clusters = set()
    for pod in now.values():
        # never run on the manager: still gated, no node; the worker pod's status, and mkd's conditions
        assert {"name": pods.ADMISSION_GATE} in pod["spec"]["schedulingGates"]
        assert not pod["spec"].get("nodeName")
        status = pod["status"]
        assert status["phase"] == "Succeeded" and status["containerStatuses"][0]["state"]["terminated"]
        dispatched = jobs.condition(pod, labels.CONDITION_DISPATCHED)
        assert dispatched is not None and dispatched["status"] == "True"
        clusters.add(jobs.cluster_from(dispatched))
    assert len(clusters) == 1, clusters  # one group, one worker
    (cluster,) = clusters
    worker = federation.kubes[cluster]
    copies = {p["metadata"]["name"]: p for p in (await worker.list(PODS, ns)).items if p["metadata"]["name"] in names}
    assert set(copies) == set(names)
    lead = copies[names[0]]
    assert lead["metadata"]["labels"][labels.ORIGIN] == federation.options.origin
    assert lead["metadata"]["labels"][labels.WORKLOAD_UID]
    for copy_ in copies.values():  # ungated on the worker, run there; the others are the lead's
        assert pods.ADMISSION_GATE not in [g["name"] for g in copy_["spec"].get("schedulingGates") or []]
        assert copy_["spec"]["nodeName"]
        assert copy_["metadata"]["labels"][pods.GROUP_NAME_LABEL] == "sample-group"
    for name in names[1:]:
        assert copies[name]["metadata"]["ownerReferences"][0]["uid"] == lead["metadata"]["uid"]
    for other in federation.worker_names:
        if other != cluster:
            assert not [p for p in (await federation.kubes[other].list(PODS, ns)).items
                        if p["metadata"]["name"] in names]

    # one Workload, queued against quota with a PodSet per role (the driver, the two workers)
    shown = await asyncio.to_thread(workload_json, federation.database_url, f"{ns}/{names[0]}")
    assert shown is not None
    assert sorted(p["count"] for p in shown["podsets"]) == [1, 2]
    assert shown["requests"]["cpu"] == "1"  # 500m + 2 x 250m
    # asked about any of its pods, mkctl why answers with the group's Workload
    why = await asyncio.to_thread(CliRunner().invoke, app, [
        "why", f"{ns}/{names[1]}", "-o", "json", "--database-url", federation.database_url,
        "--kubeconfig", str(federation.kubeconfig("manager"))])
    assert why.exit_code == 0, why.output
    assert json.loads(why.output)["workload"] == f"{ns}/{names[0]}"
    assert json.loads(why.output)["state"] == "finished"

    for name in names:
        await federation.manager.delete(PODS, name, ns)

    async def copies_removed() -> bool | NotYet:
        left = [p["metadata"]["name"] for p in (await worker.list(PODS, ns)).items if p["metadata"]["name"] in names]
        return True if not left else NotYet(f"still on {cluster}: {left}")

    await wait_for(copies_removed, f"the group's pods removed from {cluster}", top=federation)


async def test_an_inconsistent_group_is_refused_naming_the_field_and_a_single_pod_runs(
        federation: Topology) -> None:
    base = group_samples()[1].manifest
    bad = []
    for i, count in enumerate(("2", "3")):
        manifest = copy.deepcopy(base)
        manifest["metadata"]["name"] = f"odd-{i}"
        manifest["metadata"]["labels"][pods.GROUP_NAME_LABEL] = "odd-group"
        manifest["metadata"]["annotations"][pods.GROUP_TOTAL_COUNT] = count
        bad.append(jobs.Sample(manifest, Path(__file__), "Failed"))
    uncounted = copy.deepcopy(base)
    uncounted["metadata"]["name"] = "uncounted-0"
    uncounted["metadata"]["labels"][pods.GROUP_NAME_LABEL] = "uncounted"
    uncounted["metadata"]["annotations"][pods.GROUP_TOTAL_COUNT] = "zero"
    bad.append(jobs.Sample(uncounted, Path(__file__), "Failed"))
    single = copy.deepcopy(base)
    single["metadata"]["name"] = "single-pod"
    del single["metadata"]["labels"][pods.GROUP_NAME_LABEL]
    del single["metadata"]["annotations"][pods.GROUP_TOTAL_COUNT]
    one = jobs.Sample(single, Path(__file__), "Succeeded")
    ns = one.namespace
    await submit(federation, jobs.Examples(samples=[*bad, one], namespaces={ns}))

    async def refused() -> dict[str, Any] | NotYet:
        now = await manager_pods(federation, ["odd-0"], ns)
        cond = jobs.condition(now.get("odd-0") or {}, labels.CONDITION_REJECTED)
        return cond if cond and cond.get("status") == "True" else NotYet(str(now.get("odd-0", {}).get("status")))

    cond = await wait_for(refused, "the group with two total counts refused", within=60, top=federation)
    assert pods.TOTAL_COUNT_FIELD in cond["message"] and "same" in cond["message"], cond

    async def uncounted_refused() -> dict[str, Any] | NotYet:
        now = await manager_pods(federation, ["uncounted-0"], ns)
        cond = jobs.condition(now.get("uncounted-0") or {}, labels.CONDITION_REJECTED)
        return cond if cond and cond.get("status") == "True" else NotYet(str(now.get("uncounted-0", {}).get("status")))

    cond = await wait_for(uncounted_refused, "the group whose count is not a number refused", within=60,
                          top=federation)
    assert pods.TOTAL_COUNT_FIELD in cond["message"] and "positive integer" in cond["message"], cond

    async def single_done() -> dict[str, Any] | NotYet:
        now = await manager_pods(federation, ["single-pod"], ns)
        pod = now.get("single-pod") or {}
        phase = (pod.get("status") or {}).get("phase")
        return pod if phase == "Succeeded" else NotYet(str(phase))

    pod = await wait_for(single_done, "the single pod succeeded on a worker, mirrored", within=60, top=federation)
    assert {"name": pods.ADMISSION_GATE} in pod["spec"]["schedulingGates"]
    shown = await asyncio.to_thread(workload_json, federation.database_url, f"{ns}/single-pod")
    assert shown is not None and [(p["name"], p["count"]) for p in shown["podsets"]] == [("main", 1)]
