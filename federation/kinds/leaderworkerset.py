"""LeaderWorkerSet (leaderworkerset.x-k8s.io/v1): groups of a leader and workers, run on the worker by LWS's controller.

An LWS runs ``replicas`` groups (default 1) of ``leaderWorkerTemplate.size`` pods (default 1). Kueue admits it
per group (one Workload per group index, ``leaderworkerset.podSets``): with a ``leaderTemplate``, ``leader``
× 1 and ``worker`` × size − 1; without one, ``main`` × size from the worker template. MultiKueue sends every
group of an LWS to the same worker cluster together; mkd queues the LWS as one Workload holding all its
groups, so its PodSets are Kueue's per group with the counts times ``replicas``. LWS has no managedBy field:
as in Kueue, an LWS is mkd's when it names a queue (label ``kueue.x-k8s.io/queue-name``), and the manager
must run no LWS controller (it would run the groups a second time there). It has no suspend either: mkd
counts an LWS of zero groups as suspended, and stops a worker copy by scaling it to zero groups, keeping the
count in ``mkd.dev/suspended-replicas`` to restore it. Validation follows LWS's webhook (a DNS-1035 name: it
names the headless Service; replicas 0-1,000,000; size at least 1) and the CRD's enums. An LWS never
finishes: it serves, holding its quota, until deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from federation.errors import Invalid
from federation.jsoncopy import json_copy
from federation.kinds.base import (
    BaseKind,
    Finished,
    as_map,
    get_path,
    int_or,
    podset_for,
    raise_first,
    validate_count,
    validate_dns1035,
    validate_pod_template,
)
from federation.labels import PREFIX
from federation.podset import PodSet

GROUP = "leaderworkerset.x-k8s.io"
CONTROLLER = "lws-controller-manager"
"""LWS's controller (its Deployment's name): LWS has no managedBy value of its own."""
TEMPLATE = ("spec", "leaderWorkerTemplate")
MAX_REPLICAS = 1_000_000
MAX_PODS = 2**31 - 1
"""LWS refuses replicas × size above MaxInt32."""
SUSPENDED_REPLICAS = f"{PREFIX}/suspended-replicas"
"""On a worker copy scaled to zero groups by mkd (fenced): the group count to restore."""
STARTUP_POLICIES = ("LeaderCreated", "LeaderReady")
RESTART_POLICIES = ("Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None")


def replicas_of(job: Mapping[str, Any]) -> int:
    return int_or(get_path(job, ("spec", "replicas")), 1)


def size_of(job: Mapping[str, Any]) -> int:
    return int_or(get_path(job, (*TEMPLATE, "size")), 1)


@dataclass(frozen=True)
class LeaderWorkerSetKind(BaseKind):
    """LeaderWorkerSet; see the module docstring."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors = validate_dns1035(get_path(job, ("metadata", "name")))
        spec = as_map(job.get("spec"))
        replicas = spec.get("replicas")
        errors += validate_count(replicas, "spec.replicas", minimum=0)
        if isinstance(replicas, int) and replicas > MAX_REPLICAS:
            errors.append(Invalid("spec.replicas", f"replicas must be equal or less than {MAX_REPLICAS}",
                                  fix=f"run at most {MAX_REPLICAS:,} groups"))
        policy = spec.get("startupPolicy")
        if policy is not None and policy not in STARTUP_POLICIES:
            errors.append(Invalid("spec.startupPolicy", f"unsupported value {policy!r}",
                                  fix=f"use one of {', '.join(STARTUP_POLICIES)}"))
        template = spec.get("leaderWorkerTemplate")
        if not isinstance(template, Mapping):
            return [*errors, Invalid("spec.leaderWorkerTemplate", "is required",
                                     fix="add a leaderWorkerTemplate with a workerTemplate and a size")]
        size = template.get("size")
        errors += validate_count(size, "spec.leaderWorkerTemplate.size", minimum=1)
        if replicas_of(job) * size_of(job) > MAX_PODS:
            errors.append(Invalid("spec.replicas", f"the product of replicas and worker replicas must not exceed "
                                  f"{MAX_PODS}", fix="run fewer or smaller groups"))
        restart = template.get("restartPolicy")
        if restart is not None and restart not in RESTART_POLICIES:
            errors.append(Invalid("spec.leaderWorkerTemplate.restartPolicy", f"unsupported value {restart!r}",
                                  fix=f"use one of {', '.join(RESTART_POLICIES)}"))
        if template.get("leaderTemplate") is not None:
            errors += validate_pod_template(template["leaderTemplate"], "spec.leaderWorkerTemplate.leaderTemplate")
        errors += validate_pod_template(template.get("workerTemplate"), "spec.leaderWorkerTemplate.workerTemplate")
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        raise_first(self.validate(job))
        template = as_map(get_path(job, TEMPLATE))
        groups, size = replicas_of(job), size_of(job)
        field = "spec.leaderWorkerTemplate"
        worker = as_map(template.get("workerTemplate"))
        leader = template.get("leaderTemplate")
        if isinstance(leader, Mapping):
            return [podset_for("leader", groups, leader, f"{field}.leaderTemplate"),
                    podset_for("worker", groups * (size - 1), worker, f"{field}.workerTemplate")]
        return [podset_for("main", groups * size, worker, f"{field}.workerTemplate")]

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        return None  # an LWS serves until it is deleted (Kueue: never finished)

    def is_suspended(self, job: Mapping[str, Any]) -> bool:
        return bool(get_path(job, ("spec", "replicas")) == 0)

    def with_suspended(self, job: Mapping[str, Any], value: bool) -> dict[str, Any]:
        out = json_copy(dict(job))
        patch = self.suspend_patch(job, value)
        out.setdefault("spec", {})["replicas"] = patch["spec"]["replicas"]
        annotations = dict(as_map(get_path(out, ("metadata", "annotations"))))
        for key, note in patch["metadata"]["annotations"].items():
            if note is None:
                annotations.pop(key, None)
            else:
                annotations[key] = note
        out.setdefault("metadata", {})["annotations"] = annotations
        return out

    def suspend_patch(self, job: Mapping[str, Any], value: bool) -> dict[str, Any]:
        """Zero groups, the count kept in an annotation; resuming restores it."""
        if value:
            return {"spec": {"replicas": 0},
                    "metadata": {"annotations": {SUSPENDED_REPLICAS: str(replicas_of(job))}}}
        kept = get_path(job, ("metadata", "annotations", SUSPENDED_REPLICAS))
        replicas = int(kept) if isinstance(kept, str) and kept.isdigit() else replicas_of(job)
        return {"spec": {"replicas": replicas}, "metadata": {"annotations": {SUSPENDED_REPLICAS: None}}}


LEADERWORKERSET = LeaderWorkerSetKind(
    name="LeaderWorkerSet",
    group=GROUP,
    version="v1",
    plural="leaderworkersets",
    controller=CONTROLLER,
    managed_by_path=(),  # none: handed to mkd by its queue label
    suspend_path=("spec", "replicas"),  # none either: zero groups
    run_by="operator",  # the worker's LWS controller
)
