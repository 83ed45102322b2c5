"""CEL for kubesim: CRD ``x-kubernetes-validations`` and the expressions of admission policies.

Expressions are compiled and run by ``cel-expr-python`` (Google's CEL runtime, the C++ implementation behind a
Python binding) with its strings and optional-types extensions, plus the parts of the Kubernetes CEL libraries
that mkd's and the upstream Kubeflow/JobSet CRDs use or may use: the list library (``isSorted``, ``sum``,
``min``, ``max``, ``indexOf``, ``lastIndexOf``) and the regex library (``find``, ``findAll``), and
``cel.bind``. Variables are dynamically typed (no schema-typed checking at compile time), so a misspelt field
is a runtime ``no such key`` instead of a compile error; README lists the other gaps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cel_expr_python import cel as _cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from kubesim.schema import go_value

T = _cel.Type

CRD_VARS = ("self", "oldSelf")
# optionalOldSelf rules: oldSelf is rebound to an optional built from these (see _optional_rule).
OPTIONAL_VARS = ("self", "oldSelf", "kubesimOld", "kubesimHasOld")
ADMISSION_VARS = ("object", "oldObject", "request", "params", "namespaceObject", "variables", "authorizer")
# The real server caps an evaluated messageExpression at 5 KiB.
MAX_MESSAGE = 5 * 1024


class CompileError(Exception):
    """The expression does not parse or names an unknown function; the text reads like cel-go's."""


class EvalError(Exception):
    """A runtime error (no such key, no such overload, ...), worded like cel-go's where they differ."""


# ------------------------------------------------------------------ Kubernetes library functions


def _items(lst: Any) -> list[Any]:
    return list(lst)


def _is_sorted(lst: Any) -> bool:
    v = _items(lst)
    return all(v[i] <= v[i + 1] for i in range(len(v) - 1))


def _sum(lst: Any) -> Any:
    v = _items(lst)
    return sum(v[1:], v[0]) if v else 0


def _min(lst: Any) -> Any:
    v = _items(lst)
    if not v:
        raise ValueError("min(list) called on an empty list")
    return min(v)


def _max(lst: Any) -> Any:
    v = _items(lst)
    if not v:
        raise ValueError("max(list) called on an empty list")
    return max(v)


def _index_of(lst: Any, x: Any) -> int:
    v = _items(lst)
    return v.index(x) if x in v else -1


def _last_index_of(lst: Any, x: Any) -> int:
    v = _items(lst)
    return len(v) - 1 - v[::-1].index(x) if x in v else -1


def _find(s: str, pattern: str) -> str:
    m = re.search(pattern, s)
    return m.group(0) if m else ""


def _find_all(s: str, pattern: str) -> list[str]:
    return [m.group(0) for m in re.finditer(pattern, s)]


def _find_all_n(s: str, pattern: str, n: int) -> list[str]:
    out = _find_all(s, pattern)
    return out if n < 0 else out[:n]


def _k8s_extension() -> Any:
    lst = T.List(T.DYN)

    def member(name: str, oid: str, ret: Any, params: list[Any], impl: Any) -> Any:
        return _cel.FunctionDecl(name, [_cel.Overload(oid, ret, params, is_member=True, impl=impl)])

    return _cel.CelExtension("kubernetes", [
        member("isSorted", "k8s_list_is_sorted", T.BOOL, [lst], _is_sorted),
        member("sum", "k8s_list_sum", T.DYN, [lst], _sum),
        member("min", "k8s_list_min", T.DYN, [lst], _min),
        member("max", "k8s_list_max", T.DYN, [lst], _max),
        member("indexOf", "k8s_list_index_of", T.INT, [lst, T.DYN], _index_of),
        member("lastIndexOf", "k8s_list_last_index_of", T.INT, [lst, T.DYN], _last_index_of),
        member("find", "k8s_string_find", T.STRING, [T.STRING, T.STRING], _find),
        _cel.FunctionDecl("findAll", [
            _cel.Overload("k8s_string_find_all", T.List(T.STRING), [T.STRING, T.STRING], is_member=True,
                          impl=_find_all),
            _cel.Overload("k8s_string_find_all_n", T.List(T.STRING), [T.STRING, T.STRING, T.INT], is_member=True,
                          impl=_find_all_n)]),
    ])


_ENVS: dict[tuple[str, ...], Any] = {}


