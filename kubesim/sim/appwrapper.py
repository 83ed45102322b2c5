"""A small stand-in for the AppWrapper operator (workload.codeflare.dev/v1beta2), for tests and the demo.

An AppWrapper whose managedBy is unset or ``workload.codeflare.dev/appwrapper-controller`` goes through the
operator's phases: ``Suspended`` (while ``spec.suspend``), ``Resuming`` (its components created, each object
owned by the AppWrapper and labelled, with the pod templates of its PodSets, ``workload.codeflare.dev/appwrapper:
<name>``), ``Running``, then ``Succeeded`` once every expected pod succeeded and none is pending, running or
failed, or ``Failed`` when a pod fails (the components are then deleted). It writes the operator's conditions
(``QuotaReserved``, ``ResourcesDeployed``, ``PodsReady``, ``Unhealthy``, with its reasons) and
``componentStatus`` (name, kind, apiVersion, PodSets). The components run by whatever runs them in the
cluster (kubesim's Job controller, KubeRay stand-in, kubelet). Suspending deletes the components
(``Suspending`` then ``Suspended``). What the real operator does and this does not: retries
(``resettingCount``, the grace periods and retry limit annotations: a failed pod fails the AppWrapper at
once), node health monitoring, the success TTL, and ``podSetInfos`` (Kueue's node selectors and tolerations
are not applied to the pods).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from kubesim.sim.common import Batched, Key, key_of, log, set_condition

APPWRAPPERS = "appwrappers.workload.codeflare.dev"
RESOURCES = frozenset({APPWRAPPERS})
CONTROLLER = "workload.codeflare.dev/appwrapper-controller"
LABEL = "workload.codeflare.dev/appwrapper"
FINAL = ("Succeeded", "Failed")


def _ours(obj: Mapping[str, Any]) -> bool:
    return (obj.get("spec") or {}).get("managedBy") in (None, CONTROLLER)


def _at(obj: Any, path: str) -> Any:
    """The value at a PodSet path (``template.spec.template``, ``template.spec.workerGroupSpecs[0].template``)
    of a component whose ``template`` is ``obj``; None when a step is missing."""
    node: Any = {"template": obj}
    for step in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if step.startswith("["):
            index = int(step[1:-1])
            node = node[index] if isinstance(node, list) and index < len(node) else None
        else:
            node = node.get(step) if isinstance(node, dict) else None
        if node is None:
            return None
    return node


def _count(obj: Any, path: str) -> int:
    value = _at(obj, path)
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def _job_pods(obj: Any, prefix: str) -> int:
    pods = _count(obj, f"{prefix}.parallelism")
    completions = _at(obj, f"{prefix}.completions")
    return completions if isinstance(completions, int) and completions < pods else pods


def _podset_paths(component: Mapping[str, Any]) -> list[tuple[str, int]]:
    """A component's PodSets (path, replicas): declared, or inferred for the kinds the operator knows."""
    declared = component.get("podSets") or []
    if declared:
        return [(p["path"], p.get("replicas", 1)) for p in declared]
    obj = component.get("template") or {}
    kind = (obj.get("apiVersion"), obj.get("kind"))
    if kind == ("batch/v1", "Job"):
        return [("template.spec.template", _job_pods(obj, "template.spec"))]
    if kind == ("jobset.x-k8s.io/v1alpha2", "JobSet"):
        return [(f"template.spec.replicatedJobs[{i}].template.spec.template",
                 _count(obj, f"template.spec.replicatedJobs[{i}].replicas")
                 * _job_pods(obj, f"template.spec.replicatedJobs[{i}].template.spec"))
                for i in range(len((obj.get("spec") or {}).get("replicatedJobs") or []))]
    if kind == ("kubeflow.org/v1", "PyTorchJob"):
        roles = (obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}
        return [(f"template.spec.pytorchReplicaSpecs.{r}.template",
                 _count(obj, f"template.spec.pytorchReplicaSpecs.{r}.replicas")) for r in ("Master", "Worker")
                if r in roles]
    if kind in (("ray.io/v1", "RayCluster"), ("ray.io/v1", "RayJob")):
        prefix = "template.spec." if kind[1] == "RayCluster" else "template.spec.rayClusterSpec."
        groups = _at(obj, prefix + "workerGroupSpecs") or []
        return [(prefix + "headGroupSpec.template", 1)] + [
            (f"{prefix}workerGroupSpecs[{i}].template", _count(obj, f"{prefix}workerGroupSpecs[{i}].replicas"))
            for i in range(len(groups))]
    if kind == ("v1", "Pod"):
        return [("template", 1)]
    if kind in (("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")):
        return [("template.spec.template", _count(obj, "template.spec.replicas"))]
    return []


