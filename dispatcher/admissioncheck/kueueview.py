"""Kueue's objects as mkd's admission check reads and writes them: pure functions, no I/O.

Which controller serves a ClusterQueue (the ``controllerName`` of the AdmissionChecks it lists), what a
Workload says (its Job, its ClusterQueue, whether Kueue reserved quota for it, evicted or finished it, the
flavors it was assigned, the state of each check), and the two writes mkd makes: its check's entry in a
Workload's ``status.admissionChecks`` (Kueue's ``SetAdmissionCheckState``: the transition time moves only when
the state does) and the ``Active`` condition of its AdmissionChecks (as MultiKueue writes its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from federation import labels, messages
from federation.kube import Resource

CONTROLLER = "mkd.dev/dispatcher"
"""mkd's ``AdmissionCheck.spec.controllerName``."""
MULTIKUEUE = labels.MULTIKUEUE
"""MultiKueue's (``kueue.x-k8s.io/multikueue``)."""
GROUP = "kueue.x-k8s.io"
ADMISSION_CHECKS = Resource(GROUP, "v1beta2", "admissionchecks", "AdmissionCheck", namespaced=False)
WORKLOADS = Resource(GROUP, "v1beta2", "workloads", "Workload")
CLUSTER_QUEUES = Resource(GROUP, "v1beta2", "clusterqueues", "ClusterQueue", namespaced=False)
LOCAL_QUEUES = Resource(GROUP, "v1beta2", "localqueues", "LocalQueue")
RESOURCE_FLAVORS = Resource(GROUP, "v1beta2", "resourceflavors", "ResourceFlavor", namespaced=False)

