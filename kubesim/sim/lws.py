"""A small stand-in for LWS's LeaderWorkerSet controller (leaderworkerset.x-k8s.io/v1), for tests and the demo.

A LeaderWorkerSet gets, for each group index ``i`` below ``spec.replicas``, a leader pod ``<lws>-<i>`` from
``leaderTemplate`` (else ``workerTemplate``) and ``size`` − 1 worker pods ``<lws>-<i>-<j>`` from
``workerTemplate``, labelled as LWS labels them (``leaderworkerset.sigs.k8s.io/name``, ``group-index``,
``worker-index``, ``group-key``; annotations ``size`` and, on workers, ``leader-name``) and owned by the LWS;
they run until deleted. Scaling down deletes the groups at and above the new count. Its status carries LWS's
fields: ``replicas`` (groups whose leader exists), ``readyReplicas`` (groups whose every pod runs and is
ready), ``updatedReplicas``, ``hpaPodSelector``, ``observedGeneration`` and the conditions ``Available``
(``AllGroupsReady``) or ``Progressing`` (``GroupsProgressing``), one True and the other False, as LWS keeps
them. What the real controller does and this does not: no StatefulSets (the leader and worker StatefulSets
are left out, the pods are the LWS's own), no headless Service, no ``LWS_*`` environment variables, no
rolling updates (every group counts as updated), no group restart policies, and ``startupPolicy``
LeaderReady starts the workers with the leader.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

from kubesim.sim.common import RUN_FOREVER, Batched, Key, key_of, log, set_condition

LWS = "leaderworkersets.leaderworkerset.x-k8s.io"
RESOURCES = frozenset({LWS})
PREFIX = "leaderworkerset.sigs.k8s.io"
NAME = f"{PREFIX}/name"
GROUP_INDEX = f"{PREFIX}/group-index"
WORKER_INDEX = f"{PREFIX}/worker-index"
GROUP_KEY = f"{PREFIX}/group-key"
SIZE = f"{PREFIX}/size"
LEADER_NAME = f"{PREFIX}/leader-name"
CONDITIONS = {"Available": ("AllGroupsReady", "All replicas are ready"),
              "Progressing": ("GroupsProgressing", "Replicas are progressing")}


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


class LeaderWorkerSetController(Batched[Key]):
    """The LWS stand-in of one cluster; fed by the Simulation's store subscription."""

    name = "lws"

    def on_change(self, event: str, res: str, obj: Mapping[str, Any]) -> None:
        if res == LWS:
            if event != "DELETED":
                self._mark(key_of(obj))
        elif res == "pods":
            owner = ((obj.get("metadata") or {}).get("labels") or {}).get(NAME)
            if owner:
                self._mark((key_of(obj)[0], owner))

    def reconcile(self, key: Key) -> None:
        lws = self.store.get(LWS, *key)
        if lws is None or lws["metadata"].get("deletionTimestamp"):
            return
        ns, name = key
        spec = lws.get("spec") or {}
        template = spec.get("leaderWorkerTemplate") or {}
        replicas, size = _int(spec.get("replicas"), 1), _int(template.get("size"), 1)
        pods = {p["metadata"]["name"]: p for p in self.store.list("pods", ns, label_selector=f"{NAME}={name}")
                if not p["metadata"].get("deletionTimestamp")}
        for pod_name, pod in list(pods.items()):
            labels = pod["metadata"].get("labels") or {}
            if int(labels.get(GROUP_INDEX, "0")) >= replicas or int(labels.get(WORKER_INDEX, "0")) >= size:
                self.store.delete("pods", ns, pod_name)
                del pods[pod_name]
        for group in range(replicas):
            leader = f"{name}-{group}"
            for worker in range(size):
                pod_name = leader if worker == 0 else f"{leader}-{worker}"
                if pod_name not in pods:
                    pods[pod_name] = self._create_pod(lws, group, worker, size)
        self._status(lws, replicas, size, list(pods.values()))

    def _create_pod(self, lws: Mapping[str, Any], group: int, worker: int, size: int) -> dict[str, Any]:
        meta = lws["metadata"]
        template = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
        source = (template.get("leaderTemplate") if worker == 0 else None) or template.get("workerTemplate") or {}
        leader = f"{meta['name']}-{group}"
        pod_meta = copy.deepcopy(source.get("metadata") or {})
        group_key = hashlib.sha1(f"{meta['namespace']}/{leader}".encode()).hexdigest()
        pod_meta.update(name=leader if worker == 0 else f"{leader}-{worker}", namespace=meta["namespace"],
                        ownerReferences=[{"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                                          "name": meta["name"], "uid": meta["uid"], "controller": True,
                                          "blockOwnerDeletion": True}])
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), NAME: meta["name"], GROUP_INDEX: str(group),
                              WORKER_INDEX: str(worker), GROUP_KEY: group_key}
        notes = {RUN_FOREVER: "true", **(pod_meta.get("annotations") or {}), SIZE: str(size)}
        if worker:
            notes[LEADER_NAME] = leader
        pod_meta["annotations"] = notes
        spec = copy.deepcopy(source.get("spec") or {})
        spec.setdefault("restartPolicy", "Always")
        return self.store.create("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec})

    def _status(self, lws: dict[str, Any], replicas: int, size: int, pods: list[dict[str, Any]]) -> None:
        name, generation = lws["metadata"]["name"], lws["metadata"].get("generation", 1)
        groups: dict[int, list[dict[str, Any]]] = {}
        for pod in pods:
            groups.setdefault(int(pod["metadata"]["labels"][GROUP_INDEX]), []).append(pod)
        created = sum(1 for i in groups if i < replicas and f"{name}-{i}" in {p["metadata"]["name"] for p in groups[i]})
        ready = sum(1 for i, members in groups.items() if len(members) == size and all(_ready(p) for p in members))
        status = copy.deepcopy(lws.get("status") or {})
        status.update(replicas=created, readyReplicas=ready, updatedReplicas=created, observedGeneration=generation,
                      hpaPodSelector=f"{NAME}={name},{WORKER_INDEX}=0")
        conditions = status.setdefault("conditions", [])
        now = "Available" if ready == replicas else "Progressing"
        other = "Progressing" if now == "Available" else "Available"
        set_condition(conditions, now, "True", *CONDITIONS[now])
        if any(c.get("type") == other for c in conditions):  # LWS adds a condition only when it becomes True
            set_condition(conditions, other, "False")
        for condition in conditions:
            condition["observedGeneration"] = generation
        if status != lws.get("status"):
            try:
                self.store.update(LWS, {**lws, "status": status}, subresource="status")
            except Exception as exc:  # a conflict: the next event reconciles again
                log.debug("lws: status of %s: %s", name, exc)
                self._mark(key_of(lws))
