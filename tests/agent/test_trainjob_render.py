"""TrainJob render on the trainer examples (KUBEFLOW.md E #14/#16/#18/#19): JobSet, PET env, mpi, conditions."""

from __future__ import annotations

import base64
from typing import Any

import yaml

from tests.agent.test_jobset_harness import T0, Sim, ts
from worker_agent.reconcilers.trainjob import TrainJobReconciler

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"

TORCH_RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: torch-distributed, labels: {trainer.kubeflow.org/framework: torch}}
spec:
  mlPolicy: {numNodes: 1, torch: {}}
  template:
    metadata: {labels: {tier: gold}}
    spec:
      replicatedJobs:
      - name: node
        template:
          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
          spec:
            template:
              spec:
                containers:
                - name: node
                  image: pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime
                  command: [/bin/bash, -c, "torchrun train.py"]
"""

MULTI_NODE = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: multi-node-example, namespace: default, labels: {mkd.dev/origin: fed-a, mkd.dev/kind: TrainJob}}
spec:
  runtimeRef: {name: torch-distributed}
  trainer:
    numNodes: 3
    command: [bash, -c, "torchrun /workspace/train.py"]
    env: [{name: CUSTOM, value: "1"}]
"""

DEEPSPEED_RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata: {name: deepspeed-distributed}
spec:
  mlPolicy:
    numNodes: 1
    mpi: {numProcPerNode: 1, mpiImplementation: OpenMPI, sshAuthMountPath: /home/mpiuser/.ssh, runLauncherAsNode: true}
  template:
    spec:
      network: {publishNotReadyAddresses: true}
      successPolicy: {operator: All, targetReplicatedJobs: [launcher]}
      replicatedJobs:
      - name: node
        template:
          spec:
            template:
              spec:
                containers:
                - {name: node, image: ghcr.io/kubeflow/trainer/deepspeed-runtime, command: [/usr/sbin/sshd],
                   args: [-De, -f, /home/mpiuser/.sshd_config]}
      - name: launcher
        dependsOn: [{name: node, status: Ready}]
        template:
          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
          spec:
            template:
              spec:
                containers:
                - {name: node, image: ghcr.io/kubeflow/trainer/deepspeed-runtime}
