"""Fidelity audit against KUBEFLOW.md: pure render tests for rules found wrong (and fixed) or untested.

Fixed by the audit (each test fails on the code before it): managedBy ``""`` is an external
controller's value (upstream compares a string pointer); ``nprocPerNode`` is parsed like Go's
``strconv.Atoi`` (``"+2"`` counts 2); ``rdzvHost`` / ``rdzvPort`` fall back only when absent.
The rest pins rules that were right but had no test: v1 and MPI ``setCondition``, replica
counting, env appending, the init container, cleanup, suspend/resume, elastic env order, MPI
Running and hostfile formats.
"""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import yaml

from tests.agent.render_harness import T0, MemCluster, example
from tests.agent.test_jobset_harness import Sim
from tests.agent.test_mpi_render import PI, launcher_pod, set_workers
from worker_agent.reconcilers import conditions as cond
from worker_agent.reconcilers import mpi_support
from worker_agent.reconcilers.base import Observed
from worker_agent.reconcilers.mpi import MPIJobReconciler
from worker_agent.reconcilers.pytorch import PyTorchJobReconciler

STAMP0 = "2026-01-01T12:00:00Z"


def env(pod: dict[str, Any], container: int = 0) -> list[tuple[str, str]]:
    return [(e["name"], e.get("value", "")) for e in pod["spec"]["containers"][container]["env"]]


def started(job: dict[str, Any]) -> MemCluster:
    cluster = MemCluster(PyTorchJobReconciler(), job)
    cluster.settle()
    return cluster


# --- fixed mismatches ----------------------------------------------------------------------------

def test_empty_managed_by_belongs_to_another_controller() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["runPolicy"] = {"managedBy": ""}
    plan = PyTorchJobReconciler().render(Observed(job=job, children={}, now=T0))
    assert plan.creates == [] and plan.status is None and plan.events == []


def test_nproc_per_node_parsed_like_go_atoi() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["nprocPerNode"] = "+2"
    c = started(job)
    e = dict(env(c.pod("pytorch-simple-master-0")))
    assert e["WORLD_SIZE"] == "4" and e["PET_NPROC_PER_NODE"] == "+2"
    for word in ("auto", "gpu", "cpu", "²"):  # words (and non-ASCII digits) count as 1
        job = example("pytorch-simple.yaml")
        job["spec"]["nprocPerNode"] = word
        assert dict(env(started(job).pod("pytorch-simple-worker-0")))["WORLD_SIZE"] == "2"


def test_elastic_env_full_order_and_pointer_fallbacks() -> None:
    job = example("pytorch-elastic-echo.yaml")
    job["spec"]["elasticPolicy"] = {"rdzvBackend": "etcd", "rdzvHost": "", "rdzvPort": 0, "minReplicas": 1,
                                    "rdzvId": "abc", "rdzvConf": [{"key": "a", "value": "1"},
                                                                  {"key": "b", "value": "2"}],
                                    "standalone": True, "nProcPerNode": 4}
    worker = started(job).pod("elastic-example-echo-worker-0")
    # nProcPerNode (deprecated elastic field) set: no spec.nprocPerNode default, so no early PET_NPROC_PER_NODE
    assert env(worker) == [("PYTHONUNBUFFERED", "1"), ("PET_RDZV_ENDPOINT", ":0"), ("PET_RDZV_BACKEND", "etcd"),
                           ("PET_NNODES", "1:1"), ("PET_NPROC_PER_NODE", "4"), ("PET_RDZV_ID", "abc"),
                           ("PET_RDZV_CONF", "a=1,b=2"), ("PET_STANDALONE", "")]


# --- v1 setCondition (A.6) ---------------------------------------------------------------------------

