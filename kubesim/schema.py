"""Structural-schema handling of custom resources: pruning, defaulting and OpenAPI validation.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any

import orjson

from kubesim import builtin_fields
from kubesim.errors import ApiError, invalid, options_invalid, too_long, too_many
from kubesim.records import json_copy
from kubesim.resources import ResourceType

log = logging.getLogger("kubesim.schema")

Schema = dict[str, Any]
Cause = dict[str, str]

FIELD_VALIDATION = ("Ignore", "Warn", "Strict")


@dataclass
class RequestScope:
    """Per-request options the store's pipeline reads, and the warnings it leaves for the response."""

    field_validation: str = "Warn"
    method: str = "POST"
    warnings: list[str] = field(default_factory=list)
    patch_type: str = ""  # PATCH: "json" | "merge" | "strategic" | "apply"
    patch: Any = None  # PATCH: the parsed patch body
    manager: str = ""  # the field manager of a write (fieldManager, else the User-Agent's product)


_SCOPE: ContextVar[RequestScope | None] = ContextVar("kubesim_request_scope", default=None)


class request_scope:  # named as the function it replaced: ``with request_scope(...) as scope``
    """Set for the duration of one API request; in-process writers (controllers) run without one.
    (A class rather than a generator context manager: it is entered on every request.)"""

    __slots__ = ("scope", "token")

    def __init__(self, field_validation: str | None, method: str = "POST") -> None:
        directive = field_validation or "Warn"
        options = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions"}.get(method)
        if directive not in FIELD_VALIDATION:
            if options is None:
                directive = "Warn"  # only writes parse the parameter
            else:  # meta/v1 validation ValidateFieldValidation, in the handler's options check
                raise options_invalid(options, [{
                    "reason": "FieldValueNotSupported", "field": "fieldValidation",
                    "message": f"Unsupported value: {orjson.dumps(directive).decode()}: supported values: "
                               '"", "Ignore", "Strict", "Warn"'}])
        self.scope = RequestScope(directive, method)
        self.token: Token[RequestScope | None] | None = None

    def __enter__(self) -> RequestScope:
        self.token = _SCOPE.set(self.scope)
        return self.scope

    def __exit__(self, *exc: object) -> None:
        assert self.token is not None
        _SCOPE.reset(self.token)


def outside_request(fn: Callable[..., None], *args: Any) -> None:
    """Call ``fn`` as kubesim's own controllers run: with no request scope. The simulation is told of
    commits while a request is served, and what it schedules then would otherwise inherit (asyncio copies
    the context) the scope of a request that has long been answered."""
    token = _SCOPE.set(None)
    try:
        fn(*args)
    finally:
        _SCOPE.reset(token)


def current_scope() -> RequestScope | None:
    return _SCOPE.get()


# ---------------------------------------------------------------------------------------- entry point

# customresource strategy's hasBlockingErr: after these the CRD's rules are not run.
BLOCKING = ("FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany",
            "FieldValueTypeInvalid")
NOT_CHECKED = {"reason": "FieldValueInvalid", "field": "<nil>", "message": "Invalid value: null: some validation "
               "rules were not checked because the object was invalid; correct the existing errors to complete "
               "validation"}

RuleCauses = Callable[[dict[str, Any], "dict[str, Any] | None"], "list[Cause] | None"]


