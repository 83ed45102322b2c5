"""What a real server checks in a CRD's validation rules before it stores the CRD, beyond their syntax: that
every field a rule selects exists in the schema (cel-go's checker over the schema's CEL types:
``undefined field 'x'``), and that each rule's estimated worst-case cost stays within budget (cel-go's cost
estimator with the Kubernetes library's estimates, sizes taken from ``maxLength`` / ``maxItems`` /
``maxProperties`` or, without them, from the 3 MiB request limit, times the number of times the rule can run).
The expression is parsed here (a CEL parser for the grammar rules use; the runtime stays cel-expr-python) and
walked once for both checks. Types follow apiserver's ``SchemaDeclType``: an object exposes its declared
properties only (also with ``x-kubernetes-preserve-unknown-fields``), a resource root ``apiVersion``,
``kind`` and ``metadata.name`` / ``metadata.generateName``, a map its values, an int-or-string is dynamic.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

MAX = 2 ** 64 - 1
MAX_REQUEST = 3 * 1024 * 1024
RULE_LIMIT = 10_000_000  # apiextensions validation.StaticEstimatedCostLimit
CRD_LIMIT = 100_000_000  # StaticEstimatedCRDCostLimit
TRAVERSAL = 0.1  # common.StringTraversalCostFactor
REGEX = 0.25  # common.RegexStringLengthCostFactor


def _add(a: int, b: int) -> int:
    return min(a + b, MAX)


def _mul(a: int, b: int) -> int:
    return min(a * b, MAX)


def _factor(a: int, f: float) -> int:
    return MAX if a >= MAX else min(math.ceil(a * f), MAX)


# ---------------------------------------------------------------------------------------- schema types


@dataclass
class Decl:
    """A CEL type declared from a schema node (apiserver's DeclType): kind, size bound and minimal JSON size."""

    kind: str  # object | map | list | string | bytes | int | double | bool | dyn | timestamp | duration
    max_elements: int = 0
    min_size: int = 1
    fields: dict[str, Decl] = field(default_factory=dict)
    elem: Decl | None = None  # list items / map values


_RESERVED = {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if",
             "import", "let", "loop", "package", "namespace", "return", "var", "void", "while"}
_IDENT = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9]*$")


def _escape(name: str) -> str | None:
    """apiservercel.Escape: the CEL name of a property, None when it cannot be one."""
    if name in _RESERVED:
        return f"__{name}__"
    if _IDENT.match(name):
        return name.replace("__", "__underscores__")
    if not re.match(r"^[_a-zA-Z][-._/a-zA-Z0-9]*$", name):
        return None
    return (name.replace("__", "__underscores__").replace(".", "__dot__").replace("-", "__dash__")
            .replace("/", "__slash__"))


def _string_max(s: dict[str, Any]) -> int:
    if isinstance(s.get("maxLength"), int):
        return max(int(s["maxLength"]), 0) * 4
    enum = [e for e in s.get("enum") or () if isinstance(e, str)]
    if enum:
        return max(len(e) for e in enum)
    return MAX_REQUEST - 2


