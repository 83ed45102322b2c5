"""Intake of Pods: the manager's Pod events turned into events of the one Job mkd queues per single Pod or pod group.

Pods have no managedBy; a Pod is headed for mkd when it names a queue (``kueue.x-k8s.io/queue-name``) and
carries Kueue's ``kueue.x-k8s.io/admission`` scheduling gate (``federation.kinds.pod``). Intake watches only Pods
with the queue label (:data:`SELECTOR`), and this module keeps the members of each group it saw, by namespace and
``kueue.x-k8s.io/pod-group-name`` (a single Pod is kept nowhere: it is its own group object at once). A group's
object is passed on once ``pod-group-total-count`` runnable members exist (Kueue composes its Workload then too;
at once when a member's count is missing or not a positive integer, so that it is refused with the field), and
again on each change (intake's filter keeps what the engine needs: a new group, a deletion). A member deleted,
or marked for deletion, ends its group: the group object goes as deleted (its worker pods are deleted), and pods
made again form a new group (a new uid). Nothing here writes to the cluster; a Pod that names a queue but lacks the
gate gets intake's Warning Event (:func:`not_gated`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from federation import labels
from federation.kinds import pod as pods
from federation.kinds.base import as_map, get_path

SELECTOR = labels.QUEUE_NAME
"""Intake lists and watches only the manager's Pods that name a queue (a label-exists selector)."""

GroupKey = tuple[str, str]
"""(namespace, group name); a single Pod's group name is ``/`` and its own name (no label value holds a '/')."""


def _key(pod: Mapping[str, Any]) -> GroupKey:
    meta = as_map(pod.get("metadata"))
    group = pods.group_name(pod)
    return str(meta.get("namespace") or ""), group if group is not None else "/" + str(meta.get("name") or "")


class PodGroups:
    """The groups seen on the manager and the group object last passed on for each (module docstring)."""

    def __init__(self) -> None:
        self.members: dict[GroupKey, dict[str, dict[str, Any]]] = {}
        self.passed: dict[GroupKey, dict[str, Any]] = {}
        """The group object last passed on, per group that is complete (or was, until a member went)."""
        self.where: dict[tuple[str, str], GroupKey] = {}
        """(namespace, pod name) -> its group, for deletions a relist reports with a stub."""

    def feed(self, pod: Mapping[str, Any], deleted: bool) -> list[tuple[dict[str, Any], bool]]:
        """The group objects (with whether each is deleted) one Pod event makes."""
        meta = as_map(pod.get("metadata"))
        name, namespace = str(meta.get("name") or ""), str(meta.get("namespace") or "")
        key = self.where.get((namespace, name))
        if key is None and pods.group_name(pod) is None:  # a single Pod: its own group object, nothing kept
            return [(pods.group_object([pod]), deleted or bool(meta.get("deletionTimestamp")))]
        key = key or _key(pod)
        if deleted or meta.get("deletionTimestamp"):
            return self._member_gone(key, namespace, name)
        if _key(pod) != key:  # the group label cannot change (Kueue's webhook refuses it): treat as gone and new
            return self._member_gone(key, namespace, name) + self.feed(pod, False)
        group = self.members.setdefault(key, {})
        group[name] = dict(pod)
        self.where[(namespace, name)] = key
        members = list(group.values())
        if (pods.group_name(pod) is not None and not pods.group_complete(members)
                and all(pods.total_count(p) is not None for p in members)):
            return []  # a member with no usable count is passed on at once: its validation refuses the group
        obj = pods.group_object(members)
        out: list[tuple[dict[str, Any], bool]] = []
        before = self.passed.get(key)
        if before is not None and before["metadata"]["uid"] != obj["metadata"]["uid"]:
            out.append((before, True))  # other pods than before (a member made again): the old group ends
        self.passed[key] = obj
        out.append((obj, False))
        return out

    def _member_gone(self, key: GroupKey, namespace: str, name: str) -> list[tuple[dict[str, Any], bool]]:
        self.where.pop((namespace, name), None)
        group = self.members.get(key)
        if group is not None:
            group.pop(name, None)
            if not group:
                del self.members[key]
        before = self.passed.pop(key, None)
        return [(before, True)] if before is not None else []


def not_gated(pod: Mapping[str, Any]) -> str | None:
    """Why a Pod that names a queue is not taken by mkd (the text of intake's Warning Event), or None."""
    queue = pods.queue_name(pod)
    if queue is None or pods.is_gated(pod) or pods.has_controller(pod):
        return None
    if get_path(pod, ("spec", "nodeName")) or get_path(pod, ("status", "phase")) not in (None, "Pending"):
        where = "it runs on the manager cluster"
    else:
        where = "the manager cluster's scheduler runs it here"
    return (f"has {labels.QUEUE_NAME}={queue} but not the {pods.ADMISSION_GATE} scheduling gate, so mkd does not "
            f"queue or dispatch it and {where}; to have mkd run it on a worker cluster, create it with "
            f"spec.schedulingGates: [{{name: {pods.ADMISSION_GATE}}}] (a gate can only be removed after creation)")