def admit(rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, rules: RuleCauses | None = None) -> None:
    """Prune, default and validate a custom resource in place (the store's single hook; built-in kinds
    pass through). Raises 400 (Strict unknown fields) or 422 Invalid; records Warn-mode warnings on the
    request scope. The schema is the one of the object's served version (conversion is None). When the schema
    refuses the object, ``rules`` (the CRD's rule causes, None without rules) joins the same 422, as the
    strategy's Validate does; an object the schema accepts meets its rules in admission.

    What a real apiextensions-apiserver does with a CRD version's ``openAPIV3Schema`` for every create,
    update, patch and apply of a custom resource (and its ``/status``), in the real order:

    1. **prune** unknown fields (kept under ``x-kubernetes-preserve-unknown-fields``; ``apiVersion``,
       ``kind`` and ``metadata`` at the root and in ``x-kubernetes-embedded-resource`` objects) and
       non-nullable ``null`` values; the pruned paths are what ``fieldValidation`` reports:
       ``Strict`` -> 400 ``<Kind> in version "v1" cannot be handled as a <Kind>: strict decoding error:
       unknown field "spec.foo"`` (a patch: 422 at ``patch``), ``Warn`` (the server's default) -> a ``Warning: 299`` header per field,
       ``Ignore`` -> nothing. Built-in kinds only get this step (kubesim.builtin_fields: typed decoding);
    2. **default** missing properties from ``default`` (recursively, defaults are themselves defaulted);
    3. **validate** like k8s.io/kube-openapi's SchemaValidator, with its messages
       (``spec.replicas in body should be greater than or equal to 0``), turned into field errors the way
       apiextensions-apiserver's ``kubeOpenAPIResultToFieldErrors`` does. Field paths are kube-openapi's:
       properties and map keys joined with ``.`` (``spec.pytorchReplicaSpecs.Worker.replicas``), list
       items as ``[i]``. (CEL ``x-kubernetes-validations`` errors use ``[key]`` for map keys; those are
       not this module's.) On updates, errors in unchanged correlatable parts are ratcheted away
       (CRDValidationRatcheting, GA): object properties, map values and ``listType=map`` items by key.

    The request's ``fieldValidation`` directive and the warnings it produces travel in a ContextVar that
    the HTTP layer sets per request (:func:`request_scope`), so the store's signatures stay unchanged.
    Upstream: staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/{pruning,defaulting},
    pkg/apiserver/validation/validation.go and kube-openapi pkg/validation/{validate,errors}.
    """
    scope = _SCOPE.get()
    if rt.builtin:
        # Typed decoding drops what the kind does not have (API requests only: kubesim's own controllers
        # write through the store directly and are not clients).
        if scope is not None:
            before = _strict_patch_value(obj, scope)
            _report_unknown(rt, obj, builtin_fields.unknown_fields(rt, obj), scope, before)
        return
    if not rt.schemas:
        return
    av = obj.get("apiVersion") or ""
    schema = rt.schemas.get(av.rpartition("/")[2]) or rt.schemas.get(rt.storage_version)
    if schema is None:
        return
    kind, group = rt.kind, rt.group
    unknown: list[str] = []
    before = _strict_patch_value(obj, scope)
    prune_root(obj, schema, unknown)
    if scope is not None:
        _report_unknown(rt, obj, unknown, scope, before)
    apply_defaults(obj, schema)
    causes = validate(obj, schema, old)
    if causes:
        if rules is not None:
            if any(c["reason"] in BLOCKING for c in causes):
                if rules(obj, old) is not None:
                    causes.append(dict(NOT_CHECKED))
            else:
                causes += rules(obj, old) or []
        raise invalid(kind, group, (obj.get("metadata") or {}).get("name", ""), causes)


def decode(rt: ResourceType, obj: dict[str, Any]) -> None:
    """What a real server does to a custom resource while decoding the request, before admission: prune
    unknown fields (reported per fieldValidation) and apply the schema's defaults. Mutating webhooks see
    the result; :func:`admit` prunes and defaults again afterwards (what a webhook added) and validates."""
    if rt.builtin or not rt.schemas:
        return
    av = obj.get("apiVersion") or ""
    schema = rt.schemas.get(av.rpartition("/")[2]) or rt.schemas.get(rt.storage_version)
    if schema is None:
        return
    unknown: list[str] = []
    scope = _SCOPE.get()
    before = _strict_patch_value(obj, scope)
    prune_root(obj, schema, unknown)
    if scope is not None:
        _report_unknown(rt, obj, unknown, scope, before)
    apply_defaults(obj, schema)


def _go_print(v: Any) -> str:
    """Go's ``%+v`` of a decoded JSON value (maps print with sorted keys, as fmt does)."""
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_go_print(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, list):
        return "[" + " ".join(_go_print(x) for x in v) + "]"
    if v is None:
        return "<nil>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return go_float(float(v)) if not isinstance(v, int) or abs(v) < 2 ** 53 else str(v)
    return str(v)


