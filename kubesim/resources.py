"""The catalogue of served resource types: names, kinds, scope, verbs and subresources, as discovery shows them.

A ``ResourceType`` is keyed like the Store keys resources: ``"pods"`` for the core group and
``"<plural>.<group>"`` otherwise. Built-in types are fixed here; CRDs add and remove types at run time
through ``Catalogue.add_crd`` / ``remove_crd`` (called by the store when a CRD becomes established).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SUB_VERBS = ["get", "patch", "update"]


@dataclass
class ResourceType:
    """One served resource (all versions share one storage key)."""

    plural: str
    singular: str
    kind: str
    group: str
    versions: list[str]
    namespaced: bool
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    name_rule: str = "subdomain"  # subdomain | label | dns1035 | path | crd
    generation: bool = False  # whether metadata.generation is maintained
    builtin: bool = True
    scale: dict[str, Any] | None = None  # CRD scale subresource paths
    schemas: dict[str, Any] | None = None  # CRDs: version -> openAPIV3Schema (kubesim.schema)
    printer_columns: dict[str, list[dict[str, Any]]] | None = None  # CRDs: version -> additionalPrinterColumns
    verbs: list[str] = field(default_factory=lambda: list(ALL_VERBS))
    unconditional_update: bool = True  # the strategy's AllowUnconditionalUpdate: PUT without resourceVersion
    key: str = field(init=False, default="")
    list_item_prefix: bytes = field(init=False, default=b"")

    def __post_init__(self) -> None:
        # Computed once: the storage key is read on every request.
        self.key = f"{self.plural}.{self.group}" if self.group else self.plural
        self.list_item_prefix = f'{{"apiVersion":"{self.api_version()}","kind":"{self.kind}",'.encode()

    @property
    def storage_version(self) -> str:
        return self.versions[0]

    def api_version(self, version: str | None = None) -> str:
        v = version or self.storage_version
        return f"{self.group}/{v}" if self.group else v

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


BUILTINS: list[ResourceType] = [
    ResourceType("namespaces", "namespace", "Namespace", "", ["v1"], False, ("status", "finalize"), ("ns",),
                 name_rule="label", verbs=["create", "delete", "get", "list", "patch", "update", "watch"]),
    ResourceType("nodes", "node", "Node", "", ["v1"], False, ("status",), ("no",)),
    # Pods carry no metadata.generation on 1.31 (PodObservedGenerationTracking came later, gated).
    ResourceType("pods", "pod", "Pod", "", ["v1"], True, ("status", "binding", "log"), ("po",), ("all",)),
    # v1.36 validates Service names as RFC 1123 labels (RelaxedServiceNameValidation): "1abc" is accepted.
    ResourceType("services", "service", "Service", "", ["v1"], True, ("status",), ("svc",), ("all",),
                 name_rule="label",
                 verbs=["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]),
    ResourceType("configmaps", "configmap", "ConfigMap", "", ["v1"], True, (), ("cm",)),
    ResourceType("secrets", "secret", "Secret", "", ["v1"], True),
    ResourceType("podtemplates", "podtemplate", "PodTemplate", "", ["v1"], True),
    ResourceType("limitranges", "limitrange", "LimitRange", "", ["v1"], True, (), ("limits",)),
    ResourceType("serviceaccounts", "serviceaccount", "ServiceAccount", "", ["v1"], True, (), ("sa",)),
    ResourceType("events", "event", "Event", "", ["v1"], True, (), ("ev",), name_rule="path"),
    ResourceType("jobs", "job", "Job", "batch", ["v1"], True, ("status",), (), ("all",), generation=True),
    ResourceType("leases", "lease", "Lease", "coordination.k8s.io", ["v1"], True, unconditional_update=False),
    ResourceType("persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", "", ["v1"], True,
                 ("status",), ("pvc",)),
    ResourceType("deployments", "deployment", "Deployment", "apps", ["v1"], True, ("status", "scale"), ("deploy",),
                 ("all",), name_rule="subdomain", generation=True),
    ResourceType("roles", "role", "Role", "rbac.authorization.k8s.io", ["v1"], True, name_rule="path"),
    ResourceType("rolebindings", "rolebinding", "RoleBinding", "rbac.authorization.k8s.io", ["v1"], True,
                 name_rule="path"),
    ResourceType("clusterroles", "clusterrole", "ClusterRole", "rbac.authorization.k8s.io", ["v1"], False,
                 name_rule="path"),
    ResourceType("clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", "rbac.authorization.k8s.io",
                 ["v1"], False, name_rule="path"),
    ResourceType("priorityclasses", "priorityclass", "PriorityClass", "scheduling.k8s.io", ["v1"], False, (),
                 ("pc",)),
    ResourceType("runtimeclasses", "runtimeclass", "RuntimeClass", "node.k8s.io", ["v1"], False),
    ResourceType("events", "event", "Event", "events.k8s.io", ["v1"], True, (), ("ev",), name_rule="path"),
    ResourceType("validatingadmissionpolicies", "validatingadmissionpolicy", "ValidatingAdmissionPolicy",
                 "admissionregistration.k8s.io", ["v1"], False, ("status",), (), ("api-extensions",),
                 generation=True, unconditional_update=False),
    ResourceType("validatingadmissionpolicybindings", "validatingadmissionpolicybinding",
                 "ValidatingAdmissionPolicyBinding", "admissionregistration.k8s.io", ["v1"], False, (), (),
                 ("api-extensions",), generation=True, unconditional_update=False),
    ResourceType("mutatingwebhookconfigurations", "mutatingwebhookconfiguration", "MutatingWebhookConfiguration",
                 "admissionregistration.k8s.io", ["v1"], False, (), (), ("api-extensions",), generation=True,
                 unconditional_update=False),
    ResourceType("validatingwebhookconfigurations", "validatingwebhookconfiguration",
                 "ValidatingWebhookConfiguration", "admissionregistration.k8s.io", ["v1"], False, (), (),
                 ("api-extensions",), generation=True, unconditional_update=False),
    ResourceType("customresourcedefinitions", "customresourcedefinition", "CustomResourceDefinition",
                 "apiextensions.k8s.io", ["v1"], False, ("status",), ("crd", "crds"), ("api-extensions",),
                 name_rule="crd", generation=True, unconditional_update=False),
]

# The order /apis lists groups in (the legacy core group is served at /api).
GROUP_ORDER = ["admissionregistration.k8s.io", "apiextensions.k8s.io", "apps", "batch", "coordination.k8s.io", "events.k8s.io",
               "node.k8s.io", "rbac.authorization.k8s.io", "scheduling.k8s.io"]


class Catalogue:
    """Lookup of served types by storage key and by (group, version, plural)."""

    def __init__(self) -> None:
        self.by_key: dict[str, ResourceType] = {}
        """Served types by storage key; change it only through ``add_crd`` / ``remove`` (``groups`` is cached)."""
        for rt in BUILTINS:
            self.by_key[rt.key] = rt
        self._groups: dict[str, list[str]] | None = None

    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        rt = self.by_key.get(f"{plural}.{group}" if group else plural)
        if rt is None or version not in rt.versions:
            return None
        return rt

    def groups(self) -> dict[str, list[str]]:
        """group -> served versions (preferred first), for the non-core groups (computed again only after
        a type was added or removed: every /apis request asks; callers must not change it)."""
        if self._groups is None:
            self._groups = self._compute_groups()
        return self._groups

    def _compute_groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for rt in self.by_key.values():
            if not rt.group:
                continue
            vs = out.setdefault(rt.group, [])
            for v in rt.versions:
                if v not in vs:
                    vs.append(v)
        order = {g: i for i, g in enumerate(GROUP_ORDER)}
        return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [rt for rt in self.by_key.values() if rt.group == group and version in rt.versions]

    def add_crd(self, crd: dict[str, Any]) -> ResourceType:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
        # The storage version is listed first so that it is the preferred one, as upstream sorts by priority.
        versions.sort(key=lambda v: (not v.get("storage", False)))
        subs: list[str] = []
        scale = None
        for v in versions:
            sr = v.get("subresources") or {}
            if "status" in sr and "status" not in subs:
                subs.append("status")
            if "scale" in sr and "scale" not in subs:
                subs.append("scale")
                scale = sr["scale"]
        rt = ResourceType(
            plural=names.get("plural", ""),
            singular=names.get("singular") or names.get("kind", "").lower(),
            kind=names.get("kind", ""),
            group=spec.get("group", ""),
            versions=[v["name"] for v in versions],
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            subresources=tuple(subs),
            short_names=tuple(names.get("shortNames") or ()),
            categories=tuple(names.get("categories") or ()),
            generation=True,
            builtin=False,
            unconditional_update=False,  # customResourceStrategy.AllowUnconditionalUpdate
            scale=scale,
            schemas={v["name"]: (v.get("schema") or {}).get("openAPIV3Schema") for v in versions
                     if isinstance((v.get("schema") or {}).get("openAPIV3Schema"), dict)},
            printer_columns={v["name"]: list(v.get("additionalPrinterColumns") or []) for v in versions},
        )
        self.by_key[rt.key] = rt
        self._groups = None
        return rt

    def remove(self, key: str) -> None:
        rt = self.by_key.get(key)
        if rt is not None and not rt.builtin:
            del self.by_key[key]
            self._groups = None

    def api_resource_list(self, group: str, version: str) -> dict[str, Any]:
        """The APIResourceList body for /api/v1 or /apis/<group>/<version>."""
        resources: list[dict[str, Any]] = []
        for rt in sorted(self.in_group_version(group, version), key=lambda r: r.plural):
            main: dict[str, Any] = {
                "name": rt.plural, "singularName": rt.singular, "namespaced": rt.namespaced,
                "kind": rt.kind, "verbs": rt.verbs, "storageVersionHash": "",
            }
            if rt.short_names:
                main["shortNames"] = list(rt.short_names)
            if rt.categories:
                main["categories"] = list(rt.categories)
            resources.append(main)
            for sub in rt.subresources:
                if sub == "binding":
                    entry = {"name": f"{rt.plural}/binding", "singularName": "", "namespaced": True,
                             "kind": "Binding", "verbs": ["create"]}
                elif sub == "log":
                    entry = {"name": f"{rt.plural}/log", "singularName": "", "namespaced": True,
                             "kind": "Pod", "verbs": ["get"]}
                elif sub == "finalize":
                    entry = {"name": f"{rt.plural}/finalize", "singularName": "", "namespaced": False,
                             "kind": rt.kind, "verbs": ["update"]}
                elif sub == "scale":
                    entry = {"name": f"{rt.plural}/scale", "singularName": "", "namespaced": rt.namespaced,
                             "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": SUB_VERBS}
                else:
                    entry = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced,
                             "kind": rt.kind, "verbs": SUB_VERBS}
                resources.append(entry)
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
