"""AppWrapper (workload.codeflare.dev/v1beta2): wrapped resources run on the worker by its AppWrapper operator.

An AppWrapper lists components, each a whole Kubernetes object under ``template``. Its PodSets are those
Kueue computes (``awutils.GetComponentPodSpecs``): for every component, the PodSets it declares under
``podSets`` (a ``path`` from ``template`` to a pod template, ``replicas`` default 1) or, when it declares none,
the ones the AppWrapper operator infers for the kinds it knows (batch Job: min(parallelism, completions);
JobSet: each replicated Job's replicas × min(parallelism, completions); PyTorchJob: Master and Worker;
RayCluster and RayJob: the head and each worker group's replicas; Pod; Deployment and StatefulSet:
replicas); Kueue names them ``<appwrapper>-<index>`` across all components. Declared PodSets of a known
kind must match the inferred ones, as the operator's webhook requires. managedBy at ``spec.managedBy``
(the operator's value ``workload.codeflare.dev/appwrapper-controller``), suspend at ``spec.suspend``;
finished from ``status.phase`` as Kueue reads it: ``Succeeded``, or ``Failed`` once the resources are
deleted (``ResourcesDeployed`` no longer True). The worker copy carries no managedBy, so the worker's
operator deploys the components.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from federation.errors import Invalid
from federation.kinds.base import (
    BaseKind,
    Finished,
    as_map,
    get_path,
    podset_for,
    raise_first,
    true_condition,
    validate_bool,
    validate_count,
    validate_dns1123,
    validate_managed_by,
    validate_pod_template,
)
from federation.podset import PodSet

GROUP = "workload.codeflare.dev"
CONTROLLER = "workload.codeflare.dev/appwrapper-controller"
"""The AppWrapper operator's own managedBy value (``AppWrapperControllerName``)."""
MAX_PODSETS = 8
"""Kueue's ``jobframework.MaxPodSets``."""
MAX_NAME = 61
"""Kueue names the PodSets ``<name>-<index>``, DNS-1123 labels of at most 63 characters: the name leaves room for
``-7``."""
ROOT = "template"

_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


class PathError(ValueError):
    """A PodSet path that does not lead to a value in the component."""


def resolve(component: Mapping[str, Any], path: str) -> Any:
    """The value at an AppWrapper PodSet ``path`` (``template.spec.template``, ``...workerGroupSpecs[0].template``)
    in a component, as the operator's ``getValueAtPath`` reads it; raises :class:`PathError` naming the step."""
    if not path.startswith(ROOT):
        raise PathError("the first element of the path must be 'template'")
    node: Any = component.get(ROOT)
    position, rest = ROOT, path[len(ROOT):]
    while rest:
        match = _STEP.match(rest)
        if match is None:
            raise PathError(f"at {position!r}: invalid path element {rest!r}")
        key, index = match.group(1), match.group(2)
        if key is not None:
            if not isinstance(node, Mapping) or key not in node:
                raise PathError(f"at {position!r}: missing field {key!r}")
            node = node[key]
        else:
            if not isinstance(node, list) or int(index) >= len(node):
                raise PathError(f"at {position!r}: no item {index}")
            node = node[int(index)]
        position += match.group(0)
        rest = rest[match.end():]
    return node


def _int_at(component: Mapping[str, Any], path: str) -> int | None:
    try:
        value = resolve(component, path)
    except PathError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _job_pods(component: Mapping[str, Any], prefix: str) -> int:
    """A Job template's pods as the operator infers them: parallelism (default 1), or completions if fewer."""
    pods = _int_at(component, f"{prefix}.parallelism")
    pods = 1 if pods is None else pods
    completions = _int_at(component, f"{prefix}.completions")
    return completions if completions is not None and completions < pods else pods


def _exists(component: Mapping[str, Any], path: str) -> bool:
    try:
        resolve(component, path)
    except PathError:
        return False
    return True


def _replicas_or_one(component: Mapping[str, Any], path: str) -> int:
    value = _int_at(component, path)
    return 1 if value is None else value


