"""MPIJob v2beta1 end to end through the real apply loop on kubesim: pi to Succeeded, workers cleaned up."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from federation.kube import CONFIGMAPS, JOBS, PODS, SECRETS, SERVICES, Resource
from tests.agent.test_jobset_loop import NS, LoopRig, cluster, conds
from tests.waiting import eventually
from worker_agent.reconcilers.mpi import MPIJobReconciler

MPIJOBS = Resource("kubeflow.org", "v2beta1", "mpijobs", "MPIJob")

PI = """
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: pi, labels: {mkd.dev/origin: mkd}}
spec:
  slotsPerWorker: 1
  sshAuthMountPath: /home/mpiuser/.ssh
  runPolicy: {cleanPodPolicy: Running}
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        metadata: {annotations: {kubesim.mkd.dev/run-seconds: "1.5"}}
        spec:
          containers:
          - {name: mpi-launcher, image: mpioperator/mpi-pi:openmpi, command: [mpirun], args: ["-n", "2", /home/mpiuser/pi],
             resources: {limits: {cpu: 500m, memory: 512Mi}}}
    Worker:
      replicas: 2
      template:
        metadata: {annotations: {kubesim.mkd.dev/run-seconds: "120"}}
        spec:
          containers:
          - {name: mpi-worker, image: mpioperator/mpi-pi:openmpi, command: [/usr/sbin/sshd],
             args: [-De, -f, /home/mpiuser/.sshd_config], resources: {limits: {cpu: 500m, memory: 512Mi}}}
"""


@pytest.mark.timeout(60)
async def test_pi_runs_to_succeeded_and_running_workers_are_cleaned(tmp_path: Path) -> None:
    async with cluster(tmp_path) as kube:
        rig = LoopRig(kube, {"MPIJob": (MPIJOBS, MPIJobReconciler())})
        async with rig.running():
            await kube.create(MPIJOBS, yaml.safe_load(PI), NS)
            running = await rig.wait(MPIJOBS, "pi", lambda o: ("Running", "True", "MPIJobRunning") in conds(o))
            assert running["status"]["replicaStatuses"] == {"Launcher": {"active": 1}, "Worker": {"active": 2}}
            svc = await rig.get(SERVICES, "pi")
            assert svc is not None and svc["spec"]["clusterIP"] == "None"
            assert svc["spec"]["selector"] == {"training.kubeflow.org/operator-name": "mpi-operator",
                                               "training.kubeflow.org/job-name": "pi"}
            cm = await rig.get(CONFIGMAPS, "pi-config")
            assert cm is not None and cm["data"] == {
                "hostfile": "pi-worker-0.pi.default.svc slots=1\npi-worker-1.pi.default.svc slots=1\n",
                "discover_hosts.sh": "#!/bin/sh\necho pi-worker-0.pi.default.svc\necho pi-worker-1.pi.default.svc\n"}
            secret = await rig.get(SECRETS, "pi-ssh")
            assert secret is not None
            assert base64.b64decode(secret["data"]["ssh-privatekey"]).startswith(b"-----BEGIN EC PRIVATE KEY-----")
            launcher = await rig.get(JOBS, "pi-launcher")
            assert launcher is not None and launcher["metadata"]["ownerReferences"][0]["kind"] == "MPIJob"
            done = await rig.wait(MPIJOBS, "pi", lambda o: ("Succeeded", "True", "MPIJobSucceeded") in conds(o))
            assert conds(done) == [("Created", "True", "MPIJobCreated"), ("Running", "False", "MPIJobRunning"),
                                   ("Succeeded", "True", "MPIJobSucceeded")]
            assert done["status"]["completionTime"] == launcher_completion(await rig.get(JOBS, "pi-launcher"))
            # cleanPodPolicy Running: the workers still running are deleted
            await eventually(lambda: workers_going(rig), what="running workers to be deleted after success")


async def workers_going(rig: Any) -> bool:
    """Both workers are gone or being deleted."""
    pods = [await rig.get(PODS, f"pi-worker-{i}") for i in (0, 1)]
    return all(p is None or p["metadata"].get("deletionTimestamp") for p in pods)


def launcher_completion(job: dict[str, Any] | None) -> Any:
    assert job is not None
    return (job.get("status") or {}).get("completionTime")


@pytest.mark.timeout(60)
async def test_launcher_failure_fails_the_mpijob_with_completion_time(tmp_path: Path) -> None:
    job = yaml.safe_load(PI)
    job["spec"]["runPolicy"] = {"backoffLimit": 0, "cleanPodPolicy": "All"}
    job["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"] = "Never"  # a failed pod, not a restart
    launcher_meta = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["metadata"]
    launcher_meta["annotations"] = {"kubesim.mkd.dev/run-seconds": "0.3", "kubesim.mkd.dev/exit-code": "3"}
    async with cluster(tmp_path) as kube:
        rig = LoopRig(kube, {"MPIJob": (MPIJOBS, MPIJobReconciler())})
        async with rig.running():
            await kube.create(MPIJOBS, job, NS)
            failed = await rig.wait(MPIJOBS, "pi", lambda o: any(c[0] == "Failed" for c in conds(o)))
            cond = next(c for c in failed["status"]["conditions"] if c["type"] == "Failed")
            # upstream appends the last failed launcher pod's status.reason and message, both empty
            # for an ordinary container failure
            assert (cond["status"], cond["reason"], cond["message"]) == (
                "True", "BackoffLimitExceeded/", "Job has reached the specified backoff limit: ")
            assert failed["status"]["completionTime"]
            assert failed["status"]["replicaStatuses"]["Launcher"] == {"failed": 1}
            # cleanPodPolicy All: every worker goes
            await eventually(lambda: workers_going(rig), what="the workers to be deleted after failure")


@pytest.mark.timeout(60)
async def test_suspended_pi_starts_on_resume_and_succeeds(tmp_path: Path) -> None:
    job = yaml.safe_load(PI)
    job["spec"]["runPolicy"]["suspend"] = True
    async with cluster(tmp_path) as kube:
        rig = LoopRig(kube, {"MPIJob": (MPIJOBS, MPIJobReconciler())})
        async with rig.running():
            await kube.create(MPIJOBS, job, NS)
            suspended = await rig.wait(MPIJOBS, "pi", lambda o: ("Suspended", "True", "MPIJobSuspended") in conds(o))
            assert "startTime" not in suspended["status"]
            launcher = await rig.wait(JOBS, "pi-launcher", lambda o: True)
            assert launcher["spec"]["suspend"] is True
            assert await rig.get(PODS, "pi-worker-0") is None
            await kube.patch(MPIJOBS, "pi", {"spec": {"runPolicy": {"suspend": False}}}, NS)
            done = await rig.wait(MPIJOBS, "pi", lambda o: ("Succeeded", "True", "MPIJobSucceeded") in conds(o))
            assert conds(done) == [("Created", "True", "MPIJobCreated"), ("Suspended", "False", "MPIJobResumed"),
                                   ("Running", "False", "MPIJobRunning"), ("Succeeded", "True", "MPIJobSucceeded")]
            assert done["status"]["startTime"]
