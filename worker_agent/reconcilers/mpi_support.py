"""MPIJob v2beta1 building blocks: defaults, the child objects' shapes, the SSH key pair, conditions.

Everything here is a pure function of the MPIJob (and, for the discover_hosts script, of the
Running worker Pods), reproducing mpi-operator v0.8 (KUBEFLOW.md C.1-C.3): the headless
``{job}`` Service, the ``{job}-config`` ConfigMap, the ``{job}-ssh`` Secret, the worker Pods and
the ``{job}-launcher`` batch Job, plus the v2beta1 ``setCondition`` (no Failed freeze, unlike v1).
``mpi.py`` holds the reconcile order and status rules that use them.
"""

from __future__ import annotations

import base64
import copy
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from federation.kinds import mpijob
from worker_agent.reconcilers.conditions import get_condition, rfc3339

API_VERSION = "kubeflow.org/v2beta1"
OPERATOR_NAME = "mpi-operator"
OPERATOR_NAME_LABEL = "training.kubeflow.org/operator-name"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
LAUNCHER = "launcher"
WORKER = "worker"
CONFIG_MOUNT_PATH = "/etc/mpi"
HOSTFILE = "hostfile"
DISCOVER_HOSTS = "discover_hosts.sh"
ROOT_SSH_PATH = mpijob.DEFAULT_SSH_AUTH_MOUNT_PATH
SSH_VOLUME = "ssh-auth"
CONFIG_VOLUME = "mpi-job-config"

SSH_VOLUME_ITEMS = [
    {"key": "ssh-privatekey", "path": "id_rsa"},
    {"key": "ssh-publickey", "path": "id_rsa.pub"},
    {"key": "ssh-publickey", "path": "authorized_keys"},
]
CONFIG_VOLUME_ITEMS = [
    {"key": HOSTFILE, "path": HOSTFILE, "mode": 0o444},
    {"key": DISCOVER_HOSTS, "path": DISCOVER_HOSTS, "mode": 0o555},
]


# --- defaults (mpi-operator SetDefaults_MPIJob) --------------------------------------------------

