"""MPIJob v2beta1 reconciler: mpi-operator's sync loop as one pure ``render`` (KUBEFLOW.md C.2/C.3).

Order of one pass, as upstream: defaults in memory; skip jobs managed elsewhere; Created on the
first pass; a finished job with completionTime only runs cleanPodPolicy; startTime; while the
launcher Job is unfinished, the ``{job}`` Service, ``{job}-config`` ConfigMap, ``{job}-ssh`` Secret
and (unless suspended) the worker Pods, then the launcher Job (AtStartup, or once every worker
is Ready); launcher suspend kept in step with the MPIJob; workers deleted while suspended; then
the status rules. Deliberate differences: a Failed job always gets completionTime (the Evicted
path too), and the launcher's activeDeadlineSeconds is re-checked on time via ``requeue_after``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from federation import labels as mkd_labels
from federation.kinds.mpijob import MPIJOB
from federation.kube import CONFIGMAPS, JOBS, PODS, SECRETS, SERVICES, Resource
from worker_agent.reconcilers import mpi_support as mpi
from worker_agent.reconcilers.base import Observed, Plan, Reconciler
from worker_agent.reconcilers.conditions import get_condition, is_finished, parse_time, rfc3339
from worker_agent.reconcilers.jobset_support import child_stamp, controlled_by

OWNER_UID_LABEL = mkd_labels.OWNER_UID
"""Stamped on every child (and pod template) so one selector lists all of them."""
CREATED, RUNNING, SUCCEEDED, FAILED, SUSPENDED = "Created", "Running", "Succeeded", "Failed", "Suspended"
ERR_RESOURCE_EXISTS = "ErrResourceExists"
MESSAGE_RESOURCE_EXISTS = 'Resource "{name}" of Kind "{kind}" already exists and is not managed by MPIJob'
RETRY_SECONDS = 5.0
POD_LAG_SECONDS = 5.0


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _job_condition(job: Mapping[str, Any] | None, ctype: str) -> dict[str, Any] | None:
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def _job_true(job: Mapping[str, Any] | None, ctype: str) -> bool:
    cond = _job_condition(job, ctype)
    return cond is not None and cond.get("status") == "True"


class _Blocked(Exception):
    """A child of our name exists but is not ours: upstream raises and retries."""


class MPIJobReconciler(Reconciler):
    """Reconciler for ``kubeflow.org/v2beta1`` MPIJob."""

    kind = MPIJOB.name
    children: tuple[Resource, ...] = (SERVICES, CONFIGMAPS, SECRETS, PODS, JOBS)

    def __init__(self, cluster_domain: str = "") -> None:
        self.cluster_domain = cluster_domain

    def child_selector(self, job: Mapping[str, Any]) -> str:
        return f"{OWNER_UID_LABEL}={(job.get('metadata') or {}).get('uid', '')}"

    def render(self, observed: Observed) -> Plan:
        raw = observed.job
        spec = raw.get("spec") or {}
        managed_by = (spec.get("runPolicy") or {}).get("managedBy")
        if managed_by is not None and managed_by != mkd_labels.MPI_OPERATOR:
            return Plan()  # another controller owns it: write nothing, not even status
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            return Plan()
        job = mpi.with_defaults(raw)
        plan = Plan()
        errors = mpi.validate(job)
        if errors:
            plan.events.append(("Warning", "ValidationError", mpi.truncate_message(
                "Found validation errors: " + ", ".join(errors))))
            return plan
        try:
            return _Pass(self, job, observed, plan).run()
        except _Blocked:
            plan.status = None
            plan.requeue_after = RETRY_SECONDS
            return plan


class _Pass:
    """One reconcile pass; mutates ``status`` and fills ``plan``."""

    def __init__(self, owner: MPIJobReconciler, job: dict[str, Any], observed: Observed, plan: Plan) -> None:
        self.owner = owner
        self.job = job
        self.name = mpi.name_of(job)
        self.uid = str(job["metadata"].get("uid") or "")
        self.now = observed.now
        self.plan = plan
        self.stamp = child_stamp(job, OWNER_UID_LABEL)
        self.old_status = copy.deepcopy(job.get("status") or {})
        self.status = copy.deepcopy(self.old_status)
        self.by_name: dict[str, dict[str, dict[str, Any]]] = {
            plural: {str(o["metadata"]["name"]): o for o in objs}
            for plural, objs in observed.children.items()}

    # -- helpers ---------------------------------------------------------------------------------
    def _get(self, res: Resource, name: str) -> dict[str, Any] | None:
        return self.by_name.get(res.plural, {}).get(name)

    def _owned_or_block(self, obj: dict[str, Any], kind: str) -> None:
        if not controlled_by(obj, self.uid):
            msg = MESSAGE_RESOURCE_EXISTS.format(name=obj["metadata"]["name"], kind=kind)
            self.plan.events.append(("Warning", ERR_RESOURCE_EXISTS, msg))
            raise _Blocked(msg)

    def _worker_pods_all(self) -> list[dict[str, Any]]:
        return [p for p in self.by_name.get(PODS.plural, {}).values()
                if (p["metadata"].get("labels") or {}).get(mpi.JOB_ROLE_LABEL) == mpi.WORKER
                and (p["metadata"].get("labels") or {}).get(mpi.JOB_NAME_LABEL) == self.name]

    # -- the pass --------------------------------------------------------------------------------
    def run(self) -> Plan:
        job, plan = self.job, self.plan
        if not self.status.get("conditions"):
            msg = f"MPIJob {mpi.namespace_of(job)}/{self.name} is created."
            mpi.set_condition(self.status, CREATED, "True", "MPIJobCreated", msg, self.now)
            plan.events.append(("Normal", "MPIJobCreated", msg))

        if is_finished(self.status) and self.status.get("completionTime"):
            if job["spec"]["runPolicy"]["cleanPodPolicy"] in ("All", "Running"):
                self._clean_up_workers()
            return self._finish()

        if not self.status.get("startTime") and not mpi.is_suspended(job):
            self.status["startTime"] = rfc3339(self.now)

        launcher = self._get(JOBS, mpi.launcher_name(job))
        if launcher is not None:
            self._owned_or_block(launcher, "Job")
        workers: list[dict[str, Any]] = []
        done = launcher is not None and (_job_true(launcher, "Complete") or _job_true(launcher, "Failed"))
        if not done:
            self._service()
            self._config_map()
            self._secret()
            if not mpi.is_suspended(job):
                workers = self._workers()
            if launcher is None:
                ready = sum(1 for w in workers if _pod_ready(w))
                if job["spec"]["launcherCreationPolicy"] == "AtStartup" or ready == len(workers):
                    template, overridden = mpi.launcher_template(job, self.stamp)
                    if overridden:
                        plan.events.append(("Warning", "SetPodTemplateRestartPolicy",
                                            "Restart policy in pod template overridden by restart "
                                            "policy in replica spec"))
                    launcher = mpi.launcher_job(job, template, self.stamp)
                    plan.creates.append((JOBS, launcher))
        if launcher is not None and "uid" in launcher["metadata"]:
            self._sync_launcher_suspend(launcher)
        if mpi.is_suspended(job):
            self._clean_up_workers()
        self._update_status(launcher, workers)
        self._deadline_requeue(launcher)
        return self._finish()

    def _finish(self) -> Plan:
        if self.status != self.old_status:
            self.plan.status = self.status
        return self.plan

    def _service(self) -> None:
        desired = mpi.service(self.job, self.stamp)
        current = self._get(SERVICES, self.name)
        if current is None:
            self.plan.creates.append((SERVICES, desired))
            return
        self._owned_or_block(current, "Service")
        cur_spec = current.get("spec") or {}
        if (cur_spec.get("selector") != desired["spec"]["selector"]
                or bool(cur_spec.get("publishNotReadyAddresses")) != desired["spec"]["publishNotReadyAddresses"]):
            updated = copy.deepcopy(current)
            updated["spec"]["selector"] = desired["spec"]["selector"]
            updated["spec"]["publishNotReadyAddresses"] = desired["spec"]["publishNotReadyAddresses"]
            self.plan.updates.append((SERVICES, updated))

    def _config_map(self) -> None:
        running = [p for p in self._worker_pods_all() if _phase(p) == "Running"]
        data = mpi.config_data(self.job, running, self.owner.cluster_domain)
        current = self._get(CONFIGMAPS, f"{self.name}-config")
        if current is None:
            self.plan.creates.append((CONFIGMAPS, mpi.config_map(self.job, data, self.stamp)))
            return
        self._owned_or_block(current, "ConfigMap")
        if (current.get("data") or {}) != data:
            updated = copy.deepcopy(current)
            updated["data"] = data
            self.plan.updates.append((CONFIGMAPS, updated))

    def _secret(self) -> None:
        current = self._get(SECRETS, f"{self.name}-ssh")
        if current is None:
            # the only place a key pair is generated: never regenerated while the Secret exists
            self.plan.creates.append((SECRETS, mpi.ssh_secret(self.job, self.stamp)))
            return
        self._owned_or_block(current, "Secret")
        if sorted((current.get("data") or {}).keys()) != ["ssh-privatekey", "ssh-publickey"]:
            updated = copy.deepcopy(current)
            updated["data"] = mpi.ssh_secret_data()
            self.plan.updates.append((SECRETS, updated))

    def _workers(self) -> list[dict[str, Any]]:
        replicas = mpi.worker_replicas(self.job)
        if self.job["spec"]["mpiReplicaSpecs"].get("Worker") is None:
            return []
        existing = self._worker_pods_all()
        if len(existing) > replicas:
            prefix = f"{self.name}-worker-"
            for pod in existing:
                pod_name = str(pod["metadata"]["name"])
                # the index comes from the name: with runLauncherAsWorker the replica-index label
                # is shifted by one and would delete the last live worker
                suffix = pod_name[len(prefix):] if pod_name.startswith(prefix) else ""
                if suffix.isdigit() and int(suffix) >= replicas:
                    self.plan.deletes.append((PODS, pod_name))
        pods: list[dict[str, Any]] = []
        for i in range(replicas):
            current = self._get(PODS, mpi.worker_name(self.job, i))
            if current is None:
                current = mpi.worker_pod(self.job, i, self.stamp)
                self.plan.creates.append((PODS, current))
            else:
                self._owned_or_block(current, "Pod")
            pods.append(current)
        return pods

    def _sync_launcher_suspend(self, launcher: dict[str, Any]) -> None:
        suspended = mpi.is_suspended(self.job)
        launcher_suspended = bool((launcher.get("spec") or {}).get("suspend"))
        if not suspended and launcher_suspended:
            updated = copy.deepcopy(launcher)
            desired, _ = mpi.launcher_template(self.job, self.stamp)
            tmpl = updated["spec"].setdefault("template", {})
            tmeta = tmpl.setdefault("metadata", {})
            tmeta["labels"] = {**(tmeta.get("labels") or {}), **desired["metadata"].get("labels", {})}
            if desired["metadata"].get("annotations") or tmeta.get("annotations"):
                tmeta["annotations"] = {**(tmeta.get("annotations") or {}),
                                        **desired["metadata"].get("annotations", {})}
            tspec = tmpl.setdefault("spec", {})
            for key in ("nodeSelector", "tolerations", "schedulingGates"):
                if desired["spec"].get(key) is not None:
                    tspec[key] = desired["spec"][key]
                else:
                    tspec.pop(key, None)
            updated["spec"]["suspend"] = False
            # only the scheduling directives change (KEP-2926): allowed on a suspended Job whose
            # startTime the Job controller cleared when it was suspended
            self.plan.updates.append((JOBS, updated))
        elif suspended and not launcher_suspended:
            updated = copy.deepcopy(launcher)
            updated["spec"]["suspend"] = True
            self.plan.updates.append((JOBS, updated))

    def _clean_up_workers(self) -> None:
        policy = self.job["spec"]["runPolicy"]["cleanPodPolicy"]
        for i in range(mpi.worker_replicas(self.job)):
            pod = self._get(PODS, mpi.worker_name(self.job, i))
            if pod is None:
                continue
            if not controlled_by(pod, self.uid):
                self._owned_or_block(pod, "Pod")
            if policy == "Running" and _phase(pod) not in ("Running", "Pending"):
                continue
            if (PODS, pod["metadata"]["name"]) not in self.plan.deletes:
                self.plan.deletes.append((PODS, str(pod["metadata"]["name"])))
        statuses = self.status.setdefault("replicaStatuses", {})
        statuses["Worker"] = {}

    def _launcher_pods(self, launcher: dict[str, Any]) -> list[dict[str, Any]]:
        launcher_uid = launcher["metadata"].get("uid")
        if not launcher_uid:
            return []
        return [p for p in self.by_name.get(PODS.plural, {}).values() if controlled_by(p, str(launcher_uid))]

    def _update_status(self, launcher: dict[str, Any] | None, workers: list[dict[str, Any]]) -> None:
        job, status, now, plan = self.job, self.status, self.now, self.plan
        ns_name = f"{mpi.namespace_of(job)}/{self.name}"
        if mpi.is_suspended(job):
            if mpi.set_condition(status, SUSPENDED, "True", "MPIJobSuspended", "MPIJob suspended", now):
                plan.events.append(("Normal", "MPIJobSuspended", "MPIJob suspended"))
        elif get_condition(status, SUSPENDED) is not None:
            if mpi.set_condition(status, SUSPENDED, "False", "MPIJobResumed", "MPIJob resumed", now):
                plan.events.append(("Normal", "MPIJobResumed", "MPIJob resumed"))
                status["startTime"] = rfc3339(now)
        replica_statuses = status.setdefault("replicaStatuses", {})
        launcher_running = 0
        if launcher is not None:
            pods = self._launcher_pods(launcher)
            launcher_running = sum(1 for p in pods if _phase(p) == "Running")
            entry: dict[str, int] = {}
            failed = int((launcher.get("status") or {}).get("failed") or 0)
            if failed:
                entry["failed"] = failed
            replica_statuses["Launcher"] = entry
            if _job_true(launcher, "Complete"):
                entry["succeeded"] = 1
                msg = f"MPIJob {ns_name} successfully completed."
                plan.events.append(("Normal", "MPIJobSucceeded", msg))
                if not status.get("completionTime"):
                    status["completionTime"] = ((launcher.get("status") or {}).get("completionTime")
                                                or rfc3339(now))
                mpi.set_condition(status, SUCCEEDED, "True", "MPIJobSucceeded", msg, now)
            elif _job_true(launcher, "Failed"):
                self._failed_from_launcher(launcher, pods)
            elif launcher_running:
                entry["active"] = launcher_running
        running = evicted = 0
        worker_entry: dict[str, int] = {}
        for pod in workers:
            phase = _phase(pod)
            if phase == "Failed":
                worker_entry["failed"] = worker_entry.get("failed", 0) + 1
                if (pod.get("status") or {}).get("reason") == "Evicted":
                    evicted += 1
            elif phase == "Succeeded":
                worker_entry["succeeded"] = worker_entry.get("succeeded", 0) + 1
            elif phase == "Running":
                running += 1
                worker_entry["active"] = worker_entry.get("active", 0) + 1
        replica_statuses["Worker"] = worker_entry
        if evicted:
            msg = f"{evicted}/{len(workers)} workers are evicted"
            mpi.set_condition(status, FAILED, "True", "MPIJobEvicted", msg, now)
            plan.events.append(("Warning", "MPIJobEvicted", msg))
            if not status.get("completionTime"):
                status["completionTime"] = rfc3339(now)  # deliberate: a Failed job always has one
        if mpi.is_suspended(job):
            mpi.set_condition(status, RUNNING, "False", "MPIJobSuspended", f"MPIJob {ns_name} is suspended.", now)
        elif is_finished(status):
            if get_condition(status, RUNNING) is None:
                stamp = status.get("completionTime") or rfc3339(now)
                status.setdefault("conditions", []).append({
                    "type": RUNNING, "status": "False", "reason": "MPIJobRunning",
                    "message": f"MPIJob {ns_name} is finished but Running condition was never set.",
                    "lastUpdateTime": stamp, "lastTransitionTime": stamp})
        elif launcher is not None and launcher_running >= 1 and running == len(workers):
            msg = f"MPIJob {ns_name} is running."
            # upstream records the Event on every pass and the recorder folds repeats into one
            # Event; emitting it on the transition only leaves the same Event behind
            if mpi.set_condition(status, RUNNING, "True", "MPIJobRunning", msg, now):
                plan.events.append(("Normal", "MPIJobRunning", f"MPIJob {ns_name} is running"))

    def _failed_from_launcher(self, launcher: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        cond = _job_condition(launcher, "Failed") or {}
        reason = str(cond.get("reason") or "") or "MPIJobFailed"
        msg = str(cond.get("message") or "") or f"MPIJob {mpi.namespace_of(self.job)}/{self.name} has failed"
        if reason == "BackoffLimitExceeded":
            failed = [p for p in pods if _phase(p) == "Failed"]
            since = parse_time(cond.get("lastTransitionTime"))
            counted = int((launcher.get("status") or {}).get("failed") or 0)
            if (not failed and counted and since is not None
                    and (self.now - since).total_seconds() < POD_LAG_SECONDS):
                # the Job counted a failed pod the pod watch has not shown yet: wait briefly for it
                # (upstream appends its reason) rather than freeze a reason without it
                self.plan.requeue_after = 0.5
                return
            if failed:
                last = max(failed, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
                reason += "/" + str((last.get("status") or {}).get("reason") or "")
                msg = mpi.truncate_message(msg + ": " + str((last.get("status") or {}).get("message") or ""))
        self.plan.events.append(("Warning", reason, msg))
        if not self.status.get("completionTime"):
            self.status["completionTime"] = rfc3339(self.now)
        mpi.set_condition(self.status, FAILED, "True", reason, msg, self.now)

    def _deadline_requeue(self, launcher: dict[str, Any] | None) -> None:
        """Re-read the launcher when its activeDeadlineSeconds falls due (the Job controller fails it)."""
        deadline = self.job["spec"]["runPolicy"].get("activeDeadlineSeconds")
        if deadline is None or launcher is None or is_finished(self.status) or mpi.is_suspended(self.job):
            return
        started = parse_time((launcher.get("status") or {}).get("startTime")) or parse_time(
            self.status.get("startTime"))
        if started is None:
            return
        due = started + timedelta(seconds=int(deadline))
        self.plan.requeue_after = max((due - self.now).total_seconds(), 0.0) + 1.0