def _strict_patch_value(obj: dict[str, Any], scope: RequestScope | None) -> str | None:
    """The bad value of a Strict patch's 422 (apiserver endpoints/handlers/patch.go), taken before unknown
    fields are dropped: the patched object as the JSON/merge patcher re-encodes it (sorted keys), or the
    strategic patcher's ``%+v`` of the patch."""
    if scope is None or scope.method != "PATCH" or scope.field_validation != "Strict":
        return None
    if scope.patch_type in ("json", "merge"):
        return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()
    if scope.patch_type == "strategic":
        return _go_print(scope.patch)
    return None


def _report_unknown(rt: ResourceType, obj: dict[str, Any], unknown: list[str], scope: RequestScope,
                    patched: str | None = None) -> None:
    """fieldValidation: Strict refuses (400 for a request body the decoder refuses, 422 at ``patch`` for a
    patched object), Warn warns, Ignore is silent."""
    if not unknown:
        return
    log.info("kubesim: %s %s with unknown field(s) %s (fieldValidation=%s)", scope.method, rt.kind,
             ", ".join(unknown), scope.field_validation)
    if scope.field_validation == "Strict":
        text = "strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in unknown)
        if patched is not None:  # errors.NewInvalid(schema.GroupKind{}, "", field.Invalid("patch", ...))
            raise invalid("", "", "", [{"reason": "FieldValueInvalid", "field": "patch",
                                        "message": f"Invalid value: {orjson.dumps(patched).decode()}: {text}"}])
        if scope.method in ("POST", "PUT"):  # a decode failure of the request body (transformDecodeError)
            version = (obj.get("apiVersion") or rt.api_version()).rpartition("/")[2]
            text = f'{rt.kind} in version "{version}" cannot be handled as a {rt.kind}: {text}'
        raise ApiError(400, "BadRequest", text)
    if scope.field_validation == "Warn":
        scope.warnings.extend(f'unknown field "{p}"' for p in unknown)


# ---------------------------------------------------------------------------------------- pruning

_ROOT_KEEP = ("apiVersion", "kind", "metadata")


def prune_root(obj: dict[str, Any], schema: Schema, unknown: list[str]) -> None:
    _prune_object(obj, schema, "", unknown, root=True)


def _preserves(s: Schema) -> bool:
    return bool(s.get("x-kubernetes-preserve-unknown-fields"))


def _prune(value: Any, s: Schema | None, path: str, unknown: list[str]) -> None:
    if s is None:
        return
    if isinstance(value, dict):
        _prune_object(value, s, path, unknown, embedded=bool(s.get("x-kubernetes-embedded-resource")))
    elif isinstance(value, list):
        items = s.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                _prune(item, items, f"{path}[{i}]", unknown)
    # x-kubernetes-int-or-string / scalars: nothing to prune


def _prune_object(obj: dict[str, Any], s: Schema, path: str, unknown: list[str], root: bool = False,
                  embedded: bool = False) -> None:
    props: dict[str, Schema] = s.get("properties") or {}
    addl = s.get("additionalProperties")
    preserve = _preserves(s)
    for k in list(obj):
        v = obj[k]
        child = f"{path}.{k}" if path else k
        if (root or embedded) and k in _ROOT_KEEP:
            if k == "metadata" and isinstance(v, dict):
                if embedded:
                    _prune_embedded_metadata(v)
                else:  # ObjectMeta is decoded typed: fields it does not have are dropped (and reported)
                    for mk in [mk for mk in v if mk not in META_FIELDS]:
                        del v[mk]
                        unknown.append(f"metadata.{mk}")
            continue
        ps = props.get(k)
        if ps is None and isinstance(addl, dict):
            ps = addl
        if ps is None:
            if not preserve and addl is not True:
                del obj[k]
                unknown.append(child)
            continue
        if v is None and not ps.get("nullable"):
            # Non-nullable nulls are dropped before defaulting (a default then applies).
            del obj[k]
            continue
        _prune(v, ps, child, unknown)


META_FIELDS = frozenset({"name", "generateName", "namespace", "labels", "annotations", "finalizers",
                         "ownerReferences", "uid", "resourceVersion", "generation", "creationTimestamp",
                         "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"})


