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
import logging
import os
import random
from collections import deque
from collections.abc import Callable
from typing import Any

import orjson

from kubesim import apply as ssa
from kubesim import jobstatus, kinds, managed, rootca, schema
from kubesim.admission import Admission
from kubesim.deletion import DeletionMixin
from kubesim.deploykinds import deploy_kind_rules
from kubesim.errors import (
    ApiError,
    already_exists,
    conflict,
    invalid,
    namespace_terminating,
    not_found,
    precondition_failed,
    storage_key,
)
from kubesim.patch import json_patch, merge_patch, strategic_merge
from kubesim.records import Rec, now
from kubesim.resources import Catalogue, ResourceType
from kubesim.selectors import field_matches, matches, parse_field_selector, parse_label_selector
from kubesim.spec import ClusterSpec

__all__ = ["ApiError", "Rec", "Store"]

log = logging.getLogger("kubesim.store")

HISTORY = 10_000
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
RAW_CRD = "customresourcedefinitions.apiextensions.k8s.io"
# Deletes of these answer with the object itself instead of a Status (upstream ReturnDeletedObject).
RETURNS_OBJECT = {"pods", "services", "namespaces", "serviceaccounts", RAW_CRD}

Subscriber = Callable[[str, str, dict[str, Any]], None]
RawSubscriber = Callable[[str, str, "Rec", "Rec | None"], None]