def _env(names: tuple[str, ...]) -> Any:
    env = _ENVS.get(names)
    if env is None:
        env = _ENVS[names] = _cel.NewEnv(variables={n: T.DYN for n in names}, extensions=[
            ext_strings.ExtStrings(), ext_optional.ExtOptional(), ext_bindings.ExtBindings(), _k8s_extension()])
    return env


_STATUS_PREFIX = re.compile(r"^[A-Z_]+: ")


def _clean(msg: str) -> str:
    """cel-cpp's status text -> the wording of cel-go, which the real server prints."""
    msg = _STATUS_PREFIX.sub("", str(msg).strip())
    m = re.match(r'Key not found in map : "?(.*?)"?$', msg)
    if m:
        return f"no such key: {m.group(1)}"
    if msg.startswith("No matching overloads found") or msg.startswith("no matching overload"):
        return "no such overload"
    m = re.match(r"Index error: index=(-?\d+) size=\d+", msg)
    if m:
        return f"index out of bounds: {m.group(1)}"
    if msg == "Applying SELECT to non-message type":
        return "no such key"
    if msg == "divide by zero":
        return "division by zero"
    return msg


@dataclass
class Program:
    """One compiled expression."""

    source: str
    prog: Any
    uses_old_self: bool = False

    def eval(self, act: Any) -> Any:
        """The plain Python value of the expression over an ``activation``, or EvalError."""
        try:
            v = self.prog.eval(act)
        except Exception as e:  # the runtime raises for some errors instead of returning an error value
            raise EvalError(_clean(str(e))) from None
        if v.type() == T.ERROR:
            raise EvalError(_clean(str(v.value())))
        return v.plain_value()


def activation(data: dict[str, Any], names: tuple[str, ...] = ADMISSION_VARS) -> Any:
    """Bind variables once for several programs: converting the objects is most of an evaluation's cost."""
    return _env(names).Activation(data)


_OLD_SELF = re.compile(r"\boldSelf\b")
_STRING_LIT = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_CACHE: dict[tuple[tuple[str, ...], str], Program] = {}


def compile_expr(source: str, names: tuple[str, ...] = ADMISSION_VARS) -> Program:
    """Compile once per (variables, text): the same rule text in many CRDs or policies shares a program."""
    key = (names, source)
    p = _CACHE.get(key)
    if p is None:
        try:
            prog = _env(names).compile(source)
        except Exception as e:
            raise CompileError(_clean(str(e)).replace(" [INVALID_ARGUMENT]", "")) from None
        p = Program(source, prog, bool(_OLD_SELF.search(_STRING_LIT.sub("''", source))))
        if len(_CACHE) < 10_000:
            _CACHE[key] = p
    return p


# ------------------------------------------------------------------ field paths (k8s.io/apimachinery field.Path)


def child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def key(path: str, k: str) -> str:
    return f"{path}[{k}]"


def index(path: str, i: int) -> str:
    return f"{path}[{i}]"


def _normalize_field_path(fp: str) -> str:
    """A rule's ``fieldPath`` (``.spec.x``, ``['a.b']``) in field.Path form relative to the rule's node."""
    out = ""
    for m in re.finditer(r"\.([^.\[\]]+)|\['((?:[^'\\]|\\.)*)'\]", fp.strip()):
        out = child(out, m.group(1)) if m.group(1) is not None else child(out, m.group(2))
    return out


# ------------------------------------------------------------------ CRD rules


@dataclass
class Rule:
    program: Program
    rule: str
    message: str
    message_expr: Program | None
    field_path: str
    reason: str | None
    optional_old_self: bool

    def error_string(self) -> str:
        return self.message.strip() if self.message else self.rule.strip()


@dataclass
class Node:
    """A schema node with rules, or with rules somewhere below it."""

    type: str
    rules: list[Rule] = field(default_factory=list)
    properties: dict[str, Node] = field(default_factory=dict)
    additional: Node | None = None
    items: Node | None = None
    list_type: str = ""
    map_keys: tuple[str, ...] = ()
    map_type: str = ""
    compile_errors: list[str] = field(default_factory=list)


