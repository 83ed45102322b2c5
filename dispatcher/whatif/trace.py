"""A what-if trace: the Jobs to replay, one JSON object per line, read and written without I/O of its own.

Each line is one Job: when it arrived, where it queues (namespace, LocalQueue), its priority (a
WorkloadPriorityClass name, the pods' PriorityClass names, or a fixed value), its PodSets with counts and
per-pod requests in the form the dispatcher stores them, how long it runs once started, and optionally the
cluster it must run on and mkd's cluster annotations. :func:`parse` refuses a bad line naming its number
and field; :func:`dump` writes the same form back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from dispatcher.placement import Need
from dispatcher.queueing import api
from dispatcher.workload import need_of
from federation.errors import Invalid
from federation.kinds.registry import by_name
from federation.podset import parse_quantity

FIELDS = ("name", "namespace", "kind", "queue", "arrival", "runSeconds", "podSets", "priorityClass",
          "priority", "cluster", "annotations", "runEstimated", "labels")


class TraceError(Invalid):
    """A trace line that cannot be replayed: ``line`` (1-based) and the field."""

    def __init__(self, line: int, field_: str, message: str, *, fix: str = "") -> None:
        super().__init__(f"line {line}: {field_}", message, fix=fix)
        self.line = line


@dataclass(eq=False)
class TraceJob:
    """One Job of the trace. ``arrival`` is POSIX seconds; ``priority`` overrides the classes when set."""

    name: str
    namespace: str
    kind: str
    queue: str
    arrival: float
    run_seconds: float
    podsets: list[dict[str, Any]]
    need: Need
    priority_class: str = ""
    priority: int | None = None
    cluster: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    run_estimated: bool = False
    line: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def pod_priority_classes(self) -> list[str]:
        return [str(p["priorityClassName"]) for p in self.podsets if p.get("priorityClassName")]

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "namespace": self.namespace, "kind": self.kind,
                               "queue": self.queue, "arrival": _iso(self.arrival), "runSeconds": self.run_seconds,
                               "podSets": self.podsets}
        if self.priority_class:
            out["priorityClass"] = self.priority_class
        if self.priority is not None:
            out["priority"] = self.priority
        if self.cluster:
            out["cluster"] = self.cluster
        if self.annotations:
            out["annotations"] = self.annotations
        if self.run_estimated:
            out["runEstimated"] = True
        return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def parse_time(value: Any, where: str) -> float:
    """RFC 3339 text, or a number of seconds on any clock (the report counts from the first arrival)."""
    if isinstance(value, bool):
        raise Invalid(where, f"{value!r} is not a time", fix="write RFC 3339 (2026-01-01T12:00:00Z) or seconds")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise Invalid(where, f"{value!r} is not a time",
                          fix="write RFC 3339 (2026-01-01T12:00:00Z) or seconds") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    raise Invalid(where, f"{value!r} is not a time", fix="write RFC 3339 (2026-01-01T12:00:00Z) or seconds")


def _podsets(value: Any, n: int) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise TraceError(n, "podSets", "must be a non-empty list of {name, count, requests}",
                         fix='e.g. [{"name": "worker", "count": 2, "requests": {"cpu": "4"}}]')
    out = []
    names = set()
    for i, p in enumerate(value):
        where = f"podSets[{i}]"
        if not isinstance(p, Mapping):
            raise TraceError(n, where, "must be an object {name, count, requests}")
        name = p.get("name")
        if not isinstance(name, str) or not name:
            raise TraceError(n, f"{where}.name", "is missing", fix="name the PodSet (worker, master, ...)")
        if name in names:
            raise TraceError(n, f"{where}.name", f"{name!r} appears twice", fix="give each PodSet its own name")
        names.add(name)
        count = p.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise TraceError(n, f"{where}.count", f"{count!r} is not a positive integer")
        requests = p.get("requests")
        if not isinstance(requests, Mapping) or not requests:
            raise TraceError(n, f"{where}.requests", "must be an object of resource quantities",
                             fix='e.g. {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}')
        for res, q in requests.items():
            try:
                parse_quantity(q, f"{where}.requests.{res}")
            except Invalid as exc:
                raise TraceError(n, exc.field, exc.detail, fix=exc.fix) from None
        out.append({**p, "name": name, "count": count, "requests": {str(k): str(v) for k, v in requests.items()}})
    return out


def parse_line(obj: Any, n: int) -> TraceJob:
    if not isinstance(obj, Mapping):
        raise TraceError(n, "(line)", "must be a JSON object, one Job per line")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise TraceError(n, unknown[0], "is not a trace field", fix=f"use {', '.join(FIELDS)}")
    for required in ("name", "namespace", "arrival", "runSeconds", "podSets"):
        if obj.get(required) in (None, ""):
            raise TraceError(n, required, "is missing")
    name, namespace = obj["name"], obj["namespace"]
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise TraceError(n, "name" if not isinstance(name, str) else "namespace", "must be a string")
    kind = str(obj.get("kind") or "Job")
    try:
        by_name(kind)
    except Invalid as exc:
        raise TraceError(n, "kind", exc.detail, fix=exc.fix) from None
    try:
        arrival = parse_time(obj["arrival"], "arrival")
    except Invalid as exc:
        raise TraceError(n, "arrival", exc.detail, fix=exc.fix) from None
    run = obj["runSeconds"]
    if not isinstance(run, int | float) or isinstance(run, bool) or run < 0:
        raise TraceError(n, "runSeconds", f"{run!r} is not a number of seconds >= 0")
    priority = obj.get("priority")
    if priority is not None and (not isinstance(priority, int) or isinstance(priority, bool)):
        raise TraceError(n, "priority", f"{priority!r} is not an integer")
    annotations = obj.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise TraceError(n, "annotations", "must be an object of strings")
    try:
        api.placement_of(annotations)
    except Invalid as exc:
        raise TraceError(n, exc.field.replace("metadata.", ""), exc.detail, fix=exc.fix) from None
    podsets = _podsets(obj["podSets"], n)
    try:
        need = need_of(kind, podsets)
    except (Invalid, KeyError, ValueError, TypeError) as exc:
        raise TraceError(n, "podSets", str(exc)) from None
    cluster = obj.get("cluster")
    if cluster is not None and not isinstance(cluster, str):
        raise TraceError(n, "cluster", "must be a cluster name")
    return TraceJob(name=name, namespace=namespace, kind=kind, queue=str(obj.get("queue") or "default"),
                    arrival=arrival, run_seconds=float(run), podsets=podsets, need=need,
                    priority_class=str(obj.get("priorityClass") or ""), priority=priority, cluster=cluster or None,
                    annotations={str(k): str(v) for k, v in annotations.items()},
                    run_estimated=bool(obj.get("runEstimated")), line=n)


def parse(lines: Iterable[str | bytes]) -> list[TraceJob]:
    """Every Job of a JSON Lines trace (blank lines and lines starting with # are skipped)."""
    out: list[TraceJob] = []
    seen: dict[str, int] = {}
    shared: dict[bytes, tuple[list[dict[str, Any]], Need]] = {}   # one Need per distinct PodSets (100,000 Jobs)
    for n, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text or text[:1] in ("#", b"#"):
            continue
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise TraceError(n, "(line)", f"is not JSON: {exc}") from None
        key = orjson.dumps([obj.get("kind"), obj.get("podSets")], option=orjson.OPT_SORT_KEYS) \
            if isinstance(obj, dict) else b""
        job = parse_line(obj, n)
        if key in shared:
            job.podsets, job.need = shared[key]
        else:
            shared[key] = (job.podsets, job.need)
        if job.key in seen:
            raise TraceError(n, "name", f"{job.key} is already on line {seen[job.key]}",
                             fix="give each Job of the trace its own namespace/name")
        seen[job.key] = n
        out.append(job)
    return out


def dump(jobs: Iterable[TraceJob]) -> bytes:
    return b"".join(orjson.dumps(j.as_dict()) + b"\n" for j in jobs)

