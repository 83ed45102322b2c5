"""The in-memory object store of one simulated cluster: API object semantics, watch history and GC.

Objects are kept compact as their serialized JSON bytes plus a small record (labels, uid, owners), so
reads over HTTP send the stored bytes as they are and ``get``/``list`` hand out fresh copies by parsing.
Every committed change gets the next per-cluster resourceVersion, lands in a bounded event window (for
watches that resume from a version) and is passed to subscribers. Deletion follows upstream: finalizers
and deletionTimestamp, propagation Background / Foreground / Orphan, owner-reference garbage collection
and namespace termination. The store belongs to one event-loop thread and takes no locks.
"""

from __future__ import annotations

import base64
import builtins
import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from kubesim import kinds
from kubesim.errors import ApiError, already_exists, conflict, invalid, not_found
from kubesim.patch import json_patch, merge_patch, strategic_merge
from kubesim.resources import Catalogue, ResourceType
from kubesim.selectors import field_matches, matches, parse_field_selector, parse_label_selector
from kubesim.spec import ClusterSpec

__all__ = ["ApiError", "Rec", "Store"]

HISTORY = 10_000
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
RAW_CRD = "customresourcedefinitions.apiextensions.k8s.io"
# Deletes of these answer with the object itself instead of a Status (upstream ReturnDeletedObject).
RETURNS_OBJECT = {"pods", "services", "namespaces", "serviceaccounts", RAW_CRD}

Subscriber = Callable[[str, str, dict[str, Any]], None]
RawSubscriber = Callable[[str, str, "Rec", "Rec | None"], None]


_stamp: list[Any] = [0, ""]


def now() -> str:
    """RFC 3339 UTC timestamp with seconds precision (formatted once per second: it is on the hot path)."""
    t = int(time.time())
    if _stamp[0] != t:
        _stamp[0], _stamp[1] = t, datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(_stamp[1])


class Rec:
    """One stored object: its JSON bytes and what selectors, GC and watches need without parsing."""

    __slots__ = ("labels", "name", "ns", "owners", "raw", "rv", "uid")

    def __init__(self, raw: bytes, ns: str, name: str, rv: int, uid: str,
                 labels: dict[str, str] | None, owners: tuple[str, ...]) -> None:
        self.raw = raw
        self.ns = ns
        self.name = name
        self.rv = rv
        self.uid = uid
        self.labels = labels
        self.owners = owners

    def obj(self) -> dict[str, Any]:
        return orjson.loads(self.raw)  # type: ignore[no-any-return]


