"""Small helpers the simulated components share: timestamps, pod keys, conditions and Events.

Owns the shape of what the simulated scheduler, kubelet and Job controller write that is not
specific to one of them: RFC 3339 timestamps as the API server renders them, condition lists
updated the way controllers update them (lastTransitionTime moves only when status flips), and
core/v1 Events recorded best effort through the Store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Mapping
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger("kubesim.sim")

Key = tuple[str, str]
"""(namespace, name) of a namespaced object."""

ANNOTATION_PREFIX = "kubesim.mkd.dev/"
START_SECONDS = ANNOTATION_PREFIX + "start-seconds"
RUN_SECONDS = ANNOTATION_PREFIX + "run-seconds"
EXIT_CODE = ANNOTATION_PREFIX + "exit-code"
FAIL_ATTEMPTS = ANNOTATION_PREFIX + "fail-attempts"
RUN_FOREVER = ANNOTATION_PREFIX + "run-forever"
TERMINATION_SECONDS = ANNOTATION_PREFIX + "termination-seconds"


class StoreLike(Protocol):
    """The part of ``kubesim.store.Store`` the simulation uses (see the module docstring there)."""

    rng: Any
    spec: Any
    catalogue: Any

    def get(self, res: str, namespace: str | None, name: str) -> dict[str, Any] | None: ...
    def list(self, res: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> list[dict[str, Any]]: ...
    def create(self, res: str, obj: dict[str, Any]) -> dict[str, Any]: ...
    def update(self, res: str, obj: dict[str, Any], subresource: str | None = None) -> dict[str, Any]: ...
    def update_rec(self, res: str, obj: dict[str, Any], subresource: str | None = None) -> Any: ...
    def patch(self, res: str, namespace: str | None, name: str, patch: Any, patch_type: str = "merge",
              subresource: str | None = None) -> dict[str, Any]: ...
    def delete(self, res: str, namespace: str | None, name: str,
               propagation: str = "Background") -> dict[str, Any] | None: ...
    def subscribe(self, fn: Any, resources: Any = None) -> Any: ...


K = TypeVar("K", bound=Hashable)


class Batched(Generic[K]):
    """The event loop of a stand-in controller (LWS, AppWrapper, KubeRay, the generic operator): store events
    mark keys, and one loop callback soon after reconciles each key marked meanwhile once, so a burst of events
    about one object costs one pass; a reconcile that raises is logged and the rest of the batch goes on."""

    name = "controller"
    """Names the controller in the log line of a failed reconcile."""

    def __init__(self, store: StoreLike, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self.dirty: dict[K, None] = {}
        self._handle: asyncio.Handle | None = None
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True
        if self._handle is not None:
            self._handle.cancel()

    def _mark(self, key: K) -> None:
        self.dirty[key] = None
        if self._handle is None and not self.stopped:
            self._handle = self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._handle = None
        batch, self.dirty = list(self.dirty), {}
        for key in batch:
            try:
                self.reconcile(key)
            except Exception:
                log.exception("%s: %s reconcile failed", self.name, key)

    def reconcile(self, key: K) -> None:
        raise NotImplementedError


_stamp_cache: tuple[int, str] = (0, "")


def now_ts(when: float | None = None) -> str:
    """RFC 3339 UTC with second precision, as metav1.Time serialises."""
    global _stamp_cache
    second = int(time.time() if when is None else when)
    if _stamp_cache[0] == second:
        return _stamp_cache[1]
    text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _stamp_cache = (second, text)
    return text


def parse_ts(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


def find_condition(conditions: list[dict[str, Any]] | None, ctype: str) -> dict[str, Any] | None:
    for cond in conditions or ():
        if cond.get("type") == ctype:
            return cond
    return None


def set_condition(conditions: list[dict[str, Any]], ctype: str, status: str, reason: str | None = None,
                  message: str | None = None, *, now: str | None = None,
                  probe_times: bool = False) -> bool:
    """Set one condition in place; True when something changed. Keeps lastTransitionTime unless
    the status flips, as apimachinery's SetStatusCondition does."""
    stamp = now or now_ts()
    cond = find_condition(conditions, ctype)
    if cond is None:
        cond = {"type": ctype, "status": status}
        if probe_times:
            cond["lastProbeTime"] = None
        cond["lastTransitionTime"] = stamp
        if reason is not None:
            cond["reason"] = reason
        if message is not None:
            cond["message"] = message
        conditions.append(cond)
        return True
    changed = False
    if cond.get("status") != status:
        cond["status"] = status
        cond["lastTransitionTime"] = stamp
        changed = True
    for field, value in (("reason", reason), ("message", message)):
        if value is not None and cond.get(field) != value:
            cond[field] = value
            changed = True
    return changed


def record_event(store: StoreLike, involved: Mapping[str, Any], *, kind: str, api_version: str,
                 type_: str, reason: str, message: str, component: str) -> None:
    """A core/v1 Event about ``involved``; never raises (events are best effort, as in client-go)."""
    meta = involved.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    stamp = now_ts()
    suffix = f"{store.rng.getrandbits(64):016x}"
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta.get('name', 'unknown')}.{suffix}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": api_version,
            "kind": kind,
            "name": meta.get("name"),
            "namespace": namespace,
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": "",
    }
    try:
        store.create("events", event)
    except Exception as exc:  # an event must never break the controller that records it
        log.debug("event %s on %s/%s not recorded: %s", reason, namespace, meta.get("name"), exc)


def annotation(obj: Mapping[str, Any], key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return value if isinstance(value, str) else None
