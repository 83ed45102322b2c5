"""TrainJob end to end through the real apply loop on kubesim: runtime -> JobSet -> Indexed Jobs -> Complete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.kube import JOBS, Resource
from tests.agent.test_jobset_loop import NS, LoopRig, cluster, conds
from tests.agent.test_trainjob_render import DEEPSPEED_RUNTIME
from tests.waiting import eventually
from worker_agent.reconcilers.jobset import JOBSETS, JobSetReconciler
from worker_agent.reconcilers.trainjob import CLUSTER_TRAINING_RUNTIMES, TrainJobReconciler
from worker_agent.reconcilers.trainjob_build import GROUP

TRAINJOBS = Resource(GROUP, "v1alpha1", "trainjobs", "TrainJob")

RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: torch-distributed}
spec:
  mlPolicy: {numNodes: 1, torch: {}}
  template:
    spec:
      replicatedJobs:
      - name: node
        template:
          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
          spec:
            template:
              metadata: {annotations: {kubesim.mkd.dev/run-seconds: "1.0"}}
              spec:
                containers:
                - {name: node, image: pytorch/pytorch, command: [torchrun, train.py],
                   resources: {requests: {cpu: 250m, memory: 256Mi}}}
"""

TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: multi-node-example, labels: {mkd.dev/origin: mkd}}
spec:
  runtimeRef: {name: torch-distributed}
  trainer: {numNodes: 3}
"""


@pytest.mark.timeout(60)
async def test_multi_node_trainjob_runs_to_complete(tmp_path: Path) -> None:
    async with cluster(tmp_path) as kube:
        await kube.create(CLUSTER_TRAINING_RUNTIMES, yaml.safe_load(RUNTIME))
        rig = LoopRig(kube, {"TrainJob": (TRAINJOBS, TrainJobReconciler()), "JobSet": (JOBSETS, JobSetReconciler())})
        async with rig.running():
            await kube.create(TRAINJOBS, yaml.safe_load(TRAINJOB), NS)
            js = await rig.wait(JOBSETS, "multi-node-example", lambda o: True)
            assert js["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
            assert js["metadata"]["labels"]["mkd.dev/origin"] == "mkd"
            job = await rig.wait(JOBS, "multi-node-example-node-0", lambda o: True)
            assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (3, 3)
            assert job["spec"]["template"]["spec"]["subdomain"] == "multi-node-example"
            env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert (env["PET_NNODES"], env["PET_MASTER_ADDR"]) == ("3", "multi-node-example-node-0-0.multi-node-example")
            done = await rig.wait(TRAINJOBS, "multi-node-example", lambda o: ("Complete", "True", "AllJobsCompleted")
                                  in conds(o))
            assert conds(done) == [("Complete", "True", "AllJobsCompleted")]
            assert done["status"]["conditions"][0]["message"] == "jobset completed successfully"
            assert done["status"]["jobsStatus"] == [
                {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}]


@pytest.mark.timeout(60)
async def test_deadline_fails_the_trainjob_on_time_and_deletes_the_jobset(tmp_path: Path) -> None:
    runtime = yaml.safe_load(RUNTIME)
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {
        "annotations": {"kubesim.mkd.dev/run-seconds": "120"}}
    job = yaml.safe_load(TRAINJOB)
    job["spec"]["activeDeadlineSeconds"] = 2
    async with cluster(tmp_path) as kube:
        await kube.create(CLUSTER_TRAINING_RUNTIMES, runtime)
        rig = LoopRig(kube, {"TrainJob": (TRAINJOBS, TrainJobReconciler()), "JobSet": (JOBSETS, JobSetReconciler())})
        async with rig.running():
            await kube.create(TRAINJOBS, job, NS)
            await rig.wait(JOBS, "multi-node-example-node-0", lambda o: (o.get("status") or {}).get("active") == 3)
            failed = await rig.wait(TRAINJOBS, "multi-node-example", lambda o: bool(conds(o)), within=10)
            assert conds(failed) == [("Failed", "True", "DeadlineExceeded")]
            assert failed["status"]["conditions"][0]["message"] == "TrainJob exceeded its active deadline"
            async def jobset_gone() -> bool:
                return await rig.get(JOBSETS, "multi-node-example") is None
            await eventually(jobset_gone, what="the JobSet to be deleted at the deadline")


def deepspeed_runtime() -> dict[str, Any]:
    """The render tests' DeepSpeed runtime, timed for kubesim: nodes (sshd) outlive the launcher."""
    runtime: dict[str, Any] = yaml.safe_load(DEEPSPEED_RUNTIME)
    for rjob, seconds in zip(runtime["spec"]["template"]["spec"]["replicatedJobs"], ("120", "0.5"), strict=True):
        pod = rjob["template"]["spec"]["template"]
        pod["metadata"] = {"annotations": {"kubesim.mkd.dev/run-seconds": seconds}}
        for container in pod["spec"]["containers"]:
            container["resources"] = {"requests": {"cpu": "100m"}}
    return runtime


@pytest.mark.timeout(60)
async def test_deepspeed_mpi_trainjob_launcher_after_nodes_ready(tmp_path: Path) -> None:
    job = yaml.safe_load(TRAINJOB)
    job["metadata"]["name"] = "ds"
    job["spec"] = {"runtimeRef": {"name": "deepspeed-distributed"},
                   "trainer": {"numNodes": 3, "command": ["mpirun", "python", "train.py"]}}
    async with cluster(tmp_path) as kube:
        await kube.create(CLUSTER_TRAINING_RUNTIMES, deepspeed_runtime())
        rig = LoopRig(kube, {"TrainJob": (TRAINJOBS, TrainJobReconciler()), "JobSet": (JOBSETS, JobSetReconciler())})
        async with rig.running():
            await kube.create(TRAINJOBS, job, NS)
            nodes = await rig.wait(JOBS, "ds-node-0", lambda o: True)
            assert nodes["spec"]["parallelism"] == 2
            launcher = await rig.wait(JOBS, "ds-launcher-0", lambda o: True)
            node_job = await rig.get(JOBS, "ds-node-0")
            assert node_job is not None and node_job["status"]["ready"] == 2  # dependsOn node Ready
            env = {e["name"]: e.get("value") for e in launcher["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
            hostfile = await kube.get(Resource("", "v1", "configmaps", "ConfigMap"), "ds-mpi-hostfile", NS)
            assert hostfile["data"]["hostfile"] == (
                "ds-node-0-0.ds slots=1\nds-node-0-1.ds slots=1\nds-launcher-0-0.ds slots=1\n")
            done = await rig.wait(TRAINJOBS, "ds", lambda o: ("Complete", "True", "AllJobsCompleted") in conds(o))
            assert done["status"]["jobsStatus"][1]["name"] == "launcher"
            assert done["status"]["jobsStatus"][1]["succeeded"] == 1
            async def node_job_gone() -> bool:  # a finished JobSet deletes its still-active Jobs (the sshd nodes)
                return await rig.get(JOBS, "ds-node-0") is None
            await eventually(node_job_gone, what="the node Job to be deleted after completion")
