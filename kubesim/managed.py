"""``metadata.managedFields`` entries of the writers that do not apply: one ``Update`` entry per field manager.

A create, update or patch sent through the API records, for its field manager (the ``fieldManager`` query
parameter, else the User-Agent up to its first ``/``), the fields it added or changed, as apiserver's
field manager does (structured-merge-diff's ``Updater.Update``, always forced): those fields leave every
other manager's set (Apply managers' too), removed fields leave every set, and a manager left with no field
loses its entry. A map that the write brought into being is owned with its ``.`` marker. Lists are atomic,
as in :mod:`kubesim.apply`. Entries are ordered as apiserver encodes them: Apply before Update, then by time,
manager and subresource; an entry's time moves only when its set changes.
"""

from __future__ import annotations

from typing import Any

Path = tuple[str, ...]

# fieldmanager's strip set: identity and server-set metadata are nobody's fields.
_STRIPPED_META = ("name", "namespace", "creationTimestamp", "selfLink", "uid", "generation", "managedFields",
                  "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds")


def manager_of(field_manager: str | None, user_agent: str) -> str:
    """managerOrUserAgent: the fieldManager given, else the User-Agent's prefix before the first ``/``."""
    if field_manager:
        return field_manager
    return user_agent.split("/", 1)[0][:128]


def _owned_part(obj: dict[str, Any], subresource: str | None, has_status: bool) -> dict[str, Any]:
    """What a write on the main resource or on /status may own (the strategy's reset fields excluded)."""
    if subresource == "status":
        return {"status": obj["status"]} if "status" in obj else {}
    out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    if has_status:
        out.pop("status", None)
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in _STRIPPED_META}
    if meta:
        out["metadata"] = meta
    return out


def _nodes(obj: Any, prefix: Path, out: dict[Path, Any]) -> None:
    """Every node below the root: maps (marked by ``_MAP``) and leaves (scalars and atomic lists)."""
    if isinstance(obj, dict):
        if prefix:
            out[prefix] = _MAP
        for k, v in obj.items():
            _nodes(v, (*prefix, k), out)
    else:
        out[prefix] = obj


_MAP = object()


def encode_fields(paths: set[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for p in sorted(paths):
        cur = root
        for part in p:
            cur = cur.setdefault(f"f:{part}", {})
        cur.setdefault(".", {})
    return _drop_lone_markers(root)


def _drop_lone_markers(node: dict[str, Any]) -> dict[str, Any]:
    """A member with no members below it is written ``{}``; ``.`` only says so for a node with children."""
    out: dict[str, Any] = {}
    for k, v in node.items():
        if k == ".":
            continue
        out[k] = _drop_lone_markers(v)
    if "." in node and out:
        return {".": {}, **out}
    return out


def decode_fields(fields: Any, prefix: Path = ()) -> set[Path]:
    if not isinstance(fields, dict) or not fields:
        return {prefix} if prefix else set()
    out: set[Path] = set()
    for k, v in fields.items():
        if k == ".":
            if prefix:
                out.add(prefix)
        elif k.startswith("f:"):
            out |= decode_fields(v, (*prefix, k[2:]))
    return out


def _touches(owned: Path, changed: set[Path]) -> bool:
    return any(owned[:len(c)] == c for c in changed)


def record_update(old: dict[str, Any] | None, new: dict[str, Any], manager: str, subresource: str | None,
                  has_status: bool, stamp: str) -> None:
    """Set ``new``'s managedFields for a non-apply write of ``manager`` (``old`` is None on create)."""
    meta = new.setdefault("metadata", {})
    entries: list[dict[str, Any]] = [dict(e) for e in ((old or {}).get("metadata") or {}).get("managedFields") or []]
    before: dict[Path, Any] = {}
    after: dict[Path, Any] = {}
    if old is not None:
        _nodes(_owned_part(old, subresource, has_status), (), before)
    _nodes(_owned_part(new, subresource, has_status), (), after)
    for nodes in (before, after):
        nodes.pop(("metadata",), None)  # in the strip set itself: only fields below it are owned
    added = {p for p in after if p not in before}
    modified = {p for p, v in after.items() if p in before and v is not _MAP and before[p] != v}
    removed = {p for p in before if p not in after}
    changed = added | modified | removed
    key = (manager, "Update", subresource)
    mine: set[Path] = set()
    mine_entry: dict[str, Any] | None = None
    kept: list[dict[str, Any]] = []
    for e in entries:
        if (e.get("manager"), e.get("operation"), e.get("subresource")) == key:
            mine, mine_entry = decode_fields(e.get("fieldsV1")), e
            continue
        if changed:
            owned = decode_fields(e.get("fieldsV1"))
            left = {p for p in owned if not _touches(p, changed)}
            if left != owned:
                if not left:
                    continue
                e["fieldsV1"] = encode_fields(left)
        kept.append(e)
    now_mine = (mine - removed) | added | modified
    if now_mine:
        if mine_entry is not None and now_mine == mine:
            kept.append(mine_entry)
        else:
            entry: dict[str, Any] = {"manager": manager, "operation": "Update",
                                     "apiVersion": new.get("apiVersion") or "", "time": stamp,
                                     "fieldsType": "FieldsV1", "fieldsV1": encode_fields(now_mine)}
            if subresource:
                entry["subresource"] = subresource
            kept.append(entry)
    kept.sort(key=lambda e: (e.get("operation") or "", e.get("time") or "", e.get("manager") or "",
                             e.get("subresource") or ""))
    if kept:
        meta["managedFields"] = kept
    else:
        meta.pop("managedFields", None)
