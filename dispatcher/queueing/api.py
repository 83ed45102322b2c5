"""Kueue's API objects as mkd reads them: parsed from the manager cluster's JSON, pure.

``parse`` turns a ResourceFlavor, ClusterQueue, LocalQueue, Cohort, WorkloadPriorityClass (group
``kueue.x-k8s.io``, ``v1beta2`` or ``v1beta1``) or a ``scheduling.k8s.io`` PriorityClass into a
frozen dataclass. The two Kueue versions differ in a few names (``cohort`` became ``cohortName``,
a Cohort's ``parent`` became ``parentName``); both are accepted. A malformed object raises
:class:`~federation.errors.Invalid` naming the field, so the catalog can report it instead of
guessing. Quantities are :class:`~decimal.Decimal` in base units (cores, bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from federation.errors import Invalid
from federation.podset import parse_quantity

GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
"""Label on a Job naming its WorkloadPriorityClass."""
PIN_ANNOTATION = "mkd.dev/clusters"
"""Annotation (Job or ClusterQueue): comma-separated worker clusters a Workload may run on, no others."""
EXCLUDE_ANNOTATION = "mkd.dev/exclude-clusters"
"""Annotation (Job or ClusterQueue): comma-separated worker clusters a Workload never runs on."""
CLUSTER_SELECTOR_ANNOTATION = "mkd.dev/cluster-selector"
"""Annotation (Job or ClusterQueue): ``key=value,key2=value2`` a worker cluster's labels must match."""

STRATEGIES = ("BestEffortFIFO", "StrictFIFO")
STOP_POLICIES = ("None", "Hold", "HoldAndDrain")
WITHIN_CQ = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
RECLAIM = ("Never", "LowerPriority", "Any")


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """The core/v1 rule: empty key with Exists tolerates everything; empty effect matches all effects."""
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value

    def as_dict(self) -> dict[str, str]:
        out = {"key": self.key, "operator": self.operator, "value": self.value, "effect": self.effect}
        return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class ResourceFlavor:
    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class Quota:
    nominal: Decimal
    borrowing_limit: Decimal | None = None   # None: no limit
    lending_limit: Decimal | None = None     # None: lends all of its nominal quota


@dataclass(frozen=True)
class FlavorQuotas:
    name: str
    resources: Mapping[str, Quota]


@dataclass(frozen=True)
class ResourceGroup:
    covered: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@dataclass(frozen=True)
class Preemption:
    within_cluster_queue: str = "Never"
    reclaim_within_cohort: str = "Never"
    borrow_within_cohort: str = "Never"
    max_priority_threshold: int | None = None


@dataclass(frozen=True)
class Selector:
    """A metav1.LabelSelector; ``None`` as the selector itself (not this object) means no namespace."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for key, op, values in self.expressions:
            if op == "In" and labels.get(key) not in values:
                return False
            if op == "NotIn" and key in labels and labels[key] in values:
                return False
            if op == "Exists" and key not in labels:
                return False
            if op == "DoesNotExist" and key in labels:
                return False
        return True


NO_CLUSTERS: frozenset[str] = frozenset()
NO_LABELS: Mapping[str, str] = MappingProxyType({})
"""Shared by every Placement without them: a dispatcher holds one per pending Workload."""


@dataclass(frozen=True, slots=True)
class Placement:
    """mkd's per-ClusterQueue or per-Job cluster constraints (annotations)."""

    pin: frozenset[str] = NO_CLUSTERS
    exclude: frozenset[str] = NO_CLUSTERS
    selector: Mapping[str, str] = field(default_factory=lambda: NO_LABELS)


ANYWHERE = Placement()
"""The Placement of every Job and ClusterQueue without cluster annotations (one object, shared)."""


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    resource_groups: tuple[ResourceGroup, ...] = ()
    cohort: str | None = None
    namespace_selector: Selector | None = None
    strategy: str = "BestEffortFIFO"
    preemption: Preemption = Preemption()
    when_can_borrow: str = "MayStopSearch"
    when_can_preempt: str = "TryNextFlavor"
    weight: Decimal = Decimal(1)
    stop_policy: str = "None"
    placement: Placement = ANYWHERE

    def flavor_names(self) -> list[str]:
        return [f.name for g in self.resource_groups for f in g.flavors]

    def group_of(self, resource: str) -> ResourceGroup | None:
        for g in self.resource_groups:
            if resource in g.covered:
                return g
        return None


