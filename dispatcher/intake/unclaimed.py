"""Why a Job of the manager cluster has no Workload: who manages it instead.

mkd claims only Jobs whose managedBy is ``kueue.x-k8s.io/multikueue`` and never writes to the others,
so the database knows nothing about them. ``mkctl placements show NAME`` (with ``--kubeconfig``) and the
API's Workload endpoint ask the manager cluster instead: every kind mkd knows is looked up by name and
the answer names the controller the Job is left to, and the field that says so. A Job that names a
Kueue queue but has no managedBy was meant to be queued: intake puts a Warning Event on it
(:func:`queued_but_unmanaged`, once per Job) and the answer says how to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from federation import labels
from federation.errors import FederationError, NotFound
from federation.kinds import registry

NOT_MANAGED_REASON = "NotManagedByMultiKueue"
"""The Warning Event on a Job that names a Kueue queue but not mkd's managedBy."""


def queued_but_unmanaged(kind: Any, job: Mapping[str, Any]) -> str | None:
    """The feedback for a Job that carries ``kueue.x-k8s.io/queue-name`` but no managedBy at all: the user
    meant it to be queued, and mkd leaves it to the kind's own controller. None for every other Job."""
    if kind.name == "Pod":  # the queue label and Kueue's admission gate opt a Pod in
        from dispatcher.intake.podgroups import not_gated

        return not_gated(job)
    md = job.get("metadata") or {}
    queue = (md.get("labels") or {}).get(labels.QUEUE_NAME)
    if not queue or kind.managed_by(job):
        return None
    where = kind.managed_by_field
    return (f"has {labels.QUEUE_NAME}={queue} but {where} is unset, so mkd does not queue or dispatch it and "
            f"{kind.controller} runs it here; to have mkd queue it and run it on a worker cluster, create it with "
            f"{where}: {labels.MULTIKUEUE} ({where} cannot be changed once set)")


async def group_lead(kube: Any, namespace: str, name: str) -> str | None:
    """The Job name under which the pod group of Pod ``namespace/name`` is queued (its first pod by name, as
    ``federation.kinds.pod.group_object`` names it); None: no such Pod, not in a group, or already the lead."""
    from federation.kinds import pod as pods
    from federation.kube import PODS

    try:
        pod = await kube.get(PODS, name, namespace)
        group = pods.group_name(pod)
        if group is None:
            return None
        members = (await kube.list(PODS, namespace, label_selector=f"{pods.GROUP_NAME_LABEL}={group}")).items
    except FederationError:
        return None
    lead = min((str(p["metadata"]["name"]) for p in members), default=name)
    return lead if lead != name else None


async def explain(kube: Any, namespace: str, name: str) -> str | None:
    """One sentence about the Job ``namespace/name`` mkd did not claim, or None when no kind has it."""
    from federation.kube import resource_for

    for kind in registry.kinds():
        try:
            job = await kube.get(resource_for(kind), name, namespace)  # type: ignore[arg-type]
        except NotFound:
            continue  # no such Job of this kind (or the kind is not served)
        except FederationError:
            continue
        managed_by = kind.managed_by(job)
        where = kind.managed_by_field
        if kind.name == "Pod":
            queued = queued_but_unmanaged(kind, job)
            if managed_by == labels.MULTIKUEUE:
                return (f"{namespace}/{name} (Pod) names a queue and is gated but has no Workload yet: a pod of a "
                        "group waits for the group's pod-group-total-count pods, or the dispatcher has not claimed it")
            return f"{namespace}/{name} (Pod) is not managed by mkd: it " + (
                queued or f"names no queue ({labels.QUEUE_NAME}) and no {kind.controller} scheduling gate")
        if not kind.managed_by_path:  # no managedBy field (LeaderWorkerSet): its queue label hands it to mkd
            if managed_by == labels.MULTIKUEUE:
                return (f"{namespace}/{name} ({kind.name}) names a queue ({where}) but has no Workload yet: the "
                        "dispatcher has not claimed it (is it running and watching this namespace?)")
            return (f"{namespace}/{name} ({kind.name}) is left to {kind.controller}: it names no queue, and mkd "
                    f"claims a {kind.name} (which has no managedBy) when it has {where}")
        if managed_by == labels.MULTIKUEUE:
            return (f"{namespace}/{name} ({kind.name}) has {where}: {labels.MULTIKUEUE} but no Workload yet: "
                    "the dispatcher has not claimed it (is it running and watching this namespace?)")
        queued = queued_but_unmanaged(kind, job)
        if queued is not None:
            return f"{namespace}/{name} ({kind.name}) is not managed by mkd: it {queued}"
        owner = managed_by or kind.controller
        value = repr(managed_by) if managed_by else "unset"
        return (f"{namespace}/{name} ({kind.name}) is left to {owner}: its {where} is {value}, "
                f"and mkd only claims Jobs whose {where} is {labels.MULTIKUEUE}")
    return None