class Store(DeletionMixin):
    """All objects of one cluster (see module docstring)."""

    def __init__(self, spec: ClusterSpec, history: int = HISTORY, *, root_ca: str | None = None) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self._names = random.Random(f"{spec.seed}/{spec.name}/names")
        self.catalogue = Catalogue()
        self.admission = Admission(self)
        self._objs: dict[str, dict[str, dict[str, Rec]]] = {}
        self._uids: dict[str, tuple[str, str, str]] = {}
        self._deps: dict[str, set[tuple[str, str, str]]] = {}
        self.rv = 0
        self.history: deque[tuple[int, str, str, Rec, Rec | None]] = deque(maxlen=history)
        self.compacted = 0  # events with rv <= this are gone from history
        self._subs: builtins.list[tuple[Subscriber, frozenset[str] | None]] = []
        self._raw_subs: dict[str, tuple[RawSubscriber, ...]] = {}
        """Watch callbacks by resource key: a commit calls only the watches of its own resource."""
        self._next_ip = 1
        # Deferred work (GC, namespace finalization); the server points this at loop.call_soon so the
        # work happens after the response like the real controllers; without a loop it runs inline.
        self.defer: Callable[[Callable[[], None]], Any] = lambda fn: fn()
        self.root_ca = root_ca or rootca.make_ca_pem()  # published as kube-root-ca.crt in every namespace
        for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.create("namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for i, n in enumerate(spec.nodes):
            self.create("nodes", kinds.node_object(n, i))

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

    def subscribe(self, fn: Subscriber, resources: builtins.set[str] | frozenset[str] | None = None
                  ) -> Callable[[], None]:
        """Call ``fn(type, res, object)`` after each commit (of ``resources`` only, when given). The object is
        the one just written, shared by all subscribers: read it, never change it."""
        entry = (fn, None if resources is None else frozenset(resources))
        self._subs.append(entry)
        return lambda: self._subs.remove(entry) if entry in self._subs else None

    def subscribe_raw(self, fn: RawSubscriber, resource: str) -> Callable[[], None]:
        """Like subscribe but gets (type, res, rec, previous rec) without parsing, for commits of ``resource``
        only; used by watches. Callbacks are kept per resource (as the real server keeps a watch cache per
        resource), so a commit does not call the watches of other resources."""
        self._raw_subs[resource] = (*self._raw_subs.get(resource, ()), fn)

        def unsubscribe() -> None:
            subs = list(self._raw_subs.get(resource, ()))
            if fn in subs:
                subs.remove(fn)
                if subs:
                    self._raw_subs[resource] = tuple(subs)
                else:
                    del self._raw_subs[resource]
        return unsubscribe

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
        refs = meta.get("ownerReferences")
        owners = tuple(o.get("uid", "") for o in refs) if refs else ()
        # apiVersion and kind lead the stored bytes, so that list items can drop them cheaply.
        ordered = {"apiVersion": obj.get("apiVersion") or rt.api_version(), "kind": obj.get("kind") or rt.kind}
        ordered.update(obj)
        # orjson leaves slack capacity in the bytes it returns; an exact copy keeps the store compact.
        raw = memoryview(orjson.dumps(ordered)).tobytes()
        rec = Rec(raw, ns, name, self.rv, meta.get("uid", ""), meta.get("labels") or None, owners)
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
            if name == rootca.NAME and rt.key == "configmaps":
                self.defer(lambda: self._republish_root_ca(ns))
        else:
            by_name[name] = rec
            self._uids[rec.uid] = (rt.key, ns, name)
            for o in owners:
                self._deps.setdefault(o, set()).add((rt.key, ns, name))
        if len(self.history) == self.history.maxlen:
            self.compacted = self.history[0][0]
        self.history.append((self.rv, etype, rt.key, rec, old))
        for raw_fn in self._raw_subs.get(rt.key, ()):  # a tuple: what was subscribed when the commit began
            try:
                raw_fn(etype, rt.key, rec, old)
            except Exception:  # a broken watcher must not break the write that triggered it
                log.exception("kubesim: watch callback failed on %s %s", etype, rt.key)
        if self._subs:
            # Subscribers get the object just written rather than a parse of its bytes (equal to it: plain
            # JSON values in, as every writer passes); the writers do not touch it after the commit, and the
            # subscribers only read it.
            for fn, wants in list(self._subs):
                if wants is not None and rt.key not in wants:
                    continue
                try:
                    schema.outside_request(fn, etype, rt.key, ordered)
                except Exception:
                    log.exception("kubesim: subscriber failed on %s %s %s", etype, rt.key, name)
        return rec

    # ------------------------------------------------------------------ create

    def _generate_name(self, prefix: str) -> str:
        return prefix[:58] + "".join(self._names.choice(NAME_CHARS) for _ in range(5))

    def new_uid(self) -> str:
        # Random, not seeded: UIDs must stay unique across clusters and across runs of the same topology.
        return random_uid()

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
        if meta.get("resourceVersion"):
            # etcd3's store refuses this with a plain error, which the handler turns into a reasonless 500.
            raise ApiError(500, "", "resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generate_name(meta["generateName"])
        name = meta.get("name") or ""
        causes = [kinds.required("metadata.name", "name or generateName is required")] if not name \
            else kinds.name_causes(rt.name_rule, name)
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
                raise namespace_terminating(rt.plural, rt.group, name, ns)
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
        schema.admit(rt, obj, None, self._rule_causes(rt))
        kinds.apply_kind_rules(rt, obj, None, self.alloc_ip, deploy_kind_rules)
        self._record_manager(rt, None, obj, None)
        self.admission.validate(rt, "CREATE", obj, None, None, dry_run)
        if dry_run:
            obj["metadata"]["resourceVersion"] = ""
            return Rec(orjson.dumps(obj), ns, name, 0, meta["uid"], None, ())
        rec = self._commit(rt, obj, "ADDED", None)
        if rt.key == "namespaces":
            self.create("serviceaccounts", {"metadata": {"name": "default", "namespace": name}})
            self.create("configmaps", rootca.configmap(name, self.root_ca))
        elif rt.key == RAW_CRD:
            self.defer(lambda: self._establish_crd(name))
        if rec.owners and not any(o in self._uids for o in rec.owners):
            # Dangling owners: the garbage collector removes such an object soon after it appears.
            self.defer(lambda: self._collect(rt.key, ns, name))
        return rec

    def _republish_root_ca(self, ns: str) -> None:
        """root-ca-cert-publisher: a deleted kube-root-ca.crt comes back while its namespace is active."""
        nsrec = self.get_rec("namespaces", None, ns)
        if nsrec is None or b'"deletionTimestamp"' in nsrec.raw or self.get_rec("configmaps", ns, rootca.NAME):
            return
        self.create("configmaps", rootca.configmap(ns, self.root_ca))

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
        if not rv and not rt.unconditional_update:
            # registry.Store.Update: the resource named as the kind, the version parsed as the uint64 0.
            raise invalid(rt.plural, rt.group, meta["name"], [kinds.cause(
                "metadata.resourceVersion", "Invalid value: 0: must be specified for an update")])
        if meta.get("uid") and meta["uid"] != rec.uid:  # the storage checks it before the update runs
            raise precondition_failed(rt.plural, rt.group, meta["name"],
                                      storage_key(rt.plural, rt.group, ns, meta["name"], rt.builtin),
                                      f"UID in precondition: {meta['uid']}, UID in object meta: {rec.uid}")
        if rv and rv != str(rec.rv):
            raise conflict(rt.plural, rt.group, meta["name"])
        return self._replace(rt, rec, obj, subresource, dry_run)

    def _replace(self, rt: ResourceType, rec: Rec, obj: dict[str, Any], subresource: str | None,
                 dry_run: bool = False, base: dict[str, Any] | None = None) -> Rec:
        """``base``, for a /status write: a parse of ``rec`` that nothing else holds (a merge patch's
        target, which the patch left as it was): the new object is built on it instead of parsing again."""
        old = rec.obj()
        ometa = old["metadata"]
        if subresource == "status":
            new = base if base is not None else rec.obj()
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
            schema.admit(rt, new, old, self._rule_causes(rt))
            jobstatus.check_status_write(rt, new, old)
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
            schema.admit(rt, new, old, self._rule_causes(rt))
            kinds.apply_kind_rules(rt, new, old, self.alloc_ip, deploy_kind_rules)
            if rt.generation and _spec_part(new) != _spec_part(old):
                nmeta["generation"] = int(ometa.get("generation") or 1) + 1
        new["metadata"]["resourceVersion"] = ometa.get("resourceVersion")
        self._record_manager(rt, old, new, subresource)
        self.admission.validate(rt, "UPDATE", new, old, subresource, dry_run)
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

    def _rule_causes(self, rt: ResourceType) -> schema.RuleCauses | None:
        if rt.builtin:
            return None
        return lambda obj, old: self.admission.crd_rule_causes(rt, obj, old)

    @staticmethod
    def _record_manager(rt: ResourceType, old: dict[str, Any] | None, new: dict[str, Any],
                        subresource: str | None) -> None:
        """The Update entry of an API write's field manager (not for apply, nor kubesim's own writers)."""
        scope = schema.current_scope()
        if scope is not None and scope.manager and scope.patch_type != "apply":
            lists = _map_lists(rt, str(new.get("apiVersion") or ""))
            if not lists:
                managed.record_update(old, new, scope.manager, subresource, rt.has_status, now())
                return
            # a listType map list is owned item by item, as under apply (kubesim.apply.keyed)
            k_new = ssa.keyed(new, lists)
            managed.record_update(ssa.keyed(old, lists) if old is not None else None, k_new, scope.manager,
                                  subresource, rt.has_status, now())
            fields = (k_new.get("metadata") or {}).get("managedFields")
            meta = new.setdefault("metadata", {})
            if fields is None:
                meta.pop("managedFields", None)
            else:
                meta["managedFields"] = fields

    # ------------------------------------------------------------------ patch / apply

    def patch_rec(self, res: str, namespace: str | None, name: str, patch: Any, patch_type: str = "merge",
                  subresource: str | None = None, dry_run: bool = False) -> Rec:
        rt = self.rtype(res)
        rec, new, base = self._patched(res, namespace, name, patch, patch_type)
        return self._replace(rt, rec, new, subresource, dry_run, base)

    def replace_rec(self, res: str, rec: Rec, obj: dict[str, Any], subresource: str | None = None,
                    dry_run: bool = False) -> Rec:
        """Write ``obj`` over ``rec`` (which must be current) with update semantics; for ``patched`` results."""
        return self._replace(self.rtype(res), rec, obj, subresource, dry_run)

    def patched(self, res: str, namespace: str | None, name: str, patch: Any,
                patch_type: str = "merge") -> tuple[Rec, dict[str, Any]]:
        """The current record and the object ``patch`` turns it into (nothing written or validated yet)."""
        rec, new, _ = self._patched(res, namespace, name, patch, patch_type)
        return rec, new

    def _patched(self, res: str, namespace: str | None, name: str, patch: Any,
                 patch_type: str) -> tuple[Rec, dict[str, Any], dict[str, Any] | None]:
        """``patched``, and for a merge patch the parse of the current object it was applied to (a merge patch
        copies what it changes and leaves its target as it was; the others may change theirs)."""
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
        return rec, new, (old if patch_type not in ("json", "strategic") else None)

    def apply_rec(self, res: str, namespace: str | None, name: str, obj: dict[str, Any], manager: str,
                  force: bool = False, subresource: str | None = None, dry_run: bool = False) -> Rec:
        """Server-side apply (see kubesim.apply): create if missing, else merge with field ownership."""
        rt = self.rtype(res)
        ns = (namespace or "default") if rt.namespaced else ""
        meta = obj.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = ns
        api_version = obj.get("apiVersion") or rt.api_version()
        rec = self.get_rec(res, ns, name)
        lists = _map_lists(rt, api_version)
        if rec is None:
            if subresource:
                raise not_found(rt.plural, rt.group, name)
            _, meta["managedFields"] = ssa.plan({}, ssa.keyed(obj, lists), manager, None, True, api_version, now())
            meta.pop("resourceVersion", None)
            return self.create_rec(res, obj, dry_run)
        if meta.get("resourceVersion") and meta["resourceVersion"] != str(rec.rv):
            raise conflict(rt.plural, rt.group, name)
        current, obj = ssa.keyed(rec.obj(), lists), ssa.keyed(obj, lists)
        base, managed = ssa.plan(current, obj, manager, subresource, force, api_version, now())
        applied = ssa.applied_part(obj)
        new = strategic_merge(base, applied) if rt.builtin else ssa.unkeyed(merge_patch(base, applied), lists)
        new["metadata"]["managedFields"] = managed
        return self._replace(rt, rec, new, subresource, dry_run)

    def bind(self, namespace: str, name: str, node: str) -> Rec:
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
        return self._commit(rt, pod, "MODIFIED", rec)

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


_UID_POOL: list[Any] = [b"", 0]
os.register_at_fork(after_in_child=lambda: _UID_POOL.__setitem__(0, b""))  # a child never reuses the parent's


def random_uid() -> str:
    """A random (version 4) UUID as ``str(uuid.uuid4())`` spells it, from OS randomness read 4 KiB at a time
    (uuid4 makes one system call and a UUID object per UID: ~3x the cost, on every create)."""
    pool, i = _UID_POOL
    if i >= len(pool):
        pool, i = os.urandom(4096), 0
        _UID_POOL[0] = pool
    _UID_POOL[1] = i + 16
    v = int.from_bytes(pool[i:i + 16], "big") & ~(0xF000 << 64) | (4 << 76)  # version 4
    v = v & ~(0xC000 << 48) | (0x8000 << 48)  # the RFC 4122 variant
    h = f"{v:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


def _map_lists(rt: ResourceType, api_version: str) -> dict[tuple[str, ...], tuple[str, ...]]:
    """A custom resource's ``listType: map`` lists in the schema of ``api_version`` (kubesim.apply.map_lists)."""
    if rt.builtin or not rt.schemas:
        return {}
    return ssa.map_lists(rt.schemas.get(api_version.rpartition("/")[2]) or rt.schemas.get(rt.storage_version))