def rule_error(path: str, value: Any, detail: str, reason: str | None, shown_by_message: bool) -> dict[str, str]:
    """A failed rule's cause (cel/validation.go fieldErrorForReason): an Invalid one shows the value of
    ``self`` when it is a scalar, nothing for an object or a list, nor when a messageExpression wrote the
    message (which embeds the value if it wants to)."""
    f = path or "<nil>"
    if reason == "FieldValueForbidden":
        return {"reason": reason, "message": f"Forbidden: {detail}", "field": f}
    if reason == "FieldValueRequired":
        return {"reason": reason, "message": f"Required value: {detail}", "field": f}
    if reason == "FieldValueDuplicate":
        return {"reason": reason, "message": f"Duplicate value: {go_value(value)}", "field": f}
    if shown_by_message or isinstance(value, (dict, list)):
        return {"reason": "FieldValueInvalid", "message": f"Invalid value: {detail}", "field": f}
    return {"reason": "FieldValueInvalid", "message": f"Invalid value: {go_value(value)}: {detail}", "field": f}


def field_error(path: str, value_type: str, detail: str, reason: str | None) -> dict[str, str]:
    """A cause like upstream's fieldErrorForReason (Invalid unless the rule names another reason)."""
    f = path or "<nil>"
    if reason == "FieldValueForbidden":
        return {"reason": reason, "message": f"Forbidden: {detail}", "field": f}
    if reason == "FieldValueRequired":
        return {"reason": reason, "message": f"Required value: {detail}", "field": f}
    if reason == "FieldValueDuplicate":
        return {"reason": reason, "message": f'Duplicate value: "{value_type}"', "field": f}
    return {"reason": "FieldValueInvalid", "message": f'Invalid value: "{value_type}": {detail}', "field": f}


class Validator:
    """The compiled x-kubernetes-validations of one CRD version.

    ``Validator.for_schema`` turns one CRD version's ``openAPIV3Schema`` into a tree holding only the nodes
    with rules (or with rules below them), each program compiled once; ``validate`` walks an object along
    that tree the way the real server does: rules see ``self`` (and ``oldSelf`` when the old value can be
    correlated: object properties, map keys, items of ``x-kubernetes-list-type: map`` lists by their keys),
    transition rules run only when an old value exists (``optionalOldSelf`` rules always, with
    ``oldSelf`` an optional), errors on unchanged values are ratcheted away
    (CRDValidationRatcheting, on by default since 1.30) and the field errors read like upstream's.
    """

    def __init__(self, root: Node | None) -> None:
        self.root = root

    @classmethod
    def for_schema(cls, schema: dict[str, Any] | None) -> Validator:
        return cls(_build(schema) if isinstance(schema, dict) else None)

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None) -> tuple[list[dict[str, str]], list[str]]:
        """(causes, warnings): the field errors of failed rules, and ratcheted errors as warnings."""
        errs: list[dict[str, str]] = []
        warns: list[str] = []
        if self.root is not None:
            _walk(self.root, "", obj, old, old is not None and old == obj, errs, warns)
        return errs, warns


def _build(s: dict[str, Any]) -> Node | None:
    node = Node(type=str(s.get("type") or ""))
    for r in s.get("x-kubernetes-validations") or ():
        if not isinstance(r, dict):
            continue
        text = str(r.get("rule") or "")
        if not text.strip():
            continue
        optional = bool(r.get("optionalOldSelf"))
        try:
            prog = compile_expr(_optional_rule(text), OPTIONAL_VARS) if optional else compile_expr(text, CRD_VARS)
            if optional:
                prog.uses_old_self = bool(_OLD_SELF.search(_STRING_LIT.sub("''", text)))
            mprog = compile_expr(str(r["messageExpression"]), CRD_VARS) if r.get("messageExpression") else None
        except CompileError as e:
            node.compile_errors.append(f"rule compile error: {e}")
            continue
        node.rules.append(Rule(prog, text, str(r.get("message") or ""), mprog,
                               _normalize_field_path(str(r.get("fieldPath") or "")), r.get("reason"), optional))
    for name, sub in (s.get("properties") or {}).items():
        if isinstance(sub, dict):
            n = _build(sub)
            if n is not None:
                node.properties[name] = n
    ap = s.get("additionalProperties")
    if isinstance(ap, dict):
        node.additional = _build(ap)
    if isinstance(s.get("items"), dict):
        node.items = _build(s["items"])
    node.list_type = str(s.get("x-kubernetes-list-type") or "")
    node.map_keys = tuple(s.get("x-kubernetes-list-map-keys") or ())
    node.map_type = str(s.get("x-kubernetes-map-type") or "")
    if not (node.rules or node.compile_errors or node.properties or node.additional or node.items):
        return None
    return node


