"""Label and field selectors as the API server parses them from ``labelSelector`` / ``fieldSelector``.

A parsed selector is a list of requirements, each a small tuple, matched against a labels dict (or a
dict of selectable fields). Parse errors raise ``ApiError`` 400 BadRequest, as the real server answers.
"""

from __future__ import annotations

import re
from typing import Any

from kubesim.errors import ApiError

Requirement = tuple[str, str, tuple[str, ...]]  # (key, op, values); op in = != in notin exists !exists

_SET_RE = re.compile(r"^\s*([^\s!=,()]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")


def _split_top(s: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (x.strip() for x in parts) if p]


def parse_label_selector(s: str | None) -> list[Requirement]:
    if not s:
        return []
    reqs: list[Requirement] = []
    for part in _split_top(s):
        m = _SET_RE.match(part)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append((m.group(1), m.group(2), values))
            continue
        if part.startswith("!"):
            reqs.append((part[1:].strip(), "!exists", ()))
            continue
        for op in ("!=", "==", "="):
            if op in part:
                k, v = part.split(op, 1)
                k, v = k.strip(), v.strip()
                if not k or any(c in v for c in "=!() "):
                    raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
                reqs.append((k, "!=" if op == "!=" else "=", (v,)))
                break
        else:
            if any(c in part for c in " ()!="):
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {part!r}")
            reqs.append((part, "exists", ()))
    return reqs


def matches(reqs: list[Requirement], labels: dict[str, Any] | None) -> bool:
    labels = labels or {}
    for key, op, values in reqs:
        present = key in labels
        val = labels.get(key)
        if op == "=":
            if not present or val != values[0]:
                return False
        elif op == "!=":
            if present and val == values[0]:
                return False
        elif op == "in":
            if not present or val not in values:
                return False
        elif op == "notin":
            if present and val in values:
                return False
        elif op == "exists":
            if not present:
                return False
        elif op == "!exists" and present:
            return False
    return True


# Fields selectable per resource key beyond metadata.name / metadata.namespace (upstream field label sets).
SELECTABLE: dict[str, tuple[str, ...]] = {
    "pods": ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
             "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"),
    "events": ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
               "involvedObject.uid", "involvedObject.apiVersion", "involvedObject.resourceVersion",
               "involvedObject.fieldPath", "reason", "reportingComponent", "source", "type"),
    "secrets": ("type",),
    "namespaces": ("status.phase",),
    "nodes": ("spec.unschedulable",),
    "jobs.batch": ("status.successful",),
}


def parse_field_selector(res: str, s: str | None) -> list[Requirement]:
    if not s:
        return []
    reqs: list[Requirement] = []
    allowed = ("metadata.name", "metadata.namespace", *SELECTABLE.get(res, ()))
    for part in _split_top(s):
        for op in ("!=", "==", "="):
            if op in part:
                k, v = part.split(op, 1)
                k = k.strip()
                if k not in allowed:
                    raise ApiError(400, "BadRequest",
                                   f'field label not supported: {k}')
                reqs.append((k, "!=" if op == "!=" else "=", (v.strip(),)))
                break
        else:
            raise ApiError(400, "BadRequest", f"invalid selector: '{s}'; can't understand '{part}'")
    return reqs


def field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for p in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(p)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def field_matches(reqs: list[Requirement], obj: dict[str, Any]) -> bool:
    return matches(reqs, {k: field_value(obj, k) for k, _, _ in reqs})
