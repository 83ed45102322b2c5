"""TrainJob reconciler: the trainjob controller as one pure ``render`` (KUBEFLOW.md D.3/D.5).

The runtime lives in the worker cluster and carries none of our labels, so it cannot be listed
as a child: ``prepare(kube, job)`` (async, called by the apply loop before ``render``) reads the
(Cluster)TrainingRuntime and returns ``{"runtime": obj | None, "runtime_error": str}``; render
reads it from ``observed.extra`` when the Observed carries that field, else from
``observed.children["trainingruntimes" | "clustertrainingruntimes"]`` by name; once built, the
runtime is snapshotted into ConfigMap ``{trainjob}-runtime-snapshot`` (trainer v2.3), which wins
from then on. A pass: skip jobs managed elsewhere; an unknown runtime kind fails the job; while
unfinished, the snapshot, the mpi Secret (only when absent) and hostfile ConfigMap, and the JobSet ``{trainjob}`` (created, or re-applied only
while it or the TrainJob is suspended); then Suspended/Resumed, Complete/Failed copied from the
JobSet with the type renamed, jobsStatus, and DeadlineExceeded on time via ``requeue_after``.
The JobSet is stamped with the TrainJob's mkd origin labels and ``mkd.dev/owner-uid``; the agent
reconciles it with ``JobSetReconciler`` (see ``owned_jobset_selector``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import yaml

from federation import labels as mkd_labels
from federation.errors import FederationError, NotFound
from federation.kinds.trainjob import TRAINJOB
from federation.kube import CONFIGMAPS, SECRETS, Resource
from worker_agent.reconcilers.base import KubeReader, Observed, Plan, Reconciler
from worker_agent.reconcilers.conditions import parse_time, rfc3339
from worker_agent.reconcilers.jobset import JOBSETS
from worker_agent.reconcilers.jobset_support import child_stamp, controlled_by
from worker_agent.reconcilers.mpi_support import ssh_secret_data
from worker_agent.reconcilers.trainjob_build import GROUP, MPI_HOSTFILE_SUFFIX, MPI_SSH_SUFFIX, build

OWNER_UID_LABEL = mkd_labels.OWNER_UID
TRAINING_RUNTIMES = Resource(GROUP, "v1alpha1", "trainingruntimes", "TrainingRuntime")
CLUSTER_TRAINING_RUNTIMES = Resource(GROUP, "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime",
                                     namespaced=False)
RUNTIMES = {"TrainingRuntime": TRAINING_RUNTIMES, "ClusterTrainingRuntime": CLUSTER_TRAINING_RUNTIMES}
NOT_FOUND = {"ClusterTrainingRuntime": "not found ClusterTrainingRuntime specified in TrainJob",
             "TrainingRuntime": "TrainingRuntime specified in TrainJob is not found"}
SNAPSHOT_SUFFIX = "-runtime-snapshot"
SUSPENDED, COMPLETE, FAILED = "Suspended", "Complete", "Failed"
RETRY_SECONDS = 5.0


def owned_jobset_selector(trainjob: Mapping[str, Any]) -> str:
    """Selects the JobSet a TrainJob produced (the agent hands it to ``JobSetReconciler``)."""
    return f"{OWNER_UID_LABEL}={(trainjob.get('metadata') or {}).get('uid', '')}"


def runtime_ref(trainjob: Mapping[str, Any]) -> tuple[str, str, str]:
    """(name, apiGroup, kind) with the CRD defaults."""
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    return (str(ref.get("name") or ""), str(ref.get("apiGroup") or GROUP),
            str(ref.get("kind") or "ClusterTrainingRuntime"))


def set_status_condition(conditions: list[dict[str, Any]], new: dict[str, Any], now_stamp: str) -> bool:
    """apimachinery ``meta.SetStatusCondition``: update in place (new lastTransitionTime only on a
    status change), else append (keeping a given lastTransitionTime). True when changed."""
    for cur in conditions:
        if cur.get("type") != new["type"]:
            continue
        changed = False
        if cur.get("status") != new["status"]:
            cur["status"] = new["status"]
            cur["lastTransitionTime"] = new.get("lastTransitionTime") or now_stamp
            changed = True
        for key in ("reason", "message"):
            if cur.get(key) != new.get(key):
                cur[key] = new.get(key)
                changed = True
        return changed
    entry = {"type": new["type"], "status": new["status"], "reason": new.get("reason", ""),
             "message": new.get("message", ""),
             "lastTransitionTime": new.get("lastTransitionTime") or now_stamp}
    conditions.append(entry)
    return True


def _is_true(conditions: list[dict[str, Any]], ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True" for c in conditions)


class TrainJobReconciler(Reconciler):
    """Reconciler for ``trainer.kubeflow.org/v1alpha1`` TrainJob."""

    kind = TRAINJOB.name
    children: tuple[Resource, ...] = (JOBSETS, CONFIGMAPS, SECRETS)

    def child_selector(self, job: Mapping[str, Any]) -> str:
        return owned_jobset_selector(job)

    async def prepare(self, kube: KubeReader, job: Mapping[str, Any]) -> dict[str, Any]:
        """Read the runtime from the worker cluster (the extra input ``render`` needs)."""
        name, group, kind = runtime_ref(job)
        res = RUNTIMES.get(kind)
        if group != GROUP or res is None:
            return {"runtime": None, "runtime_error": ""}
        namespace = (job.get("metadata") or {}).get("namespace") if res.namespaced else None
        try:
            return {"runtime": await kube.get(res, name, namespace), "runtime_error": ""}
        except NotFound:
            return {"runtime": None, "runtime_error": f'{res.plural}.{GROUP} "{name}" not found'}
        except FederationError as exc:
            return {"runtime": None, "runtime_error": str(exc)}

    def render(self, observed: Observed) -> Plan:
        job = observed.job
        spec = job.get("spec") or {}
        managed_by = spec.get("managedBy")
        if managed_by is not None and managed_by != mkd_labels.TRAINJOB_CONTROLLER:
            return Plan()
        return _Pass(job, observed).run()


class _Pass:
    def __init__(self, job: dict[str, Any], observed: Observed) -> None:
        self.job = job
        self.observed = observed
        self.name = str(job["metadata"]["name"])
        self.namespace = str(job["metadata"].get("namespace") or "default")
        self.uid = str(job["metadata"].get("uid") or "")
        self.now = observed.now
        self.stamp_now = rfc3339(observed.now)
        self.plan = Plan()
        self.old_status = copy.deepcopy(job.get("status") or {})
        self.status = copy.deepcopy(self.old_status)
        self.conditions: list[dict[str, Any]] = self.status.setdefault("conditions", [])
        self.suspended = bool((job.get("spec") or {}).get("suspend"))
        self.by_name = {plural: {str(o["metadata"]["name"]): o for o in objs}
                        for plural, objs in observed.children.items()}
        jobset = self.by_name.get(JOBSETS.plural, {}).get(self.name)
        self.jobset = jobset if jobset is not None and controlled_by(jobset, self.uid) else None

    def _finished(self) -> bool:
        return _is_true(self.conditions, COMPLETE) or _is_true(self.conditions, FAILED)

    def _snapshot(self) -> tuple[dict[str, Any] | None, str]:
        """The runtime as snapshotted at first build (``{tj}-runtime-snapshot``), or an error."""
        cm = self.by_name.get(CONFIGMAPS.plural, {}).get(self.name + SNAPSHOT_SUFFIX)
        if cm is None:
            return None, ""
        if not controlled_by(cm, self.uid):
            return None, "invalid runtime snapshot: a snapshot configmap exists but is owned by another object"
        text = (cm.get("data") or {}).get("runtime")
        if text is None:
            return None, 'invalid runtime snapshot: snapshot ConfigMap missing "runtime" data key'
        try:
            runtime = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            return None, f"invalid runtime snapshot: unable to unmarshal the snapshot: {exc}"
        name, group, kind = runtime_ref(self.job)
        found = (str((runtime.get("metadata") or {}).get("name")), str(runtime.get("apiVersion", "")).split("/")[0],
                 str(runtime.get("kind")))
        if found != (name, group, kind):
            return None, ("invalid runtime snapshot: the snapshot refers to the wrong runtime: expecting a runtime "
                          f'with name, api group and kind of "{name}", "{group}", "{kind}" but found runtime with '
                          f'name, api group and kind of "{found[0]}", "{found[1]}", "{found[2]}"')
        return runtime, ""

    def _runtime(self) -> tuple[dict[str, Any] | None, str, bool]:
        """(runtime, error, whether to snapshot it): the snapshot wins over the live runtime."""
        snap, error = self._snapshot()
        if snap is not None or error:
            return snap, f"getting runtime snapshot: {error}" if error else "", False
        extra = self.observed.extra
        name, _, kind = runtime_ref(self.job)
        res = RUNTIMES[kind]
        if isinstance(extra, Mapping) and ("runtime" in extra or "runtime_error" in extra):
            runtime, error = extra.get("runtime"), str(extra.get("runtime_error") or "")
        else:
            runtime = next((o for o in self.observed.children.get(res.plural, []) if o["metadata"]["name"] == name),
                           None)
            error = "" if runtime is not None else f'{res.plural}.{GROUP} "{name}" not found'
        if runtime is None:
            return None, f"{NOT_FOUND[kind]}: {error}", False
        return runtime, "", True

    def run(self) -> Plan:
        _, group, kind = runtime_ref(self.job)
        if group != GROUP or kind not in RUNTIMES:
            set_status_condition(self.conditions, {
                "type": FAILED, "status": "True", "reason": "TrainingRuntimeNotSupported",
                "message": f"unsupported runtime: {kind}.{group}"}, self.stamp_now)
        elif not self._finished():
            self._objects()
        self._suspended_condition()
        self._copy_jobset_status()
        self._deadline()
        if not self.conditions:
            self.status.pop("conditions", None)
        if self.status != self.old_status:
            self.plan.status = self.status
        return self.plan

    def _objects(self) -> None:
        runtime, error, snapshot = self._runtime()
        try:
            if runtime is None:
                raise LookupError(error)
            built = build(self.job, runtime)
        except (LookupError, FederationError, ValueError, KeyError, TypeError) as exc:
            message = f"TrainJob resources reconciliation failed: {str(exc)[:950]}"
            if len(str(exc)) > 950:
                message += " ..."
            self.plan.events.append(("Warning", "TrainJobResourcesCreationFailed", message))
            self.plan.requeue_after = RETRY_SECONDS
            return
        stamp = child_stamp(self.job, OWNER_UID_LABEL)
        if snapshot:
            # later edits of the runtime must not change a running job (trainer v2.3, KEP-2599)
            kept = copy.deepcopy(runtime)
            for key in ("managedFields", "resourceVersion", "generation"):
                kept.get("metadata", {}).pop(key, None)
            self.plan.creates.append((CONFIGMAPS, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.name + SNAPSHOT_SUFFIX, "namespace": self.namespace,
                             "labels": dict(stamp)},
                "data": {"runtime": yaml.safe_dump(kept, sort_keys=True)}}))
        if built.hostfile is not None:
            self._mpi_objects(built.hostfile, stamp)
        if self.jobset is not None and not self.suspended and not (self.jobset.get("spec") or {}).get("suspend"):
            return  # both running: nothing is re-applied (spec changes land only while suspended)
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                    "labels": {**built.labels, **stamp}}
        if built.annotations:
            metadata["annotations"] = built.annotations
        desired: dict[str, Any] = {"apiVersion": f"{JOBSETS.group}/{JOBSETS.version}", "kind": "JobSet",
                                   "metadata": metadata, "spec": built.spec}
        if self.jobset is None:
            self.plan.creates.append((JOBSETS, desired))
            return
        updated = copy.deepcopy(self.jobset)
        updated["metadata"]["labels"] = {**(updated["metadata"].get("labels") or {}), **desired["metadata"]["labels"]}
        if built.annotations:
            updated["metadata"]["annotations"] = {**(updated["metadata"].get("annotations") or {}),
                                                  **built.annotations}
        updated["spec"] = {**(updated.get("spec") or {}), **built.spec}
        if updated != self.jobset:
            self.plan.updates.append((JOBSETS, updated))

    def _mpi_objects(self, hostfile: str, stamp: dict[str, str]) -> None:
        secrets = self.by_name.get(SECRETS.plural, {})
        if f"{self.name}{MPI_SSH_SUFFIX}" not in secrets:
            self.plan.creates.append((SECRETS, {
                "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth", "immutable": True,
                "metadata": {"name": f"{self.name}{MPI_SSH_SUFFIX}", "namespace": self.namespace,
                             "labels": dict(stamp)},
                "data": ssh_secret_data()}))
        data = {"hostfile": hostfile}
        current = self.by_name.get(CONFIGMAPS.plural, {}).get(f"{self.name}{MPI_HOSTFILE_SUFFIX}")
        if current is None:
            self.plan.creates.append((CONFIGMAPS, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": f"{self.name}{MPI_HOSTFILE_SUFFIX}", "namespace": self.namespace,
                             "labels": dict(stamp)},
                "data": data}))
        elif current.get("data") != data:
            updated = copy.deepcopy(current)
            updated["data"] = data
            self.plan.updates.append((CONFIGMAPS, updated))

    def _suspended_condition(self) -> None:
        if self.suspended:
            new = {"type": SUSPENDED, "status": "True", "reason": "Suspended", "message": "TrainJob is suspended"}
        elif _is_true(self.conditions, SUSPENDED):
            new = {"type": SUSPENDED, "status": "False", "reason": "Resumed", "message": "TrainJob is resumed"}
        else:
            return
        set_status_condition(self.conditions, new, self.stamp_now)

    def _copy_jobset_status(self) -> None:
        if self.jobset is None:
            return
        js_status = self.jobset.get("status") or {}
        deadline = next((dict(c) for c in self.conditions
                         if c.get("type") == FAILED and c.get("reason") == "DeadlineExceeded"), None)
        for js_type, tj_type in (("Completed", COMPLETE), ("Failed", FAILED)):
            for cond in js_status.get("conditions") or []:
                if cond.get("type") == js_type and cond.get("status") == "True":
                    set_status_condition(self.conditions, {**copy.deepcopy(cond), "type": tj_type},
                                         self.stamp_now)
        if deadline is not None:
            set_status_condition(self.conditions, deadline, self.stamp_now)
        statuses = [{"name": s.get("name"), "ready": int(s.get("ready") or 0),
                     "succeeded": int(s.get("succeeded") or 0), "failed": int(s.get("failed") or 0),
                     "active": int(s.get("active") or 0), "suspended": int(s.get("suspended") or 0)}
                    for s in js_status.get("replicatedJobsStatus") or []]
        if statuses:
            self.status["jobsStatus"] = statuses
        else:
            self.status.pop("jobsStatus", None)

    def _deadline(self) -> None:
        seconds = int((self.job.get("spec") or {}).get("activeDeadlineSeconds") or 0)
        if not seconds or self._finished() or self.suspended:
            return
        start = parse_time(self.job["metadata"].get("creationTimestamp"))
        resumed = next((c for c in self.conditions if c.get("type") == SUSPENDED and c.get("status") == "False"),
                       None)
        if resumed is not None:
            start = parse_time(resumed.get("lastTransitionTime")) or start
        if start is None:
            return
        due = start + timedelta(seconds=seconds)
        if self.now >= due:
            set_status_condition(self.conditions, {
                "type": FAILED, "status": "True", "reason": "DeadlineExceeded",
                "message": "TrainJob exceeded its active deadline"}, self.stamp_now)
            if self.jobset is not None:
                self.plan.deletes.append((JOBSETS, self.name))
            return
        self.plan.requeue_after = max((due - self.now).total_seconds(), 1.0)
