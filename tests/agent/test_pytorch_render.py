"""PyTorchJob render, pass by pass on an in-memory cluster: names, labels, env, Services, conditions."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.agent.render_harness import T0, MemCluster, example
from worker_agent.reconcilers.base import Observed
from worker_agent.reconcilers.pytorch import PyTorchJobReconciler

OP = "training.kubeflow.org/operator-name"
JN = "training.kubeflow.org/job-name"
RT = "training.kubeflow.org/replica-type"
RI = "training.kubeflow.org/replica-index"
ROLE = "training.kubeflow.org/job-role"


def env(pod: dict[str, Any], container: int = 0) -> list[tuple[str, str]]:
    return [(e["name"], e["value"]) for e in pod["spec"]["containers"][container]["env"]]


def started(name: str, **kw: Any) -> MemCluster:
    cluster = MemCluster(PyTorchJobReconciler(), example(name, **kw))
    cluster.settle()
    return cluster


def test_simple_names_labels_env_and_services() -> None:
    c = started("pytorch-simple.yaml")
    assert sorted(c.objects["pods"]) == ["pytorch-simple-master-0", "pytorch-simple-worker-0"]
    assert sorted(c.objects["services"]) == ["pytorch-simple-master-0", "pytorch-simple-worker-0"]
    master, worker = c.pod("pytorch-simple-master-0"), c.pod("pytorch-simple-worker-0")
    assert master["metadata"]["labels"] == {OP: "pytorchjob-controller", JN: "pytorch-simple", RT: "master",
                                            RI: "0", ROLE: "master"}
    assert ROLE not in worker["metadata"]["labels"]
    common = [("MASTER_PORT", "23456"), ("PET_MASTER_PORT", "23456"), ("MASTER_ADDR", "pytorch-simple-master-0"),
              ("PET_MASTER_ADDR", "pytorch-simple-master-0"), ("WORLD_SIZE", "2")]
    assert env(master) == [("PYTHONUNBUFFERED", "1"), *common, ("RANK", "0"), ("PET_NODE_RANK", "0"),
                           ("PET_NPROC_PER_NODE", "auto"), ("PET_NNODES", "2")]
    assert env(worker) == [("PYTHONUNBUFFERED", "1"), *common, ("RANK", "1"), ("PET_NODE_RANK", "1"),
                           ("PET_NPROC_PER_NODE", "auto"), ("PET_NNODES", "2")]
    assert master["spec"]["restartPolicy"] == "OnFailure"
    assert "initContainers" not in master["spec"]
    (init,) = worker["spec"]["initContainers"]
    assert init["name"] == "init-pytorch" and init["image"] == "alpine:3.10"
    assert "nslookup pytorch-simple-master-0" in init["command"][2] and "seq 100" in init["command"][2]
    assert init["resources"] == {"limits": {"cpu": "100m", "memory": "20Mi"},
                                 "requests": {"cpu": "50m", "memory": "10Mi"}}
    assert master["spec"]["containers"][0]["ports"] == [{"name": "pytorchjob-port", "containerPort": 23456}]
    assert "hostname" not in master["spec"] and "subdomain" not in master["spec"]
    svc = c.objects["services"]["pytorch-simple-worker-0"]
    four = {OP: "pytorchjob-controller", JN: "pytorch-simple", RT: "worker", RI: "0"}
    assert svc["metadata"]["labels"] == four
    assert svc["spec"] == {"clusterIP": "None", "selector": four,
                           "ports": [{"name": "pytorchjob-port", "port": 23456}]}


def test_sendrecv_world_size_and_ranks() -> None:
    c = started("pytorch-sendrecv.yaml")
    ranks = {n: dict(env(p))["RANK"] for n, p in c.objects["pods"].items()}
    assert ranks == {"pytorch-dist-basic-sendrecv-master-0": "0", "pytorch-dist-basic-sendrecv-worker-0": "1",
                     "pytorch-dist-basic-sendrecv-worker-1": "2", "pytorch-dist-basic-sendrecv-worker-2": "3"}
    assert {dict(env(p))["WORLD_SIZE"] for p in c.objects["pods"].values()} == {"4"}
    assert len(c.objects["services"]) == 4


def test_cpu_demo_nproc() -> None:
    c = started("pytorch-cpu-demo.yaml")
    e = dict(env(c.pod("torchrun-cpu-master-0")))
    assert e["WORLD_SIZE"] == "4" and e["PET_NPROC_PER_NODE"] == "2" and e["PET_NNODES"] == "2"


def test_elastic_echo_env_and_success() -> None:
    c = started("pytorch-elastic-echo.yaml")
    worker = c.pod("elastic-example-echo-worker-1")
    assert env(worker) == [("PYTHONUNBUFFERED", "1"), ("PET_NPROC_PER_NODE", "auto"),
                           ("PET_RDZV_ENDPOINT", "elastic-example-echo-worker-0:23456"),
                           ("PET_RDZV_BACKEND", "c10d"), ("PET_NNODES", "1:2"), ("PET_MAX_RESTARTS", "100")]
    assert worker["metadata"]["labels"].get(ROLE) is None
    assert c.pod("elastic-example-echo-worker-0")["metadata"]["labels"][ROLE] == "master"
    assert "initContainers" not in worker["spec"]
    c.all_phase("Running")
    c.step()
    assert c.job is not None
    assert c.job["status"]["conditions"][-1]["message"] == "PyTorchJob default/elastic-example-echo is running."
    c.set_phase("elastic-example-echo-worker-1", "Succeeded", 0)
    c.step()
    assert c.conditions()[-1] == ("Succeeded", "True", "PyTorchJobSucceeded")


def test_success_condition_sequence_and_status() -> None:
    c = started("pytorch-simple.yaml")
    assert c.conditions() == [("Created", "True", "PyTorchJobCreated")]
    c.all_phase("Running")
    c.step()
    assert c.conditions() == [("Created", "True", "PyTorchJobCreated"), ("Running", "True", "PyTorchJobRunning")]
    assert c.job is not None
    status = c.job["status"]
    assert status["replicaStatuses"]["Worker"] == {
        "active": 1, "selector": f"{JN}=pytorch-simple,{OP}=pytorchjob-controller,{RT}=worker"}
    assert status["startTime"] == "2026-01-01T12:00:00Z" and "completionTime" not in status
    c.advance(5)
    c.set_phase("pytorch-simple-master-0", "Succeeded", 0)  # worker still running: master decides
    c.step()
    assert c.conditions() == [("Created", "True", "PyTorchJobCreated"), ("Running", "False", "PyTorchJobRunning"),
                              ("Succeeded", "True", "PyTorchJobSucceeded")]
    assert c.job["status"]["completionTime"] == "2026-01-01T12:00:05Z"
    assert c.job["status"]["conditions"][-1]["message"] == "PyTorchJob pytorch-simple is successfully completed."
    c.step()  # finished pass: active moves into succeeded; cleanPodPolicy None deletes nothing
    assert c.job["status"]["replicaStatuses"]["Worker"].get("active") is None
    assert c.job["status"]["replicaStatuses"]["Worker"]["succeeded"] == 1
    assert len(c.objects["pods"]) == 2


def test_never_one_failed_worker_fails_job() -> None:
    job = example("pytorch-sendrecv.yaml")
    for rs in job["spec"]["pytorchReplicaSpecs"].values():
        rs["restartPolicy"] = "Never"
    c = MemCluster(PyTorchJobReconciler(), job)
    c.settle()
    c.all_phase("Running")
    c.step()
    c.set_phase("pytorch-dist-basic-sendrecv-worker-1", "Failed", 1)
    c.step()
    assert c.conditions()[-1] == ("Failed", "True", "PyTorchJobFailed")
    assert c.conditions()[-2] == ("Running", "False", "PyTorchJobRunning")
    assert c.job is not None and c.job["status"]["conditions"][-1]["message"] == (
        "PyTorchJob pytorch-dist-basic-sendrecv is failed because 1 Worker replica(s) failed.")
    assert "completionTime" in c.job["status"]
    frozen = c.job["status"]["conditions"]
    c.all_phase("Succeeded")
    c.step()
    assert c.job["status"]["conditions"] == frozen  # Failed freezes every later update


@pytest.mark.parametrize(("policy", "code"), [("OnFailure", 1), ("Always", 1), ("ExitCode", 137)])
def test_retryable_failure_restarts(policy: str, code: int) -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = policy
    c = MemCluster(PyTorchJobReconciler(), job)
    c.settle()
    c.all_phase("Running")
    c.step()
    c.set_phase("pytorch-simple-worker-0", "Failed", code)
    c.step()
    assert c.conditions()[-1] == ("Restarting", "True", "PyTorchJobRestarting")
    assert ("Running", "True", "PyTorchJobRunning") not in c.conditions()
    assert "pytorch-simple-worker-0" not in c.objects["pods"]
    c.step()  # recreated
    assert c.pod("pytorch-simple-worker-0")["status"]["phase"] == "Pending"
    c.all_phase("Running")
    c.step()
    assert c.conditions()[-1] == ("Running", "True", "PyTorchJobRunning")
    assert all(t != "Restarting" for t, _, _ in c.conditions())


def test_exit_code_permanent_fails_with_completion_time() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] = "ExitCode"
    job["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 30}
    c = MemCluster(PyTorchJobReconciler(), job)
    c.settle()
    c.all_phase("Running")
    c.step()
    c.set_phase("pytorch-simple-worker-0", "Failed", 3)
    plan = c.step()
    assert c.conditions()[-1] == ("Failed", "True", "PyTorchJobFailed")
    assert c.job is not None and c.job["status"]["completionTime"]  # deliberate difference
    assert plan.requeue_after == pytest.approx(30)
    c.advance(30)
    c.step()
    assert c.job is None  # TTL deleted the job, on time


def test_suspend_resume() -> None:
    c = started("pytorch-simple.yaml")
    c.all_phase("Running")
    c.step()
    assert c.job is not None
    c.job["spec"]["runPolicy"] = {"suspend": True}
    c.step()
    assert c.objects["pods"] == {} and c.objects["services"] == {}
    assert c.conditions()[-2:] == [("Running", "False", "PyTorchJobSuspended"),
                                   ("Suspended", "True", "PyTorchJobSuspended")]
    assert c.job["status"]["conditions"][-1]["message"] == "PyTorchJob pytorch-simple is suspended."
    assert c.step().status is None  # steady while suspended
    c.advance(60)
    c.job["spec"]["runPolicy"]["suspend"] = False
    c.settle()
    assert c.conditions()[-1] == ("Suspended", "False", "PyTorchJobResumed")
    assert c.job["status"]["startTime"] == "2026-01-01T12:01:00Z"
    assert len(c.objects["pods"]) == 2


def test_active_deadline_on_time_and_clean_pod_policy_running() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["runPolicy"] = {"activeDeadlineSeconds": 10, "cleanPodPolicy": "Running"}
    c = MemCluster(PyTorchJobReconciler(), job)
    plan = c.step()
    assert plan.requeue_after == pytest.approx(10, abs=0.01)
    c.all_phase("Running")
    c.set_phase("pytorch-simple-worker-0", "Succeeded", 0)
    c.advance(10)
    c.step()
    assert c.conditions()[-1] == ("Failed", "True", "PyTorchJobFailed")
    assert c.job is not None and c.job["status"]["conditions"][-1]["message"] == (
        "Job pytorch-simple has failed because it was active longer than specified deadline")
    assert sorted(c.objects["pods"]) == ["pytorch-simple-worker-0"]  # only Running/Pending pods removed
    assert sorted(c.objects["services"]) == ["pytorch-simple-worker-0"]


def test_backoff_limit_zero_fails_on_first_failure() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["runPolicy"] = {"backoffLimit": 0}
    c = MemCluster(PyTorchJobReconciler(), job)
    c.settle()
    c.all_phase("Running")
    c.step()
    c.set_phase("pytorch-simple-worker-0", "Failed", 1)
    c.step()
    assert c.job is not None and c.job["status"]["conditions"][-1]["message"] == (
        "Job pytorch-simple has failed because it has reached the specified backoff limit")


def test_backoff_limit_counts_restarts_of_running_pods() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["runPolicy"] = {"backoffLimit": 2}
    c = MemCluster(PyTorchJobReconciler(), job)
    c.settle()
    c.all_phase("Running")
    c.pod("pytorch-simple-worker-0")["status"]["containerStatuses"] = [{"name": "pytorch", "restartCount": 2}]
    c.step()
    assert c.conditions()[-1] == ("Failed", "True", "PyTorchJobFailed")


def test_service_rule_second_match_stops_creation_and_user_service_untouched() -> None:
    c = MemCluster(PyTorchJobReconciler(), example("pytorch-sendrecv.yaml"))
    labels = {OP: "pytorchjob-controller", JN: "pytorch-dist-basic-sendrecv", RT: "worker", RI: "1"}
    for name in ("extra-a", "extra-b"):  # two Services claim worker index 1; no owner reference
        c.objects["services"][name] = {"metadata": {"name": name, "labels": labels}, "spec": {}}
    c.settle()
    names = set(c.objects["services"])
    assert "pytorch-dist-basic-sendrecv-worker-1" not in names
    assert {"extra-a", "extra-b", "pytorch-dist-basic-sendrecv-worker-0"} <= names
    assert any(r == "TooManyServices" and "worker 1" in m for _, r, m in c.events)
    assert c.job is not None and "too many services for worker 1: extra-a, extra-b" in c.job["status"]["message"]
    del c.objects["services"]["extra-b"]  # resolved: the one left is kept, the message goes
    c.settle()
    assert "message" not in c.job["status"]
    assert "pytorch-dist-basic-sendrecv-worker-1" not in c.objects["services"]
    # a user Service with other labels is never listed, so never touched; the apply loop lists by selector
    assert PyTorchJobReconciler().child_selector(c.job or {}) == (
        f"{JN}=pytorch-dist-basic-sendrecv,{OP}=pytorchjob-controller")


def test_scale_down_deletes_out_of_range_pod_and_service() -> None:
    c = started("pytorch-sendrecv.yaml")
    assert c.job is not None
    c.job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 2
    c.step()
    assert "pytorch-dist-basic-sendrecv-worker-2" not in c.objects["pods"]
    assert "pytorch-dist-basic-sendrecv-worker-2" not in c.objects["services"]


def test_managed_by_other_controller_writes_nothing() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["runPolicy"] = {"managedBy": "kueue.x-k8s.io/multikueue"}
    plan = MemCluster(PyTorchJobReconciler(), job).step()
    assert plan.creates == [] and plan.status is None


def test_template_restart_policy_overwritten_with_event() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["restartPolicy"] = "Always"
    job["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] = "ExitCode"
    c = MemCluster(PyTorchJobReconciler(), job)
    c.step()
    assert c.pod("pytorch-simple-master-0")["spec"]["restartPolicy"] == "Never"
    assert any(r == "SetPodTemplateRestartPolicy" for _, r, _ in c.events)


def test_render_leaves_the_observed_job_as_read() -> None:
    """Defaulting (the port on the main container) is in memory only: the job the pass read, whose status
    the apply loop then writes, is not changed by the render, and every pod gets its own copy."""
    job = example("pytorch-simple.yaml")
    for rspec in job["spec"]["pytorchReplicaSpecs"].values():
        for container in rspec["template"]["spec"]["containers"]:
            container.pop("ports", None)
    job["metadata"]["uid"] = "u1"
    read = copy.deepcopy(job)
    plan = PyTorchJobReconciler().render(Observed(job=job, children={}, now=T0))
    assert job == read
    pods = [body for res, body in plan.creates if res.plural == "pods"]
    assert [p["spec"]["containers"][0]["ports"] for p in pods] == [[{"name": "pytorchjob-port",
                                                                     "containerPort": 23456}]] * 2
    pods[0]["spec"]["containers"][0]["ports"].append({"name": "x"})
    assert len(pods[1]["spec"]["containers"][0]["ports"]) == 1