class Store:
    """All objects of one cluster (see module docstring)."""

    def __init__(self, spec: ClusterSpec, history: int = HISTORY) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self._names = random.Random(f"{spec.seed}/{spec.name}/names")
        self.catalogue = Catalogue()
        self._objs: dict[str, dict[str, dict[str, Rec]]] = {}
        self._uids: dict[str, tuple[str, str, str]] = {}
        self._deps: dict[str, set[tuple[str, str, str]]] = {}
        self.rv = 0
        self.history: deque[tuple[int, str, str, Rec, Rec | None]] = deque(maxlen=history)
        self.compacted = 0  # events with rv <= this are gone from history
        self._subs: builtins.list[Subscriber] = []
        self._raw_subs: builtins.list[RawSubscriber] = []
        self._next_ip = 1
        # Deferred work (GC, namespace finalization); the server points this at loop.call_soon so the
        # work happens after the response like the real controllers; without a loop it runs inline.
        self.defer: Callable[[Callable[[], None]], Any] = lambda fn: fn()
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i, n in enumerate(spec.nodes):
            self.create("nodes", node_object(n, i))

    # ------------------------------------------------------------------ public contract

    def get(self, res: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        rec = self.get_rec(res, namespace, name)
        return rec.obj() if rec else None

    def list(self, res: str, namespace: str | None = None, label_selector: str | None = None,
             field_selector: str | None = None) -> builtins.list[dict[str, Any]]:
        return [r.obj() for r in self.list_recs(res, namespace, label_selector, field_selector)]

    def create(self, res: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self.create_rec(res, obj).obj()

    def update(self, res: str, obj: dict[str, Any], subresource: str | None = None) -> dict[str, Any]:
        return self.update_rec(res, obj, subresource).obj()

    def patch(self, res: str, namespace: str | None, name: str, patch: dict[str, Any] | builtins.list[Any],
              patch_type: str = "merge", subresource: str | None = None) -> dict[str, Any]:
        return self.patch_rec(res, namespace, name, patch, patch_type, subresource).obj()

    def delete(self, res: str, namespace: str | None, name: str, propagation: str | None = "Background",
               grace_period: int | None = None) -> dict[str, Any] | None:
        """Delete; returns the object while it lingers (finalizers, graceful pod deletion), else None."""
        rec, gone = self.delete_rec(res, namespace, name, propagation, grace_period=grace_period)
        return None if gone else rec.obj()

    def finalize_delete(self, res: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The kubelet's closing DELETE with gracePeriodSeconds=0 (still waits for finalizers)."""
        return self.delete(res, namespace, name, "Background", grace_period=0)

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        self._subs.append(fn)
        return lambda: self._subs.remove(fn) if fn in self._subs else None

    def subscribe_raw(self, fn: RawSubscriber) -> Callable[[], None]:
        """Like subscribe but gets (type, res, rec, previous rec) without parsing; used by watches."""
        self._raw_subs.append(fn)
        return lambda: self._raw_subs.remove(fn) if fn in self._raw_subs else None

    # ------------------------------------------------------------------ lookups

    def rtype(self, res: str) -> ResourceType:
        rt = self.catalogue.by_key.get(res)
        if rt is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({res})",
                           {"kind": res})
        return rt

    def get_rec(self, res: str, namespace: str | None, name: str) -> Rec | None:
        return self._objs.get(res, {}).get(namespace or "", {}).get(name)

    def _must(self, rt: ResourceType, ns: str, name: str) -> Rec:
        rec = self._objs.get(rt.key, {}).get(ns, {}).get(name)
        if rec is None:
            raise not_found(rt.plural, rt.group, name)
        return rec

    def list_recs(self, res: str, namespace: str | None = None, label_selector: str | None = None,
                  field_selector: str | None = None) -> builtins.list[Rec]:
        rt = self.rtype(res)
        lreq = parse_label_selector(label_selector)
        freq = parse_field_selector(rt.key, field_selector)
        by_ns = self._objs.get(res, {})
        if namespace:
            buckets = [(namespace, by_ns.get(namespace, {}))]
        else:
            buckets = sorted(by_ns.items())
        out: builtins.list[Rec] = []
        for _ns, objs in buckets:
            for name in sorted(objs):
                rec = objs[name]
                if lreq and not matches(lreq, rec.labels):
                    continue
                if freq and not self.fields_match(freq, rec):
                    continue
                out.append(rec)
        return out

    @staticmethod
    def fields_match(freq: builtins.list[Any], rec: Rec) -> bool:
        if all(k in ("metadata.name", "metadata.namespace") for k, _, _ in freq):
            return matches(freq, {"metadata.name": rec.name, "metadata.namespace": rec.ns})
        return field_matches(freq, rec.obj())

    def objects_in(self, namespace: str) -> builtins.list[tuple[str, Rec]]:
        return [(res, rec) for res, by_ns in self._objs.items() for rec in by_ns.get(namespace, {}).values()]

    # ------------------------------------------------------------------ commit

    def _commit(self, rt: ResourceType, obj: dict[str, Any], etype: str, old: Rec | None) -> Rec:
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        ns = meta.get("namespace", "") if rt.namespaced else ""
        name = meta["name"]
        owners = tuple(o.get("uid", "") for o in meta.get("ownerReferences") or ())
        # orjson leaves slack capacity in the bytes it returns; an exact copy keeps the store compact.
        rec = Rec(memoryview(orjson.dumps(obj)).tobytes(), ns, name, self.rv, meta.get("uid", ""), meta.get("labels") or None, owners)
        by_name = self._objs.setdefault(rt.key, {}).setdefault(ns, {})
        if old is not None:
            for o in old.owners:
                deps = self._deps.get(o)
                if deps is not None:
                    deps.discard((rt.key, ns, name))
                    if not deps:
                        del self._deps[o]
        if etype == "DELETED":
            by_name.pop(name, None)
            self._uids.pop(rec.uid, None)
        else:
            by_name[name] = rec
            self._uids[rec.uid] = (rt.key, ns, name)
            for o in owners:
                self._deps.setdefault(o, set()).add((rt.key, ns, name))
        if len(self.history) == self.history.maxlen:
            self.compacted = self.history[0][0]
        self.history.append((self.rv, etype, rt.key, rec, old))
        for raw_fn in list(self._raw_subs):
            try:
                raw_fn(etype, rt.key, rec, old)
            except Exception:  # a broken watcher must not break the write that triggered it
                pass
        if self._subs:
            parsed = rec.obj()
            for fn in list(self._subs):
                try:
                    fn(etype, rt.key, parsed)
                except Exception:
                    pass
        return rec

    # ------------------------------------------------------------------ create

    def _generate_name(self, prefix: str) -> str:
        return prefix[:58] + "".join(self._names.choice(NAME_CHARS) for _ in range(5))

    def new_uid(self) -> str:
        # Random, not seeded: UIDs must stay unique across clusters and across runs of the same topology.
        return str(uuid.uuid4())

    def alloc_ip(self) -> str:
        n = self._next_ip
        self._next_ip += 1
        return f"10.96.{n // 250}.{n % 250 + 1}"

    def create_rec(self, res: str, obj: dict[str, Any], dry_run: bool = False) -> Rec:
        rt = self.rtype(res)
        kinds.check_kind_and_version(rt, obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        obj["apiVersion"] = obj.get("apiVersion") or rt.api_version()
        obj["kind"] = rt.kind
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generate_name(meta["generateName"])
        name = meta.get("name") or ""
        causes = [kinds.required("metadata.name")] if not name else kinds.name_causes(rt.name_rule, name)
        ns = ""
        if rt.namespaced:
            ns = meta.get("namespace") or "default"
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        if causes:
            raise invalid(rt.kind, rt.group, name, causes)
        if rt.namespaced:
            nsrec = self.get_rec("namespaces", None, ns)
            if nsrec is None:
                raise not_found("namespaces", "", ns)
            if b'"deletionTimestamp"' in nsrec.raw:
                raise ApiError(403, "Forbidden", f'{rt.plural}{"." + rt.group if rt.group else ""} "{name}" is '
                               f"forbidden: unable to create new content in namespace {ns} because it is being "
                               "terminated", {"name": name, "kind": rt.plural})
        if self.get_rec(res, ns, name) is not None:
            raise already_exists(rt.plural, rt.group, name)
        meta["uid"] = self.new_uid()
        meta["creationTimestamp"] = now()
        for k in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(k, None)
        if rt.generation:
            meta["generation"] = 1
        if rt.has_status and not rt.builtin:
            obj.pop("status", None)
        if rt.key == RAW_CRD:
            obj.pop("status", None)
        kinds.apply_kind_rules(rt, obj, None, self.alloc_ip)
        if dry_run:
            obj["metadata"]["resourceVersion"] = ""
            return Rec(orjson.dumps(obj), ns, name, 0, meta["uid"], None, ())
        rec = self._commit(rt, obj, "ADDED", None)
        if rt.key == "namespaces":
            self.create("serviceaccounts", {"metadata": {"name": "default", "namespace": name}})
        elif rt.key == RAW_CRD:
            self.defer(lambda: self._establish_crd(name))
        if rec.owners and not any(o in self._uids for o in rec.owners):
            # Dangling owners: the garbage collector removes such an object soon after it appears.
            self.defer(lambda: self._collect(rt.key, ns, name))
        return rec

    def _establish_crd(self, name: str) -> None:
        rec = self.get_rec(RAW_CRD, None, name)
        if rec is None:
            return
        crd = rec.obj()
        spec = crd["spec"]
        rt = self.catalogue.add_crd(crd)
        t = now()
        crd["status"] = {
            "acceptedNames": {k: v for k, v in spec["names"].items()},
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "lastTransitionTime": t, "reason": "NoConflicts",
                 "message": "no conflicts found"},
                {"type": "Established", "status": "True", "lastTransitionTime": t, "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted"},
            ],
            "storedVersions": [rt.storage_version],
        }
        self._commit(self.rtype(RAW_CRD), crd, "MODIFIED", rec)

    # ------------------------------------------------------------------ update

    def update_rec(self, res: str, obj: dict[str, Any], subresource: str | None = None,
                   dry_run: bool = False) -> Rec:
        rt = self.rtype(res)
        kinds.check_kind_and_version(rt, obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict) or not meta.get("name"):
            raise invalid(rt.kind, rt.group, "", [kinds.required("metadata.name")])
        ns = (meta.get("namespace") or "default") if rt.namespaced else ""
        rec = self._must(rt, ns, meta["name"])
        rv = meta.get("resourceVersion")
        if rv and rv != str(rec.rv):
            raise conflict(rt.plural, rt.group, meta["name"])
        return self._replace(rt, rec, obj, subresource, dry_run)

    def _replace(self, rt: ResourceType, rec: Rec, obj: dict[str, Any], subresource: str | None,
                 dry_run: bool = False) -> Rec:
        old = rec.obj()
        ometa = old["metadata"]
        if subresource == "status":
            new = rec.obj()
            new_status = obj.get("status")
            if new_status is None:
                new.pop("status", None)
            else:
                new["status"] = new_status
            nmeta = obj.get("metadata") or {}
            if rt.builtin:
                # Built-in status strategies reset only the spec; label/annotation edits go through.
                for k in ("labels", "annotations"):
                    if k in nmeta:
                        new["metadata"][k] = nmeta[k]
            if "managedFields" in nmeta:
                new["metadata"]["managedFields"] = nmeta["managedFields"]
        else:
            new = obj
            new["apiVersion"] = new.get("apiVersion") or old.get("apiVersion")
            new["kind"] = rt.kind
            nmeta = new["metadata"]
            for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "generation", "namespace"):
                if k in ometa:
                    nmeta[k] = ometa[k]
                else:
                    nmeta.pop(k, None)
            nmeta.pop("generateName", None) if "generateName" not in ometa else None
            if "managedFields" not in nmeta and "managedFields" in ometa:
                nmeta["managedFields"] = ometa["managedFields"]
            if rt.has_status:
                if "status" in old:
                    new["status"] = old["status"]
                else:
                    new.pop("status", None)
            if "deletionTimestamp" in ometa:
                added = set(nmeta.get("finalizers") or ()) - set(ometa.get("finalizers") or ())
                if added:
                    raise ApiError(422, "Invalid", f'{rt.kind} "{rec.name}" is invalid: metadata.finalizers: '
                                   "Forbidden: no new finalizers can be added if the object is being deleted",
                                   {"name": rec.name, "kind": rt.kind})
            kinds.apply_kind_rules(rt, new, old, self.alloc_ip)
            if rt.generation and _spec_part(new) != _spec_part(old):
                nmeta["generation"] = int(ometa.get("generation") or 1) + 1
        new["metadata"]["resourceVersion"] = ometa.get("resourceVersion")
        if new == old:
            return rec  # a no-op write keeps the version and sends no event, like etcd3's GuaranteedUpdate
        if dry_run:
            return Rec(orjson.dumps(new), rec.ns, rec.name, rec.rv, rec.uid, None, ())
        meta = new["metadata"]
        if "deletionTimestamp" in meta and not meta.get("finalizers") and not meta.get("deletionGracePeriodSeconds"):
            return self._remove(rt, rec, new)
        out = self._commit(rt, new, "MODIFIED", rec)
        if rt.key == RAW_CRD and rec.name in self.catalogue.by_key and subresource is None:
            self.catalogue.add_crd(new)  # served versions / scope / subresources follow CRD edits
        if "deletionTimestamp" in meta:
            self.defer(lambda: self._process_deleting(rt.key, rec.ns, rec.name))
        if out.owners != rec.owners and out.owners and not any(o in self._uids for o in out.owners):
            self.defer(lambda: self._collect(rt.key, rec.ns, rec.name))
        return out

    # ------------------------------------------------------------------ patch / apply

    def patch_rec(self, res: str, namespace: str | None, name: str, patch: Any, patch_type: str = "merge",
                  subresource: str | None = None, dry_run: bool = False) -> Rec:
        rt = self.rtype(res)
        ns = (namespace or "default") if rt.namespaced else ""
        rec = self._must(rt, ns, name)
        old = rec.obj()
        if patch_type == "json":
            new = json_patch(old, patch)
        elif not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "patch body must be a JSON object")
        elif patch_type == "strategic":
            if not rt.builtin:
                raise ApiError(415, "UnsupportedMediaType",
                               "the body of the request was in an unknown format - accepted media types "
                               "include: application/json-patch+json, application/merge-patch+json, "
                               "application/apply-patch+yaml")
            new = strategic_merge(old, patch)
        else:
            new = merge_patch(old, patch)
        if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
            raise ApiError(422, "Invalid", "patch removed metadata")
        nmeta = new["metadata"]
        if nmeta.get("name") != name or (rt.namespaced and nmeta.get("namespace") != ns):
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        rv = nmeta.get("resourceVersion")
        if rv and rv != str(rec.rv):
            raise conflict(rt.plural, rt.group, name)
        return self._replace(rt, rec, new, subresource, dry_run)

    def apply_rec(self, res: str, namespace: str | None, name: str, obj: dict[str, Any], manager: str,
                  force: bool = False, subresource: str | None = None, dry_run: bool = False) -> Rec:
        """Server-side apply, simplified: create if missing, else a forced merge of the applied config."""
        rt = self.rtype(res)
        ns = (namespace or "default") if rt.namespaced else ""
        meta = obj.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = ns
        entry = {"manager": manager, "operation": "Apply", "apiVersion": obj.get("apiVersion") or rt.api_version(),
                 "time": now(), "fieldsType": "FieldsV1", "fieldsV1": _fields_v1(obj)}
        if subresource:
            entry["subresource"] = subresource
        rec = self.get_rec(res, ns, name)
        if rec is None:
            if subresource:
                raise not_found(rt.plural, rt.group, name)
            meta["managedFields"] = [entry]
            return self.create_rec(res, obj, dry_run)
        old = rec.obj()
        if meta.get("resourceVersion") and meta["resourceVersion"] != str(rec.rv):
            raise conflict(rt.plural, rt.group, name)
        applied = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        applied["metadata"] = {k: v for k, v in meta.items() if k in ("labels", "annotations", "finalizers",
                                                                      "ownerReferences")}
        new = strategic_merge(old, applied) if rt.builtin else merge_patch(old, applied)
        mf = [m for m in old["metadata"].get("managedFields") or []
              if not (m.get("manager") == manager and m.get("operation") == "Apply"
                      and m.get("subresource") == entry.get("subresource"))]
        new["metadata"]["managedFields"] = [*mf, entry]
        return self._replace(rt, rec, new, subresource, dry_run)

    def bind(self, namespace: str, name: str, node: str) -> dict[str, Any]:
        """What POST pods/binding does: set spec.nodeName (otherwise immutable) and PodScheduled=True."""
        rt = self.rtype("pods")
        rec = self._must(rt, namespace, name)
        pod = rec.obj()
        if pod["spec"].get("nodeName"):
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod '
                           f'{name} is already assigned to node "{pod["spec"]["nodeName"]}"',
                           {"name": name, "kind": "pods/binding"})
        if "deletionTimestamp" in pod["metadata"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on pods/binding "{name}": pod '
                           f"{name} is being deleted, cannot be assigned to a host",
                           {"name": name, "kind": "pods/binding"})
        pod["spec"]["nodeName"] = node
        status = pod.setdefault("status", {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                      "lastTransitionTime": now()})
        status["conditions"] = conds
        return self._commit(rt, pod, "MODIFIED", rec).obj()

    # ------------------------------------------------------------------ delete and GC

    def delete_rec(self, res: str, namespace: str | None, name: str, propagation: str | None = None,
                   precondition_uid: str | None = None, precondition_rv: str | None = None,
                   dry_run: bool = False, grace_period: int | None = None) -> tuple[Rec, bool]:
        """Delete; returns (record, gone). ``propagation`` None means the resource's default policy."""
        rt = self.rtype(res)
        ns = (namespace or "default") if rt.namespaced else ""
        rec = self._must(rt, ns, name)
        if precondition_uid and precondition_uid != rec.uid:
            raise ApiError(409, "Conflict", f'Precondition failed: UID in precondition: {precondition_uid}, '
                           f"UID in object meta: {rec.uid}", {"name": name, "kind": rt.plural})
        if precondition_rv and precondition_rv != str(rec.rv):
            raise ApiError(409, "Conflict", f"Precondition failed: ResourceVersion in precondition: "
                           f"{precondition_rv}, ResourceVersion in object meta: {rec.rv}",
                           {"name": name, "kind": rt.plural})
        if propagation is None:
            # batch/v1 Jobs still default to orphaning their pods, as upstream keeps for compatibility.
            propagation = "Orphan" if res == "jobs.batch" else "Background"
        if propagation not in ("Background", "Foreground", "Orphan"):
            raise ApiError(400, "BadRequest", f"propagationPolicy: Unsupported value: {propagation!r}")
        obj = rec.obj()
        meta = obj["metadata"]
        fins = list(meta.get("finalizers") or [])
        if propagation == "Foreground" and "foregroundDeletion" not in fins:
            fins.append("foregroundDeletion")
        if propagation == "Orphan" and "orphan" not in fins and self._deps.get(rec.uid):
            fins.append("orphan")
        if dry_run:
            return rec, not fins and res != "namespaces"
        if res == "namespaces":
            if "deletionTimestamp" not in meta:
                meta["deletionTimestamp"] = now()
                meta["deletionGracePeriodSeconds"] = 0
                obj["status"] = {"phase": "Terminating"}
                rec = self._commit(rt, obj, "MODIFIED", rec)
                self.defer(lambda: self._finalize_namespace(name))
            return rec, False
        grace = self._pod_grace(obj, grace_period) if res == "pods" else 0
        if not fins and grace == 0:
            return self._remove(rt, rec, obj), True
        if "deletionTimestamp" in meta and fins == list(meta.get("finalizers") or []) and (
                grace >= int(meta.get("deletionGracePeriodSeconds") or 0)):
            return rec, False
        first = "deletionTimestamp" not in meta
        if first or grace < int(meta.get("deletionGracePeriodSeconds") or 0):
            # A bound, running pod is deleted gracefully: it lingers until its kubelet confirms with grace 0.
            when = datetime.now(UTC) + timedelta(seconds=grace)
            meta["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
            meta["deletionGracePeriodSeconds"] = grace
        if fins:
            meta["finalizers"] = fins
        if rt.generation and first:
            meta["generation"] = int(meta.get("generation") or 1) + 1
        rec = self._commit(rt, obj, "MODIFIED", rec)
        self.defer(lambda: self._process_deleting(rt.key, ns, name))
        return rec, False

    @staticmethod
    def _pod_grace(pod: dict[str, Any], requested: int | None) -> int:
        """Upstream CheckGracefulDelete for pods: unbound or finished pods go at once."""
        if not (pod.get("spec") or {}).get("nodeName"):
            return 0
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        if requested is not None:
            return max(int(requested), 0)
        return int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30) or 0)

    def _remove(self, rt: ResourceType, rec: Rec, obj: dict[str, Any]) -> Rec:
        out = self._commit(rt, obj, "DELETED", rec)
        uid = rec.uid
        if rt.key == RAW_CRD:
            crt = self.catalogue.by_key.get(rec.name)
            if crt is not None:
                for r in self.list_recs(crt.key):
                    self._commit(crt, r.obj(), "DELETED", r)
                self.catalogue.remove(rec.name)
        if self._deps.get(uid):
            self.defer(lambda: self._owner_gone(uid))
        for o in rec.owners:
            if o in self._uids:
                self.defer(lambda o=o: self._recheck_owner(o))  # type: ignore[misc]
        if rec.ns and rt.key != "namespaces":
            nsrec = self.get_rec("namespaces", None, rec.ns)
            if nsrec is not None and b'"deletionTimestamp"' in nsrec.raw:
                self.defer(lambda: self._finalize_namespace(rec.ns))
        return out

    def _owner_gone(self, uid: str) -> None:
        for res, ns, name in sorted(self._deps.get(uid, ())):
            self._collect(res, ns, name)

    def _collect(self, res: str, ns: str, name: str) -> None:
        """Delete a dependent whose owners are all gone (the garbage collector's rule)."""
        rec = self.get_rec(res, ns, name)
        if rec is None or not rec.owners or any(o in self._uids for o in rec.owners):
            return
        try:
            self.delete_rec(res, ns or None, name, "Background")
        except ApiError:
            pass

    def _recheck_owner(self, uid: str) -> None:
        loc = self._uids.get(uid)
        if loc is not None:
            self._process_deleting(*loc)

    def _process_deleting(self, res: str, ns: str, name: str) -> None:
        """Drive the orphan / foregroundDeletion finalizers of an object being deleted."""
        rec = self.get_rec(res, ns, name)
        if rec is None or b'"deletionTimestamp"' not in rec.raw:
            return
        obj = rec.obj()
        fins = list(obj["metadata"].get("finalizers") or [])
        deps = sorted(self._deps.get(rec.uid, ()))
        if "orphan" in fins:
            for dres, dns, dname in deps:
                drec = self.get_rec(dres, dns, dname)
                if drec is None:
                    continue
                dobj = drec.obj()
                refs = [r for r in dobj["metadata"].get("ownerReferences") or [] if r.get("uid") != rec.uid]
                if refs:
                    dobj["metadata"]["ownerReferences"] = refs
                else:
                    dobj["metadata"].pop("ownerReferences", None)
                self._commit(self.rtype(dres), dobj, "MODIFIED", drec)
            fins.remove("orphan")
        elif "foregroundDeletion" in fins:
            blocking = False
            for dres, dns, dname in deps:
                drec = self.get_rec(dres, dns, dname)
                if drec is None:
                    continue
                dobj = drec.obj()
                if any(r.get("uid") == rec.uid and r.get("blockOwnerDeletion")
                       for r in dobj["metadata"].get("ownerReferences") or []):
                    blocking = True
                if "deletionTimestamp" not in dobj["metadata"]:
                    try:
                        self.delete_rec(dres, dns or None, dname, "Foreground")
                    except ApiError:
                        pass
            # Dependents without finalizers are gone by now; wait only for blocking ones that remain.
            remaining = [d for d in self._deps.get(rec.uid, ()) if self.get_rec(*d) is not None]
            if blocking and any(self._blocks(d, rec.uid) for d in remaining):
                return
            fins.remove("foregroundDeletion")
        else:
            return
        rec = self.get_rec(res, ns, name) or rec
        obj = rec.obj()
        obj["metadata"]["finalizers"] = fins
        if not fins:
            obj["metadata"].pop("finalizers", None)
        self._replace(self.rtype(res), rec, obj, None)

    def _blocks(self, loc: tuple[str, str, str], uid: str) -> bool:
        rec = self.get_rec(*loc)
        if rec is None:
            return False
        return any(r.get("uid") == uid and r.get("blockOwnerDeletion")
                   for r in rec.obj()["metadata"].get("ownerReferences") or [])

    def _finalize_namespace(self, name: str) -> None:
        """The namespace controller: delete everything in a terminating namespace, then the namespace."""
        nsrec = self.get_rec("namespaces", None, name)
        if nsrec is None or b'"deletionTimestamp"' not in nsrec.raw:
            return
        for res, rec in sorted(self.objects_in(name), key=lambda x: (x[0], x[1].name)):
            if b'"deletionTimestamp"' in rec.raw or self.get_rec(res, name, rec.name) is None:
                continue
            try:
                self.delete_rec(res, name, rec.name, "Background")
            except ApiError:
                pass
        if self.objects_in(name):
            return
        nsrec = self.get_rec("namespaces", None, name)
        if nsrec is not None:
            obj = nsrec.obj()
            obj.setdefault("spec", {})["finalizers"] = []
            self._remove(self.rtype("namespaces"), nsrec, obj)

    # ------------------------------------------------------------------ history

    def compact(self, upto: int | None = None) -> None:
        """Forget history up to ``upto`` (default: all), as etcd compaction does; older watches get 410."""
        upto = self.rv if upto is None else upto
        while self.history and self.history[0][0] <= upto:
            self.history.popleft()
        self.compacted = max(self.compacted, upto)

    def events_since(self, rv: int) -> builtins.list[tuple[int, str, str, Rec, Rec | None]] | None:
        """Events after ``rv`` from the window, or None when ``rv`` is older than the window (410)."""
        if rv < self.compacted:
            return None
        if not self.history or self.history[-1][0] <= rv:
            return []
        # The window is sorted by rv; skip from the left with a binary search.
        lo, hi = 0, len(self.history)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.history[mid][0] <= rv:
                lo = mid + 1
            else:
                hi = mid
        return [self.history[i] for i in range(lo, len(self.history))]


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _fields_v1(obj: Any) -> dict[str, Any]:
    """A FieldsV1-shaped set of the applied fields (lists are recorded as wholes)."""
    if not isinstance(obj, dict):
        return {}
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if k in ("apiVersion", "kind") or (k == "metadata" and not isinstance(v, dict)):
            continue
        if k == "metadata":
            sub = {f"f:{m}": _fields_v1(mv) for m, mv in v.items() if m in ("labels", "annotations")}
            if sub:
                out["f:metadata"] = sub
            continue
        out[f"f:{k}"] = _fields_v1(v) if isinstance(v, dict) else {}
    return out