def with_defaults(job: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of the MPIJob with the v2beta1 defaults applied (never written back), an empty string
    counting as unset as in Go (the defaults themselves are ``federation.kinds.mpijob``'s)."""
    return mpijob.with_defaults(job, empty_is_unset=True)


def validate(job: dict[str, Any]) -> list[str]:
    """The validator's checks that matter to the reconciler (on a defaulted job)."""
    errors: list[str] = []
    spec = job["spec"]
    specs = spec.get("mpiReplicaSpecs") or {}
    launcher = specs.get("Launcher")
    if launcher is None:
        errors.append("spec.mpiReplicaSpecs[Launcher]: Required value: must have Launcher replica spec")
    elif launcher.get("replicas") != 1:
        errors.append("spec.mpiReplicaSpecs[Launcher].replicas: Invalid value: must be 1")
    worker = specs.get("Worker")
    if worker is not None and int(worker.get("replicas") or 0) < 1:
        errors.append("spec.mpiReplicaSpecs[Worker].replicas: Invalid value: must be greater than or equal to 1")
    for rtype, rspec in specs.items():
        if rspec is None:
            continue
        if rspec.get("restartPolicy") not in mpijob.RESTART_POLICIES:
            errors.append(f"spec.mpiReplicaSpecs[{rtype}].restartPolicy: Unsupported value: "
                          f"{rspec.get('restartPolicy')!r}")
        if not (((rspec.get("template") or {}).get("spec") or {}).get("containers")):
            errors.append(f"spec.mpiReplicaSpecs[{rtype}].template.spec.containers: Required value: "
                          "must define at least one container")
    if int(spec.get("slotsPerWorker") or 0) < 0:
        errors.append("spec.slotsPerWorker: Invalid value: must be greater than or equal to 0")
    return errors


# --- small accessors -------------------------------------------------------------------------------

def name_of(job: dict[str, Any]) -> str:
    return str(job["metadata"]["name"])


def namespace_of(job: dict[str, Any]) -> str:
    return str(job["metadata"].get("namespace") or "default")


def run_launcher_as_worker(job: dict[str, Any]) -> bool:
    return bool(job["spec"].get("runLauncherAsWorker"))


def is_suspended(job: dict[str, Any]) -> bool:
    return bool(job["spec"]["runPolicy"].get("suspend"))


def worker_replicas(job: dict[str, Any]) -> int:
    worker = job["spec"]["mpiReplicaSpecs"].get("Worker")
    return int(worker.get("replicas") or 0) if worker is not None else 0


def worker_name(job: dict[str, Any], index: int) -> str:
    return f"{name_of(job)}-worker-{index}"


def launcher_name(job: dict[str, Any]) -> str:
    return f"{name_of(job)}-launcher"


def default_labels(job_name: str, role: str) -> dict[str, str]:
    return {OPERATOR_NAME_LABEL: OPERATOR_NAME, JOB_NAME_LABEL: job_name, JOB_ROLE_LABEL: role}


def _fqdn(host: str, job: dict[str, Any], cluster_domain: str) -> str:
    fqdn = f"{host}.{name_of(job)}.{namespace_of(job)}.svc"
    return f"{fqdn}.{cluster_domain}" if cluster_domain else fqdn


# --- child objects -----------------------------------------------------------------------------------

def service(job: dict[str, Any], stamp: dict[str, str]) -> dict[str, Any]:
    """The single headless ``{job}`` Service fronting launcher and workers (no ports)."""
    name = name_of(job)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace_of(job), "labels": {"app": name, **stamp}},
        "spec": {
            "clusterIP": "None",
            "selector": {OPERATOR_NAME_LABEL: OPERATOR_NAME, JOB_NAME_LABEL: name},
            # true only with runLauncherAsWorker, so a not-yet-ready launcher does not deadlock
            "publishNotReadyAddresses": run_launcher_as_worker(job),
        },
    }


def config_data(job: dict[str, Any], running_workers: list[dict[str, Any]],
                cluster_domain: str = "") -> dict[str, str]:
    """``hostfile`` (every host, with slots) and ``discover_hosts.sh`` (Running workers only)."""
    slots = int(job["spec"]["slotsPerWorker"])
    impl = job["spec"]["mpiImplementation"]
    hosts = [launcher_name(job)] if run_launcher_as_worker(job) else []
    hosts += [worker_name(job, i) for i in range(worker_replicas(job))]
    lines = []
    for host in hosts:
        fqdn = _fqdn(host, job, cluster_domain)
        if impl == "OpenMPI":
            lines.append(f"{fqdn} slots={slots}\n")
        elif impl in ("Intel", "MPICH"):
            lines.append(f"{fqdn}:{slots}\n")
    script = "#!/bin/sh\n"
    if run_launcher_as_worker(job):
        script += f"echo {_fqdn(launcher_name(job), job, cluster_domain)}\n"
    for pod in sorted(running_workers, key=lambda p: str(p["metadata"]["name"])):
        script += f"echo {_fqdn(str(pod['metadata']['name']), job, cluster_domain)}\n"
    return {HOSTFILE: "".join(lines), DISCOVER_HOSTS: script}


def config_map(job: dict[str, Any], data: dict[str, str], stamp: dict[str, str]) -> dict[str, Any]:
    name = name_of(job)
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config", "namespace": namespace_of(job),
                     "labels": {"app": name, **stamp}},
        "data": data,
    }


def generate_ssh_key_pair() -> tuple[bytes, bytes]:
    """An ECDSA P-521 pair: ("EC PRIVATE KEY" PEM, authorized_keys line ending in a newline)."""
    key = ec.generate_private_key(ec.SECP521R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.TraditionalOpenSSL,
                                    serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                           serialization.PublicFormat.OpenSSH)
    return private_pem, public + b"\n"


