"""The TrainJob PodSets the dispatcher places by are the pods the agent's JobSet runs (one computation).

The dispatcher computes a TrainJob's PodSets (``TRAINJOB.podsets``) to choose a cluster; the agent
renders the JobSet the trainer runtime framework would (``trainjob_build.build``). They must agree
pod for pod, and both must follow upstream trainer (KUBEFLOW.md D.3; trainer's ``newRuntimeInfo``,
the MPI / torch / plainml ``EnforceMLPolicy`` and the JobSet plugin's parallelism sync): a trainer
ancestor runs ``mlPolicy.numNodes`` pods unless ``trainer.numNodes`` overrides it (torch, plain) or
the MPI ``node`` job takes ``numNodes`` (minus one, at least one, when the launcher runs as a node);
``resourcesPerNode`` goes to the trainer ancestor's ``node`` container and, with runLauncherAsNode,
to the ``node`` job's too.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import yaml

from federation.kinds.trainjob import TRAINJOB
from federation.podset import pod_requests
from tests.agent.test_trainjob_render import DEEPSPEED_RUNTIME, TORCH_RUNTIME
from worker_agent.reconcilers.trainjob_build import build

MPI_RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: mpi-distributed}
spec:
  mlPolicy: {numNodes: 1, mpi: {numProcPerNode: 1, mpiImplementation: OpenMPI, sshAuthMountPath: /root/.ssh}}
  template:
    spec:
      replicatedJobs:
      - name: launcher
        template:
          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
          spec:
            template:
              spec:
                containers:
                - {name: node, image: mpi:1, resources: {requests: {cpu: 500m}}}
      - name: node
        template:
          spec:
            template:
              spec:
                containers:
                - {name: node, image: mpi:1, resources: {requests: {cpu: "2"}}}
"""


def job(runtime: str, **trainer: Any) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": "team-a"},
            "spec": {"managedBy": "kueue.x-k8s.io/multikueue", "runtimeRef": {"name": runtime},
                     "trainer": trainer}}


def runtime(text: str, **ml: Any) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(text)
    obj["spec"]["mlPolicy"].update(ml)
    return obj


def rendered(trainjob: dict[str, Any], rt: dict[str, Any]) -> dict[str, tuple[int, dict[str, Decimal]]]:
    """What the agent's JobSet runs: per replicatedJob, pods (replicas x parallelism) and per-pod requests."""
    out = {}
    for rjob in build(trainjob, rt).spec["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        pods = int(rjob.get("replicas", 1)) * int(job_spec.get("parallelism", 1))
        out[rjob["name"]] = (pods, dict(pod_requests(job_spec["template"]["spec"])))
    return out


def placed(trainjob: dict[str, Any], rt: dict[str, Any]) -> dict[str, tuple[int, dict[str, Decimal]]]:
    """What the dispatcher places by."""
    assert TRAINJOB.validate(trainjob, rt) == []
    return {p.name: (p.count, dict(p.requests)) for p in TRAINJOB.podsets(trainjob, rt)}


GPUS = {"requests": {"cpu": "4", "nvidia.com/gpu": "2"}}
CASES = {
    # launcher as a node: numNodes 3 = the launcher + 2 nodes, and all three get the GPUs
    "deepspeed, 3 nodes": (job("deepspeed-distributed", numNodes=3, resourcesPerNode=GPUS), DEEPSPEED_RUNTIME, {},
                           {"launcher": 1, "node": 2}),
    # numNodes 1 still runs one node job (upstream: max(numNodes-1, 1))
    "deepspeed, 1 node": (job("deepspeed-distributed", numNodes=1), DEEPSPEED_RUNTIME, {},
                          {"launcher": 1, "node": 1}),
    # no trainer.numNodes: the trainer ancestor (the launcher) runs mlPolicy.numNodes pods
    "deepspeed, runtime numNodes 3": (job("deepspeed-distributed"), DEEPSPEED_RUNTIME, {"numNodes": 3},
                                      {"launcher": 3, "node": 1}),
    # the launcher is not a node: GPUs go to the trainer ancestor (the launcher) only
    "mpi, launcher apart": (job("mpi-distributed", numNodes=2, resourcesPerNode=GPUS), MPI_RUNTIME, {},
                            {"launcher": 1, "node": 2}),
    "torch, 3 nodes": (job("torch-distributed", numNodes=3, resourcesPerNode=GPUS), TORCH_RUNTIME, {},
                       {"node": 3}),
    "torch, runtime numNodes": (job("torch-distributed"), TORCH_RUNTIME, {"numNodes": 2}, {"node": 2}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_dispatcher_podsets_are_the_pods_the_agent_runs(case: str) -> None:
    trainjob, text, ml, counts = CASES[case]
    rt = runtime(text, **ml)
    agent = rendered(trainjob, rt)
    assert {name: pods for name, (pods, _) in agent.items()} == counts  # upstream's counts
    assert placed(trainjob, rt) == {name: v for name, v in agent.items() if v[0] > 0}


def test_gpus_land_where_upstream_puts_them() -> None:
    ds = rendered(job("deepspeed-distributed", numNodes=3, resourcesPerNode=GPUS), runtime(DEEPSPEED_RUNTIME))
    assert ds["launcher"][1]["nvidia.com/gpu"] == ds["node"][1]["nvidia.com/gpu"] == Decimal(2)
    mpi = rendered(job("mpi-distributed", numNodes=2, resourcesPerNode=GPUS), runtime(MPI_RUNTIME))
    assert mpi["launcher"][1]["nvidia.com/gpu"] == Decimal(2)
    assert "nvidia.com/gpu" not in mpi["node"][1] and mpi["node"][1]["cpu"] == Decimal(2)