def test_v1_set_condition_semantics() -> None:
    t0, t1, t2 = T0, T0 + timedelta(seconds=5), T0 + timedelta(seconds=9)
    status: dict[str, Any] = {}
    assert cond.set_condition(status, "Created", "True", "PyTorchJobCreated", "c", t0)
    assert cond.set_condition(status, "Running", "True", "PyTorchJobRunning", "r", t0)
    assert not cond.set_condition(status, "Running", "True", "PyTorchJobRunning", "other text", t1)
    # Restarting replaces Running, goes last
    assert cond.set_condition(status, "Restarting", "True", "PyTorchJobRestarting", "x", t1)
    assert [c["type"] for c in status["conditions"]] == ["Created", "Restarting"]
    # Created re-set with a new reason but the same status: moved to the end, lastTransitionTime kept
    assert cond.set_condition(status, "Created", "True", "Other", "c2", t1)
    created = status["conditions"][-1]
    assert (created["type"], created["lastTransitionTime"], created["lastUpdateTime"]) == (
        "Created", STAMP0, "2026-01-01T12:00:05Z")
    assert cond.set_condition(status, "Running", "True", "PyTorchJobRunning", "r", t2)
    assert [c["type"] for c in status["conditions"]] == ["Created", "Running"]
    # Succeeded flips Running to False (timestamps untouched) and goes last
    assert cond.set_condition(status, "Succeeded", "True", "PyTorchJobSucceeded", "s", t2)
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("Created", "True"), ("Running", "False"), ("Succeeded", "True")]
    # once Failed=True exists nothing changes
    failed: dict[str, Any] = {}
    cond.set_condition(failed, "Running", "True", "PyTorchJobRunning", "r", t0)
    cond.set_condition(failed, "Failed", "True", "PyTorchJobFailed", "f", t1)
    frozen = copy.deepcopy(failed)
    assert not cond.set_condition(failed, "Running", "True", "PyTorchJobRunning", "r", t2)
    assert not cond.set_condition(failed, "Succeeded", "True", "PyTorchJobSucceeded", "s", t2)
    assert failed == frozen and failed["conditions"][0]["status"] == "False"


def test_mpi_set_condition_does_not_freeze_and_flips_failed() -> None:
    t0, t1 = T0, T0 + timedelta(seconds=5)
    status: dict[str, Any] = {}
    mpi_support.set_condition(status, "Running", "True", "MPIJobRunning", "r", t0)
    mpi_support.set_condition(status, "Failed", "True", "MPIJobEvicted", "1/2 workers are evicted", t0)
    assert mpi_support.set_condition(status, "Succeeded", "True", "MPIJobSucceeded", "s", t1)
    assert [(c["type"], c["status"]) for c in status["conditions"]] == [
        ("Running", "False"), ("Failed", "False"), ("Succeeded", "True")]
    assert mpi_support.set_condition(status, "Running", "True", "MPIJobRunning", "again", t1)
    assert status["conditions"][-1]["type"] == "Running"


# --- v1 status rules (A.5/A.6) -------------------------------------------------------------------------

def test_pending_not_counted_and_terminating_running_counts_failed() -> None:
    c = started(example("pytorch-sendrecv.yaml"))
    name = "pytorch-dist-basic-sendrecv"
    c.set_phase(f"{name}-master-0", "Running")
    c.set_phase(f"{name}-worker-0", "Running")
    c.pod(f"{name}-worker-1")["metadata"]["deletionTimestamp"] = STAMP0
    c.set_phase(f"{name}-worker-1", "Running")
    c.set_phase(f"{name}-worker-2", "Unknown")
    c.step()
    assert c.job is not None
    worker = c.job["status"]["replicaStatuses"]["Worker"]
    assert (worker.get("active"), worker.get("failed"), worker.get("succeeded")) == (1, 1, None)


def test_master_success_returns_before_a_failed_worker_fails_the_job() -> None:
    job = example("pytorch-simple.yaml")
    for rs in job["spec"]["pytorchReplicaSpecs"].values():
        rs["restartPolicy"] = "Never"
    c = started(job)
    c.set_phase("pytorch-simple-master-0", "Succeeded", 0)
    c.set_phase("pytorch-simple-worker-0", "Failed", 1)
    c.step()
    assert [t for t, s, _ in c.conditions() if s == "True"] == ["Created", "Succeeded"]


def test_no_master_non_elastic_needs_every_worker_and_no_master_env() -> None:
    job = example("pytorch-elastic-echo.yaml")
    del job["spec"]["elasticPolicy"]
    c = started(job)
    worker = c.pod("elastic-example-echo-worker-1")
    assert [n for n, _ in env(worker)] == ["PYTHONUNBUFFERED", "PET_NPROC_PER_NODE", "PET_NNODES"]
    assert "initContainers" not in worker["spec"]
    c.set_phase("elastic-example-echo-worker-0", "Succeeded", 0)
    c.set_phase("elastic-example-echo-worker-1", "Running")
    c.step()
    assert c.conditions()[-1] == ("Running", "True", "PyTorchJobRunning")
    c.set_phase("elastic-example-echo-worker-1", "Succeeded", 0)
    c.step()
    assert c.conditions()[-1] == ("Succeeded", "True", "PyTorchJobSucceeded")
    assert c.job is not None
    assert c.job["status"]["conditions"][-1]["message"] == "PyTorchJob default/elastic-example-echo successfully completed."


