"""The agent's view of a worker cluster: per-resource object caches fed by informers and by its own writes.

An informer can lag behind the agent's own writes; reconciling from a stale copy would create a
pod twice or re-add a condition. So a cache keeps, per object, the newest version by
resourceVersion, whether it came from a watch event or from the response to the agent's own
create / replace; a local delete leaves a tombstone so a late watch event of the old object
cannot resurrect it. Pods are trimmed to what reconcilers and capacity need (metadata and status,
plus the spec fields the scheduler counts) and every object is held as compact JSON next to a small
header, so 20,000 pods fit in little memory. A pod's node is kept for capacity only (``pod_usage``),
not in the pod reconcilers read. ``upsert`` says whether a watched object changed in anything
reconcilers read (``Stored``), so a watch event that changed nothing does not cost its job a pass.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from federation.kinds.kubeflow import KubeflowV1Kind
from federation.kinds.pod import MEMBERS_ANNOTATION
from federation.kinds.registry import KINDS

Key = tuple[str, str]
"""(namespace, name); namespace "" for cluster-scoped objects."""

_DROP_META = ("managedFields",)
_POD_SPEC_KEEP = ("nodeName", "containers", "initContainers", "overhead", "restartPolicy")


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def rv_of(obj: Mapping[str, Any] | None) -> int:
    """resourceVersion as an integer (kube-apiserver and kubesim both use etcd revisions); -1 if unknown."""
    if not obj:
        return -1
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(raw))
    except (TypeError, ValueError):
        return -1


_POD_STATUS_KEEP = ("phase", "reason", "message", "conditions", "containerStatuses",
                    "initContainerStatuses", "startTime")
_CONTAINER_STATUS_KEEP = ("name", "ready", "restartCount", "state", "lastState")
_CONTAINER_KEEP = ("name", "resources", "restartPolicy")
_SLIM_META = ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "deletionTimestamp",
              "finalizers")
KUBEFLOW_OPERATOR_LABEL = "training.kubeflow.org/operator-name"
V1_OPERATORS = frozenset(k.operator_name for k in KINDS if isinstance(k, KubeflowV1Kind))
"""Services of these operators are never updated by the agent, so a slim copy is enough."""


def trim(obj: dict[str, Any], plural: str) -> dict[str, Any]:
    """Shrink ``obj`` in place to what reconcilers, reports and capacity read, and return it.

    In place on purpose: the informer that produced the object keeps a reference to it for its
    relist bookkeeping, so trimming a copy would leave the full object alive twice.
    """
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for key in _DROP_META:
            meta.pop(key, None)
    if plural == "services" and ((meta or {}).get("labels") or {}).get(KUBEFLOW_OPERATOR_LABEL) in V1_OPERATORS:
        # per-index Services of the Kubeflow v1 family: the render reads names and labels only (they are
        # listed by label, never by owner), and a change requeues the job through its job-name label
        obj.clear()
        obj["metadata"] = {k: v for k, v in (meta or {}).items() if k in _SLIM_META and k != "ownerReferences"}
        return obj
    if plural == "pods":
        _trim_pod(obj, meta)
    return obj


def _slim_state(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, dict):
            kept = {}
            if "exitCode" in v:
                kept["exitCode"] = v["exitCode"]
            for key in ("reason", "startedAt", "finishedAt"):  # the times: kubectl describe on the manager
                if key in v:
                    kept[key] = v[key]
            out[k] = kept
    return out


def _trim_pod(obj: dict[str, Any], meta: Any) -> None:
    """``trim`` of a pod: each part rebuilt from the few keys kept (a watched pod has dozens that are not;
    deleting them one by one cost twice as much). The parts replaced are the informer's own: ``obj`` itself
    is changed in place, so what the informer holds shrinks with it.

    Plain loops, not comprehensions: each comprehension is a function call of its own on Python 3.11, and a
    pod took about a dozen (3 watch events and a create answer per pod)."""
    if isinstance(meta, dict):
        slim = {}
        for k in _SLIM_META:
            if k in meta:
                slim[k] = meta[k]
        refs = slim.get("ownerReferences")
        if refs:  # the controller's uid is all that is read (pods are filtered to their controller)
            controllers = []
            for r in refs:
                if r.get("controller"):
                    controllers.append({"uid": r.get("uid"), "controller": True})
            slim["ownerReferences"] = controllers
        annotations = meta.get("annotations")
        if annotations and MEMBERS_ANNOTATION in annotations:  # a pod group's lead: the pods it makes
            slim["annotations"] = {MEMBERS_ANNOTATION: annotations[MEMBERS_ANNOTATION]}
        obj["metadata"] = slim
    spec = obj.get("spec")
    if isinstance(spec, dict):
        kept_spec = {}
        for k in _POD_SPEC_KEEP:
            if k in spec:
                kept_spec[k] = spec[k]
        obj["spec"] = spec = kept_spec
        for key in ("containers", "initContainers"):
            containers = spec.get(key)
            if containers:
                slim_containers = []
                for c in containers:
                    kept = {}
                    for k in _CONTAINER_KEEP:
                        if k in c:
                            kept[k] = c[k]
                    slim_containers.append(kept)
                spec[key] = slim_containers
    status = obj.get("status")
    if isinstance(status, dict):
        slim_status = {}
        for k in _POD_STATUS_KEEP:
            if k in status:
                slim_status[k] = status[k]
        ready = []
        for c in status.get("conditions") or []:
            if c.get("type") == "Ready":
                ready.append({"type": "Ready", "status": c.get("status")})
        slim_status["conditions"] = ready
        for key in ("containerStatuses", "initContainerStatuses"):
            statuses = slim_status.get(key)
            if not statuses:
                continue
            slim_statuses = []
            for full in statuses:
                cs = {}
                for k in _CONTAINER_STATUS_KEEP:
                    if k in full:
                        cs[k] = full[k]
                state = cs.get("state")
                if isinstance(state, dict):
                    cs["state"] = _slim_state(state)
                last = cs.get("lastState")
                if isinstance(last, dict):
                    slim_last = _slim_state(last)
                    if any(slim_last.values()):
                        cs["lastState"] = slim_last
                    else:
                        del cs["lastState"]
                slim_statuses.append(cs)
            slim_status[key] = slim_statuses
        obj["status"] = slim_status
    for key in [k for k in obj if k not in ("metadata", "spec", "status")]:
        del obj[key]


class Stored(enum.IntEnum):
    """What ``ObjectCache.upsert`` did with an object; falsy only when it was refused."""

    REFUSED = 0
    """Older than the version held, or deleted here."""
    HELD = 1
    """The version held already (the watch echoing the agent's own write)."""
    SAME_CONTENT = 2
    """A newer version from the watch in which nothing a reconciler reads changed (only its resourceVersion, or
    a pod's node): the previous one came from the watch too, so whoever needed to hear of it already did."""
    CHANGED = 3


OWN_VERSIONS = 4096
"""Versions from the agent's own writes remembered per cache for ``ObjectCache.echo``: their echoes come within
moments (a reconcile pass creates a handful of objects, and passes waiting are bounded by ``backlog_max``); an
echo whose version was forgotten is decoded and stored as any watch event is."""

_HEADER_META = ("name", "namespace", "uid", "resourceVersion", "labels", "ownerReferences", "deletionTimestamp")


def pack(obj: Mapping[str, Any]) -> bytes:
    """``obj`` as compact JSON in an exact-size buffer. orjson's own output is over-allocated (40,000 trimmed
    pods: 159 MiB as returned, 32 MiB copied); the copy costs ~2 us. zlib made them half as large again but
    cost ~20 us per write and ~7 us per read: a pass reads five objects, a job is written ~11 times."""
    return bytes(memoryview(orjson.dumps(obj)))


def _shrink(obj: dict[str, Any]) -> dict[str, Any]:
    """Shrink ``obj`` in place to its header and return the header's metadata: the informer that yielded
    the dict keeps this very object, so only what the header holds stays alive."""
    meta = obj.get("metadata") or {}
    header_meta = {}
    for k in _HEADER_META:  # a loop: a comprehension is a call of its own (every upsert shrinks once)
        if k in meta:
            header_meta[k] = meta[k]
    obj.clear()
    obj["metadata"] = header_meta
    return header_meta


class ObjectCache:
    """One resource's objects: a small header per object plus the object itself as compact JSON.

    The header (name, namespace, uid, resourceVersion, labels, owner references, deletion time) is
    what indexes and owner lookups read; it is the informer's own dict shrunk in place, so the
    informer's bookkeeping costs nothing extra. The full (trimmed) object is kept as orjson bytes and
    decoded on ``get`` / ``select`` -- a few objects per reconcile pass -- which holds 5,000 jobs
    with 40,000 children in well under the agent's memory budget. Decoded objects are fresh copies
    the caller may change.

    ``select`` is called on every reconcile pass; scanning a namespace of 20,000 pods each time would
    make the agent quadratic, so the first equality term of a selector is answered from an index on
    that label key (built the first time the key is asked for, then kept up to date).
    """

    def __init__(self, plural: str) -> None:
        self.plural = plural
        self.headers: dict[Key, dict[str, Any]] = {}
        self.raw: dict[Key, bytes] = {}
        self.by_namespace: dict[str, dict[str, dict[str, Any]]] = {}
        self.tombstones: dict[Key, int] = {}
        self.indexes: dict[str, dict[tuple[str, str], dict[str, dict[str, Any]]]] = {}
        """label key -> (namespace, label value) -> name -> header."""
        self.pod_usage: dict[Key, tuple[str, str | None, bytes]] = {}
        """pods only: (phase, nodeName, request shape as JSON) for capacity, without decoding pods."""
        self._shapes: dict[bytes, bytes] = {}
        self._unwatched: set[Key] = set()
        """Keys whose stored version came from the agent's own write and has not come from the watch yet."""
        self._own: dict[int, Key] = {}
        """resourceVersion -> key of the versions stored from the agent's own writes, for ``echo`` (the newest
        ``OWN_VERSIONS``; an entry whose version is no longer held, or came from the watch, is ignored)."""

    def __len__(self) -> int:
        return len(self.headers)

    def get(self, key: Key) -> dict[str, Any] | None:
        raw = self.raw.get(key)
        return None if raw is None else self._decode(key, raw)

    def _decode(self, key: Key, raw: bytes) -> dict[str, Any]:
        obj: dict[str, Any] = orjson.loads(raw)
        rv = self.headers[key]["metadata"].get("resourceVersion")
        if rv is not None:  # kept in the header only, so that ``raw`` compares equal across versions
            obj.setdefault("metadata", {})["resourceVersion"] = rv
        return obj

    def header(self, key: Key) -> dict[str, Any] | None:
        return self.headers.get(key)

    def keys(self) -> list[Key]:
        return list(self.headers)

    def values(self) -> list[dict[str, Any]]:
        """Every object, decoded (a snapshot; costs a decode per object)."""
        return [self._decode(key, raw) for key, raw in list(self.raw.items())]

    def _put(self, key: Key, obj: dict[str, Any]) -> bool:
        """Store ``obj``; True when what reconcilers read of it changed (more than its resourceVersion)."""
        old = self.headers.get(key)
        node: str | None = None
        spec: dict[str, Any] = {}
        if self.plural == "pods":
            found = obj.get("spec")
            if isinstance(found, dict):
                spec = found
                # the node is for capacity only: scheduling alone then leaves the stored pod as it was
                node = spec.pop("nodeName", None)
        meta = obj.get("metadata")
        rv = meta.pop("resourceVersion", None) if isinstance(meta, dict) else None
        raw = pack(obj)
        if rv is not None:
            meta["resourceVersion"] = rv  # type: ignore[index]
        previous = self.raw.get(key)
        changed = previous != raw
        self.raw[key] = raw
        if self.plural == "pods":
            usage = self.pod_usage.get(key)
            if usage is not None and not changed:
                shape = usage[2]  # the containers are part of ``raw``: the same as before
            else:
                shape = bytes(memoryview(orjson.dumps([spec.get("containers"), spec.get("initContainers"),
                                                       spec.get("overhead")])))
                shape = self._shapes.setdefault(shape, shape)  # thousands of replicas share a few shapes
            self.pod_usage[key] = (str((obj.get("status") or {}).get("phase") or ""), node, shape)
        header_meta = _shrink(obj)
        self.headers[key] = obj
        self.by_namespace.setdefault(key[0], {})[key[1]] = obj
        if self.indexes:
            obj_labels = header_meta.get("labels") or {}
            if old is not None and (old.get("metadata") or {}).get("labels") != obj_labels:
                self._unindex(key, old)
            for label, index in self.indexes.items():
                value = obj_labels.get(label)
                if value is not None:
                    index.setdefault((key[0], value), {})[key[1]] = obj
        return changed

    def _unindex(self, key: Key, obj: Mapping[str, Any]) -> None:
        obj_labels = (obj.get("metadata") or {}).get("labels") or {}
        for label, index in self.indexes.items():
            value = obj_labels.get(label)
            if value is None:
                continue
            bucket = index.get((key[0], value))
            if bucket is not None:
                bucket.pop(key[1], None)
                if not bucket:
                    del index[(key[0], value)]

    def accepts(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is newer than what is known (a later version, not a locally deleted one)."""
        key = key_of(obj)
        current = self.headers.get(key)
        return self._accepts(key, rv_of(obj), -1 if current is None else rv_of(current))

    def _accepts(self, key: Key, rv: int, held: int) -> bool:
        """``accepts`` for version ``rv`` of ``key`` when the version held is ``held`` (-1: none)."""
        if rv >= 0 and rv < held:
            return False
        dead = self.tombstones.get(key)
        return dead is None or rv < 0 or rv > dead

    def upsert(self, obj: dict[str, Any], *, watched: bool = False) -> Stored:
        """Store ``obj`` unless a newer version (or a local delete) is known; falsy (REFUSED) if not stored.

        ``watched``: ``obj`` comes from the informer, not from the answer to the agent's own write.
        ``obj`` is shrunk to its header in place: use ``get`` for the object afterwards.
        """
        key = key_of(obj)
        current = self.headers.get(key)
        rv, held = rv_of(obj), -1 if current is None else rv_of(current)
        if not self._accepts(key, rv, held):
            return Stored.REFUSED
        if current is not None and held == rv >= 0:
            # this very version is held (the watch echoing the agent's own create or write, a relist):
            # storing it again would only cost a trim and an encode, and would undo ``mark_deleting``
            _shrink(obj)
            if watched:
                self._unwatched.discard(key)
            return Stored.HELD
        self.tombstones.pop(key, None)
        changed = self._put(key, trim(obj, self.plural))
        if not watched:
            self._unwatched.add(key)
            if rv >= 0:
                own = self._own
                own[rv] = key
                if len(own) > OWN_VERSIONS:
                    del own[next(iter(own))]
            return Stored.CHANGED
        if key in self._unwatched:
            # the version replaced was known from the agent's own write only: its echo never came (a relist,
            # a watch that resumed later), so whatever that write was to cause has not been caused yet
            self._unwatched.discard(key)
            return Stored.CHANGED
        return Stored.CHANGED if changed else Stored.SAME_CONTENT

    def echo(self, rv: int, line: bytes) -> dict[str, Any] | None:
        """``federation.kube.EchoCheck``: whether the watch event ``line`` (not decoded) echoes version ``rv`` of
        an object stored from the agent's own write and not watched since; if so it counts as watched now and
        its header is returned (what ``upsert`` would have found: ``Stored.HELD``). The object's uid must be in
        the line too, so that a resourceVersion-like string elsewhere in another object never passes for it."""
        key = self._own.get(rv)
        if key is None:
            return None
        header = self.headers.get(key)
        meta = header.get("metadata") if header is not None else None
        if not isinstance(meta, dict) or rv_of(header) != rv or key not in self._unwatched:
            del self._own[rv]
            return None
        uid = meta.get("uid")
        if not uid or b'"uid":"' + str(uid).encode() + b'"' not in line:
            return None
        del self._own[rv]
        self._unwatched.discard(key)
        return header

    def own_key(self, rv: int) -> Key | None:
        """The key whose version ``rv`` was stored from the agent's own write (and may still be echoed), if known."""
        return self._own.get(rv)

    def watched_at(self, key: Key, rv: int) -> bool:
        """Whether the version held of ``key`` is ``rv`` and came from the watch (not only from a write's answer)."""
        header = self.headers.get(key)
        return header is not None and rv >= 0 and rv_of(header) == rv and key not in self._unwatched

    def remove(self, key: Key, *, rv: int = -1) -> None:
        current = self.headers.pop(key, None)
        self._unwatched.discard(key)
        self.raw.pop(key, None)
        self.pod_usage.pop(key, None)
        if current is not None:
            self._unindex(key, current)
        ns = self.by_namespace.get(key[0])
        if ns is not None:
            ns.pop(key[1], None)
            if not ns:
                del self.by_namespace[key[0]]
        mark = max(rv, rv_of(current))
        if mark >= 0:
            self.tombstones[key] = mark
            if len(self.tombstones) > 50_000:  # bounded: the oldest guards are no longer needed
                for old in list(self.tombstones)[:25_000]:
                    del self.tombstones[old]

    def mark_deleting(self, key: Key, stamp: str) -> None:
        """The agent deleted ``key``; until the watch says so, show it terminating (never re-add it)."""
        header = self.headers.get(key)
        if header is None or (header.get("metadata") or {}).get("deletionTimestamp"):
            return
        current = self.get(key)
        if current is not None:
            current.setdefault("metadata", {})["deletionTimestamp"] = stamp
            usage = self.pod_usage.get(key)
            if usage is not None and usage[1] is not None:  # the node lives in ``pod_usage`` only
                current.setdefault("spec", {})["nodeName"] = usage[1]
            self._put(key, current)

    def delete_event(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """A watch said ``obj`` is gone: forget it and return the last full version known.

        Ignored (None) when the name now holds a newer object (another uid).
        """
        key = key_of(obj)
        current = self.headers.get(key)
        uid = (obj.get("metadata") or {}).get("uid")
        if current is not None and uid and (current.get("metadata") or {}).get("uid") not in (None, uid):
            return None
        last = self.get(key)
        self.remove(key, rv=rv_of(obj))
        return last

    def held(self, namespace: str | None = None, selector: str | None = None) -> dict[Key, dict[str, Any]]:
        """The headers held (of ``namespace`` only, and matching ``selector``, when given): what an informer
        started again after a failure is told the agent knows already (``Kube.informer``'s ``known``), so its
        first list reports what vanished while none watched as DELETED. A version known from the agent's own
        write only is given without its resourceVersion: the list reports it again (as MODIFIED), since what
        its echo was to cause (``upsert``, the apply loop's owed pass) has not been caused yet."""
        if namespace is None:
            found = dict(self.headers)
        else:
            found = {(namespace, name): h for name, h in (self.by_namespace.get(namespace) or {}).items()}
        if selector:
            match = Selector.parse(selector)
            found = {k: h for k, h in found.items() if match.matches((h.get("metadata") or {}).get("labels"))}
        for key in self._unwatched.intersection(found):
            found[key] = {"metadata": {**(found[key].get("metadata") or {}), "resourceVersion": ""}}
        return found

    def in_namespace(self, namespace: str) -> list[dict[str, Any]]:
        return list((self.by_namespace.get(namespace) or {}).values())

    def _index(self, label: str) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
        index = self.indexes.get(label)
        if index is None:
            index = self.indexes[label] = {}
            for key, obj in self.headers.items():
                value = ((obj.get("metadata") or {}).get("labels") or {}).get(label)
                if value is not None:
                    index.setdefault((key[0], value), {})[key[1]] = obj
        return index

    def select(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Decoded objects in ``namespace`` whose labels match ``selector``."""
        match = Selector.parse(selector)
        first = next(((k, v) for k, op, v in match.requirements if op == "="), None)
        if first is None:
            candidates: list[dict[str, Any]] = self.in_namespace(namespace)
        else:
            candidates = list((self._index(first[0]).get((namespace, first[1])) or {}).values())
        out: list[dict[str, Any]] = []
        for header in candidates:
            if match.matches((header.get("metadata") or {}).get("labels")):
                full = self.get(key_of(header))
                if full is not None:
                    out.append(full)
        return out


_REQ = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.-]*))?\s*$")


@dataclass(frozen=True)
class Selector:
    """Equality-based label selector (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``), as reconcilers write them."""

    requirements: tuple[tuple[str, str, str], ...]

    @classmethod
    @functools.lru_cache(maxsize=4096)
    def parse(cls, text: str) -> Selector:
        reqs: list[tuple[str, str, str]] = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            m = _REQ.match(part)
            if m is None:
                raise ValueError(f"unsupported label selector term {part!r}")
            neg, key, op, value = m.groups()
            if op is None:
                reqs.append((key, "!exists" if neg else "exists", ""))
            else:
                reqs.append((key, "!=" if op == "!=" else "=", value or ""))
        return cls(tuple(reqs))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        for key, op, value in self.requirements:
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
            if op == "exists" and key not in labels:
                return False
            if op == "!exists" and key in labels:
                return False
        return True