def _go_rule(r: dict[str, Any]) -> str:
    """The rule as Go's %#v prints an apiextensions.ValidationRule (what the real server shows)."""
    import orjson

    def q(v: Any) -> str:
        return orjson.dumps(str(v or "")).decode()

    reason = "(*apiextensions.FieldValueErrorReason)(nil)" if r.get("reason") is None else \
        "(*apiextensions.FieldValueErrorReason)(0xc000000000)"
    opt = "(*bool)(nil)" if r.get("optionalOldSelf") is None else "(*bool)(0xc000000000)"
    return (f"apiextensions.ValidationRule{{Rule:{q(r.get('rule'))}, Message:{q(r.get('message'))}, "
            f"MessageExpression:{q(r.get('messageExpression'))}, Reason:{reason}, FieldPath:{q(r.get('fieldPath'))}, "
            f"OptionalOldSelf:{opt}}}")


def rule_compile_causes(schema: Any, path: str) -> list[dict[str, str]]:
    """422 causes for CRD rules that do not compile, at the CRD's schema paths (checked when a CRD is written)."""
    import orjson

    out: list[dict[str, str]] = []
    if not isinstance(schema, dict):
        return out
    for j, r in enumerate(schema.get("x-kubernetes-validations") or ()):
        if not isinstance(r, dict):
            continue
        rp = f"{path}.x-kubernetes-validations[{j}]"
        text = str(r.get("rule") or "")
        try:
            compile_expr(_optional_rule(text) if r.get("optionalOldSelf") else text,
                         OPTIONAL_VARS if r.get("optionalOldSelf") else CRD_VARS)
        except CompileError as e:
            out.append({"reason": "FieldValueInvalid", "field": f"{rp}.rule",
                        "message": f"Invalid value: {_go_rule(r)}: compilation failed: {e}"})
        if r.get("messageExpression"):
            try:
                compile_expr(str(r["messageExpression"]), CRD_VARS)
            except CompileError as e:
                out.append({"reason": "FieldValueInvalid", "field": f"{rp}.messageExpression",
                            "message": f"Invalid value: {orjson.dumps(str(r['messageExpression'])).decode()}: "
                                       f"messageExpression compilation failed: {e}"})
    for name, sub in (schema.get("properties") or {}).items():
        out += rule_compile_causes(sub, f"{path}.properties[{name}]")
    out += rule_compile_causes(schema.get("items"), f"{path}.items")
    out += rule_compile_causes(schema.get("additionalProperties"), f"{path}.additionalProperties")
    return out


