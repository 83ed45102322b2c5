"""Server-side apply, simplified: field ownership per Apply manager, conflicts, and removal of dropped fields.

Ownership is tracked in ``metadata.managedFields`` (``fieldsType: FieldsV1``) at the granularity of map
keys: lists are atomic, as for the ``atomic`` list type, except a custom resource's ``listType: map`` lists,
merged and owned item by item (:func:`keyed`; the item's entry is ``f:k:{...}``, not upstream's ``k:{...}``). Applying a value another manager (Apply or Update,
see :mod:`kubesim.managed`) owns with a different value is a 409 Conflict unless ``force``; with ``force``
the other manager loses the field. Fields a manager applied before and omits now are removed unless another
manager (Apply or Update) still owns them.
"""

from __future__ import annotations

from typing import Any

import orjson

from kubesim import managed
from kubesim.errors import ApiError
from kubesim.records import json_copy

Path = tuple[str, ...]
_META_KEYS = ("labels", "annotations", "finalizers", "ownerReferences")


def map_lists(schema: Any, prefix: Path = ()) -> dict[Path, tuple[str, ...]]:
    """The ``x-kubernetes-list-type: map`` lists a CRD schema declares (path -> their keys), reached through
    object properties only (not inside other lists)."""
    out: dict[Path, tuple[str, ...]] = {}
    if not isinstance(schema, dict):
        return out
    if schema.get("type") == "array" and schema.get("x-kubernetes-list-type") == "map" and prefix:
        out[prefix] = tuple(str(k) for k in schema.get("x-kubernetes-list-map-keys") or ())
        return out
    for name, sub in (schema.get("properties") or {}).items():
        out.update(map_lists(sub, (*prefix, str(name))))
    return out


def keyed(obj: dict[str, Any], lists: dict[Path, tuple[str, ...]]) -> dict[str, Any]:
    """``obj`` with each map list as a map from its items' keys (``k:{"name":"a"}``) to the items, so that an
    apply merges and owns them item by item, as structured-merge-diff does; :func:`unkeyed` turns them back."""
    out: dict[str, Any] = json_copy(obj)
    for path, keys in lists.items():
        found, value = _get(out, path)
        if found and isinstance(value, list) and all(isinstance(i, dict) for i in value):
            parent = _get(out, path[:-1])[1]
            parent[path[-1]] = {_item_key(i, keys): i for i in value}
    return out


def unkeyed(obj: dict[str, Any], lists: dict[Path, tuple[str, ...]]) -> dict[str, Any]:
    for path in lists:
        found, value = _get(obj, path)
        if found and isinstance(value, dict):
            _get(obj, path[:-1])[1][path[-1]] = [i for i in value.values() if isinstance(i, dict) and i]
    return obj


def _item_key(item: dict[str, Any], keys: tuple[str, ...]) -> str:
    return "k:" + orjson.dumps({k: item.get(k) for k in keys}, option=orjson.OPT_SORT_KEYS).decode()


def applied_part(obj: dict[str, Any]) -> dict[str, Any]:
    """The part of an applied configuration that can be owned (no identity or server-set metadata)."""
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k in _META_KEYS}
    if meta:
        out["metadata"] = meta
    return out