def decl(s: Any, root: bool = False) -> Decl | None:
    """SchemaDeclType: None where the schema is not exposed to rules."""
    if not isinstance(s, dict):
        return None
    if s.get("x-kubernetes-int-or-string"):
        return Decl("dyn", _string_max(s) if "maxLength" in s else MAX_REQUEST - 2, 1)
    t = s.get("type")
    if root:
        props = dict(s.get("properties") or {})
        props["kind"] = props["apiVersion"] = {"type": "string"}
        props["metadata"] = {"type": "object", "properties": {"name": {"type": "string"},
                                                               "generateName": {"type": "string"}}}
        s = {**s, "properties": props}
        t = t or "object"
    if t == "array":
        items = decl(s.get("items"), bool((s.get("items") or {}).get("x-kubernetes-embedded-resource")))
        if items is None:
            return None
        n = max(s["maxItems"], 0) if isinstance(s.get("maxItems"), int) else (MAX_REQUEST - 2) // (items.min_size + 1)
        return Decl("list", n, 2, elem=items)
    if t == "object":
        addl = s.get("additionalProperties")
        if isinstance(addl, dict):
            vals = decl(addl, bool(addl.get("x-kubernetes-embedded-resource")))
            if vals is None:
                return None
            n = (max(s["maxProperties"], 0) if isinstance(s.get("maxProperties"), int)
                 else (MAX_REQUEST - 2) // (vals.min_size + 6))
            return Decl("map", n, 2, elem=vals)
        required = set(s.get("required") or ())
        fields: dict[str, Decl] = {}
        min_size = 2
        for name, p in (s.get("properties") or {}).items():
            ft = decl(p, isinstance(p, dict) and bool(p.get("x-kubernetes-embedded-resource")))
            if ft is None:
                continue
            cel_name = _escape(name)
            if cel_name is not None:
                fields[cel_name] = ft
            if name in required and "default" not in p:
                min_size += len(name) + ft.min_size + 4
        return Decl("object", 0, min_size, fields=fields)
    if t == "string":
        fmt = s.get("format")
        if fmt == "byte":
            return Decl("bytes", max(s["maxLength"], 0) if isinstance(s.get("maxLength"), int) else MAX_REQUEST - 2, 2)
        if fmt == "duration":
            return Decl("duration", 64, 4)
        if fmt == "date":
            return Decl("timestamp", 12, 12)
        if fmt == "date-time":
            return Decl("timestamp", 32, 21)
        return Decl("string", _string_max(s), 2)
    if t == "boolean":
        return Decl("bool", 0, 4)
    if t == "number":
        return Decl("double", 0, 1)
    if t == "integer":
        return Decl("int", 0, 1)
    return None


# ---------------------------------------------------------------------------------------- the parser

_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*)
  | (?P<str>[rRbB]{0,2}(?:'''(?:.|\n)*?'''|\"\"\"(?:.|\n)*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))
  | (?P<num>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<id>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>\.\?|\[\?|==|!=|<=|>=|&&|\|\||[-+*/%!<>?:.,()\[\]{}])
""", re.VERBOSE)


class ParseError(Exception):
    pass


@dataclass
class Node:
    kind: str  # lit | ident | select | call | list | map | index | comp
    pos: int = 0
    name: str = ""  # ident / select field / call function
    value: Any = None  # literal value (str for strings)
    args: list[Node] = field(default_factory=list)
    target: Node | None = None  # select operand / member call target
    optional: bool = False
    test: bool = False  # has()


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ParseError(f"unexpected character at {pos}")
            kind = m.lastgroup or ""
            if kind != "ws":
                self.toks.append((kind, m.group(), pos))
            pos = m.end()
        self.i = 0

    def peek(self, v: str | None = None) -> bool:
        if self.i >= len(self.toks):
            return False
        return v is None or (self.toks[self.i][1] == v and self.toks[self.i][0] in ("op", "id"))

    def take(self, v: str | None = None) -> tuple[str, str, int]:
        if self.i >= len(self.toks) or (v is not None and not self.peek(v)):
            raise ParseError(f"expected {v}")
        t = self.toks[self.i]
        self.i += 1
        return t

    def parse(self) -> Node:
        n = self.expr()
        if self.i != len(self.toks):
            raise ParseError("trailing input")
        return n

    def expr(self) -> Node:
        cond = self.binary(0)
        if self.peek("?"):
            pos = self.take()[2]
            a = self.binary(0)
            self.take(":")
            b = self.expr()
            return Node("call", pos, "_?_:_", args=[cond, a, b])
        return cond

    _LEVELS = [("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%")]

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.i < len(self.toks) and self.toks[self.i][1] in self._LEVELS[level] \
                and self.toks[self.i][0] in ("op", "id"):
            op, pos = self.toks[self.i][1], self.toks[self.i][2]
            self.i += 1
            right = self.binary(level + 1)
            left = Node("call", pos, "@in" if op == "in" else f"_{op}_", args=[left, right])
        return left

    def unary(self) -> Node:
        if self.peek("!") or self.peek("-"):
            _, op, pos = self.take()
            inner = self.unary()
            if op == "-" and inner.kind == "lit" and isinstance(inner.value, (int, float)):
                return inner
            return Node("call", pos, "!_" if op == "!" else "-_", args=[inner])
        return self.member()

    def member(self) -> Node:
        n = self.primary()
        while self.i < len(self.toks):
            if self.peek(".") or self.peek(".?"):
                dot = self.take()
                name = self.take()
                if self.peek("("):
                    self.take("(")
                    n = Node("call", dot[2], name[1], args=self.args(")"), target=n)
                else:
                    n = Node("select", dot[2], name[1], target=n, optional=dot[1] == ".?")
            elif self.peek("[") or self.peek("[?"):
                br = self.take()
                idx = self.expr()
                self.take("]")
                n = Node("index", br[2], args=[n, idx], optional=br[1] == "[?")
            elif self.peek("{") and n.kind in ("ident", "select"):
                self.take("{")
                while not self.peek("}"):
                    self.take()
                    self.take(":")
                    self.expr()
                    if not self.peek(","):
                        break
                    self.take(",")
                self.take("}")
                n = Node("call", n.pos, "@struct")
            else:
                break
        return n

    def args(self, close: str) -> list[Node]:
        out: list[Node] = []
        while not self.peek(close):
            out.append(self.expr())
            if not self.peek(","):
                break
            self.take(",")
        self.take(close)
        return out

    def primary(self) -> Node:
        kind, text, pos = self.take()
        if kind == "num":
            t = text.rstrip("uU")
            return Node("lit", pos, value=int(t, 16) if t.lower().startswith("0x") else
                        (float(t) if any(c in t for c in ".eE") else int(t)))
        if kind == "str":
            prefix = re.match(r"^[rRbB]*", text).group()  # type: ignore[union-attr]
            body = text[len(prefix):]
            q = 3 if body[:3] in ("'''", '"""') else 1
            return Node("lit", pos, value=body[q:-q])
        if kind == "id":
            if text in ("true", "false"):
                return Node("lit", pos, value=text == "true")
            if text == "null":
                return Node("lit", pos, value=None)
            if self.peek("("):
                self.take("(")
                return Node("call", pos, text, args=self.args(")"))
            return Node("ident", pos, text)
        if text == ".":
            return self.primary()
        if text == "(":
            n = self.expr()
            self.take(")")
            return n
        if text == "[":
            return Node("list", pos, args=self.args("]"))
        if text == "{":
            items: list[Node] = []
            while not self.peek("}"):
                if self.peek("?"):
                    self.take()
                items.append(self.expr())
                self.take(":")
                items.append(self.expr())
                if not self.peek(","):
                    break
                self.take(",")
            self.take("}")
            return Node("map", pos, args=items)
        raise ParseError(f"unexpected {text}")


# ---------------------------------------------------------------------------------------- checking and costing

DYN = Decl("dyn", MAX, 1)
_SCALARS = ("int", "double", "bool", "uint", "timestamp", "duration", "null")
_MACROS = ("all", "exists", "exists_one", "map", "filter", "transformList", "transformMap", "transformMapEntry")


class UndefinedField(Exception):
    def __init__(self, name: str, pos: int) -> None:
        super().__init__(name)
        self.name, self.pos = name, pos


@dataclass
class Value:
    """What the walk knows of an expression: its type and its size estimate (max)."""

    t: Decl
    size: int | None = None  # None: unknown

    def sz(self) -> int:
        if self.size is not None:
            return self.size
        return 1 if self.t.kind in _SCALARS else MAX


def _v(t: Decl, size: int | None = None) -> Value:
    """A computed value: its size is known only for literals and scalars (cel-go's computeSize)."""
    return Value(t, size)


def _p(t: Decl) -> Value:
    """A value at a schema path: the size estimator answers ``maxElements`` (0 for scalars and objects)."""
    return Value(t, t.max_elements)


class _Walk:
    def __init__(self, scope: dict[str, Value]) -> None:
        self.scope = [scope]

    def lookup(self, name: str) -> Value | None:
        for s in reversed(self.scope):
            if name in s:
                return s[name]
        return None

    def walk(self, n: Node) -> tuple[int, Value]:
        """(max cost, value) of ``n``; raises UndefinedField."""
        if n.kind == "lit":
            if isinstance(n.value, str):
                return 0, _v(Decl("string", len(n.value), 2), len(n.value))
            return 0, _v(Decl("bool" if isinstance(n.value, bool) else "int"), 1)
        if n.kind == "ident":
            v = self.lookup(n.name)
            return 1, v if v is not None else _v(DYN, None)
        if n.kind == "select":
            return self.select(n)
        if n.kind == "list":
            cost, elems = 0, []
            for a in n.args:
                c, v = self.walk(a)
                cost = _add(cost, c)
                elems.append(v)
            elem = elems[0].t if elems and all(e.t.kind == elems[0].t.kind for e in elems) else DYN
            return _add(cost, 10), _v(Decl("list", len(n.args), 2, elem=elem), len(n.args))
        if n.kind == "map":
            cost = 0
            for a in n.args:
                cost = _add(cost, self.walk(a)[0])
            return _add(cost, 30), _v(Decl("map", len(n.args) // 2, 2, elem=DYN), len(n.args) // 2)
        if n.kind == "index":
            (c1, coll), (c2, _) = self.walk(n.args[0]), self.walk(n.args[1])
            if coll.t.kind in ("list", "map") and coll.t.elem:
                return _add(_add(c1, c2), 1), _p(coll.t.elem)
            return _add(_add(c1, c2), 1), _v(DYN)
        return self.call(n)

    def select(self, n: Node) -> tuple[int, Value]:
        assert n.target is not None
        cost, tv = self.walk(n.target)
        t = tv.t
        if t.kind == "optional" and t.elem is not None:
            t = t.elem
        if t.kind == "object":
            ft = t.fields.get(n.name)
            if ft is None:
                raise UndefinedField(n.name, n.pos)
            out = ft
        elif t.kind == "map" and t.elem is not None:
            out = t.elem
        else:
            out = DYN
        if n.test:
            return _add(cost, 1), _v(Decl("bool"))
        if t.kind in ("object", "map"):
            cost = _add(cost, 1)
        if n.optional:
            return cost, _v(Decl("optional", elem=out))
        return cost, _p(out) if out is not DYN else _v(DYN)

    def comprehension(self, n: Node, macro: str) -> tuple[int, Value]:
        assert n.target is not None
        rc, rng = self.walk(n.target)
        two = (len(n.args) == 3 and macro in ("all", "exists", "exists_one")) or macro.startswith("transform")
        names = [a.name for a in n.args[:2 if two else 1]]
        elem = rng.t.elem if rng.t.kind in ("list", "map") and rng.t.elem else DYN
        key = Decl("string", 0, 2) if rng.t.kind == "map" else Decl("int")
        if rng.t.kind == "map" and not two:
            bound = {names[0]: _p(key)}
        elif two:
            bound = {names[0]: _p(key), names[1]: _p(elem)}
        else:
            bound = {names[0]: _p(elem) if elem is not DYN else _v(DYN)}
        self.scope.append(bound)
        try:
            body = [self.walk(a) for a in n.args[len(names):]]
        finally:
            self.scope.pop()
        bc = [c for c, _ in body]
        if macro == "all":
            per, init, result = _add(3, bc[-1]), 0, 1
        elif macro == "exists":
            per, init, result = _add(4, bc[-1]), 0, 1
        elif macro == "exists_one":
            per, init, result = _add(2, bc[-1]), 0, 2
        elif macro == "filter":
            per, init, result = _add(13, bc[-1]), 10, 1
        elif macro == "map" and len(bc) == 2:
            per, init, result = _add(_add(bc[0], bc[1]), 12), 10, 1
        else:  # map(x, t) and the transform macros: accu + [t]
            per, init, result = _add(sum(bc), 12), 10, 1
        cost = _add(_add(_add(rc, init), result), _mul(rng.sz(), per))
        if macro in ("all", "exists", "exists_one"):
            return cost, _v(Decl("bool"))
        out = elem if macro == "filter" else (body[-1][1].t if body else DYN)
        return cost, _v(Decl("list", rng.sz(), 2, elem=out), rng.sz())

    def call(self, n: Node) -> tuple[int, Value]:
        f = n.name
        if n.target is not None and f in _MACROS and n.args and all(a.kind == "ident" for a in n.args[:1]):
            return self.comprehension(n, f)
        if f == "has" and len(n.args) == 1 and n.args[0].kind == "select":
            sel = n.args[0]
            sel.test = True
            return self.select(sel)
        if f == "bind" and n.target is not None and n.target.kind == "ident" and n.target.name == "cel" \
                and len(n.args) == 3:
            ic, iv = self.walk(n.args[1])
            self.scope.append({n.args[0].name: iv})
            try:
                bc, bv = self.walk(n.args[2])
            finally:
                self.scope.pop()
            return _add(_add(10, ic), bc), bv
        cost = 0
        target: Value | None = None
        if n.target is not None:
            cost, target = self.walk(n.target)
        vals: list[Value] = []
        costs: list[int] = []
        for a in n.args:
            c, v = self.walk(a)
            costs.append(c)
            vals.append(v)
        args_cost = sum(costs)
        fc, out = self.function(f, target, vals, n.args, costs)
        return _add(cost, fc if f in ("_&&_", "_||_", "_?_:_") else _add(fc, args_cost)), out

    def function(self, f: str, target: Value | None, args: list[Value], nodes: list[Node],
                 costs: list[int]) -> tuple[int, Value]:
        boolean = _v(Decl("bool"))
        if f in ("_&&_", "_||_"):
            return _add(costs[0], costs[1]), boolean
        if f == "_?_:_":
            a, b = args[1], args[2]
            same = a.t if a.t.kind == b.t.kind else DYN
            size = max(a.sz(), b.sz())
            return _add(costs[0], max(costs[1], costs[2])), _v(same, size)
        if f in ("_==_", "_!=_", "_<_", "_<=_", "_>_", "_>=_"):
            if f in ("_==_", "_!=_") or args[0].t.kind in ("string", "bytes"):
                smallest = min(args[0].sz(), args[1].sz())
                return _factor(smallest, TRAVERSAL), boolean
            return 1, boolean
        if f == "@in":
            return (_factor(args[1].sz(), 1) if args[1].t.kind in ("list", "dyn") else 1), boolean
        if f == "_+_":
            a, b = args
            if a.t.kind == "list" or b.t.kind == "list":
                size = _add(a.sz(), b.sz())
                return 1, _v(Decl("list", size, 2, elem=a.t.elem or DYN), size)
            if a.t.kind in ("string", "bytes") or b.t.kind in ("string", "bytes"):
                size = _add(a.sz(), b.sz())
                return _factor(size, TRAVERSAL), _v(Decl(a.t.kind if a.t.kind in ("string", "bytes") else "string",
                                                         size), size)
            return 1, _v(a.t)
        if f in ("_-_", "_*_", "_/_", "_%_", "-_"):
            return 1, _v(args[0].t)
        if f == "!_":
            return 1, boolean
        if target is not None:
            ts = target.sz()
            if f == "matches" and args:
                return _mul(_factor(_add(ts, 1), TRAVERSAL), _factor(args[0].sz(), REGEX)), boolean
            if f in ("find", "findAll") and args:
                cost = _mul(_factor(_add(ts, 1), TRAVERSAL), _factor(args[0].sz(), REGEX))
                return cost, (_v(Decl("string", ts), ts) if f == "find" else
                              _v(Decl("list", ts, 2, elem=Decl("string", ts)), ts))
            if f == "contains" and args:
                return _mul(_factor(ts, TRAVERSAL), _factor(args[0].sz(), TRAVERSAL)), boolean
            if f in ("startsWith", "endsWith") and args:
                return _factor(args[0].sz(), TRAVERSAL), boolean
            if f in ("isSorted", "sum", "max", "min", "indexOf", "lastIndexOf"):
                if target.t.kind == "list":
                    el = target.t.elem or DYN
                    per = 1
                    if el.kind in ("string", "bytes"):
                        per = _add(1, _factor(el.max_elements, TRAVERSAL))
                    out = boolean if f == "isSorted" else (_v(Decl("int")) if "ndex" in f else _v(el))
                    return _mul(ts, per), out
                return _factor(ts, TRAVERSAL), _v(Decl("int"))
            if f in ("lowerAscii", "upperAscii", "substring", "trim"):
                return _factor(ts, TRAVERSAL), _v(Decl("string", ts), ts)
            if f == "replace":
                return _factor(ts, 2 * TRAVERSAL), _v(Decl("string", MAX))
            if f == "split":
                return _factor(ts, 2 * TRAVERSAL), _v(Decl("list", ts, 2, elem=Decl("string", ts)), ts)
            if f == "join":
                el_size = target.t.elem.max_elements if target.t.elem else MAX
                size = _mul(ts, el_size)
                if args:
                    size = _add(size, _mul(args[0].sz(), max(ts - 1, 0)))
                return _factor(size, TRAVERSAL), _v(Decl("string", size), size)
            if f == "format":
                return _factor(ts, TRAVERSAL), _v(Decl("string", MAX))
            if f in ("value", "orValue") and target.t.kind == "optional":
                return 1, _v(target.t.elem or DYN)
            if f in ("hasValue",):
                return 1, boolean
            if f == "size":
                return 1, _v(Decl("int"))
            if f in ("quantity", "isQuantity", "url", "isURL", "ip", "isIP", "cidr", "isCIDR") and args:
                return _factor(args[0].sz(), TRAVERSAL), _v(DYN)
        if f in ("quantity", "isQuantity", "url", "isURL", "ip", "isIP", "cidr", "isCIDR") and args:
            return _factor(args[0].sz(), TRAVERSAL), boolean if f.startswith("is") else _v(DYN)
        if f in ("size", "int", "uint", "double"):
            return 1, _v(Decl("int" if f in ("size", "int") else f))
        if f == "string":
            return 1, _v(Decl("string", MAX))
        if f in ("has",):
            return 1, boolean
        if f == "dyn" and args:
            return 1, args[0]
        return 1, _v(DYN)


@dataclass
class Checked:
    """One rule's static findings: the undefined field (name, offset) it selects, or its estimated max cost."""

    undefined: tuple[str, int] | None = None
    cost: int = 0


def check(text: str, self_type: Decl, optional_old_self: bool = False) -> Checked | None:
    """Type-check and cost one rule over ``self_type``; None when the text is beyond this parser (then only
    cel-expr-python's own compile check applies)."""
    try:
        tree = _Parser(text).parse()
    except (ParseError, AttributeError, IndexError, ValueError, RecursionError):
        return None
    old = _v(Decl("optional", elem=self_type)) if optional_old_self else _p(self_type)
    walk = _Walk({"self": _p(self_type), "oldSelf": old})
    try:
        cost, _ = walk.walk(tree)
    except UndefinedField as e:
        return Checked(undefined=(e.name, e.pos))
    except (IndexError, AttributeError, KeyError, TypeError, ValueError, RecursionError):
        return None  # a shape this walk does not know: the compile check alone judges the rule
    return Checked(cost=cost)


def located(text: str, pos: int, message: str) -> str:
    """cel-go's error text: ``ERROR: <input>:line:col: message`` and the source line with a caret."""
    line_no = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start:end if end >= 0 else len(text)]
    col = pos - start
    return f"ERROR: <input>:{line_no}:{col + 1}: {message}\n | {line}\n | {'.' * col}^"


def cost_message(what: str, cost: int, limit: int) -> str:
    """getCostErrorMessage."""
    factor = cost / limit
    if factor > 100.0:
        shown = "more than 100x"
    elif factor < 1.5:
        shown = f"{factor:f}x"
    else:
        shown = f"{factor:.1f}x"
    return (f"{what} exceeds budget by factor of {shown} (try simplifying the rule, or adding maxItems, "
            "maxProperties, and maxLength where arrays, maps, and strings are declared)")


# ---------------------------------------------------------------------------------------- a CRD's schema


def _go_rule(r: dict[str, Any]) -> str:
    from kubesim.cel import _go_rule as go_rule
    return go_rule(r)


def schema_causes(schema: Any, base: str, known: set[str], compiled: set[str]) -> list[dict[str, str]]:
    """422 causes for the rules of a CRD schema rooted at ``base`` (``spec.validation.openAPIV3Schema``):
    undefined fields and cost over budget, per rule, then the CRD's total. ``known``: rule texts the stored CRD
    already had (an update does not re-judge them); ``compiled``: texts cel-expr-python compiled (the others
    were reported already)."""
    out: list[dict[str, str]] = []
    costs: list[tuple[int, str]] = []

    def visit(s: Any, path: str, cardinality: int | None, root: bool) -> None:
        if not isinstance(s, dict):
            return
        rules = [r for r in s.get("x-kubernetes-validations") or () if isinstance(r, dict)]
        if rules:
            t = decl(s, root or bool(s.get("x-kubernetes-embedded-resource")))
            if t is not None:
                times = cardinality if cardinality is not None else MAX_REQUEST // (t.min_size + 1)
                for j, r in enumerate(rules):
                    rp = f"{path}.x-kubernetes-validations[{j}]"
                    judge(r, t, times, rp)
        for name, sub in (s.get("properties") or {}).items():
            visit(sub, f"{path}.properties[{name}]", cardinality, False)
        items = s.get("items")
        if isinstance(items, dict):
            n = s.get("maxItems")
            visit(items, f"{path}.items", cardinality * n if cardinality is not None and isinstance(n, int)
                  else None, False)
        addl = s.get("additionalProperties")
        if isinstance(addl, dict):
            n = s.get("maxProperties")
            visit(addl, f"{path}.additionalProperties", cardinality * n
                  if cardinality is not None and isinstance(n, int) else None, False)

    def judge(r: dict[str, Any], t: Decl, times: int, rp: str) -> None:
        text = str(r.get("rule") or "")
        got = check(text, t, bool(r.get("optionalOldSelf"))) if text in compiled else None
        if got is not None and got.undefined is not None:
            name, pos = got.undefined
            if text not in known:
                out.append({"reason": "FieldValueInvalid", "field": f"{rp}.rule",
                            "message": f"Invalid value: {_go_rule(r)}: compilation failed: "
                                       f"{located(text, pos, f'undefined field {name!r}')}"})
        elif got is not None:
            cost = _mul(got.cost, times)
            costs.append((cost, f"{rp}.rule"))
            if cost > RULE_LIMIT and text not in known:
                out.append({"reason": "FieldValueForbidden", "field": f"{rp}.rule",
                            "message": "Forbidden: " + cost_message("estimated rule cost", cost, RULE_LIMIT)})
        expr = str(r.get("messageExpression") or "")
        if expr and expr in compiled:
            got = check(expr, t, False)
            if got is not None and got.undefined is None:
                cost = _mul(got.cost, times)
                costs.append((cost, f"{rp}.messageExpression"))
                if cost > RULE_LIMIT and expr not in known:
                    out.append({"reason": "FieldValueForbidden", "field": f"{rp}.messageExpression",
                                "message": "Forbidden: " + cost_message("estimated messageExpression cost", cost,
                                                                        RULE_LIMIT)})

    visit(schema, base, 1, True)
    total = 0
    for c, _ in costs:
        total = _add(total, c)
    if total > CRD_LIMIT:
        for _, where in sorted(costs, key=lambda c: -c[0])[:4]:
            out.append({"reason": "FieldValueForbidden", "field": where, "message": "Forbidden: contributed to "
                        "estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema"})
        out.append({"reason": "FieldValueForbidden", "field": base, "message": "Forbidden: " + cost_message(
            "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema", total, CRD_LIMIT)})
    return out