CheckState = Literal["Pending", "Ready", "Retry", "Rejected"]
Serving = Literal["mkd", "multikueue", "both", "none"]
MESSAGE_MAX = 32768
"""The CRD's maxLength of a check's message."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def format_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- ClusterQueues and their checks ---------------------------------------------------------------


def check_names(cq: Mapping[str, Any]) -> list[str]:
    """The AdmissionChecks a ClusterQueue lists: ``spec.admissionChecks`` and, in v1beta2,
    ``spec.admissionChecksStrategy.admissionChecks[].name`` (for every flavor or some)."""
    spec = _map(cq.get("spec"))
    names = [str(n) for n in _list(spec.get("admissionChecks")) if isinstance(n, str)]
    for rule in _list(_map(spec.get("admissionChecksStrategy")).get("admissionChecks")):
        name = _map(rule).get("name")
        if isinstance(name, str) and name not in names:
            names.append(name)
    return names


def serving(cq: Mapping[str, Any] | None, controllers: Mapping[str, str]) -> Serving:
    """Who dispatches a ClusterQueue's Workloads: mkd, MultiKueue, both (a misconfiguration mkd refuses)
    or neither; ``controllers`` maps AdmissionCheck name to its controllerName."""
    if cq is None:
        return "none"
    names = {controllers.get(n) for n in check_names(cq)}
    mine, theirs = CONTROLLER in names, MULTIKUEUE in names
    return "both" if mine and theirs else "mkd" if mine else "multikueue" if theirs else "none"


def serving_checks(names: Iterable[str], controllers: Mapping[str, str]) -> Serving:
    """Who dispatches a Workload whose status lists the checks ``names`` (Kueue's own copy of its
    ClusterQueue's list, synced by Kueue for each Workload)."""
    served = {controllers.get(n) for n in names}
    mine, theirs = CONTROLLER in served, MULTIKUEUE in served
    return "both" if mine and theirs else "mkd" if mine else "multikueue" if theirs else "none"


def my_checks(cq: Mapping[str, Any] | None, controllers: Mapping[str, str]) -> list[str]:
    """The names of the checks of ``cq`` that mkd serves."""
    return [n for n in check_names(cq or {}) if controllers.get(n) == CONTROLLER]


# --- Workloads ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    name: str
    state: str
    message: str
    since: datetime | None


@dataclass(frozen=True)
class WorkloadView:
    """What mkd reads of one Kueue Workload."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    job_uid: str | None
    job_kind: str | None
    job_name: str | None
    queue_name: str
    cluster_queue: str | None
    quota_reserved: bool
    reserved_since: datetime | None
    evicted_since: datetime | None
    """The Evicted condition's transition time (True or False): when Kueue last evicted or admitted it again."""
    admitted: bool
    evicted: bool
    finished: bool
    active: bool
    cluster_name: str | None
    checks: dict[str, Check] = field(default_factory=dict)
    flavors: dict[str, dict[str, str]] = field(default_factory=dict)
    """PodSet name → resource → flavor, from ``status.admission.podSetAssignments``."""

    def check(self, names: Iterable[str]) -> Check | None:
        """The first of ``names`` this Workload carries a state for."""
        for n in names:
            if n in self.checks:
                return self.checks[n]
        return None


def _condition(status: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in _list(status.get("conditions")):
        if _map(c).get("type") == type_:
            return _map(c)
    return None


def _true(status: Mapping[str, Any], type_: str) -> bool:
    c = _condition(status, type_)
    return c is not None and c.get("status") == "True"


def parse_workload(obj: Mapping[str, Any]) -> WorkloadView:
    md = _meta(obj)
    spec, status = _map(obj.get("spec")), _map(obj.get("status"))
    owner = next((_map(o) for o in _list(md.get("ownerReferences")) if _map(o).get("controller")), None)
    admission = _map(status.get("admission"))
    flavors: dict[str, dict[str, str]] = {}
    for a in _list(admission.get("podSetAssignments")):
        a = _map(a)
        flavors[str(a.get("name") or "main")] = {str(k): str(v) for k, v in _map(a.get("flavors")).items()}
    checks = {}
    for c in _list(status.get("admissionChecks")):
        c = _map(c)
        if isinstance(c.get("name"), str):
            checks[c["name"]] = Check(c["name"], str(c.get("state") or ""), str(c.get("message") or ""),
                                      parse_time(c.get("lastTransitionTime")))
    reserved = _condition(status, "QuotaReserved")
    return WorkloadView(
        namespace=str(md.get("namespace") or ""), name=str(md.get("name") or ""), uid=str(md.get("uid") or ""),
        resource_version=str(md.get("resourceVersion") or ""),
        job_uid=str(owner["uid"]) if owner and owner.get("uid") else None,
        job_kind=str(owner["kind"]) if owner and owner.get("kind") else None,
        job_name=str(owner["name"]) if owner and owner.get("name") else None,
        queue_name=str(spec.get("queueName") or ""),
        cluster_queue=str(admission["clusterQueue"]) if admission.get("clusterQueue") else None,
        quota_reserved=bool(admission) and reserved is not None and reserved.get("status") == "True",
        reserved_since=parse_time(reserved.get("lastTransitionTime")) if reserved else None,
        evicted_since=parse_time((_condition(status, "Evicted") or {}).get("lastTransitionTime")),
        admitted=_true(status, "Admitted"), evicted=_true(status, "Evicted"), finished=_true(status, "Finished"),
        active=spec.get("active") is not False,
        cluster_name=str(status["clusterName"]) if status.get("clusterName") else None,
        checks=checks, flavors=flavors)


def released(w: WorkloadView, mine: Iterable[str]) -> bool:
    """Kueue handed this Workload to mkd: quota reserved, not evicted, finished or deactivated, and mkd's
    check on it Pending or Ready (Retry and Rejected are mkd giving it back). A Workload that carries no state
    for mkd's check (Kueue writes the list whole and adds a missing entry back as Pending) is judged by its
    quota alone."""
    check = w.check(mine)
    return (w.quota_reserved and not w.evicted and not w.finished and w.active
            and (check is None or check.state in ("Pending", "Ready")))


def pod_scheduling(w: WorkloadView, flavors: Mapping[str, Mapping[str, Any]]) -> dict[str, messages.PodScheduling]:
    """Per PodSet, what the flavors Kueue assigned add to its pods (their nodeLabels as a nodeSelector, their
    tolerations), as Kueue's job reconciler adds them when it starts the Job; ``flavors``: ResourceFlavor
    objects by name."""
    out = {}
    for podset, by_resource in w.flavors.items():
        selector: dict[str, str] = {}
        tolerations: list[dict[str, str]] = []
        for name in sorted(set(by_resource.values())):
            spec = _map(_map(flavors.get(name)).get("spec"))
            selector.update({str(k): str(v) for k, v in _map(spec.get("nodeLabels")).items()})
            for t in _list(spec.get("tolerations")):
                t = {str(k): str(v) for k, v in _map(t).items()}
                if t not in tolerations:
                    tolerations.append(t)
        if selector or tolerations:
            out[podset] = messages.PodScheduling(node_selector=selector, tolerations=tolerations)
    return out


# --- what mkd writes ------------------------------------------------------------------------------


def with_check_state(obj: Mapping[str, Any], name: str, state: CheckState, message: str,
                     now: datetime) -> list[dict[str, Any]] | None:
    """The Workload's ``status.admissionChecks`` with check ``name`` set to ``state`` and ``message`` (the
    transition time moves only when the state changes, as Kueue's ``SetAdmissionCheckState``); None when the
    Workload does not carry the check (Kueue adds it; mkd never does) or nothing would change."""
    out: list[dict[str, Any]] = []
    found = changed = False
    message = message[:MESSAGE_MAX]
    for c in _list(_map(obj.get("status")).get("admissionChecks")):
        c = dict(_map(c))
        if c.get("name") == name:
            found = True
            if c.get("state") != state:
                c["state"] = state
                c["lastTransitionTime"] = format_time(now)
                changed = True
            if c.get("message") != message:
                c["message"] = message
                changed = True
        out.append(c)
    return out if found and changed else None


ACTIVE = "Active"


def active_conditions(obj: Mapping[str, Any], now: datetime) -> list[dict[str, Any]] | None:
    """The AdmissionCheck's conditions with ``Active=True`` (reason ``Active``, message ``The admission check is
    active``, its generation observed), as MultiKueue writes its own; None when already so."""
    generation = int(_meta(obj).get("generation") or 0)
    conds = [dict(_map(c)) for c in _list(_map(obj.get("status")).get("conditions"))]
    for c in conds:
        if c.get("type") == ACTIVE:
            if (c.get("status"), c.get("reason"), c.get("observedGeneration")) == ("True", ACTIVE, generation):
                return None
            if c.get("status") != "True":
                c["lastTransitionTime"] = format_time(now)
            c.update(status="True", reason=ACTIVE, message="The admission check is active",
                     observedGeneration=generation)
            return conds
    conds.append({"type": ACTIVE, "status": "True", "reason": ACTIVE, "message": "The admission check is active",
                  "observedGeneration": generation, "lastTransitionTime": format_time(now)})
    return conds