def _rule_nodes(schema: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not isinstance(schema, dict):
        return out
    out += [r for r in schema.get("x-kubernetes-validations") or () if isinstance(r, dict)]
    for sub in (schema.get("properties") or {}).values():
        out += _rule_nodes(sub)
    out += _rule_nodes(schema.get("items"))
    out += _rule_nodes(schema.get("additionalProperties"))
    return out


def rule_texts(schema: Any) -> set[str]:
    """Every rule and messageExpression text in a CRD schema."""
    return {str(r.get(k)) for r in _rule_nodes(schema) for k in ("rule", "messageExpression") if r.get(k)}


def compiled_texts(schema: Any) -> set[str]:
    """The rule and messageExpression texts of a schema that compile (the others are reported on their own)."""
    out: set[str] = set()
    for r in _rule_nodes(schema):
        text = str(r.get("rule") or "")
        try:
            compile_expr(_optional_rule(text) if r.get("optionalOldSelf") else text,
                         OPTIONAL_VARS if r.get("optionalOldSelf") else CRD_VARS)
            out.add(text)
        except CompileError:
            pass
        if r.get("messageExpression"):
            try:
                compile_expr(str(r["messageExpression"]), CRD_VARS)
                out.add(str(r["messageExpression"]))
            except CompileError:
                pass
    return out


def _optional_rule(text: str) -> str:
    """A rule with ``optionalOldSelf: true`` sees ``oldSelf`` as an optional (none on create)."""
    return f"cel.bind(oldSelf, kubesimHasOld ? optional.of(kubesimOld) : optional.none(), ({text}))"


def _walk(node: Node, path: str, val: Any, old: Any, ratchet: bool, errs: list[dict[str, str]],
          warns: list[str]) -> None:
    if val is None:
        return  # rules only see non-null values
    for msg in node.compile_errors:
        errs.append(field_error(path, node.type, msg, None))
    if node.rules:
        _run_rules(node, path, val, old, ratchet, errs, warns)
    if isinstance(val, dict):
        correlatable = node.map_type in ("", "granular", "atomic") and isinstance(old, dict)
        for k, v in val.items():
            sub = node.properties.get(k)
            named = sub is not None
            if sub is None:
                sub = node.additional
            if sub is None:
                continue
            ov = old.get(k) if correlatable else None
            # A correlated child ratchets on its own equality; otherwise it inherits its parent's.
            r = (ov is not None and ov == v) if ov is not None else ratchet and not correlatable
            _walk(sub, child(path, k) if named else key(path, k), v, ov, r, errs, warns)
    elif isinstance(val, list) and node.items is not None:
        olds: dict[tuple[Any, ...], Any] = {}
        if node.list_type == "map" and node.map_keys and isinstance(old, list):
            for o in old:
                if isinstance(o, dict):
                    olds[tuple(o.get(k) for k in node.map_keys)] = o
        for i, item in enumerate(val):
            ov = olds.get(tuple(item.get(k) for k in node.map_keys)) if olds and isinstance(item, dict) else None
            r = (ov == item) if ov is not None else ratchet
            _walk(node.items, index(path, i), item, ov, r, errs, warns)


_CACHEABLE = (str, int, bool, type(None))
_RESULTS: dict[tuple[str, type, Any, type, Any], tuple[bool, Any]] = {}
"""(rule source, self, oldSelf) -> (evaluated, value or error text) for rules over scalars: a rule is a pure
function of its variables, and most rules guard strings, enums and integers that repeat from write to write."""


def _eval_rule(rule: Rule, val: Any, old: Any, acts: list[Any]) -> Any:
    """``rule`` over (self, oldSelf); ``acts`` holds the activations built so far ([plain, optional])."""
    key = None
    if type(val) in _CACHEABLE and type(old) in _CACHEABLE:
        key = (rule.program.source, type(val), val, type(old), old)
        hit = _RESULTS.get(key)
        if hit is not None:
            if hit[0]:
                return hit[1]
            raise EvalError(hit[1])
    if rule.optional_old_self:
        if acts[1] is None:
            acts[1] = activation({"self": val, "oldSelf": None, "kubesimOld": old,
                                  "kubesimHasOld": old is not None}, OPTIONAL_VARS)
        act = acts[1]
    else:
        if acts[0] is None:
            acts[0] = activation({"self": val, "oldSelf": old}, CRD_VARS)
        act = acts[0]
    try:
        ok = rule.program.eval(act)
    except EvalError as e:
        if key is not None:
            _remember(key, (False, str(e)))
        raise
    if key is not None and type(ok) in _CACHEABLE:
        _remember(key, (True, ok))
    return ok


def _remember(key: tuple[str, type, Any, type, Any], result: tuple[bool, Any]) -> None:
    if len(_RESULTS) >= 4096:
        _RESULTS.clear()
    _RESULTS[key] = result


def _run_rules(node: Node, path: str, val: Any, old: Any, ratchet: bool, errs: list[dict[str, str]],
               warns: list[str]) -> None:
    acts: list[Any] = [None, None]  # built only when a rule is evaluated (not answered from _RESULTS)
    for rule in node.rules:
        if rule.program.uses_old_self and old is None and not rule.optional_old_self:
            continue  # transition rules need a comparable old value, unless oldSelf is optional
        try:
            ok = _eval_rule(rule, val, old, acts)
        except EvalError as e:
            text = str(e)
            if text.startswith("no such overload"):
                detail = (f"'{text}': call arguments did not match a supported operator, function or macro "
                          f"signature for rule: {rule.error_string()}")
            else:
                detail = f"{text} evaluating rule: {rule.error_string()}"
            errs.append(field_error(path, node.type, detail, None))
            continue
        if ok is True:
            continue
        detail = ""
        detail_from_expr = False
        if rule.message_expr is not None:
            if acts[0] is None:
                acts[0] = activation({"self": val, "oldSelf": old}, CRD_VARS)
            try:
                m = rule.message_expr.eval(acts[0])
                if isinstance(m, str) and m.strip() and "\n" not in m.strip() and len(m.strip()) <= MAX_MESSAGE:
                    detail, detail_from_expr = m.strip(), True
            except EvalError:
                pass
        if not detail:
            detail = rule.message.strip() if rule.message else f"failed rule: {rule.error_string()}"
        where = child(path, rule.field_path) if rule.field_path else path
        err = rule_error(where, val, detail, rule.reason, shown_by_message=detail_from_expr)
        if not rule.program.uses_old_self and ratchet:
            warns.append(f"{err['field']}: {err['message']}")
        else:
            errs.append(err)
