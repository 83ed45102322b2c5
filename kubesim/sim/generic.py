"""A generic stand-in operator for job kinds declared in configuration (mkd's ``externalFrameworks``).

A kind mkd runs from a declaration is run on a worker by its own operator, which kubesim cannot know. This
stand-in runs any such kind the way its declaration describes it, so the kind runs end to end in tests and in the
demo: it is configured by the ConfigMap ``kubesim-generic-operator`` in ``kube-system`` (key ``kinds.yaml``: the
same ``externalFrameworks`` list mkd reads), and for each object of a declared kind whose managedBy (at
``managedByPath``) is unset or the declared ``controller``, and which is not suspended (``suspendPath``) and not
finished, it creates the pods of every PodSet from the declared template and count (``{object}-{podset}-{index}``,
owned by the object, labelled ``kubesim.mkd.dev/generic-resource`` and ``generic-owner``; restartPolicy Never when the template sets
none). It writes the declared success (the first of ``success.conditionTypes`` as a True condition, or the first
of ``success.values`` at ``success.field``) once every expected pod succeeded, the declared failure once one
failed, and nothing else; suspending deletes the pods. kubesim reads the declarations itself (it imports nothing
of mkd): entries it cannot read are logged and skipped.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kubesim.sim.common import Batched, Key, StoreLike, key_of, log, set_condition

CONFIG_NAMESPACE = "kube-system"
CONFIG_NAME = "kubesim-generic-operator"
CONFIG_KEY = "kinds.yaml"
OWNER_LABEL = "kubesim.mkd.dev/generic-owner"
"""The owning object's name, on its pods."""
RESOURCE_LABEL = "kubesim.mkd.dev/generic-resource"
"""The owning object's resource (``<plural>.<group>``), on its pods."""
PODSET_LABEL = "kubesim.mkd.dev/generic-podset"


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for step in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(step)
    return obj