def _prune_embedded_metadata(meta: dict[str, Any]) -> None:
    # Embedded ObjectMeta keeps only name/generateName/namespace/labels/annotations/ownerReferences/finalizers.
    for k in list(meta):
        if k not in ("name", "generateName", "namespace", "labels", "annotations", "ownerReferences",
                     "finalizers"):
            del meta[k]


# ---------------------------------------------------------------------------------------- defaulting

def apply_defaults(value: Any, s: Schema | None) -> None:
    if s is None:
        return
    if isinstance(value, dict):
        props: dict[str, Schema] = s.get("properties") or {}
        for k, ps in props.items():
            if "default" in ps and (k not in value or (value[k] is None and not ps.get("nullable"))):
                value[k] = json_copy(ps["default"])
        addl = s.get("additionalProperties")
        for k, v in value.items():
            child: Schema | None = props.get(k)
            if child is None and isinstance(addl, dict):
                child = addl
            if child is not None and isinstance(v, (dict, list)):
                apply_defaults(v, child)
    elif isinstance(value, list):
        items = s.get("items")
        if isinstance(items, dict):
            for item in value:
                if isinstance(item, (dict, list)):
                    apply_defaults(item, items)


# ---------------------------------------------------------------------------------------- validation

_MISSING = object()
_PATTERNS: dict[str, re.Pattern[str]] = {}


def go_value(v: Any) -> str:
    """How field.Error prints a bad value: %v for numbers and bools, %q for strings, JSON otherwise."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_float(v)
    if isinstance(v, str):
        return orjson.dumps(v).decode()
    if v is None:
        return '"null"'
    return orjson.dumps(v).decode()


def go_float(f: float) -> str:
    """Go's %v for a float64 (shortest repr, exponent form from 1e21 or below 1e-4)."""
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == int(f) and abs(f) < 1e21:
        return str(int(f))
    r = repr(f)
    if "e" in r:
        mant, _, exp = r.partition("e")
        sign = "-" if exp.startswith("-") else "+"
        return f"{mant}e{sign}{exp.lstrip('+-').zfill(2)}"
    return r


def _type_of(v: Any) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null"


def _c(reason: str, path: str, message: str) -> Cause:
    return {"reason": reason, "message": message, "field": path}


def _invalid(path: str, value: Any, detail: str) -> Cause:
    return _c("FieldValueInvalid", path, f"Invalid value: {go_value(value)}: {detail}")


def validate(obj: dict[str, Any], schema: Schema, old: dict[str, Any] | None = None) -> list[Cause]:
    """kube-openapi validation of ``obj`` (with ratcheting against ``old`` on updates) as field causes."""
    out: list[Cause] = []
    _validate(obj, schema, "", out, old if old is not None else _MISSING, root=True)
    return out


def _type_ok(v: Any, s: Schema) -> tuple[bool, str]:
    """Whether ``v`` fits the schema's type; the expected type name for the message."""
    if s.get("x-kubernetes-int-or-string"):
        return (isinstance(v, (int, str)) and not isinstance(v, bool)), "integer,string"
    t = s.get("type")
    if not t:
        return True, ""
    actual = _type_of(v)
    if actual == t:
        return True, t
    if t == "number" and actual == "integer":
        return True, t
    if t == "integer" and actual == "number" and float(v).is_integer():
        return True, t
    return False, t


