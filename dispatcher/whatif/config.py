"""A what-if configuration: Kueue's queue objects, mkd's decision settings and the worker clusters, pure.

:class:`Config` holds what the simulator needs to decide as the dispatcher would: the Kueue objects
(ResourceFlavor, ClusterQueue, LocalQueue, Cohort, WorkloadPriorityClass, PriorityClass, Namespace) as the
manager serves them, mkd's settings that change decisions (``WhatIfSettings``: fair sharing, starvation)
and the clusters (``WorkerCluster``: labels, nodes with their allocatable, cordoned, cordon intervals).
:func:`load_documents` reads them from YAML documents (files or a folder, see ``mkctl whatif``); a bad
object raises :class:`ConfigError` naming the file, the object and the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from dispatcher.placement import ClusterView, NodeView
from dispatcher.queueing import api
from dispatcher.queueing.catalog import Catalog
from dispatcher.queueing.fairshare import ALLOWED, STRATEGIES
from federation.errors import Invalid
from federation.podset import parse_quantity

KUEUE_KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "Cohort", "WorkloadPriorityClass")
MKD_GROUP = "whatif.mkd.dev"
KINDS = (*KUEUE_KINDS, "PriorityClass", "Namespace", "WhatIfSettings", "WorkerCluster")


class ConfigError(Invalid):
    """A configuration object that cannot be used: where it is (file, document), which object, which field."""

    def __init__(self, where: str, obj: str, field_: str, message: str, *, fix: str = "") -> None:
        super().__init__(f"{where}: {obj}: {field_}" if obj else f"{where}: {field_}", message, fix=fix)


@dataclass
class Settings:
    """mkd's settings that change decisions (the dispatcher's ``Settings`` fields of the same names)."""

    fair_sharing: bool = False
    preemption_strategies: tuple[str, ...] = STRATEGIES
    starvation_seconds: float = 300.0
    starvation_hold_seconds: float = 60.0
    prioritize_preemptors: bool = True
    max_admissions_per_pass: int = 2000
    pass_seconds: float = 1.0
    """How long after an eviction the dispatcher's next pass runs (the victims' room is then free)."""
    retry_seconds: float = 10.0
    """The dispatcher's ``placement_retry_seconds``: a pass at least this often while Workloads wait on a
    timer (starvation, a hold, a preemptor's room)."""

    def as_dict(self) -> dict[str, Any]:
        return {"fairSharing": {"enable": self.fair_sharing, "preemptionStrategies": list(self.preemption_strategies)},
                "starvationSeconds": self.starvation_seconds, "starvationHoldSeconds": self.starvation_hold_seconds,
                "prioritizePreemptors": self.prioritize_preemptors,
                "maxAdmissionsPerPass": self.max_admissions_per_pass, "passSeconds": self.pass_seconds,
                "retrySeconds": self.retry_seconds}


@dataclass
class NodeGroup:
    name: str
    count: int
    allocatable: dict[str, Decimal]
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()


@dataclass
class Cluster:
    name: str
    nodes: list[NodeGroup]
    labels: dict[str, str] = field(default_factory=dict)
    kinds: frozenset[str] | None = None
    cordoned: bool = False
    cordons: list[tuple[float, float | None]] = field(default_factory=list)
    """Intervals [from, until) of trace time (seconds; None: to the end) when it is cordoned."""

    def cordoned_at(self, t: float) -> bool:
        return self.cordoned or any(a <= t and (b is None or t < b) for a, b in self.cordons)

    def allocatable(self) -> dict[str, Decimal]:
        out: dict[str, Decimal] = {}
        for g in self.nodes:
            for k, v in g.allocatable.items():
                out[k] = out.get(k, Decimal(0)) + v * g.count
        return out

    def view(self) -> ClusterView:
        """An empty cluster as placement sees it (every node free)."""
        nodes = [NodeView(g.name if g.count == 1 else f"{g.name}-{i}", g.labels, g.taints, dict(g.allocatable),
                          g.allocatable) for g in self.nodes for i in range(g.count)]
        alloc = self.allocatable()
        return ClusterView(name=self.name, online=True, last_heartbeat=None, allocatable=alloc, free=dict(alloc),
                           largest_node_free={}, kinds=self.kinds, labels=dict(self.labels), nodes=nodes)

    def as_object(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"nodes": [
            {"name": g.name, "count": g.count, "allocatable": {k: str(v) for k, v in g.allocatable.items()},
             **({"labels": g.labels} if g.labels else {}),
             **({"taints": [{"key": k, "value": v, "effect": e} for k, v, e in g.taints]} if g.taints else {})}
            for g in self.nodes]}
        if self.cordoned:
            spec["cordoned"] = True
        if self.cordons:
            spec["cordons"] = [{"from": a, **({"until": b} if b is not None else {})} for a, b in self.cordons]
        if self.kinds is not None:
            spec["kinds"] = sorted(self.kinds)
        return {"apiVersion": f"{MKD_GROUP}/v1", "kind": "WorkerCluster",
                "metadata": {"name": self.name, **({"labels": self.labels} if self.labels else {})}, "spec": spec}


@dataclass
class Config:
    """See the module docstring. ``objects`` are the Kueue objects (and PriorityClasses, Namespaces) as dicts."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)
    clusters: dict[str, Cluster] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    """Where each part came from, for the report (files, the live database, the manager)."""

    def catalog(self, namespaces: Iterable[str] = ()) -> Catalog:
        """A catalog as the dispatcher's watcher would fill it; namespaces of the trace not given as objects
        exist with no labels."""
        c = Catalog()
        for obj in self.objects:
            c.apply(str(obj["kind"]), obj)
        for ns in namespaces:
            if ns not in c.namespaces:
                c.apply("Namespace", {"metadata": {"name": ns, "labels": {}}})
        return c


def _where(src: str, n: int) -> str:
    return f"{src} document {n}" if n else src


def _map(value: Any, where: str, obj: str, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(where, obj, path, f"must be an object, got {type(value).__name__}")
    return value


def _seconds(value: Any, where: str, obj: str, path: str) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigError(where, obj, path, f"{value!r} is not a number of seconds >= 0")
    return float(value)


def parse_settings(obj: Mapping[str, Any], where: str, base: Settings | None = None) -> Settings:
    name = f"WhatIfSettings {(_map(obj.get('metadata'), where, 'WhatIfSettings', 'metadata')).get('name') or ''}".strip()
    spec = _map(obj.get("spec"), where, name, "spec")
    known = {"fairSharing", "starvationSeconds", "starvationHoldSeconds", "maxAdmissionsPerPass", "passSeconds",
             "retrySeconds", "prioritizePreemptors"}
    for key in spec:
        if key not in known:
            raise ConfigError(where, name, f"spec.{key}", "is not a setting", fix=f"use {', '.join(sorted(known))}")
    out = Settings(**vars(base)) if base is not None else Settings()
    fs = _map(spec.get("fairSharing"), where, name, "spec.fairSharing")
    if "enable" in fs:
        if not isinstance(fs["enable"], bool):
            raise ConfigError(where, name, "spec.fairSharing.enable", f"{fs['enable']!r} is not true or false")
        out.fair_sharing = fs["enable"]
    if "preemptionStrategies" in fs:
        strategies = fs["preemptionStrategies"]
        if not isinstance(strategies, list) or tuple(strategies) not in ALLOWED:
            raise ConfigError(where, name, "spec.fairSharing.preemptionStrategies", f"{strategies!r} is not allowed",
                              fix=f"use one of {[list(a) for a in ALLOWED]}")
        out.preemption_strategies = tuple(strategies)
    for key, attr in (("starvationSeconds", "starvation_seconds"), ("starvationHoldSeconds", "starvation_hold_seconds"),
                      ("passSeconds", "pass_seconds"), ("retrySeconds", "retry_seconds")):
        if key in spec:
            setattr(out, attr, _seconds(spec[key], where, name, f"spec.{key}"))
    if out.starvation_hold_seconds <= 0 or out.retry_seconds <= 0:
        raise ConfigError(where, name, "spec.starvationHoldSeconds" if out.starvation_hold_seconds <= 0
                          else "spec.retrySeconds", "must be more than 0")
    if "prioritizePreemptors" in spec:
        if not isinstance(spec["prioritizePreemptors"], bool):
            raise ConfigError(where, name, "spec.prioritizePreemptors",
                              f"{spec['prioritizePreemptors']!r} is not true or false")
        out.prioritize_preemptors = spec["prioritizePreemptors"]
    if "maxAdmissionsPerPass" in spec:
        value = spec["maxAdmissionsPerPass"]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(where, name, "spec.maxAdmissionsPerPass", f"{value!r} is not a positive integer")
        out.max_admissions_per_pass = value
    return out


def _strings(value: Any, where: str, obj: str, path: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in _map(value, where, obj, path).items()}


def parse_cluster(obj: Mapping[str, Any], where: str) -> Cluster:
    md = _map(obj.get("metadata"), where, "WorkerCluster", "metadata")
    name = md.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(where, "WorkerCluster", "metadata.name", "is missing")
    label = f"WorkerCluster {name}"
    spec = _map(obj.get("spec"), where, label, "spec")
    groups = []
    nodes = spec.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise ConfigError(where, label, "spec.nodes", "must list the cluster's nodes",
                          fix="e.g. nodes: [{name: gpu, count: 10, allocatable: {cpu: '64', nvidia.com/gpu: '8'}}]")
    for i, n in enumerate(nodes):
        path = f"spec.nodes[{i}]"
        n = _map(n, where, label, path)
        count = n.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ConfigError(where, label, f"{path}.count", f"{count!r} is not a positive integer")
        alloc = _map(n.get("allocatable"), where, label, f"{path}.allocatable")
        if not alloc:
            raise ConfigError(where, label, f"{path}.allocatable", "is missing", fix="e.g. {cpu: '64', memory: 256Gi}")
        try:
            parsed = {str(k): parse_quantity(v, f"{path}.allocatable.{k}") for k, v in alloc.items()}
        except Invalid as exc:
            raise ConfigError(where, label, exc.field, exc.detail, fix=exc.fix) from None
        taints = []
        for j, t in enumerate(n.get("taints") or []):
            t = _map(t, where, label, f"{path}.taints[{j}]")
            taints.append((str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or "NoSchedule")))
        groups.append(NodeGroup(str(n.get("name") or f"node{i}"), count, parsed,
                                _strings(n.get("labels"), where, label, f"{path}.labels"), tuple(taints)))
    cordons = []
    for i, c in enumerate(spec.get("cordons") or []):
        c = _map(c, where, label, f"spec.cordons[{i}]")
        if "from" not in c:
            raise ConfigError(where, label, f"spec.cordons[{i}].from", "is missing",
                              fix="seconds after the trace's first arrival")
        start = _seconds(c["from"], where, label, f"spec.cordons[{i}].from")
        until = _seconds(c["until"], where, label, f"spec.cordons[{i}].until") if c.get("until") is not None else None
        cordons.append((start, until))
    kinds = spec.get("kinds")
    if kinds is not None and not isinstance(kinds, list):
        raise ConfigError(where, label, "spec.kinds", "must be a list of job kinds (omit it: every kind)")
    cordoned = spec.get("cordoned", False)
    if not isinstance(cordoned, bool):
        raise ConfigError(where, label, "spec.cordoned", f"{cordoned!r} is not true or false")
    return Cluster(name, groups, _strings(md.get("labels"), where, label, "metadata.labels"),
                   frozenset(str(k) for k in kinds) if kinds is not None else None, cordoned, cordons)


def load_documents(docs: Iterable[tuple[str, int, Any]], base: Config | None = None, *,
                   overlay: bool = False, check: bool = True) -> Config:
    """A configuration from parsed YAML documents ``(source, number, object)``. With ``base``, the settings
    given override the base's field by field and, as a whole, the Kueue objects given replace the base's
    queue objects and the clusters given its clusters (a part not given is the base's). With ``overlay``,
    each object or cluster given replaces the base's of the same kind and name, and the rest stay: a file
    with one changed ClusterQueue is a whole new configuration."""
    objects: list[dict[str, Any]] = []
    settings = Settings(**vars(base.settings)) if base is not None else Settings()
    clusters: dict[str, Cluster] = {}
    seen: dict[tuple[str, str, str], str] = {}
    sources: list[str] = []
    for src, n, obj in docs:
        where = _where(src, n)
        if obj is None:
            continue
        if not isinstance(obj, Mapping):
            raise ConfigError(where, "", "(document)", "must be a Kubernetes object (apiVersion, kind, metadata)")
        kind = obj.get("kind")
        if kind == "List":
            items = obj.get("items")
            if not isinstance(items, list):
                raise ConfigError(where, "List", "items", "must be a list of objects")
            sub = load_documents(((f"{where} item {i}", 0, it) for i, it in enumerate(items)), None, check=False)
            objects += sub.objects
            clusters.update(sub.clusters)
            continue
        if kind not in KINDS:
            raise ConfigError(where, str(kind or ""), "kind", f"{kind!r} is not a what-if configuration object",
                              fix=f"use {', '.join(KINDS)}")
        md = _map(obj.get("metadata"), where, str(kind), "metadata")
        name = str(md.get("name") or "")
        label = f"{kind} {md.get('namespace')}/{name}" if kind == "LocalQueue" else f"{kind} {name}"
        if src not in sources:
            sources.append(src)
        if kind == "WhatIfSettings":
            settings = parse_settings(obj, where, settings)
            continue
        if kind == "WorkerCluster":
            c = parse_cluster(obj, where)
            if c.name in clusters:
                raise ConfigError(where, label, "metadata.name", "is given twice")
            clusters[c.name] = c
            continue
        if not name:
            raise ConfigError(where, str(kind), "metadata.name", "is missing")
        if kind in KUEUE_KINDS:
            version = str(obj.get("apiVersion") or "")
            group, _, ver = version.partition("/")
            if group != api.GROUP or ver not in api.VERSIONS:
                raise ConfigError(where, label, "apiVersion", f"{version!r} is not Kueue's",
                                  fix=f"use {api.GROUP}/{api.VERSIONS[0]} (or {api.VERSIONS[1]})")
        if kind != "Namespace":
            try:
                api.PARSERS[str(kind)](obj)
            except Invalid as exc:
                raise ConfigError(where, label, exc.field, exc.detail, fix=exc.fix) from None
        key = (str(kind), str(md.get("namespace") or ""), name)
        if key in seen:
            raise ConfigError(where, label, "metadata.name", f"is also defined in {seen[key]}")
        seen[key] = where
        objects.append(dict(obj))
    out = Config(objects, settings, clusters, sources)
    if base is not None:
        out.sources = base.sources + sources
        if overlay:
            given = {_key(o) for o in objects}
            out.objects = [o for o in base.objects if _key(o) not in given] + objects
            out.clusters = {**base.clusters, **clusters}
        else:
            if not {o["kind"] for o in objects} & {*KUEUE_KINDS}:
                out.objects = base.objects + [o for o in objects if o["kind"] in ("Namespace", "PriorityClass")]
            if not clusters:
                out.clusters = base.clusters
    if check:
        _check_references(out.objects, objects)
    return out


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    md = obj.get("metadata") or {}
    return str(obj.get("kind")), str(md.get("namespace") or ""), str(md.get("name") or "")


def _check_references(objects: list[dict[str, Any]], given: list[dict[str, Any]]) -> None:
    """A ClusterQueue given naming a ResourceFlavor that is not in ``objects``, a LocalQueue naming a ClusterQueue
    that is not: the dispatcher would keep their Workloads pending, seldom what a what-if means to ask."""
    flavors = {o["metadata"]["name"] for o in objects if o["kind"] == "ResourceFlavor"}
    cqs = {o["metadata"]["name"] for o in objects if o["kind"] == "ClusterQueue"}
    if not cqs:
        return
    for o in given:
        if o["kind"] == "ClusterQueue":
            parsed = api.parse_cluster_queue(o)
            for g, group in enumerate(parsed.resource_groups):
                for f, fq in enumerate(group.flavors):
                    if fq.name not in flavors:
                        raise ConfigError("configuration", f"ClusterQueue {parsed.name}",
                                          f"spec.resourceGroups[{g}].flavors[{f}].name",
                                          f"ResourceFlavor {fq.name!r} is not given", fix="add the ResourceFlavor")
        if o["kind"] == "LocalQueue":
            target = (o.get("spec") or {}).get("clusterQueue")
            if target not in cqs:
                md = o["metadata"]
                raise ConfigError("configuration", f"LocalQueue {md.get('namespace')}/{md['name']}", "spec.clusterQueue",
                                  f"ClusterQueue {target!r} is not given", fix="add the ClusterQueue or fix the name")


def read_yaml(paths: Iterable[str | Path]) -> list[tuple[str, int, Any]]:
    """YAML documents of files and folders (``*.yaml``, ``*.yml``, ``*.json``, sorted), with where each is."""
    out: list[tuple[str, int, Any]] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.suffix in (".yaml", ".yml", ".json") and f.is_file())
            if not files:
                raise ConfigError(str(path), "", "(folder)", "holds no .yaml, .yml or .json file")
        elif path.is_file():
            files = [path]
        else:
            raise ConfigError(str(path), "", "(path)", "does not exist")
        for f in files:
            try:
                docs = list(yaml.safe_load_all(f.read_text()))
            except yaml.YAMLError as exc:
                raise ConfigError(str(f), "", "(YAML)", str(exc).replace("\n", " ")) from None
            out += [(str(f), i + 1 if len(docs) > 1 else 0, d) for i, d in enumerate(docs)]
    return out


def load(paths: Iterable[str | Path], base: Config | None = None, *, overlay: bool = False) -> Config:
    return load_documents(read_yaml(paths), base, overlay=overlay)
