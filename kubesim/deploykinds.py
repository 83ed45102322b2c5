"""The built-in kinds an operator's manifests carry but no simulated controller acts on.

Deployments, RBAC roles and bindings and PersistentVolumeClaims are served so that mkd's own
``deploy/`` manifests (rendered with kustomize) can be applied to a kubesim cluster, with server-side
dry-run in the tests, and be refused for the mistakes a real v1.36 API server refuses: a Deployment
whose selector does not match its template, a rule without verbs, a binding to a role of another kind,
a claim without a size. Defaults are the ones the real server writes. Nothing here runs: no
ReplicaSets, no authorization decisions from these roles, no volumes bound.
"""

from __future__ import annotations

from typing import Any

from kubesim.admission import selector_matches
from kubesim.kinds import bad_value, cause, default_pod_spec, required, validate_pod_spec

DEPLOY_KINDS = (
    "deployments.apps",
    "roles.rbac.authorization.k8s.io",
    "clusterroles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    "clusterrolebindings.rbac.authorization.k8s.io",
    "persistentvolumeclaims",
)


def deploy_kind_rules(key: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, str]]:
    """The store's hook (kinds.apply_kind_rules ``more``): the causes for a :data:`DEPLOY_KINDS` object, none
    for any other kind."""
    return prepare_deploy_kind(key, obj, old) if key in DEPLOY_KINDS else []


def prepare_deploy_kind(key: str, obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, str]]:
    """Default and validate one object of a :data:`DEPLOY_KINDS` kind; the causes of a 422."""
    if key == "deployments.apps":
        return _deployment(obj)
    if key in ("roles.rbac.authorization.k8s.io", "clusterroles.rbac.authorization.k8s.io"):
        return _role(obj)
    if key in ("rolebindings.rbac.authorization.k8s.io", "clusterrolebindings.rbac.authorization.k8s.io"):
        return _binding(obj, old, cluster=key.startswith("cluster"))
    return _claim(obj, old)


def _deployment(obj: dict[str, Any]) -> list[dict[str, str]]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [required("spec.selector"), required("spec.template.metadata.labels")]
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        strategy["type"] = "RollingUpdate"
        strategy.setdefault("rollingUpdate", {}).setdefault("maxUnavailable", "25%")
        strategy["rollingUpdate"].setdefault("maxSurge", "25%")
    causes: list[dict[str, str]] = []
    if strategy.get("type") == "Recreate" and strategy.get("rollingUpdate") is not None:
        causes.append(cause("spec.strategy.rollingUpdate",
                            "Forbidden: may not be specified when strategy `type` is 'Recreate'",
                            "FieldValueForbidden"))
    elif strategy.get("type") not in ("Recreate", "RollingUpdate"):
        causes.append(cause("spec.strategy.type", f'Unsupported value: "{strategy.get("type")}": supported '
                            'values: "Recreate", "RollingUpdate"', "FieldValueNotSupported"))
    replicas = spec["replicas"]
    if isinstance(replicas, int) and replicas < 0:
        causes.append(bad_value("spec.replicas", replicas, "must be greater than or equal to 0"))
    template: dict[str, Any] = spec["template"] if isinstance(spec.get("template"), dict) else {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        causes.append(required("spec.selector"))
    elif not labels:
        causes.append(required("spec.template.metadata.labels"))
    elif not selector_matches(selector, labels):
        shown = "map[" + " ".join(f"{k}:{v}" for k, v in sorted(labels.items())) + "]"
        causes.append(cause("spec.template.metadata.labels",
                            f'Invalid value: {{"{shown}"}}: `selector` does not match template `labels`'))
    pod = template.get("spec")
    if isinstance(pod, dict):
        default_pod_spec(pod)
        causes += validate_pod_spec(pod, "spec.template.spec", ("Always",))
    else:
        causes.append(required("spec.template.spec.containers"))
    return causes


def _role(obj: dict[str, Any]) -> list[dict[str, str]]:
    causes: list[dict[str, str]] = []
    for i, rule in enumerate(obj.get("rules") or []):
        where = f"rules[{i}]"
        if not rule.get("verbs"):
            causes.append(cause(f"{where}.verbs", "Required value: verbs must contain at least one value",
                                "FieldValueRequired"))
        if rule.get("nonResourceURLs"):
            if obj.get("kind") == "Role":
                causes.append(bad_value(f"{where}.nonResourceURLs", rule["nonResourceURLs"],
                                        "namespaced rules cannot apply to non-resource URLs"))
            continue
        if not rule.get("apiGroups"):
            causes.append(cause(f"{where}.apiGroups",
                                "Required value: resource rules must supply at least one api group",
                                "FieldValueRequired"))
        if not rule.get("resources"):
            causes.append(cause(f"{where}.resources",
                                "Required value: resource rules must supply at least one resource",
                                "FieldValueRequired"))
    return causes


def _binding(obj: dict[str, Any], old: dict[str, Any] | None, *, cluster: bool) -> list[dict[str, str]]:
    ref = obj.get("roleRef")
    causes: list[dict[str, str]] = []
    if not isinstance(ref, dict):
        return [required("roleRef")]
    kinds = ("ClusterRole",) if cluster else ("Role", "ClusterRole")
    if ref.get("apiGroup") != "rbac.authorization.k8s.io":
        causes.append(cause("roleRef.apiGroup", f'Unsupported value: "{ref.get("apiGroup", "")}": supported '
                            'values: "rbac.authorization.k8s.io"', "FieldValueNotSupported"))
    if ref.get("kind") not in kinds:
        supported = ", ".join(f'"{k}"' for k in kinds)
        causes.append(cause("roleRef.kind", f'Unsupported value: "{ref.get("kind", "")}": supported values: '
                            f"{supported}", "FieldValueNotSupported"))
    if not ref.get("name"):
        causes.append(required("roleRef.name"))
    if old is not None and old.get("roleRef") != ref:
        causes.append(bad_value("roleRef", ref, "cannot change roleRef"))
    for i, subject in enumerate(obj.get("subjects") or []):
        if subject.get("kind") == "ServiceAccount" and not subject.get("namespace") and cluster:
            causes.append(required(f"subjects[{i}].namespace"))
        if subject.get("kind") not in ("ServiceAccount", "User", "Group"):
            causes.append(cause(f"subjects[{i}].kind", f'Unsupported value: "{subject.get("kind", "")}": '
                                'supported values: "ServiceAccount", "User", "Group"', "FieldValueNotSupported"))
    return causes


def _claim(obj: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, str]]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [cause("spec.accessModes", "Required value: at least 1 access mode is required",
                      "FieldValueRequired"), required("spec.resources[storage]")]
    spec.setdefault("volumeMode", "Filesystem")
    if old is None:
        obj["status"] = {"phase": "Pending"}
    causes: list[dict[str, str]] = []
    if not spec.get("accessModes"):
        causes.append(cause("spec.accessModes", "Required value: at least 1 access mode is required",
                            "FieldValueRequired"))
    if not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
        causes.append(required("spec.resources[storage]"))
    return causes