def leaves(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Leaf paths of nested maps (lists and scalars are leaves)."""
    if not isinstance(obj, dict) or (not obj and prefix):
        return {prefix: obj}
    out: dict[Path, Any] = {}
    for k, v in obj.items():
        out.update(leaves(v, (*prefix, k)))
    return out


def to_fields_v1(paths: list[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for p in paths:
        cur = root
        for part in p:
            cur = cur.setdefault(f"f:{part}", {})
    return root


def from_fields_v1(fields: Any, prefix: Path = ()) -> set[Path]:
    if not isinstance(fields, dict) or not fields:
        return {prefix} if prefix else set()
    out: set[Path] = set()
    for k, v in fields.items():
        if k.startswith("f:"):
            out |= from_fields_v1(v, (*prefix, k[2:]))
    return out


def _get(obj: Any, path: Path) -> tuple[bool, Any]:
    cur = obj
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return False, None
        cur = cur[p]
    return True, cur


def _remove(obj: dict[str, Any], path: Path) -> None:
    cur: Any = obj
    for p in path[:-1]:
        if not isinstance(cur, dict) or p not in cur:
            return
        cur = cur[p]
    if isinstance(cur, dict):
        cur.pop(path[-1], None)


def _prune_emptied(obj: dict[str, Any], path: Path, mine: dict[Path, Any], still_owned: set[Path]) -> None:
    """A map left empty by removing the fields an applier dropped goes too, and so on upwards, unless the new
    configuration or another applier still holds something at or below it (structured-merge-diff removes a
    struct whose owned fields are all dropped: Kueue's release of ``status.admission`` leaves no ``{}``)."""
    while path:
        found, cur = _get(obj, path)
        if not found or cur != {} or any(_overlaps(path, p) for p in mine) \
                or any(_overlaps(path, o) for o in still_owned):
            return
        _remove(obj, path)
        path = path[:-1]


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


def _who(e: dict[str, Any]) -> str:
    """printManager: an Update manager is named with its apiVersion and time, a subresource's says so."""
    who = orjson.dumps(str(e.get("manager") or "")).decode()
    if e.get("subresource"):
        who += f' with subresource {orjson.dumps(str(e["subresource"])).decode()}'
    if e.get("operation") == "Update":
        who += f" using {e.get('apiVersion') or ''}" + (f" at {e['time']}" if e.get("time") else "")
    return who


def _conflict_error(conflicts: list[tuple[str, Path]]) -> ApiError:
    """NewConflictError: the causes, and the message inline for one conflict or grouped per manager."""
    causes = [{"reason": "FieldManagerConflict", "message": f"conflict with {who}", "field": "." + ".".join(p)}
              for who, p in conflicts]
    if len(conflicts) == 1:
        text = f"Apply failed with 1 conflict: conflict with {conflicts[0][0]}: {causes[0]['field']}"
    else:
        lines: list[str] = []
        for who in sorted({w for w, _ in conflicts}):
            lines.append(f"conflicts with {who}:")
            lines += ["- ." + ".".join(p) for w, p in sorted(conflicts, key=lambda c: c[1]) if w == who]
        text = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(409, "Conflict", text, {"causes": causes})


def plan(current: dict[str, Any], applied: dict[str, Any], manager: str, subresource: str | None,
         force: bool, api_version: str, stamp: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Return (object with dropped fields removed, new managedFields); raise 409 on conflicts with any other
    manager of the same subresource (Update ones too) over a field whose value the apply changes."""
    mine = leaves(applied_part(applied))
    entries = json_copy((current.get("metadata") or {}).get("managedFields") or [])
    key = (manager, "Apply", subresource)
    previous: set[Path] = set()
    others: list[tuple[dict[str, Any], set[Path]]] = []
    kept: list[dict[str, Any]] = []
    for e in entries:
        ek = (e.get("manager"), e.get("operation"), e.get("subresource"))
        if ek == key:
            previous = from_fields_v1(e.get("fieldsV1"))
            continue
        kept.append(e)
        if e.get("subresource") == subresource:
            others.append((e, managed.decode_fields(e.get("fieldsV1"))))
    conflicts: list[tuple[str, Path]] = []
    for path, value in mine.items():
        for e, owned in others:
            hit = [o for o in owned if o[:len(path)] == path]  # the field itself or what lies below it
            if not hit:
                continue
            found, cur = _get(current, path)
            if found and cur == value:
                continue  # shared ownership of an equal value is no conflict
            if force:
                for o in hit:
                    owned.discard(o)
                e["fieldsV1"] = managed.encode_fields(owned)
            else:
                conflicts.append((_who(e), path))
    if conflicts:
        raise _conflict_error(conflicts)
    result = json_copy(current)
    # structured-merge-diff's prune adds back what any other manager owns (addBackOwnedItems), Update ones too
    still_owned = set().union(*(o for _, o in others)) if others else set()
    for path in previous - set(mine):
        # A main-resource applier never drops status fields, a status applier only status fields.
        if (path[:1] == ("status",)) != (subresource == "status"):
            continue
        if not any(_overlaps(path, o) for o in still_owned):
            _remove(result, path)
            _prune_emptied(result, path[:-1], mine, still_owned)
    entry: dict[str, Any] = {"manager": manager, "operation": "Apply", "apiVersion": api_version, "time": stamp,
                             "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(sorted(mine))}
    if subresource:
        entry["subresource"] = subresource
    kept = [e for e in kept if e.get("fieldsV1")]
    return result, [*kept, entry]