def _set(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for step in path[:-1]:
        obj = obj.setdefault(step, {})
    obj[path[-1]] = value


def _path(text: Any, default: str | None = None) -> tuple[str, ...]:
    text = default if text is None else text
    if not isinstance(text, str) or not text:
        raise ValueError(f"{text!r} is not a dotted path")
    return tuple(text.split("."))


def _plural(kind: str) -> str:
    lower = kind.lower()
    return lower + "es" if lower.endswith("s") else lower[:-1] + "ies" if lower.endswith("y") else lower + "s"


@dataclass(frozen=True)
class Rule:
    conditions: tuple[str, ...]
    field: tuple[str, ...]
    values: tuple[str, ...]

    @staticmethod
    def read(raw: Any) -> Rule:
        raw = raw if isinstance(raw, Mapping) else {}
        if raw.get("conditionTypes"):
            return Rule(tuple(raw["conditionTypes"]), (), ())
        return Rule((), _path(raw.get("field")), tuple(raw.get("values") or ()))

    def holds(self, obj: Mapping[str, Any]) -> bool:
        if self.conditions:
            return any(c.get("type") in self.conditions and c.get("status") == "True"
                       for c in _get(obj, ("status", "conditions")) or () if isinstance(c, Mapping))
        return _get(obj, self.field) in self.values

    def write(self, status: dict[str, Any], reason: str, message: str) -> None:
        if self.conditions:
            set_condition(status.setdefault("conditions", []), self.conditions[0], "True", reason, message)
        elif self.field[:1] == ("status",) and self.values:
            _set(status, self.field[1:], self.values[0])


@dataclass(frozen=True)
class Declared:
    api_version: str
    kind: str
    resource: str
    """The store's key, ``<plural>.<group>``."""
    controller: str | None
    managed_by: tuple[str, ...]
    suspend: tuple[str, ...]
    podsets: tuple[tuple[str, tuple[str, ...], tuple[str, ...] | None, int], ...]
    """(name, template path, count path or None, default count)."""
    success: Rule
    failure: Rule

    @staticmethod
    def read(raw: Mapping[str, Any]) -> Declared:
        kind, version, group = str(raw["name"]).split(".", 2)
        podsets = tuple((str(p["name"]), _path(p["template"]), _path(p["count"]) if p.get("count") else None,
                         int(p.get("defaultCount", 1))) for p in raw.get("podSets") or ())
        return Declared(f"{group}/{version}", kind, f"{raw.get('plural') or _plural(kind)}.{group}",
                        raw.get("controller"), _path(raw.get("managedByPath"), "spec.managedBy"),
                        _path(raw.get("suspendPath"), "spec.suspend"), podsets, Rule.read(raw.get("success")),
                        Rule.read(raw.get("failure")))


def read_config(text: str) -> dict[str, Declared]:
    """The declarations of the ConfigMap's ``kinds.yaml`` by store resource key; unreadable ones are skipped."""
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        log.warning("generic operator: %s is not YAML: %s", CONFIG_KEY, exc)
        return {}
    out: dict[str, Declared] = {}
    for raw in (doc.get("externalFrameworks") if isinstance(doc, Mapping) else None) or ():
        try:
            declared = Declared.read(raw)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("generic operator: skipping declaration %r: %s", raw, exc)
            continue
        out[declared.resource] = declared
    return out


class GenericOperator(Batched[tuple[str, Key]]):
    """The stand-in of one cluster; subscribes to its ConfigMap, the declared kinds and pods."""

    name = "generic operator"

    def __init__(self, store: StoreLike, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(store, loop)
        self.kinds: dict[str, Declared] = {}
        self._unsubscribe: Callable[[], None] | None = None
        self._config: Callable[[], None] | None = None

    def start(self) -> None:
        self._config = self.store.subscribe(self._on_config, {"configmaps"})
        found = self.store.get("configmaps", CONFIG_NAMESPACE, CONFIG_NAME)
        if found is not None:
            self._on_config("ADDED", "configmaps", found)

    def stop(self) -> None:
        super().stop()
        if self._config is not None:
            self._config()
        if self._unsubscribe is not None:
            self._unsubscribe()

    def _on_config(self, event: str, res: str, obj: Mapping[str, Any]) -> None:
        if key_of(obj) != (CONFIG_NAMESPACE, CONFIG_NAME) or self.stopped:
            return
        text = "" if event == "DELETED" else str((obj.get("data") or {}).get(CONFIG_KEY) or "")
        self.kinds = read_config(text)
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._unsubscribe = self.store.subscribe(self._on_change, {*self.kinds, "pods"})
        for resource in self.kinds:  # what exists already
            try:
                for item in self.store.list(resource):
                    self._mark((resource, key_of(item)))
            except Exception as exc:  # the kind's CRD is not installed (yet): its objects come with it
                log.debug("generic operator: %s not listed: %s", resource, exc)

    def _on_change(self, event: str, res: str, obj: Mapping[str, Any]) -> None:
        if self.stopped:
            return
        if res == "pods":
            labels = (obj.get("metadata") or {}).get("labels") or {}
            owner, resource = labels.get(OWNER_LABEL), labels.get(RESOURCE_LABEL)
            if owner and resource in self.kinds:
                self._mark((resource, (key_of(obj)[0], owner)))
        elif event != "DELETED":
            self._mark((res, key_of(obj)))

    def reconcile(self, item: tuple[str, Key]) -> None:
        resource, key = item
        declared = self.kinds.get(resource)
        obj = self.store.get(resource, *key) if declared is not None else None
        if declared is None or obj is None or obj["metadata"].get("deletionTimestamp"):
            return
        managed_by = _get(obj, declared.managed_by)
        if managed_by is not None and managed_by != declared.controller:
            return  # another controller's (mkd's on the manager)
        if declared.success.holds(obj) or declared.failure.holds(obj):
            return
        meta = obj["metadata"]
        pods = self.store.list("pods", meta["namespace"],
                               label_selector=f"{RESOURCE_LABEL}={resource},{OWNER_LABEL}={meta['name']}")
        if _get(obj, declared.suspend) is True:
            for pod in pods:
                self.store.delete("pods", meta["namespace"], pod["metadata"]["name"])
            return
        expected = 0
        have = {p["metadata"]["name"] for p in pods}
        for name, template_path, count_path, default in declared.podsets:
            count = _get(obj, count_path) if count_path else None
            count = count if isinstance(count, int) and not isinstance(count, bool) else default
            expected += count
            template = _get(obj, template_path)
            for index in range(count):
                pod_name = f"{meta['name']}-{name}-{index}"
                if pod_name not in have and isinstance(template, Mapping):
                    pods.append(self._create_pod(obj, declared, resource, name, pod_name, template))
        phases = [(p.get("status") or {}).get("phase") for p in pods]
        status = copy.deepcopy(obj.get("status") or {})
        if "Failed" in phases:
            declared.failure.write(status, "PodFailed", f"{phases.count('Failed')} pods failed")
        elif expected and phases.count("Succeeded") >= expected:
            declared.success.write(status, "PodsSucceeded", f"{expected} pods succeeded")
        if status != (obj.get("status") or {}):
            try:
                self.store.update(resource, {**obj, "status": status}, subresource="status")
            except Exception as exc:  # a conflict: the next event reconciles again
                log.debug("generic operator: status of %s: %s", meta["name"], exc)
                self._mark((resource, key))

    def _create_pod(self, obj: Mapping[str, Any], declared: Declared, resource: str, podset: str, name: str,
                    template: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        pod_meta = copy.deepcopy(template.get("metadata") or {})
        pod_meta.update(name=name, namespace=meta["namespace"], ownerReferences=[{
            "apiVersion": declared.api_version, "kind": declared.kind, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": True}])
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), RESOURCE_LABEL: resource,
                              OWNER_LABEL: meta["name"], PODSET_LABEL: podset}
        spec = copy.deepcopy(template.get("spec") or {})
        spec.setdefault("restartPolicy", "Never")
        return self.store.create("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec})
