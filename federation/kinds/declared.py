"""Kinds from configuration: a job kind mkd has no module for, declared by an admin and run by its own operator.

Kueue's MultiKueue dispatches such kinds through its generic adapter (``multiKueue.externalFrameworks``, each
named ``Kind.version.group``): managedBy at ``spec.managedBy``, removed from the worker copy, and the worker
copy's whole ``status`` mirrored. Kueue leaves the Workload to an external integration controller; mkd makes it
itself, so a declaration also says where the kind keeps what mkd needs to queue it: its PodSets (paths to a pod
template and a replica count), its suspend switch, and when it has finished (True conditions of given types, or
a status field with given values). :func:`load` reads a declarations file (YAML, ``externalFrameworks: [...]``;
in Kubernetes a ConfigMap mounted as a file) and checks every declaration, each problem an
:class:`~federation.errors.Invalid` naming the field (``externalFrameworks[0].podSets[1].template``) and the fix;
:class:`DeclaredKind` is the resulting :class:`~federation.kinds.base.JobKind`, always ``run_by`` operator.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from federation import labels
from federation.errors import Invalid
from federation.kinds.base import (
    BaseKind,
    Finished,
    JobKind,
    as_map,
    dotted,
    get_path,
    int_or,
    podset_for,
    raise_first,
    true_condition,
    validate_bool,
    validate_count,
    validate_managed_by,
    validate_pod_template,
)
from federation.podset import PodSet

ROOT = "externalFrameworks"
"""The file's one key, Kueue's name for kinds handled by its generic MultiKueue adapter."""
MAX_PODSETS = 8
"""Kueue's ``jobframework.MaxPodSets``."""
DEFAULT_MANAGED_BY = "spec.managedBy"
DEFAULT_SUSPEND = "spec.suspend"
FIELDS = ("name", "plural", "controller", "managedByPath", "suspendPath", "podSets", "success", "failure")
PODSET_FIELDS = ("name", "template", "count", "defaultCount")
RULE_FIELDS = ("conditionTypes", "field", "values")

_KIND = re.compile(r"[A-Z][A-Za-z0-9]*")
_VERSION = re.compile(r"v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?")
_GROUP = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+")
_PLURAL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_STEP = re.compile(r"[A-Za-z0-9_$-]+")


def guess_plural(kind: str) -> str:
    """The plural Kubernetes guesses from a kind (``meta.UnsafeGuessKindToResource``), as a CRD usually names it."""
    lower = kind.lower()
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + "s"


@dataclass(frozen=True)
class PodSetPaths:
    """One declared PodSet: its name, where its pod template is, where its replica count is (None: always
    ``default_count``) and the count when that field is unset."""

    name: str
    template: tuple[str, ...]
    count: tuple[str, ...] | None
    default_count: int


@dataclass(frozen=True)
class FinishRule:
    """When a declared kind has succeeded (or failed): a True condition of one of ``condition_types``, or the
    status field at ``field`` holding one of ``values``."""

    condition_types: tuple[str, ...] = ()
    field: tuple[str, ...] = ()
    values: tuple[str, ...] = ()

    def matches(self, job: Mapping[str, Any]) -> tuple[str, str] | None:
        """(reason, message) when the rule holds, else None."""
        if self.condition_types:
            condition = true_condition(job, *self.condition_types)
            if condition is None:
                return None
            return str(condition.get("reason") or condition["type"]), str(condition.get("message") or "")
        value = get_path(job, self.field)
        return (str(value), "") if isinstance(value, str) and value in self.values else None