def _validate(v: Any, s: Schema, path: str, out: list[Cause], old: Any, root: bool = False) -> None:
    if old is not _MISSING and old == v:
        return  # ratcheting: an unchanged correlatable value keeps whatever it had
    name = path or "."
    if v is None:
        if s.get("nullable") or (not s.get("type") and not s.get("x-kubernetes-int-or-string")):
            return
        ok, want = _type_ok(v, s)
        out.append(_c("FieldValueTypeInvalid", path,
                      f'Invalid value: "null": {name} in body must be of type {want}: "null"'))
        return
    ok, want = _type_ok(v, s)
    if not ok:
        actual = _type_of(v)
        out.append(_c("FieldValueTypeInvalid", path,
                      f'Invalid value: "{actual}": {name} in body must be of type {want}: "{actual}"'))
        return
    for sub in ("allOf", "anyOf", "oneOf"):
        if sub in s:
            _combinators(v, s, sub, path, out)
    if "not" in s and isinstance(s["not"], dict):
        probe: list[Cause] = []
        _validate(v, s["not"], path, probe, _MISSING)
        if not probe:
            out.append(_invalid(path, v, f"{name} in body must not validate the schema (not)"))
    if isinstance(v, str):
        _string(v, s, path, name, out)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        _number(v, s, path, name, out)
    enum = s.get("enum")
    if enum is not None and v not in enum:
        shown = [e if isinstance(e, str) else orjson.dumps(e).decode() for e in enum]
        out.append(_c("FieldValueNotSupported", path, f"Unsupported value: {go_value(v)}: supported values: "
                      + ", ".join(orjson.dumps(x).decode() for x in shown)))
    if isinstance(v, list):
        _array(v, s, path, name, out, old)
    elif isinstance(v, dict):
        _object(v, s, path, name, out, old, root)


def _combinators(v: Any, s: Schema, sub: str, path: str, out: list[Cause]) -> None:
    branches = [b for b in s[sub] if isinstance(b, dict)]
    results = []
    for b in branches:
        probe: list[Cause] = []
        _validate(v, b, path, probe, _MISSING)
        results.append(probe)
    name = path or "."
    if sub == "allOf":
        for probe in results:
            out.extend(probe)
    elif sub == "anyOf" and branches and all(results):
        out.append(_invalid(path, v, f'"{name}" must validate at least one schema (anyOf)'))
        out.extend(results[0])
    elif sub == "oneOf" and branches and sum(1 for r in results if not r) != 1:
        out.append(_invalid(path, v, f'"{name}" must validate one and only one schema (oneOf)'))


_FORMATS: dict[str, re.Pattern[str]] = {
    "date-time": re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"),
    "date": re.compile(r"^\d{4}-\d{2}-\d{2}$"),
    "uuid": re.compile(r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"),
    "byte": re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"),
    "ipv4": re.compile(r"^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$"),
    "hostname": re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}"
                           r"[A-Za-z0-9])?)*$"),
}


_INLINE_FLAGS = re.compile(r"\(\?([imsU]+)\)")


def go_pattern(pat: str) -> str:
    """A Go (RE2) pattern as Python's ``re`` reads it: RE2 takes inline flags anywhere (Kueue's
    AdmissionCheck ``parameters.kind`` is ``^(?i)[a-z]...``), Python only at the start, so a flag group met later
    applies as a scoped group to the rest of the pattern, which is what it means in RE2."""
    m = _INLINE_FLAGS.search(pat)
    if m is None or m.start() == 0:
        return pat
    flags = m.group(1).replace("U", "")
    rest = go_pattern(pat[m.end():])
    return pat[:m.start()] + (f"(?{flags}:{rest})" if flags else rest)


def _string(v: str, s: Schema, path: str, name: str, out: list[Cause]) -> None:
    # kube-openapi's string validator stops at the first of maxLength, minLength, pattern that fails.
    if "maxLength" in s and len(v) > int(s["maxLength"]):
        out.append(too_long(path, int(s["maxLength"])))
    elif "minLength" in s and len(v) < int(s["minLength"]):
        out.append(_invalid(path, v, f"{name} in body should be at least {int(s['minLength'])} chars long"))
    elif pat := s.get("pattern"):
        rx = _PATTERNS.get(pat)
        if rx is None:
            rx = _PATTERNS[pat] = re.compile(go_pattern(pat))
        if not rx.search(v):
            out.append(_invalid(path, v, f"{name} in body should match '{pat}'"))
    fmt = s.get("format")
    if fmt and fmt in _FORMATS and not _FORMATS[fmt].match(v):
        out.append(_invalid(path, v, f"{name} in body must be of type {fmt}: {orjson.dumps(v).decode()}"))


