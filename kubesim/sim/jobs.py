"""The simulated batch/v1 Job controller and TTL-after-finished controller of kube-controller-manager.

Owns Job pods and Job status. Pods are created from the template with the controller ownerReference,
the ``batch.kubernetes.io/job-tracking`` finalizer and the job labels (``batch.kubernetes.io/controller-uid``,
``batch.kubernetes.io/job-name``, ``controller-uid``, ``job-name``); Indexed Jobs add the completion index
annotation and label, the ``JOB_COMPLETION_INDEX`` env var and the hostname ``{job}-{index}``. A terminal
pod is counted once (succeeded / failed / completedIndexes) and then loses its finalizer, as the real
controller tracks pods; pods of vanished Jobs lose it too. Status carries active, ready, terminating,
succeeded, failed, startTime, completionTime and the k8s >= 1.31 conditions: SuccessCriteriaMet then
Complete, FailureTarget then Failed (BackoffLimitExceeded, DeadlineExceeded, PodFailurePolicy,
FailedIndexes / MaxFailedIndexesExceeded for backoffLimitPerIndex, counted in memory only), the
terminal condition being added once no pod is still running. Suspend and scale-down delete active pods
without counting them as failures (upstream drops their finalizer first); pods cut short because the Job
met its success or failure criteria count as failed. Suspend keeps startTime (Kueue-style callers clear
it themselves); resume sets it anew. podReplacementPolicy Failed waits for terminating pods before
replacing them. Jobs whose ``spec.managedBy`` names another controller are left alone (except by the TTL
controller). Reconciles are coalesced per Job and batched.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from kubesim.sim.common import (
    Key,
    StoreLike,
    find_condition,
    key_of,
    log,
    now_ts,
    parse_ts,
    record_event,
    set_condition,
)
from kubesim.sim.jobpods import (
    INDEX_KEY,
    TRACKING_FINALIZER,
    PodSummary,
    format_indexes,
    owner_uid,
    parse_indexes,
    pod_failure_policy,
    removal_order,
    success_policy,
    summarize,
)

JOBS = "jobs.batch"
CONTROLLER = "kubernetes.io/job-controller"
COMPONENT = "job-controller"
SUCCESS_REASON = "CompletionsReached"
SUCCESS_MESSAGE = "Reached expected number of succeeded pods"
BACKOFF_REASON = "BackoffLimitExceeded"
BACKOFF_MESSAGE = "Job has reached the specified backoff limit"
DEADLINE_REASON = "DeadlineExceeded"
DEADLINE_MESSAGE = "Job was active longer than specified deadline"
POLICY_REASON = "PodFailurePolicy"
POLICY_SUCCESS_REASON = "SuccessPolicy"
INDEX_FAILURES_KEY = "batch.kubernetes.io/job-index-failure-count"
RETRY_SECONDS = 0.2
BATCH_SIZE = 50
"""Jobs reconciled per loop iteration, so a burst of Jobs does not starve the API server's loop."""
CREATE_BURST = 500
"""Pods created for one Job in one reconcile (the real controller's slow start caps it too)."""