def _ray(component: Mapping[str, Any], prefix: str) -> list[tuple[str, int]]:
    out = [(f"{prefix}headGroupSpec.template", 1)]
    groups = get_path(component, tuple(p for p in f"{prefix}workerGroupSpecs".split(".")))
    for index in range(len(groups) if isinstance(groups, list) else 0):
        group = f"{prefix}workerGroupSpecs[{index}]."
        if _exists(component, f"{group}template"):
            out.append((f"{group}template", _replicas_or_one(component, f"{group}replicas")))
    return out


def infer_podsets(component: Mapping[str, Any]) -> list[tuple[str, int]] | None:
    """(path, replicas) the AppWrapper operator infers for a component of a kind it knows; None for others."""
    template = as_map(component.get(ROOT))
    kind = (template.get("apiVersion"), template.get("kind"))
    if kind == ("batch/v1", "Job"):
        return [("template.spec.template", _job_pods(component, "template.spec"))]
    if kind == ("jobset.x-k8s.io/v1alpha2", "JobSet"):
        out = []
        jobs = get_path(template, ("spec", "replicatedJobs"))
        for index in range(len(jobs) if isinstance(jobs, list) else 0):
            prefix = f"template.spec.replicatedJobs[{index}]"
            if _exists(component, f"{prefix}.template"):
                replicas = _replicas_or_one(component, f"{prefix}.replicas")
                out.append((f"{prefix}.template.spec.template",
                            replicas * _job_pods(component, f"{prefix}.template.spec")))
        return out
    if kind == ("kubeflow.org/v1", "PyTorchJob"):
        return [(f"template.spec.pytorchReplicaSpecs.{role}.template",
                 _replicas_or_one(component, f"template.spec.pytorchReplicaSpecs.{role}.replicas"))
                for role in ("Master", "Worker")
                if _exists(component, f"template.spec.pytorchReplicaSpecs.{role}.template")]
    if kind == ("ray.io/v1", "RayCluster"):
        return _ray(component, "template.spec.")
    if kind == ("ray.io/v1", "RayJob"):
        return _ray(component, "template.spec.rayClusterSpec.")
    if kind == ("v1", "Pod"):
        return [("template", 1)]
    if kind in (("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")):
        return [("template.spec.template", _replicas_or_one(component, "template.spec.replicas"))]
    return None


