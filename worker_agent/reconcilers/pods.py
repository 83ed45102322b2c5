"""A single Pod or pod group on a worker: the lead pod is the placed copy, the reconciler creates the others.

The inbox creates the group's lead pod (its first by name) from the Place, carrying the whole group in its
``mkd.dev/pod-group`` annotation (``federation.kinds.pod``). Each pass creates the group's other pods as the
manager has them (Kueue's admission gate removed), named as there, labelled like every child of a placed copy (the
origin and the lead's uid) and owned by the lead pod, so deleting the lead deletes the group. Pods are run by the
worker's scheduler and kubelets, and their status is theirs: the reconciler never writes one. It reports the
group's status (``status.pods``: each pod's by name, ``{}`` for one not made yet) to the dispatcher instead
(``Plan.report``), from which it reads finished: every pod has ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from federation import labels as mkd_labels
from federation.kinds import pod as pods
from federation.kinds.base import as_map, get_path
from federation.kube import PODS, Resource
from worker_agent.reconcilers.base import Observed, Plan, Reconciler
from worker_agent.reconcilers.jobset_support import child_stamp
from worker_agent.reports import placement_of

OWNER_UID_LABEL = mkd_labels.OWNER_UID


class PodGroupReconciler(Reconciler):
    """Creates a group's pods beside its lead pod and reports their statuses (module docstring)."""

    children: tuple[Resource, ...] = (PODS,)
    reports_status = True
    """The status mirrored is the reconciler's report, not the lead pod's own (``Agent.follow_jobs``)."""

    @property
    def kind(self) -> str:
        return pods.POD.name

    def child_selector(self, job: Mapping[str, Any]) -> str:
        return f"{OWNER_UID_LABEL}={(job.get('metadata') or {}).get('uid', '')}"

    def render(self, observed: Observed) -> Plan:
        job = observed.job
        if placement_of(job) is None:
            return Plan()  # a pod of a group, seen by the origin's informer: its lead's pass handles it
        lead = str(get_path(job, ("metadata", "name")) or "")
        have = {str(get_path(p, ("metadata", "name"))): p for p in observed.children.get(PODS.plural, [])}
        stamp = child_stamp(job, OWNER_UID_LABEL)
        plan = Plan()
        statuses: dict[str, dict[str, Any]] = {}
        for member in pods.members_of(job):
            name = str(get_path(member, ("metadata", "name")) or "")
            if name == lead:
                statuses[name] = dict(as_map(job.get("status")))
                continue
            made = have.get(name)
            if made is None:
                plan.creates.append((PODS, pods.worker_pod(member, stamp)))
                statuses[name] = {}
            else:
                statuses[name] = dict(as_map(made.get("status")))
        started = [str(s["startTime"]) for s in statuses.values() if s.get("startTime")]
        plan.report = {"pods": statuses, **({"startTime": min(started)} if started else {})}
        return plan
