"""Plain Pods and pod groups the way Kueue's pod integration reads them: opt-in, validation, PodSets, outcome.

Pods have no ``spec.managedBy``. Kueue's pod integration takes a Pod whose namespace its
``managedJobsNamespaceSelector`` matches and that names a LocalQueue in the ``kueue.x-k8s.io/queue-name``
label; its webhook gates the Pod with the ``kueue.x-k8s.io/admission`` scheduling gate at creation, so on a
MultiKueue manager the Pod never runs there (the gate is only ever removed, and MultiKueue never removes it:
the worker's copy runs). A **single Pod** is one Workload with one PodSet ``main`` of one pod. A **pod group**
is every Pod of a namespace with the same ``kueue.x-k8s.io/pod-group-name`` label, each carrying the
``kueue.x-k8s.io/pod-group-total-count`` annotation with the same count: one Workload, composed once that many
runnable Pods exist, with one PodSet per distinct role (the pods whose spec has the same shape: containers'
requests and ports, node selector, affinity, tolerations, runtime class, priority, topology spread, overhead,
resource claims) counting that role's pods, sorted by name, at most 8 (``kueue.x-k8s.io/role-hash``, Kueue's
own name of a role, is used when the webhook wrote it; mkd hashes the same fields otherwise). A single Pod is
finished when it ends (Succeeded or Failed); a group when all its pods have ended: Succeeded when every pod
succeeded, else Failed — mkd does not wait for replacement Pods of a failed member, as Kueue does unless a
member carries ``kueue.x-k8s.io/retriable-in-group: "false"``. Nothing here talks to a cluster.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from federation import labels
from federation.errors import Invalid
from federation.kinds.base import (
    LAST_APPLIED,
    SERVER_SET_METADATA,
    BaseKind,
    Finished,
    as_map,
    get_path,
    podset_for,
    validate_pod_template,
)
from federation.podset import PodSet

ADMISSION_GATE = "kueue.x-k8s.io/admission"
"""The scheduling gate Kueue's webhook adds to the Pods it manages; the manager's scheduler leaves them alone."""
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_TOTAL_COUNT = "kueue.x-k8s.io/pod-group-total-count"
ROLE_HASH = "kueue.x-k8s.io/role-hash"
MAX_PODSETS = 8
"""Kueue's limit on a Workload's PodSets, so on a pod group's roles."""
SINGLE_PODSET = "main"
ENDED = ("Succeeded", "Failed")

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SHAPE_FIELDS = ("affinity", "nodeSelector", "overhead", "priority", "resourceClaims", "runtimeClassName",
                 "tolerations", "topologySpreadConstraints")


def _label_field(key: str) -> str:
    return f"metadata.labels[{key}]"


def _annotation_field(key: str) -> str:
    return f"metadata.annotations[{key}]"


GROUP_NAME_FIELD = _label_field(GROUP_NAME_LABEL)
TOTAL_COUNT_FIELD = _annotation_field(GROUP_TOTAL_COUNT)


def group_name(pod: Mapping[str, Any]) -> str | None:
    """The pod's group (its ``kueue.x-k8s.io/pod-group-name`` label), None for a single Pod."""
    value = as_map(get_path(pod, ("metadata", "labels"))).get(GROUP_NAME_LABEL)
    return value if isinstance(value, str) and value else None


def queue_name(pod: Mapping[str, Any]) -> str | None:
    value = as_map(get_path(pod, ("metadata", "labels"))).get(labels.QUEUE_NAME)
    return value if isinstance(value, str) and value else None


def is_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod still carries Kueue's admission scheduling gate."""
    gates = get_path(pod, ("spec", "schedulingGates"))
    return isinstance(gates, list) and any(isinstance(g, Mapping) and g.get("name") == ADMISSION_GATE
                                           for g in gates)


def has_controller(pod: Mapping[str, Any]) -> bool:
    """Whether a controller owns the pod (a Job's, a ReplicaSet's): that controller is the one queued, not it."""
    refs = get_path(pod, ("metadata", "ownerReferences"))
    return isinstance(refs, list) and any(isinstance(r, Mapping) and r.get("controller") is True for r in refs)


def headed_for_multikueue(pod: Mapping[str, Any]) -> bool:
    """The opt-in, Kueue's: a top-level Pod that names a queue and is held by the admission gate. A Pod without
    the gate is running (or about to) on the manager; taking it to a worker would run it twice."""
    return queue_name(pod) is not None and is_gated(pod) and not has_controller(pod)


