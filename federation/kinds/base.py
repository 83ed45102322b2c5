"""The JobKind protocol and the helpers every kind shares.

A :class:`JobKind` knows one kind of Job: its group/version/kind/plural, where managedBy lives,
what mkd validates (each failure an :class:`~federation.errors.Invalid` naming the field path and
the fix, all failures collected), its PodSets, its suspend switch, how to read finished /
succeeded / failed from status, and how to prepare the copy sent to a worker. :class:`BaseKind`
implements the parts that only differ by a field path; the kind modules add validation, PodSets
and status rules. Nothing here talks to a cluster.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import orjson

from federation import labels
from federation.errors import Invalid
from federation.jsoncopy import json_copy
from federation.podset import PodSet, pod_requests

SERVER_SET_METADATA = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "generation",
    "managedFields",
    "ownerReferences",
    "finalizers",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "generateName",
)
"""Metadata the API server sets (or that binds an object to its cluster): never copied to a worker."""

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
"""kubectl's annotation: it describes the manager object, so the worker copy drops it."""

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class Finished(NamedTuple):
    """A Job's final outcome read from its status."""

    outcome: Literal["Succeeded", "Failed"]
    reason: str
    message: str


RunBy = Literal["agent", "operator"]
"""Who runs a kind's worker copy: ``agent``, a reconciler of mkd's agent (unless the cluster's agent delegates the
kind to an installed operator); ``operator``, the worker cluster's own controller (the batch Job controller), with
the agent creating, mirroring and deleting the copy only."""


@dataclass(frozen=True)
class RuntimeRef:
    """Where a TrainJob's runtime lives; ``namespace`` None means cluster-scoped."""

    api_version: str
    kind: str
    plural: str
    name: str
    namespace: str | None


@runtime_checkable
class JobKind(Protocol):
    """What the dispatcher and the agent need to know about one kind of Job."""

    # read-only properties so frozen dataclasses and plain attributes both satisfy the protocol
    @property
    def name(self) -> str: ...  # "PyTorchJob", "MPIJob", "TrainJob", "Job", "JobSet", ...
    @property
    def group(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def plural(self) -> str: ...
    @property
    def api_version(self) -> str: ...  # "kubeflow.org/v1", "batch/v1"
    @property
    def controller(self) -> str: ...  # the kind's own managedBy value (federation.labels)
    @property
    def managed_by_path(self) -> tuple[str, ...]: ...
    @property
    def suspend_path(self) -> tuple[str, ...]: ...
    @property
    def max_conditions(self) -> int | None: ...  # the CRD's maxItems on status.conditions (TrainJob: 8)
    @property
    def run_by(self) -> RunBy: ...  # who runs the worker copy: mkd's agent or the cluster's own controller
    @property
    def defaulted_by_crd(self) -> bool: ...  # the CRD's schema defaults managedBy to ``controller``
    @property
    def reads(self) -> tuple[tuple[str, str], ...]: ...  # (group, plural) also read (get) for this kind

    @property
    def managed_by_field(self) -> str: ...  # what a user writes to hand a Job to mkd, for messages

    def managed_by(self, job: Mapping[str, Any]) -> str | None: ...
    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]: ...
    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]: ...
    def runtime_ref(self, job: Mapping[str, Any]) -> RuntimeRef | None: ...
    def is_suspended(self, job: Mapping[str, Any]) -> bool: ...
    def with_suspended(self, job: Mapping[str, Any], value: bool) -> dict[str, Any]: ...
    def suspend_patch(self, job: Mapping[str, Any], value: bool) -> dict[str, Any]: ...
    def finished(self, job: Mapping[str, Any]) -> Finished | None: ...
    def prepare_for_worker(
        self, job: Mapping[str, Any], *, stamp: Mapping[str, str], managed_by: str | None
    ) -> dict[str, Any]: ...
    def update_for_worker(self, existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]: ...


# --- path helpers ------------------------------------------------------------------------------


def get_path(obj: Mapping[str, Any], path: Sequence[str]) -> Any:
    """The value at ``path`` or None when any step is missing or not a map."""
    node: Any = obj
    for key in path:
        if type(node) is not dict and not isinstance(node, Mapping):  # (the exact type first: ABC checks cost)
            return None
        node = node.get(key)
    return node


def set_path(obj: dict[str, Any], path: Sequence[str], value: Any) -> None:
    """Set ``path`` in place, creating maps on the way."""
    node = obj
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def del_path(obj: dict[str, Any], path: Sequence[str]) -> None:
    """Remove ``path`` in place if present."""
    parent = get_path(obj, path[:-1]) if len(path) > 1 else obj
    if isinstance(parent, dict):
        parent.pop(path[-1], None)