def test_env_is_appended_to_every_container_never_replaced() -> None:
    job = example("pytorch-simple.yaml")
    worker_spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    worker_spec["containers"][0]["env"] = [{"name": "MASTER_ADDR", "value": "mine"}]
    worker_spec["containers"].append({"name": "sidecar", "image": "busybox"})
    worker_spec["initContainers"] = [{"name": "user-init", "image": "busybox"}]
    pod = started(job).pod("pytorch-simple-worker-0")
    main = env(pod, 0)
    assert main[0] == ("MASTER_ADDR", "mine") and ("MASTER_ADDR", "pytorch-simple-master-0") in main
    assert env(pod, 1) == main[1:]
    assert [i["name"] for i in pod["spec"]["initContainers"]] == ["user-init", "init-pytorch"]
    assert "env" not in pod["spec"]["initContainers"][0]


def test_init_container_exact_and_only_on_workers() -> None:
    c = started(example("pytorch-simple.yaml"))
    assert "initContainers" not in c.pod("pytorch-simple-master-0")["spec"]
    (init,) = c.pod("pytorch-simple-worker-0")["spec"]["initContainers"]
    assert init == {
        "name": "init-pytorch", "image": "alpine:3.10", "imagePullPolicy": "IfNotPresent",
        "resources": {"limits": {"cpu": "100m", "memory": "20Mi"}, "requests": {"cpu": "50m", "memory": "10Mi"}},
        "command": ["sh", "-c", "err=1;for i in $(seq 100); do if nslookup pytorch-simple-master-0; "
                    "then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err"]}


def test_clean_pod_policy_running_deletes_running_and_pending_and_only_their_services() -> None:
    job = example("pytorch-sendrecv.yaml")
    job["spec"]["runPolicy"] = {"cleanPodPolicy": "Running"}
    c = started(job)
    name = "pytorch-dist-basic-sendrecv"
    c.set_phase(f"{name}-master-0", "Succeeded", 0)
    c.set_phase(f"{name}-worker-0", "Running")
    c.set_phase(f"{name}-worker-1", "Succeeded", 0)  # worker-2 stays Pending
    c.step()  # Succeeded
    del c.objects["pods"][f"{name}-worker-1"]  # its Service stays: no pod, no delete
    plan = c.step()  # finished pass: cleanup
    assert sorted(n for _, n in plan.deletes) == sorted([f"{name}-worker-0", f"{name}-worker-0",
                                                         f"{name}-worker-2", f"{name}-worker-2"])
    assert f"{name}-worker-1" in c.objects["services"] and f"{name}-master-0" in c.objects["pods"]


def test_suspend_deletes_every_pod_and_resume_message_and_start_time() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["runPolicy"] = {"cleanPodPolicy": "None"}  # ignored: the job is not finished
    c = started(job)
    c.set_phase("pytorch-simple-master-0", "Running")  # the worker stays Pending: deleted all the same
    c.step()
    assert c.job is not None
    assert c.job["status"]["replicaStatuses"]["Master"]["active"] == 1
    c.job["status"]["conditions"] = c.job["status"]["conditions"][:1]  # as if Running had never been set
    c.job["spec"]["runPolicy"]["suspend"] = True
    c.step()
    assert c.objects["pods"] == {} and c.objects["services"] == {}
    # never Running before: only Suspended is added
    assert c.conditions() == [("Created", "True", "PyTorchJobCreated"), ("Suspended", "True", "PyTorchJobSuspended")]
    assert c.job["status"]["replicaStatuses"]["Master"].get("active") is None  # active reset to 0
    c.advance(30)
    c.job["spec"]["runPolicy"]["suspend"] = False
    c.step()
    last = c.job["status"]["conditions"][-1]
    assert (last["type"], last["status"], last["reason"], last["message"]) == (
        "Suspended", "False", "PyTorchJobResumed", "PyTorchJob pytorch-simple is resumed.")
    assert c.job["status"]["startTime"] == "2026-01-01T12:00:30Z"
    assert ("Normal", "PyTorchJobResumed", "PyTorchJob pytorch-simple is resumed.") in c.events