def total_count(pod: Mapping[str, Any]) -> int | None:
    """The pod's ``pod-group-total-count`` when it is a positive integer (validation reports the rest)."""
    raw = as_map(get_path(pod, ("metadata", "annotations"))).get(GROUP_TOTAL_COUNT)
    if not isinstance(raw, str) or not raw.strip().lstrip("+").isdigit():
        return None
    value = int(raw)
    return value if value >= 1 else None


def validate_pod(pod: Mapping[str, Any]) -> list[Invalid]:
    """One Pod's own rules: its name, containers and requests, its group metadata as Kueue's webhook checks it
    (both the group label and the total-count annotation, or neither; the count a positive integer)."""
    errors: list[Invalid] = []
    name = get_path(pod, ("metadata", "name"))
    if not isinstance(name, str) or not name:
        errors.append(Invalid("metadata.name", "is required", fix="set a name such as my-pod"))
    # the pod's spec checked as a template's (a field "pod.spec..." read as the pod's own "spec...")
    errors += [Invalid(e.field.removeprefix("pod."), e.detail, fix=e.fix)
               for e in validate_pod_template({"spec": pod.get("spec")}, "pod")]
    group = group_name(pod)
    raw = as_map(get_path(pod, ("metadata", "annotations"))).get(GROUP_TOTAL_COUNT)
    if group is None and raw is not None:
        errors.append(Invalid(GROUP_NAME_FIELD, f"is required when {TOTAL_COUNT_FIELD} is set",
                              fix=f"label every pod of the group with {GROUP_NAME_LABEL}: <group name>, or remove "
                                  f"the {GROUP_TOTAL_COUNT} annotation to run a single Pod"))
    if group is not None:
        if len(group) > 253 or not _SUBDOMAIN.fullmatch(group):
            errors.append(Invalid(GROUP_NAME_FIELD, f"{group!r} is not a valid Workload name (DNS-1123 subdomain)",
                                  fix="use lower case letters, digits, '-' and '.'"))
        if raw is None:
            errors.append(Invalid(TOTAL_COUNT_FIELD, f"is required when {GROUP_NAME_FIELD} is set",
                                  fix=f"annotate every pod of group {group!r} with {GROUP_TOTAL_COUNT}: \"<number of "
                                      "pods in the group>\""))
        elif total_count(pod) is None:
            errors.append(Invalid(TOTAL_COUNT_FIELD, f"{raw!r} is not a positive integer",
                                  fix=f"set it to the number of pods in group {group!r}, as a string such as \"3\""))
    return errors


def validate_group(pods: Sequence[Mapping[str, Any]]) -> list[Invalid]:
    """A group's rules across its members (each already valid on its own): one total count, one queue, no
    more runnable pods than the count, at most 8 roles. Each problem names the pod it was found on."""
    if not pods:
        return []
    first = pods[0]
    first_name = get_path(first, ("metadata", "name"))
    group = group_name(first)
    count, queue = total_count(first), queue_name(first)
    errors: list[Invalid] = []
    for pod in pods[1:]:
        name = get_path(pod, ("metadata", "name"))
        if total_count(pod) != count:
            raw = as_map(get_path(pod, ("metadata", "annotations"))).get(GROUP_TOTAL_COUNT)
            errors.append(Invalid(f"{TOTAL_COUNT_FIELD} (pod {name})",
                                  f"{raw!r} differs from {count} on pod {first_name}",
                                  fix=f"give every pod of group {group!r} the same {GROUP_TOTAL_COUNT}"))
        if queue_name(pod) != queue:
            errors.append(Invalid(f"{_label_field(labels.QUEUE_NAME)} (pod {name})",
                                  f"{queue_name(pod)!r} differs from {queue!r} on pod {first_name}",
                                  fix=f"put every pod of group {group!r} in the same queue"))
    runnable = [p for p in pods if get_path(p, ("status", "phase")) != "Failed"]
    if count is not None and len(runnable) > count:
        errors.append(Invalid(TOTAL_COUNT_FIELD, f"group {group!r} has {len(runnable)} pods, more than its total "
                                                 f"count {count}",
                              fix=f"delete the extra pods or raise {GROUP_TOTAL_COUNT} on every pod"))
    roles = {role_of(p) for p in pods}
    if len(roles) > MAX_PODSETS:
        errors.append(Invalid("spec", f"group {group!r} has {len(roles)} distinct pod roles, more than "
                                      f"{MAX_PODSETS} PodSets",
                              fix="give pods of one role the same requests, ports, node selector, affinity and "
                                  f"tolerations, so the group has at most {MAX_PODSETS} roles"))
    return errors


