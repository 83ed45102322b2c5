"""The shared Kubeflow v1 render (training-operator's ``ReconcileJobs``), pure: Observed in, Plan out.

One base for the v1 family (PyTorchJob, TFJob, XGBoostJob, PaddleJob, JAXJob); a member names
its spec field, default container and port, operator name and replica types, and overrides
the env / init-container / status hooks. The pass follows KUBEFLOW.md A.5: skip jobs managed by
someone else, finished jobs are cleaned up (cleanPodPolicy, TTL), suspended jobs lose their pods
and Services, resume resets startTime, backoffLimit and activeDeadlineSeconds fail the job, then
per replica type the Pods and headless Services per index (A.3 count rules) and the status.
Deliberate differences: a Failed job always gets completionTime; deadlines and TTLs are
returned as ``requeue_after`` so they fire on time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from federation import labels as mkd_labels
from federation.errors import Invalid
from federation.jsoncopy import json_copy
from federation.kinds.base import latest_condition
from federation.kinds.kubeflow import DEFAULT_REPLICAS, KubeflowV1Kind
from federation.kube import PODS, SERVICES, Resource
from worker_agent.reconcilers import conditions as cond
from worker_agent.reconcilers.base import Observed, Plan, Reconciler

GROUP_LABEL = "training.kubeflow.org"
OPERATOR_NAME = f"{GROUP_LABEL}/operator-name"
JOB_NAME = f"{GROUP_LABEL}/job-name"
REPLICA_TYPE = f"{GROUP_LABEL}/replica-type"
REPLICA_INDEX = f"{GROUP_LABEL}/replica-index"
JOB_ROLE = f"{GROUP_LABEL}/job-role"

RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
RETRYABLE_MAGIC = 0xBEEF
"""Exit code assumed when the main container has not terminated (upstream: retryable)."""


class PassAborted(Exception):
    """A child cannot be built: upstream returns the error, ending the pass before the status write."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ReplicaSpec:
    """One defaulted replica spec (defaulting is in memory only, as upstream)."""

    rtype: str
    replicas: int
    template: dict[str, Any]
    restart_policy: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    if type(meta) is dict:  # what JSON decodes to; the ABC check below costs ten times as much
        return meta
    return meta if isinstance(meta, Mapping) else {}


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _replica_status(status: dict[str, Any], rtype: str) -> dict[str, Any]:
    statuses = status.setdefault("replicaStatuses", {})
    entry: dict[str, Any] = statuses.setdefault(rtype, {})
    return entry


def _bump(entry: dict[str, Any], key: str, by: int = 1) -> None:
    entry[key] = int(entry.get(key, 0)) + by


def _count(entry: Mapping[str, Any], key: str) -> int:
    return int(entry.get(key, 0) or 0)


def _drop_zeros(status: dict[str, Any]) -> None:
    """ReplicaStatus fields are ``omitempty``: zero counts do not appear on the wire."""
    for entry in (status.get("replicaStatuses") or {}).values():
        for key in ("active", "succeeded", "failed"):
            if key in entry and not entry[key]:
                del entry[key]