@dataclass(frozen=True)
class DeclaredKind(BaseKind):
    """A kind from configuration; see the module docstring."""

    pod_sets: tuple[PodSetPaths, ...] = ()
    success: FinishRule = FinishRule()
    failure: FinishRule = FinishRule()
    source: str = ""
    """Where it was declared (``kinds.yaml: externalFrameworks[0]``), for ``mkctl kinds``."""

    def validate(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[Invalid]:
        errors: list[Invalid] = []
        name = get_path(job, ("metadata", "name"))
        if not isinstance(name, str) or len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
            errors.append(Invalid("metadata.name", "is required" if not name else
                                  f"{name!r} is not a DNS-1123 subdomain (what a custom resource's name must be)",
                                  fix="use lower case letters, digits, '-' and '.', e.g. my-run-1"))
        errors += validate_managed_by(self, job)
        errors += validate_bool(job, self.suspend_path)
        for declared in self.pod_sets:
            count_field = dotted(declared.count) if declared.count else ""
            raw = get_path(job, declared.count) if declared.count else None
            count_errors = validate_count(raw, count_field, minimum=0) if declared.count else []
            errors += count_errors
            if not count_errors and self._count(job, declared) > 0:
                errors += validate_pod_template(get_path(job, declared.template), dotted(declared.template))
        return errors

    @staticmethod
    def _count(job: Mapping[str, Any], declared: PodSetPaths) -> int:
        if declared.count is None:
            return declared.default_count
        return int_or(get_path(job, declared.count), declared.default_count)

    def podsets(self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> list[PodSet]:
        """One PodSet per declared one, in declaration order; those counting no pods are left out."""
        raise_first(self.validate(job))
        out = []
        for declared in self.pod_sets:
            count = self._count(job, declared)
            if count > 0:
                template = as_map(get_path(job, declared.template))
                out.append(podset_for(declared.name, count, template, dotted(declared.template)))
        return out

    def finished(self, job: Mapping[str, Any]) -> Finished | None:
        """Failed when the failure rule holds, else Succeeded when the success rule does; with two condition
        rules the newest True condition of either decides, as for the built-in kinds."""
        if self.success.condition_types and self.failure.condition_types:
            condition = true_condition(job, *self.success.condition_types, *self.failure.condition_types)
            if condition is None:
                return None
            outcome: Literal["Succeeded", "Failed"] = (
                "Succeeded" if condition["type"] in self.success.condition_types else "Failed")
            return Finished(outcome, str(condition.get("reason") or condition["type"]),
                            str(condition.get("message") or ""))
        failed = self.failure.matches(job)
        if failed is not None:
            return Finished("Failed", *failed)
        succeeded = self.success.matches(job)
        return Finished("Succeeded", *succeeded) if succeeded is not None else None


# --- reading declarations ----------------------------------------------------------------------------


class Declarations:
    """Collects the problems of one file's declarations (every one, not only the first)."""

    def __init__(self) -> None:
        self.errors: list[Invalid] = []

    def fail(self, field: str, message: str, fix: str) -> None:
        self.errors.append(Invalid(field, message, fix=fix))

    def path(self, raw: Any, field: str, *, default: str | None = None) -> tuple[str, ...] | None:
        """A dotted field path (``spec.workers.template``): map keys only, none empty."""
        if raw is None and default is not None:
            raw = default
        if raw is None:
            self.fail(field, "is required", fix="write the dotted path of the field, e.g. spec.workers.template")
            return None
        if not isinstance(raw, str) or not raw:
            self.fail(field, f"{raw!r} is not a field path", fix="write a dotted path such as spec.suspend")
            return None
        steps = tuple(raw.split("."))
        if not all(_STEP.fullmatch(s) for s in steps):
            self.fail(field, f"{raw!r} is not a dotted path of map keys (no list indices, no empty steps)",
                      fix="write a path of field names such as spec.workers.template")
            return None
        return steps

    def unknown(self, raw: Mapping[str, Any], known: Sequence[str], field: str) -> None:
        for key in raw:
            if key not in known:
                self.fail(f"{field}.{key}" if field else str(key), "is not a field of a declaration here",
                          fix=f"use only {', '.join(known)} (exact case)")

    def strings(self, raw: Any, field: str, what: str) -> tuple[str, ...]:
        if not isinstance(raw, list) or not raw or not all(isinstance(v, str) and v for v in raw):
            self.fail(field, "must be a non-empty list of strings", fix=f"list the {what}, e.g. [{what.split()[0]}]")
            return ()
        return tuple(raw)


def _rule(d: Declarations, raw: Any, field: str, example: str) -> FinishRule:
    if not isinstance(raw, Mapping):
        d.fail(field, "is required" if raw is None else "must be a map",
               fix=f"write {field.rsplit('.', 1)[-1]}: {{conditionTypes: [{example}]}} or "
                   f"{{field: status.phase, values: [{example}]}}")
        return FinishRule()
    d.unknown(raw, RULE_FIELDS, field)
    has_conditions, has_field = "conditionTypes" in raw, "field" in raw
    if has_conditions == has_field:
        d.fail(field, "must give either conditionTypes or field (with values), not both" if has_conditions
               else "gives neither conditionTypes nor field",
               fix=f"write conditionTypes: [{example}] or field: status.phase with values: [{example}]")
        return FinishRule()
    if has_conditions:
        if "values" in raw:
            d.fail(f"{field}.values", "goes with field, not with conditionTypes", fix="remove values")
        return FinishRule(condition_types=d.strings(raw["conditionTypes"], f"{field}.conditionTypes",
                                                    f"{example} condition types"))
    path = d.path(raw["field"], f"{field}.field")
    values = d.strings(raw.get("values"), f"{field}.values", f"{example} values")
    return FinishRule(field=path or (), values=values)


def _pod_sets(d: Declarations, raw: Any, field: str) -> tuple[PodSetPaths, ...]:
    if not isinstance(raw, list) or not raw:
        d.fail(field, "must list at least one PodSet",
               fix="add podSets: [{name: workers, template: spec.workers.template, count: spec.workers.replicas}]")
        return ()
    if len(raw) > MAX_PODSETS:
        d.fail(field, f"lists {len(raw)} PodSets; at most {MAX_PODSETS} are supported (as in Kueue)",
               fix="declare fewer PodSets")
    out: list[PodSetPaths] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        here = f"{field}[{index}]"
        if not isinstance(item, Mapping):
            d.fail(here, "must be a map", fix="write {name: ..., template: ..., count: ...}")
            continue
        d.unknown(item, PODSET_FIELDS, here)
        name = item.get("name")
        if not isinstance(name, str) or len(name) > 63 or not _LABEL.fullmatch(name):
            d.fail(f"{here}.name", "is required" if name is None else f"{name!r} is not a DNS-1123 label",
                   fix="name it with lower-case letters, digits and '-', after the key holding its template "
                       "(e.g. workers)")
            name = None
        elif name in seen:
            d.fail(f"{here}.name", f"{name!r} is declared twice", fix="give each PodSet its own name")
        template = d.path(item.get("template"), f"{here}.template")
        count = d.path(item["count"], f"{here}.count") if item.get("count") is not None else None
        default = item.get("defaultCount", 1)
        if isinstance(default, bool) or not isinstance(default, int) or default < 0:
            d.fail(f"{here}.defaultCount", f"{default!r} is not an integer >= 0",
                   fix="write the pods the PodSet runs when its count field is unset, e.g. 1")
            default = 1
        if name is not None and template is not None:
            seen.add(name)
            out.append(PodSetPaths(name, template, count, default))
    return tuple(out)


def declare(raw: Any, field: str, d: Declarations) -> DeclaredKind | None:
    """One declaration (a map of :data:`FIELDS`), or None when it has problems (recorded in ``d``)."""
    if not isinstance(raw, Mapping):
        d.fail(field, "must be a map", fix="write {name: Kind.version.group, podSets: [...], success: ..., "
                                           "failure: ...}")
        return None
    before = len(d.errors)
    d.unknown(raw, FIELDS, field)
    name = raw.get("name")
    kind = version = group = ""
    parts = name.split(".", 2) if isinstance(name, str) else []
    if len(parts) == 3:
        kind, version, group = parts
    if not (_KIND.fullmatch(kind) and _VERSION.fullmatch(version) and _GROUP.fullmatch(group)):
        d.fail(f"{field}.name", "is required" if name is None else f"{name!r} is not Kind.version.group",
               fix="write the kind, its API version and its API group as Kueue names them, "
                   "e.g. TrainingRun.v1.example.com (a custom resource: its group has a dot)")
    plural = raw.get("plural", guess_plural(kind) if kind else None)
    if not isinstance(plural, str) or len(plural) > 63 or not _PLURAL.fullmatch(plural):
        d.fail(f"{field}.plural", f"{plural!r} is not a resource name",
               fix="write the plural of the kind's CRD (spec.names.plural), e.g. trainingruns")
    controller = raw.get("controller", f"the {kind or 'kind'}'s operator")
    if not isinstance(controller, str) or not controller or controller == labels.MULTIKUEUE:
        d.fail(f"{field}.controller", f"{controller!r} cannot be the kind's own controller",
               fix=f"write the managedBy value of the kind's own operator (never {labels.MULTIKUEUE}), or leave "
                   "it out")
    managed_by = d.path(raw.get("managedByPath"), f"{field}.managedByPath", default=DEFAULT_MANAGED_BY)
    suspend = d.path(raw.get("suspendPath"), f"{field}.suspendPath", default=DEFAULT_SUSPEND)
    if managed_by is not None and managed_by == suspend:
        d.fail(f"{field}.suspendPath", "is the managedBy path", fix="write the path of the kind's boolean suspend "
                                                                    "field, e.g. spec.suspend")
    pod_sets = _pod_sets(d, raw.get("podSets"), f"{field}.podSets")
    success = _rule(d, raw.get("success"), f"{field}.success", "Succeeded")
    failure = _rule(d, raw.get("failure"), f"{field}.failure", "Failed")
    if len(d.errors) > before or managed_by is None or suspend is None or not isinstance(plural, str):
        return None
    return DeclaredKind(name=kind, group=group, version=version, plural=plural, controller=str(controller),
                        managed_by_path=managed_by, suspend_path=suspend, run_by="operator", pod_sets=pod_sets,
                        success=success, failure=failure, source=field)


class DeclarationsInvalid(Invalid):
    """Every problem of a declarations file; the message lists them all, the first one's field leads."""

    def __init__(self, source: str, errors: Sequence[Invalid]) -> None:
        first = errors[0]
        super().__init__(first.field, "; ".join(str(e) for e in errors), fix="")
        self.source = source
        self.errors = list(errors)
        self.message = f"{source}: " + "; ".join(str(e) for e in errors)

    def __str__(self) -> str:
        return self.message


def parse(doc: Any, source: str, builtin: Sequence[JobKind]) -> tuple[DeclaredKind, ...]:
    """The kinds a declarations document declares; raises :class:`DeclarationsInvalid` listing every problem.

    ``builtin``: the kinds mkd knows already; a declaration may not take one's name or apiVersion and kind."""
    d = Declarations()
    if doc is None:
        return ()
    if not isinstance(doc, Mapping):
        raise DeclarationsInvalid(source, [Invalid(ROOT, "the file must be a map with one key",
                                                   fix=f"write {ROOT}: [...]")])
    d.unknown(doc, (ROOT,), "")
    items = doc.get(ROOT)
    if items is None:
        items = []
    if not isinstance(items, list):
        d.fail(ROOT, "must be a list of declarations", fix=f"write {ROOT}: [{{name: Kind.version.group, ...}}]")
        items = []
    taken = {k.name: f"mkd's built-in {k.name} ({k.api_version})" for k in builtin}
    apis = {(k.api_version, k.name) for k in builtin}
    out: list[DeclaredKind] = []
    for index, raw in enumerate(items):
        field = f"{ROOT}[{index}]"
        kind = declare(raw, field, d)
        if kind is None:
            continue
        if kind.name in taken or (kind.api_version, kind.name) in apis:
            d.fail(f"{field}.name", f"{kind.name} is already {taken.get(kind.name) or 'declared'}",
                   fix="declare each kind once, and only kinds mkd has no module for (mkctl kinds lists them)")
            continue
        taken[kind.name] = f"declared at {field}"
        out.append(kind)
    if d.errors:
        raise DeclarationsInvalid(source, d.errors)
    return tuple(out)


def load(path: Path, builtin: Sequence[JobKind]) -> tuple[DeclaredKind, ...]:
    """The kinds declared in the YAML file at ``path`` (:func:`parse`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DeclarationsInvalid(str(path), [Invalid("file", f"cannot be read ({exc.strerror or exc})",
                                                      fix="mount the ConfigMap holding it, or fix the path")]) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DeclarationsInvalid(str(path), [Invalid("file", f"is not valid YAML{where}",
                                                      fix="fix the YAML syntax")]) from None
    return parse(doc, str(path), builtin)
