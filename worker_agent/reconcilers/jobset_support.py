"""JobSet building blocks: the webhook's defaults, the controller's ``updateCondition``, child helpers.

Shared by ``jobset.py`` and ``trainjob.py`` (which also stamps the JobSet it produces): the mkd
labels every child carries so one selector lists them, the controller-ownerRef test, and how a
batch Job reads as finished. Pure functions, no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from federation import labels as mkd_labels
from federation.kinds.jobset import DEFAULT_REPLICAS
from worker_agent.reconcilers.conditions import rfc3339

_COPIED_LABELS = (mkd_labels.ORIGIN,)
"""Only the origin: with a workload uid a child (a TrainJob's JobSet) would pass for a placed Job."""


def child_stamp(job: Mapping[str, Any], owner_label: str) -> dict[str, str]:
    """The parent's uid under ``owner_label`` plus its origin label. The origin lets the agent's
    origin-selected informers see a TrainJob's JobSet (and reconcile it as a JobSet); without the
    workload uid and attempt it is never taken for a placed Job (no status Report, no GC)."""
    meta = job.get("metadata") or {}
    parent_labels = meta.get("labels") or {}
    stamp = {key: str(parent_labels[key]) for key in _COPIED_LABELS if key in parent_labels}
    stamp[owner_label] = str(meta.get("uid") or "")
    return stamp


def controlled_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    return any(ref.get("controller") and ref.get("uid") == owner_uid
               for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def job_finished(job: Mapping[str, Any]) -> str:
    """``"Complete"``, ``"Failed"`` or ``""`` from a batch/v1 Job's conditions."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return ""


def with_defaults(js: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy with the JobSet webhook's defaults (never written back)."""
    out = copy.deepcopy(dict(js))
    spec = out.setdefault("spec", {})
    network = spec.get("network") or {}
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    spec["network"] = network
    if not spec.get("successPolicy"):
        spec["successPolicy"] = {"operator": "All"}
    spec["successPolicy"].setdefault("operator", "All")
    spec.setdefault("replicatedJobs", [])
    for rjob in spec["replicatedJobs"]:
        rjob.setdefault("replicas", DEFAULT_REPLICAS)
        template = rjob.setdefault("template", {})
        job_spec = template.setdefault("spec", {})
        if not job_spec.get("completionMode"):
            job_spec["completionMode"] = "Indexed"
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
    return out


def set_condition(status: dict[str, Any], ctype: str, cstatus: str, reason: str, message: str,
                  now: datetime) -> bool:
    """The jobset controller's ``updateCondition``: a status change replaces the entry in place with
    a new lastTransitionTime; a reason/message change keeps it; an absent type is appended only
    when True. True when something changed."""
    conditions = [dict(c) for c in status.get("conditions") or []]
    new = {"type": ctype, "status": cstatus, "reason": reason, "message": message,
           "lastTransitionTime": rfc3339(now)}
    changed = found = False
    for i, cur in enumerate(conditions):
        if cur.get("type") != ctype:
            continue
        found = True
        if cur.get("status") != cstatus:
            conditions[i] = new
            changed = True
        elif cur.get("reason") != reason or cur.get("message") != message:
            new["lastTransitionTime"] = cur.get("lastTransitionTime", new["lastTransitionTime"])
            conditions[i] = new
            changed = True
    if not found and cstatus == "True":
        conditions.append(new)
        changed = True
    if changed:
        status["conditions"] = conditions
    return changed