class KubeflowV1Reconciler(Reconciler):
    """Base of the v1 family; a member names its :class:`KubeflowV1Kind` (names, spec field, main container,
    replica types, operator name, port and restart defaults) and overrides the hooks."""

    job_kind: KubeflowV1Kind
    children: tuple[Resource, ...] = (PODS, SERVICES)
    _canonical: dict[tuple[str, ...], dict[str, str]] = {}
    """Replica types by their lower-case spelling, per ``replica_types`` (``defaulted_specs``)."""

    # --- the kind's facts (federation.kinds) ---------------------------------------------------
    @property
    def kind(self) -> str:
        return self.job_kind.name

    @property
    def plural(self) -> str:
        return self.job_kind.plural

    @property
    def specs_field(self) -> str:
        return self.job_kind.replica_specs_field

    @property
    def container(self) -> str:
        return self.job_kind.container_name

    @property
    def operator_name(self) -> str:
        return self.job_kind.operator_name

    @property
    def port_name(self) -> str:
        return self.job_kind.port_name

    @property
    def default_port(self) -> int:
        return self.job_kind.default_port

    @property
    def default_restart(self) -> str:
        return self.job_kind.default_restart_policy

    @property
    def replica_types(self) -> tuple[str, ...]:
        """Canonical replica types in the order they are reconciled."""
        return self.job_kind.replica_types

    # --- naming ---------------------------------------------------------------------------
    def child_selector(self, job: Mapping[str, Any]) -> str:
        return f"{JOB_NAME}={self.job_label(job)},{OPERATOR_NAME}={self.operator_name}"

    @staticmethod
    def job_label(job: Mapping[str, Any]) -> str:
        return str(_meta(job).get("name", "")).replace("/", "-")

    def replica_labels(self, job: Mapping[str, Any], rtype: str, index: int) -> dict[str, str]:
        return {OPERATOR_NAME: self.operator_name, JOB_NAME: self.job_label(job),
                REPLICA_TYPE: rtype.lower(), REPLICA_INDEX: str(index)}

    def selector(self, job: Mapping[str, Any], rtype: str) -> str:
        # the keys in sorted order (job-name < operator-name < replica-type), as upstream's label selector prints
        return (f"{JOB_NAME}={self.job_label(job)},{OPERATOR_NAME}={self.operator_name},"
                f"{REPLICA_TYPE}={rtype.lower()}")

    @staticmethod
    def child_name(job: Mapping[str, Any], rtype: str, index: int) -> str:
        return f"{_meta(job).get('name', '')}-{rtype.lower()}-{index}".replace("/", "-")

    def reason(self, what: str) -> str:
        return f"{self.kind}{what}"

    # --- defaulting (in memory) -------------------------------------------------------------
    def defaulted_specs(self, job: Mapping[str, Any]) -> dict[str, ReplicaSpec]:
        raw = (job.get("spec") or {}).get(self.specs_field) or {}
        if not isinstance(raw, Mapping) or not raw:
            raise Invalid(f"spec.{self.specs_field}", "no replica specs", fix="add at least one replica type")
        canonical = self._canonical.get(self.replica_types)
        if canonical is None:
            canonical = self._canonical[self.replica_types] = {t.lower(): t for t in self.replica_types}
        found: dict[str, ReplicaSpec] = {}
        for key, body in raw.items():
            rtype = canonical.get(str(key).lower())
            if rtype is None:
                raise Invalid(f"spec.{self.specs_field}.{key}", "unsupported replica type",
                              fix=f"use one of {', '.join(self.replica_types)}")
            body = body or {}
            replicas = body.get("replicas")
            template = self.default_port_on(body.get("template") or {})
            found[rtype] = ReplicaSpec(rtype, DEFAULT_REPLICAS if replicas is None else int(replicas), template,
                                       str(body.get("restartPolicy") or self.default_restart))
        return {t: found[t] for t in self.replica_types if t in found}

    def _main_index(self, template: Mapping[str, Any], *, fallback: bool) -> int | None:
        """Index of the main container (by name; else the first one when ``fallback``), None if none."""
        containers = (template.get("spec") or {}).get("containers") or []
        for i, container in enumerate(containers):
            if container.get("name") == self.container:
                return i
        return 0 if fallback and containers else None

    def main_container(self, template: Mapping[str, Any], *, fallback: bool) -> dict[str, Any] | None:
        index = self._main_index(template, fallback=fallback)
        if index is None:
            return None
        container = template["spec"]["containers"][index]
        return container if isinstance(container, dict) else dict(container)

    def default_port_on(self, template: Mapping[str, Any]) -> dict[str, Any]:
        """``template`` with the default port on its main container (upstream's in-memory defaulting).

        The job's own template is never changed: when a port is added, the dicts and lists on the way to
        it (template, spec, containers, that container) are copied and the rest is shared, so a pass
        copies nothing for a template that already names its port. ``build_pod`` deep-copies the result
        before it changes anything."""
        out = dict(template)
        index = self._main_index(template, fallback=True)
        if index is None or not self.port_name:
            return out
        containers = list(template["spec"]["containers"])
        container = containers[index]
        ports = container.get("ports") or []
        if any(p.get("name") == self.port_name for p in ports):
            return out
        containers[index] = {**container, "ports": [*ports, {"name": self.port_name,
                                                             "containerPort": self.default_port}]}
        out["spec"] = {**template["spec"], "containers": containers}
        return out

    def port_of(self, spec: ReplicaSpec | None) -> int | None:
        if spec is None:
            return None
        container = self.main_container(spec.template, fallback=False)
        for port in (container or {}).get("ports") or []:
            if port.get("name") == self.port_name:
                return int(port["containerPort"])
        return None

    # --- hooks --------------------------------------------------------------------------------
    def is_master_role(self, specs: Mapping[str, ReplicaSpec], rtype: str, index: int) -> bool:
        if "Master" in specs:
            return rtype == "Master"
        return rtype == "Worker" and index == 0

    def pod_env(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec], rtype: str,
                index: int) -> list[dict[str, Any]]:
        return []

    def init_containers(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec], rtype: str,
                        index: int) -> list[dict[str, Any]]:
        return []

    def leader(self, specs: Mapping[str, ReplicaSpec]) -> str | None:
        """The replica type whose success is the job's success; None: every Worker must succeed."""
        return "Master" if "Master" in specs else None

    def messages(self, job: Mapping[str, Any], leader: bool) -> tuple[str, str]:
        """(running, succeeded) messages; upstream words them differently with and without a leader."""
        meta = _meta(job)
        name, ns = meta.get("name", ""), meta.get("namespace", "")
        if leader:
            return f"{self.kind} {name} is running.", f"{self.kind} {name} is successfully completed."
        return f"{self.kind} {ns}/{name} is running.", f"{self.kind} {ns}/{name} successfully completed."

    def any_worker_success(self, job: Mapping[str, Any]) -> bool:
        """Whether one succeeded Worker is enough without a leader (PyTorch elastic)."""
        return False

    # --- the pass -----------------------------------------------------------------------------
    def starting(self, job: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
        """Whether ``status`` says Running (its latest condition) while replicas are still to start: fewer active
        than the spec asks for of some type, and none succeeded or failed. The apply loop holds such a status as
        it holds Created (``worker_agent.apply``): pods started moments apart then cost one status write, not
        one per pod (a Master's, then its Worker's)."""
        if latest_condition(status) != cond.RUNNING:
            return False
        try:
            specs = self.defaulted_specs(job)
        except Invalid:
            return False
        entries = status.get("replicaStatuses") or {}
        short = False
        for rtype, rspec in specs.items():
            entry = entries.get(rtype) or {}
            if _count(entry, "succeeded") or _count(entry, "failed"):
                return False
            short = short or _count(entry, "active") < rspec.replicas
        return short

    @staticmethod
    def settles_after(status: Mapping[str, Any] | None) -> bool:
        """Whether a render right after a pass's own creates and status write (``status``; None: none)
        plans nothing (tests/agent/test_settles.py): new pods count in no replica status until their phase
        changes, an event of its own, and a running job's status is a fixed point of the pass that wrote
        it. Not a finished one: the pass after it moves active replicas to succeeded, as upstream's does."""
        return status is None or not cond.is_finished(dict(status))

    def render(self, observed: Observed) -> Plan:
        job, now = observed.job, observed.now
        plan = Plan()
        meta = _meta(job)
        spec = job.get("spec") or {}
        run_policy = spec.get("runPolicy") or {}
        managed_by = run_policy.get("managedBy")
        # upstream compares a *string pointer*: any set value but the operator's own, "" included,
        # belongs to another controller (ManagedByExternalController)
        if (managed_by is not None and managed_by != mkd_labels.TRAINING_OPERATOR) or meta.get("deletionTimestamp"):
            return plan
        name = str(meta.get("name", ""))
        try:
            specs = self.defaulted_specs(job)
        except Invalid as exc:
            plan.events.append(("Warning", "InvalidSpec", exc.message))
            return plan
        old: dict[str, Any] = job.get("status") or {}
        status = json_copy(old)
        if cond.get_condition(status, cond.CREATED) is None and not status.get("conditions"):
            cond.set_condition(status, cond.CREATED, "True", self.reason("Created"),
                               f"{self.kind} {name} is created.", now)
        uid = meta.get("uid")
        pods = [p for p in observed.children.get(PODS.plural, []) if self._controlled(p, uid)]
        services = list(observed.children.get(SERVICES.plural, []))
        suspend = bool(run_policy.get("suspend"))

        if cond.is_finished(status):
            if cond.has_true(status, cond.SUCCEEDED):
                for entry in (status.get("replicaStatuses") or {}).values():
                    entry["succeeded"] = _count(entry, "succeeded") + _count(entry, "active")
                    entry["active"] = 0
            self._delete_pods_and_services(plan, run_policy, pods, services, finished=True)
            if not suspend:
                self._ttl(plan, run_policy, status, now)
            return self._finish(plan, old, status)

        if suspend:
            self._delete_pods_and_services(plan, run_policy, pods, services, finished=False)
            for entry in (status.get("replicaStatuses") or {}).values():
                entry["active"] = 0
            msg = f"{self.kind} {name} is suspended."
            changed = False
            if cond.has_true(status, cond.RUNNING):
                changed |= cond.set_condition(status, cond.RUNNING, "False", self.reason("Suspended"), msg, now)
            if not cond.has_true(status, cond.SUSPENDED):
                changed |= cond.set_condition(status, cond.SUSPENDED, "True", self.reason("Suspended"), msg, now)
            if changed:
                plan.events.append(("Normal", self.reason("Suspended"), msg))
            return self._finish(plan, old, status)

        if cond.has_true(status, cond.SUSPENDED):
            msg = f"{self.kind} {name} is resumed."
            cond.set_condition(status, cond.SUSPENDED, "False", self.reason("Resumed"), msg, now)
            status["startTime"] = cond.rfc3339(now)
            plan.events.append(("Normal", self.reason("Resumed"), msg))

        failure = self._past_limits(job, specs, run_policy, status, pods, now)
        if failure:
            if not status.get("completionTime"):
                status["completionTime"] = cond.rfc3339(now)
            cond.set_condition(status, cond.FAILED, "True", self.reason("Failed"), failure, now)
            plan.events.append(("Normal", self.reason("Failed"), failure))
            self._delete_pods_and_services(plan, run_policy, pods, services, finished=True)
            self._ttl(plan, run_policy, status, now)
            return self._finish(plan, old, status)

        conflicts: list[str] = []
        pod_groups, service_groups = self._by_replica(pods), self._by_replica(services)
        try:
            for rspec in specs.values():
                self._reconcile_pods(plan, job, specs, rspec, pod_groups, status, now)
                conflicts += self._reconcile_services(plan, job, rspec, service_groups)
        except PassAborted as exc:
            # upstream: a Pod or Service that cannot be built ("port not found", "failed to find the
            # port") aborts the pass before the status update; what was already planned still
            # happens, and the next pass retries
            plan.events.append(("Warning", exc.reason, exc.message))
            return plan
        self._update_job_status(plan, job, specs, status, now)
        if conflicts:
            # not an upstream field: the dispatcher only sees .status, and this blocks the job
            status["message"] = "; ".join(conflicts)
        else:
            status.pop("message", None)

        if cond.is_finished(status):
            if not status.get("completionTime"):
                # deliberate difference: upstream leaves it unset on the ExitCode 1-127 path
                status["completionTime"] = cond.rfc3339(now)
            self._ttl(plan, run_policy, status, now)
        else:
            self._deadline_requeue(plan, run_policy, status, now)
        return self._finish(plan, old, status)

    # --- pieces of the pass -----------------------------------------------------------------
    @staticmethod
    def _controlled(obj: Mapping[str, Any], uid: Any) -> bool:
        if not uid:
            return True
        return any(ref.get("controller") and ref.get("uid") == uid
                   for ref in _meta(obj).get("ownerReferences") or [])

    @staticmethod
    def _finish(plan: Plan, old: Mapping[str, Any], status: dict[str, Any]) -> Plan:
        _drop_zeros(status)
        if status != old:
            plan.status = status
        return plan

    def _delete_pods_and_services(self, plan: Plan, run_policy: Mapping[str, Any],
                                  pods: list[dict[str, Any]], services: list[dict[str, Any]],
                                  *, finished: bool) -> None:
        policy = run_policy.get("cleanPodPolicy") or "None"
        if finished and policy == "None":
            return
        service_names = {_meta(s).get("name") for s in services}
        for pod in pods:
            if finished and policy == "Running" and _phase(pod) not in ("Running", "Pending"):
                continue
            pod_name = str(_meta(pod).get("name"))
            if not _meta(pod).get("deletionTimestamp"):
                plan.deletes.append((PODS, pod_name))
            if pod_name in service_names:
                plan.deletes.append((SERVICES, pod_name))

    def _ttl(self, plan: Plan, run_policy: Mapping[str, Any], status: Mapping[str, Any], now: datetime) -> None:
        ttl = run_policy.get("ttlSecondsAfterFinished")
        completed = cond.parse_time(status.get("completionTime"))
        if ttl is None or completed is None:
            return
        remaining = (completed + timedelta(seconds=int(ttl)) - now).total_seconds()
        if remaining <= 0:
            plan.delete_job = True
        else:
            plan.requeue_after = _sooner(plan.requeue_after, remaining)

    @staticmethod
    def _deadline_requeue(plan: Plan, run_policy: Mapping[str, Any], status: Mapping[str, Any],
                          now: datetime) -> None:
        deadline = run_policy.get("activeDeadlineSeconds")
        if deadline is None:
            return
        started = cond.parse_time(status.get("startTime"))
        if started is None:
            return
        remaining = (started + timedelta(seconds=int(deadline)) - now).total_seconds()
        plan.requeue_after = _sooner(plan.requeue_after, max(remaining, 0.0) + 0.001)

    def _past_limits(self, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec],
                     run_policy: Mapping[str, Any], status: Mapping[str, Any],
                     pods: list[dict[str, Any]], now: datetime) -> str:
        name = _meta(job).get("name", "")
        backoff = run_policy.get("backoffLimit")
        if backoff is not None:
            active = sum(1 for p in pods if _phase(p) not in ("Succeeded", "Failed")
                         and not _meta(p).get("deletionTimestamp"))
            failed = sum(1 for p in pods if _phase(p) == "Failed")
            total = sum(s.replicas for s in specs.values())
            previous_failed = sum(_count(e, "failed") for e in (status.get("replicaStatuses") or {}).values())
            # the v1 work queue's requeue count is always 0, so (requeues + 1) > limit means limit == 0
            exceeds = failed > previous_failed and active != total and 1 > int(backoff)
            if exceeds or self._past_backoff(specs, pods, int(backoff)):
                return f"Job {name} has failed because it has reached the specified backoff limit"
        deadline = run_policy.get("activeDeadlineSeconds")
        started = cond.parse_time(status.get("startTime")) if deadline is not None else None
        if deadline is not None and started is not None and (now - started).total_seconds() >= int(deadline):
            return f"Job {name} has failed because it was active longer than specified deadline"
        return ""

    @staticmethod
    def _past_backoff(specs: Mapping[str, ReplicaSpec], pods: list[dict[str, Any]], limit: int) -> bool:
        restarts = 0
        for rtype, spec in specs.items():
            if spec.restart_policy not in ("OnFailure", "Always", "ExitCode"):
                continue
            for pod in pods:
                if _meta(pod).get("labels", {}).get(REPLICA_TYPE) != rtype.lower() or _phase(pod) != "Running":
                    continue
                pstatus = pod.get("status") or {}
                for cs in [*(pstatus.get("initContainerStatuses") or []), *(pstatus.get("containerStatuses") or [])]:
                    restarts += int(cs.get("restartCount", 0) or 0)
        return restarts > 0 if limit == 0 else restarts >= limit

    @staticmethod
    def _by_replica(objs: list[dict[str, Any]]) -> dict[str, dict[int, list[dict[str, Any]]]]:
        """``objs`` by their replica-type label and replica-index (those without a non-negative integer index
        are skipped, as upstream does), grouped once per pass for every replica type."""
        grouped: dict[str, dict[int, list[dict[str, Any]]]] = {}
        for obj in objs:
            obj_labels = _meta(obj).get("labels") or {}
            rtype = obj_labels.get(REPLICA_TYPE)
            if rtype is None:
                continue
            try:
                index = int(obj_labels.get(REPLICA_INDEX, ""))
            except ValueError:
                continue
            if index >= 0:
                grouped.setdefault(rtype, {}).setdefault(index, []).append(obj)
        return grouped

    @staticmethod
    def _slices(grouped: Mapping[str, Mapping[int, list[dict[str, Any]]]], rtype: str,
                replicas: int) -> list[list[dict[str, Any]]]:
        """One bucket per index of ``rtype`` (``_by_replica``): max(highest index + 1, replicas) of them."""
        by_index = grouped.get(rtype.lower()) or {}
        size = max([replicas, *(i + 1 for i in by_index)])
        return [by_index.get(i, []) for i in range(size)]

    def _reconcile_pods(self, plan: Plan, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec],
                        rspec: ReplicaSpec, pods: Mapping[str, Mapping[int, list[dict[str, Any]]]],
                        status: dict[str, Any], now: datetime) -> None:
        rtype = rspec.rtype
        status.setdefault("replicaStatuses", {})[rtype] = {}
        entry = status["replicaStatuses"][rtype]
        name = _meta(job).get("name", "")
        for index, bucket in enumerate(self._slices(pods, rtype, rspec.replicas)):
            if len(bucket) > 1:
                plan.events.append(("Warning", "TooManyPods",
                                    f"We have too many pods for {rtype.lower()} {index}"))
                continue
            if not bucket:
                if index < rspec.replicas:
                    plan.creates.append((PODS, self.build_pod(plan, job, specs, rspec, index)))
                continue
            pod = bucket[0]
            pod_name = str(_meta(pod).get("name"))
            terminating = bool(_meta(pod).get("deletionTimestamp"))
            if index >= rspec.replicas and not terminating:
                plan.deletes.append((PODS, pod_name))
            exit_code = RETRYABLE_MAGIC
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                terminated = (cs.get("state") or {}).get("terminated")
                if cs.get("name") == self.container and terminated:
                    exit_code = int(terminated.get("exitCode", 0))
            if _phase(pod) == "Failed":
                policy = rspec.restart_policy
                if policy in ("OnFailure", "Always") or (policy == "ExitCode" and exit_code >= 128):
                    if not terminating and (PODS, pod_name) not in plan.deletes:
                        plan.deletes.append((PODS, pod_name))
                    msg = f"job {name} is restarting because {rtype} replica(s) failed."
                    if cond.set_condition(status, cond.RESTARTING, "True", self.reason("Restarting"), msg, now):
                        plan.events.append(("Warning", self.reason("Restarting"), msg))
                elif policy == "ExitCode":
                    msg = f"job {name} is failed because {rtype} replica(s) failed."
                    if cond.set_condition(status, cond.FAILED, "True", self.reason("Failed"), msg, now):
                        plan.events.append(("Warning", self.reason("Failed"),
                                            f"{msg} Pod {pod_name} exited with code {exit_code}"))
            phase = _phase(pod)
            if phase == "Running":
                _bump(entry, "failed" if terminating else "active")
            elif phase == "Succeeded":
                _bump(entry, "succeeded")
            elif phase == "Failed":
                _bump(entry, "failed")

    def _reconcile_services(self, plan: Plan, job: Mapping[str, Any], rspec: ReplicaSpec,
                            services: Mapping[str, Mapping[int, list[dict[str, Any]]]]) -> list[str]:
        """Create / delete the per-index Services; returns one line per index blocked by duplicates."""
        rtype = rspec.rtype
        conflicts: list[str] = []
        for index, bucket in enumerate(self._slices(services, rtype, rspec.replicas)):
            if len(bucket) > 1:
                names = ", ".join(sorted(str(_meta(s).get("name")) for s in bucket))
                text = (f"We have too many services for {rtype.lower()} {index}: {names}; "
                        "creating nothing for this index until only one matches")
                plan.events.append(("Warning", "TooManyServices", text))
                conflicts.append(text)
                continue
            if not bucket:
                if index < rspec.replicas:
                    plan.creates.append((SERVICES, self.build_service(plan, job, rspec, index)))
                continue
            if index >= rspec.replicas:
                plan.deletes.append((SERVICES, str(_meta(bucket[0]).get("name"))))
        return conflicts

    def _update_job_status(self, plan: Plan, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec],
                           status: dict[str, Any], now: datetime) -> None:
        if not status.get("startTime"):
            status["startTime"] = cond.rfc3339(now)
        name = _meta(job).get("name", "")
        leader = self.leader(specs)
        running_msg, done_msg = self.messages(job, leader is not None)
        for rtype in specs:  # before the loop: an early return must not leave an rtype without one
            _replica_status(status, rtype)["selector"] = self.selector(job, rtype)
        for rtype, rspec in specs.items():
            entry = _replica_status(status, rtype)
            succeeded, running, failed = _count(entry, "succeeded"), _count(entry, "active"), _count(entry, "failed")
            expected = rspec.replicas - succeeded
            if rtype == leader:
                if running > 0:
                    cond.set_condition(status, cond.RUNNING, "True", self.reason("Running"), running_msg, now)
                if expected == 0:
                    self._succeed(plan, status, done_msg, now)
                    return
            elif leader is None and rtype == "Worker":
                if expected == 0 or (self.any_worker_success(job) and succeeded > 0):
                    self._succeed(plan, status, done_msg, now)
                elif running > 0:
                    cond.set_condition(status, cond.RUNNING, "True", self.reason("Running"), running_msg, now)
            if failed > 0 and rspec.replicas > succeeded + running:
                if rspec.restart_policy != "Never":
                    msg = f"{self.kind} {name} is restarting because {failed} {rtype} replica(s) failed."
                    if cond.set_condition(status, cond.RESTARTING, "True", self.reason("Restarting"), msg, now):
                        plan.events.append(("Warning", self.reason("Restarting"), msg))
                else:
                    msg = f"{self.kind} {name} is failed because {failed} {rtype} replica(s) failed."
                    if not status.get("completionTime") and not cond.has_true(status, cond.FAILED):
                        status["completionTime"] = cond.rfc3339(now)
                    if cond.set_condition(status, cond.FAILED, "True", self.reason("Failed"), msg, now):
                        plan.events.append(("Normal", self.reason("Failed"), msg))

    def _succeed(self, plan: Plan, status: dict[str, Any], msg: str, now: datetime) -> None:
        if cond.has_true(status, cond.FAILED):
            return
        if not status.get("completionTime"):
            status["completionTime"] = cond.rfc3339(now)
        if cond.set_condition(status, cond.SUCCEEDED, "True", self.reason("Succeeded"), msg, now):
            plan.events.append(("Normal", self.reason("Succeeded"), msg))

    # --- objects ----------------------------------------------------------------------------------
    def build_pod(self, plan: Plan, job: Mapping[str, Any], specs: Mapping[str, ReplicaSpec],
                  rspec: ReplicaSpec, index: int) -> dict[str, Any]:
        template = json_copy(rspec.template)
        tmeta = template.get("metadata") or {}
        pod_labels = dict(tmeta.get("labels") or {})
        pod_labels.update(self.replica_labels(job, rspec.rtype, index))
        if self.is_master_role(specs, rspec.rtype, index):
            pod_labels[JOB_ROLE] = "master"
        meta: dict[str, Any] = {"name": self.child_name(job, rspec.rtype, index),
                                "namespace": _meta(job).get("namespace"), "labels": pod_labels}
        if tmeta.get("annotations"):
            meta["annotations"] = dict(tmeta["annotations"])
        if tmeta.get("finalizers"):
            meta["finalizers"] = list(tmeta["finalizers"])
        pod_spec: dict[str, Any] = template.get("spec") or {}
        try:
            env = self.pod_env(job, specs, rspec.rtype, index)
        except Invalid as exc:
            raise PassAborted("FailedCreatePod", exc.message) from exc
        for i, container in enumerate(pod_spec.get("containers") or []):
            # ``env`` is built for this pod: the first container takes it, the others a copy each
            container["env"] = [*(container.get("env") or []), *(env if i == 0 else json_copy(env))]
        inits = self.init_containers(job, specs, rspec.rtype, index)
        if inits:
            pod_spec["initContainers"] = [*(pod_spec.get("initContainers") or []), *inits]
        if pod_spec.get("restartPolicy"):
            plan.events.append(("Warning", "SetPodTemplateRestartPolicy",
                                "Restart policy in pod template will be overwritten by restart policy in replica spec"))
        pod_spec["restartPolicy"] = "Never" if rspec.restart_policy == "ExitCode" else rspec.restart_policy
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}

    def build_service(self, plan: Plan, job: Mapping[str, Any], rspec: ReplicaSpec,
                      index: int) -> dict[str, Any]:
        container = self.main_container(rspec.template, fallback=False)
        if container is None:
            raise PassAborted("FailedCreateService",
                              f"failed to find the port: no container named {self.container} in {rspec.rtype}")
        labels = self.replica_labels(job, rspec.rtype, index)
        ports = [{"name": p["name"], "port": p["containerPort"]}
                 for p in container.get("ports") or [] if p.get("name")]
        spec: dict[str, Any] = {"clusterIP": "None", "selector": dict(labels)}
        if ports:
            spec["ports"] = ports
        return {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": self.child_name(job, rspec.rtype, index),
                             "namespace": _meta(job).get("namespace"), "labels": labels},
                "spec": spec}


def _sooner(current: float | None, candidate: float) -> float:
    return candidate if current is None else min(current, candidate)