# --- MPIJob v2beta1 (C.2/C.3) ------------------------------------------------------------------------

def test_mpi_running_requires_every_worker_running() -> None:
    sim = Sim(MPIJobReconciler(), yaml.safe_load(PI))
    sim.step()
    set_workers(sim, "Running", ready=True)
    sim.objects["pods"]["pi-worker-1"]["status"] = {"phase": "Pending"}
    launcher_pod(sim, "Running")
    sim.step()
    assert [t for t, _, _ in sim.conditions()] == ["Created"]
    set_workers(sim, "Running", ready=True)
    sim.step()
    assert sim.conditions()[-1] == ("Running", "True", "MPIJobRunning")


def test_mpi_hostfile_formats_and_launcher_env_per_implementation() -> None:
    job = mpi_support.with_defaults(yaml.safe_load(PI))
    job["spec"]["slotsPerWorker"] = 3
    for impl, line in (("OpenMPI", "pi-worker-0.pi.default.svc.cluster.local slots=3\n"),
                       ("Intel", "pi-worker-0.pi.default.svc.cluster.local:3\n"),
                       ("MPICH", "pi-worker-0.pi.default.svc.cluster.local:3\n")):
        job["spec"]["mpiImplementation"] = impl
        hostfile = mpi_support.config_data(job, [], "cluster.local")["hostfile"]
        assert hostfile.splitlines(keepends=True)[0] == line and hostfile.count("\n") == 2
    template, _ = mpi_support.launcher_template(job, {})
    assert env(template) == [("K_MPI_JOB_ROLE", "launcher"), ("HYDRA_HOST_FILE", "/etc/mpi/hostfile"),
                             ("HYDRA_LAUNCH_EXTRA_ARGS", "-o ConnectionAttempts=10"),
                             ("NVIDIA_VISIBLE_DEVICES", ""), ("NVIDIA_DRIVER_CAPABILITIES", "")]
    job["spec"]["mpiImplementation"] = "OpenMPI"
    job["spec"]["runLauncherAsWorker"] = True
    template, _ = mpi_support.launcher_template(job, {})
    assert env(template) == [("K_MPI_JOB_ROLE", "launcher"), ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
                             ("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),
                             ("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10"),
                             ("OMPI_MCA_orte_set_default_slots", "3")]
    assert mpi_support.config_data(job, [], "")["hostfile"].splitlines()[0] == "pi-launcher.pi.default.svc slots=3"


def test_master_port_not_found_aborts_the_pass_instead_of_writing_none() -> None:
    job = example("pytorch-simple.yaml")
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"] = "main"
    plan = PyTorchJobReconciler().render(Observed(job=job, children={}, now=T0))
    assert plan.creates == [] and plan.status is None
    assert plan.events[-1][:2] == ("Warning", "FailedCreatePod") and "port not found" in plan.events[-1][2]
    elastic = example("pytorch-elastic-echo.yaml")
    elastic["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "main"
    plan = PyTorchJobReconciler().render(Observed(job=elastic, children={}, now=T0))
    assert not [b for _, b in plan.creates if b["kind"] == "Pod"] and plan.status is None
    elastic["spec"]["elasticPolicy"]["rdzvPort"] = 29400  # an explicit port needs no lookup
    plan = PyTorchJobReconciler().render(Observed(job=elastic, children={}, now=T0))
    pod = next(b for _, b in plan.creates if b["kind"] == "Pod")
    assert ("PET_RDZV_ENDPOINT", "elastic-example-echo-worker-0:29400") in env(pod)


def test_no_pytorch_container_fails_service_creation_and_ends_the_pass() -> None:
    job = example("pytorch-elastic-echo.yaml")
    job["spec"]["elasticPolicy"]["rdzvPort"] = 29400
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "main"
    plan = PyTorchJobReconciler().render(Observed(job=job, children={}, now=T0))
    # the Worker pods were planned before the Service failed; the status is not written
    assert [b["kind"] for _, b in plan.creates] == ["Pod", "Pod"] and plan.status is None
    assert plan.events[-1][:2] == ("Warning", "FailedCreateService")
    assert plan.events[-1][2].startswith("failed to find the port")