def node_object(n: Any, index: int = 0) -> dict[str, Any]:
    """The Node a NodeSpec describes: capacity = allocatable, Ready, hostname label."""
    res = {"cpu": n.cpu, "memory": n.memory, "pods": str(n.pods), "ephemeral-storage": "100Gi", **n.extended}
    t = now()
    labels = {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64", **n.labels}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "labels": labels, "annotations": {"kubesim.mkd.dev/simulated": "true"}},
        "spec": {},
        "status": {
            "capacity": dict(res), "allocatable": dict(res),
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status", "lastHeartbeatTime": t, "lastTransitionTime": t},
                *[{"type": c, "status": "False", "reason": f"KubeletHas{r}", "message": m,
                   "lastHeartbeatTime": t, "lastTransitionTime": t}
                  for c, r, m in (("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
                                  ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
                                  ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"))],
            ],
            "addresses": [{"type": "InternalIP", "address": f"172.18.{index // 250}.{index % 250 + 2}"},
                          {"type": "Hostname", "address": n.name}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.31.0-kubesim",
                         "containerRuntimeVersion": "kubesim://1.0", "kernelVersion": "6.0.0", "osImage": "kubesim",
                         "kubeProxyVersion": "v1.31.0-kubesim", "machineID": "", "systemUUID": "", "bootID": ""},
            "phase": "Running",
        },
    }


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()