def component_podsets(component: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(path, replicas) of a component: its declared PodSets, else the inferred ones (none for unknown kinds)."""
    declared = component.get("podSets")
    if isinstance(declared, list) and declared:
        return [(str(p.get("path")), p.get("replicas", 1)) for p in declared if isinstance(p, Mapping)]
    return infer_podsets(component) or []


def _validate_component(component: Any, field: str) -> list[Invalid]:
    if not isinstance(component, Mapping):
        return [Invalid(field, "must be an object", fix="write {template: <a Kubernetes object>, podSets: [...]}")]
    template = component.get(ROOT)
    if not isinstance(template, Mapping):
        return [Invalid(f"{field}.template", "is required", fix="put the wrapped object (apiVersion, kind, "
                        "metadata, spec) under template")]
    errors: list[Invalid] = []
    for key in ("apiVersion", "kind"):
        if not isinstance(template.get(key), str) or not template.get(key):
            errors.append(Invalid(f"{field}.template.{key}", "is required", fix=f"set the wrapped object's {key}"))
    declared = component.get("podSets")
    if declared is not None and not isinstance(declared, list):
        return [*errors, Invalid(f"{field}.podSets", "must be a list", fix="write a list of {path, replicas}")]
    paths: set[str] = set()
    for index, podset in enumerate(declared or []):
        path_field = f"{field}.podSets[{index}]"
        if not isinstance(podset, Mapping):
            errors.append(Invalid(path_field, "must be an object", fix="write {path, replicas}"))
            continue
        errors += validate_count(podset.get("replicas"), f"{path_field}.replicas", minimum=0)
        path = podset.get("path")
        if not isinstance(path, str) or not path:
            errors.append(Invalid(f"{path_field}.path", "is required",
                                  fix="give the path from template to a pod template, e.g. template.spec.template"))
            continue
        if path in paths:
            errors.append(Invalid(f"{path_field}.path", f"multiple podSets with path {path!r}",
                                  fix="declare each pod template once"))
        paths.add(path)
        try:
            target = resolve(component, path)
        except PathError as exc:
            errors.append(Invalid(f"{path_field}.path", f"{path!r}: {exc}",
                                  fix="give the path from template to a pod template, e.g. template.spec.template"))
            continue
        errors += validate_pod_template(target, f"{field}.{path}")
    inferred = infer_podsets(component)
    if declared and inferred is not None:
        want = dict(inferred)
        have = {str(p.get("path")): p.get("replicas", 1) for p in declared if isinstance(p, Mapping)}
        if set(want) != set(have):
            errors.append(Invalid(f"{field}.podSets", f"the declared paths {sorted(have)} differ from the ones "
                                  f"inferred for a {template.get('kind')}: {sorted(want)}",
                                  fix="remove podSets (they are inferred for this kind) or declare exactly these"))
        else:
            for path, count in want.items():
                if have[path] != count:
                    errors.append(Invalid(f"{field}.podSets", f"replica count {have[path]} differs from the "
                                          f"inferred count {count} for the PodSet at {path!r}",
                                          fix=f"set replicas to {count} or remove podSets"))
    elif not declared:
        if inferred is None:
            errors.append(Invalid(f"{field}.podSets", f"are required for a {template.get('kind')} (the operator "
                                  "infers them only for Job, JobSet, PyTorchJob, RayCluster, RayJob, Pod, "
                                  "Deployment and StatefulSet)",
                                  fix="declare the component's pod templates as podSets: [{path, replicas}]"))
        for path, _ in inferred or []:
            try:
                errors += validate_pod_template(resolve(component, path), f"{field}.{path}")
            except PathError as exc:
                errors.append(Invalid(f"{field}.{path}", str(exc), fix="add the pod template"))
    return errors


@dataclass(frozen=True)
class AppWrapperKind(BaseKind):
    """AppWrapper; see the module docstring."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        name = get_path(job, ("metadata", "name"))
        errors = validate_dns1123(name, "metadata.name")
        if not errors and len(name) > MAX_NAME:
            errors.append(Invalid("metadata.name", f"must be no more than {MAX_NAME} characters (Kueue names the "
                                  "PodSets <name>-<index>)", fix=f"shorten it to {MAX_NAME} characters"))
        errors += validate_managed_by(self, job)
        errors += validate_bool(job, ("spec", "suspend"))
        components = get_path(job, ("spec", "components"))
        if not isinstance(components, list) or not components:
            return [*errors, Invalid("spec.components", "must list at least one component",
                                     fix="wrap the objects to run as components: [{template: ...}]")]
        for index, component in enumerate(components):
            errors += _validate_component(component, f"spec.components[{index}]")
        if not errors:
            total = sum(len(component_podsets(c)) for c in components)
            if total == 0:
                errors.append(Invalid("spec.components", "no component has a pod template",
                                      fix="wrap at least one object that runs pods, or declare its podSets"))
            elif total > MAX_PODSETS:
                errors.append(Invalid("spec.components", f"too many: {total} PodSets, at most {MAX_PODSETS}",
                                      fix=f"wrap at most {MAX_PODSETS} pod templates in one AppWrapper"))
        return errors

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        raise_first(self.validate(job))
        name = str(get_path(job, ("metadata", "name")))
        out: list[PodSet] = []
        for index, component in enumerate(get_path(job, ("spec", "components"))):
            for path, count in component_podsets(component):
                template = as_map(resolve(component, path))
                out.append(podset_for(f"{name}-{len(out)}", count, template, f"spec.components[{index}].{path}"))
        return out

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        phase = get_path(job, ("status", "phase"))
        if phase == "Succeeded":
            return Finished("Succeeded", "Succeeded", "AppWrapper finished successfully")
        if phase == "Failed" and true_condition(job, "ResourcesDeployed") is None:
            unhealthy = true_condition(job, "Unhealthy") or {}
            return Finished("Failed", str(unhealthy.get("reason") or "Failed"),
                            str(unhealthy.get("message") or "AppWrapper failed"))
        return None


APPWRAPPER = AppWrapperKind(
    name="AppWrapper",
    group=GROUP,
    version="v1beta2",
    plural="appwrappers",
    controller=CONTROLLER,
    managed_by_path=("spec", "managedBy"),
    suspend_path=("spec", "suspend"),
    run_by="operator",  # the worker's AppWrapper operator
)