def dotted(path: Sequence[str]) -> str:
    return ".".join(path)


def as_map(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a map, else an empty one (validation reports the wrong type separately)."""
    return value if isinstance(value, Mapping) else {}


# --- shared validation -------------------------------------------------------------------------


def validate_dns1035(name: Any, field: str = "metadata.name", max_length: int = 63) -> list[Invalid]:
    """RFC 1035 label: lower-case alphanumerics and '-', starting with a letter, at most 63 characters."""
    if not isinstance(name, str) or not name:
        return [Invalid(field, "is required", fix="set a name such as my-job")]
    problems = []
    if len(name) > max_length:
        problems.append(f"must be no more than {max_length} characters")
    if not _DNS1035.fullmatch(name):
        problems.append(
            "must consist of lower case alphanumeric characters or '-', start with a letter "
            "and end with an alphanumeric character (RFC 1035 label)"
        )
    return [Invalid(field, f"{name!r} {p}", fix="rename it, e.g. my-job-1") for p in problems]


def validate_dns1123(name: Any, field: str) -> list[Invalid]:
    """RFC 1123 label (names of replicated Jobs, containers)."""
    if not isinstance(name, str) or not name:
        return [Invalid(field, "is required", fix="set a name such as worker")]
    if len(name) > 63 or not _DNS1123.fullmatch(name):
        return [
            Invalid(
                field, f"{name!r} is not a valid RFC 1123 label", fix="use lower case letters, digits and '-'"
            )
        ]
    return []


def validate_bool(job: Mapping[str, Any], path: tuple[str, ...]) -> list[Invalid]:
    """An optional boolean field (``spec.suspend``, ``spec.runPolicy.suspend``): absent or true/false."""
    value = get_path(job, path)
    if value is None or isinstance(value, bool):
        return []
    return [Invalid(".".join(path), f"{value!r} is not a boolean", fix="write true or false")]


def validate_managed_by(kind: JobKind, job: Mapping[str, Any]) -> list[Invalid]:
    """managedBy is absent, the kind's own controller, or MultiKueue."""
    value = get_path(job, kind.managed_by_path)
    allowed = (kind.controller, labels.MULTIKUEUE)
    if value is None or value in allowed:
        return []
    return [
        Invalid(
            dotted(kind.managed_by_path),
            f"unsupported value {value!r}: supported values are {allowed[0]!r} and {allowed[1]!r}",
            fix=f"set it to {labels.MULTIKUEUE!r} to run it through mkd, or remove it",
        )
    ]


def validate_count(value: Any, field: str, *, minimum: int, required: bool = False) -> list[Invalid]:
    """An integer count at least ``minimum`` (absent is fine unless ``required``)."""
    if value is None:
        return [Invalid(field, "is required", fix=f"set it to an integer >= {minimum}")] if required else []
    if isinstance(value, bool) or not isinstance(value, int):
        return [Invalid(field, f"{value!r} is not an integer", fix=f"set it to an integer >= {minimum}")]
    if value < minimum:
        return [
            Invalid(
                field, f"{value} must be greater than or equal to {minimum}", fix=f"set it to >= {minimum}"
            )
        ]
    return []


def int_or(value: Any, default: int) -> int:
    """``value`` when it is a real int, else ``default`` (validation reports bad values)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


_VALID_TEMPLATES: collections.OrderedDict[bytes, None] = collections.OrderedDict()
_VALID_TEMPLATES_MAX = 1024


def validate_pod_template(
    template: Any, field: str, *, required_container: str | None = None
) -> list[Invalid]:
    """A PodTemplateSpec with ≥1 container, each named and with an image, and parseable resources.

    Templates found valid are remembered (by their JSON, the field and the container rule): Jobs
    submitted from one template repeat it, and adding up the requests again is most of a claim's
    validation. Invalid ones are checked afresh each time (their problems are new objects)."""
    try:
        key = orjson.dumps([template, field, required_container], option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not JSON (never from an API server): just check
        key = b""
    if key and key in _VALID_TEMPLATES:
        _VALID_TEMPLATES.move_to_end(key)
        return []
    errors = _validate_pod_template(template, field, required_container)
    if key and not errors:
        _VALID_TEMPLATES[key] = None
        if len(_VALID_TEMPLATES) > _VALID_TEMPLATES_MAX:
            _VALID_TEMPLATES.popitem(last=False)
    return errors


def _validate_pod_template(template: Any, field: str, required_container: str | None) -> list[Invalid]:
    if not isinstance(template, Mapping):
        return [Invalid(field, "is required", fix="add a pod template with spec.containers")]
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        return [
            Invalid(f"{field}.spec", "is required", fix="add spec.containers with at least one container")
        ]
    errors: list[Invalid] = []
    containers_field = f"{field}.spec.containers"
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        errors.append(
            Invalid(containers_field, "must be specified", fix="add at least one container with an image")
        )
        containers = []
    names = []
    for key in ("containers", "initContainers"):
        items = spec.get(key) or []
        if not isinstance(items, list):
            if key == "initContainers":
                errors.append(
                    Invalid(f"{field}.spec.{key}", "must be a list", fix="write a list of containers")
                )
            continue
        for index, container in enumerate(items):
            path = f"{field}.spec.{key}[{index}]"
            if not isinstance(container, Mapping):
                errors.append(
                    Invalid(path, "must be a container object", fix="write {name: ..., image: ...}")
                )
                continue
            if key == "containers":
                names.append(container.get("name"))
            if not isinstance(container.get("name"), str) or not container.get("name"):
                errors.append(Invalid(f"{path}.name", "is required", fix="name the container"))
            image = container.get("image")
            if not isinstance(image, str) or not image.strip():
                errors.append(Invalid(f"{path}.image", "must be required", fix="set the container image"))
    if required_container is not None and containers and required_container not in names:
        errors.append(
            Invalid(
                containers_field,
                f"must have at least one container with name {required_container}",
                fix=f"name the main container {required_container!r}",
            )
        )
    if not errors:
        try:
            pod_requests(spec, f"{field}.spec")
        except Invalid as exc:
            errors.append(exc)
    return errors


def podset_for(name: str, count: int, template: Mapping[str, Any], field: str) -> PodSet:
    """A PodSet from a validated template; per-pod requests counted by the scheduler's rules."""
    spec = as_map(template.get("spec"))
    return PodSet(
        name=name,
        count=count,
        template=json_copy(dict(template)),
        requests=pod_requests(spec, f"{field}.spec"),
    )


def raise_first(errors: list[Invalid]) -> None:
    """podsets() refuses an invalid Job with its first failure (validate() lists all of them)."""
    if errors:
        raise errors[0]


# --- status helpers ----------------------------------------------------------------------------


PASSING_CONDITIONS = frozenset({"Created"})
"""A Job's own conditions that it leaves on its own within moments: the Kubeflow v1 family's first
(``JobCreated``, until its pods run)."""


def latest_condition(status: Mapping[str, Any], ignore: Collection[str] = ()) -> str | None:
    """The type of the latest True condition in ``status`` whose type is not in ``ignore``, if any."""
    last = None
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("status") == "True" and c.get("type") not in ignore:
            last = c.get("type")
    return last if isinstance(last, str) else None


def true_condition(job: Mapping[str, Any], *types: str) -> dict[str, Any] | None:
    """The newest (last listed) condition of one of ``types`` with status True."""
    conditions = get_path(job, ("status", "conditions"))
    if not isinstance(conditions, list):
        return None
    found = None
    for condition in conditions:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") in types
            and condition.get("status") == "True"
        ):
            found = dict(condition)
    return found


