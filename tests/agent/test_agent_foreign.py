"""Two controllers on one job are refused: an upstream operator installed without ``--delegate``.

The agent clears managedBy on the copies it runs itself, and an upstream operator (training-operator,
mpi-operator, jobset, trainer) reconciles every job whose managedBy is nil as well. The agent sees
the second controller by what it does: an object controlled by the copy that mkd did not create. It
then stops reconciling the copy, deletes it, tells the dispatcher (a permanent Rejected naming the
fix) and the user (a Warning Event), and refuses later Places of that kind the same way.
"""

from __future__ import annotations

from typing import Any

from federation.kube import EVENTS, SERVICES
from tests.agent.conftest import PYTORCHJOBS, AgentHarness, place
from tests.agent.render_harness import example
from tests.agent.test_agent_pytorch import FOREVER, with_annotations
from tests.dispatcher.harness import eventually


def upstream_service(job: dict[str, Any]) -> dict[str, Any]:
    """What the training-operator would create for the copy: controlled by it, no mkd marks."""
    meta = job["metadata"]
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{meta['name']}-op-0", "namespace": meta["namespace"],
                         "labels": {"training.kubeflow.org/job-name": meta["name"],
                                    "training.kubeflow.org/operator-name": "pytorchjob-controller"},
                         "ownerReferences": [{"apiVersion": job["apiVersion"], "kind": job["kind"],
                                              "name": meta["name"], "uid": meta["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {"clusterIP": "None", "ports": [{"name": "pytorchjob-port", "port": 23456}],
                     "selector": {"training.kubeflow.org/job-name": meta["name"]}}}


async def test_a_copy_another_controller_also_reconciles_is_refused(harness: AgentHarness) -> None:
    job = with_annotations(example("pytorch-simple.yaml"), **{FOREVER: "true"})
    await harness.send(place(job, uid="wl-twice"))
    await harness.wait_report(lambda r: r.type == "accepted" and r.placement.workload_uid == "wl-twice")
    copy_ = await eventually(lambda: harness.get(PYTORCHJOBS, "pytorch-simple", "team-a"), what="the copy")
    # the agent's own children are not taken for another controller's
    await eventually(lambda: harness.get(SERVICES, "pytorch-simple-master-0", "team-a"), what="own Service")
    assert not [r for r in harness.reports if r.type == "rejected"]

    await harness.kube.create(SERVICES, upstream_service(copy_), "team-a")  # the upstream operator at work
    refused = await harness.wait_report(lambda r: r.type == "rejected" and r.placement.workload_uid == "wl-twice")
    assert refused.reason == "TwoControllers" and refused.permanent, refused
    assert "--delegate PyTorchJob=kubeflow.org/training-operator" in refused.message, refused.message
    assert "pytorch-simple-op-0" in refused.message

    async def gone() -> bool:
        return await harness.get(PYTORCHJOBS, "pytorch-simple", "team-a") is None
    await eventually(gone, what="the refused copy deleted")

    async def warned() -> list[dict[str, Any]]:
        events = (await harness.kube.list(EVENTS, "team-a")).items
        return [e for e in events if e.get("reason") == "TwoControllers"]
    (event,) = await eventually(warned, what="a Warning Event on the copy")
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == "pytorch-simple"

    # from now on PyTorchJobs are refused here at once, before anything is created
    second = with_annotations(example("pytorch-sendrecv.yaml"), **{FOREVER: "true"})
    seen = len(harness.reports)
    await harness.send(place(second, uid="wl-second"))
    answer = await harness.wait_report(lambda r: r.type in ("accepted", "rejected")
                                       and r.placement.workload_uid == "wl-second", after=seen)
    assert answer.type == "rejected" and answer.reason == "TwoControllers", answer
    name = second["metadata"]["name"]
    assert await harness.get(PYTORCHJOBS, name, "team-a") is None
