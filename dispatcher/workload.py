"""From a Job to a Workload and back: pure helpers shared by intake, placement and the status mirror.

``describe`` turns a manager Job into the Workload row mkd claims (kind, queue, PodSets, total
requests, suspended) or into the list of problems that make it impossible to run;
``need_of`` reads a Workload row's PodSets back for placement; ``place_command`` builds the
Place Command with the ownership stamp every worker copy carries; ``condition`` builds a
``metav1.Condition`` the way Kubernetes controllers write them.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson

from dispatcher.placement import Need, PodSetDemand
from federation import labels, messages
from federation.clock import rfc3339
from federation.errors import Invalid
from federation.kinds.base import PASSING_CONDITIONS, JobKind
from federation.kinds.base import latest_condition as base_latest_condition
from federation.podset import Resources, format_quantity, parse_quantity, total_requests


@functools.lru_cache(maxsize=4096)
def _quantity(amount: Decimal, resource: str) -> str:
    return format_quantity(amount, resource)


def format_resources(resources: Resources) -> dict[str, str]:
    """Quantity strings per resource (cached: the same few amounts recur in every Job of a kind)."""
    return {name: _quantity(resources[name], name) for name in sorted(resources)}


def meta(job: Mapping[str, Any]) -> Mapping[str, Any]:
    value = job.get("metadata")
    return value if type(value) is dict or isinstance(value, Mapping) else {}  # (the exact type first: ABC checks cost)


def uid_of(job: Mapping[str, Any]) -> str:
    return str(meta(job).get("uid") or "")


def generation_of(job: Mapping[str, Any]) -> int:
    value = meta(job).get("generation")
    return value if isinstance(value, int) else 0


def being_deleted(job: Mapping[str, Any]) -> bool:
    return bool(meta(job).get("deletionTimestamp"))


@dataclass
class Described:
    """What intake learned from one Job: the Workload columns, or why it cannot run."""

    columns: dict[str, Any]
    need: Need | None
    problems: list[Invalid] = field(default_factory=list)


def describe(kind: JobKind, job: Mapping[str, Any], runtime: Mapping[str, Any] | None,
             runtime_problem: Invalid | None = None) -> Described:
    """Validate a Job and compute its PodSets; never raises for a bad Job (problems are returned)."""
    md = meta(job)
    job_labels = md.get("labels") if isinstance(md.get("labels"), Mapping) else {}
    assert isinstance(job_labels, Mapping)
    columns: dict[str, Any] = {
        "uid": uid_of(job), "namespace": str(md.get("namespace") or ""), "name": str(md.get("name") or ""),
        "kind": kind.name, "api_version": kind.api_version,
        "queue": str(job_labels.get(labels.QUEUE_NAME) or labels.DEFAULT_QUEUE),
        "priority": 0, "generation": generation_of(job), "suspended": kind.is_suspended(job),
        "requests": {}, "podsets": [], "excluded": [], "spec_version": 1, "attempt": 0,
        "reason": "", "cluster": None,
        "labels": {str(k): str(v) for k, v in job_labels.items()},  # for label filters (mkctl, API)
    }
    problems: list[Invalid] = [runtime_problem] if runtime_problem is not None else []
    if not problems:
        try:
            problems = list(kind.validate(job, runtime))
        except Invalid as exc:
            problems = [exc]
    if problems:
        return Described(columns, None, problems)
    try:
        requests, podsets, need = _podsets(kind, job, runtime)
    except Invalid as exc:
        return Described(columns, None, [exc])
    columns["requests"] = dict(requests)
    columns["podsets"] = [dict(p, requests=dict(p["requests"])) for p in podsets]
    return Described(columns, need)


_PodSets = tuple[dict[str, str], list[dict[str, Any]], Need]
_PODSETS: collections.OrderedDict[bytes, _PodSets] = collections.OrderedDict()
_PODSETS_MAX = 1024


def _podsets(kind: JobKind, job: Mapping[str, Any], runtime: Mapping[str, Any] | None) -> _PodSets:
    """PodSets as Workload columns, remembered per (kind, spec, runtime): Jobs submitted from one
    template share them, and computing them walks every pod template again (a third of a claim's CPU).
    Only called after ``kind.validate`` passed, so every Job is still validated on its own."""
    try:
        key = orjson.dumps([kind.name, job.get("spec"), runtime], option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON (never from the API server): just compute
        key = b""
    hit = _PODSETS.get(key) if key else None
    if hit is not None:
        _PODSETS.move_to_end(key)
        return hit
    podsets = kind.podsets(job, runtime)
    total = total_requests(podsets)
    rows = [{"name": p.name, "count": p.count, "requests": format_resources(p.requests),
             **constraints_of(p.template)} for p in podsets]
    out: _PodSets = (format_resources(total), rows, need_of(kind.name, rows))
    if key:
        _PODSETS[key] = out
        if len(_PODSETS) > _PODSETS_MAX:
            _PODSETS.popitem(last=False)
    return out


def constraints_of(template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template's scheduling constraints kept on the Workload row (only those present):
    nodeSelector, tolerations, required node affinity terms, priorityClassName."""
    spec = template.get("spec") if isinstance(template.get("spec"), Mapping) else {}
    assert isinstance(spec, Mapping)
    out: dict[str, Any] = {}
    if isinstance(spec.get("nodeSelector"), Mapping) and spec["nodeSelector"]:
        out["nodeSelector"] = {str(k): str(v) for k, v in spec["nodeSelector"].items()}
    if isinstance(spec.get("tolerations"), list) and spec["tolerations"]:
        out["tolerations"] = [dict(t) for t in spec["tolerations"] if isinstance(t, Mapping)]
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if isinstance(terms, list) and terms:
        out["affinity"] = [[dict(e) for e in (t.get("matchExpressions") or []) if isinstance(e, Mapping)]
                           for t in terms if isinstance(t, Mapping)]
    if spec.get("priorityClassName"):
        out["priorityClassName"] = str(spec["priorityClassName"])
    return out


def _demand(p: Mapping[str, Any], per_pod: Resources) -> PodSetDemand:
    tolerations = tuple((str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
                         str(t.get("effect") or "")) for t in p.get("tolerations") or [])
    affinity = tuple(tuple((str(e.get("key") or ""), str(e.get("operator") or "In"),
                            tuple(str(v) for v in e.get("values") or [])) for e in term)
                     for term in p.get("affinity") or [])
    return PodSetDemand(str(p["name"]), int(p["count"]), per_pod,
                        tuple(sorted((p.get("nodeSelector") or {}).items())), tolerations, affinity)


def need_of(kind: str, podsets: list[dict[str, Any]]) -> Need:
    """A Workload row's PodSets as placement input."""
    total: dict[str, Decimal] = {}
    pods = []
    demands = []
    for p in podsets:
        per_pod = {k: parse_quantity(v, f"podsets.{p['name']}.{k}") for k, v in p["requests"].items()}
        pods.append((str(p["name"]), per_pod))
        demands.append(_demand(p, per_pod))
        for k, v in per_pod.items():
            total[k] = total.get(k, Decimal(0)) + v * int(p["count"])
    return Need(kind, total, tuple(pods), tuple(demands))


def problem_text(problems: list[Invalid]) -> str:
    return "; ".join(p.message for p in problems)


def stamp(*, origin: str, uid: str, attempt: int, epoch: int, kind: str) -> dict[str, str]:
    """The labels every worker copy carries (ownership and garbage collection go by them)."""
    return {
        labels.ORIGIN: origin, labels.WORKLOAD_UID: uid, labels.PLACEMENT_ATTEMPT: str(attempt),
        labels.EPOCH: str(epoch), labels.JOB_KIND: kind, labels.KUEUE_ORIGIN: origin,
    }


def place_command(kind: JobKind, job: Mapping[str, Any], *, origin: str, attempt: int, epoch: int,
                  spec_version: int, now: datetime) -> messages.Place:
    """The Place Command for one placement attempt at one spec version.

    The worker copy has managedBy removed (the agent sets what its cluster needs), like MultiKueue.
    """
    uid = uid_of(job)
    md = meta(job)
    manifest = kind.prepare_for_worker(
        job, stamp=stamp(origin=origin, uid=uid, attempt=attempt, epoch=epoch, kind=kind.name), managed_by=None)
    annotations = dict(manifest["metadata"].get("annotations") or {})
    annotations[labels.SPEC_VERSION_ANNOTATION] = str(spec_version)
    annotations[labels.MANAGER_NAMESPACE_ANNOTATION] = str(md.get("namespace") or "")
    annotations[labels.MANAGER_NAME_ANNOTATION] = str(md.get("name") or "")
    manifest["metadata"]["annotations"] = annotations
    return messages.Place(
        placement=messages.PlacementKey(workload_uid=uid, attempt=attempt, epoch=epoch),
        spec_version=spec_version,
        job=messages.JobRef(kind=kind.name, api_version=kind.api_version,
                            namespace=str(md.get("namespace")), name=str(md.get("name"))),
        manifest=manifest, sent_at=now,
    )


def condition(type_: str, status: bool, reason: str, message: str, now: datetime,
              observed_generation: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": type_, "status": "True" if status else "False", "reason": reason,
        "message": message[:32768], "lastTransitionTime": rfc3339(now),
    }
    if observed_generation:
        out["observedGeneration"] = observed_generation
    return out


def reset(type_: str, reason: str, message: str, now: datetime, *, previously: bool = False) -> dict[str, Any]:
    """``type_`` set to False, but only where the Job has it True now (the writer decides, against what the
    Job shows): Kueue's ``resetActiveCondition`` (``previously``: the message becomes "Previously: " and the
    old message) and ``SyncAdmittedCondition``, which change nothing on a Workload that never had it."""
    return {**condition(type_, False, reason, message, now), IF_TRUE: "previously" if previously else "as is"}


def removal(type_: str) -> dict[str, Any]:
    """``type_`` taken off the Job (mkd's ``MultiClusterPending`` once the Workload no longer waits)."""
    return {"type": type_, REMOVE: True}


IF_TRUE = "_ifTrue"
REMOVE = "_remove"
"""Keys of the writer's instructions (``reset``, ``removal``); never written to a Job."""

MKD_CONDITIONS = (*labels.KUEUE_CONDITIONS, labels.CONDITION_DISPATCHED, labels.CONDITION_PENDING,
                  labels.CONDITION_REJECTED)
"""mkd's conditions on the manager Job, in the order they are written there (those False first): with no
condition of its own yet, the Job's STATE (the last type) is what holds now: MultiClusterPending while it
waits, MultiClusterDispatched once placed, MultiClusterRejected when mkd will not run it."""
_RANK = {t: i for i, t in enumerate(MKD_CONDITIONS)}


def _rank(cond: Mapping[str, Any]) -> tuple[bool, int]:
    return cond.get("status") == "True", _RANK.get(cond.get("type"), -1)  # type: ignore[arg-type]


def latest_condition(status: Mapping[str, Any]) -> str | None:
    """The type of the Job's own latest True condition in ``status`` (mkd's are not the Job's), if any."""
    return base_latest_condition(status, MKD_CONDITIONS)


def passing(status: Mapping[str, Any]) -> bool:
    """Whether a worker's (unfinished) ``status`` is one its Job leaves on its own soon: no condition of the
    Job's own is True yet (a batch Job or a JobSet before it ends, any Job before its controller's first
    write), or the latest is :data:`PASSING_CONDITIONS`' (Kubeflow's ``Created``). Running, Restarting,
    Suspended and the finished conditions are not."""
    last = latest_condition(status)
    return last is None or last in PASSING_CONDITIONS


def merge_status(worker: Mapping[str, Any] | None, mkd: Mapping[str, dict[str, Any]],
                 current: Mapping[str, Any] | None, limit: int | None = None) -> dict[str, Any]:
    """The manager Job's new ``.status``: the worker's, replacing the manager's, plus mkd's own conditions.

    Only mkd's conditions (``MKD_CONDITIONS``) are mkd's to keep; everything else comes from the
    worker, whole (nothing the worker no longer has survives; see :func:`merge_patch`). mkd's
    conditions go **first**: every Kubeflow CRD prints ``.status.conditions[-1:].type`` as its
    STATE column, so the Job's own latest condition must stay last; among mkd's, those False go
    first (see ``MKD_CONDITIONS``). Before any worker status arrived (``worker`` None), the
    manager's own non-mkd status is kept. ``limit``: the kind's CRD holds at most that many conditions
    (TrainJob: 8) and refuses a status above it whole: mkd's go first, from the front (False ones, then
    the True ones least telling of where the Job stands); the Job's own are never dropped.
    """
    base = dict(worker) if worker is not None else {
        k: v for k, v in (current or {}).items() if k != "conditions"}
    conds = worker.get("conditions") if worker is not None else (current or {}).get("conditions")
    own = [c for c in (conds or []) if isinstance(c, Mapping) and c.get("type") not in MKD_CONDITIONS]
    out: dict[str, Any] = {k: v for k, v in base.items() if k != "conditions" and v is not None}
    if own or mkd:
        ours = sorted(mkd.values(), key=_rank)
        if limit is not None and len(ours) + len(own) > limit:
            ours = ours[len(ours) + len(own) - limit:] if len(own) < limit else []
        out["conditions"] = [*ours, *own]
    return out


def merge_patch(current: Mapping[str, Any] | None, target: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``current`` into ``target``, at every depth.

    A merge patch merges objects key by key, so sending ``target`` as is would keep nested keys it
    lacks (``replicaStatuses.Launcher.active`` of a finished MPIJob); here each of them is nulled.
    Lists are replaced whole, as a merge patch does anyway.
    """
    patch: dict[str, Any] = {}
    old = current or {}
    for key, value in target.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before or key not in old:
            patch[key] = value
    for key in old:
        if key not in target:
            patch[key] = None
    return patch
