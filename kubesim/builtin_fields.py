"""Unknown fields in built-in kinds: what a real API server's typed decoding drops (and reports).

A real server decodes a Pod, Job, Service, ... into its Go struct: a field the struct does not have is
dropped, and ``fieldValidation`` says what the client hears (``Strict``: 400 ``strict decoding error:
unknown field "spec.containers[0].imagePullPolciy"``, 422 at ``patch`` for a patch; ``Warn``, the default: a warning; ``Ignore``:
nothing). kubesim has no Go structs; it takes the field sets from the official client's models (the
``openapi_types`` / ``attribute_map`` of ``kubernetes.client.models``, generated from the same API), so
every built-in kind kubesim serves is checked to the client's API version. Free-form parts (``object``:
IntOrString, RawExtension, ``fieldsV1``) are not descended into.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from kubernetes.client import models

from kubesim.resources import ResourceType

_LIST = re.compile(r"^List\[(.+)\]$")
_DICT = re.compile(r"^Dict\[str, (.+)\]$")
_SCALARS = {"str", "int", "float", "bool", "datetime", "date", "object", "bytearray", "bytes"}

# Node: ("model", {json key: node}) | ("list", node) | ("map", node) | None (scalar / free-form).
Node = tuple[str, Any] | None


def model_name(rt: ResourceType) -> str:
    version = rt.versions[0].capitalize()
    if rt.kind == "Event":
        return "CoreV1Event" if rt.group == "" else "EventsV1Event"
    return f"{version}{rt.kind}"


@cache
def _node(type_name: str) -> Node:
    t = type_name.strip()
    if t in _SCALARS:
        return None
    m = _LIST.match(t)
    if m:
        inner = _node(m.group(1))
        return ("list", inner) if inner is not None else None
    m = _DICT.match(t)
    if m:
        inner = _node(m.group(1))
        return ("map", inner) if inner is not None else None
    cls = getattr(models, t, None)
    if cls is None or not isinstance(getattr(cls, "openapi_types", None), dict):
        return None
    # Field types resolve lazily: models refer to each other, some recursively (JSONSchemaProps).
    return ("model", {cls.attribute_map.get(attr, attr): _LAZY(typ) for attr, typ in cls.openapi_types.items()})


class _LAZY:
    """A field's type, resolved on first use (models refer to each other, some recursively)."""

    __slots__ = ("node", "type_name")

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name
        self.node: Node | bool = False

    def get(self) -> Node:
        if self.node is False:
            self.node = _node(self.type_name)
        return self.node  # type: ignore[return-value]


def warm(types: list[ResourceType]) -> int:
    """Resolve the field trees of the built-in ``types`` now (importing the client's model modules takes about
    a second): a server calls this before it says it is ready, so that its first requests do not pay for it.
    Returns how many models were resolved."""
    seen: set[int] = set()
    stack: list[Node] = [_node(model_name(rt)) for rt in types if rt.builtin]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        kind, inner = node
        if kind != "model":
            stack.append(inner)
        elif id(inner) not in seen:
            seen.add(id(inner))
            stack += [lazy.get() for lazy in inner.values()]
    return len(seen)


def unknown_fields(rt: ResourceType, obj: dict[str, Any]) -> list[str]:
    """Drop the fields of ``obj`` its kind does not have; return their paths (``spec.containers[0].x``)."""
    root = _node(model_name(rt))
    if root is None:
        return []
    out: list[str] = []
    _walk(obj, root, None, out)
    return out


Path = tuple[Any, str, Any] | None
"""Where a value is: None at the root, else (the parent's Path, "." or "[", key or index); spelt out only
for a field that is reported (most writes have none, and every request walks its whole object)."""


def _spell(path: Path) -> str:
    parts: list[str] = []
    while path is not None:
        path, sep, key = path
        parts.append(f"[{key}]" if sep == "[" else (f".{key}" if path is not None else str(key)))
    return "".join(reversed(parts))


def _walk(value: Any, node: Node, path: Path, out: list[str]) -> None:
    if node is None:
        return
    kind, inner = node
    if kind == "model":
        if not isinstance(value, dict):
            return
        unknown: list[str] | None = None
        for k, v in value.items():
            field = inner.get(k)
            if field is None:
                if unknown is None:
                    unknown = []
                unknown.append(k)
                out.append(_spell((path, ".", k)))
                continue
            if v is not None:
                sub = field.get()
                if sub is not None:
                    _walk(v, sub, (path, ".", k), out)
        if unknown is not None:
            for k in unknown:
                del value[k]
    elif kind == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            _walk(item, inner, (path, "[", i), out)
    elif kind == "map" and isinstance(value, dict):
        for k, item in value.items():
            _walk(item, inner, (path, "[", k), out)