def group_complete(pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the group's Workload can be composed: as many runnable pods as the total count (Kueue waits)."""
    if not pods:
        return False
    count = total_count(pods[0])
    return count is not None and sum(get_path(p, ("status", "phase")) != "Failed" for p in pods) >= count


def _shape(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What a role is made of (Kueue's pod spec shape): pods with equal shapes share a PodSet."""
    def containers(key: str) -> list[dict[str, Any]]:
        out = []
        for c in spec.get(key) or ():
            c = as_map(c)
            out.append({"ports": c.get("ports"), "resources": {"requests": as_map(c.get("resources")).get("requests")}})
        return out
    shape: dict[str, Any] = {f: spec.get(f) for f in _SHAPE_FIELDS}
    shape["containers"] = containers("containers")
    shape["initContainers"] = containers("initContainers")
    if spec.get("resources") is not None:
        shape["resources"] = as_map(spec.get("resources")).get("requests")
    return {"spec": shape}


def role_of(pod: Mapping[str, Any]) -> str:
    """The pod's role: Kueue's ``role-hash`` annotation when its webhook wrote one, else 8 hex digits of the
    SHA-256 of the spec's shape."""
    written = as_map(get_path(pod, ("metadata", "annotations"))).get(ROLE_HASH)
    if isinstance(written, str) and written:
        return written
    shape = orjson.dumps(_shape(as_map(pod.get("spec"))), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(shape).hexdigest()[:8]


def _template(pod: Mapping[str, Any]) -> dict[str, Any]:
    return {"spec": dict(as_map(pod.get("spec")))}


def single_podsets(pod: Mapping[str, Any]) -> list[PodSet]:
    """A single Pod's one PodSet ``main`` of one pod."""
    return [podset_for(SINGLE_PODSET, 1, _template(pod), "spec")]


def group_podsets(pods: Sequence[Mapping[str, Any]]) -> list[PodSet]:
    """One PodSet per role of the group's runnable pods, named by the role and counting its pods, by name."""
    by_role: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        if get_path(pod, ("status", "phase")) == "Failed":
            continue
        by_role.setdefault(role_of(pod), []).append(pod)
    return [podset_for(role, len(members), _template(members[0]), "spec")
            for role, members in sorted(by_role.items())]


def single_finished(pod: Mapping[str, Any]) -> Finished | None:
    """A single Pod ends with its phase."""
    phase = get_path(pod, ("status", "phase"))
    if phase not in ENDED:
        return None
    status = as_map(pod.get("status"))
    return Finished("Succeeded" if phase == "Succeeded" else "Failed", str(status.get("reason") or phase),
                    str(status.get("message") or ""))


def group_finished(pods: Sequence[Mapping[str, Any]], total: int) -> Finished | None:
    """A group has ended when ``total`` of its pods have, every one of them (Kueue's message: "Pods succeeded:
    n/total.")."""
    phases = [get_path(p, ("status", "phase")) for p in pods]
    ended = [p for p in phases if p in ENDED]
    if len(ended) < total or len(ended) < len(phases):
        return None
    succeeded = sum(p == "Succeeded" for p in phases)
    message = f"Pods succeeded: {succeeded}/{total}."
    if succeeded >= total:
        return Finished("Succeeded", "Succeeded", message)
    return Finished("Failed", "PodFailed", message)


def mirrored_status(local: Mapping[str, Any], remote: Mapping[str, Any]) -> dict[str, Any]:
    """The manager pod's status from its worker copy's, as MultiKueue writes it: the worker's whole, except that
    the manager pod keeps its own ``PodScheduled`` (False, SchedulingGated) until the worker's pod is scheduled,
    so the manager's cluster autoscaler never counts a gated pod as unschedulable. A worker pod with a
    ``startTime`` or past Pending has been scheduled even where its report leaves ``PodScheduled`` out (the
    agent's pod cache keeps only the Ready condition)."""
    out = dict(remote)
    local_sched = _condition(local, "PodScheduled")
    remote_sched = _condition(remote, "PodScheduled")
    scheduled = (remote_sched.get("status") == "True" if remote_sched is not None
                 else bool(remote.get("startTime")) or remote.get("phase") not in (None, "Pending"))
    if local_sched is not None and not scheduled:
        conditions = [c for c in remote.get("conditions") or () if as_map(c).get("type") != "PodScheduled"]
        out["conditions"] = [dict(local_sched), *conditions]
    return out


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def worker_pod(pod: Mapping[str, Any], stamp: Mapping[str, str]) -> dict[str, Any]:
    """The worker's copy of a manager pod: its metadata without what the manager's server set (uid, owner,
    node), ``stamp`` added to its labels, Kueue's admission gate removed (the worker copy runs), no status."""
    meta = {k: v for k, v in as_map(pod.get("metadata")).items() if k not in SERVER_SET_METADATA}
    annotations = {k: v for k, v in as_map(meta.get("annotations")).items() if k != LAST_APPLIED}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    meta["labels"] = {**as_map(meta.get("labels")), **stamp}
    spec = dict(as_map(pod.get("spec")))
    gates = [g for g in spec.get("schedulingGates") or () if as_map(g).get("name") != ADMISSION_GATE]
    if gates:
        spec["schedulingGates"] = gates
    else:
        spec.pop("schedulingGates", None)
    spec.pop("nodeName", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# --- the JobKind: a pod group as one Job ----------------------------------------------------------------------

MEMBERS_ANNOTATION = f"{labels.PREFIX}/pod-group"
"""On a worker's lead pod: the group's pods as the manager has them (JSON), from which the agent creates the rest."""
MAX_MEMBERS_BYTES = 200 * 1024
"""The group's pods must fit in one annotation of the lead pod (a pod's annotations hold 256 KiB at most)."""


def group_object(members: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The one Job mkd queues for a single Pod or a complete pod group: named and labelled as its first pod by
    name (the lead pod, whose Events the group's are), ``spec.pods`` the members as the manager has them,
    ``status.pods`` their statuses by name, ``status.conditions`` mkd's on the lead pod. A single Pod keeps its uid; a
    group's is derived from its members' uids, so the same pods are the same group after a restart and a group made
    again is a new one."""
    ordered = sorted(members, key=lambda p: str(get_path(p, ("metadata", "name")) or ""))
    lead = ordered[0]
    meta = as_map(lead.get("metadata"))
    uids = sorted(str(get_path(p, ("metadata", "uid")) or "") for p in ordered)
    uid = uids[0] if len(ordered) == 1 and group_name(lead) is None else str(
        uuid.uuid5(uuid.NAMESPACE_OID, "mkd.dev/pod-group/" + ",".join(uids)))
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": uid, "generation": 1,
                     "creationTimestamp": meta.get("creationTimestamp"),
                     "labels": dict(as_map(meta.get("labels"))), "annotations": dict(as_map(meta.get("annotations"))),
                     **({"deletionTimestamp": meta["deletionTimestamp"]} if meta.get("deletionTimestamp") else {})},
        "spec": {"pods": [_member(p) for p in ordered]},
        # mkd's conditions on the lead pod stand for the group's (it writes them on every pod alike); the pods' own
        # (a gated pod's PodScheduled) are theirs, in status.pods
        "status": {**({"conditions": mine} if (mine := _mkd_conditions(lead)) else {}),
                   "pods": {str(get_path(p, ("metadata", "name"))): dict(as_map(p.get("status"))) for p in ordered}},
    }


_MKD_CONDITIONS = frozenset({labels.CONDITION_DISPATCHED, labels.CONDITION_REJECTED, labels.CONDITION_PENDING,
                             *labels.KUEUE_CONDITIONS})


def _mkd_conditions(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    found = get_path(pod, ("status", "conditions"))
    return [dict(c) for c in found if isinstance(c, Mapping) and c.get("type") in _MKD_CONDITIONS] \
        if isinstance(found, list) else []


def _member(pod: Mapping[str, Any]) -> dict[str, Any]:
    meta = as_map(pod.get("metadata"))
    out_meta = {k: meta[k] for k in ("name", "uid", "labels", "annotations") if k in meta}
    return {"metadata": out_meta, "spec": dict(as_map(pod.get("spec")))}


def members_of(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The group's pods: ``spec.pods`` of a group object, the lead pod's annotation on a worker, else the pod."""
    listed = get_path(obj, ("spec", "pods"))
    if isinstance(listed, list):
        return [as_map(p) for p in listed]
    carried = as_map(get_path(obj, ("metadata", "annotations"))).get(MEMBERS_ANNOTATION)
    if isinstance(carried, str):
        try:
            decoded = orjson.loads(carried)
        except orjson.JSONDecodeError:
            decoded = None
        if isinstance(decoded, list):
            return [as_map(p) for p in decoded]
    return [obj]


def pod_statuses(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A group status's pods by name (``status.pods``)."""
    pods = status.get("pods")
    return {str(k): dict(as_map(v)) for k, v in pods.items()} if isinstance(pods, Mapping) else {}


@dataclass(frozen=True)
class PodKind(BaseKind):
    """v1 Pod, one Job per single Pod or pod group (module docstring). No managedBy: a Pod is headed for
    MultiKueue by its queue label and Kueue's admission gate, and is never suspended (the gate holds it)."""

    def managed_by(self, job: Mapping[str, Any]) -> str | None:
        members = members_of(job)
        return labels.MULTIKUEUE if members and all(headed_for_multikueue(p) for p in members) else None

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        members = members_of(job)
        if not members:
            return [Invalid("spec.pods", "lists no pod", fix="create the group's pods")]
        errors: list[Invalid] = []
        for pod in members:
            name = get_path(pod, ("metadata", "name"))
            where = f" (pod {name})" if len(members) > 1 else ""
            errors += [Invalid(e.field + where, e.detail, fix=e.fix) for e in validate_pod(pod)]
        if group_name(members[0]) is not None:
            errors += validate_group(members)
            size = len(orjson.dumps([_member(p) for p in members]))
            if size > MAX_MEMBERS_BYTES:
                errors.append(Invalid(GROUP_NAME_FIELD, f"the group's {len(members)} pods take {size // 1024} KiB, "
                                                        f"more than the {MAX_MEMBERS_BYTES // 1024} KiB mkd carries",
                                      fix="split the group, or run its pods as a Job or JobSet"))
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        members = members_of(job)
        if not members:
            raise Invalid("spec.pods", "lists no pod", fix="create the group's pods")
        if group_name(members[0]) is None:
            return single_podsets(members[0])
        return group_podsets(members)

    @property
    def managed_by_field(self) -> str:
        """What hands a Pod to mkd beside its queue label: Kueue's admission gate (removing it takes the Pod back)."""
        return f"spec.schedulingGates[{ADMISSION_GATE}]"

    def is_suspended(self, job: Mapping[str, Any]) -> bool:
        return False

    def suspend_patch(self, job: Mapping[str, Any], value: bool) -> dict[str, Any]:
        """A Pod has nothing to suspend it by: the agent and the fencer delete a placed group's Pods instead."""
        raise Invalid("spec", "a Pod cannot be suspended", fix="delete the Pod; mkd places its group again")

    def with_suspended(self, job: Mapping[str, Any], value: bool) -> dict[str, Any]:
        return dict(job)

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        """From ``status.pods`` (a group's status as the agent reports it): every pod listed there has ended. A
        pod on its own (a single Pod, or one pod of a group as the manager shows it) ends with its phase; a
        worker's lead pod of a group of several ends only with the group."""
        status = as_map(job.get("status"))
        pods = pod_statuses(status)
        if pods:
            if len(pods) == 1 and all(group_name(p) is None for p in members_of(job)):
                return single_finished({"status": next(iter(pods.values()))})
            listed = [{"status": s} for s in pods.values()]
            return group_finished(listed, len(listed))
        if "phase" in status and len(members_of(job)) == 1:
            return single_finished(job)
        return None

    def prepare_for_worker(self, job: Mapping[str, Any], *, stamp: Mapping[str, str],
                           managed_by: str | None) -> dict[str, Any]:
        """The lead pod as the worker gets it, carrying the whole group (:data:`MEMBERS_ANNOTATION`)."""
        members = members_of(job) or [job]
        lead = worker_pod(members[0], stamp)
        carried = [_member({**p, "metadata": {k: v for k, v in as_map(p.get("metadata")).items() if k != "uid"}})
                   for p in members]
        annotations = {k: v for k, v in as_map(as_map(job.get("metadata")).get("annotations")).items()
                       if k != MEMBERS_ANNOTATION}
        annotations.update(as_map(lead["metadata"].get("annotations")))
        annotations[MEMBERS_ANNOTATION] = orjson.dumps(carried).decode()
        lead["metadata"]["annotations"] = annotations
        return lead

    def update_for_worker(self, existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
        """A pod's spec does not change: only its labels and annotations follow (the epoch label)."""
        out = {k: v for k, v in existing.items() if k != "status"}
        metadata = dict(as_map(existing.get("metadata")))
        wanted = as_map(desired.get("metadata"))
        for key in ("labels", "annotations"):
            metadata[key] = dict(as_map(wanted.get(key)))
        out["metadata"] = metadata
        return out


POD = PodKind(
    name="Pod",
    group="",
    version="v1",
    plural="pods",
    controller=ADMISSION_GATE,  # what holds a Pod on the manager: Kueue's admission gate, not a managedBy
    managed_by_path=(),
    suspend_path=(),
    run_by="agent",  # the agent creates the group's other pods from the lead pod (worker_agent/reconcilers/pods.py)
)
