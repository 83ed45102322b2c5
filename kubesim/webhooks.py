"""Admission webhooks: MutatingWebhookConfiguration and ValidatingWebhookConfiguration called over HTTPS.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from kubesim import cel, schema
from kubesim.admission import MWC, VWC, Attributes, rules_match
from kubesim.errors import ApiError, conflict
from kubesim.patch import json_patch
from kubesim.records import Rec

if TYPE_CHECKING:
    from kubesim.store import Store

log = logging.getLogger("kubesim.webhooks")

ADDRESS_ANNOTATION = "kubesim.mkd.dev/webhook-address"
RETRIES = 5


class CallError(Exception):
    """A webhook could not be called or answered nonsense (upstream ErrCallingWebhook)."""


def internal_error(message: str) -> ApiError:
    return ApiError(500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]})


def denied(name: str, status: dict[str, Any] | None) -> ApiError:
    """upstream webhookerrors.ToStatusErr: the webhook's Status with a code >= 400 and a prefixed message."""
    st = dict(status or {})
    prefix = f'admission webhook "{name}" denied the request'
    raw_code = st.get("code")
    code = raw_code if isinstance(raw_code, int) else 0
    if code < 400:
        code = 400
    if st.get("message"):
        msg = f"{prefix}: {st['message']}"
    elif st.get("reason"):
        msg = f"{prefix}: {st['reason']}"
    else:
        msg = f"{prefix} without explanation"
    return ApiError(code, str(st.get("reason") or ""), msg, st.get("details"))