def finished_from_conditions(job: Mapping[str, Any], succeeded: str, failed: str) -> Finished | None:
    """Finished from a Succeeded-like and a Failed-like condition, whichever True one is newest."""
    condition = true_condition(job, succeeded, failed)
    if condition is None:
        return None
    outcome: Literal["Succeeded", "Failed"] = "Succeeded" if condition["type"] == succeeded else "Failed"
    return Finished(
        outcome, str(condition.get("reason") or condition["type"]), str(condition.get("message") or "")
    )


# --- the common implementation -------------------------------------------------------------------


@dataclass(frozen=True)
class BaseKind:
    """Identity, managedBy, suspend and the worker copy; subclasses add validate/podsets/finished."""

    name: str
    group: str
    version: str
    plural: str
    controller: str
    managed_by_path: tuple[str, ...]
    suspend_path: tuple[str, ...]
    max_conditions: int | None = None
    """The most conditions the kind's CRD lets ``status.conditions`` hold (None: no limit); a status write
    above it is refused whole, so the manager Job's writer drops mkd's least telling ones first."""
    run_by: RunBy = "agent"
    """Who runs the worker copy (:data:`RunBy`)."""
    defaulted_by_crd: bool = False
    """The CRD's schema defaults managedBy to :attr:`controller` while a request is decoded (TrainJob's), so an
    explicit controller value cannot be told from an omitted one (the handover webhook counts it as unset)."""
    reads: tuple[tuple[str, str], ...] = ()
    """Other resources, as (API group, plural), the dispatcher and the agent read (get) for this kind (a
    TrainJob's runtimes); part of the kind's RBAC rules in deploy/."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def managed_by_field(self) -> str:
        """The managedBy field, or for a kind without one the Kueue queue label that hands it to mkd."""
        return dotted(self.managed_by_path) if self.managed_by_path else f"metadata.labels[{labels.QUEUE_NAME}]"

    def managed_by(self, job: Mapping[str, Any]) -> str | None:
        """The managedBy value as written (None when absent; no default is invented). A kind without a managedBy
        field (``managed_by_path`` empty: LeaderWorkerSet) is handed to mkd by naming a Kueue queue, as Kueue
        decides for it: such a Job reads as managed by MultiKueue while it carries ``kueue.x-k8s.io/queue-name``."""
        if not self.managed_by_path:
            queue = get_path(job, ("metadata", "labels", labels.QUEUE_NAME))
            return labels.MULTIKUEUE if isinstance(queue, str) and queue else None
        value = get_path(job, self.managed_by_path)
        return value if isinstance(value, str) else None

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        raise NotImplementedError

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        raise NotImplementedError

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        raise NotImplementedError

    def runtime_ref(self, job: Mapping[str, Any]) -> RuntimeRef | None:
        return None

    def is_suspended(self, job: Mapping[str, Any]) -> bool:
        return get_path(job, self.suspend_path) is True

    def with_suspended(self, job: Mapping[str, Any], value: bool) -> dict[str, Any]:
        out = json_copy(dict(job))
        set_path(out, self.suspend_path, value)
        return out

    def suspend_patch(self, job: Mapping[str, Any], value: bool) -> dict[str, Any]:
        """The merge patch that suspends (``value`` True) or resumes a worker copy the way its kind allows: its
        suspend field (the lease watchdog and the fencer stop copies with it)."""
        out: dict[str, Any] = {self.suspend_path[-1]: value}
        for key in reversed(self.suspend_path[:-1]):
            out = {key: out}
        return out

    def prepare_for_worker(
        self, job: Mapping[str, Any], *, stamp: Mapping[str, str], managed_by: str | None
    ) -> dict[str, Any]:
        """A copy fit to create in a worker cluster: no server-set metadata, no status, labels stamped."""
        out = json_copy(dict(job))
        out.pop("status", None)
        out["apiVersion"] = self.api_version
        out["kind"] = self.name
        metadata = dict(as_map(out.get("metadata")))
        for key in SERVER_SET_METADATA:
            metadata.pop(key, None)
        annotations = dict(as_map(metadata.get("annotations")))
        annotations.pop(LAST_APPLIED, None)
        if annotations:
            metadata["annotations"] = annotations
        else:
            metadata.pop("annotations", None)
        metadata["labels"] = {**as_map(metadata.get("labels")), **stamp}
        out["metadata"] = metadata
        if not self.managed_by_path:
            pass  # no managedBy field: the worker's controller runs every copy
        elif managed_by is None:
            del_path(out, self.managed_by_path)
        else:
            set_path(out, self.managed_by_path, managed_by)
        self.strip_server_defaults(out)
        return out

    def update_for_worker(self, existing: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
        """The update that turns the worker's ``existing`` copy into ``desired`` (a newer
        ``prepare_for_worker`` result: suspend, resume, an edit) the way this kind allows.

        The worker's API server owns the copy's metadata (uid, resourceVersion, finalizers, owner
        references): it is kept, with the labels and annotations replaced by the desired ones. The
        spec is the desired one, except what the worker's API server generated and will not let
        change (:meth:`keep_worker_generated`; a batch Job's selector and labels).
        """
        out = {k: json_copy(v) for k, v in existing.items() if k != "status"}
        metadata = dict(as_map(existing.get("metadata")))
        wanted = as_map(desired.get("metadata"))
        for key in ("labels", "annotations"):
            if isinstance(wanted.get(key), Mapping):
                metadata[key] = dict(wanted[key])
            else:
                metadata.pop(key, None)
        out["metadata"] = metadata
        out["spec"] = json_copy(desired.get("spec"))
        self.keep_worker_generated(existing, out)
        return out

    def keep_worker_generated(self, existing: Mapping[str, Any], update: dict[str, Any]) -> None:
        """Copy into ``update`` what the worker's API server generated on ``existing`` and keeps immutable."""

    def strip_server_defaults(self, job: dict[str, Any]) -> None:
        """Remove fields the manager's API server generated that the worker's would refuse (batch Job)."""
