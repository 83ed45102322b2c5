"""Kubeflow v1 job conditions: ``set_condition`` with the training-operator's exact semantics.

KUBEFLOW.md A.6: once a ``Failed=True`` condition exists nothing changes any more; the same
type with the same status and reason is a no-op; a reason-only change keeps
``lastTransitionTime``; Running and Restarting exclude each other; Succeeded or Failed flip
an existing Running to False; the new condition always goes to the end of the list (the
printer column reads the last one).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from federation.clock import rfc3339 as rfc3339  # (the reconcilers import it from here)

CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
SUCCEEDED = "Succeeded"
SUSPENDED = "Suspended"
FAILED = "Failed"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def get_condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == ctype:
            return dict(cond)
    return None


def has_true(status: dict[str, Any], ctype: str) -> bool:
    for cond in status.get("conditions") or []:
        if cond.get("type") == ctype:
            return bool(cond.get("status") == "True")
    return False


def is_finished(status: dict[str, Any]) -> bool:
    return has_true(status, SUCCEEDED) or has_true(status, FAILED)


def _filter_out(conditions: list[dict[str, Any]], ctype: str) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    for cond in conditions:
        other = cond.get("type")
        if ctype == RESTARTING and other == RUNNING:
            continue
        if ctype == RUNNING and other == RESTARTING:
            continue
        if other == ctype:
            continue
        if ctype in (FAILED, SUCCEEDED) and other == RUNNING:
            cond = {**cond, "status": "False"}
        kept.append(cond)
    return kept


def set_condition(status: dict[str, Any], ctype: str, cstatus: str, reason: str, message: str,
                  now: datetime) -> bool:
    """Apply one condition update in place; True when the list changed."""
    if has_true(status, FAILED):
        return False
    current = get_condition(status, ctype)
    if current is not None and current.get("status") == cstatus and current.get("reason") == reason:
        return False
    stamp = rfc3339(now)
    condition = {"type": ctype, "status": cstatus, "reason": reason, "message": message,
                 "lastUpdateTime": stamp, "lastTransitionTime": stamp}
    if current is not None and current.get("status") == cstatus:
        condition["lastTransitionTime"] = current.get("lastTransitionTime", stamp)
    status["conditions"] = [*_filter_out(list(status.get("conditions") or []), ctype), condition]
    return True
