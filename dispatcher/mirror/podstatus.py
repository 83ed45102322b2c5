"""The status of a single Pod or pod group written onto its Pods in the manager cluster, one merge patch per Pod.

The worker reports a group's status as ``status.pods`` (each pod's status by name, ``federation.kinds.pod``);
each manager Pod gets its worker twin's status the MultiKueue way (``federation.kinds.pod.mirrored_status``: the
worker's whole, the manager pod keeping its SchedulingGated condition until the worker pod is scheduled), plus
mkd's own conditions (``kubectl describe pod`` says why a Pod waits or where it runs), placed first. A Pod of the
group no worker status names yet keeps its own status, with mkd's conditions. What was written is kept as the
group's baseline: ``conditions`` (the lead pod's) and ``pods``. The kube writer (``dispatcher.mirror.kubewriter``)
calls this for the Pod kind instead of its one status patch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.workload import MKD_CONDITIONS, merge_patch, merge_status
from federation.kinds import pod as pods
from federation.kinds.base import as_map, get_path


def targets(worker: Mapping[str, Any] | None, mkd: Mapping[str, dict[str, Any]],
            current: Mapping[str, Any] | None, names: list[str]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each pod's (current, new) status: ``worker`` the reported group status (None: none new), ``current`` the
    group's baseline, ``names`` the group's pods."""
    now = pods.pod_statuses(as_map(current))
    new = pods.pod_statuses(worker) if worker is not None else {}
    out: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for name in names:
        mine = now.get(name, {})
        remote = new.get(name)
        theirs = pods.mirrored_status(_own(mine), remote) if remote else None
        out[name] = (mine, merge_status(theirs, mkd, mine))
    return out


def _own(status: Mapping[str, Any]) -> dict[str, Any]:
    """A manager pod's status without mkd's conditions (what ``mirrored_status`` keeps from it)."""
    conds = [c for c in status.get("conditions") or () if as_map(c).get("type") not in MKD_CONDITIONS]
    return {**status, "conditions": conds}


def names_of(job: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> list[str]:
    """The group's pods by name: from the cached group object, else from the baseline."""
    members = [str(get_path(p, ("metadata", "name"))) for p in pods.members_of(job)] if job else []
    return members or sorted(pods.pod_statuses(as_map(current)))


def lead_uid(job: Mapping[str, Any] | None) -> str | None:
    """The lead pod's own uid (a group's Events go to it; the group's uid is not a pod's)."""
    if not job:
        return None
    members = pods.members_of(job)
    uid = get_path(members[0], ("metadata", "uid")) if members else None
    return uid if isinstance(uid, str) else None


async def write(kube: Any, res: Any, namespace: str, changes: Mapping[str, tuple[dict[str, Any], dict[str, Any]]]
                ) -> dict[str, Any]:
    """Patch each pod whose status changes; returns the group's baseline as written (``conditions``: the lead
    pod's, ``pods``). A pod gone meanwhile is skipped (its group's end follows from intake)."""
    from federation.errors import NotFound

    written: dict[str, Any] = {}
    for name, (before, after) in changes.items():
        patch = merge_patch(before, after)
        if not patch:
            written[name] = after
            continue
        try:
            result = await kube.patch(res, name, {"status": patch}, namespace, subresource="status")
        except NotFound:
            continue
        status = result.get("status") if isinstance(result, dict) else None
        written[name] = status if isinstance(status, dict) else after
    lead: dict[str, Any] = next(iter(written.values()), {})
    return {"conditions": list(lead.get("conditions") or []), "pods": written}
