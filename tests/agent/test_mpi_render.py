"""MPIJob v2beta1 render on the pi / horovod shapes (KUBEFLOW.md E #10-#13): children, hostfile, status."""

from __future__ import annotations

import base64
from typing import Any

import yaml

from tests.agent.test_jobset_harness import T0, Sim, ts
from worker_agent.reconcilers.mpi import OWNER_UID_LABEL, MPIJobReconciler

OP, JN, ROLE, RI = ("training.kubeflow.org/operator-name", "training.kubeflow.org/job-name",
                    "training.kubeflow.org/job-role", "training.kubeflow.org/replica-index")

PI = """
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: pi, namespace: default, labels: {mkd.dev/origin: fed-a, mkd.dev/kind: MPIJob}}
spec:
  slotsPerWorker: 1
  sshAuthMountPath: /home/mpiuser/.ssh
  runPolicy: {cleanPodPolicy: Running, ttlSecondsAfterFinished: 60}
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      template:
        spec:
          containers:
          - name: mpi-launcher
            image: docker.io/mpioperator/mpi-pi:openmpi
            command: [mpirun]
            args: ["-n", "2", /home/mpiuser/pi]
            resources: {limits: {cpu: "1", memory: 1Gi}}
    Worker:
      replicas: 2
      template:
        spec:
          containers:
          - name: mpi-worker
            image: docker.io/mpioperator/mpi-pi:openmpi
            command: [/usr/sbin/sshd]
            args: [-De, -f, /home/mpiuser/.sshd_config]
            resources: {limits: {cpu: "1", memory: 1Gi}}
"""


def pi(**spec: Any) -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load(PI)
    job["spec"].update(spec)
    return job


def env(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["name"], e.get("value", "")) for e in obj["spec"]["containers"][0]["env"]]


def launcher_pod(sim: Sim, phase: str, **status: Any) -> None:
    launcher = sim.obj("jobs", "pi-launcher")
    sim.objects["pods"]["pi-launcher-abcde"] = {
        "metadata": {"name": "pi-launcher-abcde", "creationTimestamp": ts(sim.now),
                     "labels": dict(launcher["spec"]["template"]["metadata"]["labels"]),
                     "ownerReferences": [{"uid": launcher["metadata"]["uid"], "controller": True}]},
        "status": {"phase": phase, **status}}