def ssh_secret_data() -> dict[str, str]:
    """Secret ``data`` (base64) with a fresh key pair; called only when the Secret is created."""
    private_pem, public = generate_ssh_key_pair()
    return {"ssh-privatekey": base64.b64encode(private_pem).decode(),
            "ssh-publickey": base64.b64encode(public).decode()}


def ssh_secret(job: dict[str, Any], stamp: dict[str, str]) -> dict[str, Any]:
    name = name_of(job)
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth",
        "metadata": {"name": f"{name}-ssh", "namespace": namespace_of(job),
                     "labels": {"app": name, **stamp}},
        "data": ssh_secret_data(),
    }


def _setup_ssh(pod_spec: dict[str, Any], job: dict[str, Any]) -> None:
    mount_path = job["spec"]["sshAuthMountPath"]
    secret: dict[str, Any] = {"secretName": f"{name_of(job)}-ssh", "items": copy.deepcopy(SSH_VOLUME_ITEMS)}
    if mount_path == ROOT_SSH_PATH:
        secret["defaultMode"] = 0o600
    pod_spec.setdefault("volumes", []).append({"name": SSH_VOLUME, "secret": secret})
    pod_spec["containers"][0].setdefault("volumeMounts", []).append(
        {"name": SSH_VOLUME, "mountPath": mount_path})


def _restart_policy(rspec: dict[str, Any]) -> str:
    policy = str(rspec.get("restartPolicy") or "")
    return "Never" if policy == "ExitCode" else policy