class Webhooks:
    """Calls the cluster's admission webhooks for one request at a time.

    ``Webhooks.write`` wraps one create/update/patch/apply request of the HTTP layer. With no webhook
    configuration in the cluster it is the plain store call. Otherwise, as the real server does:

    1. the object the request would write (body, or the patch applied to the current object) goes through
       every matching mutating webhook in order (configurations by name, webhooks in list order), each
       getting an AdmissionReview v1 and answering ``allowed`` plus an optional base64 ``JSONPatch``;
    2. the store defaults and validates it (CRD rules and ValidatingAdmissionPolicies included) without
       writing (a dry run), and the matching validating webhooks see that final object, all called at once;
       the first refusal in order answers;
    3. the object is written; if another writer changed it meanwhile, the steps run again.

    A webhook is reached by ``clientConfig.url`` or ``clientConfig.service``. A service maps to the address in
    the Service's ``kubesim.mkd.dev/webhook-address`` annotation (``host:port``), or to ``externalName`` of an
    ExternalName Service; the TLS certificate is verified against ``caBundle`` (the system roots without one)
    and the name ``<service>.<namespace>.svc``, as the real server does. Calls honour ``timeoutSeconds``;
    a failure to call (refused, timeout, TLS, a malformed answer) follows ``failurePolicy``; a refusal is
    the webhook's Status with the real server's ``admission webhook "<name>" denied the request: ...``.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._ssl: dict[str, ssl.SSLContext] = {}
        self._cache: dict[str, tuple[tuple[int, int], list[tuple[str, dict[str, Any]]]]] = {}

    def configured(self, a: Attributes | None = None) -> bool:
        """Whether some webhook configuration exists (and, given a request, whose rules name it)."""
        hooks = self._hooks(MWC) + self._hooks(VWC)
        if a is None or not hooks:
            return bool(hooks)
        return any(rules_match(w, a) for _cfg, w in hooks)

    def _hooks(self, key: str) -> list[tuple[str, dict[str, Any]]]:
        """(configuration name, webhook) in call order, parsed again only when a configuration changed."""
        recs = self.store._objs.get(key, {}).get("", {})
        if not recs:
            return []  # asked on every write: most clusters have no webhook configuration
        sig = (len(recs), max(r.rv for r in recs.values()))
        hit = self._cache.get(key)
        if hit is None or hit[0] != sig:
            hooks = [(name, w) for name in sorted(recs) for w in recs[name].obj().get("webhooks") or ()]
            hit = self._cache[key] = (sig, hooks)
        return hit[1]

    # -------------------------------------------------------------- the request flow

    async def write(self, a: Attributes, direct: Callable[[], Rec],
                    build: Callable[[], tuple[Rec | None, dict[str, Any]]],
                    commit: Callable[[Rec | None, dict[str, Any], bool], Rec]) -> tuple[Rec, list[str]]:
        """Run the request through admission and write it; returns the record and the warnings.

        ``direct`` is the plain store call (no webhooks configured); ``build`` gives the current record and
        the object the request would write; ``commit(current, obj, dry_run)`` writes (or dry-runs) it.
        """
        adm = self.store.admission
        adm.warnings = []
        if not self.configured(a):
            try:
                rec = direct()
            finally:
                warns = adm.take_warnings()
            return rec, warns
        for _ in range(RETRIES):
            warnings: list[str] = []
            old_rec, obj = build()
            obj = orjson.loads(orjson.dumps(obj))
            if not a.subresource:  # decoded as a real server decodes: pruned and defaulted before admission
                schema.decode(a.rt, obj)
            a.old = old_rec.obj() if old_rec is not None else None
            a.obj = obj
            obj = await self._mutate(a, warnings)
            if self._moved(a, old_rec):
                continue
            if self._matching(VWC, a):
                try:
                    final = commit(old_rec, orjson.loads(orjson.dumps(obj)), True)
                finally:
                    adm.warnings = []
                fobj = final.obj()
                if not (obj.get("metadata") or {}).get("name"):
                    obj.setdefault("metadata", {})["name"] = fobj["metadata"]["name"]  # keep the generated name
                a.obj = fobj
                a.name = fobj["metadata"]["name"]
                await self._validate(a, warnings)
                if self._moved(a, old_rec):
                    continue
            try:
                rec = commit(old_rec, obj, a.dry_run)
            finally:
                warnings += adm.take_warnings()
            return rec, warnings
        raise conflict(a.rt.plural, a.rt.group, a.name)

    async def admit_delete(self, a: Attributes, options: dict[str, Any]) -> list[str]:
        """A DELETE request: policies, then mutating and validating webhooks see ``oldObject`` only
        (mutating webhooks may only allow or refuse here). Returns the warnings; raises a refusal."""
        rec = self.store.get_rec(a.rt.key, a.namespace or None, a.name)
        if rec is None:
            return []  # the store answers 404
        adm = self.store.admission
        a.old = rec.obj()
        a.obj = None
        adm.warnings = []
        try:
            adm.validate(a.rt, "DELETE", None, a.old, None, a.dry_run)
        finally:
            warnings = adm.take_warnings()
        if not self.configured(a):
            return warnings
        a.options = {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1",
                     **{k: v for k, v in options.items() if k in ("propagationPolicy", "gracePeriodSeconds",
                                                                 "preconditions")}}
        for _cfg, w in self._hooks(MWC):
            if self._called_and_matched(w, a):
                await self._mutate_one(w, a, warnings)  # on DELETE there is no object to patch
        await self._validate(a, warnings)
        return warnings

    def _moved(self, a: Attributes, old_rec: Rec | None) -> bool:
        if old_rec is None:
            return False
        return self.store.get_rec(a.rt.key, old_rec.ns or None, old_rec.name) is not old_rec

    # -------------------------------------------------------------- matching

    def _matching(self, key: str, a: Attributes) -> list[tuple[str, dict[str, Any]]]:
        return [(cfg, w) for cfg, w in self._hooks(key) if self.store.admission.matcher.matches(w, a, "rules")]

    def _conditions_pass(self, w: dict[str, Any], a: Attributes) -> bool:
        conds = w.get("matchConditions") or ()
        if not conds:
            return True
        data = {"object": a.obj, "oldObject": a.old, "request": a.request(), "authorizer": None,
                "params": None, "namespaceObject": None, "variables": {}}
        act = cel.activation(data)
        errors = []
        for c in conds:
            try:
                ok = cel.compile_expr(c.get("expression", "")).eval(act)
            except (cel.CompileError, cel.EvalError) as e:
                errors.append(f"expression '{c.get('expression', '')}' resulted in error: {e}")
                continue
            if ok is False:
                return False
        if errors:
            raise CallError(f"failed to evaluate match conditions: {'; '.join(errors)}")
        return True

    # -------------------------------------------------------------- mutating

    async def _mutate(self, a: Attributes, warnings: list[str]) -> dict[str, Any]:
        """Mutating webhooks in order, each matched against the object as the ones before it left it; those
        with ``reinvocationPolicy: IfNeeded`` run once more if a later webhook changed the object."""
        obj = a.obj
        assert obj is not None
        hooks = [w for _cfg, w in self._hooks(MWC)]
        called: list[tuple[int, dict[str, Any]]] = []  # (index, object after the call) of IfNeeded hooks
        for i, w in enumerate(hooks):
            if self._called_and_matched(w, a):
                obj = await self._mutate_one(w, a, warnings) or obj
                if w.get("reinvocationPolicy") == "IfNeeded":
                    called.append((i, obj))
        again = [hooks[i] for i, seen in called if seen != obj]
        for w in again:
            if self._called_and_matched(w, a):
                obj = await self._mutate_one(w, a, warnings) or obj
        return obj

    def _called_and_matched(self, w: dict[str, Any], a: Attributes) -> bool:
        if not self.store.admission.matcher.matches(w, a, "rules"):
            return False
        try:
            return self._conditions_pass(w, a)
        except CallError as e:
            if w.get("failurePolicy") == "Ignore":
                return False
            raise internal_error(f'failed calling webhook "{w.get("name", "")}": {e}') from None

    async def _mutate_one(self, w: dict[str, Any], a: Attributes, warnings: list[str]) -> dict[str, Any] | None:
        obj = a.obj
        name = w.get("name", "")
        try:
            resp = await self._call(w, a)
        except CallError as e:
            if w.get("failurePolicy") == "Ignore":
                log.warning("kubesim: ignoring failed webhook %s: %s", name, e)
                return obj
            raise internal_error(f'failed calling webhook "{name}": {e}') from None
        warnings += [str(x) for x in resp.get("warnings") or ()]
        if not resp.get("allowed"):
            raise denied(name, resp.get("status"))
        patch = resp.get("patch")
        if patch and obj is not None:  # a DELETE has no object to patch: kubesim ignores the patch
            if resp.get("patchType") != "JSONPatch":
                raise internal_error(f'failed calling webhook "{name}": received invalid webhook response: '
                                     f'expected patchType "JSONPatch", got "{resp.get("patchType")}"')
            try:
                ops = orjson.loads(base64.b64decode(patch))
                obj = json_patch(obj, ops)
            except ApiError as e:
                raise internal_error(e.message) from None
            except Exception as e:
                raise internal_error(f"error decoding patch from webhook {name}: {e}") from None
            if not isinstance(obj, dict):
                raise internal_error(f'webhook "{name}" patched the object into a non-object')
            a.obj = obj
        return obj

    # -------------------------------------------------------------- validating

    async def _validate(self, a: Attributes, warnings: list[str]) -> None:
        hooks = [w for _cfg, w in self._matching(VWC, a)]

        async def one(w: dict[str, Any]) -> ApiError | None:
            name = w.get("name", "")
            try:
                if not self._conditions_pass(w, a):
                    return None
                resp = await self._call(w, a)
            except CallError as e:
                if w.get("failurePolicy") == "Ignore":
                    log.warning("kubesim: ignoring failed webhook %s: %s", name, e)
                    return None
                return internal_error(f'failed calling webhook "{name}": {e}')
            warnings.extend(str(x) for x in resp.get("warnings") or ())
            if not resp.get("allowed"):
                return denied(name, resp.get("status"))
            return None

        results = await asyncio.gather(*(one(w) for w in hooks))
        for err in results:
            if err is not None:
                raise err

    # -------------------------------------------------------------- the call

    def _context(self, ca_bundle: str | None) -> ssl.SSLContext:
        key = ca_bundle or ""
        ctx = self._ssl.get(key)
        if ctx is None:
            if ca_bundle:
                try:
                    pem = base64.b64decode(ca_bundle).decode()
                    ctx = ssl.create_default_context(cadata=pem)
                except (ValueError, ssl.SSLError) as e:
                    raise CallError(f"failed to call webhook: bad caBundle: {e}") from None
            else:
                ctx = ssl.create_default_context()
            self._ssl[key] = ctx
        return ctx

    def _target(self, w: dict[str, Any]) -> tuple[str, str, str]:
        """(URL as the real server names it, URL kubesim connects to, TLS server name)."""
        cc = w.get("clientConfig") or {}
        timeout = f"?timeout={int(w.get('timeoutSeconds') or 10)}s"
        if cc.get("url"):
            url = str(cc["url"])
            host = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
            return url + timeout, url, host
        svc = cc.get("service") or {}
        ns, name, port = svc.get("namespace", ""), svc.get("name", ""), int(svc.get("port") or 443)
        path = svc.get("path") or ""
        shown = f"https://{name}.{ns}.svc:{port}{path}{timeout}"
        rec = self.store.get_rec("services", ns, name)
        if rec is None:
            raise CallError(f'failed to call webhook: Post "{shown}": service "{name}" not found')
        s = rec.obj()
        addr = ((s.get("metadata") or {}).get("annotations") or {}).get(ADDRESS_ANNOTATION)
        if not addr and (s.get("spec") or {}).get("type") == "ExternalName":
            addr = f"{s['spec'].get('externalName')}:{port}"
        if not addr:
            raise CallError(f'failed to call webhook: Post "{shown}": no endpoints available for service "{name}"')
        return shown, f"https://{addr}{path}", f"{name}.{ns}.svc"

    async def _call(self, w: dict[str, Any], a: Attributes) -> dict[str, Any]:
        shown, url, server_name = self._target(w)
        ctx = self._context((w.get("clientConfig") or {}).get("caBundle"))
        req = a.request()
        req["object"] = a.obj
        req["oldObject"] = a.old
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}
        timeout = float(w.get("timeoutSeconds") or 10)
        where = f'Post "{shown}"'
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
                async with session.post(url, data=orjson.dumps(review), ssl=ctx, server_hostname=server_name,
                                        headers={"Content-Type": "application/json",
                                                 "Accept": "application/json"}) as r:
                    body = await r.read()
                    status = r.status
        except TimeoutError:
            raise CallError(f"failed to call webhook: {where}: context deadline exceeded") from None
        except aiohttp.ClientConnectorCertificateError as e:
            raise CallError(f"failed to call webhook: {where}: tls: failed to verify certificate: "
                            f"x509: {e.certificate_error}") from None
        except aiohttp.ClientConnectorError as e:
            text = "connect: connection refused" if isinstance(e.os_error, ConnectionRefusedError) else str(e)
            raise CallError(f"failed to call webhook: {where}: dial tcp {e.host}:{e.port}: {text}") from None
        except (aiohttp.ClientError, OSError) as e:
            raise CallError(f"failed to call webhook: {where}: {e}") from None
        if status != 200:
            raise CallError(f"failed to call webhook: an error on the server ({body[:200].decode(errors='replace')!r}) "
                            f"has prevented the request from succeeding (status {status})")
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise CallError(f"received invalid webhook response: {e}") from None
        if not isinstance(answer, dict) or answer.get("apiVersion") != "admission.k8s.io/v1" \
                or answer.get("kind") != "AdmissionReview":
            got = answer.get("apiVersion", "") if isinstance(answer, dict) else ""
            kind = answer.get("kind", "") if isinstance(answer, dict) else ""
            raise CallError(f"received invalid webhook response: expected webhook response of "
                            f"admission.k8s.io/v1, Kind=AdmissionReview, got {got}, Kind={kind}")
        resp = answer.get("response")
        if not isinstance(resp, dict):
            raise CallError("received invalid webhook response: webhook response was absent")
        if resp.get("uid") != a.uid:
            raise CallError(f'received invalid webhook response: expected response.uid="{a.uid}", '
                            f'got "{resp.get("uid", "")}"')
        return resp


def warning_headers(warnings: list[str]) -> list[tuple[str, str]]:
    """RFC 7234 Warning headers as the real server writes them (``299 - "text"``)."""
    out = []
    for w in warnings:
        with contextlib.suppress(Exception):
            text = w.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
            out.append(("Warning", f'299 - "{text}"'))
    return out