@dataclass(frozen=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    stop_policy: str = "None"


@dataclass(frozen=True)
class Cohort:
    name: str
    parent: str | None = None
    resource_groups: tuple[ResourceGroup, ...] = ()
    weight: Decimal = Decimal(1)


@dataclass(frozen=True)
class PriorityClass:
    """A WorkloadPriorityClass or a scheduling.k8s.io PriorityClass: a name and a value."""

    name: str
    value: int


# --- parsing -------------------------------------------------------------------------------------


def _map(obj: Any, where: str) -> Mapping[str, Any]:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise Invalid(where, f"must be an object, got {type(obj).__name__}")
    return obj


def _list(obj: Any, where: str) -> list[Any]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise Invalid(where, f"must be a list, got {type(obj).__name__}")
    return obj


def _enum(value: Any, allowed: tuple[str, ...], where: str, default: str) -> str:
    if value is None or value == "":
        return default
    if value not in allowed:
        raise Invalid(where, f"{value!r} is not one of {', '.join(allowed)}", fix=f"use one of {', '.join(allowed)}")
    return str(value)


def _name(obj: Mapping[str, Any]) -> str:
    name = _map(obj.get("metadata"), "metadata").get("name")
    if not isinstance(name, str) or not name:
        raise Invalid("metadata.name", "is missing")
    return name


def _weight(spec: Mapping[str, Any], where: str) -> Decimal:
    fs = _map(spec.get("fairSharing"), f"{where}.fairSharing")
    return parse_quantity(fs["weight"], f"{where}.fairSharing.weight") if fs.get("weight") is not None else Decimal(1)


def _resource_groups(value: Any, where: str) -> tuple[ResourceGroup, ...]:
    groups = []
    for i, g in enumerate(_list(value, where)):
        gw = f"{where}[{i}]"
        g = _map(g, gw)
        covered = tuple(str(r) for r in _list(g.get("coveredResources"), f"{gw}.coveredResources"))
        flavors = []
        for j, f in enumerate(_list(g.get("flavors"), f"{gw}.flavors")):
            fw = f"{gw}.flavors[{j}]"
            f = _map(f, fw)
            quotas: dict[str, Quota] = {}
            for k, r in enumerate(_list(f.get("resources"), f"{fw}.resources")):
                rw = f"{fw}.resources[{k}]"
                r = _map(r, rw)
                name = str(r.get("name") or "")
                if name not in covered:
                    raise Invalid(f"{rw}.name", f"{name!r} is not in coveredResources {list(covered)}",
                                  fix="list the resource in the group's coveredResources")
                quotas[name] = Quota(
                    nominal=parse_quantity(r.get("nominalQuota", 0), f"{rw}.nominalQuota"),
                    borrowing_limit=(parse_quantity(r["borrowingLimit"], f"{rw}.borrowingLimit")
                                     if r.get("borrowingLimit") is not None else None),
                    lending_limit=(parse_quantity(r["lendingLimit"], f"{rw}.lendingLimit")
                                   if r.get("lendingLimit") is not None else None))
            flavors.append(FlavorQuotas(str(f.get("name") or ""), quotas))
        groups.append(ResourceGroup(covered, tuple(flavors)))
    return tuple(groups)


def parse_selector(value: Any, where: str) -> Selector | None:
    if value is None:
        return None
    value = _map(value, where)
    exprs = []
    for i, e in enumerate(_list(value.get("matchExpressions"), f"{where}.matchExpressions")):
        e = _map(e, f"{where}.matchExpressions[{i}]")
        op = _enum(e.get("operator"), ("In", "NotIn", "Exists", "DoesNotExist"),
                   f"{where}.matchExpressions[{i}].operator", "In")
        values = tuple(str(v) for v in _list(e.get("values"), f"{where}.matchExpressions[{i}].values"))
        if op in ("In", "NotIn") and not values:  # as metav1 validation refuses it
            raise Invalid(f"{where}.matchExpressions[{i}].values", f"{op} needs at least one value",
                          fix="list the values, or use Exists")
        exprs.append((str(e.get("key") or ""), op, values))
    return Selector({str(k): str(v) for k, v in _map(value.get("matchLabels"), f"{where}.matchLabels").items()},
                    tuple(exprs))


def _csv(text: Any) -> frozenset[str]:
    return frozenset(p.strip() for p in str(text or "").split(",") if p.strip()) or NO_CLUSTERS


def placement_of(annotations: Mapping[str, Any] | None) -> Placement:
    """mkd's cluster pin / exclude / selector annotations (on a Job or a ClusterQueue)."""
    ann = annotations or {}
    if not any(a in ann for a in (PIN_ANNOTATION, EXCLUDE_ANNOTATION, CLUSTER_SELECTOR_ANNOTATION)):
        return ANYWHERE
    selector: dict[str, str] = {}
    for part in _csv(ann.get(CLUSTER_SELECTOR_ANNOTATION)):
        key, sep, value = part.partition("=")
        if not sep:
            raise Invalid(f"metadata.annotations[{CLUSTER_SELECTOR_ANNOTATION}]", f"{part!r} is not key=value",
                          fix="write key=value pairs separated by commas")
        selector[key.strip()] = value.strip()
    return Placement(_csv(ann.get(PIN_ANNOTATION)), _csv(ann.get(EXCLUDE_ANNOTATION)), selector or NO_LABELS)


def parse_cluster_queue(obj: Mapping[str, Any]) -> ClusterQueue:
    spec = _map(obj.get("spec"), "spec")
    pre = _map(spec.get("preemption"), "spec.preemption")
    bwc = _map(pre.get("borrowWithinCohort"), "spec.preemption.borrowWithinCohort")
    fung = _map(spec.get("flavorFungibility"), "spec.flavorFungibility")
    cohort = spec.get("cohortName") or spec.get("cohort")  # v1beta2 / v1beta1
    threshold = bwc.get("maxPriorityThreshold")
    groups = _resource_groups(spec.get("resourceGroups"), "spec.resourceGroups")
    if not cohort:
        for g in groups:
            for f in g.flavors:
                if any(q.borrowing_limit is not None for q in f.resources.values()):
                    raise Invalid("spec.resourceGroups", "borrowingLimit must be nil when cohort is empty",
                                  fix="set spec.cohortName or remove borrowingLimit")
    return ClusterQueue(
        name=_name(obj), resource_groups=groups, cohort=str(cohort) if cohort else None,
        namespace_selector=parse_selector(spec.get("namespaceSelector"), "spec.namespaceSelector"),
        strategy=_enum(spec.get("queueingStrategy"), STRATEGIES, "spec.queueingStrategy", "BestEffortFIFO"),
        preemption=Preemption(
            within_cluster_queue=_enum(pre.get("withinClusterQueue"), WITHIN_CQ,
                                       "spec.preemption.withinClusterQueue", "Never"),
            reclaim_within_cohort=_enum(pre.get("reclaimWithinCohort"), RECLAIM,
                                        "spec.preemption.reclaimWithinCohort", "Never"),
            borrow_within_cohort=_enum(bwc.get("policy"), ("Never", "LowerPriority"),
                                       "spec.preemption.borrowWithinCohort.policy", "Never"),
            max_priority_threshold=int(threshold) if threshold is not None else None),
        when_can_borrow=_enum(fung.get("whenCanBorrow"), ("MayStopSearch", "TryNextFlavor", "Borrow"),
                              "spec.flavorFungibility.whenCanBorrow", "MayStopSearch"),
        when_can_preempt=_enum(fung.get("whenCanPreempt"), ("TryNextFlavor", "MayStopSearch", "Preempt"),
                               "spec.flavorFungibility.whenCanPreempt", "TryNextFlavor"),
        weight=_weight(spec, "spec"),
        stop_policy=_enum(spec.get("stopPolicy"), STOP_POLICIES, "spec.stopPolicy", "None"),
        placement=placement_of(_map(obj.get("metadata"), "metadata").get("annotations")),
    )


def parse_local_queue(obj: Mapping[str, Any]) -> LocalQueue:
    spec = _map(obj.get("spec"), "spec")
    md = _map(obj.get("metadata"), "metadata")
    cq = spec.get("clusterQueue")
    if not isinstance(cq, str) or not cq:
        raise Invalid("spec.clusterQueue", "is missing", fix="name the ClusterQueue this LocalQueue submits to")
    return LocalQueue(str(md.get("namespace") or ""), _name(obj), cq,
                      _enum(spec.get("stopPolicy"), STOP_POLICIES, "spec.stopPolicy", "None"))


def parse_cohort(obj: Mapping[str, Any]) -> Cohort:
    spec = _map(obj.get("spec"), "spec")
    parent = spec.get("parentName") or spec.get("parent")
    return Cohort(_name(obj), str(parent) if parent else None,
                  _resource_groups(spec.get("resourceGroups"), "spec.resourceGroups"), _weight(spec, "spec"))


def parse_flavor(obj: Mapping[str, Any]) -> ResourceFlavor:
    spec = _map(obj.get("spec"), "spec")
    taints = tuple(Taint(str(_map(t, "spec.nodeTaints").get("key") or ""), str(t.get("value") or ""),
                         str(t.get("effect") or "NoSchedule")) for t in _list(spec.get("nodeTaints"), "spec.nodeTaints"))
    return ResourceFlavor(_name(obj), {str(k): str(v) for k, v in _map(spec.get("nodeLabels"), "spec.nodeLabels").items()},
                          taints, tuple(parse_toleration(t, "spec.tolerations")
                                        for t in _list(spec.get("tolerations"), "spec.tolerations")))


def parse_toleration(t: Any, where: str) -> Toleration:
    t = _map(t, where)
    return Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"), str(t.get("value") or ""),
                      str(t.get("effect") or ""))


def parse_priority_class(obj: Mapping[str, Any]) -> PriorityClass:
    value = obj.get("value")
    if not isinstance(value, int) or isinstance(value, bool):
        raise Invalid("value", f"must be an integer, got {value!r}")
    return PriorityClass(_name(obj), value)


PARSERS = {
    "ResourceFlavor": parse_flavor, "ClusterQueue": parse_cluster_queue, "LocalQueue": parse_local_queue,
    "Cohort": parse_cohort, "WorkloadPriorityClass": parse_priority_class, "PriorityClass": parse_priority_class,
}
