"""JobSet reconciler: the jobset controller's part as one pure ``render`` (KUBEFLOW.md D.4).

The webhook defaults are applied in memory (DNS hostnames and publishNotReadyAddresses on,
completionMode Indexed, pod restartPolicy OnFailure, successPolicy All, replicas 1). A pass, as
upstream: replicatedJobsStatus from the child Jobs; a finished JobSet deletes its active Jobs and
honours ttlSecondsAfterFinished; Jobs of an older restart attempt are deleted; a failed Job runs
the failure policy (fail, or restart everything with restart-attempt+1 until maxRestarts);
enough successful Jobs complete it; otherwise the one headless Service named after the subdomain
is created if absent, missing child Jobs ``{jobset}-{rJob}-{i}`` are created (dependsOn honoured),
and suspend/resume is pushed down to the Jobs. The batch Jobs themselves run under the
cluster's Job controller.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from federation import labels as mkd_labels
from federation.kinds.batchjob import job_pod_count
from federation.kinds.jobset import JOBSET
from federation.kube import JOBS, SERVICES, Resource
from worker_agent.reconcilers.base import Observed, Plan, Reconciler
from worker_agent.reconcilers.conditions import parse_time
from worker_agent.reconcilers.jobset_support import (
    child_stamp,
    controlled_by,
    job_finished,
    set_condition,
    with_defaults,
)

GROUP = "jobset.sigs.k8s.io"
"""Prefix of the label and annotation keys; the API group itself is ``jobset.x-k8s.io``."""
JOBSETS = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
OWNER_UID_LABEL = mkd_labels.OWNER_UID

JOBSET_NAME = f"{GROUP}/jobset-name"
JOBSET_UID = f"{GROUP}/jobset-uid"
RJOB_NAME = f"{GROUP}/replicatedjob-name"
RJOB_REPLICAS = f"{GROUP}/replicatedjob-replicas"
GLOBAL_REPLICAS = f"{GROUP}/global-replicas"
JOB_INDEX = f"{GROUP}/job-index"
JOB_KEY = f"{GROUP}/job-key"
JOB_GLOBAL_INDEX = f"{GROUP}/job-global-index"
GROUP_NAME = f"{GROUP}/group-name"
GROUP_REPLICAS = f"{GROUP}/group-replicas"
JOB_GROUP_INDEX = f"{GROUP}/job-group-index"
RESTART_ATTEMPT = f"{GROUP}/restart-attempt"

COMPLETED, FAILED, SUSPENDED, RESTARTING = "Completed", "Failed", "Suspended", "Restarting"
FAILED_JOBS_MESSAGE = "jobset failed due to one or more job failures"
MAX_RESTARTS_MESSAGE = "jobset failed due to reaching max number of restarts"
COMPLETED_MESSAGE = "jobset completed successfully"
RESTART_ACTION_MESSAGE = "applying RestartJobSet failure policy action"
RETRY_SECONDS = 1.0


def _first_failed(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    def failed_at(job: dict[str, Any]) -> str:
        for cond in (job.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Failed" and cond.get("status") == "True":
                return str(cond.get("lastTransitionTime") or "")
        return ""
    return min(jobs, key=lambda j: (failed_at(j), str(j["metadata"]["name"])))


def subdomain(js: Mapping[str, Any]) -> str:
    return str(((js.get("spec") or {}).get("network") or {}).get("subdomain") or js["metadata"]["name"])


class JobSetReconciler(Reconciler):
    """Reconciler for ``jobset.x-k8s.io/v1alpha2`` JobSet."""

    kind = JOBSET.name
    children: tuple[Resource, ...] = (JOBS, SERVICES)

    def child_selector(self, job: Mapping[str, Any]) -> str:
        return f"{OWNER_UID_LABEL}={(job.get('metadata') or {}).get('uid', '')}"

    def render(self, observed: Observed) -> Plan:
        raw = observed.job
        managed_by = (raw.get("spec") or {}).get("managedBy")
        if managed_by is not None and managed_by != mkd_labels.JOBSET_CONTROLLER:
            return Plan()
        if (raw.get("metadata") or {}).get("deletionTimestamp"):
            return Plan()
        return _Pass(with_defaults(raw), observed).run()


class _Pass:
    def __init__(self, js: dict[str, Any], observed: Observed) -> None:
        self.js = js
        self.name = str(js["metadata"]["name"])
        self.namespace = str(js["metadata"].get("namespace") or "default")
        self.uid = str(js["metadata"].get("uid") or "")
        self.now = observed.now
        self.plan = Plan()
        self.old_status = copy.deepcopy(js.get("status") or {})
        self.status = copy.deepcopy(self.old_status)
        self.status.setdefault("restarts", 0)
        self.stamp = child_stamp(js, OWNER_UID_LABEL)
        self.services = {str(s["metadata"]["name"]): s for s in observed.children.get(SERVICES.plural, [])}
        self.rjobs: list[dict[str, Any]] = js["spec"]["replicatedJobs"]
        self.suspended = bool(js["spec"].get("suspend"))
        self.active: list[dict[str, Any]] = []
        self.successful: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self.previous: list[dict[str, Any]] = []
        restarts = int(self.status["restarts"])
        for job in observed.children.get(JOBS.plural, []):
            if not controlled_by(job, self.uid):
                continue
            try:
                attempt = int((job["metadata"].get("labels") or {}).get(RESTART_ATTEMPT, ""))
            except ValueError:
                attempt = -1
            if attempt < restarts:
                self.previous.append(job)
                continue
            finished = job_finished(job)
            {"": self.active, "Failed": self.failed, "Complete": self.successful}[finished].append(job)

    def run(self) -> Plan:
        self.status["replicatedJobsStatus"] = self._replicated_job_statuses()
        if self._finished():
            self._delete(self.active)
            self._ttl()
            return self._done()
        self._delete(self.previous)
        if not self.suspended and self._all_ready():
            self._set(RESTARTING, "False", "JobsReady", "all jobs are ready")
        if self.failed:
            self._failure_policy()
            return self._done()
        if self.successful and self._success_policy():
            return self._done()
        self._headless_service()
        self._create_jobs()
        if self.suspended:
            for job in self.active:
                if not (job.get("spec") or {}).get("suspend"):
                    updated = copy.deepcopy(job)
                    updated["spec"]["suspend"] = True
                    self.plan.updates.append((JOBS, updated))
            self._set(SUSPENDED, "True", "SuspendedJobs", "jobset is suspended")
            self._set(RESTARTING, "False", "JobSetSuspended", "jobset is suspended")
        else:
            self._resume()
        return self._done()

    # -- status ------------------------------------------------------------------------------------
    def _done(self) -> Plan:
        if self.previous and self.plan.requeue_after is None:
            self.plan.requeue_after = RETRY_SECONDS  # recreate once the old attempt's Jobs are gone
        if self.status != self.old_status:
            self.plan.status = self.status
        return self.plan

    def _set(self, ctype: str, cstatus: str, reason: str, message: str, event_type: str = "Normal") -> None:
        if set_condition(self.status, ctype, cstatus, reason, message, self.now):
            self.plan.events.append((event_type, reason, message))

    def _finished(self) -> bool:
        return any(c.get("type") in (COMPLETED, FAILED) and c.get("status") == "True"
                   for c in self.status.get("conditions") or [])

    def _replicated_job_statuses(self) -> list[dict[str, Any]]:
        counts = {r["name"]: {"name": r["name"], "ready": 0, "succeeded": 0, "failed": 0,
                              "active": 0, "suspended": 0} for r in self.rjobs}
        for job in self.active:
            entry = counts.get((job["metadata"].get("labels") or {}).get(RJOB_NAME, ""))
            if entry is None:
                continue
            jspec, jstatus = job.get("spec") or {}, job.get("status") or {}
            pods = job_pod_count(jspec)
            if int(jstatus.get("succeeded") or 0) + int(jstatus.get("ready") or 0) >= pods:
                entry["ready"] += 1
            if int(jstatus.get("active") or 0) > 0:
                entry["active"] += 1
            if jspec.get("suspend"):
                entry["suspended"] += 1
        for bucket, key in ((self.successful, "succeeded"), (self.failed, "failed")):
            for job in bucket:
                entry = counts.get((job["metadata"].get("labels") or {}).get(RJOB_NAME, ""))
                if entry is not None:
                    entry[key] += 1
        return list(counts.values())

    def _all_ready(self) -> bool:
        total = sum(int(r["replicas"]) for r in self.rjobs)
        ready = sum(int(s["ready"]) + int(s["succeeded"]) for s in self.status["replicatedJobsStatus"])
        return total == ready

    # -- policies ----------------------------------------------------------------------------------
    def _fail(self, reason: str, message: str) -> None:
        self._set(FAILED, "True", reason, message, "Warning")
        self._set(RESTARTING, "False", "JobSetFailed", "jobset failed")
        self.status["terminalState"] = FAILED

    def _failure_policy(self) -> None:
        first = str(_first_failed(self.failed)["metadata"]["name"])
        policy = self.js["spec"].get("failurePolicy")
        if policy is None:
            self._fail("FailedJobs", f"{FAILED_JOBS_MESSAGE} (first failed job: {first})")
            return
        # rules are not interpreted: the default action (RestartJobSet) applies to every failure
        if int(self.status.get("restartsCountTowardsMax") or 0) >= int(policy.get("maxRestarts") or 0):
            self._fail("ReachedMaxRestarts", f"{MAX_RESTARTS_MESSAGE} (first failed job: {first})")
            return
        message = f"{RESTART_ACTION_MESSAGE} (first failed job: {first})"
        self.status["restarts"] = int(self.status["restarts"]) + 1
        self.status["restartsCountTowardsMax"] = int(self.status.get("restartsCountTowardsMax") or 0) + 1
        self._set(RESTARTING, "True", "DefaultFailurePolicy", message, "Warning")
        self.plan.events.append(("Warning", "RestartJobSetFailurePolicyAction", message))
        self.plan.requeue_after = RETRY_SECONDS

    def _success_policy(self) -> bool:
        policy = self.js["spec"]["successPolicy"]
        targets = policy.get("targetReplicatedJobs") or []
        matching = sum(1 for j in self.successful
                       if not targets or (j["metadata"].get("labels") or {}).get(RJOB_NAME) in targets)
        if policy.get("operator") == "Any":
            expected = 1
        else:
            expected = sum(int(r["replicas"]) for r in self.rjobs if not targets or r["name"] in targets)
        if matching < expected:
            return False
        self._set(COMPLETED, "True", "AllJobsCompleted", COMPLETED_MESSAGE)
        self._set(RESTARTING, "False", "JobSetCompleted", COMPLETED_MESSAGE)
        self.status["terminalState"] = COMPLETED
        return True

    def _ttl(self) -> None:
        ttl = self.js["spec"].get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        finished_at = None
        for cond in self.status.get("conditions") or []:
            if cond.get("type") in (COMPLETED, FAILED) and cond.get("status") == "True":
                finished_at = parse_time(cond.get("lastTransitionTime"))
        if finished_at is None:
            return
        due = finished_at + timedelta(seconds=int(ttl))
        if self.now >= due:
            self.plan.delete_job = True
        else:
            self.plan.requeue_after = (due - self.now).total_seconds()

    # -- children ------------------------------------------------------------------------------------
    def _delete(self, jobs: list[dict[str, Any]]) -> None:
        for job in jobs:
            if not job["metadata"].get("deletionTimestamp"):
                self.plan.deletes.append((JOBS, str(job["metadata"]["name"])))

    def _headless_service(self) -> None:
        network = self.js["spec"]["network"]
        if not network.get("enableDNSHostnames"):
            return
        name = subdomain(self.js)
        if name in self.services:
            return
        self.plan.creates.append((SERVICES, {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": self.namespace, "labels": dict(self.stamp)},
            "spec": {"clusterIP": "None", "selector": {JOBSET_NAME: self.name},
                     "publishNotReadyAddresses": bool(network.get("publishNotReadyAddresses", True))},
        }))

    def _dependencies_met(self, rjob: dict[str, Any]) -> bool:
        replicas = {r["name"]: int(r["replicas"]) for r in self.rjobs}
        statuses = {s["name"]: s for s in self.status["replicatedJobsStatus"]}
        for dep in rjob.get("dependsOn") or []:
            actual = statuses.get(dep.get("name"))
            if actual is None:
                return False
            want = replicas.get(dep.get("name"), 0)
            if dep.get("status") == "Complete" and want != actual["succeeded"]:
                return False
            if dep.get("status") == "Ready" and want != actual["failed"] + actual["ready"] + actual["succeeded"]:
                return False
        return True

    def _create_jobs(self) -> None:
        existing = {str(j["metadata"]["name"])
                    for j in (*self.active, *self.successful, *self.failed, *self.previous)}
        for rjob in self.rjobs:
            if not self._dependencies_met(rjob):
                continue
            for idx in range(int(rjob["replicas"])):
                if f"{self.name}-{rjob['name']}-{idx}" not in existing:
                    self.plan.creates.append((JOBS, self._child_job(rjob, idx)))

    def _jobset_labels(self, rjob: dict[str, Any], idx: int) -> dict[str, str]:
        job_name = f"{self.name}-{rjob['name']}-{idx}"
        group = rjob.get("groupName") or "default"
        global_index = group_index = 0
        for other in self.rjobs:
            if other["name"] == rjob["name"]:
                break
            global_index += int(other["replicas"])
        for other in self.rjobs:
            if (other.get("groupName") or "default") != group:
                continue
            if other["name"] == rjob["name"]:
                break
            group_index += int(other["replicas"])
        return {
            JOBSET_NAME: self.name,
            JOBSET_UID: self.uid,
            RJOB_NAME: str(rjob["name"]),
            RESTART_ATTEMPT: str(int(self.status["restarts"])),
            RJOB_REPLICAS: str(int(rjob["replicas"])),
            GLOBAL_REPLICAS: str(sum(int(r["replicas"]) for r in self.rjobs)),
            JOB_INDEX: str(idx),
            JOB_KEY: hashlib.sha1(f"{self.namespace}/{job_name}".encode()).hexdigest(),
            JOB_GLOBAL_INDEX: str(global_index + idx),
            GROUP_NAME: group,
            GROUP_REPLICAS: str(sum(int(r["replicas"]) for r in self.rjobs
                                    if (r.get("groupName") or "default") == group)),
            JOB_GROUP_INDEX: str(group_index + idx),
        }

    def _child_job(self, rjob: dict[str, Any], idx: int) -> dict[str, Any]:
        template = copy.deepcopy(rjob.get("template") or {})
        tmeta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        js_labels = self._jobset_labels(rjob, idx)
        pod_template = spec.setdefault("template", {})
        pmeta = pod_template.setdefault("metadata", {})
        pmeta["labels"] = {**(pmeta.get("labels") or {}), **js_labels, **self.stamp}
        pmeta["annotations"] = {**(pmeta.get("annotations") or {}), **js_labels}
        if self.js["spec"]["network"].get("enableDNSHostnames"):
            pod_template.setdefault("spec", {})["subdomain"] = subdomain(self.js)
        spec["suspend"] = self.suspended
        return {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {
                "name": f"{self.name}-{rjob['name']}-{idx}", "namespace": self.namespace,
                "labels": {**(tmeta.get("labels") or {}), **js_labels, **self.stamp},
                "annotations": {**(tmeta.get("annotations") or {}), **js_labels},
            },
            "spec": spec,
        }

    def _resume(self) -> None:
        templates = {r["name"]: (r.get("template") or {}).get("spec", {}).get("template") or {}
                     for r in self.rjobs}
        for job in self.active:
            if not (job.get("spec") or {}).get("suspend"):
                continue
            updated = copy.deepcopy(job)
            want = templates.get((job["metadata"].get("labels") or {}).get(RJOB_NAME, ""), {})
            tmpl = updated["spec"].setdefault("template", {})
            tmeta = tmpl.setdefault("metadata", {})
            wmeta = want.get("metadata") or {}
            if wmeta.get("labels"):
                tmeta["labels"] = {**(tmeta.get("labels") or {}), **wmeta["labels"]}
            if wmeta.get("annotations"):
                tmeta["annotations"] = {**(tmeta.get("annotations") or {}), **wmeta["annotations"]}
            tspec, wspec = tmpl.setdefault("spec", {}), want.get("spec") or {}
            if wspec.get("nodeSelector"):
                tspec["nodeSelector"] = {**(tspec.get("nodeSelector") or {}), **wspec["nodeSelector"]}
            for key in ("tolerations", "schedulingGates"):
                merged = list(tspec.get(key) or [])
                merged += [item for item in wspec.get(key) or [] if item not in merged]
                if merged:
                    tspec[key] = merged
            updated["spec"]["suspend"] = False
            self.plan.updates.append((JOBS, updated))
        self._set(SUSPENDED, "False", "ResumeJobs", "jobset is resumed")


__all__ = ["JOBSETS", "JobSetReconciler", "subdomain"]