def set_workers(sim: Sim, phase: str, ready: bool = False) -> None:
    for name, pod in sim.objects["pods"].items():
        if "-worker-" in name:
            pod["status"] = {"phase": phase,
                             "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}


def test_pi_children_names_labels_and_env() -> None:
    sim = Sim(MPIJobReconciler(), pi())
    plan = sim.step()
    assert [(r.plural, b["metadata"]["name"]) for r, b in plan.creates] == [
        ("services", "pi"), ("configmaps", "pi-config"), ("secrets", "pi-ssh"),
        ("pods", "pi-worker-0"), ("pods", "pi-worker-1"), ("jobs", "pi-launcher")]
    stamp = {"mkd.dev/origin": "fed-a", OWNER_UID_LABEL: "uid-pi"}
    svc = sim.obj("services", "pi")
    assert svc["metadata"]["labels"] == {"app": "pi", **stamp}
    assert svc["spec"] == {"clusterIP": "None", "selector": {OP: "mpi-operator", JN: "pi"},
                           "publishNotReadyAddresses": False}
    cm = sim.obj("configmaps", "pi-config")
    assert cm["data"] == {"hostfile": "pi-worker-0.pi.default.svc slots=1\npi-worker-1.pi.default.svc slots=1\n",
                          "discover_hosts.sh": "#!/bin/sh\n"}
    secret = sim.obj("secrets", "pi-ssh")
    assert secret["type"] == "kubernetes.io/ssh-auth"
    assert base64.b64decode(secret["data"]["ssh-privatekey"]).startswith(b"-----BEGIN EC PRIVATE KEY-----\n")
    assert base64.b64decode(secret["data"]["ssh-publickey"]).startswith(b"ecdsa-sha2-nistp521 AAAA")
    w1 = sim.obj("pods", "pi-worker-1")
    assert w1["metadata"]["labels"] == {OP: "mpi-operator", JN: "pi", ROLE: "worker", RI: "1", **stamp}
    assert (w1["spec"]["hostname"], w1["spec"]["subdomain"]) == ("pi-worker-1", "pi")
    assert w1["spec"]["dnsConfig"] == {"searches": ["pi.default.svc.cluster.local"]}
    assert w1["spec"]["restartPolicy"] == "Never"
    assert w1["spec"]["containers"][0]["command"] == ["/usr/sbin/sshd"]  # user command kept
    assert env(w1) == [("K_MPI_JOB_ROLE", "worker")]
    assert w1["spec"]["volumes"] == [{"name": "ssh-auth", "secret": {"secretName": "pi-ssh", "items": [
        {"key": "ssh-privatekey", "path": "id_rsa"}, {"key": "ssh-publickey", "path": "id_rsa.pub"},
        {"key": "ssh-publickey", "path": "authorized_keys"}]}}]  # no defaultMode off /root/.ssh
    assert w1["spec"]["containers"][0]["volumeMounts"] == [{"name": "ssh-auth", "mountPath": "/home/mpiuser/.ssh"}]
    job = sim.obj("jobs", "pi-launcher")
    assert job["metadata"]["labels"] == {"app": "pi", **stamp}
    assert job["spec"]["ttlSecondsAfterFinished"] == 60 and job["spec"]["podReplacementPolicy"] == "Failed"
    assert "suspend" not in job["spec"]
    tmpl = job["spec"]["template"]
    assert tmpl["metadata"]["labels"] == {OP: "mpi-operator", JN: "pi", ROLE: "launcher", **stamp}
    assert (tmpl["spec"]["hostname"], tmpl["spec"]["subdomain"], tmpl["spec"]["restartPolicy"]) == (
        "pi-launcher", "pi", "OnFailure")
    assert env(tmpl) == [("K_MPI_JOB_ROLE", "launcher"), ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
                         ("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),
                         ("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10"),
                         ("OMPI_MCA_orte_set_default_slots", "1"), ("NVIDIA_VISIBLE_DEVICES", ""),
                         ("NVIDIA_DRIVER_CAPABILITIES", "")]
    assert [v["name"] for v in tmpl["spec"]["volumes"]] == ["ssh-auth", "mpi-job-config"]
    assert tmpl["spec"]["volumes"][1]["configMap"] == {"name": "pi-config", "items": [
        {"key": "hostfile", "path": "hostfile", "mode": 0o444},
        {"key": "discover_hosts.sh", "path": "discover_hosts.sh", "mode": 0o555}]}
    assert sim.conditions() == [("Created", "True", "MPIJobCreated")]
    assert sim.job is not None and sim.job["status"]["startTime"] == ts(T0)
    assert ("Normal", "MPIJobCreated", "MPIJob default/pi is created.") in sim.events
    assert MPIJobReconciler().child_selector(sim.job) == f"{OWNER_UID_LABEL}=uid-pi"


def test_secret_is_generated_once_and_render_is_stable() -> None:
    sim = Sim(MPIJobReconciler(), pi())
    sim.step()
    key = sim.obj("secrets", "pi-ssh")["data"]["ssh-privatekey"]
    plan = sim.step()
    assert not plan.creates and not plan.updates and not plan.deletes and plan.status is None
    assert sim.obj("secrets", "pi-ssh")["data"]["ssh-privatekey"] == key


def test_running_discover_hosts_success_and_clean_pod_policy() -> None:
    sim = Sim(MPIJobReconciler(), pi())
    sim.step()
    set_workers(sim, "Running", ready=True)
    launcher_pod(sim, "Running")
    sim.advance(5)
    plan = sim.step()
    assert sim.obj("configmaps", "pi-config")["data"]["discover_hosts.sh"] == (
        "#!/bin/sh\necho pi-worker-0.pi.default.svc\necho pi-worker-1.pi.default.svc\n")
    assert [r.plural for r, _ in plan.updates] == ["configmaps"]
    assert sim.conditions() == [("Created", "True", "MPIJobCreated"), ("Running", "True", "MPIJobRunning")]
    assert sim.job is not None
    assert sim.job["status"]["replicaStatuses"] == {"Launcher": {"active": 1}, "Worker": {"active": 2}}
    done = ts(sim.now)
    sim.obj("jobs", "pi-launcher")["status"] = {
        "succeeded": 1, "completionTime": done, "conditions": [{"type": "Complete", "status": "True"}]}
    sim.objects["pods"]["pi-launcher-abcde"]["status"] = {"phase": "Succeeded"}
    sim.advance(5)
    sim.step()
    assert sim.conditions() == [("Created", "True", "MPIJobCreated"), ("Running", "False", "MPIJobRunning"),
                                ("Succeeded", "True", "MPIJobSucceeded")]
    status = sim.job["status"]
    assert status["completionTime"] == done
    assert status["replicaStatuses"]["Launcher"] == {"succeeded": 1}
    plan = sim.step()  # finished with completionTime: cleanPodPolicy Running deletes the running workers
    assert sorted(n for _, n in plan.deletes) == ["pi-worker-0", "pi-worker-1"]
    assert sim.job["status"]["replicaStatuses"]["Worker"] == {}
    assert not sim.step().deletes


def test_launcher_backoff_failure_reason_and_completion_time() -> None:
    sim = Sim(MPIJobReconciler(), pi())
    sim.step()
    launcher_pod(sim, "Failed", reason="OOMKilled", message="container ran out of memory")
    sim.obj("jobs", "pi-launcher")["status"] = {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]}
    sim.advance(7)
    sim.step()
    assert sim.job is not None
    # never Running: the Running=False entry comes after Failed, stamped at completionTime
    assert sim.conditions() == [("Created", "True", "MPIJobCreated"),
                                ("Failed", "True", "BackoffLimitExceeded/OOMKilled"), ("Running", "False", "MPIJobRunning")]
    failed = sim.job["status"]["conditions"][1]
    assert failed["message"] == "Job has reached the specified backoff limit: container ran out of memory"
    assert sim.job["status"]["completionTime"] == ts(sim.now)
    assert sim.job["status"]["replicaStatuses"]["Launcher"] == {"failed": 1}
    assert ("Warning", "BackoffLimitExceeded/OOMKilled", failed["message"]) in sim.events


def test_evicted_worker_fails_the_job_with_completion_time() -> None:
    sim = Sim(MPIJobReconciler(), pi())
    sim.step()
    sim.obj("pods", "pi-worker-0")["status"] = {"phase": "Failed", "reason": "Evicted"}
    sim.step()
    assert sim.job is not None
    assert sim.conditions()[-2:] == [("Failed", "True", "MPIJobEvicted"), ("Running", "False", "MPIJobRunning")]
    assert sim.job["status"]["conditions"][-2]["message"] == "1/2 workers are evicted"
    assert sim.job["status"]["completionTime"] == ts(T0)


def test_suspend_and_resume() -> None:
    sim = Sim(MPIJobReconciler(), pi(runPolicy={"suspend": True, "cleanPodPolicy": "None"}))
    plan = sim.step()
    assert sorted(b["metadata"]["name"] for _, b in plan.creates) == ["pi", "pi-config", "pi-launcher", "pi-ssh"]
    assert sim.obj("jobs", "pi-launcher")["spec"]["suspend"] is True
    assert sim.job is not None and "startTime" not in sim.job["status"]
    assert sim.conditions() == [("Created", "True", "MPIJobCreated"), ("Suspended", "True", "MPIJobSuspended"),
                                ("Running", "False", "MPIJobSuspended")]
    assert sim.job["status"]["conditions"][-1]["message"] == "MPIJob default/pi is suspended."
    sim.job["spec"]["runPolicy"]["suspend"] = False
    sim.advance(30)
    plan = sim.step()
    assert sim.obj("jobs", "pi-launcher")["spec"]["suspend"] is False
    assert sorted(b["metadata"]["name"] for _, b in plan.creates) == ["pi-worker-0", "pi-worker-1"]
    assert ("Suspended", "False", "MPIJobResumed") in sim.conditions()
    assert sim.job["status"]["startTime"] == ts(sim.now)
    # suspending again deletes the workers whatever their phase (cleanPodPolicy None keeps nothing back)
    sim.job["spec"]["runPolicy"]["suspend"] = True
    plan = sim.step()
    assert sorted(n for _, n in plan.deletes) == ["pi-worker-0", "pi-worker-1"]
    assert sim.obj("jobs", "pi-launcher")["spec"]["suspend"] is True


def test_run_launcher_as_worker_intel_hostfile_and_index_shift() -> None:
    sim = Sim(MPIJobReconciler(), pi(runLauncherAsWorker=True, mpiImplementation="Intel", slotsPerWorker=2))
    sim.step()
    assert sim.obj("configmaps", "pi-config")["data"] == {
        "hostfile": "pi-launcher.pi.default.svc:2\npi-worker-0.pi.default.svc:2\npi-worker-1.pi.default.svc:2\n",
        "discover_hosts.sh": "#!/bin/sh\necho pi-launcher.pi.default.svc\n"}
    assert sim.obj("services", "pi")["spec"]["publishNotReadyAddresses"] is True
    assert sim.obj("pods", "pi-worker-0")["metadata"]["labels"][RI] == "1"
    tmpl = sim.obj("jobs", "pi-launcher")["spec"]["template"]
    assert tmpl["metadata"]["labels"][RI] == "0"
    assert env(tmpl) == [("K_MPI_JOB_ROLE", "launcher"), ("I_MPI_HYDRA_HOST_FILE", "/etc/mpi/hostfile"),
                         ("I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "-o ConnectionAttempts=10"),
                         ("I_MPI_PERHOST", "2")]


def test_wait_for_workers_ready_and_scale_down() -> None:
    job = pi(launcherCreationPolicy="WaitForWorkersReady", sshAuthMountPath="")
    sim = Sim(MPIJobReconciler(), job)
    plan = sim.step()
    assert "pi-launcher" not in [b["metadata"]["name"] for _, b in plan.creates]
    ssh = sim.obj("pods", "pi-worker-0")["spec"]["volumes"][0]["secret"]
    assert ssh["defaultMode"] == 0o600  # defaulted mount path /root/.ssh
    set_workers(sim, "Running", ready=False)
    assert not sim.step().creates
    set_workers(sim, "Running", ready=True)
    assert [b["metadata"]["name"] for _, b in sim.step().creates] == ["pi-launcher"]
    assert sim.job is not None
    sim.job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = 1
    plan = sim.step()
    assert plan.deletes and [n for _, n in plan.deletes] == ["pi-worker-1"]
    assert sim.obj("configmaps", "pi-config")["data"]["hostfile"] == "pi-worker-0.pi.default.svc slots=1\n"


def test_foreign_service_blocks_and_managed_elsewhere_writes_nothing() -> None:
    sim = Sim(MPIJobReconciler(), pi())
    sim.objects["services"]["pi"] = {"metadata": {"name": "pi", "ownerReferences": []}, "spec": {}}
    plan = sim.step()
    assert ("Warning", "ErrResourceExists",
            'Resource "pi" of Kind "Service" already exists and is not managed by MPIJob') in plan.events
    assert not plan.creates and plan.status is None and plan.requeue_after
    other = Sim(MPIJobReconciler(), pi(runPolicy={"managedBy": "kueue.x-k8s.io/multikueue"}))
    plan = other.step()
    assert not (plan.creates or plan.status or plan.events)


def test_invalid_job_gets_a_validation_event_only() -> None:
    job = pi()
    job["spec"]["mpiReplicaSpecs"]["Worker"]["restartPolicy"] = "Always"
    plan = Sim(MPIJobReconciler(), job).step()
    assert not plan.creates and plan.status is None
    assert plan.events[0][:2] == ("Warning", "ValidationError")
    assert "restartPolicy" in plan.events[0][2]


def test_counted_failed_pod_not_yet_seen_waits_briefly_then_fails() -> None:
    sim = Sim(MPIJobReconciler(), pi())
    sim.step()
    sim.obj("jobs", "pi-launcher")["status"] = {"failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": ts(sim.now),
         "message": "Job has reached the specified backoff limit"}]}
    plan = sim.step()
    assert plan.requeue_after == 0.5 and ("Failed", "True", "BackoffLimitExceeded") not in sim.conditions()
    sim.advance(6)  # the pod never shows up: fail without the pod's reason
    sim.step()
    assert ("Failed", "True", "BackoffLimitExceeded") in sim.conditions()


def test_launcher_deadline_is_rechecked_on_time() -> None:
    sim = Sim(MPIJobReconciler(), pi(runPolicy={"activeDeadlineSeconds": 30}))
    sim.step()
    assert sim.obj("jobs", "pi-launcher")["spec"]["activeDeadlineSeconds"] == 30
    sim.obj("jobs", "pi-launcher")["status"] = {"startTime": ts(T0)}
    sim.advance(10)
    assert sim.step().requeue_after == 21.0