def _number(v: float, s: Schema, path: str, name: str, out: list[Cause]) -> None:
    def shown(bound: Any) -> str:
        return str(int(bound)) if isinstance(v, int) and float(bound).is_integer() else go_float(float(bound))

    if "maximum" in s:
        mx = s["maximum"]
        if s.get("exclusiveMaximum") and v >= mx:
            out.append(_invalid(path, v, f"{name} in body should be less than {shown(mx)}"))
        elif v > mx:
            out.append(_invalid(path, v, f"{name} in body should be less than or equal to {shown(mx)}"))
    if "minimum" in s:
        mn = s["minimum"]
        if s.get("exclusiveMinimum") and v <= mn:
            out.append(_invalid(path, v, f"{name} in body should be greater than {shown(mn)}"))
        elif v < mn:
            out.append(_invalid(path, v, f"{name} in body should be greater than or equal to {shown(mn)}"))
    mo = s.get("multipleOf")
    if mo and (v / mo) != int(v / mo):
        out.append(_invalid(path, v, f"{name} in body should be a multiple of {shown(mo)}"))


def _list_key(item: Any, keys: list[str]) -> Any:
    return tuple(orjson.dumps(item.get(k)) for k in keys) if isinstance(item, dict) else None


def _array(v: list[Any], s: Schema, path: str, name: str, out: list[Cause], old: Any) -> None:
    if "maxItems" in s and len(v) > int(s["maxItems"]):
        out.append(too_many(path, len(v), int(s["maxItems"])))
    if "minItems" in s and len(v) < int(s["minItems"]):
        out.append(_invalid(path, len(v), f"{name} in body should have at least {int(s['minItems'])} items"))
    list_type = s.get("x-kubernetes-list-type")
    if s.get("uniqueItems") or list_type == "set":
        seen: set[bytes] = set()
        for i, item in enumerate(v):
            key = orjson.dumps(item, option=orjson.OPT_SORT_KEYS)
            if key in seen:
                out.append(_c("FieldValueDuplicate", f"{path}[{i}]", f"Duplicate value: {go_value(item)}"))
            seen.add(key)
    old_by_key: dict[Any, Any] = {}
    keys = s.get("x-kubernetes-list-map-keys") or []
    if list_type == "map" and keys:
        seen_keys: set[Any] = set()
        for i, item in enumerate(v):
            k = _list_key(item, keys)
            if k in seen_keys:
                shown = {kk: item.get(kk) for kk in keys} if isinstance(item, dict) else item
                out.append(_c("FieldValueDuplicate", f"{path}[{i}]", f"Duplicate value: {go_value(shown)}"))
            seen_keys.add(k)
        if isinstance(old, list):
            old_by_key = {_list_key(o, keys): o for o in old}
    items = s.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(v):
            o = old_by_key.get(_list_key(item, keys), _MISSING) if old_by_key else _MISSING
            _validate(item, items, f"{path}[{i}]", out, o)


def _object(v: dict[str, Any], s: Schema, path: str, name: str, out: list[Cause], old: Any, root: bool) -> None:
    props: dict[str, Schema] = s.get("properties") or {}
    addl = s.get("additionalProperties")
    if "maxProperties" in s and len(v) > int(s["maxProperties"]):
        out.append(too_many(path, len(v), int(s["maxProperties"])))
    if "minProperties" in s and len(v) < int(s["minProperties"]):
        out.append(_invalid(path, len(v), f"{name} in body should have at least {int(s['minProperties'])} "
                            "properties"))
    for k in s.get("required") or ():
        if k not in v:
            out.append(_c("FieldValueRequired", f"{path}.{k}" if path else k, "Required value"))
    old_map = old if isinstance(old, dict) else None
    for k, item in v.items():
        if root and k == "metadata":
            continue  # ObjectMeta is validated by the generic metadata rules, not by the schema
        ps = props.get(k)
        if ps is None and isinstance(addl, dict):
            ps = addl
        if ps is None:
            if addl is False:
                out.append(_c("FieldValueForbidden", path, f"Forbidden: {name}.{k} in body is a forbidden "
                              "property"))
            continue
        o = old_map.get(k, _MISSING) if old_map is not None else _MISSING
        _validate(item, ps, f"{path}.{k}" if path else k, out, o)
