"""Deletion as the API server and its controllers do it: finalizers, graceful pod deletion, propagation.

``DeletionMixin`` is part of ``Store``: ``delete_rec`` sets deletionTimestamp while finalizers (including the
``orphan`` and ``foregroundDeletion`` ones that propagation policies add) or a pod's grace period keep the
object; the garbage collector's rules (dependents whose owners are all gone are deleted; orphaning strips
owner references; foreground waits for blocking dependents) and the namespace controller (empty a
terminating namespace, then remove it) run as deferred work after the triggering write.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from kubesim.errors import ApiError, conflict, forbidden, options_invalid
from kubesim.records import Rec, now
from kubesim.resources import ResourceType

if TYPE_CHECKING:
    from collections.abc import Callable

    from kubesim.resources import Catalogue

RAW_CRD = "customresourcedefinitions.apiextensions.k8s.io"


class DeletionMixin:
    """Delete and garbage-collection behaviour of the Store."""

    if TYPE_CHECKING:  # provided by Store
        _deps: dict[str, set[tuple[str, str, str]]]
        _uids: dict[str, tuple[str, str, str]]
        _objs: dict[str, dict[str, dict[str, Rec]]]
        catalogue: Catalogue
        defer: Callable[[Callable[[], None]], Any]

        def rtype(self, res: str) -> ResourceType: ...
        def get_rec(self, res: str, namespace: str | None, name: str) -> Rec | None: ...
        def _must(self, rt: ResourceType, ns: str, name: str) -> Rec: ...
        def _commit(self, rt: ResourceType, obj: dict[str, Any], etype: str, old: Rec | None) -> Rec: ...
        def _replace(self, rt: ResourceType, rec: Rec, obj: dict[str, Any], subresource: str | None,
                     dry_run: bool = False) -> Rec: ...
        def list_recs(self, res: str, namespace: str | None = None, label_selector: str | None = None,
                      field_selector: str | None = None) -> list[Rec]: ...
        def objects_in(self, namespace: str) -> list[tuple[str, Rec]]: ...


    def delete_rec(self, res: str, namespace: str | None, name: str, propagation: str | None = None,
                   precondition_uid: str | None = None, precondition_rv: str | None = None,
                   dry_run: bool = False, grace_period: int | None = None) -> tuple[Rec, bool]:
        """Delete; returns (record, gone). ``propagation`` None means the resource's default policy."""
        rt = self.rtype(res)
        ns = (namespace or "default") if rt.namespaced else ""
        if res == "namespaces" and name in ("default", "kube-system", "kube-public"):
            # The namespace lifecycle admission plugin, before anything else (dry runs included).
            raise forbidden("namespaces", "", name, "this namespace may not be deleted")
        rec = self._must(rt, ns, name)
        # rest.BeforeDelete: the options are validated, then the preconditions checked (naming the kind).
        if propagation is not None and propagation not in ("Background", "Foreground", "Orphan"):
            raise options_invalid("DeleteOptions", [{
                "reason": "FieldValueNotSupported", "field": "propagationPolicy",
                "message": f"Unsupported value: {orjson.dumps(propagation).decode()}: supported values: "
                           '"Foreground", "Background", "Orphan", "nil"'}])
        if precondition_uid and precondition_uid != rec.uid:
            raise conflict(rt.kind, rt.group, name, f"the UID in the precondition ({precondition_uid}) does not "
                           f"match the UID in record ({rec.uid}). The object might have been deleted and then "
                           "recreated")
        if precondition_rv and precondition_rv != str(rec.rv):
            raise conflict(rt.kind, rt.group, name, f"the ResourceVersion in the precondition ({precondition_rv}) "
                           f"does not match the ResourceVersion in record ({rec.rv}). The object might have been "
                           "modified")
        if propagation is None:
            # batch/v1 Jobs still default to orphaning their pods, as upstream keeps for compatibility.
            propagation = "Orphan" if res == "jobs.batch" else "Background"
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
        if rec.ns and rt.key != "namespaces" and self._empty(rec.ns):
            nsrec = self.get_rec("namespaces", None, rec.ns)
            if nsrec is not None and b'"deletionTimestamp"' in nsrec.raw:
                self.defer(lambda: self._finalize_namespace(rec.ns))  # swept already: now it can go
        return out

    def _empty(self, namespace: str) -> bool:
        """Whether no object is left in ``namespace`` (one look per resource, not a listing)."""
        return not any(by_ns.get(namespace) for by_ns in self._objs.values())

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
        """The namespace controller: delete everything in a terminating namespace, then the namespace. It runs
        when the namespace is deleted and again once the last object in it is gone (creating content in a
        terminating namespace is refused, so nothing new needs a sweep of its own; a sweep for every object
        removed made deleting a namespace of 27,000 objects take over ten minutes)."""
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
        if not self._empty(name):
            return
        nsrec = self.get_rec("namespaces", None, name)
        if nsrec is not None:
            obj = nsrec.obj()
            obj.setdefault("spec", {})["finalizers"] = []
            self._remove(self.rtype("namespaces"), nsrec, obj)
