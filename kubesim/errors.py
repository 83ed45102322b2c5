"""``ApiError``: a failure that carries a Kubernetes ``Status`` (code, reason, message, details).

The store raises it; the HTTP layer turns it into the response body the official client parses into
``ApiException``. Helpers build the common statuses with upstream's wording.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An API failure with the fields of a metav1.Status."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
        }
        if self.reason:  # "Unknown" is the empty reason, omitted like any empty field
            body["reason"] = self.reason
        body["code"] = self.code
        if self.details is not None:
            body["details"] = self.details
        return body


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(plural, group)} "{name}" not found',
                    {"name": name, "group": group, "kind": plural} if group else {"name": name, "kind": plural})


def already_exists(plural: str, group: str, name: str) -> ApiError:
    d: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        d["group"] = group
    return ApiError(409, "AlreadyExists", f'{_qualified(plural, group)} "{name}" already exists', d)


def conflict(plural: str, group: str, name: str) -> ApiError:
    d: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        d["group"] = group
    return ApiError(409, "Conflict",
                    f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again", d)


def invalid(kind: str, group: str, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid; each cause is {"reason", "message", "field"} like field.Error renders."""
    msgs = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    text = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
    d: dict[str, Any] = {"name": name, "kind": kind, "causes": causes}
    if group:
        d["group"] = group
    return ApiError(422, "Invalid", f'{kind}.{group} "{name}" is invalid: {text}' if group
                    else f'{kind} "{name}" is invalid: {text}', d)