def worker_pod(job: dict[str, Any], index: int, stamp: dict[str, str]) -> dict[str, Any]:
    """Worker Pod ``{job}-worker-{i}``: hostname + subdomain, sshd by default, the ssh-auth volume."""
    name = name_of(job)
    pod_name = worker_name(job, index)
    rspec = job["spec"]["mpiReplicaSpecs"]["Worker"]
    template = copy.deepcopy(rspec.get("template") or {})
    meta = template.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    labels.update(default_labels(name, WORKER))
    labels[REPLICA_INDEX_LABEL] = str(index + 1 if run_launcher_as_worker(job) else index)
    labels.update(stamp)
    spec = template.get("spec") or {}
    spec["hostname"] = pod_name
    spec["subdomain"] = name
    if spec.get("hostNetwork"):
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    # hard-coded upstream: Intel and MPICH workers reach the launcher through its short hostname
    search = f"{name}.{namespace_of(job)}.svc.cluster.local"
    dns = spec.setdefault("dnsConfig", {})
    dns["searches"] = [*(dns.get("searches") or []), search]
    spec["restartPolicy"] = _restart_policy(rspec)
    container = spec["containers"][0]
    if not container.get("command") and not container.get("args"):
        container["command"] = ["/usr/sbin/sshd", "-De"]
    container["env"] = [*(container.get("env") or []), {"name": "K_MPI_JOB_ROLE", "value": WORKER}]
    _setup_ssh(spec, job)
    metadata: dict[str, Any] = {"name": pod_name, "namespace": namespace_of(job), "labels": labels}
    if meta.get("annotations"):
        metadata["annotations"] = dict(meta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _launcher_env(job: dict[str, Any]) -> list[dict[str, str]]:
    hostfile = f"{CONFIG_MOUNT_PATH}/{HOSTFILE}"
    slots = str(int(job["spec"]["slotsPerWorker"]))
    env = [{"name": "K_MPI_JOB_ROLE", "value": LAUNCHER}]
    impl = job["spec"]["mpiImplementation"]
    if impl == "OpenMPI":
        env += [{"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "true"},
                {"name": "OMPI_MCA_orte_default_hostfile", "value": hostfile},
                {"name": "OMPI_MCA_plm_rsh_args", "value": "-o ConnectionAttempts=10"},
                {"name": "OMPI_MCA_orte_set_default_slots", "value": slots}]
    elif impl == "Intel":
        env += [{"name": "I_MPI_HYDRA_HOST_FILE", "value": hostfile},
                {"name": "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"},
                {"name": "I_MPI_PERHOST", "value": slots}]
    elif impl == "MPICH":
        env += [{"name": "HYDRA_HOST_FILE", "value": hostfile},
                {"name": "HYDRA_LAUNCH_EXTRA_ARGS", "value": "-o ConnectionAttempts=10"}]
    if not run_launcher_as_worker(job):
        # keeps a launcher from grabbing GPUs it was never scheduled for
        env += [{"name": "NVIDIA_VISIBLE_DEVICES", "value": ""},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": ""}]
    return env


def launcher_template(job: dict[str, Any], stamp: dict[str, str]) -> tuple[dict[str, Any], bool]:
    """The launcher pod template, and whether the user set a template restartPolicy (a warning)."""
    name = name_of(job)
    rspec = job["spec"]["mpiReplicaSpecs"]["Launcher"]
    template = copy.deepcopy(rspec.get("template") or {})
    meta = template.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    labels.update(default_labels(name, LAUNCHER))
    if run_launcher_as_worker(job):
        labels[REPLICA_INDEX_LABEL] = "0"
    labels.update(stamp)
    spec = template.get("spec") or {}
    spec["hostname"] = launcher_name(job)
    spec["subdomain"] = name
    if spec.get("hostNetwork"):
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    container = spec["containers"][0]
    container["env"] = [*(container.get("env") or []), *_launcher_env(job)]
    _setup_ssh(spec, job)
    overridden = bool(spec.get("restartPolicy"))
    spec["restartPolicy"] = _restart_policy(rspec)
    spec.setdefault("volumes", []).append({
        "name": CONFIG_VOLUME,
        "configMap": {"name": f"{name}-config", "items": copy.deepcopy(CONFIG_VOLUME_ITEMS)}})
    container.setdefault("volumeMounts", []).append({"name": CONFIG_VOLUME, "mountPath": CONFIG_MOUNT_PATH})
    out_meta: dict[str, Any] = {"labels": labels}
    if meta.get("annotations"):
        out_meta["annotations"] = dict(meta["annotations"])
    return {"metadata": out_meta, "spec": spec}, overridden


def launcher_job(job: dict[str, Any], template: dict[str, Any], stamp: dict[str, str]) -> dict[str, Any]:
    """The ``{job}-launcher`` batch/v1 Job; the cluster's Job controller runs its pod."""
    run_policy = job["spec"]["runPolicy"]
    spec: dict[str, Any] = {"template": template, "podReplacementPolicy": "Failed"}
    for field_name in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if run_policy.get(field_name) is not None:
            spec[field_name] = run_policy[field_name]
    if is_suspended(job):
        spec["suspend"] = True
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": launcher_name(job), "namespace": namespace_of(job),
                     "labels": {"app": name_of(job), **stamp}},
        "spec": spec,
    }


# --- v2beta1 conditions (mpi_job_controller_status.go) ----------------------------------------------

def set_condition(status: dict[str, Any], ctype: str, cstatus: str, reason: str, message: str,
                  now: datetime) -> bool:
    """Upstream ``setCondition``: same status and reason is a no-op; the new one goes last;
    Succeeded/Failed flip Running and an older Failed to False. True when the list changed."""
    current = get_condition(status, ctype)
    if current is not None and current.get("status") == cstatus and current.get("reason") == reason:
        return False
    stamp = rfc3339(now)
    condition = {"type": ctype, "status": cstatus, "reason": reason, "message": message,
                 "lastUpdateTime": stamp, "lastTransitionTime": stamp}
    if current is not None and current.get("status") == cstatus:
        condition["lastTransitionTime"] = current.get("lastTransitionTime", stamp)
    kept: list[dict[str, Any]] = []
    for cond in status.get("conditions") or []:
        other = cond.get("type")
        if other == ctype:
            continue
        if (ctype, other) in (("Restarting", "Running"), ("Running", "Restarting")):
            continue
        if ctype in ("Failed", "Succeeded") and other in ("Running", "Failed"):
            cond = {**cond, "status": "False"}
        kept.append(cond)
    status["conditions"] = [*kept, condition]
    return True


def truncate_message(message: str, limit: int = 1024) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."
