"""The HTTP face of one simulated cluster: Kubernetes REST paths, discovery, watch streams and faults.

One HTTP server (kubesim/httpserver.py) per cluster routes every request through a single handler that
parses the Kubernetes URL layout (``/api/v1/...``, ``/apis/<group>/<version>/...``, namespaced or not,
with a subresource) and calls the cluster's ``Store``. Bodies go out as the stored JSON bytes where possible.
``Faults`` lets tests make the server fail, throttle, hang or drop its watch connections.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson
import yaml

from kubesim import managed, printing, schema
from kubesim.admission import Attributes
from kubesim.audit import AuditLog
from kubesim.authz import Access, query_true, token_request_target
from kubesim.errors import ApiError, not_found, options_invalid
from kubesim.httpserver import HttpServer, Request, Response, StreamResponse
from kubesim.podlog import serve_pod_log
from kubesim.resources import ResourceType
from kubesim.reviews import Reviews
from kubesim.sim.logs import LogBook
from kubesim.store import RETURNS_OBJECT, Rec, Store
from kubesim.watch import Watcher, serve_watch
from kubesim.webhooks import Webhooks, warning_headers

log = logging.getLogger("kubesim.server")

VERSION_INFO = {
    "major": "1", "minor": "31", "gitVersion": "v1.31.0-kubesim", "gitCommit": "kubesim", "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.22", "compiler": "gc", "platform": "linux/amd64",
}
PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}
JSON = "application/json"


@dataclass
class Faults:
    """Failure injection for one cluster; safe to set from any thread (plain float deadlines)."""

    fail_status: int = 0
    fail_until: float = 0.0
    pause_until: float = 0.0
    _drop: Any = None  # set by the server: a thread-safe callable that drops all watches

    def fail(self, status: int = 500, seconds: float = 1.0) -> None:
        """Answer every request with ``status`` (500 or 429 with Retry-After) for ``seconds``."""
        self.fail_status = status
        self.fail_until = time.monotonic() + seconds

    def pause(self, seconds: float) -> None:
        """Hold every request arriving in the next ``seconds`` until the pause ends, then serve it."""
        self.pause_until = time.monotonic() + seconds

    def drop_watches(self) -> None:
        """Cut every open watch connection, as a broken network or an apiserver restart would."""
        if self._drop is not None:
            self._drop()

    def clear(self) -> None:
        self.fail_until = self.pause_until = 0.0


@dataclass
class Target:
    """A parsed resource URL."""

    rt: ResourceType
    version: str
    namespace: str | None
    name: str | None
    sub: str | None


def status_body(e: ApiError) -> bytes:
    return orjson.dumps(e.status())


def error_response(e: ApiError, headers: dict[str, str] | None = None) -> Response:
    return Response(body=status_body(e), status=e.code, content_type=JSON, headers=headers)


class ApiServer:
    """Routes requests for one cluster onto its store."""

    def __init__(self, store: Store, faults: Faults, bookmark_seconds: float = 1.0) -> None:
        self.store = store
        self.faults = faults
        self.bookmark_seconds = bookmark_seconds
        self.watchers: set[Watcher] = set()
        self.last_watch_line: tuple[Rec | None, str, bytes] = (None, "", b"")
        """The watch line built last (record, event type, line), for the next watch that sends the same event."""
        self.address = "127.0.0.1:0"
        self.webhooks = Webhooks(store)
        self.audit = AuditLog()
        self.access = Access(store, enforce=bool(getattr(getattr(store, "spec", None), "authorize", False)))
        """Authentication and RBAC (kubesim/authz.py); ``access.enforce`` judges every request."""
        self.logs: LogBook | None = None
        """The simulated kubelet's container logs (kubesim/sim/logs.py), served by pods/{name}/log."""
        self.reviews = Reviews(store, self.access)
        """TokenReview / SubjectAccessReview (kubesim/reviews.py); ``reviews.add_token`` adds users."""

    def http_server(self) -> HttpServer:
        """The HTTP front end (kubesim/httpserver.py) with ``handle`` for every request: one handler routes
        everything, and what a general web framework does per request was most of the CPU per request."""
        return HttpServer(self.handle, asyncio.get_running_loop())

    def drop_watches(self) -> None:
        for w in list(self.watchers):
            with contextlib.suppress(Exception):
                w.queue.put_nowait(None)
            if w.transport is not None:
                w.transport.abort() if hasattr(w.transport, "abort") else w.transport.close()
        self.watchers.clear()

    # ------------------------------------------------------------------ entry

    async def handle(self, request: Request) -> Response | StreamResponse:
        self.audit.record(request)
        f = self.faults
        while f.pause_until and time.monotonic() < f.pause_until:  # noqa: ASYNC110 - set from other threads
            # Short naps so that Faults.clear() releases held requests promptly.
            await asyncio.sleep(min(0.05, f.pause_until - time.monotonic()))
        if f.fail_until and time.monotonic() < f.fail_until:
            if f.fail_status == 429:
                return error_response(ApiError(429, "TooManyRequests", "kubesim: injected throttling, please "
                                               "retry", {"retryAfterSeconds": 1}), {"Retry-After": "1"})
            code = f.fail_status or 500
            reason = {503: "ServiceUnavailable", 504: "Timeout"}.get(code, "InternalError")
            return error_response(ApiError(code, reason, "Internal error occurred: kubesim: injected fault",
                                           {"causes": [{"message": "kubesim: injected fault"}]}))
        try:
            with schema.request_scope(request.query.get("fieldValidation"), request.method) as scope:
                scope.manager = managed.manager_of(request.query.get("fieldManager"),
                                                   request.headers.get("User-Agent", ""))
                if self.access.enforce:  # kubesim/authz.py: 401 / 403 before anything is served
                    self.access.check(request.method, request.path, request.query,
                                      request.headers.get("Authorization", ""))
                sa = token_request_target(request.method, request.path)
                resp = (self._json(self.access.token_request(*sa, await self._body(request)), 201) if sa
                        else await self._route(request))
            if scope.warnings and not resp.prepared:
                for w in scope.warnings:  # one header per warning, as the real server writes them
                    resp.headers.add("Warning", "299 - " + orjson.dumps(w).decode())
            return resp
        except ApiError as e:
            log.debug("kubesim %s %s?%s -> %s %s: %s", request.method, request.path, request.query_string, e.code,
                      e.reason, e.message)
            return error_response(e)
        except Exception as e:  # the real server answers 500 with a Status, and so do we
            log.exception("kubesim handler failed: %s %s", request.method, request.path)
            return error_response(ApiError(500, "InternalError", f"Internal error occurred: {e!r}"))

    async def _route(self, request: Request) -> Response | StreamResponse:
        path = request.path
        stripped = path.strip("/")
        parts = stripped.split("/") if stripped else []
        if "%" in stripped:
            parts = [unquote(p) for p in parts]
        if not parts:
            return self._json({"paths": ["/api", "/api/v1", "/apis", "/version", "/healthz"]})
        head = parts[0]
        if head in ("healthz", "readyz", "livez"):
            return Response(text="ok")
        if head == "version":
            return self._json(VERSION_INFO)
        if head == "openapi" and len(parts) >= 2 and parts[1] == "v3":
            return self._openapi_v3(parts[2:])
        if head == "api":
            if len(parts) == 1:
                return self._json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": self.address}]})
            group, version, rest = "", parts[1], parts[2:]
        elif head == "apis" and len(parts) == 4 and self.reviews.handles(parts[1], parts[2], parts[3:]):
            body = await self._body(request) if request.method == "POST" else {}
            code, review = self.reviews.answer(request.method, parts[1], body)
            return self._json(review, code)
        elif head == "apis":
            if len(parts) == 1:
                return self._json({"kind": "APIGroupList", "apiVersion": "v1",
                                   "groups": [self._group(g, vs) for g, vs in self.store.catalogue.groups().items()]})
            groups = self.store.catalogue.groups()
            if parts[1] not in groups:
                raise self._no_such_path()
            if len(parts) == 2:
                return self._json({"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1], groups[parts[1]])})
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise self._no_such_path()
        if not rest:
            if (group == "" and version != "v1") or (group and version not in self.store.catalogue.groups()[group]):
                raise self._no_such_path()
            return self._json(self.store.catalogue.api_resource_list(group, version))
        watch_path = False
        if rest[0] == "watch":
            watch_path, rest = True, rest[1:]
        target = self._target(group, version, rest)
        return await self._dispatch(request, target, watch_path)

    def _openapi_v3(self, gv_parts: list[str]) -> Response:
        """Just enough OpenAPI v3 for kubectl: per group-version paths whose PATCH operations name their
        kind and accept ``fieldValidation``, so kubectl validates server-side (kubesim.schema applies it to
        custom resources); there are no schemas, so kubectl falls back to its built-in patch metadata."""
        cat = self.store.catalogue
        gvs = ["api/v1"] + [f"apis/{g}/{v}" for g, vs in cat.groups().items() for v in vs]
        if not gv_parts:
            return self._json({"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={self.store.rv}"}
                                         for gv in gvs}})
        gv = "/".join(gv_parts)
        if gv not in gvs:
            raise self._no_such_path()
        group, version = ("", "v1") if gv == "api/v1" else (gv_parts[1], gv_parts[2])
        params = [{"name": n, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                  for n in ("dryRun", "fieldManager", "fieldValidation", "force")]
        paths: dict[str, Any] = {}
        for rt in cat.in_group_version(group, version):
            gvk = {"group": group, "version": version, "kind": rt.kind}
            base = f"/{gv}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"/{gv}/{rt.plural}"

            def op(action: str, gvk: dict[str, str] = gvk) -> dict[str, Any]:
                return {"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
                        "parameters": params, "responses": {"200": {"description": "OK"}}}
            paths[base] = {"get": op("list"), "post": op("post")}
            paths[f"{base}/{{name}}"] = {"get": op("get"), "put": op("put"), "patch": op("patch"),
                                         "delete": op("delete")}
        return self._json({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": VERSION_INFO["gitVersion"]},
                           "paths": paths, "components": {"schemas": {}}})

    def _no_such_path(self) -> ApiError:
        return ApiError(404, "NotFound", "the server could not find the requested resource", {})

    def _group(self, g: str, versions: list[str]) -> dict[str, Any]:
        vs = [{"groupVersion": f"{g}/{v}", "version": v} for v in versions]
        return {"name": g, "versions": vs, "preferredVersion": vs[0]}

    def _target(self, group: str, version: str, rest: list[str]) -> Target:
        cat = self.store.catalogue
        ns: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and not (group == "" and len(rest) == 3
                                                               and rest[2] in ("status", "finalize")):
            ns, rest = rest[1], rest[2:]
        rt = cat.find(group, version, rest[0])
        if rt is None or (ns is not None and not rt.namespaced):
            raise self._no_such_path()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if len(rest) > 3 or (sub is not None and sub not in rt.subresources):
            raise self._no_such_path()
        if rt.key == "namespaces" and name is None and ns is not None:
            raise self._no_such_path()
        return Target(rt, version, ns, name, sub)

    # ------------------------------------------------------------------ dispatch

    async def _dispatch(self, request: Request, t: Target, watch_path: bool) -> Response | StreamResponse:
        q = request.query
        m = request.method
        dry = q.get("dryRun") == "All"
        options = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions",
                   "DELETE": "DeleteOptions"}.get(m)
        if options and "dryRun" in q and any(v != "All" for v in q.getall("dryRun")):
            # meta/v1 validation ValidateDryRun: a client that meant a dry run must not write.
            raise options_invalid(options, [{
                "reason": "FieldValueNotSupported", "field": "dryRun",
                "message": f"Unsupported value: {orjson.dumps(q.getall('dryRun')).decode()}: supported values: "
                           '"All"'}])
        store = self.store
        rt = t.rt
        if t.name is None:
            if m == "GET":
                if watch_path or query_true(q.get("watch")):
                    return await serve_watch(self, request, t)
                return self._list(request, t)
            if m == "POST":
                obj = await self._body(request)
                self._check_ns(obj, t)
                meta = obj.get("metadata") or {}
                a = self._attrs(t, "CREATE", meta.get("namespace") or t.namespace, meta.get("name") or "", dry)
                rec, warns = await self.webhooks.write(
                    a, lambda: store.create_rec(rt.key, obj, dry_run=dry), lambda: (None, obj),
                    lambda _rec, o, d: store.create_rec(rt.key, o, dry_run=d))
                return self._obj(rec, t, 201, warns)
            if m == "DELETE":
                return self._delete_collection(request, t)
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                           "resource", {})
        name = t.name
        if watch_path:
            return await serve_watch(self, request, t, name)
        if t.sub == "scale":
            return await self._scale(request, t)
        if t.sub == "log":
            assert t.namespace is not None
            return await serve_pod_log(store, self.logs, request, t.namespace, name)
        if t.sub == "binding":
            return await self._binding(request, t)
        # namespaces/finalize writes spec.finalizers; it is a main-resource write with a narrower body.
        sub = "status" if t.sub == "status" else None
        if m == "GET":
            got = store.get_rec(rt.key, t.namespace, name) or self._raise_nf(t)
            if sub is None and printing.wants_table(request.headers.get("Accept", "")):
                return self._table(request, t, [got], {"resourceVersion": str(got.rv)})
            return self._obj(got, t)
        if m == "PUT":
            obj = await self._body(request)
            meta = obj.get("metadata") or {}
            if meta.get("name") != name:
                raise ApiError(400, "BadRequest", "the name of the object "
                               f"({meta.get('name')}) does not match the name on the URL ({name})")
            self._check_ns(obj, t)
            if t.sub == "finalize":
                rec = store.get_rec(rt.key, None, name) or self._raise_nf(t)
                cur = rec.obj()
                cur.setdefault("spec", {})["finalizers"] = (obj.get("spec") or {}).get("finalizers") or []
                obj = cur
            if t.sub == "finalize":
                return self._obj(store.update_rec(rt.key, obj, sub, dry_run=dry), t)
            a = self._attrs(t, "UPDATE", t.namespace, name, dry)
            rec, warns = await self.webhooks.write(
                a, lambda: store.update_rec(rt.key, obj, sub, dry_run=dry),
                lambda: (store.get_rec(rt.key, t.namespace, name) or self._raise_nf(t), obj),
                lambda _rec, o, d: store.update_rec(rt.key, o, sub, dry_run=d))
            return self._obj(rec, t, 200, warns)
        if m == "PATCH":
            ctype = request.content_type
            ptype = PATCH_TYPES.get(ctype)
            if ptype is None:
                accepted = ["application/json-patch+json", "application/merge-patch+json",
                            *(["application/strategic-merge-patch+json"] if rt.builtin else []),
                            "application/apply-patch+yaml"]  # handlers/patch.go's list for the kind
                raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                               "accepted media types include: " + ", ".join(accepted))
            raw = await request.read()
            if ptype == "apply":
                scope = schema.current_scope()
                if scope is not None:
                    scope.patch_type = "apply"  # Apply entries are kubesim.apply's, not Update ones
                manager = q.get("fieldManager")
                if not manager:
                    raise ApiError(400, "BadRequest", "PATCH /apply: fieldManager is required for apply requests")
                try:
                    # Most clients send JSON (valid YAML); parse it as JSON first, it is much faster.
                    body = orjson.loads(raw) if raw.lstrip()[:1] == b"{" else yaml.safe_load(raw.decode())
                except Exception as e:
                    raise ApiError(400, "BadRequest", f"error decoding YAML: {e}") from None
                if not isinstance(body, dict):
                    raise ApiError(400, "BadRequest", "apply body must be an object")
                existed = store.get_rec(rt.key, t.namespace, name) is not None
                force = q.get("force") == "true"

                def applied() -> tuple[Rec | None, dict[str, Any]]:
                    cur = store.get_rec(rt.key, t.namespace, name)
                    return cur, store.apply_rec(rt.key, t.namespace, name, orjson.loads(orjson.dumps(body)),
                                                manager, force, sub, dry_run=True).obj()

                def commit_applied(cur: Rec | None, o: dict[str, Any], d: bool) -> Rec:
                    if cur is None:
                        o["metadata"].pop("resourceVersion", None)
                        return store.create_rec(rt.key, o, dry_run=d)
                    return store.replace_rec(rt.key, cur, o, sub, dry_run=d)

                a = self._attrs(t, "UPDATE" if existed else "CREATE", t.namespace, name, dry)
                rec, warns = await self.webhooks.write(
                    a, lambda: store.apply_rec(rt.key, t.namespace, name, body, manager, force, sub, dry_run=dry),
                    applied, commit_applied)
                return self._obj(rec, t, 200 if existed else 201, warns)
            try:
                patch = orjson.loads(raw)
            except orjson.JSONDecodeError as e:
                raise ApiError(400, "BadRequest", f"error decoding patch: {e}") from None
            scope = schema.current_scope()
            if scope is not None:
                scope.patch_type, scope.patch = ptype, patch
            a = self._attrs(t, "UPDATE", t.namespace, name, dry)
            rec, warns = await self.webhooks.write(
                a, lambda: store.patch_rec(rt.key, t.namespace, name, patch, ptype, sub, dry_run=dry),
                lambda: store.patched(rt.key, t.namespace, name, patch, ptype),
                lambda cur, o, d: store.replace_rec(rt.key, cur, o, sub, dry_run=d) if cur is not None
                else self._raise_nf(t))
            return self._obj(rec, t, 200, warns)
        if m == "DELETE":
            return await self._delete(request, t)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource",
                       {})

    def _raise_nf(self, t: Target) -> Rec:
        raise not_found(t.rt.plural, t.rt.group, t.name or "")

    async def _body(self, request: Request) -> dict[str, Any]:
        raw = await request.read()
        try:
            obj = orjson.loads(raw) if raw.lstrip()[:1] in (b"{", b"[") else yaml.safe_load(raw.decode())
        except Exception as e:
            raise ApiError(400, "BadRequest", f"the object provided is unrecognized: {e}") from None
        if not isinstance(obj, dict):
            raise ApiError(400, "BadRequest", "the object provided is unrecognized (must be an object)")
        return obj

    def _check_ns(self, obj: dict[str, Any], t: Target) -> None:
        av = obj.get("apiVersion")
        if av and av != t.rt.api_version(t.version):
            raise ApiError(400, "BadRequest", f"the API version in the data ({av}) does not match the expected "
                           f"API version ({t.rt.api_version(t.version)})")
        if not t.rt.namespaced:
            return
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        ns = meta.get("namespace")
        if ns and t.namespace and ns != t.namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace "
                           "sent on the request")
        if t.namespace:
            meta["namespace"] = t.namespace

    # ------------------------------------------------------------------ rendering

    def render(self, rec: Rec, t: Target) -> bytes:
        rt = t.rt
        if rt.builtin or len(rt.versions) == 1:
            return rec.raw
        # Custom resources read through another served version get that apiVersion (conversion "None").
        want = rt.api_version(t.version)
        if f'"apiVersion":"{want}"'.encode() in rec.raw:
            return rec.raw
        obj = rec.obj()
        obj["apiVersion"] = want
        return orjson.dumps(obj)

    def list_item(self, rec: Rec, t: Target) -> bytes:
        """A list item: built-in kinds are listed without apiVersion/kind, as typed lists encode them."""
        if not t.rt.builtin:
            return self.render(rec, t)
        prefix = t.rt.list_item_prefix
        raw = rec.raw
        return b"{" + raw[len(prefix):] if raw.startswith(prefix) else raw

    def _obj(self, rec: Rec, t: Target, status: int = 200, warnings: list[str] | None = None) -> Response:
        resp = Response(body=self.render(rec, t), status=status, content_type=JSON)
        for k, v in warning_headers(warnings or []):
            resp.headers.add(k, v)
        return resp

    def _attrs(self, t: Target, op: str, namespace: str | None, name: str, dry: bool) -> Attributes:
        """The admission attributes of a write (objects are filled in by the webhook flow)."""
        ns = (namespace or "default") if t.rt.namespaced else ""
        return Attributes(t.rt, t.version, op, None, None, t.sub or "", ns, name, dry)

    def _json(self, body: Any, status: int = 200) -> Response:
        return Response(body=orjson.dumps(body), status=status, content_type=JSON)

    def _list(self, request: Request, t: Target) -> Response:
        q = request.query
        rt = t.rt
        recs = self.store.list_recs(rt.key, t.namespace, q.get("labelSelector"), q.get("fieldSelector"))
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        cont = q.get("continue")
        if cont:
            try:
                token = orjson.loads(base64.urlsafe_b64decode(cont))
                after = (token["ns"], token["name"])
            except Exception:
                raise ApiError(400, "BadRequest", "continue key is not valid: illegal base64 data") from None
            recs = [r for r in recs if (r.ns, r.name) > after]
        limit = int(q.get("limit") or 0)
        if limit > 0 and len(recs) > limit:
            last = recs[limit - 1]
            meta["continue"] = base64.urlsafe_b64encode(orjson.dumps(
                {"v": "meta.k8s.io/v1", "rv": self.store.rv, "ns": last.ns, "name": last.name})).decode()
            if not q.get("labelSelector") and not q.get("fieldSelector"):
                meta["remainingItemCount"] = len(recs) - limit  # upstream omits it for filtered lists
            recs = recs[:limit]
        if printing.wants_table(request.headers.get("Accept", "")):
            return self._table(request, t, recs, meta)
        head = orjson.dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version(t.version), "metadata": meta})
        body = b"".join((head[:-1], b',"items":[', b",".join(self.list_item(r, t) for r in recs), b"]}"))
        return Response(body=body, content_type=JSON)

    def _table(self, request: Request, t: Target, recs: list[Rec], meta: dict[str, Any]) -> Response:
        """Server-side printing (kubesim.printing): the Table ``kubectl get`` asks for."""
        objs = [orjson.loads(self.render(r, t)) for r in recs]
        return self._json(printing.table(t.rt, t.version, objs, meta, request.query.get("includeObject", "Metadata")))

    # ------------------------------------------------------------------ delete

    async def _delete_options(self, request: Request) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        raw = await request.read()
        if raw.strip():
            with contextlib.suppress(Exception):
                parsed = orjson.loads(raw)
                if isinstance(parsed, dict):
                    opts = parsed
        q = request.query
        for k in ("propagationPolicy", "gracePeriodSeconds", "orphanDependents"):
            if k in q and k not in opts:
                opts[k] = q[k]
        if "propagationPolicy" not in opts and "orphanDependents" in opts:
            opts["propagationPolicy"] = "Orphan" if str(opts["orphanDependents"]).lower() == "true" \
                else "Background"
        return opts

    async def _delete(self, request: Request, t: Target) -> Response:
        opts = await self._delete_options(request)
        pre = opts.get("preconditions") or {}
        rt = t.rt
        assert t.name is not None
        grace = opts.get("gracePeriodSeconds")
        warns = await self.webhooks.admit_delete(self._attrs(t, "DELETE", t.namespace, t.name,
                                                             request.query.get("dryRun") == "All"), opts)
        rec, gone = self.store.delete_rec(rt.key, t.namespace, t.name, opts.get("propagationPolicy"),
                                          pre.get("uid"), pre.get("resourceVersion"),
                                          dry_run=request.query.get("dryRun") == "All",
                                          grace_period=None if grace is None else int(grace))
        if gone and rt.key not in RETURNS_OBJECT:
            details: dict[str, Any] = {"name": t.name, "kind": rt.plural, "uid": rec.uid}
            if rt.group:
                details["group"] = rt.group
            resp = self._json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                               "details": details})
            for k, v in warning_headers(warns):
                resp.headers.add(k, v)
            return resp
        return self._obj(rec, t, 200, warns)

    def _delete_collection(self, request: Request, t: Target) -> Response:
        q = request.query
        recs = self.store.list_recs(t.rt.key, t.namespace, q.get("labelSelector"), q.get("fieldSelector"))
        items = []
        for r in recs:
            with contextlib.suppress(ApiError):
                rec, _ = self.store.delete_rec(t.rt.key, r.ns or None, r.name, q.get("propagationPolicy"))
                items.append(self.render(rec, t))
        head = orjson.dumps({"kind": f"{t.rt.kind}List", "apiVersion": t.rt.api_version(t.version),
                             "metadata": {"resourceVersion": str(self.store.rv)}})
        return Response(body=head[:-1] + b',"items":[' + b",".join(items) + b"]}", content_type=JSON)

    # ------------------------------------------------------------------ subresources

    async def _binding(self, request: Request, t: Target) -> Response:
        if request.method != "POST":
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method", {})
        body = await self._body(request)
        node = (body.get("target") or {}).get("name")
        assert t.name is not None and t.namespace is not None
        if not node:
            raise ApiError(422, "Invalid", "target.name: Required value")
        self.store.bind(t.namespace, t.name, node)
        return self._json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
                          201)

    async def _scale(self, request: Request, t: Target) -> Response:
        rt = t.rt
        assert t.name is not None and rt.scale is not None
        rec = self.store.get_rec(rt.key, t.namespace, t.name) or self._raise_nf(t)
        spec_path = rt.scale.get("specReplicasPath", ".spec.replicas").lstrip(".").split(".")
        status_path = rt.scale.get("statusReplicasPath", ".status.replicas").lstrip(".").split(".")
        if request.method in ("PUT", "PATCH"):
            body = await self._body(request)
            replicas = (body.get("spec") or {}).get("replicas")
            obj = rec.obj()
            cur = obj
            for p in spec_path[:-1]:
                cur = cur.setdefault(p, {})
            cur[spec_path[-1]] = replicas
            rec = self.store.update_rec(rt.key, obj)
        obj = rec.obj()

        def dig(path: list[str]) -> Any:
            cur: Any = obj
            for p in path:
                cur = cur.get(p) if isinstance(cur, dict) else None
            return cur

        m = obj["metadata"]
        return self._json({"kind": "Scale", "apiVersion": "autoscaling/v1",
                           "metadata": {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                          "creationTimestamp") if k in m},
                           "spec": {"replicas": dig(spec_path) or 0},
                           "status": {"replicas": dig(status_path) or 0}})