"""


def load(text: str, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load(text)
    obj["spec"].update(spec)
    return obj


def sim_for(job: dict[str, Any], runtime: dict[str, Any] | None) -> Sim:
    return Sim(TrainJobReconciler(), job, extra={"runtime": runtime, "runtime_error": "" if runtime else
                                                  'clustertrainingruntimes.trainer.kubeflow.org "x" not found'})


def env(container: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(e["name"], e.get("value", e.get("valueFrom"))) for e in container.get("env", [])]


def test_torch_multi_node_jobset() -> None:
    sim = sim_for(load(MULTI_NODE), load(TORCH_RUNTIME))
    plan = sim.step()
    assert [(r.plural, b["metadata"]["name"]) for r, b in plan.creates] == [
        ("configmaps", "multi-node-example-runtime-snapshot"), ("jobsets", "multi-node-example")]
    snapshot = yaml.safe_load(sim.obj("configmaps", "multi-node-example-runtime-snapshot")["data"]["runtime"])
    assert snapshot == load(TORCH_RUNTIME)
    js = sim.obj("jobsets", "multi-node-example")
    assert js["metadata"]["labels"] == {"tier": "gold", "mkd.dev/origin": "fed-a",
                                        "mkd.dev/owner-uid": "uid-multi-node-example"}
    assert "suspend" not in js["spec"]
    (rjob,) = js["spec"]["replicatedJobs"]
    assert rjob["replicas"] == 1
    assert (rjob["template"]["spec"]["parallelism"], rjob["template"]["spec"]["completions"]) == (3, 3)
    node = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
    assert node["command"] == ["bash", "-c", "torchrun /workspace/train.py"]
    assert env(node) == [
        ("CUSTOM", "1"), ("PET_NNODES", "3"), ("PET_NPROC_PER_NODE", "1"),
        ("PET_NODE_RANK", {"fieldRef": {"fieldPath":
                                        "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}),
        ("PET_MASTER_ADDR", "multi-node-example-node-0-0.multi-node-example"), ("PET_MASTER_PORT", "29500")]
    assert node["ports"] == [{"containerPort": 29500}]
    assert plan.status is None  # no condition until something happens


def test_num_proc_per_node_auto_rule() -> None:
    job = load(MULTI_NODE)
    job["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"cpu": "2500m"}, "limits": {"cpu": "4"}}
    sim = sim_for(job, load(TORCH_RUNTIME))
    sim.step()
    node = sim.obj("jobsets", "multi-node-example")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"]["containers"][0]
    assert ("PET_NPROC_PER_NODE", "3") in env(node)  # CPU request rounded up
    assert node["resources"] == {"limits": {"cpu": "4"}, "requests": {"cpu": "2500m"}}
    job["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": 2}}
    sim = sim_for(job, load(TORCH_RUNTIME))
    sim.step()
    node = sim.obj("jobsets", "multi-node-example")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"]["containers"][0]
    assert ("PET_NPROC_PER_NODE", "auto") in env(node)


def test_suspended_kueue_example_then_resume_complete() -> None:
    sim = sim_for(load(MULTI_NODE, suspend=True), load(TORCH_RUNTIME))
    sim.step()
    assert sim.obj("jobsets", "multi-node-example")["spec"]["suspend"] is True
    assert sim.job is not None
    assert sim.job["status"]["conditions"] == [{"type": "Suspended", "status": "True", "reason": "Suspended",
                                                "message": "TrainJob is suspended",
                                                "lastTransitionTime": ts(T0)}]
    sim.job["spec"]["suspend"] = False
    sim.advance(10)
    plan = sim.step()  # the JobSet is still suspended, so the spec is re-applied with suspend false
    assert [r.plural for r, _ in plan.updates] == ["jobsets"]
    assert sim.obj("jobsets", "multi-node-example")["spec"]["suspend"] is False
    assert [(c["type"], c["status"], c["reason"]) for c in sim.job["status"]["conditions"]] == [
        ("Suspended", "False", "Resumed")]
    assert not sim.step().updates  # both running: nothing re-applied
    js = sim.obj("jobsets", "multi-node-example")
    js["status"] = {"replicatedJobsStatus": [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0,
                                              "active": 1, "suspended": 0}]}
    sim.step()
    assert sim.job["status"]["jobsStatus"] == [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0,
                                                "active": 1, "suspended": 0}]
    js["status"]["conditions"] = [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                                   "message": "jobset completed successfully", "lastTransitionTime": ts(sim.now)}]
    sim.advance(5)
    sim.step()
    assert [(c["type"], c["status"], c["reason"]) for c in sim.job["status"]["conditions"]] == [
        ("Suspended", "False", "Resumed"), ("Complete", "True", "AllJobsCompleted")]
    assert sim.job["status"]["conditions"][1]["message"] == "jobset completed successfully"


def test_failed_jobset_is_copied_with_type_failed() -> None:
    sim = sim_for(load(MULTI_NODE), load(TORCH_RUNTIME))
    sim.step()
    sim.obj("jobsets", "multi-node-example")["status"] = {"conditions": [{
        "type": "Failed", "status": "True", "reason": "FailedJobs", "lastTransitionTime": ts(T0),
        "message": "jobset failed due to one or more job failures (first failed job: multi-node-example-node-0)"}]}
    sim.step()
    assert sim.job is not None
    assert [(c["type"], c["reason"]) for c in sim.job["status"]["conditions"]] == [("Failed", "FailedJobs")]


def test_deadline_on_time_measured_from_creation() -> None:
    sim = sim_for(load(MULTI_NODE, activeDeadlineSeconds=60), load(TORCH_RUNTIME))
    plan = sim.step()
    assert plan.requeue_after == 60.0
    sim.advance(60)
    plan = sim.step()
    assert sim.job is not None
    assert sim.job["status"]["conditions"] == [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                                "message": "TrainJob exceeded its active deadline",
                                                "lastTransitionTime": ts(sim.now)}]
    assert [(r.plural, n) for r, n in plan.deletes] == [("jobsets", "multi-node-example")]


def test_deadline_restarts_at_resume() -> None:
    sim = sim_for(load(MULTI_NODE, activeDeadlineSeconds=60, suspend=True), load(TORCH_RUNTIME))
    assert sim.step().requeue_after is None  # not checked while suspended
    sim.advance(600)
    assert sim.job is not None
    sim.job["spec"]["suspend"] = False
    assert sim.step().requeue_after == 60.0


def test_unknown_runtime_kind_and_missing_runtime() -> None:
    job = load(MULTI_NODE, runtimeRef={"name": "x", "kind": "MagicRuntime"})
    sim = sim_for(job, load(TORCH_RUNTIME))
    sim.step()
    assert sim.job is not None
    cond = sim.job["status"]["conditions"][0]
    assert (cond["type"], cond["reason"], cond["message"]) == (
        "Failed", "TrainingRuntimeNotSupported", "unsupported runtime: MagicRuntime.trainer.kubeflow.org")
    sim = sim_for(load(MULTI_NODE), None)
    plan = sim.step()
    assert not plan.creates and plan.requeue_after
    assert plan.events == [("Warning", "TrainJobResourcesCreationFailed",
                            "TrainJob resources reconciliation failed: not found ClusterTrainingRuntime specified "
                            'in TrainJob: clustertrainingruntimes.trainer.kubeflow.org "x" not found')]


def test_deepspeed_mpi_runtime() -> None:
    job = load(MULTI_NODE)
    job["metadata"]["name"] = "ds"
    job["spec"]["runtimeRef"] = {"name": "deepspeed-distributed"}
    job["spec"]["trainer"] = {"numNodes": 3, "command": ["mpirun", "python", "train.py"]}
    sim = sim_for(job, load(DEEPSPEED_RUNTIME))
    plan = sim.step()
    assert [(r.plural, b["metadata"]["name"]) for r, b in plan.creates] == [
        ("configmaps", "ds-runtime-snapshot"), ("secrets", "ds-mpi-ssh-auth"), ("configmaps", "ds-mpi-hostfile"), ("jobsets", "ds")]
    secret = sim.obj("secrets", "ds-mpi-ssh-auth")
    assert secret["immutable"] is True and secret["type"] == "kubernetes.io/ssh-auth"
    assert base64.b64decode(secret["data"]["ssh-privatekey"]).startswith(b"-----BEGIN EC PRIVATE KEY-----")
    assert sim.obj("configmaps", "ds-mpi-hostfile")["data"] == {"hostfile": (
        "ds-node-0-0.ds slots=1\nds-node-0-1.ds slots=1\nds-launcher-0-0.ds slots=1\n")}
    node, launcher = sim.obj("jobsets", "ds")["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["parallelism"] == 2 and launcher["template"]["spec"]["parallelism"] == 1
    lpod = launcher["template"]["spec"]["template"]["spec"]
    assert [v["name"] for v in lpod["volumes"]] == ["mpi-ssh-auth", "mpi-hostfile"]
    assert lpod["volumes"][0]["secret"]["defaultMode"] == 0o400
    lc = lpod["containers"][0]
    assert lc["command"] == ["mpirun", "python", "train.py"]
    assert lc["volumeMounts"] == [{"name": "mpi-ssh-auth", "mountPath": "/home/mpiuser/.ssh"},
                                  {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}]
    assert env(lc) == [("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),
                       ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"), ("OMPI_MCA_orte_set_default_slots", "1"),
                       ("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10")]
    nc = node["template"]["spec"]["template"]["spec"]["containers"][0]
    assert nc["command"] == ["/usr/sbin/sshd"] and "env" not in nc
    assert nc["volumeMounts"] == [{"name": "mpi-ssh-auth", "mountPath": "/home/mpiuser/.ssh"}]
    assert launcher["template"]["metadata"]["labels"][ANCESTOR] == "trainer"
    plan = sim.step()  # the Secret is never regenerated; the hostfile is stable
    assert not plan.creates and not plan.updates


def test_runtime_snapshot_wins_over_later_runtime_edits() -> None:
    sim = sim_for(load(MULTI_NODE, suspend=True), load(TORCH_RUNTIME))
    sim.step()
    edited = load(TORCH_RUNTIME)
    edited["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["image"] = "edited:latest"
    sim.extra = {"runtime": edited, "runtime_error": ""}
    sim.job["spec"]["trainer"]["numNodes"] = 2  # type: ignore[index]
    plan = sim.step()  # suspended: the JobSet is re-applied, from the snapshot
    assert [r.plural for r, _ in plan.updates] == ["jobsets"] and not plan.creates
    rjob = sim.obj("jobsets", "multi-node-example")["spec"]["replicatedJobs"][0]
    assert rjob["template"]["spec"]["parallelism"] == 2
    assert rjob["template"]["spec"]["template"]["spec"]["containers"][0]["image"].startswith("pytorch/")
    cm = sim.obj("configmaps", "multi-node-example-runtime-snapshot")
    cm["metadata"]["ownerReferences"] = [{"uid": "someone-else", "controller": True}]
    plan = sim.step()
    assert plan.events[0][2].startswith("TrainJob resources reconciliation failed: getting runtime snapshot: "
                                        "invalid runtime snapshot: a snapshot configmap exists but is owned by")


MULTI_STEP_RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainingRuntime
metadata: {name: torch-with-dataset-init, namespace: default}
spec:
  mlPolicy: {numNodes: 1, torch: {}}
  template:
    spec:
      replicatedJobs:
      - name: dataset-initializer
        template:
          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: dataset-initializer}}
          spec:
            template:
              spec:
                containers: [{name: dataset-initializer, image: ghcr.io/kubeflow/trainer/dataset-initializer}]
      - name: node
        dependsOn: [{name: dataset-initializer, status: Complete}]
        template:
          metadata: {labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}}
          spec:
            template:
              spec:
                containers: [{name: node, image: pytorch/pytorch, env: [{name: PET_NNODES, value: "9"}]}]
"""