def _finished(conditions: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond
    return None


def _true(conditions: list[dict[str, Any]] | None, ctype: str) -> dict[str, Any] | None:
    cond = find_condition(conditions, ctype)
    return cond if cond is not None and cond.get("status") == "True" else None


class JobController:
    """One per simulated cluster; fed by the Simulation's store subscription."""

    def __init__(self, store: StoreLike, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self.job_keys: dict[str, Key] = {}                       # job uid -> key
        self.pods: dict[str, dict[str, PodSummary]] = {}         # job uid -> pod name -> summary
        self.counted: dict[str, set[str]] = {}                   # job uid -> pod uids already counted
        self.index_failures: dict[str, dict[int, int]] = {}     # job uid -> index -> failed pods
        self.deleted_by_us: set[str] = set()                     # pod uids deleted for suspend/excess/finish
        self.written_rv: dict[Key, str] = {}
        self.timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self.dirty: dict[Key, None] = {}
        self._handle: asyncio.Handle | None = None
        self._busy: Key | None = None
        self._seq = 0
        self.reconciles = 0
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        for _, handle in self.timers.values():
            handle.cancel()
        self.timers.clear()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    # --- events -------------------------------------------------------------------------------
    def on_job(self, event: str, job: Mapping[str, Any]) -> None:
        key = key_of(job)
        meta = job.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if event == "DELETED":
            self.job_keys.pop(uid, None)
            self.written_rv.pop(key, None)
            timer = self.timers.pop(key, None)
            if timer is not None:
                timer[1].cancel()
            for pod in list((self.pods.pop(uid, None) or {}).values()):
                if pod.tracked and (pod.terminal or pod.deleting):
                    self.loop.call_soon(self._drop_finalizer, key[0], pod.name, pod.uid)
            self.counted.pop(uid, None)
            self.index_failures.pop(uid, None)
            return
        self.job_keys[uid] = key
        if self.written_rv.get(key) == meta.get("resourceVersion"):
            return  # our own status write
        self._mark(key)

    def on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        owner = owner_uid(pod)
        meta = pod.get("metadata") or {}
        tracked = TRACKING_FINALIZER in (meta.get("finalizers") or ())
        if owner is None or owner not in self.job_keys:
            if tracked and event != "DELETED" and (owner is None or owner not in self.job_keys):
                status = pod.get("status") or {}
                if meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
                    self.loop.call_soon(self._drop_orphan_finalizer, str(meta.get("namespace") or ""),
                                        str(meta.get("name") or ""), str(meta.get("uid") or ""))
            return
        self._remember(owner, event, pod)
        key = self.job_keys[owner]
        if key != self._busy:
            self._mark(key)

    def _remember(self, owner: str, event: str, pod: Mapping[str, Any]) -> None:
        name = (pod.get("metadata") or {}).get("name") or ""
        pods = self.pods.setdefault(owner, {})
        if event == "DELETED":
            gone = pods.pop(name, None)
            if gone is not None:
                self.deleted_by_us.discard(gone.uid)
            return
        old = pods.get(name)
        if old is None:
            self._seq += 1
        pods[name] = summarize(pod, old.seq if old is not None else self._seq)

    def _mark(self, key: Key) -> None:
        self.dirty[key] = None
        if self._handle is None and not self.stopped:
            self._handle = self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._handle = None
        if self.stopped:
            return
        batch = []
        for key in self.dirty:
            batch.append(key)
            if len(batch) >= BATCH_SIZE:
                break
        for key in batch:
            del self.dirty[key]
        for key in batch:
            self._busy = key
            try:
                self.reconcile(key)
            except Exception:
                log.exception("job %s/%s reconcile failed", *key)
            finally:
                self._busy = None
        if self.dirty and self._handle is None:
            self._handle = self.loop.call_soon(self._drain)

    def _wake_at(self, key: Key, when: float) -> None:
        """Reconcile ``key`` again at wall-clock time ``when`` (deadline, TTL)."""
        current = self.timers.get(key)
        if current is not None and current[0] <= when:
            return
        if current is not None:
            current[1].cancel()
        delay = max(when - time.time(), 0.0)

        def fire() -> None:
            self.timers.pop(key, None)
            self._mark(key)

        self.timers[key] = (when, self.loop.call_later(delay + 0.005, fire))

    # --- reconcile ----------------------------------------------------------------------------
    def reconcile(self, key: Key) -> None:
        self.reconciles += 1
        job = self.store.get(JOBS, *key)
        if job is None:
            return
        meta = job["metadata"]
        spec = job.get("spec") or {}
        if spec.get("managedBy") not in (None, CONTROLLER):
            # Another controller runs it; only the TTL-after-finished controller still looks at it.
            status = job.get("status") or {}
            self._timers(key, spec, status, status.get("conditions") or [], time.time(), ttl_only=True)
            return
        uid = str(meta.get("uid"))
        self.job_keys[uid] = key
        status = job.setdefault("status", {})
        before = orjson.dumps(status)
        conditions: list[dict[str, Any]] = status.setdefault("conditions", [])
        pods = self.pods.setdefault(uid, {})  # the live index: pods created below show up in it
        now = time.time()
        stamp = now_ts(now)
        indexed = spec.get("completionMode") == "Indexed"
        completions = spec.get("completions")
        parallelism = int(spec.get("parallelism", 1) if spec.get("parallelism") is not None else 1)
        finished = _finished(conditions)
        events: list[tuple[str, str, str]] = []

        # 1. Count terminal pods once, then release their finalizers.
        counted = self.counted.setdefault(uid, set())
        succeeded_indexes = parse_indexes(status.get("completedIndexes"))
        per_index = spec.get("backoffLimitPerIndex") if indexed else None
        failed_indexes = parse_indexes(status.get("failedIndexes"))
        newly_counted: list[PodSummary] = []
        policy_failure: tuple[str, str] | None = None
        for pod in pods.values():
            if not pod.terminal or pod.uid in counted:
                continue
            if not pod.tracked:
                counted.add(pod.uid)
                continue
            newly_counted.append(pod)
            counted.add(pod.uid)
            if finished is not None:
                continue
            if pod.phase == "Succeeded":
                if indexed:
                    if pod.index is not None and (completions is None or pod.index < completions):
                        succeeded_indexes.add(pod.index)
                else:
                    status["succeeded"] = int(status.get("succeeded") or 0) + 1
            elif pod.uid not in self.deleted_by_us:
                verdict = pod_failure_policy(spec.get("podFailurePolicy"), key[0], pod)
                if verdict is not None and verdict[0] == "Ignore":
                    continue
                status["failed"] = int(status.get("failed") or 0) + 1
                if verdict is not None and verdict[0] == "FailJob" and policy_failure is None:
                    policy_failure = (POLICY_REASON, verdict[1])
                if per_index is not None and pod.index is not None:
                    fails = self.index_failures.setdefault(uid, {})
                    fails[pod.index] = fails.get(pod.index, 0) + 1
                    if fails[pod.index] > int(per_index) or (verdict is not None and verdict[0] == "FailIndex"):
                        failed_indexes.add(pod.index)
        if indexed:
            status["completedIndexes"] = format_indexes(succeeded_indexes)
            status["succeeded"] = len(succeeded_indexes)
        if per_index is not None:
            status["failedIndexes"] = format_indexes(failed_indexes)

        active = [p for p in pods.values() if p.active]
        terminating = [p for p in pods.values() if p.deleting and not p.terminal]
        succeeded = int(status.get("succeeded") or 0)
        failed = int(status.get("failed") or 0)

        suspended = bool(spec.get("suspend"))
        failure_target = _true(conditions, "FailureTarget")
        success_met = _true(conditions, "SuccessCriteriaMet")

        # A Job being deleted only has its pods counted; the garbage collector removes them.
        being_deleted = bool(meta.get("deletionTimestamp"))
        if being_deleted:
            pass
        elif finished is None and failure_target is None and success_met is None:
            if suspended:
                if _job_condition(conditions, "Suspended", "True", "JobSuspended", "Job suspended", now=stamp):
                    events.append(("Normal", "Suspended", "Job suspended"))
                self._delete_pods(key, active)
                active = []
            else:
                cond = find_condition(conditions, "Suspended")
                if cond is not None and cond.get("status") == "True":
                    _job_condition(conditions, "Suspended", "False", "JobResumed", "Job resumed", now=stamp)
                    events.append(("Normal", "Resumed", "Job resumed"))
                    status["startTime"] = stamp
                status.setdefault("startTime", stamp)
                failure = (policy_failure or _index_failure(spec, per_index, failed_indexes, succeeded_indexes)
                           or self._failure(job, spec, status, active, failed, now, per_index is not None))
                if failure is not None:
                    reason, message = failure
                    _job_condition(conditions, "FailureTarget", "True", reason, message, now=stamp)
                    failure_target = find_condition(conditions, "FailureTarget")
                    events.append(("Warning", reason, message))
                elif (policy_met := success_policy(spec.get("successPolicy"), succeeded_indexes)) is not None:
                    _job_condition(conditions, "SuccessCriteriaMet", "True", POLICY_SUCCESS_REASON, policy_met,
                                   now=stamp)
                    success_met = find_condition(conditions, "SuccessCriteriaMet")
                else:
                    # Pods beyond what is still needed go first (not failures), then completion is judged.
                    active = self._manage(job, key, pods, active, terminating, parallelism, completions, indexed,
                                          succeeded, succeeded_indexes | failed_indexes, events)
                    if self._succeeded(indexed, completions, succeeded, succeeded_indexes, active):
                        _job_condition(conditions, "SuccessCriteriaMet", "True", SUCCESS_REASON, SUCCESS_MESSAGE,
                                       now=stamp)
                        success_met = find_condition(conditions, "SuccessCriteriaMet")

        if being_deleted:
            pass
        elif finished is None and (failure_target is not None or success_met is not None):
            self._delete_pods(key, active, counted=True)
            active = []
            if not any(not p.terminal for p in pods.values()):
                if failure_target is not None:
                    _job_condition(conditions, "Failed", "True", failure_target.get("reason"),
                                   failure_target.get("message"), now=stamp)
                else:
                    met = success_met or {}
                    _job_condition(conditions, "Complete", "True", met.get("reason", SUCCESS_REASON),
                                   met.get("message", SUCCESS_MESSAGE), now=stamp)
                    status["completionTime"] = stamp
                    events.append(("Normal", "Completed", "Job completed"))
                finished = _finished(conditions)
        elif finished is not None:
            self._delete_pods(key, active, counted=True)
            active = []

        ready = sum(1 for p in active if p.ready and p.name in pods and pods[p.name].active)
        terminating_now = sum(1 for p in pods.values() if p.deleting and not p.terminal)
        live = sum(1 for p in pods.values() if p.active)
        _set_count(status, "active", live)
        status["ready"] = ready
        status["terminating"] = terminating_now
        _set_count(status, "succeeded", int(status.get("succeeded") or 0))
        _set_count(status, "failed", int(status.get("failed") or 0))
        status.setdefault("uncountedTerminatedPods", {})
        if not conditions:
            status.pop("conditions", None)
        if not status.get("completedIndexes"):
            status.pop("completedIndexes", None)

        if orjson.dumps(status) != before:
            try:
                written = self.store.update(JOBS, job, subresource="status")
                self.written_rv[key] = written["metadata"].get("resourceVersion")
            except Exception as exc:
                log.debug("job %s/%s status not written: %s", key[0], key[1], exc)
                counted.difference_update(p.uid for p in newly_counted)  # count them on the retry
                self.loop.call_later(RETRY_SECONDS, self._mark, key)
                return
        for pod in newly_counted:
            self._drop_finalizer(key[0], pod.name, pod.uid)
        for type_, reason, message in events:
            record_event(self.store, job, kind="Job", api_version="batch/v1", type_=type_, reason=reason,
                         message=message, component=COMPONENT)
        self._timers(key, spec, status, conditions, now)

    def _failure(self, job: Mapping[str, Any], spec: Mapping[str, Any], status: Mapping[str, Any],
                 active: list[PodSummary], failed: int, now: float, per_index: bool) -> tuple[str, str] | None:
        limit = spec.get("backoffLimit")
        # With backoffLimitPerIndex upstream defaults backoffLimit to MaxInt32; the store defaults it to 6.
        limit = 2**31 - 1 if limit is None or per_index else int(limit)
        if failed > limit:
            return BACKOFF_REASON, BACKOFF_MESSAGE
        template_spec = ((spec.get("template") or {}).get("spec") or {})
        if template_spec.get("restartPolicy") == "OnFailure":
            restarts = sum(p.restarts for p in active)
            if (restarts > 0) if limit == 0 else (restarts >= limit):
                return BACKOFF_REASON, BACKOFF_MESSAGE
        deadline = spec.get("activeDeadlineSeconds")
        started = parse_ts(status.get("startTime"))
        if deadline is not None and started is not None and now - started >= int(deadline):
            return DEADLINE_REASON, DEADLINE_MESSAGE
        return None

    @staticmethod
    def _succeeded(indexed: bool, completions: int | None, succeeded: int, succeeded_indexes: set[int],
                   active: list[PodSummary]) -> bool:
        if active:
            return False  # as upstream: complete only once no pod is still running
        if completions is None:
            return succeeded > 0
        if indexed:
            return len(succeeded_indexes) >= int(completions)
        return succeeded >= int(completions)

    def _manage(self, job: Mapping[str, Any], key: Key, pods: Mapping[str, PodSummary], active: list[PodSummary],
                terminating: list[PodSummary], parallelism: int, completions: int | None, indexed: bool,
                succeeded: int, succeeded_indexes: set[int], events: list[tuple[str, str, str]]) -> list[PodSummary]:
        spec = job.get("spec") or {}
        policy = spec.get("podReplacementPolicy") or ("Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
        occupying = active + (terminating if policy == "Failed" else [])
        active = sorted(active, key=lambda p: p.seq)
        if indexed:
            total = int(completions if completions is not None else parallelism)
            excess: list[PodSummary] = []
            seen: set[int] = set()
            for pod in active:
                if pod.index is None or pod.index >= total or pod.index in succeeded_indexes or pod.index in seen:
                    excess.append(pod)
                else:
                    seen.add(pod.index)
            busy = {p.index for p in occupying if p.index is not None}
            keep = [p for p in active if p not in excess]
            if len(keep) > parallelism:
                excess += removal_order(keep)[: len(keep) - parallelism]
            self._delete_pods(key, excess)
            active = [p for p in active if p not in excess]
            room = parallelism - len([p for p in occupying if p not in excess])
            wanted = [i for i in range(total) if i not in succeeded_indexes and i not in busy][: max(room, 0)]
            for index in wanted[:CREATE_BURST]:
                self._create_pod(job, key, index, events)
        else:
            if completions is None:
                want = parallelism if succeeded == 0 else len(active)
            else:
                want = min(parallelism, int(completions) - succeeded)
            want = max(want, 0)
            if len(active) > want:
                excess = removal_order(active)[: len(active) - want]
                self._delete_pods(key, excess)
                active = [p for p in active if p not in excess]
            missing = want - len(occupying)
            for _ in range(min(max(missing, 0), CREATE_BURST)):
                self._create_pod(job, key, None, events)
        uid = str(job["metadata"].get("uid"))
        return [p for p in self.pods.get(uid, {}).values() if p.active]

    # --- writes -------------------------------------------------------------------------------
    def _create_pod(self, job: Mapping[str, Any], key: Key, index: int | None,
                    events: list[tuple[str, str, str]]) -> None:
        meta = job["metadata"]
        name = meta["name"]
        uid = str(meta.get("uid"))
        template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        tmeta = template.get("metadata") or {}
        pod_spec = template.get("spec") or {}
        labels = dict(tmeta.get("labels") or {})
        labels.update({"batch.kubernetes.io/controller-uid": uid, "batch.kubernetes.io/job-name": name,
                       "controller-uid": uid, "job-name": name})
        annotations = dict(tmeta.get("annotations") or {})
        generate = f"{name}-"
        if index is not None:
            labels[INDEX_KEY] = str(index)
            annotations[INDEX_KEY] = str(index)
            if (job.get("spec") or {}).get("backoffLimitPerIndex") is not None:
                annotations[INDEX_FAILURES_KEY] = str(self.index_failures.get(uid, {}).get(index, 0))
            generate = f"{name}-{index}-"
            pod_spec.setdefault("hostname", f"{name}-{index}")
            for container in list(pod_spec.get("containers") or ()) + list(pod_spec.get("initContainers") or ()):
                env = container.setdefault("env", [])
                if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                    env.append({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                        "apiVersion": "v1", "fieldPath": f"metadata.labels['{INDEX_KEY}']"}}})
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": generate,
                "namespace": key[0],
                "labels": labels,
                "annotations": annotations,
                "finalizers": [TRACKING_FINALIZER],
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                     "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": pod_spec,
        }
        if not annotations:
            del pod["metadata"]["annotations"]
        try:
            created = self.store.create("pods", pod)
        except Exception as exc:
            log.warning("job %s/%s: creating a pod failed: %s", key[0], key[1], exc)
            events.append(("Warning", "FailedCreate", f"Error creating: {exc}"))
            # Try again shortly, as the controller's rate-limited requeue does (e.g. a generated name clash).
            self.loop.call_later(RETRY_SECONDS, self._mark, key)
            return
        events.append(("Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}"))

    def _delete_pods(self, key: Key, pods: Iterable[PodSummary], *, counted: bool = False) -> None:
        """Delete active pods. Like the real controller, pods removed for suspension or scale-down are not
        failures (it drops their finalizer first); pods cut short because the Job finished count as failed."""
        for pod in pods:
            if pod.deleting:
                continue
            if not counted:
                self.deleted_by_us.add(pod.uid)
            try:
                self.store.delete("pods", key[0], pod.name)
            except Exception as exc:
                log.debug("deleting pod %s/%s: %s", key[0], pod.name, exc)

    def _drop_finalizer(self, namespace: str, name: str, uid: str) -> None:
        if self.stopped:
            return
        try:
            pod = self.store.get("pods", namespace, name)
            if pod is None or pod["metadata"].get("uid") != uid:
                return
            finalizers = [f for f in pod["metadata"].get("finalizers") or () if f != TRACKING_FINALIZER]
            if len(finalizers) == len(pod["metadata"].get("finalizers") or ()):
                return
            self.store.patch("pods", namespace, name, {"metadata": {"finalizers": finalizers or None}})
        except Exception as exc:
            log.debug("finalizer on pod %s/%s not removed: %s", namespace, name, exc)

    def _drop_orphan_finalizer(self, namespace: str, name: str, uid: str) -> None:
        if self.stopped:
            return
        pod = self.store.get("pods", namespace, name)
        if pod is None:
            return
        owner = owner_uid(pod)
        if owner is not None and owner in self.job_keys:
            return
        self._drop_finalizer(namespace, name, uid)

    def _timers(self, key: Key, spec: Mapping[str, Any], status: Mapping[str, Any],
                conditions: list[dict[str, Any]], now: float, *, ttl_only: bool = False) -> None:
        finished = _finished(conditions)
        if finished is not None:
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is None:
                return
            since = parse_ts(finished.get("lastTransitionTime")) or now
            expiry = since + int(ttl)
            if expiry <= now:
                try:
                    # The TTL-after-finished controller deletes in the foreground, as upstream does.
                    self.store.delete(JOBS, key[0], key[1], propagation="Foreground")
                except Exception as exc:
                    log.debug("TTL delete of job %s/%s: %s", key[0], key[1], exc)
            else:
                self._wake_at(key, expiry)
            return
        if ttl_only:
            return
        deadline = spec.get("activeDeadlineSeconds")
        started = parse_ts(status.get("startTime"))
        if deadline is not None and started is not None and not spec.get("suspend"):
            self._wake_at(key, started + int(deadline))


def _index_failure(spec: Mapping[str, Any], per_index: Any, failed: set[int],
                   succeeded: set[int]) -> tuple[str, str] | None:
    """backoffLimitPerIndex outcomes: too many failed indexes, or every index settled with some failed."""
    if per_index is None or not failed:
        return None
    most = spec.get("maxFailedIndexes")
    if most is not None and len(failed) > int(most):
        return "MaxFailedIndexesExceeded", "Job has exceeded the specified maximal number of failed indexes"
    if len(failed | succeeded) >= int(spec.get("completions") or 0):
        return "FailedIndexes", "Job has failed indexes"
    return None


def _job_condition(conditions: list[dict[str, Any]], ctype: str, status: str, reason: str | None,
                   message: str | None, *, now: str) -> bool:
    """set_condition plus lastProbeTime, which the Job controller stamps whenever it writes a condition."""
    changed = set_condition(conditions, ctype, status, reason, message, now=now)
    if changed:
        for cond in conditions:
            if cond.get("type") == ctype:
                cond["lastProbeTime"] = now
    return changed


def _set_count(status: dict[str, Any], field: str, value: int) -> None:
    if value:
        status[field] = value
    else:
        status.pop(field, None)
