"""``ApiError``: a failure that carries a Kubernetes ``Status`` (code, reason, message, details).

The store raises it; the HTTP layer turns it into the response body the official client parses into
``ApiException``. Helpers build the common statuses, and the field causes of a 422, with upstream's wording
(apimachinery's ``pkg/api/errors`` and ``pkg/util/validation/field/errors.go``).
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


OPTIMISTIC_LOCK = "the object has been modified; please apply your changes to the latest version and try again"


def conflict(plural: str, group: str, name: str, why: str = OPTIMISTIC_LOCK) -> ApiError:
    """NewConflict (``plural`` is whatever names the resource: BeforeDelete passes the kind)."""
    d: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        d["group"] = group
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {why}', d)


def storage_key(plural: str, group: str, namespace: str, name: str, builtin: bool) -> str:
    """The etcd key a real server keeps an object under (default prefix /registry), as StorageError prints it."""
    prefix = {"services": "services/specs", "nodes": "minions",
              "customresourcedefinitions": "apiextensions.k8s.io/customresourcedefinitions"}.get(plural, plural)
    if not builtin:
        prefix = f"{group}/{plural}"
    return f"/registry/{prefix}/{namespace}/{name}" if namespace else f"/registry/{prefix}/{name}"


def precondition_failed(plural: str, group: str, name: str, key: str, detail: str) -> ApiError:
    """A storage precondition (Preconditions.Check: StorageError invalid object) reported as a Conflict."""
    return conflict(plural, group, name, f"StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, "
                                         f"AdditionalErrorMsg: Precondition failed: {detail}")


def options_invalid(kind: str, causes: list[dict[str, str]]) -> ApiError:
    """A request's CreateOptions / UpdateOptions / PatchOptions / DeleteOptions refused (meta.k8s.io)."""
    return invalid(kind, "meta.k8s.io", "", causes)


def forbidden(plural: str, group: str, name: str, why: str) -> ApiError:
    d: dict[str, Any] = {"name": name, "kind": plural}
    if group:
        d["group"] = group
    return ApiError(403, "Forbidden", f'{_qualified(plural, group)} "{name}" is forbidden: {why}', d)


def namespace_terminating(plural: str, group: str, name: str, namespace: str) -> ApiError:
    """The namespace lifecycle admission plugin's refusal: Forbidden plus a NamespaceTerminating cause."""
    err = forbidden(plural, group, name,
                    f"unable to create new content in namespace {namespace} because it is being terminated")
    assert err.details is not None
    err.details["causes"] = [{"reason": "NamespaceTerminating", "message": f"namespace {namespace} is being "
                              "terminated", "field": "metadata.namespace"}]
    return err


def invalid(kind: str, group: str, name: str, causes: list[dict[str, str]]) -> ApiError:
    """422 Invalid; each cause is {"reason", "message", "field"} like field.Error renders."""
    msgs = [f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes]
    text = msgs[0] if len(msgs) == 1 else "[" + ", ".join(msgs) + "]"
    d: dict[str, Any] = {"name": name, "kind": kind, "causes": causes}
    if group:
        d["group"] = group
    for k in ("name", "kind"):  # omitempty, as metav1.StatusDetails marshals them
        if not d[k]:
            del d[k]
    return ApiError(422, "Invalid", f'{kind}.{group} "{name}" is invalid: {text}' if group
                    else f'{kind} "{name}" is invalid: {text}', d)


def too_long(field: str, max_length: int) -> dict[str, str]:
    """field.TooLong: the value is left out, the limit is worded in bytes whatever was counted."""
    unit = "byte" if max_length == 1 else "bytes"
    return {"reason": "FieldValueTooLong", "message": f"Too long: may not be more than {max_length} {unit}",
            "field": field}


def too_many(field: str, actual: int, max_quantity: int) -> dict[str, str]:
    """field.TooMany: the count given, then the limit in items."""
    unit = "item" if max_quantity == 1 else "items"
    return {"reason": "FieldValueTooMany", "message": f"Too many: {actual}: must have at most {max_quantity} {unit}",
            "field": field}
