"""The agent end to end on kubesim: Commands in over MQTT, PyTorchJobs run by the agent, Reports out."""

from __future__ import annotations

import copy
from typing import Any

from federation import labels
from federation.kube import PODS, SERVICES
from tests.agent.conftest import PYTORCHJOBS, AgentHarness, conditions, place
from tests.agent.render_harness import example

RUN = "kubesim.mkd.dev/run-seconds"


def with_annotations(job: dict[str, Any], **annotations: str) -> dict[str, Any]:
    job = copy.deepcopy(job)
    job["metadata"].pop("uid", None)
    for rs in job["spec"]["pytorchReplicaSpecs"].values():
        meta = rs["template"].setdefault("metadata", {})
        meta["annotations"] = {**meta.get("annotations", {}), **annotations}
    return job


async def test_simple_runs_to_success_with_upstream_shape(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-simple.yaml"), **{RUN: "1.0"})
    cmd = place(job)
    await harness.send(cmd)
    accepted = await harness.wait_report(lambda r: r.type == "accepted")
    assert accepted.placement == cmd.placement and accepted.spec_version == 1
    running = await harness.wait_report(
        lambda r: r.type == "status" and ("Running", "True", "PyTorchJobRunning") in conditions(r.status))
    assert running.finished is None
    master = await harness.get(PODS, "pytorch-simple-master-0", "team-a")
    assert master is not None
    env = [(e["name"], e.get("value")) for e in master["spec"]["containers"][0]["env"]]
    assert env[:3] == [("PYTHONUNBUFFERED", "1"), ("MASTER_PORT", "23456"), ("PET_MASTER_PORT", "23456")]
    (owner,) = master["metadata"]["ownerReferences"]
    assert owner["kind"] == "PyTorchJob" and owner["controller"] and owner["blockOwnerDeletion"]
    svc = await harness.get(SERVICES, "pytorch-simple-worker-0", "team-a")
    assert svc is not None and svc["spec"]["clusterIP"] == "None"
    done = await harness.wait_report(lambda r: r.type == "status" and r.finished == "Succeeded")
    assert conditions(done.status) == [("Created", "True", "PyTorchJobCreated"),
                                       ("Running", "False", "PyTorchJobRunning"),
                                       ("Succeeded", "True", "PyTorchJobSucceeded")]
    assert done.status["completionTime"] and done.status["startTime"]
    seqs = [r.seq for r in harness.statuses(cmd.placement.workload_uid)]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    stored = await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a")
    assert stored is not None
    assert stored["metadata"]["labels"][labels.ORIGIN] == "mkd"
    assert stored["metadata"]["labels"][labels.WORKLOAD_UID] == "wl-pytorch-simple"
    assert stored["status"] == done.status