class AppWrapperOperator(Batched[Key]):
    """The AppWrapper stand-in of one cluster; fed by the Simulation's store subscription."""

    name = "appwrapper"

    def on_change(self, event: str, res: str, obj: Mapping[str, Any]) -> None:
        if res == APPWRAPPERS:
            if event != "DELETED":
                self._mark(key_of(obj))
        elif res == "pods":
            owner = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL)
            if owner:
                self._mark((key_of(obj)[0], owner))

    def _resource(self, template: Mapping[str, Any]) -> str:
        api_version = str(template.get("apiVersion") or "")
        group, _, version = api_version.rpartition("/")
        for rt in self.store.catalogue.in_group_version(group, version):
            if rt.kind == template.get("kind"):
                return str(rt.key)
        raise LookupError(f"no resource for {api_version} {template.get('kind')}")

    def reconcile(self, key: Key) -> None:
        aw = self.store.get(APPWRAPPERS, *key)
        if aw is None or aw["metadata"].get("deletionTimestamp") or not _ours(aw):
            return
        spec, status = aw.get("spec") or {}, copy.deepcopy(aw.get("status") or {})
        conditions = status.setdefault("conditions", [])
        phase = status.get("phase") or ""
        components = spec.get("components") or []
        if not status.get("componentStatus"):
            status["componentStatus"] = [
                {"name": "", "kind": (c.get("template") or {}).get("kind", ""),
                 "apiVersion": (c.get("template") or {}).get("apiVersion", ""),
                 "podSets": [{"path": p, "replicas": n} for p, n in _podset_paths(c)]} for c in components]
        if phase in FINAL:
            self._write(aw, status)
            return
        if spec.get("suspend") is True:
            if phase in ("Resuming", "Running"):
                self._undeploy(aw, status)
                set_condition(conditions, "ResourcesDeployed", "False", "Suspended", "Suspend is true")
                set_condition(conditions, "QuotaReserved", "False", "Suspended", "Suspend is true")
            status["phase"] = "Suspended"
            self._write(aw, status)
            return
        if phase in ("", "Suspended"):
            for ctype, value in (("QuotaReserved", "True"), ("ResourcesDeployed", "True"), ("PodsReady", "False"),
                                 ("Unhealthy", "False")):
                set_condition(conditions, ctype, value, "Resuming", "Suspend is false")
            status["phase"] = "Resuming"
            self._deploy(aw, status)
            status["phase"] = "Running"
            self._write(aw, status)
            return
        self._running(aw, status)

    def _deploy(self, aw: Mapping[str, Any], status: dict[str, Any]) -> None:
        meta = aw["metadata"]
        owner = {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper", "name": meta["name"],
                 "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}
        for index, component in enumerate((aw.get("spec") or {}).get("components") or []):
            obj = copy.deepcopy(component.get("template") or {})
            obj_meta = obj.setdefault("metadata", {})
            obj_meta["namespace"] = meta["namespace"]
            obj_meta["labels"] = {**(obj_meta.get("labels") or {}), LABEL: meta["name"]}
            obj_meta["ownerReferences"] = [owner]
            for path, _ in _podset_paths(component):
                template = _at(obj, path)
                if isinstance(template, dict):
                    tmeta = template.setdefault("metadata", {})
                    tmeta["labels"] = {**(tmeta.get("labels") or {}), LABEL: meta["name"]}
            res = self._resource(obj)
            have = status["componentStatus"][index].get("name") or ""
            if not have or self.store.get(res, meta["namespace"], have) is None:
                created = self.store.create(res, obj)
                status["componentStatus"][index]["name"] = created["metadata"]["name"]
                set_condition(status["componentStatus"][index].setdefault("conditions", []), "ResourcesDeployed",
                              "True", "ComponentCreatedSuccessfully", "")

    def _undeploy(self, aw: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        meta = aw["metadata"]
        deployed = status.get("componentStatus") or []
        for index, component in enumerate((aw.get("spec") or {}).get("components") or []):
            template = component.get("template") or {}
            name = deployed[index].get("name") if index < len(deployed) else None
            res = self._resource(template)
            if name and self.store.get(res, meta["namespace"], name) is not None:
                self.store.delete(res, meta["namespace"], name)
        for pod in self.store.list("pods", meta["namespace"], label_selector=f"{LABEL}={meta['name']}"):
            self.store.delete("pods", meta["namespace"], pod["metadata"]["name"])

    def _running(self, aw: dict[str, Any], status: dict[str, Any]) -> None:
        meta = aw["metadata"]
        conditions = status["conditions"]
        expected = sum(p.get("replicas", 1) for c in status["componentStatus"] for p in c.get("podSets") or [])
        counts = {"Pending": 0, "Running": 0, "Succeeded": 0, "Failed": 0}
        for pod in self.store.list("pods", meta["namespace"], label_selector=f"{LABEL}={meta['name']}"):
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            counts[phase if phase in counts else "Pending"] += 1
        pending, running, succeeded, failed = (counts[p] for p in ("Pending", "Running", "Succeeded", "Failed"))
        if failed > 0:
            set_condition(conditions, "Unhealthy", "True", "FoundFailedPods", "")
            self._undeploy(aw, status)
            message = f"{failed} pods failed"
            set_condition(conditions, "ResourcesDeployed", "False", "Failed", message)
            set_condition(conditions, "QuotaReserved", "False", "Failed", "No resources deployed")
            status["phase"] = "Failed"
        elif succeeded >= expected and pending + running == 0:
            message = f"{succeeded} pods succeeded and no running, pending, or failed pods"
            set_condition(conditions, "QuotaReserved", "False", "Succeeded", message)
            set_condition(conditions, "ResourcesDeployed", "True", "Succeeded", message)
            status["phase"] = "Succeeded"
        elif running + succeeded >= expected:
            set_condition(conditions, "PodsReady", "True", "SufficientPodsReady",
                          f"{running} pods running; {succeeded} pods succeeded")
        else:
            set_condition(conditions, "PodsReady", "False", "InsufficientPodsReady",
                          f"{pending} pods pending; {running} pods running; {succeeded} pods succeeded")
        self._write(aw, status)

    def _write(self, aw: dict[str, Any], status: dict[str, Any]) -> None:
        if status == (aw.get("status") or {}):
            return
        try:
            self.store.update(APPWRAPPERS, {**aw, "status": status}, subresource="status")
        except Exception as exc:  # a conflict: the next event reconciles again
            log.debug("appwrapper: status of %s: %s", aw["metadata"]["name"], exc)
            self._mark(key_of(aw))