def test_multi_step_initializer_env_and_namespaced_runtime() -> None:
    job = load(MULTI_NODE, runtimeRef={"name": "torch-with-dataset-init", "kind": "TrainingRuntime"},
               initializer={"dataset": {"storageUri": "hf://tatsu-lab/alpaca", "env": [{"name": "X", "value": "y"}]}})
    job["spec"]["trainer"] = {"numNodes": 2, "numProcPerNode": 4,
                              "resourcesPerNode": {"requests": {"cpu": "2", "memory": "4Gi"},
                                                   "limits": {"cpu": "4", "memory": "8Gi"}}}
    sim = sim_for(job, load(MULTI_STEP_RUNTIME))
    sim.step()
    init, node = sim.obj("jobsets", "multi-node-example")["spec"]["replicatedJobs"]
    assert init["replicas"] == 1 and init["template"]["spec"]["parallelism"] == 1
    ic = init["template"]["spec"]["template"]["spec"]["containers"][0]
    assert env(ic) == [("STORAGE_URI", "hf://tatsu-lab/alpaca"), ("X", "y")]
    nc = node["template"]["spec"]["template"]["spec"]["containers"][0]
    assert node["template"]["spec"]["parallelism"] == 2 and node["dependsOn"] == [
        {"name": "dataset-initializer", "status": "Complete"}]
    assert env(nc)[0] == ("PET_NNODES", "2")  # upserted in place over the runtime's value
    assert ("PET_NPROC_PER_NODE", "4") in env(nc)
    assert nc["resources"] == {"limits": {"cpu": "4", "memory": "8Gi"}, "requests": {"cpu": "2", "memory": "4Gi"}}
