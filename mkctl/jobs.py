"""The sample jobs: loading them from ``examples/``, what each is expected to end as, and how far it got.

Shared by the demo and the end-to-end tests. :func:`load_examples` reads YAML files into
:class:`Sample` objects (job kinds the registry knows, and with ``declared`` those an examples file declares),
runtimes (``TrainingRuntime`` / ``ClusterTrainingRuntime``, installed into every cluster), CRDs, declarations
files (``externalFrameworks``) and namespaces. :func:`expectation` says
what a sample should end as: ``Succeeded`` for a job handed to mkd, ``Pending`` (with a reason) for one
that fits no cluster, ``Untouched`` for one managed by another controller. :func:`observe` reads a
manager Job as the dispatcher left it and says where it stands, in the words of the demo's table.
Everything here looks at the manager cluster only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from federation import labels

log = logging.getLogger(__name__)

Expect = str
"""Succeeded, Failed, Pending, Untouched, or, for a kind that serves until deleted, the condition of its own it
reaches and keeps (a LeaderWorkerSet's ``Available``)."""
ENDS = ("Succeeded", "Failed", "Pending", "Untouched")
EXPECT_ANNOTATION = "mkd.dev/demo-expect"
"""An example may state its expected end explicitly: one of :data:`ENDS` or a serving condition."""

RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
DEMO_SETS = ("**",)
"""Glob patterns of folders under ``examples/`` the demo submits: all of them."""


def examples_dir() -> Path:
    """``examples/`` of the source tree (editable install), else of the working directory."""
    here = Path(__file__).resolve().parents[1] / "examples"
    return here if here.is_dir() else Path.cwd() / "examples"


def queues_dir() -> Path:
    """``demo/queues/`` (the queue objects and jobs ``make demo`` adds to the examples), found like ``examples/``."""
    here = Path(__file__).resolve().parents[1] / "demo" / "queues"
    return here if here.is_dir() else Path.cwd() / "demo" / "queues"


@dataclass
class Sample:
    """One job manifest to submit to the manager, where it came from, and what it should end as."""

    manifest: dict[str, Any]
    source: Path
    expect: Expect

    @property
    def kind(self) -> str:
        return str(self.manifest.get("kind", ""))

    @property
    def name(self) -> str:
        return str(self.manifest.get("metadata", {}).get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.manifest.get("metadata", {}).get("namespace") or "default")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class Examples:
    samples: list[Sample] = field(default_factory=list)
    runtimes: list[dict[str, Any]] = field(default_factory=list)
    namespaces: set[str] = field(default_factory=set)
    skipped: list[str] = field(default_factory=list)
    queue_objects: list[dict[str, Any]] = field(default_factory=list)
    """Kueue objects (ResourceFlavor, ClusterQueue, LocalQueue, ...) the demo installs on the manager."""
    crds: list[dict[str, Any]] = field(default_factory=list)
    """CustomResourceDefinitions of declared kinds, installed into every cluster (with ``declared``)."""
    kinds_files: list[Path] = field(default_factory=list)
    """Declarations files (``externalFrameworks``; the services' ``kinds_file``), with ``declared``."""
    declared: tuple[Any, ...] = ()
    """The kinds those files declare."""

    def add(self, other: Examples) -> None:
        """Another set's samples, runtimes, namespaces and queue objects after these."""
        self.samples += other.samples
        self.runtimes += other.runtimes
        self.namespaces |= other.namespaces
        self.skipped += other.skipped
        self.queue_objects += other.queue_objects
        self.crds += other.crds
        self.kinds_files += other.kinds_files
        self.declared += other.declared


def _kind_of(manifest: Mapping[str, Any], declared: Iterable[Any] = ()) -> Any:
    from federation.kinds.registry import by_api

    api_version, kind = str(manifest.get("apiVersion", "")), str(manifest.get("kind", ""))
    return by_api(api_version, kind) or next(
        (k for k in declared if (k.api_version, k.name) == (api_version, kind)), None)


def expectation(manifest: Mapping[str, Any], source: Path | None = None, declared: Iterable[Any] = ()) -> Expect:
    """What a sample should end as; explicit annotation first, then managedBy and the file's name."""
    meta = manifest.get("metadata", {}) or {}
    explicit = (meta.get("annotations") or {}).get(EXPECT_ANNOTATION)
    if isinstance(explicit, str) and explicit:
        return explicit
    kind = _kind_of(manifest, declared)
    if kind is None or kind.managed_by(manifest) != labels.MULTIKUEUE:
        return "Untouched"
    name = f"{source.stem if source else ''} {meta.get('name', '')}"
    if "too-large" in name or "too-big" in name or "oversize" in name:
        return "Pending"
    return "Succeeded"


def load_examples(root: Path | None = None, sets: Iterable[str] = DEMO_SETS, *, declared: bool = False) -> Examples:
    """Every document of ``*.yaml`` in the chosen folders of ``examples/``, sorted into samples and runtimes.

    ``declared``: also the jobs of kinds a declarations file among them declares, with those files and the CRDs
    (whoever submits them runs the services with that ``kinds_file`` and installs the CRDs); without it, those
    jobs are skipped like any kind mkd does not know."""
    from federation.kinds.declared import ROOT, parse
    from federation.kinds.registry import KINDS

    root = root or examples_dir()
    found = Examples()
    paths = sorted({p for sub in sets for pattern in ("*.yaml", "*.yml")
                    for p in root.glob(f"{sub}/{pattern}" if sub else pattern)})
    read: list[tuple[Path, dict[str, Any]]] = []
    for path in paths:
        with path.open() as fh:
            read += [(path, d) for d in yaml.safe_load_all(fh) if isinstance(d, dict)]
    if declared:
        for path, doc in read:
            if ROOT in doc:
                found.kinds_files.append(path)
                found.declared += parse(doc, str(path), KINDS)
    for path, doc in read:
        kind = str(doc.get("kind", ""))
        if ROOT in doc:
            continue
        if kind == "CustomResourceDefinition":
            if declared:
                found.crds.append(doc)
            continue
        if kind in RUNTIME_KINDS:
            found.runtimes.append(doc)
        elif str(doc.get("apiVersion", "")).startswith("kueue.x-k8s.io/"):
            found.queue_objects.append(doc)
            if doc.get("metadata", {}).get("namespace"):
                found.namespaces.add(str(doc["metadata"]["namespace"]))
        elif kind == "Namespace":
            found.namespaces.add(str(doc["metadata"]["name"]))
        elif _kind_of(doc, found.declared) is not None:
            sample = Sample(doc, path, expectation(doc, path, found.declared))
            found.samples.append(sample)
            found.namespaces.add(sample.namespace)
        else:
            found.skipped.append(f"{path.name}: {doc.get('apiVersion')}/{kind}")
    for runtime in found.runtimes:
        ns = runtime.get("metadata", {}).get("namespace")
        if runtime.get("kind") == "TrainingRuntime":
            found.namespaces.add(str(ns or "default"))
    return found


# --- observing a manager Job ---------------------------------------------------------------------


@dataclass
class Observation:
    """Where one manager Job stands, as the demo table shows it."""

    key: str
    kind: str
    queue: str
    state: str
    """Waiting (not claimed yet), Pending, Placed, Created, Running, Succeeded, Failed, Rejected, Untouched."""
    reason: str = ""
    cluster: str = ""
    created: datetime | None = None
    finished_at: datetime | None = None
    exists: bool = True

    def elapsed(self, now: datetime | None = None) -> float:
        if self.created is None:
            return 0.0
        end = self.finished_at or now or datetime.now(UTC)
        return max(0.0, (end - self.created).total_seconds())


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return None


def condition(job: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            return cond  # type: ignore[no-any-return]
    return None


def has_mkd_marks(job: Mapping[str, Any]) -> bool:
    """Did mkd write to this Job (a label or annotation of its own, a condition, any status)?"""
    meta = job.get("metadata", {}) or {}
    keys = list(meta.get("labels") or {}) + list(meta.get("annotations") or {})
    if any(k.startswith(labels.PREFIX + "/") for k in keys):
        return True
    return bool(job.get("status"))


def cluster_from(cond: Mapping[str, Any] | None) -> str:
    """The dispatcher names the cluster in MultiClusterDispatched's message ("... worker-2 ...")."""
    if not cond:
        return ""
    text = f"{cond.get('message', '')}"
    for word in text.replace('"', " ").replace("'", " ").replace(",", " ").split():
        word = word.strip(".;:()")
        if word.startswith("worker-") or word.startswith("cluster-"):
            return word
    return ""


def observe(sample: Sample, job: Mapping[str, Any] | None) -> Observation:
    """The manager Job ``job`` (None: not found) as a row of the demo table."""
    meta = (job or sample.manifest).get("metadata", {}) or {}
    queue = str((meta.get("labels") or {}).get(labels.QUEUE_NAME) or labels.DEFAULT_QUEUE)
    obs = Observation(sample.key, sample.kind, queue, "Waiting", created=parse_time(meta.get("creationTimestamp")))
    if job is None:
        obs.exists, obs.state, obs.reason = False, "Missing", "not found in the manager cluster"
        return obs
    kind = _kind_of(job)
    managed_by = kind.managed_by(job) if kind else None
    if managed_by != labels.MULTIKUEUE:
        obs.state = "Untouched" if not has_mkd_marks(job) else "Touched"
        obs.reason = f"managedBy={managed_by or '(none)'}: left to its own controller"
        return obs
    dispatched = condition(job, labels.CONDITION_DISPATCHED)
    rejected = condition(job, labels.CONDITION_REJECTED)
    if dispatched is not None and dispatched.get("status") == "True":
        obs.cluster = cluster_from(dispatched)
    status = job.get("status") or {}
    done = kind.finished(job) if kind else None
    if done is not None:
        obs.state, obs.reason = done.outcome, done.reason or done.message
        obs.finished_at = parse_time(status.get("completionTime")) or _last_transition(job)
    elif rejected is not None and rejected.get("status") == "True":
        obs.state, obs.reason = "Rejected", str(rejected.get("message") or rejected.get("reason") or "")
    elif (pending := condition(job, labels.CONDITION_PENDING)) is not None and pending.get("status") == "True":
        obs.state, obs.reason = "Pending", str(pending.get("message") or pending.get("reason") or "")
    elif dispatched is not None and dispatched.get("status") == "False":
        obs.state, obs.reason = "Pending", str(dispatched.get("message") or dispatched.get("reason") or "")
    elif dispatched is not None and sample.expect not in ENDS and (
            (serving := condition(job, sample.expect)) is not None and serving.get("status") == "True"):
        obs.state, obs.reason = sample.expect, str(serving.get("reason") or "")
    elif dispatched is not None:
        last = _last_condition(job, exclude=(labels.CONDITION_DISPATCHED,))
        obs.state = last or "Placed"
        obs.reason = str(dispatched.get("reason") or "")
    return obs


def _last_condition(job: Mapping[str, Any], exclude: tuple[str, ...]) -> str:
    conds = [c for c in (job.get("status") or {}).get("conditions") or []
             if c.get("type") not in exclude and c.get("status") == "True"]
    return str(conds[-1]["type"]) if conds else ""


def _last_transition(job: Mapping[str, Any]) -> datetime | None:
    times = [parse_time(c.get("lastTransitionTime")) for c in (job.get("status") or {}).get("conditions") or []]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def reached(sample: Sample, obs: Observation) -> bool:
    """Has the job reached its expected end (a pending job counts once its reason is written)?"""
    if sample.expect == "Pending":
        return obs.state == "Pending" and bool(obs.reason)
    return obs.state == sample.expect


def final(obs: Observation) -> bool:
    """No further change is expected from mkd (it may still be wrong: compare with ``reached``)."""
    return obs.state in ("Succeeded", "Failed", "Rejected", "Untouched", "Touched", "Missing")
