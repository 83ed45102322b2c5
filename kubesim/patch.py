"""Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge patch.

Strategic merge knows the merge keys of the built-in lists mkd touches (containers by name, env by name,
ports by containerPort or port, volumes by name, volumeMounts by mountPath, conditions by type,
ownerReferences by uid, ...) and the ``$patch`` / ``$deleteFromPrimitiveList`` / ``$setElementOrder`` /
``$retainKeys`` directives. Errors raise ``ApiError`` as the real server reports them.
"""

from __future__ import annotations

from typing import Any

from kubesim.errors import ApiError
from kubesim.records import json_copy

# Lists merged by key: field name -> merge key. "ports" depends on context (see _merge_key).
MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name",
    "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath", "conditions": "type",
    "ownerReferences": "uid", "imagePullSecrets": "name", "hostAliases": "ip", "envFrom": "",
    "topologySpreadConstraints": "topologyKey", "resourceClaims": "name", "addresses": "type",
    "taints": "key", "images": "", "containerStatuses": "name", "initContainerStatuses": "name",
    "readinessGates": "conditionType", "podIPs": "ip", "hostIPs": "ip", "secrets": "name",
}
# Primitive lists with patchStrategy merge (union instead of replace).
MERGE_PRIMITIVES = {"finalizers"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: null deletes, objects merge recursively, everything else replaces."""
    if not isinstance(patch, dict):
        return json_copy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(400, "BadRequest", f"json patch path must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, dict):
            if p not in cur:
                raise ApiError(422, "Invalid", f"doc is missing path: \"{path}\": missing value")
            cur = cur[p]
        elif isinstance(cur, list):
            try:
                cur = cur[int(p)]
            except (ValueError, IndexError):
                raise ApiError(422, "Invalid", f"doc is missing path: \"{path}\": missing value") from None
        else:
            raise ApiError(422, "Invalid", f"doc is missing path: \"{path}\": missing value")
    return cur, parts[-1]


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _container(doc, parts, path)
    try:
        return parent[int(last)] if isinstance(parent, list) else parent[last]
    except (KeyError, ValueError, IndexError, TypeError):
        raise ApiError(422, "Invalid", f"doc is missing path: \"{path}\": missing value") from None


def _remove(doc: Any, path: str) -> Any:
    parent, last = _container(doc, _pointer(path), path)
    try:
        if isinstance(parent, list):
            return parent.pop(int(last))
        return parent.pop(last)
    except (KeyError, ValueError, IndexError, TypeError):
        raise ApiError(422, "Invalid", f"doc is missing path: \"{path}\": missing value") from None


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _container(doc, parts, path)
    if isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
            return doc
        try:
            i = int(last)
        except ValueError:
            raise ApiError(422, "Invalid", f"invalid array index {last!r} in {path!r}") from None
        if i < 0 or i > len(parent) - (1 if replace else 0):
            raise ApiError(422, "Invalid", f"add operation index out of bounds: {path!r}")
        if replace:
            parent[i] = value
        else:
            parent.insert(i, value)
    elif isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(422, "Invalid", f"replace operation does not apply: doc is missing key: {path}")
        parent[last] = value
    else:
        raise ApiError(422, "Invalid", f"doc is missing path: \"{path}\": missing value")
    return doc


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 on a deep copy of ``doc``."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest",
                       "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = json_copy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op:
            raise ApiError(400, "BadRequest", "Unexpected kind: missing op")
        kind, path = op["op"], op.get("path", "")
        if kind == "add":
            doc = _add(doc, path, json_copy(op.get("value")))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            doc = _add(doc, path, json_copy(op.get("value")), replace=True)
        elif kind == "move":
            val = _remove(doc, op["from"])
            doc = _add(doc, path, val)
        elif kind == "copy":
            doc = _add(doc, path, json_copy(_get(doc, op["from"])))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(422, "Invalid", f"testing value {path} failed: test failed")
        else:
            raise ApiError(400, "BadRequest", f"Unexpected kind: {kind}")
    return doc


def _merge_key(field: str, path: tuple[str, ...]) -> str | None:
    if field == "ports":
        # Container ports merge by containerPort; Service ports by port.
        return "containerPort" if any(p.endswith("ontainers") for p in path) else "port"
    key = MERGE_KEYS.get(field)
    return key if key else None


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Strategic merge patch of ``patch`` onto ``target`` (neither is mutated)."""
    if not isinstance(patch, dict):
        return json_copy(patch)
    if patch.get("$patch") == "replace":
        return {k: json_copy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys") or k.startswith("$setElementOrder/"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            if isinstance(result.get(field), list):
                result[field] = [x for x in result[field] if x not in (v or [])]
            continue
        if v is None:
            result.pop(k, None)
            continue
        cur = result.get(k)
        if isinstance(v, dict):
            merged = strategic_merge(cur, v, (*path, k))
            if merged is None:
                result.pop(k, None)
            else:
                result[k] = merged
        elif isinstance(v, list):
            result[k] = _merge_list(k, cur, v, (*path, k))
        else:
            result[k] = v
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_list(field: str, cur: Any, patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    if field in MERGE_PRIMITIVES and isinstance(cur, list):
        out = list(cur)
        for x in patch:
            if x not in out:
                out.append(x)
        return out
    key = _merge_key(field, path)
    if key is None or not isinstance(cur, list) or not all(isinstance(x, dict) for x in patch):
        return [x for x in json_copy(patch) if not (isinstance(x, dict) and x.get("$patch"))]
    if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
        return [json_copy(x) for x in patch if not x.get("$patch")]
    out = [dict(x) if isinstance(x, dict) else x for x in cur]
    for item in patch:
        kv = item.get(key)
        idx = next((i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == kv), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(strategic_merge({}, item, path))
        else:
            out[idx] = strategic_merge(out[idx], item, path)
    return out
